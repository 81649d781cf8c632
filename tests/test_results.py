"""§6.1 results: the loaders, tables and charts of aiayn.results on a small results folder written here."""

import json
import math

import numpy as np
import pytest

from aiayn import results

PROVENANCE = {
    "device": "NVIDIA H100 80GB HBM3",
    "torch": "2.13.0+cu128",
    "cuda": "12.8",
    "python": "3.11.7",
    "git_commit": "0123456789abcdef0123456789abcdef01234567",
    "git_dirty": False,
    "date": "2026-01-02T03:04:05+00:00",
    "command": "python -m aiayn.experiment --direction en-de",
    "concurrent_runs": 4,
}


def split_scores(score: float, n: int) -> dict:
    return {
        "file": "x",
        "sentences": n,
        "decode_s": 2.0,
        "sacrebleu": {
            "score": score,
            "signature": "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0",
            "bp": 0.95,
            "sys_len": 950,
            "ref_len": 1000,
            "precisions": [1, 1, 1, 1],
            "text": "",
        },
        "tok_lc": {
            "score": score + 0.5,
            "signature": "nrefs:1|case:mixed|eff:no|tok:none",
            "bp": 1.0,
            "sys_len": 1,
            "ref_len": 1,
            "precisions": [1, 1, 1, 1],
            "text": "",
        },
    }


def metrics(direction="en-de", N=4, P_drop=0.3, val_bleu=40.0) -> dict:
    src, tgt = direction.split("-")
    return {
        "direction": direction,
        "src_lang": src,
        "tgt_lang": tgt,
        "layers": "aiayn",
        "bleu": {split: split_scores(val_bleu if split == "val" else 41.25, 3) for split in results.SPLITS},
        "val": {"loss": 2.5, "nll": 1.5, "ppl": math.exp(1.5)},
        "parameters": 9_400_000,
        "updates": 6000,
        "epochs": 25,
        "stopped_by": "time budget",
        "averaged_checkpoints": [f"step_{i:08d}.pt" for i in range(10)],
        "decoding": {"beam_size": 4, "alpha": 0.6, "max_output": "input length + 50", "batch": 128},
        "model_config": {
            "vocab_size": 8000,
            "N": N,
            "d_model": 256,
            "d_ff": 1024,
            "h": 4,
            "P_drop": P_drop,
            "eps_ls": 0.1,
        },
        "data": {"bpe_size": 8000, "max_tokens": 8000, "limit_train_batches": None},
        "provenance": {**PROVENANCE, "wall_s": {"setup": 5.0, "train": 440.4, "total": 538.6}, "time_budget_s": 540},
    }


HISTORY = {
    "step": [1, 2, 3, 4, 5],
    "loss": [9.0, 8.0, 7.0, 6.0, 5.0],
    "lr": [1e-4] * 5,
    "epoch": [1, 1, 2, 2, 3],
    "val_loss": [7.5, 6.5],
    "val_ppl": [100.0, 50.0],
}


def attention() -> dict:
    rng = np.random.default_rng(0)
    N, h, S, T = 2, 3, 4, 5

    def weights(*shape):
        w = rng.random(shape)
        return (w / w.sum(-1, keepdims=True)).astype(np.float16)

    out = {}
    for k in range(3):
        out.update(
            {
                f"s{k}_enc_self": weights(N, h, S, S),
                f"s{k}_dec_self": weights(N, h, T, T),
                f"s{k}_cross": weights(N, h, T, S),
                f"s{k}_src_tokens": np.array(["▁A", "▁dog", ".", "</s>"]),
                f"s{k}_tgt_tokens": np.array(["<s>", "▁Ein", "▁Hund", '"', "."]),
                f"s{k}_source": np.array("A dog."),
                f"s{k}_hypothesis": np.array("Ein Hund."),
                f"s{k}_reference": np.array("Ein Hund."),
            }
        )
    return out


@pytest.fixture
def run_dir(tmp_path):
    folder = tmp_path / "en-de"
    folder.mkdir()
    (folder / "metrics.json").write_text(json.dumps(metrics()), encoding="utf-8")
    (folder / "history.json").write_text(json.dumps(HISTORY), encoding="utf-8")
    (folder / "hyp.test2016.txt").write_text("Ein Hund läuft.\n\nZwei\u2028Katzen.\n", encoding="utf-8")
    np.savez_compressed(folder / "attention.npz", **attention())
    return folder


