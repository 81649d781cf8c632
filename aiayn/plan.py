"""The book's GPU runs as one plan, and a rehearsal of the whole plan on the CPU.

The results chapters (§4's timings, §6.1, §6.2) read what these stages write. On a GPU each stage fits one call of
at most ten minutes; the rehearsal runs every stage in a tiny configuration on the CPU, into a temporary folder (never
results/), and then executes the results chapters on what it wrote. The GPU runs differ from the rehearsal only by
the profile: model sizes, time budgets and how many runs share the device.

    python -m aiayn.plan show [--profile gpu]          # every stage's commands
    python -m aiayn.plan run search --out DIR          # on the GPU: throughput of 1-8 runs at once, Table 3 on val
    python -m aiayn.plan run recipes --out DIR         # candidate recipes side by side, 3 seeds each, chosen on val
    python -m aiayn.plan run longer --out DIR          # the same with fewer runs at once: more epochs each
    python -m aiayn.plan run push --out DIR            # four runs at once, so each trains twice as long as in longer
    python -m aiayn.plan run confirm --out DIR         # the push stage's choice, as push ran it: more seeds of it
    python -m aiayn.plan run repeat --out DIR          # the longer stage's choice: three seeds, both directions
    python -m aiayn.plan run floor --out DIR           # the same with nn.Transformer's layers: the floor, as repeat ran
    python -m aiayn.plan run final --out DIR           # both directions and the floor (--recipe gpu), more seeds;
                                                       # the decoding benchmark; pretrained files
    python -m aiayn.plan run speed --out DIR           # the benchmarks, the fp16 path (again: what did not fit)
    python -m aiayn.plan rehearse --out DIR            # all of it, tiny, on the CPU; then the chapters
    python -m aiayn.plan pack DIR --into OUT           # DIR as tar.gz parts of at most 15 MB (what a GPU call returns)
    python -m aiayn.plan install PARTS_OR_DIR          # a GPU run's results into results/ and pretrained/

Not about the paper: it schedules runs of aiayn.experiment and aiayn.variations. The model, its training and the recipes
live in the chapters' modules (aiayn.model, aiayn.training).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import torch

from aiayn import ROOT, corpus, variations
from aiayn.runs import config as run_config
from aiayn.runs import launch

STAGES = ("search", "recipes", "longer", "push", "confirm", "repeat", "floor", "final", "speed")
FINAL_RUNS = {
    "gpu-en-de": ("en-de", "aiayn"),
    "gpu-de-en": ("de-en", "aiayn"),
    "gpu-floor-en-de": ("en-de", "torch"),
    "gpu-floor-de-en": ("de-en", "torch"),
}
RECIPES = "gpu-recipes"  # the recipes stage's folder: candidate recipes, several seeds each
LONGER = "gpu-longer"  # the longer stage's: fewer runs at once, so each trains for more epochs
PUSH = "gpu-push"  # the push stage's: four runs at once, so each trains for about twice the longer stage's epochs
CONFIRM = "gpu-confirm"  # the confirm stage's: the push stage's choice, other seeds, four at once as push ran them
REPEAT = "gpu-repeat"  # the repeat stage's: the longer stage's choice, three seeds in each direction
FLOOR = "gpu-floor-repeat"  # the floor stage's: the repeat stage's runs with PyTorch's layers
FOLDERS = {"recipes": RECIPES, "longer": LONGER, "push": PUSH, "confirm": CONFIRM, "repeat": REPEAT, "floor": FLOOR}
SEEDS = "gpu-seeds"  # more seeds of the two directions (val and test 2016 only), for the spread between seeds
# Table 3's rows as the GPU stage trains them (results/variations)
TABLE3 = [
    "base",
    "A-h1",
    "A-h2",
    "A-h8",
    "A-h16",
    "B-d_k16",
    "C-N2",
    "C-N6",
    "C-d_model128",
    "C-d_model512",
    "C-d_ff512",
    "C-d_ff2048",
    "D-P_drop0",
    "D-P_drop0.1",
    "D-eps_ls0",
    "E-learned",
]

# the rehearsal's model and run: small enough for a 2-core CPU to run every stage in minutes
TINY = {
    "set": ["d_model=32", "N=1", "d_ff=64", "h=2"],
    "max_tokens": 2000,
    "limit_train": 3,
    "max_updates": 6,
    "warmup": 10,
}
PROFILES = {
    "gpu": {
        "bpe_size": 8000,
        "scaling": {"concurrency": [8], "budget": 45, "settings": {}},
        "variations": {
            "rows": TABLE3,
            "parallel": 8,
            "budget": 250,
            "total": 530,
            "settings": {"max_tokens": 4096, "warmup": 1000, "factor": 0.5},
        },
        # candidate recipes against the gpu recipe, three seeds each, scored on val (the choice) and test 2016
        "recipes": {
            "parallel": 16,
            "budget": 480,
            "eval_reserve": 80,
            "seeds": [0, 1, 2],
            "reverse_seeds": [0],
            "settings": {"recipe": "gpu"},
            "candidates": {
                "gpu": {},
                "gpu-16k": {"max_tokens": 16384},
                "wide-p3": {"set": ["d_model=512", "d_ff=1024", "P_drop=0.3"]},
                "wide-p3-16k": {"set": ["d_model=512", "d_ff=1024", "P_drop=0.3"], "max_tokens": 16384},
            },
        },
        # the recipes stage again with six runs at once rather than sixteen, so that each run trains for about
        # three times as many epochs: larger and more regularised models against the chosen candidate
        "longer": {
            "parallel": 6,
            "budget": 450,
            "eval_reserve": 80,
            "seeds": [0],
            "reverse_seeds": [],
            "settings": {"recipe": "gpu"},
            "candidates": {
                "gpu-16k": {"max_tokens": 16384},
                "p3-16k": {"set": ["P_drop=0.3"], "max_tokens": 16384},
                "deep-p3-16k": {"set": ["N=6", "d_ff=1024", "P_drop=0.3"], "max_tokens": 16384},
                "wide-p3-16k": {"set": ["d_model=512", "d_ff=1024", "P_drop=0.3"], "max_tokens": 16384},
                "p3-32k": {"set": ["P_drop=0.3"], "max_tokens": 32768},
                "wide-p3-32k": {"set": ["d_model=512", "d_ff=1024", "P_drop=0.3"], "max_tokens": 32768},
            },
        },
        # the longer stage's lesson (the same recipe scored 39.7 on val at 33 epochs, 41.1 at 79): the longer stage
        # with four runs at once, so each trains for about twice as many epochs again; the chosen recipe against more
        # regularised ones (what is not given here is the longer stage's, below)
        "push": {
            "parallel": 4,
            "budget": 480,
            "eval_reserve": 40,
            "candidates": {
                "gpu-16k": {"max_tokens": 16384},
                "p3-16k": {"set": ["P_drop=0.3"], "max_tokens": 16384},
                "p3-ff1024-16k": {"set": ["P_drop=0.3", "d_ff=1024"], "max_tokens": 16384},
                "wide-p3-16k": {"set": ["d_model=512", "d_ff=1024", "P_drop=0.3"], "max_tokens": 16384},
            },
        },
        # the push stage's choice (wide-p3-16k, on val) as push ran it, four at once for as long: EN→DE seeds 1 and 2
        # (push ran seed 0) and DE→EN seeds 0 and 1, for the mean and spread of what the push stage chose
        "confirm": {"seeds": [1, 2], "reverse_seeds": [0, 1], "chosen": "wide-p3-16k"},
        # the longer stage's choice (gpu-16k, on val) with as many runs at once: three seeds in each direction, for
        # the mean and spread of the recipe that the longer stage chose
        "repeat": {
            "parallel": 6,
            "budget": 470,
            "eval_reserve": 40,
            "seeds": [0, 1, 2],
            "reverse_seeds": [0, 1, 2],
            "settings": {"recipe": "gpu"},
            "candidates": {"gpu-16k": {"max_tokens": 16384}},
        },
        "final": {"parallel": 8, "budget": 520, "seeds": [1, 2], "settings": {"recipe": "gpu"}},
        "speed": [
            ["benchmarks/train_throughput.py", "--out", "{out}/bench_train.json"],
            [
                "benchmarks/train_throughput.py",
                "--compile",
                "--compile-reference",
                "--out",
                "{out}/bench_train_compiled.json",
            ],
            [
                "benchmarks/train_throughput.py",
                "--preset",
                "multi30k",
                "--batch",
                "320",
                "--length",
                "24",
                "--out",
                "{out}/bench_train_multi30k.json",
            ],
            [
                "benchmarks/train_throughput.py",
                "--preset",
                "multi30k",
                "--batch",
                "320",
                "--length",
                "24",
                "--precision",
                "fp16",
                "--out",
                "{out}/bench_train_multi30k_fp16.json",
            ],
            ["benchmarks/layers.py", "--out", "{out}/layers_gpu.json"],
            ["benchmarks/epoch_cost.py", "--out", "{out}/bench_epoch.json"],
            ["benchmarks/compile_check.py", "--out", "{out}/bench_compile.json"],
        ],
        "decode": ["benchmarks/decode_throughput.py", "--ckpt-dir", "{ckpt}", "--out", "{out}/bench_decode.json"],
    },
    # the rehearsal: the same stages with a model and budgets that a 2-core CPU runs in minutes; the runs stop at
    # TINY's max_updates, and the budgets leave room for their set-up on a machine busy with other tests
    "tiny": {
        "bpe_size": 1000,
        "scaling": {
            "concurrency": [1, 2],
            "budget": 30,
            "settings": TINY,
        },
        "variations": {
            "rows": ["base", "A-h1", "R-factor1"],
            "parallel": "auto",
            "budget": 90,
            "total": 360,
            "settings": {
                "base_set": TINY["set"],
                **{k: v for k, v in TINY.items() if k != "set"},
                "max_output": 6,
                "eval_reserve": 40,
            },
        },
        "recipes": {
            "parallel": 2,
            "budget": 90,
            "eval_reserve": 40,
            "seeds": [0],
            "reverse_seeds": [],
            "settings": {**TINY, "max_output": 6},
            "candidates": {"tiny": {}, "tiny-p1": {"set": ["P_drop=0.1"]}},
        },
        "longer": {
            "parallel": 1,
            "budget": 90,
            "eval_reserve": 35,
            "seeds": [0],
            "reverse_seeds": [],
            "settings": {**TINY, "max_output": 6},
            "candidates": {"tiny": {}},
        },
        "confirm": {"seeds": [1], "reverse_seeds": [], "chosen": "tiny"},  # one run, for the plumbing
        "repeat": {
            "parallel": 2,
            "budget": 90,
            "eval_reserve": 35,
            "seeds": [0],
            "reverse_seeds": [0],
            "settings": {**TINY, "max_output": 6},
            "candidates": {"tiny": {}},
        },
        "final": {
            "parallel": 2,
            "budget": 150,
            "seeds": [],
            "settings": {**TINY, "average_last": 2, "max_output": 6, "decode_batch": 256, "eval_reserve": 100},
        },
        "speed": [
            ["benchmarks/train_throughput.py", "--quick", "--out", "{out}/bench_train.json"],
            [
                "benchmarks/train_throughput.py",
                "--quick",
                "--precision",
                "fp16",
                "--out",
                "{out}/bench_train_multi30k_fp16.json",
            ],
            ["benchmarks/layers.py", "--quick", "--out", "{out}/layers_gpu.json"],
            ["benchmarks/epoch_cost.py", "--quick", "--bpe-size", "1000", "--out", "{out}/bench_epoch.json"],
        ],
        "decode": [
            "benchmarks/decode_throughput.py",
            "--ckpt-dir",
            "{ckpt}",
            "--limit",
            "16",
            "--out",
            "{out}/bench_decode.json",
        ],
    },
}
# the push stage: the longer stage but for what the profile changes; the confirm stage: the push stage with the seeds
# the profile gives, for the candidate it chose; the floor stage: the repeat stage's runs, as many at once and for as
# long, with nn.Transformer's layers
for _profile in PROFILES.values():
    _profile["push"] = {**_profile["longer"], **_profile.get("push", {})}
    _confirm = {**_profile["push"], **_profile["confirm"]}
    _chosen = _confirm.pop("chosen")
    _profile["confirm"] = {**_confirm, "candidates": {_chosen: _profile["push"]["candidates"][_chosen]}}
    _repeat = _profile["repeat"]
    _floor = {name: {**changes, "layers": "torch"} for name, changes in _repeat["candidates"].items()}
    _profile["floor"] = {**_repeat, "candidates": _floor}


class PlanError(RuntimeError):
    """A stage that cannot run as asked; the message says what to do."""


def _python(args: list[str], log: Path, env: dict | None = None) -> int:
    """Run `python ARGS` from the repository root, its output into `log` (and a line on the console)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    with open(log, "w", encoding="utf-8") as handle:
        code = subprocess.run(
            [sys.executable, *args],
            cwd=ROOT,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        ).returncode
    print(
        f"{'ok' if code == 0 else f'FAILED ({code})'} in {time.perf_counter() - start:.0f} s: python "
        f"{' '.join(args)}  [{log}]",
        flush=True,
    )
    return code


