"""§6.2, Table 3 at Multi30k scale: each variation of the `multi30k` model trained, beam-searched and scored on val.

    python -m aiayn.variations --list
    python -m aiayn.variations --rows base A --seeds 0 1 --budget 80 --parallel 4 --out results/variations

Each run is its own process (`python -m aiayn.experiment`), so several can share one GPU: --parallel sets how many run
at once. Besides the paper's rows (A)-(E), family R varies what the paper fixes but small data needs tuned: the BPE
size, the batch size, the learning-rate factor, dropout and checkpoint averaging. The final recipe is chosen from
these on validation BLEU alone (`best_row`).

Not about the model: a row's changes are TransformerConfig fields (aiayn.model, chapter 7), and §6.2's chapter
(book/13_variations.ipynb) reads what the runs write.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from aiayn import ROOT, corpus
from aiayn.model import PRESETS, TransformerConfig, parameter_count
from aiayn.runs import config as run_config
from aiayn.runs import launch
from aiayn.training import RECIPES

BASE = "multi30k"
# the experiment's options that a call of variations passes on to every run (RunConfig declares them)
PASSED = (
    "bpe_size",
    "max_tokens",
    "max_updates",
    "warmup",
    "factor",
    "limit_train",
    "decode_batch",
    "max_output",
    "pad_multiple",
    "precision",
)
STARTUP_S = 20  # imports, CUDA start and the encoded cache before the first run, added to the estimate
OPTIONS = ("bpe_size", "max_tokens", "factor", "warmup", "average_last")  # experiment options a recipe row may set


class VariationsError(RuntimeError):
    """A bad option; the message says what to do."""


# The paper's Table 3 (Vaswani et al., 2017; newstest2013 dev): row -> (perplexity per wordpiece, BLEU, parameters
# ×10^6, None where the paper gives none), in the paper's own values.
TABLE_3 = {
    "base": (4.92, 25.8, 65),
    "h=1, d_k=d_v=512": (5.29, 24.9, None),
    "h=4, d_k=d_v=128": (5.00, 25.5, None),
    "h=16, d_k=d_v=32": (4.91, 25.8, None),
    "h=32, d_k=d_v=16": (5.01, 25.4, None),
    "d_k=16": (5.16, 25.1, 58),
    "d_k=32": (5.01, 25.4, 60),
    "N=4": (5.19, 25.3, 50),
    "N=8": (4.88, 25.5, 80),
    "d_model=256, d_k=d_v=32": (5.75, 24.5, 28),
    "d_model=1024, d_k=d_v=128": (4.66, 26.0, 168),
    "d_ff=1024": (5.12, 25.4, 53),
    "d_ff=4096": (4.75, 26.2, 90),
    "P_drop=0.0": (5.77, 24.6, None),
    "P_drop=0.2": (4.95, 25.5, None),
    "eps_ls=0.0": (4.67, 25.3, None),
    "eps_ls=0.2": (5.47, 25.7, None),
    "positional embedding instead of sinusoids": (4.92, 25.7, None),
}


@dataclass(frozen=True)
class Row:
    """One row of Table 3 at our scale: TransformerConfig changes to the base and the paper's row it mirrors."""

    name: str
    family: str  # "base" or A–E
    changes: dict = field(default_factory=dict)
    paper_row: str | None = None  # the paper's row (a key of TABLE_3); None where the paper has no such row
    note: str = ""
    options: dict = field(default_factory=dict)  # experiment options (OPTIONS) that differ from the base run

    @property
    def ppl(self) -> float | None:
        """The paper's newstest2013 dev perplexity (per wordpiece)."""
        return TABLE_3[self.paper_row][0] if self.paper_row else None

    @property
    def bleu(self) -> float | None:
        """The paper's newstest2013 dev BLEU."""
        return TABLE_3[self.paper_row][1] if self.paper_row else None

    @property
    def params(self) -> int | None:
        """The paper's parameter count ×10^6 (blank in the paper for rows A, D, E)."""
        return TABLE_3[self.paper_row][2] if self.paper_row else None

    def paper(self) -> dict:
        """The paper's Table 3 values of this row, None where it has none."""
        return {"row": self.paper_row, "ppl_dev": self.ppl, "bleu_dev": self.bleu, "params_1e6": self.params}


