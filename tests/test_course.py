"""The course: exercises found from the solution markers, nbgrader source notebooks with one graded cell per check,
checks that give the book's solutions full marks and wrong answers the points of the checks they pass (with
relative errors and the likely cause), no credit for calling or copying the book's code, and the whole nbgrader cycle
on one assignment: generate, release, autograde, feedback, export."""

import importlib.util
import inspect
import math
import os
import runpy
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import torch
import torch.nn.functional as F

from aiayn import course

ROOT = course.ROOT
BIN = Path(sys.executable).parent


def checks(**env):
    """aiayn/checks.py executed afresh, as a check cell runs it, with the given environment variables."""
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        return runpy.run_path(importlib.util.find_spec("aiayn.checks").origin)
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k)
            else:
                os.environ[k] = v


CHECKS = checks()
ASSIGNMENTS = CHECKS["ASSIGNMENTS"]


def failed(assignment, answer) -> dict:
    """{check key: message} of the checks ``answer`` (a function, or a namespace) does not pass."""
    return {c.key: message for c, message in CHECKS["results"](assignment, answer) if message}


def points(assignment, answer) -> int:
    return sum(c.points for c, message in CHECKS["results"](assignment, answer) if not message)


# ---- exercises and source notebooks ----------------------------------------------------------------------


def _toy_notebook():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("import math  # set-up"),
        nbformat.v4.new_markdown_cell("# Toy\n\nText."),
        nbformat.v4.new_code_cell("x = 1", outputs=[nbformat.v4.new_output("stream", text="1")], execution_count=1),
        nbformat.v4.new_markdown_cell("## Exercises\n\n1. Think.\n2. **Code:** double it."),
        nbformat.v4.new_code_cell("def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell("assert double(2) == 4"),
        nbformat.v4.new_markdown_cell("3. **Code:** warmup, then a cosine."),
        nbformat.v4.new_code_cell(
            "def warmup_cosine(step, peak, warmup, total):\n    ### BEGIN SOLUTION\n"
            "    return 0.0\n    ### END SOLUTION"
        ),
        nbformat.v4.new_code_cell("print(warmup_cosine(1, 1, 1, 2))"),
    ]
    return nb


def test_find_exercises_from_markers():
    found = course.find_exercises(_toy_notebook(), "99_schedule", ASSIGNMENTS)
    assert [(e.number, e.solution_cell, e.test_cell, e.names, e.assignments) for e in found] == [
        (2, 4, 5, ["double"], []),
        (3, 7, 8, ["warmup_cosine"], ["schedule"]),
    ]
    early = _toy_notebook()
    early.cells.insert(1, nbformat.v4.new_code_cell("### BEGIN SOLUTION\ny = 2\n### END SOLUTION"))
    with pytest.raises(ValueError, match="before the Exercises heading"):
        course.find_exercises(early, "99_schedule", ASSIGNMENTS)


def test_source_notebook_has_one_graded_cell_per_check():
    nb = course.source_notebook(_toy_notebook(), "99_schedule", registry=ASSIGNMENTS)
    meta = [c.metadata.get("nbgrader", {}) for c in nb.cells]
    graded = {m["grade_id"]: m["points"] for m in meta if m.get("grade")}
    want = {f"schedule_{c.key}": c.points for c in ASSIGNMENTS["schedule"].checks}
    assert graded == {"test_double": 1, **want}
    assert [m["grade_id"] for m in meta if m.get("solution")] == ["double", "warmup_cosine"]
    book = [c for c, m in zip(nb.cells, meta) if m.get("locked") and not m.get("grade")]
    assert [c.source for c in book] == ["import math  # set-up", "x = 1"]  # the book's code: read-only
    assert all(c.outputs == [] for c in nb.cells if c.cell_type == "code")
    assert "BEGIN SOLUTION" in nb.cells[5].source  # nbgrader's generate_assignment removes the solutions
    assert "colab" not in nb.cells[1].source.lower()  # no link to the chapter (and its solutions) unless asked
    linked = course.source_notebook(_toy_notebook(), "99_schedule", link=True, registry=ASSIGNMENTS)
    assert "colab.research.google.com" in linked.cells[1].source


