"""Table 3 at Multi30k scale: the rows, their configs and counts, the budget guard, and a tiny run of two rows."""

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from aiayn import variations
from aiayn.model import PRESETS, count_parameters, make_model, parameter_count

BASE = PRESETS["multi30k"]
EXPECTED = {  # Table 3's families at our scale: the changes to the multi30k preset
    "base": {},
    "A-h1": {"h": 1},
    "A-h2": {"h": 2},
    "A-h8": {"h": 8},
    "A-h16": {"h": 16},
    "B-d_k16": {"d_k": 16},
    "B-d_k32": {"d_k": 32},
    "C-N2": {"N": 2},
    "C-N6": {"N": 6},
    "C-d_model128": {"d_model": 128},
    "C-d_model512": {"d_model": 512},
    "C-d_ff512": {"d_ff": 512},
    "C-d_ff2048": {"d_ff": 2048},
    "D-P_drop0": {"P_drop": 0.0},
    "D-P_drop0.1": {"P_drop": 0.1},
    "D-P_drop0.5": {"P_drop": 0.5},
    "D-eps_ls0": {"eps_ls": 0.0},
    "D-eps_ls0.2": {"eps_ls": 0.2},
    "E-learned": {"learned_positions": True},
    "R-bpe4000": {},
    "R-bpe16000": {},
    "R-tokens4000": {},
    "R-tokens16000": {},
    "R-factor1": {},
    "R-factor2.5": {},
    "R-P_drop0.4": {"P_drop": 0.4},
    "R-avg5": {},
    "R-avg10": {},
}
OPTIONS = {
    "R-bpe4000": {"bpe_size": 4000},
    "R-bpe16000": {"bpe_size": 16000},
    "R-tokens4000": {"max_tokens": 4000},
    "R-tokens16000": {"max_tokens": 16000},
    "R-factor1": {"factor": 1.0},
    "R-factor2.5": {"factor": 2.5},
    "R-avg5": {"average_last": 5},
    "R-avg10": {"average_last": 10},
}  # the recipe rows change training, not the model
TINY = [
    "--base-set",
    "d_model=32",
    "N=1",
    "d_ff=64",
    "h=2",
    "--bpe-size",
    "1000",
    "--limit-train",
    "200",
    "--max-updates",
    "5",
    "--decode-batch",
    "256",
    "--budget",
    "240",
    "--max-total",
    "600",
]


def differences(c):
    return {f.name: getattr(c, f.name) for f in dataclasses.fields(c) if getattr(c, f.name) != getattr(BASE, f.name)}


def test_every_row_is_valid_and_differs_from_base_exactly_as_listed():
    assert [row.name for row in variations.ROWS] == list(EXPECTED)
    for row in variations.ROWS:
        assert row.changes == EXPECTED[row.name] and row.family == row.name.split("-")[0]
        assert row.options == OPTIONS.get(row.name, {})
        vocab = {"vocab_size": row.options["bpe_size"]} if "bpe_size" in row.options else {}
        assert differences(variations.config(row)) == {**row.changes, **vocab}  # valid, and nothing else moved
    for name in ("C-d_model128", "C-d_model512"):
        c = variations.config(variations.BY_NAME[name])
        assert c.d_ff == BASE.d_ff and c.h == BASE.h  # as in the paper's rows, only d_model (and d_k) change


