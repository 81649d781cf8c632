"""The GPU plan: every stage rehearsed on the CPU (tiny), the results chapters executed on what it wrote, and the
hand-over of a GPU stage's output into results/ and pretrained/."""

import json
import os
from pathlib import Path
import re
import subprocess
import sys

import pytest
import torch

from aiayn import plan, pretrained
from aiayn import ROOT
from aiayn.runs import config as run_config


def _tree(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*")) if folder.is_dir() else []


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory, multi30k_cache):
    """`python -m aiayn.plan rehearse`, as a reader would run it (a fresh process), once for this module."""
    out = tmp_path_factory.mktemp("plan") / "rehearsal"
    before = _tree(ROOT / "results"), _tree(ROOT / "pretrained"), pretrained.REGISTRY.read_bytes()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "aiayn.plan", "rehearse", "--out", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=1500,
    )
    after = _tree(ROOT / "results"), _tree(ROOT / "pretrained"), pretrained.REGISTRY.read_bytes()
    return out, done, before == after


def test_every_stage_runs_and_the_chapters_read_what_it_wrote(rehearsal):
    out, done, untouched = rehearsal
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads((out / "rehearsal.json").read_text())
    assert report["stages"] == dict.fromkeys(
        ("search", "recipes", "longer", "push", "confirm", "repeat", "floor", "final", "speed"), 0
    )
    assert report["chapters"] == {"12_results": "ok", "13_variations": "ok"}
    assert untouched, "the rehearsal changed results/, pretrained/ or aiayn/pretrained.json"
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["row"] in {"base", "A-h1", "R-factor1"} and recipe["chosen_on"] == "Multi30k val, sacreBLEU"
    summary = json.loads((out / "variations" / "summary.json").read_text())
    assert {r["row"] for r in summary["runs"]} == {"base", "A-h1", "R-factor1"} and summary["failed"] == []
    assert recipe["val_bleu_mean"] == max(r["val_bleu_mean"] for r in summary["by_row"].values())
    chosen = json.loads((out / plan.RECIPES / "recipes.json").read_text())
    means = {name: row["en-de"]["val"]["mean"] for name, row in chosen["candidates"].items()}
    assert set(means) == set(plan.PROFILES["tiny"]["recipes"]["candidates"]) and None not in means.values()
    assert chosen["chosen"] == max(means, key=means.get) and set(chosen["codes"].values()) == {0}
    # every tiny run fails its checks (it never converges), and the report names each with its warnings
    assert set(chosen["failed_checks"]) == set(chosen["codes"]) and all(chosen["failed_checks"].values())
    for name, changes in plan.PROFILES["tiny"]["recipes"]["candidates"].items():
        metrics = json.loads((out / plan.RECIPES / name / "en-de-seed0" / "metrics.json").read_text())
        assert set(metrics["bleu"]) == {"val", "test2016"}
        for field, value in (pair.split("=") for pair in changes.get("set", [])):
            assert float(metrics["model_config"][field]) == float(value), (name, field)
    for name, (direction, layers) in plan.FINAL_RUNS.items():
        metrics = json.loads((out / name / "metrics.json").read_text())
        assert (metrics["direction"], metrics["layers"]) == (direction, layers)
        assert metrics["provenance"]["concurrent_runs"] == plan.PROFILES["tiny"]["final"]["parallel"]
        assert set(metrics["bleu"]) == {"val", "test2016", "test2017", "mscoco2017", "test2018"}
    registry = json.loads((out / "pretrained" / "pretrained.json").read_text())
    assert set(registry) == {"gpu-en-de", "gpu-de-en"}
    model = pretrained.load(
        "gpu-en-de", registry_path=out / "pretrained" / "pretrained.json", folder=out / "pretrained"
    )
    assert isinstance(model.translate("Two dogs play in the snow."), str)
    for name in ("bench_train.json", "bench_decode.json", "bench_epoch.json", "layers_gpu.json", "scaling.json"):
        assert (out / name).is_file(), name
    scaling = json.loads((out / "scaling.json").read_text())
    assert [r["concurrent"] for r in scaling["results"]] == plan.PROFILES["tiny"]["scaling"]["concurrency"]
    assert scaling["best_concurrency"] in plan.PROFILES["tiny"]["scaling"]["concurrency"]