def _experiments(runs: dict[str, list[str]], out: Path, parallel: int) -> dict[str, int | None]:
    """Several `python -m aiayn.experiment` runs, `parallel` at a time, each with its own log; name -> exit code."""
    return launch.run_all([launch.Job(name, argv, out / f"{name}.log") for name, argv in runs.items()], parallel)


def scaling(profile: dict, out: Path, scratch: Path) -> dict:
    """Training throughput of 1, 2, 4, ... runs sharing the device: per run and in total (target tokens/s)."""
    p = profile["scaling"]
    report = {"budget_s": p["budget"], "results": []}
    for k in p["concurrency"]:
        runs = {
            f"k{k}-{i}": run_config.to_argv(
                run_config.RunConfig().replace(
                    direction="en-de",
                    out=str(out / "scaling" / f"k{k}-{i}"),
                    ckpt_dir=str(scratch / "scaling" / f"k{k}-{i}"),
                    bpe_size=profile["bpe_size"],
                    time_budget=p["budget"],
                    eval_reserve=10.0,
                    splits=[],
                    epochs=1000,
                    seed=i,
                    **p["settings"],
                )
            )
            for i in range(k)
        }
        codes = _experiments(runs, out / "scaling", k)
        rates = []
        for name in runs:
            metrics = json.loads((out / "scaling" / name / "metrics.json").read_text()) if codes[name] == 0 else None
            rates.append(metrics["train_target_tokens_per_s"] if metrics else None)
        done = [r for r in rates if r]
        report["results"].append({"concurrent": k, "per_run": rates, "total": sum(done) if len(done) == k else None})
        print(f"{k} at once: {sum(done):,.0f} target tokens/s in total" if len(done) == k else f"{k} at once: failed")
    best = max((r for r in report["results"] if r["total"]), key=lambda r: r["total"], default=None)
    report["best_concurrency"] = best["concurrent"] if best else 1
    report["provenance"] = _provenance("search")
    (out / "scaling.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    shutil.rmtree(scratch / "scaling", ignore_errors=True)
    return report


def _provenance(stage: str) -> dict:
    from aiayn.runs.provenance import provenance

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return provenance(f"python -m aiayn.plan run {stage}", device)


def search(profile: dict, out: Path, scratch: Path, started: float) -> dict:
    """Scaling, then the Table 3 rows and the recipe rows on validation, then the recipe: the best row on val BLEU."""
    corpus.encoded(profile["bpe_size"])
    report = scaling(profile, out, scratch)
    p = profile["variations"]
    parallel = report["best_concurrency"] if p["parallel"] == "auto" else p["parallel"]
    rows = variations.select(p["rows"])
    waves = -(-len(rows) // parallel)
    if p["budget"] == "fit":  # what is left of the stage's time, shared out among the waves
        budget = int((p["total"] - (time.perf_counter() - started)) // waves)
        if budget < 60:
            raise PlanError(
                f"only {budget} s per run are left for {waves} waves of {parallel} runs; give the stage "
                f"more time or fewer rows"
            )
    else:
        budget = p["budget"]
    argv = [
        "--rows",
        *p["rows"],
        "--parallel",
        str(parallel),
        "--budget",
        str(budget),
        "--max-total",
        str(waves * budget),
        "--out",
        str(out / "variations"),
        "--ckpt-root",
        str(scratch / "variations"),
        *_flags({"bpe_size": profile["bpe_size"], **p["settings"]}),
    ]
    code = variations.main(argv)
    summary = json.loads((out / "variations" / "summary.json").read_text())
    recipe = {**variations.best_row(summary), "parallel": parallel, "budget_s": budget, "variations_exit": code}
    (out / "recipe.json").write_text(json.dumps(recipe, indent=1) + "\n", encoding="utf-8")
    print(f"recipe, chosen on validation BLEU: {recipe['row']} ({recipe['val_bleu_mean']:.2f})", flush=True)
    return recipe


def _flags(settings: dict) -> list[str]:
    """A command line from settings: --name value (a list gives several values)."""
    argv = []
    for name, value in settings.items():
        argv += [f"--{name.replace('_', '-')}", *map(str, value if isinstance(value, list) else [value])]
    return argv


def recipe_config(recipe: dict | None, settings: dict) -> run_config.RunConfig:
    """The final runs' settings (direction and folders still to be given): the profile's, then the chosen row's
    model changes and experiment options."""
    given = {k: v for k, v in settings.items() if k != "set"}
    config = run_config.recipe_config(settings.get("recipe")).replace(**given)
    changes = dict(pair.partition("=")[::2] for pair in settings.get("set", []))
    if recipe:
        changes.update(recipe["changes"])
        config = config.replace(**recipe["options"])
    config.set = run_config.merge_set(config.set, changes)
    return config


def _bleu(run: Path, split: str) -> float | None:
    """A run's lowercased tokenised BLEU on a split (the literature's; sacreBLEU's when sacremoses is missing)."""
    path = run / "metrics.json"
    if not path.exists():
        return None
    scores = json.loads(path.read_text())["bleu"].get(split)
    return (scores.get("tok_lc") or scores["sacrebleu"])["score"] if scores else None


def _spread(values: list[float | None]) -> dict:
    """Mean, lowest and highest of the values there are, and how many there are."""
    done = [v for v in values if v is not None]
    mean = sum(done) / len(done) if done else None
    return {"mean": mean, "min": min(done, default=None), "max": max(done, default=None), "n": len(done)}


def failed_checks(out: Path, runs) -> dict[str, list[str]]:
    """The runs under `out` whose metrics.json holds warnings (a run that did not converge, ignores its source or
    repeats itself): run -> its warnings."""
    failed = {}
    for run in runs:
        path = out / run / "metrics.json"
        warnings = json.loads(path.read_text()).get("warnings") if path.exists() else None
        if warnings:
            failed[run] = warnings
    return failed


def recipes(profile: dict, out: Path, scratch: Path, stage: str = "recipes") -> dict:
    """Candidate recipes, several seeds each, side by side: EN→DE on val and test 2016, DE→EN with fewer seeds.
    The recipe is the candidate with the best mean val BLEU of EN→DE; test 2016 is reported, never used to choose.
    Writes `out`/FOLDERS[stage]/ (gpu-recipes/ for the recipes stage): a folder of runs per candidate, their logs, and
    recipes.json."""
    p, out, scratch = profile[stage], out / FOLDERS[stage], scratch / FOLDERS[stage]
    settings = {"bpe_size": profile["bpe_size"], **p["settings"]}
    corpus.encoded(settings["bpe_size"])
    runs, spec = {}, {}
    for name, changes in p["candidates"].items():
        row = {"changes": dict(x.partition("=")[::2] for x in changes.get("set", []))}
        config = recipe_config(row | {"options": {k: v for k, v in changes.items() if k != "set"}}, settings)
        for direction, seeds in (("en-de", p["seeds"]), ("de-en", p["reverse_seeds"])):
            for seed in seeds:
                run = f"{name}/{direction}-seed{seed}"
                spec[run] = (name, direction)
                runs[run] = run_config.to_argv(
                    config.replace(
                        direction=direction,
                        seed=seed,
                        splits=["val", "test2016"],
                        out=str(out / run),
                        ckpt_dir=str(scratch / run),
                        time_budget=float(p["budget"]),
                        eval_reserve=float(p["eval_reserve"]),
                    )
                )
                shutil.rmtree(scratch / run, ignore_errors=True)
    codes = _experiments(runs, out / "logs", p["parallel"])
    report = {"candidates": {}, "codes": codes}
    for name, changes in p["candidates"].items():
        row = {"changes": changes}
        for direction in ("en-de", "de-en"):
            names = [r for r, (c, d) in spec.items() if c == name and d == direction]
            row[direction] = {split: _spread([_bleu(out / r, split) for r in names]) for split in ("val", "test2016")}
        report["candidates"][name] = row
    report["failed_checks"] = failed_checks(out, runs)
    # a tiny rehearsal never converges: its candidates are chosen among all the same, to rehearse the plumbing
    failed = {spec[run][0] for run in report["failed_checks"]} if profile is not PROFILES["tiny"] else set()
    scored = {n: r["en-de"]["val"]["mean"] for n, r in report["candidates"].items() if n not in failed}
    scored = {n: v for n, v in scored.items() if v is not None}
    report["chosen"] = max(scored, key=scored.get) if scored else None
    report["provenance"] = {**_provenance(stage), "concurrent_runs": p["parallel"]}  # its runs', not its own
    (out / "recipes.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    for name, row in report["candidates"].items():
        cells = [
            f"{d} {s} {row[d][s]['mean']:.2f} ({row[d][s]['min']:.2f}-{row[d][s]['max']:.2f}, n={row[d][s]['n']})"
            for d in ("en-de", "de-en")
            for s in ("val", "test2016")
            if row[d][s]["n"]
        ]
        print(f"{name}: " + "; ".join(cells), flush=True)
    for run, warnings in report["failed_checks"].items():
        print(f"{run} failed its checks, and its candidate is not chosen: {'; '.join(warnings)}", flush=True)
    print(f"recipe, chosen on validation BLEU: {report['chosen']}", flush=True)
    for run in runs:
        shutil.rmtree(scratch / run, ignore_errors=True)
    return report


def final(profile: dict, out: Path, scratch: Path, recipe_path: Path | None) -> dict[str, int]:
    """Both directions with the recipe and with PyTorch's layers, side by side; the decoding benchmark; the files of
    the trained models for readers (`aiayn.pretrained`)."""
    from aiayn import pretrained

    recipe = json.loads(Path(recipe_path).read_text()) if recipe_path else None
    p = profile["final"]
    common = recipe_config(recipe, {"bpe_size": profile["bpe_size"], **p["settings"]})
    corpus.encoded(common.bpe_size)
    specs = {name: (direction, layers, {}) for name, (direction, layers) in FINAL_RUNS.items()}
    specs.update(
        {
            f"{SEEDS}/{direction}-seed{seed}": (direction, "aiayn", {"seed": seed, "splits": ["val", "test2016"]})
            for seed in p["seeds"]
            for direction in ("en-de", "de-en")
        }
    )
    runs = {
        name: run_config.to_argv(
            common.replace(
                direction=direction,
                layers=layers,
                out=str(out / name),
                ckpt_dir=str(scratch / name),
                time_budget=float(p["budget"]),
                **extra,
            )
        )
        for name, (direction, layers, extra) in specs.items()
    }
    for name in runs:
        shutil.rmtree(scratch / name, ignore_errors=True)
    codes = _experiments(runs, out / "logs", p["parallel"])
    if codes.get("gpu-en-de") == 0:
        command = [arg.format(out=out, ckpt=scratch / "gpu-en-de") for arg in profile["decode"]]
        codes["bench_decode"] = _python(command, out / "logs" / "bench_decode.log")
    for name in ("gpu-en-de", "gpu-de-en"):
        if codes.get(name) == 0:
            # a tiny rehearsal never converges: its models are exported to rehearse the plumbing
            entry = pretrained.export(
                name,
                scratch / name,
                out / name,
                folder=out / "pretrained",
                registry_path=out / "pretrained" / "pretrained.json",
                allow_failed=profile is PROFILES["tiny"],
            )
            print(f"model file {name}: {entry['bytes'] / 1e6:.1f} MB", flush=True)
    if recipe:
        (out / "recipe.json").write_text(json.dumps(recipe, indent=1) + "\n", encoding="utf-8")
    return codes


SPEED_BUDGET_S = 450  # a benchmark is not started after this many seconds of the stage: one call lasts 10 minutes


def speed(profile: dict, out: Path, budget_s: float = SPEED_BUDGET_S) -> dict[str, int]:
    """The benchmark scripts, one after the other (each owns the device while it measures).

    A benchmark whose report exists is skipped, and none starts after `budget_s` seconds: calling the stage again
    (same --out) runs what is left.
    """
    started, codes = time.perf_counter(), {}
    for i, cmd in enumerate(profile["speed"]):
        name, argv = Path(cmd[0]).stem + f"#{i}", [c.format(out=out) for c in cmd]
        report = Path(argv[argv.index("--out") + 1])
        if report.is_file():
            print(f"done before: {report}", flush=True)
        elif time.perf_counter() - started > budget_s:
            print(
                f"not started ({budget_s:.0f} s of the stage used): python {' '.join(argv)}; call the stage "
                f"again with the same --out to run it",
                flush=True,
            )
            codes[name] = 3
        else:
            codes[name] = _python(argv, out / "logs" / f"speed{i}.log")
    return codes


def execute_chapters(results: Path, into: Path, chapters=("12_results", "13_variations")) -> dict[str, str]:
    """Run the results chapters on the results in `results` (AIAYN_RESULTS); each executed notebook goes to `into`."""
    from aiayn._book import execute

    status = {}
    env_before = {k: os.environ.get(k) for k in ("AIAYN_RESULTS", "AIAYN_PRETRAINED_REGISTRY")}
    os.environ["AIAYN_RESULTS"] = str(results)
    registry = results / "pretrained" / "pretrained.json"
    if registry.is_file():
        os.environ["AIAYN_PRETRAINED_REGISTRY"] = str(registry)
    try:
        for name in chapters:
            path = ROOT / "book" / f"{name}.ipynb"
            if not path.is_file():
                continue
            start = time.perf_counter()
            try:
                execute(path, timeout=900, into=into / f"{name}.ipynb")
                status[name] = "ok"
            except Exception as err:  # noqa: BLE001  reported, and the notebook with its error is kept
                status[name] = f"{type(err).__name__}: {str(err)[-2000:]}"
            print(f"{name}: {status[name][:200]} in {time.perf_counter() - start:.0f} s", flush=True)
    finally:
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return status


def show(profile_name: str) -> str:
    """The stages of a profile as the command lines they run."""
    profile = PROFILES[profile_name]
    lines = [f"profile {profile_name}: joint BPE {profile['bpe_size']}"]
    s, v, f = profile["scaling"], profile["variations"], profile["final"]
    lines.append(
        f"search: {', '.join(map(str, s['concurrency']))} training runs at once for {s['budget']} s each; "
        f"then Table 3 rows {' '.join(v['rows'])} ({v['parallel']} at once, budget {v['budget']}) on val; "
        f"then recipe.json, the row with the best val BLEU"
    )
    for stage, folder in FOLDERS.items():
        r = profile[stage]
        lines.append(
            f"{stage}: {', '.join(r['candidates'])} on {' '.join(_flags(r['settings']))}, EN→DE seeds "
            f"{', '.join(map(str, r['seeds']))} and DE→EN seeds {', '.join(map(str, r['reverse_seeds'])) or 'none'}, "
            f"{r['parallel']} at once, --time-budget {r['budget']}; then {folder}/recipes.json, the best on val BLEU"
        )
    seeds = f", and seeds {', '.join(map(str, f['seeds']))} of both directions" if f["seeds"] else ""
    lines.append(
        f"final: {', '.join(FINAL_RUNS)}{seeds}, {f['parallel']} at once, --time-budget {f['budget']} "
        f"{' '.join(_flags(f['settings']))} (or with --recipe FILE, a row of the search's recipe.json); then the "
        f"decoding benchmark and the model files"
    )
    lines += ["speed: python " + " ".join(cmd) for cmd in profile["speed"]]
    return "\n".join(lines)


def pack(folder: Path, into: Path, part_bytes: int = 15 * 2**20) -> list[Path]:
    """`folder` as a gzipped tar split into parts of at most `part_bytes` (a GPU call returns files up to 16 MB)."""
    into.mkdir(parents=True, exist_ok=True)
    archive = into / f"{folder.name}.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(folder, arcname=folder.name)
    payload = archive.read_bytes()
    archive.unlink()
    parts = []
    for i in range(0, max(len(payload), 1), part_bytes):
        parts.append(into / f"{folder.name}.tar.gz.part{i // part_bytes:02d}")
        parts[-1].write_bytes(payload[i : i + part_bytes])
    return parts


def install(
    source: Path,
    results: Path = ROOT / "results",
    models: Path = ROOT / "pretrained",
    registry_path: Path | None = None,
) -> list[str]:
    """Copy a GPU stage's output (a folder, or the parts `pack` wrote) into results/ and pretrained/."""
    import tempfile

    from aiayn import pretrained

    registry_path = Path(registry_path or pretrained.REGISTRY)

    source = Path(source)
    with tempfile.TemporaryDirectory() as tmp:
        parts = sorted(source.glob("*.tar.gz.part*")) if source.is_dir() else []
        if parts:
            archive = Path(tmp) / "stage.tar.gz"
            archive.write_bytes(b"".join(p.read_bytes() for p in parts))
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            source = next(p for p in Path(tmp).iterdir() if p.is_dir())
        devices = {json.loads(m.read_text())["provenance"]["device"] for m in source.rglob("metrics.json")}
        if any(d == "cpu" or d.startswith("CPU") for d in devices):
            raise PlanError(
                f"{source} holds CPU runs (a rehearsal?); install copies a GPU stage's runs, while a CPU "
                f"run is written into results/ by its own experiment command"
            )
        copied = []
        for item in sorted(source.iterdir()):
            if item.name == "pretrained":
                known = pretrained.registry(registry_path)
                for name, entry in pretrained.registry(item / "pretrained.json").items():
                    models.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(item / entry["file"], models / entry["file"])
                    known[name] = entry
                    copied.append(str(models / entry["file"]))
                registry_path.write_text(json.dumps(known, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
            elif item.name != "logs":
                target = results / item.name
                if item.is_dir():
                    shutil.rmtree(target, ignore_errors=True)
                    shutil.copytree(item, target, ignore=shutil.ignore_patterns("*.pt"))
                else:
                    shutil.copyfile(item, target)
                copied.append(str(target))
        return copied


def run_stage(stage: str, profile_name: str, out: Path, scratch: Path, recipe: Path | None = None) -> int:
    """One stage into `out`; 0 when every command in it succeeded."""
    started = time.perf_counter()
    profile = PROFILES[profile_name]
    if profile_name != "tiny" and not torch.cuda.is_available():
        raise PlanError(f"the {profile_name} profile needs a GPU; on a CPU, rehearse the plan with the tiny profile")
    if not torch.cuda.is_available() and out.resolve().is_relative_to((ROOT / "results").resolve()):
        raise PlanError(f"--out {out} is in results/, which holds GPU runs only: choose a folder outside it")
    out.mkdir(parents=True, exist_ok=True)
    if stage == "search":
        search(profile, out, scratch, started)
        failed = json.loads((out / "variations" / "summary.json").read_text())["failed"]
    elif stage in FOLDERS:
        failed = [name for name, code in recipes(profile, out, scratch, stage)["codes"].items() if code]
    elif stage == "final":
        failed = [name for name, code in final(profile, out, scratch, recipe).items() if code]
    elif stage == "speed":
        failed = [name for name, code in speed(profile, out).items() if code]
    else:
        raise PlanError(f"unknown stage {stage!r}; choose one of {', '.join(STAGES)}")
    print(
        f"stage {stage}: {time.perf_counter() - started:.0f} s" + (f"; failed: {failed}" if failed else ""), flush=True
    )
    return 1 if failed else 0


def rehearse(out: Path, scratch: Path) -> dict:
    """Every stage in the tiny profile on the CPU, then the results chapters on what they wrote."""
    started = time.perf_counter()
    codes = {stage: run_stage(stage, "tiny", out, scratch) for stage in STAGES}
    chapters = execute_chapters(out, out / "chapters")
    report = {"stages": codes, "chapters": chapters, "seconds": time.perf_counter() - started}
    (out / "rehearsal.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"rehearsal: {report['seconds']:.0f} s; stages {codes}; chapters {chapters}", flush=True)
    return report


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m aiayn.plan", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("show", help="the stages and their commands")
    s.add_argument("--profile", choices=PROFILES, default="gpu")
    r = sub.add_parser("run", help="one stage")
    r.add_argument("stage", choices=STAGES)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--profile", choices=PROFILES, default="gpu")
    r.add_argument("--scratch", type=Path, default=Path("/tmp/aiayn-plan-checkpoints"), help="checkpoints (not kept)")
    r.add_argument("--recipe", type=Path, default=None, help="recipe.json of the search stage (final stage)")
    h = sub.add_parser("rehearse", help="every stage, tiny, on the CPU; then the results chapters")
    h.add_argument("--out", type=Path, required=True)
    h.add_argument("--scratch", type=Path, default=None)
    k = sub.add_parser("pack", help="a folder as tar.gz parts of at most 15 MB")
    k.add_argument("folder", type=Path)
    k.add_argument("--into", type=Path, required=True)
    i = sub.add_parser("install", help="a GPU stage's output (folder or parts) into results/ and pretrained/")
    i.add_argument("source", type=Path)
    args = p.parse_args(argv)
    try:
        if args.command == "show":
            print(show(args.profile))
        elif args.command == "run":
            return run_stage(args.stage, args.profile, args.out, args.scratch, args.recipe)
        elif args.command == "rehearse":
            if args.out.resolve().is_relative_to((ROOT / "results").resolve()):
                raise PlanError("the rehearsal writes CPU runs, which never go into results/: choose another --out")
            report = rehearse(args.out, args.scratch or args.out.parent / f"{args.out.name}-checkpoints")
            return 0 if not any(report["stages"].values()) and set(report["chapters"].values()) <= {"ok"} else 1
        elif args.command == "pack":
            for part in pack(args.folder, args.into):
                print(part)
        else:
            for path in install(args.source):
                print(path)
    except (PlanError, variations.VariationsError, corpus.CorpusError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