# The rows of the `multi30k` preset. Our base (N=4, d_model=256, h=4, d_k=64,
# P_drop=0.3) mirrors the paper's base (N=6, d_model=512, h=8, d_k=64, P_drop=0.1).
ROWS = [
    Row(
        "base",
        "base",
        {},
        "base",
        note="the paper's base: N=6, d_model=512, d_ff=2048, h=8, d_k=d_v=64, P_drop=0.1, eps_ls=0.1",
    ),
    Row("A-h1", "A", {"h": 1}, "h=1, d_k=d_v=512", note="one head, as the paper's single-head row"),
    Row("A-h2", "A", {"h": 2}, "h=4, d_k=d_v=128", note="same d_k as the paper's row"),
    Row("A-h8", "A", {"h": 8}, "h=16, d_k=d_v=32", note="same d_k as the paper's row"),
    Row("A-h16", "A", {"h": 16}, "h=32, d_k=d_v=16", note="same d_k as the paper's row"),
    Row(
        "B-d_k16",
        "B",
        {"d_k": 16},
        "d_k=16",
        note="aiayn.model sets d_v = d_k, so d_v shrinks too; the paper keeps d_v = 64",
    ),
    Row(
        "B-d_k32",
        "B",
        {"d_k": 32},
        "d_k=32",
        note="aiayn.model sets d_v = d_k, so d_v shrinks too; the paper keeps d_v = 64",
    ),
    Row("C-N2", "C", {"N": 2}, "N=4", note="two layers fewer than base, as the paper's N=4"),
    Row("C-N6", "C", {"N": 6}, "N=8", note="two layers more than base, as the paper's N=8"),
    Row(
        "C-d_model128",
        "C",
        {"d_model": 128},
        "d_model=256, d_k=d_v=32",
        note="d_ff stays at the base value, as in the paper's row (its 28M count needs d_ff = 2048 there)",
    ),
    Row(
        "C-d_model512",
        "C",
        {"d_model": 512},
        "d_model=1024, d_k=d_v=128",
        note="d_ff stays at the base value, as in the paper's row (its 168M count needs d_ff = 2048 there)",
    ),
    Row("C-d_ff512", "C", {"d_ff": 512}, "d_ff=1024", note="half of base, as in the paper"),
    Row("C-d_ff2048", "C", {"d_ff": 2048}, "d_ff=4096", note="twice base, as in the paper"),
    Row("D-P_drop0", "D", {"P_drop": 0.0}, "P_drop=0.0", note="no dropout"),
    Row(
        "D-P_drop0.1",
        "D",
        {"P_drop": 0.1},
        None,
        note="no paper row: less dropout than our base (the paper's base uses P_drop = 0.1)",
    ),
    Row("D-P_drop0.5", "D", {"P_drop": 0.5}, "P_drop=0.2", note="more dropout than base, as the paper's 0.2"),
    Row("D-eps_ls0", "D", {"eps_ls": 0.0}, "eps_ls=0.0", note="no label smoothing"),
    Row("D-eps_ls0.2", "D", {"eps_ls": 0.2}, "eps_ls=0.2", note="twice base, as in the paper"),
    Row(
        "E-learned",
        "E",
        {"learned_positions": True},
        "positional embedding instead of sinusoids",
        note="learned positional embeddings (up to max_len positions)",
    ),
    Row("R-bpe4000", "R", note="a smaller joint BPE vocabulary", options={"bpe_size": 4000}),
    Row("R-bpe16000", "R", note="a larger joint BPE vocabulary", options={"bpe_size": 16000}),
    Row("R-tokens4000", "R", note="half the batch: twice the updates per epoch", options={"max_tokens": 4000}),
    Row("R-tokens16000", "R", note="twice the batch", options={"max_tokens": 16000}),
    Row("R-factor1", "R", note="the paper's learning rate (factor 1)", options={"factor": 1.0}),
    Row("R-factor2.5", "R", note="a higher peak learning rate", options={"factor": 2.5}),
    Row("R-P_drop0.4", "R", {"P_drop": 0.4}, note="more dropout, between base and D's 0.5"),
    Row("R-avg5", "R", note="average the last 5 checkpoints", options={"average_last": 5}),
    Row("R-avg10", "R", note="average the last 10 checkpoints, as the final runs do", options={"average_last": 10}),
]
# Table 3 at CPU scale: each change made to the CPU recipe's model (N=3, d_model=256, d_ff=512, h=8, d_k=d_v=32,
# P_drop=0.1, eps_ls=0.1), trained for the same number of updates; the paper's row at the same ratio to its base.
CPU_UPDATES = 500  # updates per run: about 8 minutes of one core for the base
CPU_ROWS = [
    Row("base", "base", {}, "base", note="the CPU recipe's model at CPU_UPDATES updates"),
    Row("A-h1", "A", {"h": 1}, "h=1, d_k=d_v=512", note="one head of d_k = d_model"),
    Row("A-h4", "A", {"h": 4}, "h=4, d_k=d_v=128", note="half the heads, twice d_k"),
    Row("A-h16", "A", {"h": 16}, "h=16, d_k=d_v=32", note="twice the heads, half d_k"),
    Row("B-d_k16", "B", {"d_k": 16, "d_v": 32}, "d_k=32", note="half d_k; d_v kept, as in the paper"),
    Row("B-d_k8", "B", {"d_k": 8, "d_v": 32}, "d_k=16", note="a quarter of d_k; d_v kept"),
    Row("C-N2", "C", {"N": 2}, "N=4", note="two thirds of the layers, as the paper's N=4"),
    Row("C-N4", "C", {"N": 4}, "N=8", note="four thirds of the layers, as the paper's N=8"),
    Row(
        "C-d_model128",
        "C",
        {"d_model": 128},
        "d_model=256, d_k=d_v=32",
        note="half d_model (d_k follows: 16); d_ff kept, as in the paper",
    ),
    Row("C-d_ff1024", "C", {"d_ff": 1024}, "d_ff=4096", note="twice d_ff"),
    Row("D-P_drop0", "D", {"P_drop": 0.0}, "P_drop=0.0", note="no dropout"),
    Row("D-eps_ls0", "D", {"eps_ls": 0.0}, "eps_ls=0.0", note="no label smoothing"),
    Row(
        "E-learned",
        "E",
        {"learned_positions": True},
        "positional embedding instead of sinusoids",
        note="learned positional embeddings",
    ),
    # §5's settings around the recipe (batch 4,096 tokens, warmup 400, factor 0.64), at the same budget; a batch
    # of a different size gets the updates that see the same number of tokens
    Row(
        "R-tokens2048",
        "R",
        note="half the batch, twice the updates",
        options={"max_tokens": 2048, "max_updates": 2 * CPU_UPDATES},
    ),
    Row(
        "R-tokens8192",
        "R",
        note="twice the batch, half the updates",
        options={"max_tokens": 8192, "max_updates": CPU_UPDATES // 2},
    ),
    Row("R-warmup100", "R", note="a quarter of the warmup", options={"warmup": 100}),
    Row("R-warmup1600", "R", note="four times the warmup", options={"warmup": 1600}),
    Row("R-factor0.32", "R", note="half the learning rate", options={"factor": 0.32}),
    Row("R-factor1.28", "R", note="twice the learning rate", options={"factor": 1.28}),
    Row("R-factor2.56", "R", note="four times the learning rate", options={"factor": 2.56}),
    Row("R-factor5.12", "R", note="eight times the learning rate", options={"factor": 5.12}),
]
ROW_SETS = {"multi30k": ROWS, "cpu": CPU_ROWS}  # the base each set of rows changes: a preset, or the CPU recipe
BY_NAME = {row.name: row for row in ROWS}
FAMILIES = ("base", "A", "B", "C", "D", "E", "R")


def rows_of(base: str) -> tuple[list[Row], dict[str, Row]]:
    """The rows that change `base` ("multi30k" or "cpu"), as a list and by name."""
    rows = ROW_SETS[base]
    return rows, {row.name: row for row in rows}


def base_config(base_set: list[str] | None = None, base: str = BASE) -> TransformerConfig:
    """The `multi30k` preset, or the CPU recipe's model (base="cpu"), with the --base-set changes."""
    recipe = RECIPES[base]["set"] if base in RECIPES else {}
    return PRESETS[BASE].replace(**recipe, **run_config.model_overrides(base_set or []))


def config(row: Row, base_set: list[str] | None = None, base: str = BASE) -> TransformerConfig:
    """The row's TransformerConfig: the base with the row's changes (and its BPE size as the vocabulary)."""
    c = base_config(base_set, base)
    return c.replace(**row.changes, vocab_size=row.options.get("bpe_size", c.vocab_size))


def select(names: list[str], base: str = BASE) -> list[Row]:
    """Rows by name, by family letter (A–E), "base" or "all", in Table 3 order."""
    rows, by_name = rows_of(base)
    wanted = set()
    for name in names:
        if name == "all":
            wanted |= set(by_name)
        elif name in FAMILIES:
            wanted |= {row.name for row in rows if row.family == name}
        elif name in by_name:
            wanted.add(name)
        else:
            raise VariationsError(
                f"--rows {name}: unknown row; give a family ({', '.join(FAMILIES)}), 'all', "
                f"or a row name from --list: {', '.join(by_name)}"
            )
    return [row for row in rows if row.name in wanted]


def describe(row: Row, c: TransformerConfig) -> str:
    """The row's changes as FIELD=VALUE, with the d_k (= d_v) that follows from them."""
    text = (
        " ".join(
            [
                *(f"{k}={v}" for k, v in row.changes.items()),
                *(f"--{k.replace('_', '-')} {v}" for k, v in row.options.items()),
            ]
        )
        or "-"
    )
    if any(k in row.changes for k in ("h", "d_model")):
        text += f" (d_k=d_v={c.d_k or c.d_model // c.h})"
    return text


def listing(base: str = BASE) -> str:
    """Every row: name, family, changes to the base, our parameter count, and the paper's Table 3 values."""

    def cell(value, fmt):
        return "-" if value is None else format(value, fmt)

    lines = [
        f"Base: {'the ' + base + ' preset' if base == BASE else 'the ' + base + ' recipe'} {base_config(base=base)}",
        "Paper: Table 3, newstest2013 dev (PPL per wordpiece, BLEU, params ×10^6; '-' where the paper has none).",
        f"{'row':14s}{'family':7s}{'changes to base':36s}{'ours ×10^6':>11s}  {'paper row':43s}"
        f"{'PPL':>6s}{'BLEU':>6s}{'params':>7s}",
    ]
    for row in rows_of(base)[0]:
        c = config(row, base=base)
        lines.append(
            f"{row.name:14s}{row.family:7s}{describe(row, c):36s}{parameter_count(c) / 1e6:>11.2f}  "
            f"{row.paper_row or '-':43s}{cell(row.ppl, '.2f'):>6s}{cell(row.bleu, '.1f'):>6s}"
            f"{cell(row.params, 'd'):>7s}"
        )
        if row.note:
            lines.append(f"{'':21s}{row.note}")
    return "\n".join(lines)


def record(row: Row, seed: int, metrics: dict) -> dict:
    """One run's line of summary.json, taken from its metrics.json."""
    return {
        "row": row.name,
        "family": row.family,
        "seed": seed,
        "changes": row.changes,
        "options": row.options,
        "val_ppl": metrics["val"]["ppl"],
        "val_bleu": metrics["bleu"]["val"]["sacrebleu"]["score"],
        "val_bleu_tok_lc": metrics["bleu"]["val"]["tok_lc"]["score"],
        "parameters": metrics["parameters"],
        "train_s": metrics["provenance"]["wall_s"]["train"],
        "total_s": metrics["provenance"]["wall_s"]["total"],
        "updates": metrics["updates"],
        "epochs": metrics["epochs"],
        "stopped_by": metrics["stopped_by"],
        "time_budget_s": metrics["provenance"]["time_budget_s"],
        "device": metrics["provenance"]["device"],
        "git_commit": metrics["provenance"]["git_commit"],
        "threads": metrics["provenance"].get("threads"),
        "precision": metrics.get("precision"),
        "warnings": metrics.get("warnings", []),
        "paper": row.paper(),
    }


def write_summary(out: Path, failures: list[dict], command: str, base: str = BASE) -> dict:
    """summary.json from every <row>-s<seed>/metrics.json under out, with means over seeds per row."""
    rows, by_name = rows_of(base)

    def seed(path):
        return int(path.parent.name.rsplit("-s", 1)[1])

    runs = []
    for row in rows:
        for path in sorted(out.glob(f"{row.name}-s*/metrics.json"), key=seed):
            runs.append(record(row, seed(path), json.loads(path.read_text("utf-8"))))
    by_row = {}
    for name in dict.fromkeys(r["row"] for r in runs):
        mine = [r for r in runs if r["row"] == name]
        by_row[name] = {
            "seeds": [r["seed"] for r in mine],
            "paper": by_name[name].paper(),
            **{
                f"{key}_mean": statistics.fmean(r[key] for r in mine)
                for key in ("val_ppl", "val_bleu", "val_bleu_tok_lc")
            },
            **{
                f"{key}_sd": statistics.stdev(r[key] for r in mine) if len(mine) > 1 else None
                for key in ("val_ppl", "val_bleu")
            },
        }
    summary = {
        "base": base if base == BASE else f"the {base} recipe's model",
        "paper_table": "Table 3 (newstest2013 dev), Vaswani et al. 2017",
        "scored": "Multi30k val, beam K=4, alpha=0.6",
        "runs": runs,
        "by_row": by_row,
        "failed": failures,
        "updated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return summary


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m aiayn.variations",
        description="Table 3 (§6.2) at Multi30k scale: "
        "train each variation of the multi30k model through aiayn.experiment and score val.",
    )
    p.add_argument("--list", action="store_true", help="print every row with the paper's values and stop")
    p.add_argument(
        "--base",
        choices=sorted(ROW_SETS),
        default=BASE,
        help="the model the rows change: the multi30k preset, or the CPU recipe's (its own rows, trained "
        "with its settings for --max-updates updates each)",
    )
    p.add_argument("--rows", nargs="+", default=["all"], help="row names, families (A-E, R), base, or all")
    p.add_argument("--parallel", type=int, default=1, help="runs at once, each its own process (they share the GPU)")
    p.add_argument("--seeds", nargs="+", type=int, default=[0])
    p.add_argument("--budget", type=float, default=80.0, help="seconds per run (aiayn.experiment --time-budget)")
    p.add_argument(
        "--max-total",
        type=float,
        default=540.0,
        help="refuse when the waves of --parallel runs × --budget exceed this many seconds",
    )
    p.add_argument("--out", default=str(ROOT / "results" / "variations"), help="one folder <row>-s<seed> per run")
    p.add_argument("--ckpt-root", default=str(ROOT / "checkpoints" / "variations"), help="scratch for checkpoints")
    p.add_argument("--keep-checkpoints", action="store_true", help="keep each run's checkpoints (default: delete)")
    p.add_argument("--base-set", nargs="*", default=[], metavar="FIELD=VALUE", help="change the base config first")
    p.add_argument("--direction", choices=("en-de", "de-en"), default="en-de")
    p.add_argument("--average-last", type=int, default=1, help="the paper's Table 3 uses no checkpoint averaging")
    p.add_argument("--eval-reserve", type=float, default=25.0, help="seconds of each budget kept for scoring val")
    options = dict(run_config.options())
    for name in PASSED:  # the experiment's own options, declared there once
        kinds = {k: v for k, v in options[name].items() if k in ("type", "choices")}
        p.add_argument(
            "--" + name.replace("_", "-"),
            default=None,
            help=f"{options[name]['help']} (passed to aiayn.experiment)",
            **kinds,
        )
    return p.parse_args(argv)


def experiment_argv(args: argparse.Namespace, row: Row, seed: int, out: Path, ckpt: Path) -> list[str]:
    """The aiayn.experiment command line of one (row, seed) run: the row's changes and options over the base."""
    changes = {**run_config.model_overrides(args.base_set), **row.changes}
    recipe = args.base if args.base != BASE else None
    config = run_config.recipe_config(recipe)
    given = {name: getattr(args, name) for name in PASSED if getattr(args, name) is not None}
    config = config.replace(
        direction=args.direction,
        out=str(out),
        ckpt_dir=str(ckpt),
        preset=BASE,
        eval_reserve=args.eval_reserve,
        time_budget=args.budget,
        seed=seed,
        splits=["val"],
        average_last=args.average_last,
        **{**given, **row.options},
    )
    config.set = run_config.merge_set(config.set, changes)
    return run_config.to_argv(config)


def run(args: argparse.Namespace, argv: list[str], started: float) -> int:
    """Check the plan against --max-total, then run each (row, seed) without metrics.json; 0 if all succeed."""
    rows = select(args.rows, args.base)
    for row in rows:
        try:
            config(row, args.base_set, args.base)
        except (TypeError, ValueError) as err:
            raise VariationsError(
                f"row {row.name} on --base-set {' '.join(args.base_set)}: {err}; "
                f"choose a base where every chosen row is valid"
            ) from None
    if args.base == "cpu" and args.max_updates is None:
        args.max_updates = CPU_UPDATES
    if args.parallel < 1:
        raise VariationsError(f"--parallel must be at least 1, got {args.parallel}")
    out, ckpt_root = Path(args.out), Path(args.ckpt_root)
    if ckpt_root.resolve().is_relative_to(out.resolve()):
        raise VariationsError(f"--ckpt-root {ckpt_root} lies inside --out {out}; results hold no checkpoints")
    plan = [(row, seed) for row in rows for seed in args.seeds]
    todo = [(row, seed) for row, seed in plan if not (out / f"{row.name}-s{seed}" / "metrics.json").is_file()]
    waves = -(-len(todo) // args.parallel)
    need = waves * args.budget
    print(
        f"{len(plan)} runs chosen, {len(plan) - len(todo)} already done; {len(todo)} to do, {args.parallel} at once: "
        f"{waves} × {args.budget:g} s = {need:.0f} s, about {need + STARTUP_S:.0f} s with start-up "
        f"(--max-total {args.max_total:g} s)",
        flush=True,
    )
    if need > args.max_total:
        fit = int(args.max_total // args.budget) * args.parallel
        raise VariationsError(
            f"{waves} waves × --budget {args.budget:g} s = {need:.0f} s exceeds --max-total "
            f"{args.max_total:g} s; choose fewer --rows or --seeds (at most {fit} runs fit) or a "
            f"larger --parallel, and run the rest in another call: finished runs are skipped"
        )
    command = " ".join(["python -m aiayn.variations", *argv])
    bpe_size = args.bpe_size or run_config.RunConfig().bpe_size
    for size in dict.fromkeys(row.options.get("bpe_size", bpe_size) for row, _ in todo):
        corpus.encoded(size)  # made here once, before the runs read it side by side
    failures = []

    def job(row: Row, seed: int) -> launch.Job:
        name, log = f"{row.name}-s{seed}", out / f"{row.name}-s{seed}" / "run.log"

        def before():
            shutil.rmtree(ckpt_root / name, ignore_errors=True)  # an interrupted run starts again from scratch
            print(f"start {name}: {describe(row, config(row, args.base_set, args.base))}", flush=True)

        def after(code):
            if code is None:
                failures.append({"run": name, "error": f"killed after {timeout:.0f} s (see {log})"})
            elif code != 0:
                tail = log.read_text(encoding="utf-8").strip().splitlines()[-1:] if log.is_file() else []
                error = f"aiayn.experiment exited with {code}: {' '.join(tail)} (see {log})"
                failures.append({"run": name, "error": error})
            if not args.keep_checkpoints:
                shutil.rmtree(ckpt_root / name, ignore_errors=True)
            write_summary(out, failures, command, args.base)

        argv = experiment_argv(args, row, seed, out / name, ckpt_root / name)
        return launch.Job(name, argv, log, before, after)

    timeout = 1.5 * args.budget + 60  # the experiment keeps its own budget; this only catches a hung run
    launch.run_all([job(row, seed) for row, seed in todo], args.parallel, timeout)
    summary = write_summary(out, failures, command, args.base)
    print(
        f"\nwrote {out}/summary.json: {len(summary['runs'])} runs; {time.perf_counter() - started:.0f} s in all",
        flush=True,
    )
    for r in summary["runs"]:
        print(
            f"{r['row']:14s} s{r['seed']}  val ppl {r['val_ppl']:7.2f}  BLEU {r['val_bleu']:5.2f}  "
            f"(tok, lc {r['val_bleu_tok_lc']:5.2f})  {r['parameters'] / 1e6:6.2f}M  {r['updates']} updates"
        )
    if failures:
        print(
            f"{len(failures)} runs failed: {', '.join(f['run'] for f in failures)}; call again to retry them",
            file=sys.stderr,
        )
    return 1 if failures else 0


def best_row(summary: dict) -> dict:
    """The row with the highest mean validation BLEU (sacreBLEU): the recipe for the final runs, chosen on val only."""
    if not summary.get("by_row"):
        raise VariationsError("the summary holds no finished runs to choose from; run the variations first")
    name = max(summary["by_row"], key=lambda n: summary["by_row"][n]["val_bleu_mean"])
    row = BY_NAME[name]
    return {
        "row": name,
        "changes": row.changes,
        "options": row.options,
        "val_bleu_mean": summary["by_row"][name]["val_bleu_mean"],
        "chosen_on": "Multi30k val, sacreBLEU",
    }


def main(argv: list[str] | None = None) -> int:
    """The command line: --list, or the chosen runs."""
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.list:
        print(listing(args.base))
        return 0
    try:
        return run(args, argv, time.perf_counter())
    except (VariationsError, run_config.ExperimentError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