def test_the_executed_chapters_show_the_runs_not_the_missing_message(rehearsal):
    out, done, _ = rehearsal
    assert done.returncode == 0
    for name in ("12_results", "13_variations"):
        cells = json.loads((out / "chapters" / f"{name}.ipynb").read_text())["cells"]
        text = "".join(
            str(o.get("text", "")) + json.dumps(o.get("data", {}))
            for c in cells
            if c["cell_type"] == "code"
            for o in c.get("outputs", [])
        )
        assert "Traceback" not in text, name
        missing = re.findall(r"([\w.-]+): not stored yet", text)
        # GPU only, and the CPU runs, which live in results/, not in the rehearsal's folder
        assert set(missing) <= {
            "bench_train_compiled.json",
            "bench_train_multi30k.json",
            "cpu-en-de",
            "cpu-de-en",
            "cpu-fast-en-de",
            "cpu-fast-de-en",
            "cpu-fast-search",
            "cpu_levers.json",
            "cpu_levers_fast.json",
            "cpu_decoding.json",
            "curve.json",
            "cpu-floor-en-de",
            "cpu-floor-seeds",
            "cpu-search",
            "cpu-seeds",
            "cpu-variations",
            "gpu-search",
            "gpu-floor-16k",
            "gpu-levers",
        }, (name, missing)
    assert "floor" in json.dumps(json.loads((out / "chapters" / "12_results.ipynb").read_text()))


def test_cpu_runs_never_go_into_results(rehearsal, tmp_path):
    out, _, _ = rehearsal
    with pytest.raises(plan.PlanError, match="holds CPU runs"):
        plan.install(
            out, results=tmp_path / "results", models=tmp_path / "models", registry_path=tmp_path / "registry.json"
        )
    assert not (tmp_path / "results").exists()


def test_pack_and_install_a_gpu_stage(rehearsal, tmp_path):
    """A GPU stage's folder, packed into parts (as a GPU call returns it), lands in results/ and pretrained/."""
    out, _, _ = rehearsal
    stage = tmp_path / "final"
    (stage / "gpu-en-de").mkdir(parents=True)
    metrics = json.loads((out / "gpu-en-de" / "metrics.json").read_text())
    metrics["provenance"]["device"] = "cuda:0 (NVIDIA H200)"
    (stage / "gpu-en-de" / "metrics.json").write_text(json.dumps(metrics))
    (stage / "gpu-en-de" / "stray.pt").write_bytes(b"checkpoints are not results")
    (stage / "logs").mkdir()
    (stage / "logs" / "gpu-en-de.log").write_text("log")
    (stage / "pretrained").mkdir()
    for path in (out / "pretrained").iterdir():
        (stage / "pretrained" / path.name).write_bytes(path.read_bytes())
    parts = plan.pack(stage, tmp_path / "parts", part_bytes=50_000)
    assert len(parts) > 1 and all(p.stat().st_size <= 50_000 for p in parts)
    registry = tmp_path / "registry.json"
    registry.write_text(json.dumps({"other": {"file": "other.pt"}}))
    copied = plan.install(
        tmp_path / "parts", results=tmp_path / "results", models=tmp_path / "models", registry_path=registry
    )
    assert (tmp_path / "results" / "gpu-en-de" / "metrics.json").is_file() and not (
        tmp_path / "results" / "logs"
    ).exists()
    assert not list((tmp_path / "results").rglob("*.pt"))
    assert (tmp_path / "models" / "gpu-en-de.pt").read_bytes() == (out / "pretrained" / "gpu-en-de.pt").read_bytes()
    assert set(json.loads(registry.read_text())) == {"other", "gpu-en-de", "gpu-de-en"}
    assert str(tmp_path / "models" / "gpu-en-de.pt") in copied


def test_the_gpu_profile_needs_a_gpu_and_results_hold_no_rehearsal(tmp_path, capsys):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert plan.main(["run", "final", "--out", str(tmp_path / "x")]) == 2
    assert "needs a GPU" in capsys.readouterr().err
    assert plan.main(["run", "speed", "--profile", "tiny", "--out", str(ROOT / "results" / "x")]) == 2
    assert "holds GPU runs only" in capsys.readouterr().err
    assert plan.main(["rehearse", "--out", str(ROOT / "results" / "x")]) == 2
    assert "never go into results/" in capsys.readouterr().err
    assert not (ROOT / "results" / "x").exists()