def test_load_run_and_missing_files(run_dir, tmp_path):
    assert results.load_run(tmp_path / "nothing") is None and results.load_json(tmp_path / "x.json") is None
    run = results.load_run(run_dir)
    assert run["folder"] == run_dir and run["history"] == HISTORY and run["attention"] == run_dir / "attention.npz"
    assert run["metrics"]["updates"] == 6000
    # one line per sentence: an empty output stays a line, and U+2028 inside a line does not split it
    assert results.hypotheses(run, "test2016") == ["Ein Hund läuft.", "", "Zwei\u2028Katzen."]
    assert results.missing("gpu-de-en") == (
        "gpu-de-en: not stored yet. It is made on a GPU by\n"
        "    python -m aiayn.experiment --recipe gpu --direction de-en --out\n"
        "      results/gpu-de-en"
    )
    assert "--layers torch" in results.missing("gpu-floor-en-de")
    assert results.missing("cpu-de-en") == (
        "cpu-de-en: not stored yet. It is made by\n"
        "    python -m aiayn.experiment --recipe cpu --direction de-en --out\n"
        "      results/cpu-de-en"
    )
    names = [*results.STAGE, *results.RUNS]
    assert all(len(line) <= 79 for name in names for line in results.missing(name).splitlines())
    assert "aiayn.plan run speed" in results.missing("bench_train.json")
    assert "aiayn.plan run search" in results.missing("variations")


def test_provenance_and_config_lines(run_dir):
    m = results.load_run(run_dir)["metrics"]
    assert results.provenance_line(m) == (
        "NVIDIA H100 80GB HBM3 | torch 2.13.0+cu128, CUDA 12.8 | commit 0123456789 | 2026-01-02 | 4 run(s) sharing "
        "the device | 539 s in all, 440 s of training\n  command: python -m aiayn.experiment --direction en-de"
    )
    cpu = {**PROVENANCE, "device": "CPU: Intel(R) Xeon(R) Processor", "cpu_cores": 2, "threads": 2, "cuda": None}
    assert results.provenance_line({"provenance": cpu}).startswith(
        "CPU: Intel(R) Xeon(R) Processor, 2 cores, 2 thread(s) | torch 2.13.0+cu128 | commit 0123456789 | 2026"
    )
    assert results.provenance_line({"provenance": {**PROVENANCE, "git_dirty": True, "cuda": None}}).startswith(
        "NVIDIA H100 80GB HBM3 | torch 2.13.0+cu128 | commit 0123456789 with uncommitted changes | 2026-01-02 | 4 run"
    )
    assert results.config_line(m) == (
        "aiayn layers, N=4 d_model=256 d_ff=1024 h=4 P_drop=0.3 eps_ls=0.1, 9.40M parameters; joint BPE 8000, "
        "8000-token batches; 6000 updates in 25 epochs (stopped by time budget); average of 10 checkpoints; beam 4, "
        "alpha 0.6; fp32"
    )
    described = results.describe(results.load_run(run_dir), "ours")
    assert described.endswith("sacreBLEU signature:\n    nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0")
    assert all(len(line) <= 79 for line in described.splitlines())  # printed in the chapter's 79 columns
    assert "2026-01-02" in described and "6000 updates in 25 epochs" in described


def test_bleu_table_puts_ours_before_the_anchors_of_each_direction(run_dir):
    table = results.bleu_table({"ours": results.load_run(run_dir)})
    assert len(table) == 2 + len(results.ANCHORS)
    assert table.loc[0].tolist()[:5] == ["ours", "en-de", "Multi30k test 2016", results.SACREBLEU, 41.25]
    assert table.loc[1].tolist()[:5] == ["ours", "en-de", "Multi30k test 2016", results.TOK_LC, 41.75]
    assert table.loc[1, "note"] == "9.4M parameters, 6000 updates, beam 4, alpha 0.6, on NVIDIA H100 80GB HBM3"
    assert table["direction"].tolist() == ["en-de"] * 5 + ["de-en"] * 1
    wu = table[table["system"].str.startswith("Wu")].iloc[0]
    assert (wu["BLEU"], wu["metric"], wu["direction"]) == (41.02, results.TOK_LC, "en-de")
    assert not table["system"].str.contains("nn.Transformer").any()  # the floor is a stored run, never a typed figure
    both = results.bleu_table({"ours": results.load_run(run_dir), "floor": results.load_run(run_dir)})
    assert both["system"].tolist()[:4] == ["ours", "ours", "floor", "floor"]
    assert table[table["test set"] == "WMT newstest2014"]["BLEU"].tolist() == [27.3, 28.4]
    assert table[table["system"] == "bentrevett tutorial"]["BLEU"].tolist() == [36.52]


