"""The one-command experiment: reference length, time budget, option errors, and a tiny run end to end."""

import json
from dataclasses import fields
import os
from pathlib import Path

import numpy as np
import pytest
import sacrebleu
import torch
from sacremoses import MosesTokenizer

from aiayn import bleu, data, experiment
from aiayn.runs import config as run_config
from aiayn.runs import scoring
from aiayn.training import MULTI30K_TRAIN, RECIPES, TrainConfig

TINY = [
    "--set",
    "d_model=32",
    "N=1",
    "d_ff=64",
    "h=2",
    "--bpe-size",
    "1000",
    "--max-tokens",
    "2000",
    "--warmup",
    "20",
    "--average-last",
    "2",
    "--decode-batch",
    "256",
    "--limit-train",
    "4",
]
LINES = {"val": 1014, "test2016": 1000, "test2017": 1000, "mscoco2017": 461, "test2018": 1071}


def test_reference_length_is_wu_et_al(multi30k_cache):
    """Lowercasing before Moses gives Wu et al.'s 12,103 tokens; after it, "Bart." stays one token (an abbreviation)."""
    check = scoring.check_reference_length()
    assert check == {"test2016_de_tokens": 12103, "expected": 12103, "ok": True}
    refs = [de for _, de in data.load("test2016")]
    moses = MosesTokenizer(lang="de")
    assert sum(len(moses.tokenize(r, return_str=True).lower().split()) for r in refs) == 12102


def test_score_agrees_with_sacrebleu():
    hyps, refs = (
        ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee!"],
        ["Ein Mann fährt ein Fahrrad.", "Zwei Hunde spielen im Schnee."],
    )
    s = scoring.score(hyps, refs, "de")
    assert s["sacrebleu"]["score"] == pytest.approx(sacrebleu.corpus_bleu(hyps, [refs]).score, abs=1e-9)
    assert s["sacrebleu"]["aiayn_bleu"] == pytest.approx(s["sacrebleu"]["score"], abs=1e-9)
    assert "tok:13a" in s["sacrebleu"]["signature"] and "tok:none" in s["tok_lc"]["signature"]
    tok = scoring.moses_tokenize(refs, "de")
    assert tok[1] == "zwei hunde spielen im schnee ."
    assert s["tok_lc"]["ref_len"] == sum(len(t.split()) for t in tok)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--set", "d_modle=32"], "expected FIELD=VALUE with FIELD one of"),
        (["--set", "N=six"], "not a number"),
        (["--set", "h=3"], "not divisible"),
        (["--set", "vocab_size=500"], "--bpe-size"),
        (["--preset", "huge"], "unknown --preset"),
        (["--average-last", "0"], "at least 1"),
    ],
)
def test_bad_options_say_what_to_do(tmp_path, capsys, argv, message):
    assert experiment.main(["--direction", "en-de", "--out", str(tmp_path / "out"), *argv]) == 2
    assert message in capsys.readouterr().err


def test_unknown_direction_and_leftover_checkpoints(tmp_path, capsys):
    with pytest.raises(SystemExit):
        experiment.main(["--direction", "en-fr", "--out", str(tmp_path)])
    assert "invalid choice: 'en-fr'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        experiment.main(["--direction", "en-de", "--out", str(tmp_path), "--precision", "fp8"])
    assert "invalid choice: 'fp8'" in capsys.readouterr().err
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "step_00000001.pt").write_bytes(b"")
    assert (
        experiment.main(["--direction", "en-de", "--out", str(tmp_path / "o"), "--ckpt-dir", str(tmp_path / "ck")]) == 2
    )
    assert "pass --resume" in capsys.readouterr().err
    assert (
        experiment.main(
            ["--direction", "en-de", "--out", str(tmp_path / "o"), "--ckpt-dir", str(tmp_path / "o" / "ck")]
        )
        == 2
    )
    assert "inside --out" in capsys.readouterr().err


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads cost more than they give, the more so on a busy machine
    yield
    torch.set_num_threads(threads)


