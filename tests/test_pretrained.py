"""Shipped models: export a run, find it by name (checkout, cache, download), verify it, and fail clearly."""

import json

import pytest
import torch

from aiayn import data, pretrained
from aiayn.decoding import translate
from aiayn.model import TransformerConfig, make_model
from aiayn.tokenization import Tokenizer

SENTENCES = [
    "Two dogs play in the snow.",
    "Zwei Hunde spielen im Schnee.",
    "A man rides a bike.",
    "Ein Mann fährt Fahrrad.",
    "A woman sits on a bench.",
    "Eine Frau sitzt auf einer Bank.",
]


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """An experiment's checkpoint folder (averaged.pt, tokenizer.json) and results folder (metrics.json), tiny."""
    root = tmp_path_factory.mktemp("run")
    ckpt, results = root / "ck", root / "results"
    ckpt.mkdir()
    results.mkdir()
    tokenizer = Tokenizer.train(SENTENCES * 5, vocab_size=400)
    tokenizer.save(ckpt / "tokenizer.json")
    config = TransformerConfig(vocab_size=len(tokenizer), N=1, d_model=16, d_ff=32, h=2, P_drop=0.0, max_len=64)
    torch.manual_seed(0)
    model = make_model(config)
    torch.save(
        {"model_config": vars(config), "model": model.state_dict(), "layers": "aiayn", "direction": "en-de"},
        ckpt / "averaged.pt",
    )
    score = {"sacrebleu": {"score": 1.5}, "tok_lc": {"score": 2.5}}
    (results / "metrics.json").write_text(
        json.dumps(
            {
                "direction": "en-de",
                "layers": "aiayn",
                "parameters": 1234,
                "updates": 10,
                "bleu": {"val": score, "test2016": score},
                "provenance": {"device": "cpu", "git_commit": "abc"},
            }
        )
    )
    return ckpt, results, model, tokenizer


@pytest.fixture
def shipped(run, tmp_path):
    """The run exported into a 'server' folder with its registry; an empty checkout folder and cache."""
    ckpt, results, _, _ = run
    server, registry = tmp_path / "server", tmp_path / "registry" / "pretrained.json"
    registry.parent.mkdir()
    entry = pretrained.export("en-de", ckpt, results, folder=server, registry_path=registry)
    where = {
        "registry_path": registry,
        "folder": tmp_path / "checkout",
        "cache": tmp_path / "cache",
        "urls": (f"file://{server}/{{file}}",),
        "retries": 1,
        "timeout": 5,
    }
    return entry, server, where


def test_export_then_load_gives_the_same_translations(run, shipped):
    _, _, model, tokenizer = run
    entry, server, where = shipped
    assert entry["file"] == "en-de.pt" and entry["bytes"] == (server / "en-de.pt").stat().st_size
    assert entry["bleu"]["test2016"] == {"sacrebleu": 1.5, "tok_lc": 2.5} and entry["provenance"]["git_commit"] == "abc"
    m = pretrained.load("en-de", registry_path=where["registry_path"], folder=server)  # found in the checkout
    assert m.direction == "en-de" and m.path == server / "en-de.pt" and m.metrics["updates"] == 10
    for name, w in model.state_dict().items():  # stored in fp16, loaded in fp32
        assert torch.equal(m.model.state_dict()[name], w.half().float() if w.is_floating_point() else w), name
    half = make_model(model.config)
    half.load_state_dict({k: v.half().float() for k, v in model.state_dict().items()})
    sentences = ["Two dogs play.", "A man sits on a bench."]
    assert m.translate(sentences) == translate(half.eval(), tokenizer, sentences)
    assert isinstance(m.translate("Two dogs play."), str)


def test_downloads_into_the_cache_and_refetches_a_corrupt_file(shipped, capsys):
    _, server, where = shipped
    path = pretrained.locate("en-de", **where)
    assert path == where["cache"] / "en-de.pt" and path.read_bytes() == (server / "en-de.pt").read_bytes()
    assert pretrained.locate("en-de", **where) == path  # now from the cache
    path.write_bytes(path.read_bytes()[:1000])  # an interrupted download
    assert pretrained.locate("en-de", **where) == path
    assert "does not match its SHA256" in capsys.readouterr().err
    assert path.read_bytes() == (server / "en-de.pt").read_bytes()


def test_a_file_with_the_wrong_checksum_is_not_used(shipped):
    _, server, where = shipped
    (server / "en-de.pt").write_bytes(b"not the model")
    with pytest.raises(pretrained.PretrainedError, match="SHA256 is not the expected"):
        pretrained.locate("en-de", **where)
    assert not (where["cache"] / "en-de.pt").exists()