def test_every_assignment_grades_an_exercise_and_every_chapter_is_listed(capsys):
    graded, notebooks = set(), set()
    for path in course.sources():
        notebooks.add(path.stem)
        for e in course.find_exercises(nbformat.read(path, as_version=4), path.stem, ASSIGNMENTS):
            graded.update(e.assignments)
    assert graded == set(ASSIGNMENTS), f"checks without an exercise: {set(ASSIGNMENTS) - graded}"
    chapters = {
        p.stem for p in (ROOT / "book").glob("[0-9]*.ipynb") if "### BEGIN SOLUTION" in p.read_text(encoding="utf-8")
    }
    assert chapters and chapters <= notebooks
    assert course.main(["list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in chapters)


def test_solution_cells_are_collapsed_on_the_website():
    for path in sorted((ROOT / "book").glob("[0-9]*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code" and course.has_solution(cell.source):
                assert "hide-input" in cell.metadata.get("tags", []), f"{path.name}: {cell.source[:40]!r}"
                assert cell.metadata.get("mystnb", {}).get("code_prompt_show") == "Show solution", path.name


# ---- the book's solutions get full marks -----------------------------------------------------------------


def _namespace():
    """What a chapter's cells have defined by its exercises: torch, math, F, and the package's public names."""
    import importlib
    import pkgutil

    import aiayn

    ns = {"torch": torch, "math": math, "F": F, "nn": torch.nn}
    for m in pkgutil.iter_modules(aiayn.__path__):
        if not m.name.startswith("_") and m.name not in ("course", "checks", "plan", "experiment"):
            try:
                module = importlib.import_module(f"aiayn.{m.name}")
            except ImportError:
                continue
            ns.update({k: v for k, v in vars(module).items() if not k.startswith("_")})
    return ns


def test_the_books_own_solutions_get_full_marks():
    graded = set()
    for path in course.sources():
        nb = nbformat.read(path, as_version=4)
        for e in course.find_exercises(nb, path.stem, ASSIGNMENTS):
            for key in e.assignments:
                ns = _namespace()
                exec(nb.cells[e.solution_cell].source, ns)
                assert failed(key, ns) == {}, f"{path.name}: {key}"
                graded.add(key)
    assert graded == set(ASSIGNMENTS)


# ---- wrong answers: the points of the checks they pass, and why the others fail -----------------------------


def test_a_wrong_schedule_loses_the_points_of_the_checks_it_fails():
    def one_step_late(step, peak, warmup, total):  # the warmup counts steps from 0
        if step <= warmup:
            return peak * (step - 1) / warmup
        return 0.0 if step >= total else peak * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2

    why = failed("schedule", one_step_late)
    assert set(why) == {"warmup", "peak", "grid"}
    assert points("schedule", one_step_late) == sum(
        c.points for c in ASSIGNMENTS["schedule"].checks if c.key in ("decay", "end")
    )
    assert "one step off" in why["peak"] and "(relative)" in why["peak"]
    assert "off by 100.0% (relative)" in why["warmup"]  # step 1 gave 0: an error of 100%, not "off by 1e-05"


def test_the_books_label_smoothing_is_not_szegedys():
    def book_formula(logits, target, eps_ls, pad_id):
        V = logits.size(-1)
        q = torch.full_like(logits, eps_ls / (V - 2))
        q[..., pad_id] = 0.0
        q.scatter_(-1, target[..., None], 1.0 - eps_ls)
        return -(q * logits.log_softmax(-1)).sum(-1).masked_fill(target == pad_id, 0.0).sum()

    why = failed("label_smoothing", book_formula)
    assert set(why) == {"true_token", "spread", "reference"}
    assert "the book's formula" in why["spread"] and "(relative)" in why["reference"]


def test_missing_scale_and_ignored_masks_in_attention():
    def no_scale(query, key, value, key_lengths=None, causal=False):
        return (query @ key.transpose(-2, -1)).softmax(-1) @ value

    why = failed("attention", no_scale)
    assert "not divided by sqrt(d_k)" in why["scale"]
    assert {"lengths", "causal", "both"} <= set(why) and "shape" not in why


def test_stepping_the_schedule_per_micro_batch():
    def per_batch(model, batches, optimizer, scheduler, accum):
        for i, batch in enumerate(batches, 1):
            (model(batch) / accum).backward()
            scheduler.step()
            if i % accum == 0:
                optimizer.step()
                optimizer.zero_grad()

    why = failed("accumulation", per_batch)
    assert set(why) == {"per_update"} and "once per micro-batch" in why["per_update"]


def test_the_papers_interleaved_layout_is_named():
    def interleaved(max_len, d_model):  # Equation (pe): sine, cosine, sine, ... with timescales 10000^(2i/d_model)
        angle = torch.arange(max_len)[:, None] / 10000 ** (torch.arange(0, d_model, 2) / d_model)
        return torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)

    why = failed("positional", interleaved)
    assert "interleaved" in why["zero"] and "shape" not in why and "norm" not in why


def test_a_parameter_count_without_biases_is_named():
    def no_biases(c):
        d, dk = c.d_model, c.d_k or c.d_model // c.h
        attention, ffn = 4 * d * c.h * dk, 2 * d * c.d_ff
        return c.vocab_size * d + c.N * (attention + ffn + 4 * d) + c.N * (2 * attention + ffn + 6 * d)

    why = failed("parameter_count", no_biases)
    assert set(why) == {"base", "d_k", "sizes"} and "biases of the projections are missing" in why["base"]
    from aiayn.model import parameter_count

    assert "calls aiayn.model.parameter_count" in failed("parameter_count", lambda c: parameter_count(c))["base"]


# ---- calling or copying the book's code, rewriting the checks, endless loops -------------------------------


def test_calling_or_copying_the_reference_does_not_pass():
    from aiayn.attention import attention, padding_mask  # noqa: F401
    from aiayn.training import LabelSmoothingLoss

    def via_book(q, k, v, key_lengths=None, causal=False):
        return attention(q, k, v)[0]

    assert points("attention", via_book) == 0
    V_minus = {}

    def via_loss(logits, target, eps_ls, pad_id):  # the book's loss with eps rescaled: the same target
        V = logits.size(-1)
        V_minus["V"] = V
        return LabelSmoothingLoss(eps_ls * (V - 2) / (V - 1), pad_id)(logits, target)

    assert points("label_smoothing", via_loss) == 0
    ns = {"torch": torch, "nn": torch.nn, "F": F, "math": math}
    exec(inspect.getsource(LabelSmoothingLoss).replace("class LabelSmoothingLoss", "class Copy"), ns)
    exec(
        "def my_label_smoothing(logits, target, eps_ls, pad_id):\n"
        "    V = logits.size(-1)\n"
        "    return Copy(eps_ls * (V - 2) / (V - 1), pad_id)(logits, target)\n",
        ns,
    )
    assert "calls aiayn.training.LabelSmoothingLoss" in failed("label_smoothing", ns)["reference"]
    import sacrebleu

    assert points("bleu", lambda h, r: sacrebleu.corpus_bleu(h, [r], smooth_method="add-k", smooth_value=1).score) == 0


def test_rewriting_the_loaded_checks_changes_nothing(monkeypatch):
    """A check cell runs aiayn/checks.py afresh from the file: patching the imported module does not pass it."""
    import aiayn.checks

    monkeypatch.setattr(aiayn.checks, "check", lambda *args: None)
    monkeypatch.setattr(aiayn.checks, "_close", lambda *args, **kwargs: None)
    monkeypatch.setattr(aiayn.checks, "ASSIGNMENTS", {})
    cell = course.CHECK_CELL.format(points=2, s="s", what="", assignment="schedule", key="decay")
    ns = {"warmup_cosine": lambda step, peak, warmup, total: peak}
    with pytest.raises(AssertionError, match="half the peak"):
        exec(cell, ns)


def test_an_endless_loop_fails_its_check_after_the_time_limit():
    fresh = checks(AIAYN_CHECK_SECONDS="0.5")

    def loops(step, peak, warmup, total):
        while True:
            pass

    [(check, message)] = [r for r in fresh["results"]("schedule", loops) if r[0].key == "peak"]
    assert message == "your function did not return within 0.5 s (an endless loop?)"


# ---- the whole nbgrader cycle ----------------------------------------------------------------------------


def _nbgrader(root: Path, *args) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}  # nbgrader runs `alembic`
    return subprocess.run([str(BIN / "nbgrader"), *args], cwd=root, capture_output=True, text=True, env=env)


def _answers(source: Path) -> dict:
    """The reference solutions of a course notebook, without the markers: {first line: cell source}."""
    nb = nbformat.read(source, as_version=4)
    return {
        c.source.splitlines()[0]: "\n".join(line for line in c.source.splitlines() if "### " not in line)
        for c in nb.cells
        if course.has_solution(c.source)
    }


def _submit(root: Path, assignment: str, student: str, answers=None, edit=None, raw=None) -> None:
    """A submission of ``student``: the released notebook with ``answers`` ({first line: source}) in its solution
    cells, then changed by ``edit(nb)``; or the text ``raw``."""
    path = root / "submitted" / student / assignment / f"{assignment}.ipynb"
    path.parent.mkdir(parents=True)
    if raw is not None:
        path.write_text(raw)
        return
    nb = nbformat.read(root / "release" / assignment / f"{assignment}.ipynb", as_version=4)
    for cell in nb.cells:
        first = cell.source.splitlines()[0] if cell.source else ""
        if cell.metadata.get("nbgrader", {}).get("solution") and answers and first in answers:
            cell.source = answers[first]
    if edit:
        edit(nb)
    nbformat.write(nb, path)


def test_the_nbgrader_cycle_on_one_assignment(tmp_path):
    """generate, release, autograde (correct, wrong, empty, corrupted, looping, tampered, stripped), feedback,
    export; the points are those the checks give in the student's own run."""
    root = tmp_path / "course"
    assert course.write_course(root, [course.COURSE / "schedule.ipynb"]) == ["schedule"]
    config = root / "nbgrader_config.py"
    text = config.read_text()
    assert "STUDENT_CELL = 30" in text and "CHECK_CALL = 10" in text
    config.write_text(
        text.replace("STUDENT_CELL = 30", "STUDENT_CELL = 5").replace("CHECK_CALL = 10", "CHECK_CALL = 2")
    )
    run = _nbgrader(root, "generate_assignment", "schedule")
    assert run.returncode == 0, run.stderr
    release = root / "release" / "schedule" / "schedule.ipynb"
    released = release.read_text()
    assert "### BEGIN SOLUTION" not in released and "math.cos" not in released

    right = _answers(course.COURSE / "schedule.ipynb")
    cosine, epoch = sorted(right)  # "def my_train_epoch(...", "def warmup_cosine(..." sort the other way round
    epoch, cosine = (cosine, epoch) if "my_train_epoch" in cosine else (epoch, cosine)
    wrong = {
        cosine: right[cosine].replace("(total - warmup)))", "total))"),
        epoch: right[epoch]
        .replace("            scheduler.step()", "")
        .replace("(model(batch) / accum).backward()", "(model(batch) / accum).backward()\n        scheduler.step()"),
    }
    looping = {cosine: right[cosine], epoch: "while True:\n    pass"}

    def tamper(nb):
        graded = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade")]
        graded[0].metadata["nbgrader"]["points"] = 100
        graded[1].source = "pass"
        extra = nbformat.v4.new_code_cell("print('free points')")
        extra.metadata["nbgrader"] = {
            "grade": True,
            "grade_id": "extra",
            "locked": False,
            "points": 50,
            "schema_version": 3,
            "solution": False,
        }
        nb.cells.append(extra)

    def strip(nb):
        for cell in nb.cells:
            cell.metadata = {}

    _submit(root, "schedule", "a_correct", right)
    _submit(root, "schedule", "b_wrong", wrong)
    _submit(root, "schedule", "c_empty")
    _submit(root, "schedule", "d_corrupted", raw='{"cells": [')
    _submit(root, "schedule", "e_looping", looping)
    _submit(root, "schedule", "f_tampered", wrong, tamper)
    _submit(root, "schedule", "g_stripped", right, strip)
    run = _nbgrader(root, "autograde", "schedule")
    assert run.returncode == 1 and "for student 'd_corrupted'" in run.stderr  # the others are graded all the same
    assert _nbgrader(root, "generate_feedback", "schedule").returncode == 0
    assert _nbgrader(root, "export").returncode == 0

    import csv

    with open(root / "grades.csv") as fh:
        scores = {row["student_id"]: (float(row["score"]), float(row["max_score"])) for row in csv.DictReader(fh)}

    def own_run(answers):  # the points the check cells give when the student runs the notebook
        ns = {"torch": torch, "math": math}
        for source in answers.values():
            exec(source, ns)
        return points("schedule", ns) + points("accumulation", ns)

    total = ASSIGNMENTS["schedule"].points + ASSIGNMENTS["accumulation"].points
    assert own_run(right) == total and 0 < own_run(wrong) < total
    assert list(scores) == ["a_correct", "b_wrong", "c_empty", "d_corrupted", "e_looping", "f_tampered", "g_stripped"]
    assert scores == {
        "a_correct": (total, total),
        "b_wrong": (own_run(wrong), total),
        "c_empty": (0, total),
        "d_corrupted": (0, total),
        "e_looping": (ASSIGNMENTS["schedule"].points, total),
        "f_tampered": (own_run(wrong), total),
        "g_stripped": (total, total),
    }
    for student in ("a_correct", "b_wrong", "e_looping"):
        assert (root / "feedback" / student / "schedule" / "schedule.html").exists()
    graded = nbformat.read(root / "autograded" / "b_wrong" / "schedule" / "schedule.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in graded.cells for o in c.get("outputs", []))
    n_checks = len(ASSIGNMENTS["schedule"].checks) + len(ASSIGNMENTS["accumulation"].checks)
    assert printed.count("passed, ") + printed.count("failed, 0 of ") == n_checks  # what the student sees too

    report = "\n".join(course.report(root, "schedule"))
    lines = {line.split()[0]: line for line in report.splitlines() if not line.startswith(" ")}
    assert "not graded: NotJSONError" in lines["d_corrupted"]
    report = " ".join(report.split())  # the details, unwrapped
    assert "cell 13 stopped by the time limit; the cells after it ran" in report
    assert "schedule_decay: half-way through the decay" in report and "(relative)" in report
    assert "differ from the instructor's copy (schedule_warmup): restored" in report
    assert "1 read-only or graded cell(s) edited (schedule_peak)" in report
    assert "(extra): run as ordinary cells" in report
    assert "cell(s) without nbgrader metadata recognised by their source" in report


@pytest.mark.parametrize("name", ["schedule", "label_smoothing", "greedy_and_bleu"])
def test_course_notebooks_run_with_their_solutions(name):
    """The course notebooks run top to bottom: their solutions pass the visible tests in the cell after them."""
    from nbclient import NotebookClient

    nb = nbformat.read(course.COURSE / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]


def test_the_instructors_page_shows_what_the_worked_example_prints(tmp_path):
    """The page's worked example, run: its report and its grades.csv are those the commands print today."""
    import re

    page = (ROOT / "book" / "instructors.md").read_text(encoding="utf-8")

    def shown(command):  # the lines the page shows under `$ command`, up to the next command or the block's end
        block = re.search(rf"^\$ {re.escape(command)}\n(.*?)(?=^\$ |^```)", page, re.M | re.S)
        assert block, f"the page shows no `$ {command}`"
        return block.group(1).rstrip("\n")

    limits = dict(re.findall(r"^(STUDENT_CELL|BOOK_CELL|CHECK_CALL) = (\d+)", course.NBGRADER_CONFIG, re.M))
    assert len(limits) == 3
    for name, seconds in limits.items():  # the table of time limits
        assert re.search(rf"^\| `{name}` \| {seconds} s \|", page, re.M), name
    assert f"did not return within {limits['CHECK_CALL']} s" in page
    from aiayn._nbgrader import Execute

    assert f"`c.Execute.interrupt_grace`, {Execute.class_traits()['interrupt_grace'].default_value:g} s" in page

    root = tmp_path / "my-course"
    assert course.main(["course", str(root), "label_smoothing"]) == 0
    assert _nbgrader(root, "generate_assignment", "label_smoothing").returncode == 0
    assert course.main(["demo", "label_smoothing", "--course", str(root)]) == 0
    assert _nbgrader(root, "autograde", "label_smoothing").returncode == 0
    assert "\n".join(course.report(root, "label_smoothing")) == shown("python -m aiayn.course report label_smoothing")
    assert _nbgrader(root, "export").returncode == 0
    columns = [0, 3, 7, 9, 10]  # cut -d, -f1,4,8,10,11
    rows = [line.split(",") for line in (root / "grades.csv").read_text().strip().splitlines()]
    assert "\n".join(",".join(row[i] for i in columns) for row in rows) == shown("cut -d, -f1,4,8,10,11 grades.csv")


# ---- a class graded in the sandbox: what a submission can and cannot do ----------------------------------

needs_sandbox = pytest.mark.skipif(
    bool(__import__("aiayn._nbgrader", fromlist=["x"]).sandbox_problem()),
    reason="grading needs bubblewrap (apt-get install bubblewrap)",
)

ATTACKS = {  # student: (answers: "right", "none" or a replacement of warmup_cosine, a cell added after the answers)
    "a_honest": ("right", ""),
    "b_tamper": (
        "none",
        "import glob, importlib.util, os\n"
        "for path in [importlib.util.find_spec('aiayn.checks').origin, importlib.util.find_spec('aiayn').origin,\n"
        "             '{root}/gradebook.db', *glob.glob('{root}/submitted/*/schedule/schedule.ipynb'),\n"
        "             *glob.glob('{root}/source/*/*.ipynb'), '../../../gradebook.db']:\n"
        "    try:\n"
        "        with open(path, 'a') as fh:\n"
        "            fh.write('20')\n"
        "    except OSError:\n"
        "        pass",
    ),
    "c_honest": ("right", ""),
    "d_stuck_in_c": ("right", "import re\nre.match(r'(a+)+$', 'a' * 40 + 'b')  # hours in one C call"),
    "e_ignores_sigint": (
        "right",
        "import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nstart = time.time()\n"
        "while time.time() - start < 120:\n    pass",
    ),
    "f_displays": (
        "def warmup_cosine(step, peak, warmup, total):\n    get_ipython().displayhook(100)\n    return 0.0",
        "",
    ),
    "g_patches": (
        "def warmup_cosine(step, peak, warmup, total):\n    return 0.0",
        "import builtins, math, torch\nmath.isclose = lambda *a, **k: True\ntorch.allclose = lambda *a, **k: True\n"
        "builtins.abs = lambda x: 0.0",
    ),
    "h_reads_checks": (
        "import importlib.util, runpy\n"
        "warmup_cosine = runpy.run_path(importlib.util.find_spec('aiayn.checks').origin)['_warmup_cosine']",
        "",
    ),
    "i_blanks_checks": (
        "right-wrong",
        "get_ipython().input_transformers_cleanup.append(lambda lines: [] if 'check' in ''.join(lines) else lines)",
    ),
    "j_no_profile": (
        "import sys\nfrom aiayn.training import rate\nsys.setprofile = lambda f: None\n"
        "def warmup_cosine(step, peak, warmup, total):\n    return 0.0",
        "",
    ),
    "k_reads_linecache": (  # the right value only if the running check's source can be found
        "import linecache, math\n"
        "def warmup_cosine(step, peak, warmup, total):\n"
        "    key = 'def _warmup_' + 'cosine'  # not in this cell's own source\n"
        "    if not any(key in ''.join(v[2]) for v in list(linecache.cache.values()) if len(v) > 2):\n"
        "        return 0.0\n"
        "    if step <= warmup:\n        return peak * step / warmup\n"
        "    return 0.0 if step >= total else peak * (1 + math.cos(math.pi * (step - warmup) / (total - warmup))) / 2",
        "",
    ),
    "l_ends_its_kernel": ("right", "import os\nos._exit(0)"),
}


@needs_sandbox
def test_a_class_graded_in_the_sandbox(tmp_path):
    """Twelve submissions of one assignment, graded by nbgrader in the sandbox: a submission that writes the checks,
    the package, the gradebook and other submissions changes no grade; a cell stuck in C, ignoring interrupts or
    ending its kernel loses only itself; displayed values, patched comparisons, the checks' own reference, blanked
    check cells, a disabled call watch and the running check's source earn nothing; every graded cell earns 0 or its
    maximum; the report flags what it saw."""
    import hashlib

    from nbgrader.api import Gradebook

    root = tmp_path / "course"
    course.write_course(root, [course.COURSE / "schedule.ipynb"])
    config = root / "nbgrader_config.py"
    text = (
        config.read_text().replace("STUDENT_CELL = 30", "STUDENT_CELL = 3").replace("CHECK_CALL = 10", "CHECK_CALL = 2")
    )
    config.write_text(text + "c.Execute.interrupt_grace = 2\n")
    assert _nbgrader(root, "generate_assignment", "schedule").returncode == 0
    right = _answers(course.COURSE / "schedule.ipynb")
    cosine = next(k for k in right if "warmup_cosine" in k)
    wrong = {cosine: right[cosine].replace("(total - warmup)))", "total))")}

    def after_the_answers(cell):  # an edit that inserts `cell` after the first solution cell
        def edit(nb):
            first = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("solution"))
            nb.cells.insert(first + 1, nbformat.v4.new_code_cell(cell.format(root=root)))

        return edit if cell else None

    for student, (answer, extra) in ATTACKS.items():
        answers = {"right": right, "right-wrong": {**right, **wrong}, "none": {}}.get(answer, {cosine: answer})
        _submit(root, "schedule", student, answers, after_the_answers(extra))
    protected = [Path(importlib.util.find_spec("aiayn.checks").origin), root / "source/schedule/schedule.ipynb"]
    protected += sorted((root / "submitted").glob("*/schedule/schedule.ipynb"))
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in protected}

    run = _nbgrader(root, "autograde", "schedule")
    assert run.returncode == 0, run.stderr[-3000:]
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in protected} == before

    total = ASSIGNMENTS["schedule"].points + ASSIGNMENTS["accumulation"].points
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission("schedule", s).score for s in ATTACKS}
        for student in ATTACKS:
            for grade in gb.find_submission_notebook("schedule", "schedule", student).grades:
                assert grade.score in (0, grade.max_score), (student, grade.name, grade.score)

    def own_run(warmup_cosine):  # the points of the schedule checks in the student's own, honest run
        return points("schedule", warmup_cosine)

    assert scores == {
        "a_honest": total,
        "b_tamper": 0,
        "c_honest": total,
        "d_stuck_in_c": total,
        "e_ignores_sigint": total,
        "f_displays": own_run(lambda step, peak, warmup, total: 0.0),
        "g_patches": 0,
        "h_reads_checks": 0,
        "i_blanks_checks": 0,
        "j_no_profile": 0,
        "k_reads_linecache": own_run(lambda step, peak, warmup, total: 0.0),
        "l_ends_its_kernel": total,
    }
    assert 0 < scores["f_displays"] < ASSIGNMENTS["schedule"].points
    blocks, student = {}, None  # the report's lines of each student, unwrapped
    for line in course.report(root, "schedule"):
        student = student if line.startswith(" ") else line.split()[0]
        blocks[student] = blocks.get(student, "") + " " + " ".join(line.split())
    stuck = "did not stop when interrupted (a long call into C code?): graded again without it"
    assert stuck in blocks["d_stuck_in_c"] and stuck in blocks["e_ignores_sigint"]
    assert "ended its kernel: graded again without it" in blocks["l_ends_its_kernel"]
    assert "FLAG replaced builtins.abs" in blocks["g_patches"]
    assert "FLAG no check result" in blocks["i_blanks_checks"]
    assert "FLAG replaced sys.setprofile" in blocks["j_no_profile"]
    assert "FLAG" not in blocks["a_honest"] + blocks["c_honest"] + blocks["d_stuck_in_c"] + blocks["f_displays"]