def test_heads_keep_compute_constant_and_key_size_shrinks():
    for row in variations.select(["A"]):
        c = variations.config(row)
        assert c.d_k is None and c.h * (c.d_model // c.h) == c.d_model == 256
    assert [variations.config(r).h * variations.config(r).d_k for r in variations.select(["B"])] == [64, 128]
    assert BASE.d_model // BASE.h == 64  # base d_k, as the paper's


def test_parameter_counts_and_paper_values():
    for name, n in [
        ("base", 9_420_800),
        ("A-h1", 9_420_800),
        ("B-d_k16", 7_054_592),
        ("C-N6", 13_107_200),
        ("C-d_model512", 25_124_864),
        ("E-learned", 9_551_872),
    ]:
        c = variations.config(variations.BY_NAME[name])
        assert parameter_count(c) == n
        if name in ("base", "B-d_k16", "E-learned"):
            assert count_parameters(make_model(c)) == n
    paper = {row.name: (row.ppl, row.bleu, row.params) for row in variations.ROWS}
    assert paper["base"] == (4.92, 25.8, 65) and paper["A-h1"] == (5.29, 24.9, None)
    assert paper["C-d_model512"] == (4.66, 26.0, 168) and paper["E-learned"] == (4.92, 25.7, None)
    assert paper["D-P_drop0.1"] == (None, None, None)
    assert {r.name for r in variations.ROWS if r.params is not None} == {"base", *EXPECTED} - {
        n for n in EXPECTED if n[0] in "ADER"
    }


def test_list_and_selection(capsys):
    assert variations.main(["--list"]) == 0
    text = capsys.readouterr().out
    assert all(name in text for name in EXPECTED) and "5.29" in text and "d_k=d_v=16" in text
    assert [r.name for r in variations.select(["E", "base", "C-N2"])] == ["base", "C-N2", "E-learned"]
    assert len(variations.select(["all"])) == 28 and len(variations.select(["R"])) == 9
    with pytest.raises(variations.VariationsError, match="unknown row"):
        variations.select(["F"])


def test_budget_guard_refuses(tmp_path, capsys):
    out = tmp_path / "out"
    argv = ["--rows", "all", "--seeds", "0", "1", "--budget", "80", "--out", str(out), "--ckpt-root", str(tmp_path)]
    assert variations.main(argv) == 2
    err = capsys.readouterr().err
    assert "56 waves × --budget 80 s = 4480 s exceeds --max-total 540 s" in err and "at most 6 runs fit" in err
    assert not out.exists()
    assert variations.main([*argv, "--parallel", "8"]) == 2  # 7 waves of 8 runs: 560 s
    assert "7 waves × --budget 80 s = 560 s" in capsys.readouterr().err
    assert variations.main([*argv[:2], "--parallel", "0", "--out", str(out)]) == 2
    assert "--parallel must be at least 1" in capsys.readouterr().err


def test_cpu_rows_change_the_cpu_recipes_model_and_keep_d_v():
    """Table 3 at CPU scale: 12 rows over the CPU recipe's model; (A) keeps h * d_k = d_model, (B) keeps d_v."""
    rows, by_name = variations.rows_of("cpu")
    base = variations.base_config(base="cpu")
    assert (base.N, base.d_model, base.d_ff, base.h, base.P_drop) == (3, 256, 512, 8, 0.1)
    assert len([r for r in rows if r.family not in ("base", "R")]) >= 12
    for row in rows:
        c = variations.config(row, base="cpu")
        if row.family == "A":
            assert c.h * (c.d_k or c.d_model // c.h) == c.d_model
        if row.family == "B":
            assert c.d_v == 32 and c.d_k < 32
    args = variations.parse_args(["--base", "cpu"])
    args.max_updates = variations.CPU_UPDATES
    argv = variations.experiment_argv(args, by_name["B-d_k8"], 0, Path("o"), Path("c"))
    assert argv[argv.index("--recipe") + 1] == "cpu" and {"d_k=8", "d_v=32"} <= set(argv)
    assert argv[argv.index("--max-updates") + 1] == str(variations.CPU_UPDATES)
    t2, t8 = by_name["R-tokens2048"].options, by_name["R-tokens8192"].options  # the same tokens as the base sees
    assert t2["max_tokens"] * t2["max_updates"] == t8["max_tokens"] * t8["max_updates"] == 4096 * variations.CPU_UPDATES


@pytest.fixture
def one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: threads cost more than they give
    yield
    torch.set_num_threads(threads)


def test_two_tiny_rows_end_to_end_then_skipped(multi30k_cache, tmp_path, one_thread, capsys):
    out, ck = tmp_path / "variations", tmp_path / "ck"
    argv = ["--rows", "A-h1", "E-learned", "--out", str(out), "--ckpt-root", str(ck), "--parallel", "2", *TINY]
    assert variations.main(argv) == 0
    for name in ("A-h1-s0", "E-learned-s0"):
        assert {p.name for p in (out / name).iterdir()} == {
            "metrics.json",
            "history.json",
            "attention.npz",
            "hyp.val.txt",
            "run.log",
        }
        assert "wrote" in (out / name / "run.log").read_text()
        assert json.loads((out / name / "metrics.json").read_text())["provenance"]["concurrent_runs"] == 2
        metrics = json.loads((out / name / "metrics.json").read_text())
        assert set(metrics["bleu"]) == {"val"} and metrics["reference_check"] is None
        assert metrics["updates"] == 5 and metrics["model_config"]["d_model"] == 32
        assert metrics["parameters"] == parameter_count(
            variations.config(variations.BY_NAME[name[:-3]], TINY[1:5]).replace(vocab_size=1000)
        )
    summary = json.loads((out / "summary.json").read_text())
    assert [(r["row"], r["seed"]) for r in summary["runs"]] == [("A-h1", 0), ("E-learned", 0)]
    assert set(summary["runs"][0]) == {
        "row",
        "family",
        "seed",
        "changes",
        "val_ppl",
        "val_bleu",
        "val_bleu_tok_lc",
        "threads",
        "precision",
        "warnings",
        "parameters",
        "train_s",
        "total_s",
        "updates",
        "epochs",
        "stopped_by",
        "time_budget_s",
        "device",
        "git_commit",
        "paper",
        "options",
    }
    assert summary["runs"][1]["changes"] == {"learned_positions": True} and summary["failed"] == []
    assert summary["by_row"]["A-h1"]["val_ppl_sd"] is None and summary["runs"][0]["paper"]["bleu_dev"] == 24.9
    assert not ck.exists() or not any(ck.iterdir())  # checkpoints deleted after each run
    capsys.readouterr()
    assert variations.main(argv) == 0
    assert "2 runs chosen, 2 already done" in capsys.readouterr().out
    assert json.loads((out / "summary.json").read_text())["runs"] == summary["runs"]


def test_best_row_is_chosen_on_validation():
    summary = {
        "by_row": {
            "base": {"val_bleu_mean": 30.0},
            "R-factor2.5": {"val_bleu_mean": 31.5},
            "D-P_drop0.5": {"val_bleu_mean": 29.0},
        }
    }
    best = variations.best_row(summary)
    assert best == {
        "row": "R-factor2.5",
        "changes": {},
        "options": {"factor": 2.5},
        "val_bleu_mean": 31.5,
        "chosen_on": "Multi30k val, sacreBLEU",
    }
    with pytest.raises(variations.VariationsError, match="no finished runs"):
        variations.best_row({"by_row": {}})