def test_show_lists_every_stage_and_the_recipe_joins_the_profile():
    text = plan.show("gpu")
    assert text.count("\n") >= 3 and "search:" in text and "final:" in text and "speed: python" in text
    assert "recipes:" in text and "longer:" in text and plan.LONGER in text
    # the confirm stage runs the push stage's choice as push ran it (as many at once, as long), with other seeds
    push, confirm = plan.PROFILES["gpu"]["push"], plan.PROFILES["gpu"]["confirm"]
    chosen = json.loads((plan.ROOT / "results" / plan.PUSH / "recipes.json").read_text())["chosen"]
    assert confirm["candidates"] == {chosen: push["candidates"][chosen]} and 0 not in confirm["seeds"]
    assert {k: v for k, v in confirm.items() if "seeds" not in k and k != "candidates"} == {
        k: v for k, v in push.items() if "seeds" not in k and k != "candidates"
    }
    config = plan.recipe_config(
        {"changes": {"P_drop": 0.4}, "options": {"factor": 2.5, "max_tokens": 4000}},
        {"set": ["d_model=32", "P_drop=0.1"], "max_tokens": 2000, "warmup": 10},
    )
    assert config.set == ["d_model=32", "P_drop=0.4"]
    assert (config.max_tokens, config.train.warmup, config.train.factor) == (4000, 10, 2.5)
    assert plan.recipe_config(None, {"warmup": 10}).train.warmup == 10
    gpu = plan.recipe_config(None, plan.PROFILES["gpu"]["final"]["settings"])  # the GPU recipe, as named
    assert run_config.to_argv(gpu)[-2:] == ["--recipe", "gpu"] and gpu.max_tokens == 8192


def test_a_candidate_whose_run_failed_its_checks_is_not_chosen(tmp_path, monkeypatch):
    """The recipes stage (and the longer one) chooses on val among candidates whose runs passed their checks; a run
    that failed is named in the report with its warnings, whatever its BLEU."""
    scores = {"good": 30.0, "diverged": 35.0}

    def experiments(runs, logs, parallel):
        for run, argv in runs.items():
            folder = Path(argv[argv.index("--out") + 1])
            folder.mkdir(parents=True)
            bleu = {s: {"tok_lc": {"score": scores[run.split("/")[0]]}} for s in ("val", "test2016")}
            warnings = ["validation perplexity 128.7 is far above a converged run's"] if "diverged" in run else []
            (folder / "metrics.json").write_text(json.dumps({"bleu": bleu, "warnings": warnings}))
        return {run: 0 for run in runs}

    monkeypatch.setattr(plan, "_experiments", experiments)
    monkeypatch.setattr(plan.corpus, "encoded", lambda size: None)
    profile = {
        "bpe_size": 8000,
        "longer": {**plan.PROFILES["gpu"]["longer"], "candidates": {"good": {}, "diverged": {"set": ["N=6"]}}},
    }
    report = plan.recipes(profile, tmp_path, tmp_path / "scratch", "longer")
    assert report["chosen"] == "good" and list(report["failed_checks"]) == ["diverged/en-de-seed0"]
    assert report["candidates"]["diverged"]["en-de"]["val"]["mean"] == 35.0  # its score is kept, and shown
    assert json.loads((tmp_path / plan.LONGER / "recipes.json").read_text())["chosen"] == "good"
    assert report["provenance"]["command"] == "python -m aiayn.plan run longer"
    assert report["provenance"]["concurrent_runs"] == plan.PROFILES["gpu"]["longer"]["parallel"]  # its runs' number


def test_the_speed_stage_skips_what_is_done_and_stops_starting_at_its_budget(tmp_path, capsys):
    script = tmp_path / "bench.py"
    script.write_text("import sys, pathlib, time\ntime.sleep(0.05)\npathlib.Path(sys.argv[2]).write_text('{}')\n")
    profile = {"speed": [[str(script), "--out", "{out}/a.json"], [str(script), "--out", "{out}/b.json"]]}
    out = tmp_path / "speed"
    assert plan.speed(profile, out, budget_s=0.02) == {"bench#0": 0, "bench#1": 3}
    assert (out / "a.json").is_file() and not (out / "b.json").exists()
    assert "call the stage again with the same --out" in capsys.readouterr().out
    assert plan.speed(profile, out, budget_s=0.02) == {"bench#1": 0}  # a.json is done: skipped
    assert (out / "b.json").is_file() and "done before" in capsys.readouterr().out