def test_end_to_end_tiny_run_then_continue(multi30k_cache, tmp_path, one_thread, capsys):
    first, out, ck = tmp_path / "results" / "first", tmp_path / "results" / "en-de", tmp_path / "ck"
    base = ["--direction", "en-de", "--ckpt-dir", str(ck), *TINY]
    assert experiment.main([*base, "--out", str(first), "--max-updates", "6", "--time-budget", "3600"]) == 0
    # a finished run stays as it is: --resume says so, a plain run refuses to overwrite it
    assert experiment.main([*base, "--out", str(first), "--max-updates", "10", "--resume"]) == 0
    assert "is finished" in capsys.readouterr().out
    assert json.loads((first / "metrics.json").read_text())["updates"] == 6
    assert experiment.main([*base, "--out", str(first), "--max-updates", "10"]) == 2
    assert "already holds the metrics.json" in capsys.readouterr().err
    # its checkpoints continue into a new --out
    assert experiment.main([*base, "--out", str(out), "--max-updates", "10", "--resume"]) == 0
    assert {p.name for p in out.iterdir()} == {
        "metrics.json",
        "history.json",
        "attention.npz",
        *(f"hyp.{s}.txt" for s in LINES),
    }
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["updates"] == 10 and metrics["stopped_by"] == "max_updates"
    assert json.loads((out / "history.json").read_text())["step"] == list(range(1, 11))
    assert metrics["reference_check"]["test2016_de_tokens"] == 12103
    assert metrics["model_config"]["d_model"] == 32 and metrics["model_config"]["vocab_size"] == 1000
    assert metrics["averaged_checkpoints"] == ["step_00000008.pt", "step_00000010.pt"]
    assert set(metrics["provenance"]) >= {
        "device",
        "torch",
        "git_commit",
        "git_dirty",
        "date",
        "command",
        "wall_s",
        "concurrent_runs",
        "cpu",
        "cpu_cores",
        "cpu_features",
        "threads",
    }
    assert set(metrics["provenance"]["wall_s"]) == {"setup", "train", "average", "decode_and_score", "write", "total"}
    assert metrics["provenance"]["device"].startswith("CPU: ") and "--resume" in metrics["provenance"]["command"]
    assert metrics["provenance"]["cpu_cores"] == os.cpu_count() and metrics["provenance"]["threads"] >= 1
    native = set(run_config.NATIVE_BF16) & set(metrics["provenance"]["cpu_features"])
    precision = "bf16" if native else "fp32"  # run_config.run_precision
    assert metrics["layers"] == "aiayn" and metrics["processes"] == 1 and metrics["precision"] == precision
    assert metrics["checks"]["source"].keys() == {"nll", "nll_wrong_source", "gain"}
    assert metrics["warnings"] == metrics["checks"]["warnings"] and metrics["warnings"]  # a tiny run: not converged
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


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--eps-ls", "1"], "--eps-ls must lie in [0, 1)"),
        (["--bpe-size", "200"], "--bpe-size must exceed"),
        (["--factor", "0"], "--factor must be positive"),
        (["--resume", "--eval-only"], "give one of them"),
        (["--pad-multiple", "0"], "--pad-multiple must be at least 1"),
    ],
)
def test_more_bad_options(tmp_path, capsys, argv, message):
    assert experiment.main(["--direction", "en-de", "--out", str(tmp_path / "out"), *argv]) == 2
    assert message in capsys.readouterr().err