def test_offline_says_where_to_get_the_file(shipped):
    _, _, where = shipped
    offline = {**where, "urls": (f"file://{where['cache']}/nowhere/{{file}}",)}
    with pytest.raises(pretrained.PretrainedError, match="could not download the model file en-de.pt") as err:
        pretrained.locate("en-de", **offline)
    assert "copy it to" in str(err.value) and "AIAYN_PRETRAINED" in str(err.value)


def test_unknown_names_and_an_empty_registry(shipped, tmp_path):
    _, _, where = shipped
    with pytest.raises(pretrained.PretrainedError, match="unknown model 'en-fr'; the shipped ones are en-de"):
        pretrained.locate("en-fr", **where)
    with pytest.raises(pretrained.PretrainedError, match="no trained model is shipped with this version"):
        pretrained.locate("en-de", registry_path=tmp_path / "none.json")


def test_load_file_reads_an_experiments_averaged_model_and_rejects_junk(run, tmp_path):
    ckpt, _, model, _ = run
    m = pretrained.load_file(ckpt / "averaged.pt")
    assert all(torch.equal(m.model.state_dict()[k], v) for k, v in model.state_dict().items())
    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"\x00" * 100)
    with pytest.raises(pretrained.PretrainedError, match="not a readable model file"):
        pretrained.load_file(junk)
    with pytest.raises(pretrained.PretrainedError, match="no model file at"):
        pretrained.load_file(tmp_path / "missing.pt")
    lonely = tmp_path / "lonely.pt"
    torch.save({"model_config": {}, "model": {}}, lonely)
    with pytest.raises(pretrained.PretrainedError, match="neither a model file of this book"):
        pretrained.load_file(lonely)


def test_the_book_ships_what_its_registry_lists(capsys):
    """The repository's registry is valid JSON, and every model it lists is in pretrained/ with its checksum."""
    known = pretrained.registry()
    for name, entry in known.items():
        path = pretrained.FOLDER / entry["file"]
        assert path.is_file(), f"{name}: {path} is listed in aiayn/pretrained.json but missing"
        assert data.sha256(path) == entry["sha256"], f"{name}: {path} does not match its SHA256"
    assert pretrained.main(["list"]) == 0
    out = capsys.readouterr().out
    assert ("no trained model is shipped" in out) == (not known)


def test_attention_of_a_shipped_model(run, shipped):
    """Pretrained.attention: every layer's and head's weights for one sentence and the model's own translation."""
    _, server, where = shipped
    m = pretrained.load("en-de", registry_path=where["registry_path"], folder=server)
    att = m.attention("Two dogs play.")
    S, T = len(att["src_tokens"]), len(att["tgt_tokens"])
    assert att["src_tokens"][-1] == "</s>" and att["tgt_tokens"][0] == "<s>"
    assert att["enc_self"].shape == (1, 2, S, S) and att["cross"].shape == (1, 2, T, S)
    assert att["dec_self"].shape == (1, 2, T, T) and str(att["hypothesis"]) == m.translate("Two dogs play.")
    assert abs(att["cross"].astype("float32").sum(-1) - 1).max() < 1e-2
    with pytest.raises(ValueError, match="one non-empty sentence"):
        m.attention("  ")


def test_a_failed_run_is_not_shipped(run, tmp_path):
    ckpt, results, _, _ = run
    failed = tmp_path / "failed"
    failed.mkdir()
    metrics = json.loads((results / "metrics.json").read_text())
    (failed / "metrics.json").write_text(json.dumps({**metrics, "warnings": ["outputs collapsed: ..."]}))
    with pytest.raises(pretrained.PretrainedError, match="a failed run, not shipped: outputs collapsed"):
        pretrained.export("en-de", ckpt, failed, folder=tmp_path / "out", registry_path=tmp_path / "r.json")
    assert not (tmp_path / "out").exists()


def test_the_tied_table_is_stored_once(shipped):
    """The averaged weights hold the shared table three times (three equal tensors); the file holds it once."""
    _, server, _ = shipped
    weights = torch.load(server / "en-de.pt", weights_only=True)["model"]
    table = weights["src_embed.lut.weight"]
    assert table.dtype == torch.float16
    assert weights["tgt_embed.lut.weight"].data_ptr() == weights["generator.weight"].data_ptr() == table.data_ptr()