def test_scores_table(run_dir):
    scores = results.scores_table(results.load_run(run_dir))
    assert scores.index.tolist() == list(results.SPLITS)
    assert scores.loc["val", results.SACREBLEU] == 40.0 and scores.loc["test2018", results.TOK_LC] == 41.75
    assert scores.loc["test2016", "length ratio"] == 0.95 and scores.loc["mscoco2017", "sentences"] == 3


def test_history_frames_place_validation_at_epoch_ends():
    train, val = results.history_frames(HISTORY)
    assert train.shape == (5, 4) and train["loss"].tolist() == HISTORY["loss"]
    assert val.to_dict("list") == {"epoch": [1, 2], "step": [2, 4], "val_loss": [7.5, 6.5], "val_ppl": [100.0, 50.0]}


def test_attention_frame_is_long_format(run_dir):
    att = results.load_attention(run_dir / "attention.npz")
    cross = results.attention_frame(att, 1, "cross")
    assert len(cross) == 2 * 3 * 5 * 4  # layers x heads x len_q x len_k
    assert len(results.attention_frame(att, 0, "enc_self")) == 2 * 3 * 4 * 4
    assert len(results.attention_frame(att, 2, "dec_self")) == 2 * 3 * 5 * 5
    assert sorted(cross["layer"].unique()) == [1, 2] and sorted(cross["head"].unique()) == [1, 2, 3]
    row = cross[(cross["layer"] == 2) & (cross["head"] == 3) & (cross["query"] == 2) & (cross["key"] == 1)].iloc[0]
    assert (row["query_token"], row["key_token"]) == ("▁Hund", "▁dog")
    assert row["weight"] == np.float32(att["s1_cross"][1, 2, 2, 1])
    sums = cross.groupby(["layer", "head", "query"])["weight"].sum()
    assert np.allclose(sums, 1, atol=1e-2)


def test_attention_chart_has_selectors_and_small_data(run_dir):
    att = results.load_attention(run_dir / "attention.npz")
    spec = results.attention_chart(att, 0, "cross", min_weight=0.0).to_dict()
    data = next(iter(spec["datasets"].values()))
    assert len(data) == 2 * 3 * 5 * 4
    assert {p["name"]: p["bind"]["options"] for p in spec["params"]} == {"layer": [1, 2], "head": [1, 2, 3]}
    assert spec["params"][0]["value"] == 2  # the last layer first
    assert spec["encoding"]["x"]["scale"]["domain"] == [0, 1, 2, 3]
    assert spec["encoding"]["y"]["axis"]["labelExpr"] == '["<s>", "▁Ein", "▁Hund", "\\"", "."][datum.value]'
    cut = results.attention_chart(att, 0, "dec_self", max_positions=3).to_dict()
    assert len(next(iter(cut["datasets"].values()))) <= 2 * 3 * 3 * 3 and cut["encoding"]["x"]["scale"]["domain"] == [
        0,
        1,
        2,
    ]


def test_sentence_frame_and_error_profile():
    sources = ["A dog runs.", "Two cats.", "A man.", "Berlin"]
    refs = ["Ein Hund rennt.", "Zwei Katzen sitzen auf dem Sofa.", "Ein Mann.", "Berlin"]
    hyps = ["Ein Hund rennt.", "Zwei", "Ein Mann Mann Mann Mann Mann Mann.", "Berlin"]
    frame = results.sentence_frame(sources, refs, hyps)
    assert frame["bleu"].iloc[0] == pytest.approx(100.0) and frame["hyp_words"].tolist() == [3, 1, 7, 1]
    profile = results.error_profile(frame)
    assert profile["sentences"].to_dict() == {
        "empty output": 0,
        "a word 3 times in a row": 1,
        "under half the reference length": 1,
        "over 1.5 times the reference length": 1,
        "a broken character (U+FFFD)": 0,
        "copies the source": 1,
    }
    assert profile.loc["copies the source", "share %"] == 25.0
    assert math.isnan(profile.loc["empty output", "mean sentence BLEU"])
    with pytest.raises(ValueError, match="one line per source sentence"):
        results.sentence_frame(sources, refs, hyps[:3])