def test_calling_or_pasting_the_chapters_own_function_in_a_notebook_earns_nothing():
    """In a kernel, the chapter's `attention` (a cell of the notebook, compiled as IPython compiles cells) and a
    copy of it pasted under another name are recognised by their syntax trees, and fail the checks that call them."""
    from nbclient import NotebookClient

    chapter = nbformat.read(course.BOOK / "02_attention.ipynb", as_version=4)
    source = next(c.source for c in chapter.cells if c.cell_type == "code" and "def attention(" in c.source)
    answer = (
        "def my_attention(query, key, value, key_lengths=None, causal=False):\n"
        "    len_q, len_k = query.size(-2), key.size(-2)\n"
        "    mask = torch.ones(len_q, len_k, dtype=torch.bool)\n"
        "    if causal:\n"
        "        mask = mask & (torch.arange(len_k)[None] <= torch.arange(len_q)[:, None])\n"
        "    if key_lengths is not None:\n"
        "        mask = mask & (torch.arange(len_k) < torch.as_tensor(key_lengths).view(-1, 1, 1, 1))\n"
        "    return {name}(query, key, value, mask)[0]"
    )
    check = course.CHECK_CELL.format(points=2, s="s", what="", assignment="attention", key="no_mask")
    cells = [
        "import math\nimport torch\nimport torch.nn.functional as F",
        source,
        answer.format(name="attention"),
        check,
    ]
    cells += [
        source.replace("def attention(", "def scaled(").replace("Scaled dot", "Mine:"),
        answer.format(name="scaled"),
    ]
    fused = (
        "def my_attention(q, k, v, key_lengths=None, causal=False):\n    return F.scaled_dot_product_attention(q, k, v)"
    )
    cells += [check, fused, check]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=60, kernel_name="python3", allow_errors=True).execute()
    printed = ["".join(o.get("text", "") for o in nb.cells[i].outputs) for i in (3, 6, 8)]
    assert "calls aiayn.attention.attention (or a copy of it)" in printed[0]
    assert "calls aiayn.attention.attention (or a copy of it)" in printed[1]
    assert "calls torch.nn.functional.scaled_dot_product_attention" in printed[2]


def test_replaced_tools_are_named_and_restored_ones_pass(monkeypatch):
    """Against the grader's record of the checks' tools, a replaced torch.allclose, math.isclose or built-in fails
    the check with its name; the unchanged interpreter passes."""
    import builtins

    fresh = checks()
    grading = {"nonce": "n", "tools": fresh["tools"]()}
    assert fresh["_replaced"](grading, "before", []) == ""
    for owner, name in ((torch, "allclose"), (math, "isclose"), (builtins, "abs"), (sys, "setprofile")):
        with monkeypatch.context() as m:
            m.setattr(owner, name, lambda *args, **kwargs: True)
            flags = []
            assert f"{owner.__name__}.{name}" in fresh["_replaced"](grading, "before this check ran", flags)
            assert flags == [f"replaced {owner.__name__}.{name}"]
