"""The one-command experiment: reference length, time budget, option errors, and a tiny run end to end."""
import json

import numpy as np
import pytest
import sacrebleu
import torch
from sacremoses import MosesTokenizer

from aiayn import bleu, data, experiment

TINY = ["--set", "d_model=32", "N=1", "d_ff=64", "h=2", "--bpe-size", "1000", "--max-tokens", "2000",
        "--warmup", "20", "--average-last", "2", "--decode-batch", "256", "--limit-train", "4"]
LINES = {"val": 1014, "test2016": 1000, "test2017": 1000, "mscoco2017": 461, "test2018": 1071}


def test_reference_length_is_wu_et_al(multi30k_cache):
    """Lowercasing before Moses gives Wu et al.'s 12,103 tokens; after it, "Bart." stays one token (an abbreviation)."""
    check = experiment.check_reference_length()
    assert check == {"test2016_de_tokens": 12103, "expected": 12103, "ok": True}
    refs = [de for _, de in data.load("test2016")]
    moses = MosesTokenizer(lang="de")
    assert sum(len(moses.tokenize(r, return_str=True).lower().split()) for r in refs) == 12102


def test_score_agrees_with_sacrebleu():
    hyps, refs = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee!"], ["Ein Mann fährt ein Fahrrad.",
                                                                                "Zwei Hunde spielen im Schnee."]
    s = experiment.score(hyps, refs, "de")
    assert s["sacrebleu"]["score"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    assert s["sacrebleu"]["aiayn_bleu"] == pytest.approx(s["sacrebleu"]["score"], abs=1e-9)
    assert "tok:13a" in s["sacrebleu"]["signature"] and "tok:none" in s["tok_lc"]["signature"]
    tok = experiment.moses_tokenize(refs, "de")
    assert tok[1] == "zwei hunde spielen im schnee ."
    assert s["tok_lc"]["ref_len"] == sum(len(t.split()) for t in tok)


@pytest.mark.parametrize("argv, message", [
    (["--set", "d_modle=32"], "expected FIELD=VALUE with FIELD one of"),
    (["--set", "N=six"], "not a number"),
    (["--set", "h=3"], "not divisible"),
    (["--set", "vocab_size=500"], "--bpe-size"),
    (["--preset", "huge"], "unknown --preset"),
    (["--average-last", "0"], "at least 1"),
])
def test_bad_options_say_what_to_do(tmp_path, capsys, argv, message):
    assert experiment.main(["--direction", "en-de", "--out", str(tmp_path / "out"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_unknown_direction_and_leftover_checkpoints(tmp_path, capsys):
    with pytest.raises(SystemExit):
        experiment.main(["--direction", "en-fr", "--out", str(tmp_path)])
    assert "invalid choice: 'en-fr'" in capsys.readouterr().err
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "step_00000001.pt").write_bytes(b"")
    assert experiment.main(["--direction", "en-de", "--out", str(tmp_path / "o"), "--ckpt-dir", str(tmp_path / "ck")]) == 2
    assert "pass --resume" in capsys.readouterr().err
    assert experiment.main(["--direction", "en-de", "--out", str(tmp_path / "o"),
                            "--ckpt-dir", str(tmp_path / "o" / "ck")]) == 2
    assert "inside --out" in capsys.readouterr().err


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads cost more than they give, the more so on a busy machine
    yield
    torch.set_num_threads(threads)


def test_end_to_end_tiny_run_then_resume(multi30k_cache, tmp_path, one_thread):
    out, ck = tmp_path / "results" / "en-de", tmp_path / "ck"
    base = ["--direction", "en-de", "--out", str(out), "--ckpt-dir", str(ck), *TINY]
    assert experiment.main([*base, "--max-updates", "6", "--time-budget", "3600"]) == 0
    assert experiment.main([*base, "--max-updates", "10", "--resume"]) == 0
    assert {p.name for p in out.iterdir()} == {"metrics.json", "history.json", "attention.npz",
                                               *(f"hyp.{s}.txt" for s in LINES)}
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["updates"] == 10 and metrics["stopped_by"] == "max_updates"
    assert json.loads((out / "history.json").read_text())["step"] == list(range(1, 11))
    assert metrics["reference_check"]["test2016_de_tokens"] == 12103
    assert metrics["model_config"]["d_model"] == 32 and metrics["model_config"]["vocab_size"] == 1000
    assert metrics["averaged_checkpoints"] == ["step_00000008.pt", "step_00000010.pt"]
    assert set(metrics["provenance"]) >= {"device", "torch", "git_commit", "git_dirty", "date", "command", "wall_s"}
    assert set(metrics["provenance"]["wall_s"]) == {"setup", "train", "average", "decode_and_score", "write", "total"}
    assert metrics["provenance"]["device"] == "cpu" and "--resume" in metrics["provenance"]["command"]
    assert set(metrics["val"]) == {"loss", "nll", "ppl"} and metrics["parameters"] > 0
    for split, n in LINES.items():
        hyps = (out / f"hyp.{split}.txt").read_text(encoding="utf-8").split("\n")
        assert len(hyps) == n + 1 and hyps[-1] == ""
        refs = [de for _, de in data.load(split)]
        ours, theirs = bleu.corpus_bleu(hyps[:-1], refs), sacrebleu.corpus_bleu(hyps[:-1], [refs])
        s = metrics["bleu"][split]
        assert s["sacrebleu"]["score"] == pytest.approx(theirs.score, abs=1e-9)
        assert ours.score == pytest.approx(theirs.score, abs=1e-9) and ours.sys_len == theirs.sys_len
        assert s["tok_lc"]["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:none")
        assert s["sentences"] == n
    assert metrics["bleu"]["test2016"]["tok_lc"]["ref_len"] == 12103
    with np.load(out / "attention.npz") as att:
        assert (out / "attention.npz").stat().st_size < 300_000
        for k in range(3):
            S, T = len(att[f"s{k}_src_tokens"]), len(att[f"s{k}_tgt_tokens"])
            assert att[f"s{k}_enc_self"].shape == (1, 2, S, S) and att[f"s{k}_enc_self"].dtype == np.float16
            assert att[f"s{k}_dec_self"].shape == (1, 2, T, T) and att[f"s{k}_cross"].shape == (1, 2, T, S)
            assert np.allclose(att[f"s{k}_cross"].astype(np.float32).sum(-1), 1, atol=1e-2)
            assert att[f"s{k}_tgt_tokens"][0] == "<s>" and att[f"s{k}_src_tokens"][-1] == "</s>"
    assert not list(out.rglob("*.pt"))


def test_benchmarks_run_quick_and_keep_out_of_results(multi30k_cache, tmp_path):
    """Both benchmark scripts run on the CPU with --quick; they refuse to write such a run into results/."""
    import os
    import subprocess
    import sys

    root = experiment.ROOT
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for script, keys in (("train_throughput.py", {"ratio_tokens_per_s", "results", "provenance", "flops_method"}),
                         ("decode_throughput.py", {"speedup_cache", "same_hypotheses", "results", "provenance"})):
        out = tmp_path / f"{script}.json"
        done = subprocess.run([sys.executable, str(root / "benchmarks" / script), "--quick", "--out", str(out)],
                              cwd=root, env=env, capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(out.read_text())
        assert keys <= set(report) and report["provenance"]["device"] == "cpu" and report["config"]["quick"]
        refused = subprocess.run([sys.executable, str(root / "benchmarks" / script), "--quick", "--out",
                                  str(root / "results" / "x.json")], cwd=root, env=env, capture_output=True, text=True)
        assert refused.returncode != 0 and "outside results/" in refused.stderr
    assert report["same_hypotheses"] is True