def _python(code: str, tmp_path, *args, timeout=600, block_spacy=True, wait=True):
    """Run the experiment (or any code) in a fresh interpreter; with block_spacy, `import spacy` fails there."""
    import os
    import subprocess
    import sys

    prelude = (
        (
            "import sys\nclass _NoSpacy:\n    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'spacy':\n            raise ImportError('spaCy is blocked here')\n"
            "sys.meta_path.insert(0, _NoSpacy())\n"
        )
        if block_spacy
        else ""
    )
    script = tmp_path / "run_it.py"
    script.write_text(prelude + code)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(experiment.ROOT)}
    cmd = [sys.executable, str(script), *args]
    if not wait:
        return subprocess.Popen(
            cmd, cwd=experiment.ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
    return subprocess.run(cmd, cwd=experiment.ROOT, env=env, capture_output=True, text=True, timeout=timeout)


RUN_EXPERIMENT = "import sys\nfrom aiayn import experiment\nsys.exit(experiment.main(sys.argv[1:]))\n"


@pytest.fixture
def encoded_cache(multi30k_cache):
    """The encoded cache for the tiny runs (made here, with spaCy, so the runs under test can do without it)."""
    from aiayn import corpus

    corpus.encoded(1000)
    return multi30k_cache


def test_runs_without_spacy_from_the_encoded_cache(encoded_cache, tmp_path):
    """On a machine without spaCy (the GPU machine) a run reads the encoded cache and writes every output."""
    out = tmp_path / "out"
    done = _python(
        RUN_EXPERIMENT,
        tmp_path,
        "--direction",
        "de-en",
        "--out",
        str(out),
        "--ckpt-dir",
        str(tmp_path / "ck"),
        *TINY,
        "--max-updates",
        "2",
        "--max-output",
        "6",
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert {p.name for p in out.iterdir()} == {
        "metrics.json",
        "history.json",
        "attention.npz",
        *(f"hyp.{s}.txt" for s in LINES),
    }
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["direction"] == "de-en" and metrics["data"]["encoded_cache"].endswith(".pt")
    with np.load(out / "attention.npz") as att:
        assert att["s0_cross"].ndim == 4
    blocked = _python("import spacy\n", tmp_path)
    assert blocked.returncode != 0 and "spaCy is blocked here" in blocked.stderr  # the block did hold


def test_floor_layers_train_and_report(encoded_cache, tmp_path, one_thread):
    """--layers torch trains nn.Transformer's layers in the same pipeline; a mismatched resume is refused."""
    out, ck = tmp_path / "floor", tmp_path / "ck"
    base = ["--direction", "en-de", "--ckpt-dir", str(ck), *TINY, "--splits"]
    assert experiment.main([*base, "--out", str(out), "--layers", "torch", "--max-updates", "2"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["layers"] == "torch" and metrics["updates"] == 2 and metrics["bleu"] == {}
    assert experiment.main([*base, "--out", str(tmp_path / "again"), "--max-updates", "3", "--resume"]) == 2


def test_curve_scores_val_at_checkpoints_and_keeps_the_last(encoded_cache, tmp_path, one_thread):
    """--curve 2: every second checkpoint (and the last) beam-searched on val, each at the training time it was saved,
    beside the averaged model; the scratch folder keeps --average-last checkpoints; a resumed run gets no curve."""
    out, ck = tmp_path / "curve", tmp_path / "ck"
    argv = ["--direction", "en-de", "--ckpt-dir", str(ck), *TINY, "--max-updates", "5", "--save-every", "1"]
    assert experiment.main([*argv, "--splits", "val", "--out", str(out), "--curve", "2"]) == 0
    curve = json.loads((out / "curve.json").read_text())
    assert [p["step"] for p in curve["points"]] == [2, 4, 5]
    times = [p["train_s"] for p in curve["points"]]
    assert times == sorted(times) and 0 < times[-1] <= curve["averaged"]["train_s"] + 1
    assert all(0 <= p["val_bleu"] <= 100 for p in curve["points"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert curve["averaged"]["val_bleu"] == metrics["bleu"]["val"]["tok_lc"]["score"]
    assert len(list(ck.glob("step_*.pt"))) == 2
    assert experiment.main([*argv, "--out", str(tmp_path / "again"), "--curve", "2", "--resume"]) == 2


def test_interrupted_run_resumes(encoded_cache, tmp_path):
    """A run killed with SIGKILL mid-training continues from its newest checkpoint with --resume."""
    import time

    out, ck = tmp_path / "out", tmp_path / "ck"
    args = [
        "--direction",
        "en-de",
        "--out",
        str(out),
        "--ckpt-dir",
        str(ck),
        *TINY[:-2],
        "--splits",
        "--max-updates",
        "400",
        "--save-every",
        "1",
    ]
    proc = _python(RUN_EXPERIMENT, tmp_path, *args, wait=False)
    try:
        deadline = time.monotonic() + 300
        while not len(list(ck.glob("step_*.pt"))) >= 2 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert proc.poll() is None, proc.stdout.read()[-3000:]
    finally:
        proc.kill()
        proc.wait()
    assert not (out / "metrics.json").exists()
    saved = sorted(ck.glob("step_*.pt"))
    killed_at = int(saved[-1].stem.split("_")[1])
    assert 0 < killed_at < 400
    done = _python(RUN_EXPERIMENT, tmp_path, *args[:-4], "--max-updates", str(killed_at + 2), "--resume")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["updates"] == killed_at + 2
    history = json.loads((out / "history.json").read_text())["step"]
    assert history == list(range(1, killed_at + 3))


def test_two_processes_equal_one_with_accumulation(encoded_cache, tmp_path):
    """torchrun with 2 processes takes the same updates as 1 process accumulating 2 micro-batches (no dropout)."""
    import shutil
    import subprocess
    import sys

    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    if torchrun is None:
        pytest.skip("torchrun is not installed beside this Python")
    common = ["--direction", "en-de", *TINY, "--set", "P_drop=0", "--max-updates", "3", "--splits"]
    assert experiment.parse_args([*common, "--out", "x"]).set == ["d_model=32", "N=1", "d_ff=64", "h=2", "P_drop=0"]
    one = _python(
        RUN_EXPERIMENT,
        tmp_path,
        *common,
        "--accum",
        "2",
        "--out",
        str(tmp_path / "one"),
        "--ckpt-dir",
        str(tmp_path / "ck1"),
        block_spacy=False,
    )
    assert one.returncode == 0, one.stdout[-3000:] + one.stderr[-3000:]
    import os

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(experiment.ROOT)}
    two = subprocess.run(
        [
            torchrun,
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "aiayn.experiment",
            *common,
            "--out",
            str(tmp_path / "two"),
            "--ckpt-dir",
            str(tmp_path / "ck2"),
        ],
        cwd=experiment.ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert two.returncode == 0, two.stdout[-3000:] + two.stderr[-3000:]
    m1, m2 = (json.loads((tmp_path / n / "metrics.json").read_text()) for n in ("one", "two"))
    assert m1["processes"] == 1 and m2["processes"] == 2
    h1, h2 = (json.loads((tmp_path / n / "history.json").read_text()) for n in ("one", "two"))
    assert h1["step"] == h2["step"] == [1, 2, 3]
    assert h2["loss"] == pytest.approx(h1["loss"], rel=1e-4)
    assert m2["val"]["loss"] == pytest.approx(m1["val"]["loss"], rel=1e-4)
    w1 = torch.load(sorted((tmp_path / "ck1").glob("step_*.pt"))[-1], weights_only=False)["model"]
    w2 = torch.load(sorted((tmp_path / "ck2").glob("step_*.pt"))[-1], weights_only=False)["model"]
    for name in w1:
        assert torch.allclose(w1[name], w2[name], rtol=1e-4, atol=1e-6), name


def test_benchmarks_run_quick_and_keep_out_of_results(multi30k_cache, tmp_path):
    """The benchmark scripts run on the CPU with --quick; they refuse to write such a run into results/."""
    import os
    import subprocess
    import sys

    root = experiment.ROOT
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for script, keys in (
        ("train_throughput.py", {"ratio_tokens_per_s", "results", "provenance", "flops_method"}),
        ("decode_throughput.py", {"speedup_cache", "same_hypotheses", "results", "provenance"}),
        ("epoch_cost.py", {"batches", "loop", "provenance"}),
    ):
        out = tmp_path / f"{script}.json"
        done = subprocess.run(
            [sys.executable, str(root / "benchmarks" / script), "--quick", "--out", str(out)],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        report = json.loads(out.read_text())
        assert keys <= set(report) and report["provenance"]["device"].startswith("CPU: ") and report["config"]["quick"]
        assert report.get("same_hypotheses", True) is True
        refused = subprocess.run(
            [sys.executable, str(root / "benchmarks" / script), "--quick", "--out", str(root / "results" / "x.json")],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        assert refused.returncode != 0 and "outside results/" in refused.stderr
    assert report["batches"]["batches_per_epoch"] > 0 and report["loop"]["ratio_book_over_bare"] > 0


def test_cpu_levers_measures_the_written_out_route(encoded_cache, tmp_path):
    """benchmarks/cpu_levers.py, one short round (against the CPU recipe, whose vocabulary is cached): every variant
    trains and is set against the recipe's rate."""
    import subprocess
    import sys

    out = tmp_path / "levers.json"
    argv = ["--recipe", "cpu", "--steps", "1", "--rounds", "1", "--only", "recipe", "math_attention", "no_dropout"]
    done = subprocess.run(
        [sys.executable, str(experiment.ROOT / "benchmarks" / "cpu_levers.py"), *argv, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(out.read_text())
    assert report["config"]["recipe"] == "cpu" and set(report["results"]) == {"recipe", "math_attention", "no_dropout"}
    assert all(v["ratio_tokens"] > 0 for v in report["results"].values())


def test_recipe_fills_what_the_command_line_leaves_out():
    """--recipe cpu sets its settings; options given beside it win; without a recipe the defaults hold."""
    cpu = RECIPES["cpu"]
    args = experiment.parse_args(["--direction", "en-de", "--out", "x", "--recipe", "cpu"])
    assert (args.max_tokens, args.train.warmup, args.train.factor, args.train.epochs) == (
        cpu["max_tokens"],
        cpu["warmup"],
        cpu["factor"],
        cpu["epochs"],
    )
    assert args.time_budget == cpu["time_budget"] and args.train.clip_norm == cpu["clip_norm"]
    assert run_config.model_overrides(args.set) == cpu["set"]
    args = experiment.parse_args(
        ["--direction", "en-de", "--out", "x", "--recipe", "cpu", "--factor", "0.3", "--set", "N=2", "P_drop=0.2"]
    )
    assert args.train.factor == 0.3 and args.train.warmup == cpu["warmup"]
    assert run_config.model_overrides(args.set) == {**cpu["set"], "N": 2, "P_drop": 0.2}
    twice = ["--direction", "en-de", "--out", "x", "--recipe", "cpu", "--factor", "0.3", "--set", "N=2", "--set"]
    assert experiment.parse_args([*twice, "P_drop=0.2"]) == args  # a second --set adds to the first
    plain = experiment.parse_args(["--direction", "en-de", "--out", "x"])
    assert plain == run_config.RunConfig(direction="en-de", out="x") and plain.set == []
    assert plain.train == TrainConfig(**MULTI30K_TRAIN, progress=False)  # the training's defaults are chapter 10's
    # one declaration: the command line is generated from RunConfig and the TrainConfig it nests, and a config's
    # command line parses back to it
    assert {a.dest for a in experiment.parser()._actions} - {"help"} == set(run_config.RunConfig().flat())
    assert set(run_config.TRAIN_OPTIONS) < {f.name for f in fields(TrainConfig)}
    assert experiment.parse_args(experiment.to_argv(args)) == args
    with pytest.raises(run_config.ExperimentError, match="no setting"):
        plain.replace(warmpu=10)
    with pytest.raises(SystemExit):
        experiment.parse_args(["--direction", "en-de", "--out", "x", "--recipe", "laptop"])