@pytest.mark.parametrize(
    "sentence, times, expected",
    [
        ("ein Mann einem einem einem", 3, True),
        ("ein ein Mann", 3, False),
        ("ein ein Mann", 2, True),
        ("", 3, False),
        ("a b a b a b", 2, False),
    ],
)
def test_repeats(sentence, times, expected):
    assert results.repeats(sentence, times) is expected


def test_benchmark_tables():
    train = {
        "results": {
            "aiayn": {
                "tokens_per_s": 500_000.0,
                "seconds_per_step": 0.05,
                "parameters": 63_000_000,
                "flops_per_step": 2e13,
                "mfu": 0.1,
            },
            "nn.Transformer": {
                "tokens_per_s": 400_000.0,
                "seconds_per_step": 0.0625,
                "parameters": 63_004_096,
                "flops_per_step": 2e13,
                "mfu": None,
            },
        }
    }
    table = results.train_benchmark_table(train)
    assert table.loc["aiayn", "ms per update"] == 50.0 and table.loc["aiayn", "MFU %"] == 10.0
    assert table.loc["nn.Transformer", "TFLOP per update"] == 20.0 and math.isnan(table.loc["nn.Transformer", "MFU %"])
    decode = {
        "results": {
            "cache": {"seconds": 2.0, "sentences_per_s": 500.0, "output_tokens_per_s": 7000.0},
            "no_cache": {"seconds": 8.0, "sentences_per_s": 125.0, "output_tokens_per_s": 1750.0},
        }
    }
    assert results.decode_benchmark_table(decode).to_dict("index") == {
        "cache": {"sentences/s": 500.0, "output tokens/s": 7000.0, "seconds": 2.0},
        "no_cache": {"sentences/s": 125.0, "output tokens/s": 1750.0, "seconds": 8.0},
    }


def test_results_reads_files_and_trains_nothing():
    """The results module imports no training code, and its splits are the experiment's."""
    import subprocess
    import sys

    code = (
        "import sys, aiayn.results; print(sorted(m for m in sys.modules if m.startswith('aiayn.') or "
        "m == 'torch.distributed'))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "aiayn.training" not in loaded and "aiayn.experiment" not in loaded and "aiayn.plan" not in loaded
    assert "aiayn.runs" not in loaded
    from aiayn.runs.config import SCORED

    assert results.SPLITS == SCORED
    assert set(results.GPU_RUNS) == set(__import__("aiayn.plan").plan.FINAL_RUNS)
    assert results.SEEDS == __import__("aiayn.plan").plan.SEEDS


def test_search_and_checks_tables(run_dir, tmp_path):
    m = metrics()
    m.update(
        train_config={"factor": 0.64, "warmup": 400},
        precision="bf16",
        warnings=[],
        checks={
            "outputs": {"test2016": {"sentences": 3, "distinct": 1.0, "most_common": "x", "most_common_share": 1 / 3}},
            "source": {"nll": 1.5, "nll_wrong_source": 4.0, "gain": 2.5},
            "warnings": [],
        },
    )
    for name in ("lr2e-3", "lr1e-3"):
        (tmp_path / "search" / name).mkdir(parents=True)
        (tmp_path / "search" / name / "metrics.json").write_text(json.dumps(m), encoding="utf-8")
    (tmp_path / "search" / "unfinished").mkdir()  # a run without metrics.json is not listed
    runs = results.search_runs(tmp_path / "search")
    assert list(runs) == ["lr1e-3", "lr2e-3"]
    table = results.search_table(runs)
    assert table.loc["lr2e-3", "peak lr (1e-3)"] == pytest.approx(1e3 * 0.64 * 256**-0.5 * 400**-0.5)
    assert table.loc["lr2e-3", "val BLEU"] == 40.5 and table.loc["lr2e-3", "source gain"] == 2.5
    assert table.loc["lr2e-3", "train min"] == pytest.approx(440.4 / 60)
    checks = results.checks_table({"a": runs["lr2e-3"], "b": results.load_run(run_dir)}, {"a": "ours", "b": "old"})
    assert checks.index.tolist() == ["ours"]  # a run written before the checks existed has no row
    assert checks.loc["ours", "distinct outputs %"] == 100.0 and checks.loc["ours", "val NLL, wrong source"] == 4.0


def test_every_stored_run_has_its_own_label():
    """Tables and legends key the runs by label: two runs under one label would show one of them twice."""
    runs = {name: results.load_run(results.RESULTS / name) for name in results.RUNS}
    labels = [results.label(name, run) for name, run in runs.items() if run is not None]
    assert len(labels) == len(set(labels)) and len(labels) >= 2, labels
