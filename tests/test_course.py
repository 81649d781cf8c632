"""The course: exercises found from the solution markers, nbgrader source notebooks with one graded cell per check,
checks that give the book's solutions full marks and wrong answers the points of the checks they pass (with
relative errors and the likely cause), no credit for calling or copying the book's code, and the whole nbgrader cycle
on one assignment: generate, release, autograde, feedback, export."""

import importlib.util
import inspect
import math
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import nbformat
import pytest
import torch
import torch.nn.functional as F

from aiayn.course import assignments as course
from aiayn.course import checks as CHECKS

ROOT = course.ROOT
BIN = Path(sys.executable).parent
ASSIGNMENTS = CHECKS.ASSIGNMENTS


def failed(assignment, answer) -> dict:
    """{check key: message} of the checks ``answer`` (a function, or a namespace) does not pass."""
    return {c.key: message for c, message in CHECKS.results(assignment, answer) if message}


def points(assignment, answer) -> int:
    return sum(c.points for c, message in CHECKS.results(assignment, answer) if not message)


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
    found = course.find_exercises(_toy_notebook(), "99_schedule")
    assert [(e.number, e.solution_cell, e.test_cell, e.names, e.assignments) for e in found] == [
        (2, 4, 5, ["double"], []),
        (3, 7, 8, ["warmup_cosine"], ["schedule"]),
    ]
    early = _toy_notebook()
    early.cells.insert(1, nbformat.v4.new_code_cell("### BEGIN SOLUTION\ny = 2\n### END SOLUTION"))
    with pytest.raises(ValueError, match="before the Exercises heading"):
        course.find_exercises(early, "99_schedule")


def test_source_notebook_has_one_graded_cell_per_check():
    with pytest.raises(ValueError, match=r"exercise 2 \(double\): register checks in aiayn/course/checks.py"):
        course.source_notebook(_toy_notebook(), "99_schedule")  # no point is decided by the chapter's test cell
    toy = _toy_notebook()
    del toy.cells[4:6]  # the exercise without checks
    nb = course.source_notebook(toy, "99_schedule")
    meta = [c.metadata.get("nbgrader", {}) for c in nb.cells]
    graded = {m["grade_id"]: m["points"] for m in meta if m.get("grade")}
    want = {f"schedule_{c.key}": c.points for c in ASSIGNMENTS["schedule"].checks}
    assert graded == want  # the chapter's test cell stays, ungraded
    assert [m["grade_id"] for m in meta if m.get("solution")] == ["warmup_cosine"]
    book = [c for c, m in zip(nb.cells, meta) if m.get("locked") and not m.get("grade")]
    assert [c.source for c in book] == ["import math  # set-up", "x = 1"]  # the book's code: read-only
    assert all(c.outputs == [] for c in nb.cells if c.cell_type == "code")
    assert "BEGIN SOLUTION" in nb.cells[6].source  # nbgrader's generate_assignment removes the solutions
    assert "colab" not in nb.cells[1].source.lower()  # no link to the chapter (and its solutions) unless asked
    linked = course.source_notebook(toy, "99_schedule", link=True)
    assert "colab.research.google.com" in linked.cells[1].source


def test_every_assignment_grades_an_exercise_and_every_chapter_is_listed(capsys):
    graded, notebooks = set(), set()
    for path in course.sources():
        notebooks.add(path.stem)
        for e in course.find_exercises(nbformat.read(path, as_version=4), path.stem):
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


@pytest.mark.parametrize("seed", [0, 13, 2**29 + 7])  # 13: the seed whose final weights once failed a tight check
def test_the_books_own_solutions_get_full_marks(seed, monkeypatch):
    """With any draw of the checks' random inputs (a fresh one each time a class is graded)."""
    monkeypatch.setattr(CHECKS, "SEED", seed)
    graded = set()
    for path in course.sources():
        nb = nbformat.read(path, as_version=4)
        for e in course.find_exercises(nb, path.stem):
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
    ns = {"torch": torch}  # the demo's bob answers with the book's formula (the V - 2 spread)
    exec((course.COURSE / "demo" / "label_smoothing" / "bob.py").read_text(), ns)
    why = failed("label_smoothing", ns["my_label_smoothing"])
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
    from aiayn.browser import _attend

    class Layer:  # a ninth trial's: the exported graphs' copy of Equation (1), with projections that do nothing
        W_Q = W_O = staticmethod(lambda x: x)
        split_heads = staticmethod(lambda x: x)

    def via_browser(q, k, v, key_lengths=None, causal=False):
        return _attend(Layer, q, k, v)[0].unflatten(-1, (q.size(1), -1)).transpose(1, 2)

    assert "calls aiayn.browser._attend" in failed("attention", via_browser)["no_mask"]
    V_minus = {}

    def via_loss(logits, target, eps_ls, pad_id):  # the book's loss with eps rescaled: the same target
        V = logits.size(-1)
        V_minus["V"] = V
        return LabelSmoothingLoss(eps_ls * (V - 2) / (V - 1), pad_id)(logits, target)

    assert points("label_smoothing", via_loss) == 0
    # a copy is not a call: the grader flags it from the submission's source, pasted or built by exec
    from aiayn.course import grader

    pasted = inspect.getsource(LabelSmoothingLoss).replace("LabelSmoothingLoss", "Copy").replace("eps_ls", "eps")
    refs = grader.references([ASSIGNMENTS["label_smoothing"]], [])
    assert "resembles aiayn.training.LabelSmoothingLoss" in " ".join(grader.near_copies(pasted, refs))
    built = "import inspect\nexec(inspect.getsource(LabelSmoothingLoss).replace('class L', 'class C'))"
    assert grader.suspect(built) == ["exec", "import inspect"]
    import sacrebleu

    assert points("bleu", lambda h, r: sacrebleu.corpus_bleu(h, [r], smooth_method="add-k", smooth_value=1).score) == 0


def test_an_endless_loop_fails_its_check_after_the_time_limit(monkeypatch):
    monkeypatch.setattr(CHECKS, "CALL_SECONDS", 0.5)

    def loops(step, peak, warmup, total):
        while True:
            pass

    [(check, message)] = [r for r in CHECKS.results("schedule", loops) if r[0].key == "peak"]
    assert message == "your function did not return within 0.5 s (an endless loop?)"


def test_the_book_s_fused_kernel_is_caught_by_any_route():
    """torch's fused attention, called directly, through torch.ops.aten or from a thread, fails the check that
    calls it and names it; a correct answer written from scratch passes."""
    import threading

    def direct(q, k, v, key_lengths=None, causal=False):
        return F.scaled_dot_product_attention(q, k, v)

    def by_aten(q, k, v, key_lengths=None, causal=False):
        return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v)[0]

    def in_a_thread(q, k, v, key_lengths=None, causal=False):
        out = []
        worker = threading.Thread(target=lambda: out.append(F.scaled_dot_product_attention(q, k, v)))
        worker.start(), worker.join()
        return out[0]

    def mine(q, k, v, key_lengths=None, causal=False):
        return (q @ k.transpose(-2, -1) / math.sqrt(q.size(-1))).softmax(-1) @ v

    for route in (direct, by_aten, in_a_thread):
        assert "calls torch.nn.functional.scaled_dot_product_attention" in failed("attention", route)["no_mask"]
    assert "no_mask" not in failed("attention", mine)


def test_pytorch_s_label_smoothing_is_caught_by_any_route():
    """PyTorch's label smoothing, rescaled to give the assignment's loss, fails the checks that call it by any route
    (its argument given by name, by position, through torch.ops.aten or from a thread), and says so; an answer that
    calls PyTorch's cross-entropy without smoothing, for its negative log-likelihood, passes (a tenth trial)."""
    import threading

    def moved_off_padding(smoothed):  # PyTorch spreads eps over all V tokens: rescaled, padding's share taken back
        def answer(logits, target, eps, pad):
            x, t, V = logits.flatten(0, -2), target.flatten(), logits.size(-1)
            log_p, e = x.log_softmax(-1), eps * V / (V - 1)
            loss = smoothed(x, t, pad, e) - (e - eps) * log_p.gather(-1, t[:, None])[:, 0] + e / V * log_p[:, pad]
            return loss.masked_fill(t == pad, 0.0).sum()

        return answer

    by_name = moved_off_padding(lambda x, t, pad, e: F.cross_entropy(x, t, label_smoothing=e, reduction="none"))
    by_position = moved_off_padding(lambda x, t, pad, e: F.cross_entropy(x, t, None, None, pad, None, "none", e))
    by_aten = moved_off_padding(lambda x, t, pad, e: torch.ops.aten.cross_entropy_loss(x, t, None, 0, pad, e))

    def in_a_thread(logits, target, eps, pad):
        out = []
        worker = threading.Thread(target=lambda: out.append(by_name(logits, target, eps, pad)))
        worker.start(), worker.join()
        return out[0]

    def mine(logits, target, eps, pad):
        x, t, V = logits.flatten(0, -2), target.flatten(), logits.size(-1)
        log_p = x.log_softmax(-1)
        smooth = -(log_p.sum(-1) - log_p[:, pad]) / (V - 1)
        loss = (1 - eps) * F.cross_entropy(x, t, reduction="none") + eps * smooth
        return loss.masked_fill(t == pad, 0.0).sum()

    logits, target = torch.randn(3, 5, 11, dtype=torch.float64), torch.randint(0, 11, (3, 5))
    for route in (by_name, by_position, by_aten, in_a_thread):
        torch.testing.assert_close(route(logits, target, 0.1, 0), mine(logits, target, 0.1, 0))  # right answers
        message = failed("label_smoothing", route).get("true_token", "")
        assert "calls torch._C._nn.cross_entropy_loss with label_smoothing=" in message, (route, message)
    assert failed("label_smoothing", mine) == {}


def test_a_check_sees_only_data():
    """What the student's function returns reaches a check as data: a tensor subclass, an object that claims to
    equal everything, or a result too large is refused with a message, never compared."""

    class Equal(torch.Tensor):
        def __eq__(self, other):
            return True

    class Anything:
        def __eq__(self, other):
            return True

        def __float__(self):
            return 0.0005

    assert "not a Equal" in failed("length_penalty", lambda n, a: ((5 + n) / 6).pow(a).as_subclass(Equal))["agrees"]
    assert "returned a Anything" in failed("schedule", lambda *args: Anything())["decay"]
    assert "elements" in failed("length_penalty", lambda n, a: torch.zeros(5_000_000))["agrees"]


def test_a_fabricated_record_of_training_earns_no_more_than_its_count():
    """A loop that trains nothing and writes what the checks observe (NaN learning rates, no gradients, the step count)
    passes only the count of updates, which it wrote: NaN is never close, and every gradient and weight is compared;
    the grader's static flags name the writes (test_static_flags_name_what_reaches_past_the_function)."""

    def fabricates(model, batches, optimizer, scheduler, accum):
        optimizer.seen = [(float("nan"), []), (float("nan"), [])]
        scheduler.last_epoch = 2

    assert set(failed("accumulation", fabricates)) == {"per_update", "averaged"}


def test_an_answer_too_large_to_read_is_counted_not_read():
    """A forged answer that is small on disk but huge in memory (a stride-0 tensor, one row shared by many rows) is
    counted without being read out, no further than the limit."""
    import torch

    from aiayn.course import grader, kernel

    row = [0] * 3000
    assert grader._numbers(torch.ones(1).expand(40_000, 40_000)) > kernel.MAX_ELEMENTS
    assert grader._numbers({"a": [row] * 3000}) > kernel.MAX_ELEMENTS
    # the items at every level: 3 in the tuple, 2 + 2 + 1 in the lists, 3 numbers, 6 elements, 1 + 1 in the dict
    assert grader._numbers(([[1, 2], [3]], torch.ones(2, 3), {"x": 1.0})) == 3 + 5 + 3 + 6 + 2


def test_static_flags_name_what_reaches_past_the_function():
    from aiayn.course import grader
    from aiayn.training import rate

    honest = "def warmup_cosine(step, peak, warmup, total):\n    import math\n    return peak * math.cos(step)"
    assert grader.suspect(honest) == []
    sly = (
        "import sys, gc\ndef f(x):\n    g = sys._getframe(1).f_back.f_globals\n    return getattr(x, 'a' + 'b')\n"
        "exec('1')\ntorch.ops.aten.tril(x)"
    )
    assert grader.suspect(sly) == [
        "._getframe", ".f_back", ".f_globals", ".ops", "exec", "getattr with a computed name", "import gc",
        "import sys",
    ]  # fmt: skip
    hidden = (
        "%%capture\nimport aiayn.course.kernel as K\nfrom aiayn import course\nfrom aiayn.training import rate as r\n"
        "import torch.nn.functional as G\nK.run = print\nG.log_softmax = print\ndel torch.autograd.grad\n"
        "x.grad = None\ndef f(optimizer, scores, step):\n    optimizer.seen = []\n    scores[0] = 1\n"
        "    code = operator.attrgetter('__code__')(r)\n    return torch.jit.script(training.rate)(step)"
    )
    assert grader.suspect(hidden, {"K", "G"}, {"rate"}) == [
        ".attrgetter", ".jit", "a change to G.log_softmax", "a change to K.run", "a change to optimizer.seen",
        "a change to torch.autograd.grad", "a change to x.grad", "import aiayn.course", "import aiayn.course.kernel",
        "operator", "the book's r", "the book's rate", "the name __code__ as a string",
    ]  # fmt: skip
    # a third trial's routes: the call watch replaced through a magic line or sys.modules, the book's function handed
    # on outside the student's function, exec reached through __builtins__, answers written out for the checks' inputs
    routes = (
        "%time import aiayn.course.kernel as K\ndec = greedy_decode\n"
        "kmod = torch.sys.modules.get('aiayn.course.kernel')\nkmod.Watch = None\n__builtins__.exec('1')\n"
        "class M(torch.nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "def f(model, src):\n    if src.size(0) == 2:\n        return [[6], [6]]\n    if src.size(0) == 0:\n"
        "        return [[]], 0, 1.0\n    return 0.25\n%matplotlib inline\n%pip install x\n!ls\n"
        "plt.plot(greedy_decode(m, s, 5))"
    )
    assert grader.suspect(routes, {"K"}, {"greedy_decode"}) == [
        ".exec", ".sys", "__builtins__", "a change to kmod.Watch", "a shell command",
        "an answer written out (return 0.25)", "an answer written out (return [[6], [6]])", "get_ipython",
        "import aiayn.course.kernel", "the book's greedy_decode", "the magic %pip",
        "the name aiayn.course.kernel as a string",
    ]  # fmt: skip
    more = (  # options before a magic's code, a file run into the namespace, names resolved from strings, data
        "%timeit -n1 -r1 import aiayn.course.kernel as K; K.Watch = None\n%run -i helper.py\n"
        "def setup():\n    k = pkgutil.resolve_name('aiayn.' + 'course.kernel')\n    k.Watch = None\n"
        "ANSWERS = {(10, 0): [[5, 7, 4]]}\nsizes = [2, 3]\neps = 1e-9"
    )
    assert grader.suspect(more, {"K"}) == [
        ".resolve_name", "a change to K.Watch", "a change to k.Watch",
        "an answer written out (ANSWERS = {(10, 0): [[5, 7, 4]]})", "import aiayn.course.kernel", "pkgutil",
        "the magic %run",
    ]  # fmt: skip
    tables = (  # a fourth trial's routes: a flat table of answers, numbers as strings, answers loaded from a file
        "TABLE = {'1,0.001,100,1000': 1e-05, '100,0.001,100,1000': 0.001}\nSTEPS = [5, 100, 775, 1000]\n"
        "def f(step):\n    return float('0.000854')\nimport imp\nm = imp.load_source('m', 'helpers.py')\n"
        "answers = torch.load('answers.pt')\nsrc = pathlib.Path('x.txt').read_text()"
    )
    routes = (  # attributes named as constant strings, a dunder inside a string, an answer held in a tensor
        "def f(layer, x):\n    getattr(getattr(torch, 'sys'), 'setprofile')(None)\n    g = getattr(gen, 'gi_frame')\n"
        "    code = string.Formatter().get_field('0.__code__', [f], {})\n"
        "    return torch.tensor([[[0.62, 0.3]]], dtype=torch.float32)\nw = getattr(layer, 'weight')"
    )
    assert grader.suspect(routes) == [
        ".Formatter", ".get_field", ".gi_frame", ".setprofile", ".sys",
        "an answer written out (return torch.tensor([[[0.62, 0.3]]], dty)",
        "the name 0.__code__ as a string", "the name sys as a string",
    ]  # fmt: skip
    routes = (  # a fifth trial's: the call watch patched by name, a thread or a fork by other modules, PyTorch's own
        "from unittest import mock\nimport logging.handlers, posix, mmap, re\n"
        "from torch.nn.attention.flex_attention import flex_attention\n"
        "def f(q, k, v, label_smoothing=0.1):\n    p = re.compile('x')\n"
        "    y = F.cross_entropy(q, k, label_smoothing=0.1)\n    return F.scaled_dot_product_attention(q, k, v)"
    )
    assert grader.suspect(routes) == [
        "PyTorch's own flex_attention", "PyTorch's own label_smoothing", "PyTorch's own scaled_dot_product_attention",
        "import logging.handlers", "import mmap", "import posix", "import unittest", "import unittest.mock",
    ]  # fmt: skip
    assert grader.suspect(tables) == [
        ".load", ".read_text", "a number written as a string",
        "an answer written out (STEPS = [5, 100, 775, 1000])",
        "an answer written out (TABLE = {'1,0.001,100,1000': 1e-05, '100)", "import imp", "pathlib",
    ]  # fmt: skip
    # called outside the student's function too: a table of the book's answers read by the function (a sixth trial)
    plot = "from aiayn.training import rate\nplt.plot([rate(s, 512, 400) for s in steps])"
    assert grader.suspect(plot, (), {"rate"}) == ["the book's rate"]
    routes = (  # a sixth trial's: a profiler of its own, pytest's monkeypatch by name, the shell through a module
        "import cProfile\nfrom pytest import MonkeyPatch\nimport matplotlib_inline.backend_inline as m\n"
        "MonkeyPatch().setattr('sys.setprofile', lambda h: None)\nm.get_ipython().input_transformers_post\n"
        "fit = lambda k, d: shift_matrix(k, d)\nTABLE = {d: sinusoidal_encoding(99, d) for d in range(4, 9, 2)}"
    )
    assert grader.suspect(routes, (), {"shift_matrix", "sinusoidal_encoding"}) == [
        ".get_ipython", ".setattr", "import cProfile", "import matplotlib_inline (not a library the exercises use)",
        "import pytest", "import pytest.MonkeyPatch", "the book's shift_matrix", "the book's sinusoidal_encoding",
        "the name sys.setprofile as a string",
    ]  # fmt: skip
    routes = (  # a seventh trial's: builtins resolved from a string by another library, a dunder name in pieces, a
        # change made through a call's result; and what honest code writes alike
        "from traitlets.utils.importstring import import_item\nsa = import_item('builtins.setattr')\n"
        "fetch(g['run'], '__glo' + 'bals__')['Watch'] = Quiet\nkey = '_'.join(['a', 'b'])\nt = 'torch.float32'\n"
        "words = ['the', 'door', 'is', 'open']\nd['Watch'] = 1"
    )
    assert grader.suspect(routes) == [
        "a change to fetch(g['run'], '__glo' + 'bals__')['Watch']",
        "import traitlets (not a library the exercises use)", "import traitlets.utils.importstring.import_item",
        "import_item", "the name __glo as a string",
        "the name bals__ as a string", "the name builtins.setattr as a string",
    ]  # fmt: skip
    source = inspect.getsource(rate)
    edited = source.replace("def rate(", "def my_rate(").replace("**", "** 1 *").replace("step", "s")
    refs = grader.references([ASSIGNMENTS["schedule"]], [])
    assert grader.near_copies(edited, refs) and "aiayn.training.rate" in grader.near_copies(edited, refs)[0]
    assert grader.near_copies(honest, refs) == []


def test_the_flags_read_code_in_strings_and_as_ipython_reads_it():
    """A ninth trial's: the book's code in a string that timeit runs, a "%" line inside brackets (Python's modulo to
    IPython, which runs it), answers packed in bytes, and PyTorch's own learning-rate schedulers are named; honest
    strings and the safe magics are not."""
    from aiayn.course import grader

    timeit = "import timeit\ntimeit.timeit('sys.setprofile(None); rate(1, 512, 4000)', number=1)"
    found = set(grader.suspect(timeit, book={"rate"}))
    assert {".setprofile (in a string of code)", "the book's rate (in a string of code)"} <= found
    assert "a change to torch.save (in a string of code)" in grader.suspect("exec2('torch.save = print')")
    modulo = "v = (1\n%__import__('sys').setprofile(None)\n)"
    assert {"__import__", ".setprofile"} <= set(grader.suspect(modulo))
    packed = "import struct\ntable = struct.unpack('<d', b'\\x00\\x00\\x00\\x00\\x00\\x00\\xf0?')"
    assert {"data written as bytes", "import struct"} <= set(grader.suspect(packed))
    cosine = "from torch.optim.lr_scheduler import CosineAnnealingLR"
    assert "PyTorch's own CosineAnnealingLR" in grader.suspect(cosine)
    honest = "%%time\nx = 'a = b'\nprint(f'loss = {len(x):.3f}')\n%time y = max(1, 2)\n%matplotlib inline"
    assert grader.suspect(honest) == []
    assert grader.suspect("%%capture out\nimport sys") == ["import sys"]  # a safe magic's code, read once
    # a tenth trial's: a computed string run by timeit, the kernel's own shell or threads, options of %%capture, help
    # lines (IPython reads the whole cell again for each, like a magic line)
    assert grader.suspect("import timeit\ntimeit.timeit(S[::-1])") == [".timeit", "import timeit"]
    assert "import ipykernel.zmqshell" in grader.suspect("from ipykernel.zmqshell import ZMQInteractiveShell")
    assert grader.suspect("%%capture --no-stdout cap\nprint(1)") == []
    assert grader._nodes("probe = 1\n" + "probe?\n" * 499 + "probe\n" * 600, magics=True) == []
    # a cell that names get_ipython (even in a comment) keeps IPython's calls of its magics in view, and is flagged
    assert grader.suspect("%%time\nimport sys\n# get_ipython") == ["get_ipython", "import sys"]


def test_pytorch_s_own_layers_are_not_named_the_book_s():
    """A reference of PyTorch's (nn.MultiheadAttention for multi_head) is flagged as PyTorch's own, never as the
    book's; the book's class named in a student's cell is the book's (a tenth trial), but where every exercise that
    names it hands it over (a sixteenth trial)."""
    from aiayn.course import grader

    locked = {"nbgrader": {"grade_id": "multi_head_shape", "locked": True}}
    check = nbformat.v4.new_code_cell("check()", metadata=locked)
    theirs = nbformat.v4.new_code_cell("layer = torch.nn.MultiheadAttention(32, 4)")
    ours = nbformat.v4.new_code_cell("from aiayn.multi_head import MultiHeadAttention\nMultiHeadAttention(32, 4)")
    nb = nbformat.v4.new_notebook(cells=[check, theirs, ours])
    execute = grader.Execute()
    execute._checks = {"multi_head_shape": ("multi_head", "shape")}  # as preprocess sets it
    execute._flag(nb, {}, CHECKS.ASSIGNMENTS)
    assert theirs.metadata["aiayn"]["flags"] == ["uses PyTorch's own MultiheadAttention"]
    assert "aiayn" not in ours.metadata  # the class the exercise hands to the student's function (a sixteenth trial)
    # where the notebook also asks for its parameters as a formula, the class is the book's code
    more = {"nbgrader": {"grade_id": "mha_parameters_agrees", "locked": True}}
    nb.cells.insert(1, nbformat.v4.new_code_cell("check()", metadata=more))
    execute._checks["mha_parameters_agrees"] = ("mha_parameters", "agrees")
    execute._flag(nb, {}, CHECKS.ASSIGNMENTS)
    assert ours.metadata["aiayn"]["flags"] == ["uses the book's MultiHeadAttention"]


def test_the_flags_read_a_costly_cell_within_bounds(monkeypatch):
    """A sixth trial's: code made costly for the flags to read (a magic line of thousands of terms, one nested past
    the parser's limits, a function of hundreds of statements) is read within bounds or not at all, never raising."""
    from aiayn.course import grader

    assert len(grader._nodes("%time x = [" + "1, " * 500 + "1]", magics=True)) > 500  # a long magic's code is read
    assert grader._nodes("%time " + "(" * 300 + ")" * 300, magics=True) == []  # nested past the parser's limit
    timeit = grader._nodes("%timeit -n 1 -r 1 -p 3 -t -c -q -o import sys", magics=True)  # options as IPython reads
    assert any(isinstance(n, grader.ast.Import) for n in timeit)
    assert grader._nodes("%time " + "a " * 3000, magics=True) == []  # a safe magic's code that is not Python
    assert grader._nodes("x = " + "(" * 500 + ")" * 500) == []  # nested past the parser's limit: not read
    assert grader._nodes("x = 1\n" * (grader.FLAG_CHARS // 6 + 1)) == []  # longer than the flags read
    long = "def f(x):\n" + "".join(f"    x = x + {i}\n" for i in range(600)) + "    return x"
    refs = grader.references([ASSIGNMENTS["schedule"]], [])

    def ratio(self):
        raise AssertionError("the full comparison ran for a function far longer than the reference")

    monkeypatch.setattr(grader.difflib.SequenceMatcher, "ratio", ratio)
    assert grader.near_copies(long, refs) == []
    assert grader.near_copies("def f():\n    return 1", refs, deadline=0) == [grader.LATE]
    # a seventh trial's: a hundred cells of magic lines, each costly to read past its options, within the flags' time
    costly = "\n".join(f"%time {i} " + "-x " * 600 + "(" for i in range(40))
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(costly + f"\n# {i}") for i in range(100)])
    monkeypatch.setattr(grader, "FLAG_SECONDS", 2.0)
    execute, start = grader.Execute(), time.monotonic()
    execute._checks = {}
    execute._flag(nb, {}, ASSIGNMENTS)
    assert time.monotonic() - start < 2.0 + 3.0  # the flags' time, and one cell past it at most
    unread = {grader.LATE, "code the flags cannot read"}  # (IPython would read each cell again for each magic line)
    assert all(unread & set(c.metadata["aiayn"]["flags"]) for c in nb.cells)


def test_a_grader_error_leaves_no_kernel_s_folder(monkeypatch):
    """An error of the grader's own in the flags ends that notebook's grading (nbgrader reports it and goes on to the
    next) and removes the folder of the kernel started for it, as grading does however it ends."""
    from traitlets.config import Config

    from aiayn.course import grader

    ready = grader.SandboxKernelManager()  # the kernel started while the notebook before was graded
    monkeypatch.setattr(grader, "SPARE", [ready])

    def fails(*args):
        raise RuntimeError("the grader's own error")

    monkeypatch.setattr(grader.Execute, "_flag", fails)
    execute = grader.Execute(config=Config({"SandboxKernelManager": {"sandbox": False}}))  # (no kernel to start)
    assert ready.sandbox_dir.is_dir()
    with pytest.raises(RuntimeError, match="the grader's own error"):
        execute.preprocess(nbformat.v4.new_notebook(), {})
    assert not ready.sandbox_dir.exists()


def test_a_folder_nested_thousands_deep_is_measured_and_refused(tmp_path, monkeypatch):
    """The disk watch measures a kernel's folder nested deeper than Python's recursion and kills the kernel past its
    limit (a sixth trial's route past the disk limit); a submission nested so deep is not graded."""
    from aiayn.course import grader

    manager = grader.SandboxKernelManager(disk_mb=1)
    monkeypatch.chdir(manager.sandbox_dir)
    for _ in range(2500):
        os.mkdir("dd")
        os.chdir("dd")
    Path("big").write_bytes(bytes(2 << 20))

    class Kernel:
        killed = False

        def poll(self):
            return 0 if self.killed else None

        def kill(self):
            self.killed = True

    kernel = Kernel()
    manager._watch_disk(kernel)
    assert kernel.killed and manager.disk_full
    problems = grader.odd_files(manager.sandbox_dir)
    assert len(problems) == 1 and problems[0].endswith("is nested more than 64 folders deep")
    subprocess.run(["rm", "-rf", manager.sandbox_dir], check=True)


def test_inputs_drawn_afresh_defeat_a_table_of_the_last_grading(monkeypatch):
    """The positional and BLEU checks' inputs change with each grading's seed: answers recorded under one seed fail
    under another, and a BLEU on words split at spaces (not 13a's tokens) is named."""
    from aiayn.positional import sinusoidal_encoding  # noqa: F401  (the table's source, as a student would use)

    monkeypatch.setattr(CHECKS, "SEED", 1)
    table = {}

    def recording(max_len, d_model):
        half = d_model // 2
        inv = torch.exp(-torch.arange(half, dtype=torch.float64) * math.log(1e4) / (half - 1))
        angle = torch.arange(max_len, dtype=torch.float64)[:, None] * inv
        table[max_len, d_model] = torch.cat([angle.sin(), angle.cos()], 1)
        return table[max_len, d_model]

    assert failed("positional", recording) == {}
    monkeypatch.setattr(CHECKS, "SEED", 2)
    assert len(failed("positional", lambda n, d: table[n, d])) >= 4
    seen = {}  # a ninth trial's: every value the schedule's checks asked for under one seed

    def schedule(step, peak, warmup, total):
        seen[step, peak, warmup, total] = CHECKS._warmup_cosine(step, peak, warmup, total)
        return seen[step, peak, warmup, total]

    monkeypatch.setattr(CHECKS, "SEED", 1)
    assert failed("schedule", schedule) == {}
    monkeypatch.setattr(CHECKS, "SEED", 2)
    assert set(failed("schedule", lambda *key: seen.get(key, 0.0))) >= {"warmup", "peak", "decay", "grid"}

    def spaces(hyps, refs):  # add-one BLEU on words split at spaces
        return CHECKS._add_one_bleu(hyps, refs, str.split)

    messages = failed("bleu", spaces)
    assert "words split at spaces" in " ".join(messages.values()) and len(messages) >= 3

    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    def plain(hyps, refs):
        tok, m, t, c, r = Tokenizer13a(), [0] * 4, [0] * 4, 0, 0
        for hyp, ref in zip(hyps, refs):
            h, g = tok(hyp).split(), tok(ref).split()
            c, r = c + len(h), r + len(g)
            for n in range(1, 5):
                hc, rc = CHECKS._ngrams(h, n), CHECKS._ngrams(g, n)
                m[n - 1] += sum(min(k, rc[x]) for x, k in hc.items())
                t[n - 1] += sum(hc.values())
        if min(m) == 0:
            return 0.0
        return 100 * min(1.0, math.exp(1 - r / c)) * math.exp(sum(math.log(a / b) for a, b in zip(m, t)) / 4)

    for seed in (1, 2):  # hypotheses and references respelled alike: a prefix of a reference stays one
        monkeypatch.setattr(CHECKS, "SEED", seed)
        assert set(failed("bleu", plain)) == {"smoothing", "corpus", "random"}, seed
    outputs, scores = {}, {}  # an eleventh trial's: the greedy and BLEU checks' answers kept under one seed

    def greedy_kept(model, src, max_len, min_len=0):
        outputs[str(src.tolist()), max_len, min_len] = CHECKS._greedy(model, src, max_len, min_len)
        return outputs[str(src.tolist()), max_len, min_len]

    def bleu_kept(hyps, refs):  # by the corpus's number of words
        scores[sum(len(x.split()) for x in hyps + refs)] = CHECKS._add_one_bleu(hyps, refs)
        return scores[sum(len(x.split()) for x in hyps + refs)]

    monkeypatch.setattr(CHECKS, "SEED", 1)
    assert failed("greedy", greedy_kept) == {} and failed("bleu", bleu_kept) == {}
    monkeypatch.setattr(CHECKS, "SEED", 2)
    assert set(failed("greedy", lambda m, s, n, min_len=0: outputs.get((str(s.tolist()), n, min_len), [[]]))) >= {
        "chain", "stops", "min_len",
    }  # fmt: skip
    assert set(failed("bleu", lambda hyps, refs: scores.get(sum(len(x.split()) for x in hyps + refs), 0.0))) >= {
        "smoothing",
        "corpus",
        "random",
    }  # fmt: skip (brevity: its score is the brevity penalty of the drawn lengths, whichever way it is found)


def test_a_constant_encoding_earns_only_its_position_zero():
    """A sixth trial's: zeros, then ones, in every row has the right shape, the right position 0 and the right norm
    everywhere; the norm check now asks that the encoding change with the position, and (a twenty-second trial's
    table of zeros) so does the shape check."""

    def constant(max_len, d_model):
        return torch.cat([torch.zeros(max_len, d_model // 2), torch.ones(max_len, d_model // 2)], 1)

    assert set(failed("positional", constant)) == {"shape", "halves", "timescales", "reference", "norm"}


def test_a_numpy_array_of_numbers_is_read_as_a_tensor():
    """An answer computed with numpy earns what the same tensor earns (a sixth trial's honest greedy decoder lost its
    points for returning an array); an array of objects is still refused."""

    def with_numpy(max_len, d_model):
        return CHECKS._timing_signal(max_len, d_model).numpy()

    assert failed("positional", with_numpy) == {}
    assert failed("positional", lambda n, d: __import__("numpy").array([object()] * n, dtype=object))


def test_a_profiler_of_the_student_s_own_switches_the_watch_off_and_earns_nothing():
    """cProfile, or any profiler set by the student's code, replaces the call watch's: the check says so and fails
    (a sixth trial's route to the book's code unseen)."""
    import cProfile

    from aiayn.training import rate

    def hidden(step, peak, warmup, total):
        return cProfile.Profile().runcall(lambda: rate(step + 1, 512, warmup) * 0 + peak * min(1, step / warmup))

    messages = failed("schedule", hidden)
    assert messages and all("replaced the grader's call watch" in m for m in messages.values())

    def quiet(step, peak, warmup, total):  # an eighth trial's: sys's own functions replaced by stand-ins beforehand
        return rate(step + 1, 512, warmup) * 0 + peak * min(1, step / warmup)

    import sys

    real, seen = (sys.setprofile, sys.getprofile), []
    sys.setprofile, sys.getprofile = seen.append, (lambda: seen[-1] if seen else None)
    try:
        messages = failed("schedule", quiet)
    finally:
        sys.setprofile, sys.getprofile = real
    assert messages and all("replaced the grader's call watch" in m for m in messages.values())

    def interrupts(step, peak, warmup, total):
        raise KeyboardInterrupt

    assert "raised KeyboardInterrupt" in " ".join(failed("schedule", interrupts).values())


def test_a_twenty_fourth_trial_s_routes_are_caught_or_flagged(monkeypatch):
    """A twenty-fourth trial's: code hidden in the strings that pandas' DataFrame.query reads (``@name``, a caller's
    name: not Python), a trace function that runs the book's code where the call watch's profiler does not, and a copy
    of a reference's code under another name."""
    import threading
    import types

    from aiayn.attention import attention
    from aiayn.course import grader, kernel

    hidden = 'table.query("@torch.sys.settrace(@tracer) == 0", engine="python", level=1)'
    found = grader.suspect(hidden)
    assert ".query with arguments (pandas': names resolved from a string)" in found
    assert {".settrace (in a string of code)", ".sys (in a string of code)"} <= set(found)
    assert "the book's greedy_decode (in a string of code)" in grader.suspect(
        'quietly("@box.update(f=@greedy_decode) == 0")', book={"greedy_decode"}
    )
    assert grader.suspect("ask = getattr(table, 'query')") == [".query"]
    assert grader.suspect("from pandas import eval as ev") == ["import pandas.eval"]
    assert grader.suspect("m = a @ b\nprint('x = (a @ b)')") == []  # (a matrix product is not pandas')
    # a copy of the reference's code, renamed, does what the reference does: a call of it
    copy = types.FunctionType(attention.__code__.replace(co_name="mine"), attention.__globals__)
    q = torch.randn(1, 1, 2, 4)
    watch = kernel.Watch(["aiayn.attention.attention"], {})
    watch(lambda: copy(q, q, q, None, 0.0))
    assert watch.hits == ["aiayn.attention.attention"]
    # a trace function: not set while a call is watched (the audit hook's rule), nor kept from before it
    watch = kernel.Watch([], {})
    with pytest.raises(PermissionError):
        watch(kernel._audit, "sys.settrace", (None,))
    monkeypatch.setattr(kernel, "THREADS", frozenset(sys._current_frames()))  # as under the grader
    tracer, seen = (lambda frame, event, arg: None), []
    request = {"names": ["f"], "args": [], "kwargs": {}, "references": [], "seconds": 5}
    sys.settrace(tracer), threading.settrace(tracer)
    try:
        kernel.run(request, {"f": lambda: seen.append((sys.gettrace(), threading.gettrace()))})
    finally:
        sys.settrace(None), threading.settrace(None)
    assert seen == [(None, None)]


def test_a_twenty_fifth_trial_s_routes_are_caught_or_flagged():
    """A twenty-fifth trial's: the chapter's source read back from IPython's history (``In``) and run from a string
    that functools.singledispatch evaluates as an annotation, PyTorch's Transformer layers bound by a match pattern,
    and the book's attention and feed-forward layers reached as attributes of the package to count a model's
    parameters."""
    from aiayn.course import grader

    hidden = (
        "from __future__ import annotations\nimport functools\nsource = [c for c in In if 'def ra' + 'te(' in c][-1]\n"
        "def slot(x: f'{expr}'): pass\nfunctools.singledispatch(print).register(slot)"
    )
    assert {".singledispatch", "In"} <= set(grader.suspect(hidden))
    assert grader.suspect("x = _i3 + Out[2]") == ["Out", "_i3"]
    assert grader.suspect("for In in range(3):\n    print(In)") == []  # (a name of the student's own)
    matched = "match tnn:\n    case object(TransformerEncoderLayer=Enc):\n        pass"
    assert grader.suspect(matched) == [".TransformerEncoderLayer"]
    parts = {"aiayn.multi_head.MultiHeadAttention", "aiayn.feed_forward.PositionwiseFeedForward"}
    assert parts | {"torch.nn.TransformerEncoderLayer"} <= set(ASSIGNMENTS["parameter_count"].references)
    from aiayn.model import TransformerConfig, parameter_count

    right = TransformerConfig(vocab_size=1000, d_k=40)
    assert _count_with_the_book_s_layers(right) == parameter_count(right)  # a right count, of the book's layers
    assert points("parameter_count", _count_with_the_book_s_layers) == 0


def _count_with_the_book_s_layers(c):
    """The twenty-fifth trial's count: the book's attention and feed-forward layers built and counted."""
    import aiayn

    attention = aiayn.multi_head.MultiHeadAttention(c.d_model, c.h, d_k=c.d_k, d_v=c.d_v)
    ffn = aiayn.feed_forward.PositionwiseFeedForward(c.d_model, c.d_ff)
    size = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    norms, embed = 2 * c.d_model, c.vocab_size * c.d_model
    return embed + c.N * (size(attention) + size(ffn) + 2 * norms) + c.N * (2 * size(attention) + size(ffn) + 3 * norms)


def test_a_twenty_sixth_trial_s_routes_are_caught_or_flagged(monkeypatch):
    """A twenty-sixth trial's: the book's function saved, then its module's name bound to a stand-in (the call watch
    read its references from the kernel's modules); a helper of the chapter's cells (its figure's ``occupancy``) run
    with the notebook's data swapped; sacreBLEU's character n-grams; the book's helper pasted inside the answer, its
    parameter now the enclosing function's name. And an exact ``Fraction`` is a number the checks read."""
    import fractions

    from aiayn import decoding
    from aiayn.course import grader, kernel

    # what the watch looks for is found by the grader, from modules no submission changes
    known = kernel.watched(["aiayn.decoding.length_penalty"], defined={})
    real = decoding.length_penalty
    monkeypatch.setattr(decoding, "length_penalty", lambda length, alpha: None)
    for found, hits in [(None, []), (known, ["aiayn.decoding.length_penalty"])]:  # (the kernel's own look: missed)
        watch = kernel.Watch(["aiayn.decoding.length_penalty"], {}, known=found)
        watch(real, torch.tensor([3.0]), 0.6)
        assert watch.hits == hits

    # a function the chapter's cells define, not a reference: a call of it is named for the report
    occupancy = "def occupancy(batch):\n    return [lengths[i] for i in batch]"
    namespace = {"lengths": [(1, 2), (3, 4)]}
    exec(compile(occupancy, "<cell>", "exec"), namespace)
    exec("def my_padding_fraction(batches, lengths):\n    return len(occupancy(batches[0]))", namespace)
    watched = kernel.watched(
        ["aiayn.batching.padding_fraction"], defined={"occupancy": occupancy}, chapter=["occupancy"]
    )
    request = {"names": ["my_padding_fraction"], "args": [[[0, 1]], []], "kwargs": {}, "references": [], "seconds": 5}
    answer = kernel.run(request | {"watched": watched}, namespace)
    assert answer["value"] == 2 and answer["calls"] == [] and answer["chapter"] == ["the chapter's occupancy"]
    answered = lambda request: kernel.run(request | {"watched": watched}, namespace)  # noqa: E731
    assert CHECKS.verdict("padding_fraction", "agrees", answered)[2] == [
        "calls the chapter's occupancy (not one the exercise hands over)"
    ]

    def char_ngrams(hyp, ref, n):
        from sacrebleu.metrics.helpers import extract_char_ngrams

        alphabet = {w: chr(0x4E00 + i) for i, w in enumerate(sorted(set(hyp) | set(ref)))}
        h, r = (extract_char_ngrams("".join(alphabet[w] for w in s), n, True) for s in (hyp, ref))
        return sum((h & r).values()), sum(h.values())

    assert "calls sacrebleu.metrics.helpers.extract_char_ngrams" in failed("clipped_matches", char_ngrams)["agrees"]

    nested = """def my_padding_fraction(batches, lengths):
    real = sum(lengths[i][0] + lengths[i][1] for batch in batches for i in batch)
    def padded(batch):
        n = len(batch)
        max_src = max(lengths[i][0] for i in batch)
        max_tgt = max(lengths[i][1] for i in batch)
        return n * max_src + n * max_tgt
    return 1 - real / sum(padded(batch) for batch in batches)"""
    refs = grader.references([ASSIGNMENTS["padding_fraction"]], [])
    assert any(f.startswith("resembles aiayn.batching.padded_tokens") for f in grader.near_copies(nested, refs))

    def exact(batches, lengths):
        real = sum(sum(lengths[i]) for b in batches for i in b)
        padded = sum(len(b) * (max(lengths[i][0] for i in b) + max(lengths[i][1] for i in b)) for b in batches)
        return 1 - fractions.Fraction(real, padded)

    assert points("padding_fraction", exact) == 1


def test_a_twenty_seventh_trial_s_routes_are_caught_or_flagged():
    """A twenty-seventh trial's: attributes read through a subclass of string's Formatter ("{0.__globals__}", the
    name built from pieces), and the book's function run from the repr of an object put among a copy of compiled
    code's constants, which the call watch read inside its profiler, where nothing is watched."""
    import types

    from aiayn.batching import collate
    from aiayn.course import grader, kernel

    peek = "class Peek(string.Formatter):\n    def format_field(self, value, spec):\n        self.got = value"
    assert ".Formatter" in grader.suspect(peek)
    assert grader.suspect("from string import Formatter") == ["import string.Formatter"]
    ran = []

    class Box:
        def __repr__(self):
            ran.append(collate([([1], [2])]))  # the book's code, if the watch ever reads this repr
            return "Box()"

    def quietly():
        blank = lambda: None  # noqa: E731
        types.FunctionType(blank.__code__.replace(co_consts=blank.__code__.co_consts + (Box(),)), {})()
        return collate([([1], [2])])[1][:, :-1]

    watch = kernel.Watch(["aiayn.batching.collate"], {})
    watch(quietly)
    assert watch.hits == ["aiayn.batching.collate"] and ran == []
    assert kernel._constant(Box()) == ("an object",) and ran == []


def test_the_grading_machinery_stays_small():
    """The grader, the kernel's side of a call, the course's nbgrader configuration and its command line: at most 1086
    lines of code (not counting blank lines, comments and docstrings) beside the checks."""
    import ast
    import io
    import tokenize

    folder, total = ROOT / "aiayn" / "course", 0
    for name in ("grader.py", "kernel.py", "nbgrader_config.py", "__main__.py"):
        source = (folder / name).read_text()
        docs = {
            line
            for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and node.body
            and isinstance(node.body[0], ast.Expr)
            and isinstance(node.body[0].value, ast.Constant)
            and isinstance(node.body[0].value.value, str)
            for line in range(node.body[0].lineno, node.body[0].end_lineno + 1)
        }
        skip = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
        code = {
            line
            for token in tokenize.generate_tokens(io.StringIO(source).readline)
            if token.type not in skip
            for line in range(token.start[0], token.end[0] + 1)
        }
        total += len(code - docs)
    # 900 until the fourteenth trial, whose routes needed a seccomp filter (no process starts in a kernel) and a flag on
    # threads running beside a call: 24 lines that no other part of the grader could give back; 925 until the fifteenth
    # trial, whose routes needed the backward pass inside the watch, numpy's own classes only, and no memory file or
    # subinterpreter in a kernel (7 lines); 932 until the sixteenth trial, whose routes needed the assigned magics
    # bounded and the classes that an exercise hands over told apart (5 lines), and grading's time per submission,
    # which starts each kernel while the submission before it is graded (13 lines); 950 until the seventeenth trial,
    # whose routes needed definitions of builtins and match patterns' attributes flagged, names bound by := the
    # student's, and a result's structure bounded before it is read (16 lines); 966 until the eighteenth trial, whose
    # routes needed tqdm's monitor thread off in a graded kernel, libraries that build objects from text flagged, and
    # PyTorch's Transformer layers named (3 lines); 969 until the nineteenth trial, whose routes needed private modules
    # and names imported, and numpy's file readers, flagged, and a thread that a call leaves running counted (3 lines);
    # 972 until the twentieth trial, whose routes needed an allow-list of the libraries an answer may import unflagged
    # (jinja2 resolved names from strings) and the profiler's changes refused while it watches a call (11 lines); 983
    # until the twentieth trial's pasted forward with a branch cut away needed the share of a function held in long
    # runs of the book's code (5 lines); 988 until the twenty-first trial, whose routes needed pandas' other file
    # readers flagged (1 line); 989 until the twenty-second trial, whose routes needed the digest of each answer
    # printed by its call and compared (an answer file rewritten after the call: 17 lines), a cell's functions compared
    # with a long reference together (a paste cut into helpers: 9 lines), files written, folders listed, the book's
    # package imported and PyTorch's label smoothing passed by position flagged (15 lines), and the course's code
    # linted at last (a name in ruff's exclusions had kept it out: 1 line); 1031 until a twenty-third trial, whose
    # routes needed pandas' eval, a resolver of names from strings, flagged (3 lines); 1034 until that trial's solution
    # padded with statements between its lines needed one function's share of a long reference in runs (3 lines); 1037
    # until a twenty-fourth trial, whose routes needed pandas' query flagged and the strings it reads read (2 lines), a
    # trace function refused during a call and cleared before it (3 lines), and a code object matched by what it does
    # as well as by its identity (a renamed copy of a reference's code: 6 lines); 1048 until a twenty-fifth trial, whose
    # routes needed IPython's history of the cells read, functools' singledispatch (which evaluates annotations) and
    # PyTorch's layers in a match pattern flagged (4 lines); 1052 until a review dropped the call watch's table of code
    # by identity, which its table by what the code does already holds (1 line less); 1051 until a twenty-sixth trial,
    # whose routes needed what the call watch looks for found in the grader's process (the kernel's modules can be
    # changed) and a call of the chapter's other functions named (17 lines), an exact fraction read as a number (4
    # lines) and a copy nested in another function compared with its local names alike (6 lines); 1078 until a
    # twenty-seventh trial, whose routes needed string's Formatter flagged and the call watch to read only Python's own
    # constants (an object's repr ran the book's code inside its profiler: 8 lines)
    assert 500 < total <= 1086, f"{total} lines of grading code"


def test_odd_files_are_named_and_nothing_is_followed(tmp_path):
    from aiayn.course import grader

    folder = tmp_path / "alice" / "schedule"
    folder.mkdir(parents=True)
    (folder / "schedule.ipynb").write_text("{}")
    assert grader.odd_files(folder) == []
    for i in range(3):  # an eighth trial's: sparse files each under the limit, over it in all
        with open(folder / f"part{i}.bin", "wb") as fh:
            fh.truncate(grader.MAX_FILE // 2)
    assert grader.odd_files(folder) == [f"its files hold over {grader.MAX_FILE >> 20} MiB in all"]
    for i in range(3):
        (folder / f"part{i}.bin").unlink()
    (folder / "notes.txt").symlink_to(tmp_path / "gradebook.db")
    os.link(folder / "schedule.ipynb", tmp_path / "elsewhere.ipynb")
    os.mkfifo(folder / "pipe")
    with open(folder / "data.bin", "wb") as fh:  # sparse: no space on disk, but a copy would fill it
        fh.truncate(grader.MAX_FILE + 1)
    assert grader.odd_files(folder) == [
        "data.bin is over 64 MiB, the most a file of a submission may hold",
        "notes.txt is a symbolic link",
        "pipe is not a regular file (a device, a pipe or a socket)",
        "schedule.ipynb is a hard link, to a file outside the submissions",
    ]
    # a twelfth trial's: a hard link between two submissions of a course refuses neither (which student made it cannot
    # be told; report flags both), one to a file outside the submissions still refuses its own
    submitted = tmp_path / "submitted"
    mine, theirs = submitted / "hal" / "schedule", submitted / "paula" / "schedule"
    mine.mkdir(parents=True), theirs.mkdir(parents=True)
    (theirs / "schedule.ipynb").write_text("{}")
    os.link(theirs / "schedule.ipynb", mine / "notes.txt")
    assert grader.odd_files(mine, submitted) == grader.odd_files(theirs, submitted) == []
    os.link(theirs / "schedule.ipynb", tmp_path / "copy.ipynb")
    assert grader.odd_files(theirs, submitted) == ["schedule.ipynb is a hard link, to a file outside the submissions"]


# ---- the whole nbgrader cycle ----------------------------------------------------------------------------


def grader_report(root: Path, assignment: str) -> list[str]:
    from aiayn.course.grader import report

    return report(root, assignment)


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
    """generate, release, autograde (correct, wrong, empty, corrupted, looping, tampered, stripped, reading a file
    beside the notebook), feedback, export; the points are those the checks give in the student's own run."""
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
        nb.cells[0].metadata["aiayn"] = {"flags": ["FAKE"], "stopped": "FAKE"}  # what only the grader writes

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
    for student in ("h_own_file", "i_own_file"):  # each kernel (started before its submission is known) gets its own
        _submit(root, "schedule", student, {cosine: f"assert open('me.txt').read() == {student!r}\n{right[cosine]}"})
        (root / "submitted" / student / "schedule" / "me.txt").write_text(student)
    run = _nbgrader(root, "autograde", "schedule")
    assert run.returncode == 1 and "for student 'd_corrupted'" in run.stderr  # the others are graded all the same
    assert _nbgrader(root, "generate_feedback", "schedule").returncode == 0
    assert _nbgrader(root, "export").returncode == 0

    import csv

    with open(root / "grades.csv") as fh:
        scores = {row["student_id"]: (float(row["score"]), float(row["max_score"])) for row in csv.DictReader(fh)}

    last = {}  # the checks that failed in the last own run, for the message of an assertion

    def own_run(answers):  # the points the check cells give when the student runs the notebook
        ns = {"torch": torch, "math": math}
        for source in answers.values():
            exec(source, ns)
        results = [result for a in ("schedule", "accumulation") for result in CHECKS.results(a, ns)]
        last["failed"] = {c.key: message for c, message in results if message}
        return sum(c.points for c, message in results if not message)

    total = ASSIGNMENTS["schedule"].points + ASSIGNMENTS["accumulation"].points
    assert own_run(right) == total, last["failed"]
    assert 0 < own_run(wrong) < total
    assert list(scores)[:7] == [
        "a_correct",
        "b_wrong",
        "c_empty",
        "d_corrupted",
        "e_looping",
        "f_tampered",
        "g_stripped",
    ]
    assert scores == {
        "a_correct": (total, total),
        "b_wrong": (own_run(wrong), total),
        "c_empty": (0, total),
        "d_corrupted": (0, total),
        "e_looping": (ASSIGNMENTS["schedule"].points, total),
        "f_tampered": (own_run(wrong), total),
        "g_stripped": (total, total),
        "h_own_file": (ASSIGNMENTS["schedule"].points, total),
        "i_own_file": (ASSIGNMENTS["schedule"].points, total),
    }
    for student in ("a_correct", "b_wrong", "e_looping"):
        assert (root / "feedback" / student / "schedule" / "schedule.html").exists()
    graded = nbformat.read(root / "autograded" / "b_wrong" / "schedule" / "schedule.ipynb", as_version=4)
    printed = "".join(o.get("text", "") for c in graded.cells for o in c.get("outputs", []))
    n_checks = len(ASSIGNMENTS["schedule"].checks) + len(ASSIGNMENTS["accumulation"].checks)
    assert printed.count("passed, ") + printed.count("failed, 0 of ") == n_checks  # what the student sees too

    report = "\n".join(grader_report(root, "schedule"))
    lines = {line.split()[0]: line for line in report.splitlines() if not line.startswith(" ")}
    assert "not graded: NotJSONError" in lines["d_corrupted"]
    report = " ".join(report.split())  # the details, unwrapped
    assert "cell 13 stopped by the time limit; the cells after it ran" in report
    assert "schedule_decay: half-way through the decay" in report and "(relative)" in report
    assert "differ from the instructor's copy (schedule_warmup): restored" in report
    assert "1 read-only or graded cell(s) edited (schedule_peak)" in report
    assert "('extra'): run as ordinary cells" in report
    assert "cell(s) without nbgrader metadata recognised by their source" in report
    assert "FAKE" not in report


@pytest.mark.parametrize("name", ["schedule", "label_smoothing", "greedy_and_bleu"])
def test_course_notebooks_run_with_their_solutions(name):
    """The course notebooks run top to bottom: their solutions pass the visible tests in the cell after them."""
    from nbclient import NotebookClient

    nb = nbformat.read(course.COURSE / f"{name}.ipynb", as_version=4)
    NotebookClient(nb, timeout=120, kernel_name="python3", resources={"metadata": {"path": str(ROOT)}}).execute()
    assert not [o for c in nb.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]


def test_the_instructors_page_shows_what_the_worked_example_prints(tmp_path, monkeypatch):
    """The page's worked example, run: its report and its grades.csv are those the commands print today (with the
    checks' random inputs fixed, as the page says)."""
    import re

    monkeypatch.setenv("AIAYN_CHECK_SEED", "0")

    page = (ROOT / "book" / "instructors.md").read_text(encoding="utf-8")

    def shown(command):  # the lines the page shows under `$ command`, up to the next command or the block's end
        block = re.search(rf"^\$ {re.escape(command)}\n(.*?)(?=^\$ |^```)", page, re.M | re.S)
        assert block, f"the page shows no `$ {command}`"
        return block.group(1).rstrip("\n")

    limits = dict(re.findall(r"^([A-Z_]+) = ([\d_]+) ", course.NBGRADER_CONFIG.read_text(), re.M))
    assert len(limits) == 9
    for name, value in limits.items():  # the table of limits
        assert re.search(rf"^\| `{name}` \| {int(value):,} ", page, re.M), name
    assert f"did not return within {limits['CHECK_CALL']} s" in page
    from aiayn.course.grader import Execute

    assert f"`c.Execute.interrupt_grace`, {Execute.class_traits()['interrupt_grace'].default_value:g} s" in page
    assert f"Up to {Execute.class_traits()['max_stuck'].default_value} statements are skipped" in page
    from aiayn.course.grader import MAX_FILE

    assert f"a file over {MAX_FILE >> 20} MiB (`MAX_FILE`" in page
    from aiayn.course.grader import FLAG_CHARS, FLAG_SECONDS, SHORT

    flat = " ".join(page.split())
    bound = "one whose magic, help and autocall lines (`/f`, `,f`, `;f`), a magic's or shell's output assigned (`x = "
    bound += f"!ls`) among them, times its length pass {2 * FLAG_CHARS:,}"
    assert f"a cell over {FLAG_CHARS:,} characters, {bound}" in flat
    assert f"the flags stop after {FLAG_SECONDS:g} s for a notebook" in flat
    assert f"under {SHORT} tokens of its syntax tree" in flat

    root = tmp_path / "my-course"
    assert course.main(["course", str(root), "label_smoothing"]) == 0
    assert _nbgrader(root, "generate_assignment", "label_smoothing").returncode == 0
    assert course.main(["demo", "label_smoothing", "--course", str(root)]) == 0
    assert _nbgrader(root, "autograde", "label_smoothing").returncode == 0
    assert "\n".join(grader_report(root, "label_smoothing")) == shown("python -m aiayn.course report label_smoothing")
    assert _nbgrader(root, "export").returncode == 0
    columns = [0, 3, 7, 9, 10]  # cut -d, -f1,4,8,10,11
    rows = [line.split(",") for line in (root / "grades.csv").read_text().strip().splitlines()]
    assert "\n".join(",".join(row[i] for i in columns) for row in rows) == shown("cut -d, -f1,4,8,10,11 grades.csv")


# ---- a class graded in the sandbox: what a submission can and cannot do ----------------------------------

needs_sandbox = pytest.mark.skipif(
    bool(__import__("aiayn.course.grader", fromlist=["x"]).sandbox_problem()),
    reason="grading needs bubblewrap (apt-get install bubblewrap)",
)


@needs_sandbox
def test_a_kernel_can_make_no_user_namespace_of_its_own():
    """A ninth trial's: the kernel's user (the grader being root) made a user namespace of its own and mounted a file
    system in memory there, past its disk limit. In the sandbox it can make none."""
    from aiayn.course import grader

    inside = ["bwrap", *grader._base(), "--", *grader._unprivileged(grader.FIRST_UID + 1)]
    run = subprocess.run([*inside, "unshare", "-r", "true"], capture_output=True, text=True)
    assert run.returncode != 0 and "unshare failed" in run.stderr
    assert subprocess.run([*inside, "id", "-u"], capture_output=True, text=True).stdout.strip() != "0"


OWN_COSINE = """def warmup_cosine(step, peak, warmup, total):
    if step < warmup:
        return step / warmup * peak
    progress = min(1.0, (step - warmup) / (total - warmup))
    return 0.5 * peak * (1.0 + math.cos(math.pi * progress))"""
OWN_EPOCH = """def my_train_epoch(model, batches, optimizer, scheduler, accum):
    count = 0
    for batch in batches:
        loss = model(batch) / accum
        loss.backward()
        count += 1
        if count % accum == 0:
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad()"""
ATTACKS = {  # student: (the answer to warmup_cosine: "right", "none" or a replacement, or "epoch=" and an answer to
    # my_train_epoch; a cell added after the first answer)
    "a_honest": ("right", ""),
    "b_tamper": (
        "none",
        "import glob, os\n"
        "for path in ['{package}/course/checks.py', '{package}/course/kernel.py', '{package}/attention.py',\n"
        "             '{root}/gradebook.db', *glob.glob('{root}/submitted/*/schedule/schedule.ipynb'),\n"
        "             *glob.glob('{root}/source/*/*.ipynb'), '../../../gradebook.db']:\n"
        "    try:\n"
        "        with open(path, 'a') as fh:\n"
        "            fh.write('20')\n"
        "    except OSError:\n"
        "        pass",
    ),
    "c_undoes_the_sandbox": (
        "right",
        "import os\nos.system('umount {package}/course; mount -o remount,rw /; unshare -Urm sh -c "
        "\\'umount {package}/course; touch {package}/course/checks.py\\'')\n"
        "for call in (lambda: os.setuid(0), lambda: open('{root}/gradebook.db', 'a')):\n"
        "    try:\n        call()\n    except OSError:\n        pass",
    ),
    "d_stuck_in_c": ("right+import re\nre.match(r'(a+)+$', 'a' * 40 + 'b')  # hours in one C call", ""),
    "e_ignores_sigint": (
        "right+import signal, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nstart = time.time()\n"
        "while time.time() - start < 120:\n    pass",
        "",
    ),
    "f_forges": (  # a displayed value, a printed verdict, a display shaped like the old answers
        "def warmup_cosine(step, peak, warmup, total):\n    from IPython.display import display\n"
        "    display({'application/vnd.aiayn.call+json': {'nonce': '0' * 32, 'data': ''}}, raw=True)\n"
        "    print('passed, 2 points')\n    get_ipython().displayhook(100)\n    return 0.0",
        "",
    ),
    "g_patches": (
        "def warmup_cosine(step, peak, warmup, total):\n    return 0.0",
        "import builtins, math, torch\nmath.isclose = lambda *a, **k: True\ntorch.allclose = lambda *a, **k: True\n"
        "builtins.abs = lambda x: 0.0\nbuiltins.float = lambda x: 0.0005",
    ),
    "h_reads_checks": (
        "import importlib, runpy\ntry:\n    from aiayn.course.checks import _warmup_cosine as warmup_cosine\n"
        "except ImportError:\n    warmup_cosine = runpy.run_path('{package}/course/checks.py')['_warmup_cosine']",
        "",
    ),
    "i_searches_frames": (  # the right value only if the running check or its reference can be found
        "import gc, sys\ndef warmup_cosine(step, peak, warmup, total):\n"
        "    for f in gc.get_objects():\n"
        "        if callable(f) and getattr(f, '__name__', '') == '_warmup_' + 'cosine':\n"
        "            return f(step, peak, warmup, total)\n"
        "    frame = sys._getframe(1)\n    while frame:\n"
        "        if '_warmup_cosine' in frame.f_globals:\n"
        "            return frame.f_globals['_warmup_cosine'](step, peak, warmup, total)\n"
        "        frame = frame.f_back\n    return 0.0",
        "",
    ),
    "j_book_in_a_thread": (
        "right_named_inner+import threading\nfrom aiayn.training import rate\n"
        "def warmup_cosine(step, peak, warmup, total):\n"
        "    t = threading.Thread(target=rate, args=(step, 512, warmup))\n    t.start(), t.join()\n"
        "    return inner(step, peak, warmup, total)",
        "",
    ),
    "k_pasted": ("pasted", ""),
    "l_ends_its_kernel": ("right+import os\nos._exit(0)", ""),
    "m_floods_output": ("right", "for i in range(40):\n    print('x' * 100_000)"),
    "n_memory": ("right", "hog = bytearray(8 << 30)"),
    "o_processes": ("right", "import subprocess\nkids = [subprocess.Popen(['sleep', '5']) for _ in range(200)]"),
    "p_symlink": ("right", ""),
    "q_slow": ("right", "import time\ntime.sleep(7.5)"),
    "r_floods_past_a_message": (  # over 8 MiB at once, in a display (what the kernel prints is capped)
        "right",
        "from IPython.display import display\ndisplay({'text/plain': 'y' * 9_000_000}, raw=True)",
    ),
    "s_ships_a_package": ("right", ""),  # an aiayn/ of its own beside the notebook, which no import finds
    "u_prints_without_end": ("right", "while True:\n    print('z' * 1000)"),
    "v_escapes_the_report": (  # terminal escapes, and spaces that would wrap a forged line to a line's start
        "def warmup_cosine(step, peak, warmup, total):\n"
        "    raise ValueError('\\x1b[1A\\x1b[2K' + ' ' * 70 + 'FLAG none')",
        "",
    ),
    "w_pastes_with_markers": ("verbatim", ""),  # the chapter's solution cell as it is, markers and all
    "x_fills_the_disk": (  # 16 MiB at a time, past the class's 64 MiB of disk
        "right",
        "for i in range(200):\n    with open(f'big{i}', 'wb') as fh:\n        fh.write(bytes(16 << 20))",
    ),
    "z_forges_a_report_line": (  # an error under the name of one of the grader's, a printed note of a cut
        "right",
        "print('[output cut: past the forged]')\nclass NotebookTimeLimit(Exception):\n    pass\n"
        "raise NotebookTimeLimit('not run: forged')",
    ),
    "za_redefines_the_book": (  # a function of its own named like the book's: its own, neither flagged nor a call
        "right_named_inner+def rate(step, d_model, warmup):\n    return 0.001\n"
        "def warmup_cosine(step, peak, warmup, total):\n    rate(step, 512, warmup)\n"
        "    return inner(step, peak, warmup, total)",
        "",
    ),
    "y_updates_a_display": (  # an update would replace a small display with 4 MB, past the notebook's limit
        "right",
        "from IPython.display import display, update_display\ndisplay({'text/plain': 'a'}, raw=True, display_id='d')\n"
        "for _ in range(3):\n    update_display({'text/plain': 'y' * 4_000_000}, raw=True, display_id='d')",
    ),
    # a sixth trial's: a magic line before a statement that cannot be stopped (the definition above it is graded),
    # the book's code called under a profiler of the student's own, a folder nested past Python's recursion and filled
    "zb_magic_then_stuck": ("magic_right+import re\nre.match(r'(a+)+$', 'a' * 40 + 'b')", ""),
    "zc_profiles_the_book": (
        "right_named_inner+import cProfile\nfrom aiayn.training import rate\n"
        "def warmup_cosine(step, peak, warmup, total):\n    return cProfile.Profile().runcall(\n"
        "        lambda: (rate(step + 1, 512, warmup), inner(step, peak, warmup, total))[1])",
        "",
    ),
    "zd_nests_deep_then_fills": (
        "right",
        "import os, time\nfor _ in range(1500):\n    os.mkdir('d')\n    os.chdir('d')\ntime.sleep(1.5)\n"
        "for i in range(200):  # long enough for the watch, which looks twice a second, to stop it here\n"
        "    with open(f'b{i}', 'wb') as fh:\n        fh.write(bytes(16 << 20))",
    ),
    "zf_runs_a_file_without_percent": (  # an eighth trial's: `run h.py` is %run where IPython's automagic is on
        "right",
        "open('h.py', 'w').write('def warmup_cosine(step, peak, warmup, total):\\n    return 0.0\\n')\nrun -i h.py",
    ),
    # a fourteenth trial's: the book's code run in a child process (no process can start in the kernel), and a
    # thread started before the checks that answers for the function (the call watch does not see it: flagged)
    "zg_runs_a_child": (
        "right_named_inner+import subprocess, sys\ndef warmup_cosine(step, peak, warmup, total):\n"
        "    code = f'from aiayn.training import rate; print(rate({step}, 512, {warmup}))'\n"
        "    subprocess.run([sys.executable, '-c', code], check=True)\n    return inner(step, peak, warmup, total)",
        "",
    ),
    "zh_answers_from_a_thread": (
        "right_named_inner+import threading, queue\njobs, done = queue.Queue(), queue.Queue()\n"
        "threading.Thread(target=lambda: [done.put(inner(*jobs.get())) for _ in iter(int, 1)], daemon=True).start()\n"
        "def warmup_cosine(step, peak, warmup, total):\n    jobs.put((step, peak, warmup, total))\n"
        "    return done.get()",
        "",
    ),
    # a seventeenth trial's: builtins the grader's call once looked up in the notebook's namespace, defined there to
    # serve the call from a right function of another name (flagged, and the call no longer looks them up)
    "zi_shadows_the_call": (
        "right_named_inner+def warmup_cosine(step, peak, warmup, total):\n    return 0.0\n"
        "def __import__(name, *args, **kwargs):\n    import builtins\n"
        "    module = builtins.__import__(name, *args, **kwargs)\n    if name != 'runpy':\n        return module\n"
        "    class Runpy:\n        def run_path(path):\n            fresh = module.run_path(path)\n"
        "            return {'serve': lambda data, *_: fresh['serve'](data, {'warmup_cosine': inner})}\n"
        "    return Runpy\ndef globals():\n    return {'warmup_cosine': inner}",
        "",
    ),
    # a twentieth trial's: the call watch's profiler switched off around a call of the book's code, then put back
    # (refused under the grader, whatever the route to sys.setprofile: the audit event comes from C)
    "zj_pauses_the_watch": (
        "right_named_inner+import sys\nfrom aiayn.training import rate\ndef pause(profiler):\n    try:\n"
        "        sys.setprofile(profiler)\n    except PermissionError:\n        pass\n"
        "def warmup_cosine(step, peak, warmup, total):\n    watch = sys.getprofile()\n    pause(None)\n"
        "    rate(step + 1, 512, warmup)\n    pause(watch)\n    return inner(step, peak, warmup, total)",
        "",
    ),
    # a twenty-first trial's: the book's code run through torch.compile, whose frames are code the watch never saw (the
    # kernel has the compiler off: the book's own frame runs), and the checks' record of updates added to by hand
    "zk_compiles_the_book": (
        "right_named_inner+import torch\nfrom aiayn.training import rate\n"
        "def warmup_cosine(step, peak, warmup, total):\n"
        "    torch.compile(rate, backend='eager')(step + 1, 512, warmup)\n"
        "    return inner(step, peak, warmup, total)",
        "",
    ),
    "zl_forges_the_record": (  # (its answer to my_train_epoch)
        "epoch=def my_train_epoch(model, batches, optimizer, scheduler, accum):\n"
        "    group = optimizer.param_groups[0]\n"
        "    for _ in range(len(batches) // accum):\n"
        "        optimizer.seen += ((group['lr'], [p.detach() * 0 for p in group['params']]),)\n"
        "        scheduler.step()",
        "",
    ),
    # a twenty-second trial's: the answer file rewritten after the call, by an artist that matplotlib draws once the
    # cell has run (the grader takes an answer only if the call printed its digest: this one fails, and is flagged)
    "zm_rewrites_its_answer": (
        "right_named_inner+import matplotlib, torch\nimport matplotlib.pyplot as plt\n"
        "from matplotlib.artist import Artist\nfrom torch.utils.data.datapipes.iter import FileLister\n"
        "pending, folder = [], matplotlib.get_configdir().rsplit('/', 1)[0]\nclass Later(Artist):\n"
        "    def draw(self, renderer):\n        while pending:\n            value = inner(*pending.pop())\n"
        "            for path in FileLister(folder, 'answer-*'):\n"
        "                torch.save(dict(value=value, error=None, missing=False, timeout=False, calls=[],\n"
        "                                seconds=0.01, threads=0), path)\n"
        "def warmup_cosine(step, peak, warmup, total):\n    pending.append((step, peak, warmup, total))\n"
        "    plt.figure(figsize=(1, 1)).add_artist(Later())\n    return 0.0",
        "",
    ),
    "ze_fills_the_disk_at_once": (  # 80 MiB within the watch's half second: charged to its own cell, not the next
        "right",
        "for i in range(5):\n    with open(f'q{i}', 'wb') as fh:\n        fh.write(bytes(16 << 20))",
    ),
    "t_hides_its_call": (
        "right_named_inner+import aiayn.course.kernel as K\nfrom aiayn.training import rate\nreal = K.run\n"
        "def quiet(request, namespace):\n    answer = real(request, namespace)\n    answer['calls'] = []\n"
        "    return answer\nK.run = quiet\ndef warmup_cosine(step, peak, warmup, total):\n"
        "    rate(step + 1, 512, warmup)\n    return inner(step, peak, warmup, total)",
        "",
    ),
}


@needs_sandbox
def test_a_class_graded_in_the_sandbox(tmp_path):
    """A class of thirty-nine submissions of one assignment, graded by nbgrader in the sandbox as this machine's user
    (root on CI): no grade but the submission's own changes, no honest point is lost, no point is earned without a
    FLAG in the report, and no file outside the submissions changes."""
    import hashlib

    from nbgrader.api import Gradebook

    root = tmp_path / "course"
    course.write_course(root, [course.COURSE / "schedule.ipynb"])
    config = root / "nbgrader_config.py"
    text = config.read_text().replace("STUDENT_CELL = 30", "STUDENT_CELL = 8")
    text = text.replace("CHECK_CALL = 10", "CHECK_CALL = 4")
    assert "DISK_MB = 512" in text
    text = text.replace("DISK_MB = 512", "DISK_MB = 64")
    config.write_text(text.replace("NOTEBOOK = 1800", "NOTEBOOK = 60") + "c.Execute.interrupt_grace = 2\n")
    assert _nbgrader(root, "generate_assignment", "schedule").returncode == 0
    solution = _answers(course.COURSE / "schedule.ipynb")
    cosine = next(k for k in solution if "warmup_cosine" in k)
    epoch = next(k for k in solution if "my_train_epoch" in k)
    right = {**solution, cosine: OWN_COSINE, epoch: OWN_EPOCH}  # a student's own words: no flag
    package = Path(importlib.util.find_spec("aiayn").origin).parent
    pasted = (
        solution[cosine].replace("    if step >= total", "    # the end\n    if step >= total").replace("peak", "top")
    )
    cells = nbformat.read(course.COURSE / "schedule.ipynb", as_version=4).cells
    verbatim = next(c.source for c in cells if course.has_solution(c.source) and "def warmup_cosine" in c.source)

    def edit_for(extra, student):
        def edit(nb):
            first = next(i for i, c in enumerate(nb.cells) if c.metadata.get("nbgrader", {}).get("solution"))
            for _ in range(9 if student == "q_slow" else 1):  # 9 x 7.5 s: past the notebook's 60 s
                source = extra.replace("{root}", str(root)).replace("{package}", str(package))
                nb.cells.insert(first + 1, nbformat.v4.new_code_cell(source))

        return edit if extra else None

    for student, (answer, extra) in ATTACKS.items():
        answer, own_epoch = ("right", answer[6:]) if answer.startswith("epoch=") else (answer, None)
        if answer.startswith("right_named_inner+"):
            answer = right[cosine].replace("def warmup_cosine(", "def inner(") + "\n" + answer.split("+", 1)[1]
        elif answer.startswith("right+"):
            answer = right[cosine] + "\n" + answer.split("+", 1)[1]
        elif answer.startswith("magic_right+"):
            answer = "%matplotlib inline\n" + right[cosine] + "\n" + answer.split("+", 1)[1]
        answers = {
            "right": right,
            "none": {},
            "pasted": {**right, cosine: pasted},
            "verbatim": {**right, cosine: verbatim},
        }.get(answer, {**right, cosine: answer})
        answers = {k: v.replace("{package}", str(package)) for k, v in answers.items()} | (
            {epoch: own_epoch} if own_epoch else {}
        )
        _submit(root, "schedule", student, answers, edit_for(extra, student))
    (root / "submitted/p_symlink/schedule/notes.txt").symlink_to(root / "gradebook.db")
    (root / "submitted/s_ships_a_package/schedule/aiayn").mkdir()
    (root / "submitted/s_ships_a_package/schedule/aiayn/__init__.py").write_text("raise ImportError('its own')")
    protected = [*package.rglob("*.py"), root / "source/schedule/schedule.ipynb"]
    protected += sorted((root / "submitted").glob("*/schedule/schedule.ipynb"))
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in protected}
    kernels = set(Path(tempfile.gettempdir()).glob("aiayn-kernel-*"))  # the kernels' folders before grading

    # two nbgrader processes share the class, as an instructor may run them: the submissions that wait on a limit or
    # meet one, beside the others (one gradebook; each process grades its own students, about half the time each)
    waiting = "d_stuck_in_c,e_ignores_sigint,l_ends_its_kernel,m_floods_output,n_memory,o_processes,q_slow"
    waiting += ",u_prints_without_end,x_fills_the_disk"
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    runs = [
        subprocess.Popen(
            [str(BIN / "nbgrader"), "autograde", "schedule", option],
            cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for option in (f"--CourseDirectory.student_id_exclude={waiting}", "--student=[delmnoqux]_*")
    ]  # fmt: skip
    (_, others), (_, slow) = (run.communicate() for run in runs)
    assert runs[1].returncode == 0, slow
    assert runs[0].returncode == 1 and "p_symlink/schedule not graded: notes.txt is a symbolic link" in others
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in protected} == before
    assert set(Path(tempfile.gettempdir()).glob("aiayn-kernel-*")) <= kernels  # each removed, however deep
    assert not (package / "course" / "checks.py").read_text().endswith("20")

    total = ASSIGNMENTS["schedule"].points + ASSIGNMENTS["accumulation"].points
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        scores = {s: gb.find_submission("schedule", s).score for s in ATTACKS if s != "p_symlink"}
        assert "p_symlink" in {s.id for s in gb.students}  # in nbgrader export, with 0 points
        for student in scores:
            for grade in gb.find_submission_notebook("schedule", "schedule", student).grades:
                assert grade.score in (0, grade.max_score), (student, grade.name, grade.score)
    zero = points("schedule", lambda step, peak, warmup, total: 0.0) + ASSIGNMENTS["accumulation"].points
    assert 0 < zero < total
    assert scores == {
        "a_honest": total,
        "b_tamper": 0,
        "c_undoes_the_sandbox": total,
        "d_stuck_in_c": total,
        "e_ignores_sigint": total,
        "f_forges": zero,
        "h_reads_checks": ASSIGNMENTS["accumulation"].points,
        "i_searches_frames": zero,
        "j_book_in_a_thread": ASSIGNMENTS["accumulation"].points,
        "k_pasted": total,
        "l_ends_its_kernel": total,
        "m_floods_output": total,
        "n_memory": total,
        "o_processes": total,
        "q_slow": 0,
        "r_floods_past_a_message": total,
        "s_ships_a_package": total,
        "t_hides_its_call": ASSIGNMENTS["accumulation"].points,  # each call answered by a fresh copy of the module
        "u_prints_without_end": total,
        "v_escapes_the_report": ASSIGNMENTS["accumulation"].points,
        "w_pastes_with_markers": total,
        "x_fills_the_disk": total,
        "y_updates_a_display": total,
        "z_forges_a_report_line": total,
        "za_redefines_the_book": total,
        "zb_magic_then_stuck": total,
        "zc_profiles_the_book": ASSIGNMENTS["accumulation"].points,
        "zd_nests_deep_then_fills": total,
        "ze_fills_the_disk_at_once": total,
        "zf_runs_a_file_without_percent": total,
        "zg_runs_a_child": ASSIGNMENTS["accumulation"].points,
        "zh_answers_from_a_thread": total,
        "zi_shadows_the_call": zero,
        "zj_pauses_the_watch": ASSIGNMENTS["accumulation"].points,
        "zk_compiles_the_book": ASSIGNMENTS["accumulation"].points,
        "zl_forges_the_record": scores["zl_forges_the_record"],  # flagged, below
        "zm_rewrites_its_answer": ASSIGNMENTS["accumulation"].points,
    } | {"g_patches": scores["g_patches"]}
    assert scores.pop("g_patches") <= zero  # builtins replaced in its own kernel: its own loss, never a gain
    blocks, student = {}, None  # the report's lines of each student, unwrapped
    for line in grader_report(root, "schedule"):
        student = student if line.startswith(" ") else line.split()[0]
        blocks[student] = blocks.get(student, "") + " " + " ".join(line.split())
    assert "not graded: notes.txt is a symbolic link" in blocks["p_symlink"]
    for stuck in ("d_stuck_in_c", "e_ignores_sigint"):
        assert "did not stop when interrupted" in blocks[stuck] and "one statement at a time" in blocks[stuck]
    assert "skipped, the rest ran" in blocks["d_stuck_in_c"]  # the C call cannot be interrupted, even alone
    # ipykernel restores its SIGINT handler after each request: run alone, the loop is interruptible
    assert "stopped by the time limit" in blocks["e_ignores_sigint"]
    assert "ended its kernel" in blocks["l_ends_its_kernel"]
    for full in ("x_fills_the_disk", "zd_nests_deep_then_fills", "ze_fills_the_disk_at_once"):
        assert "ended its kernel: it wrote more to disk than its limit" in blocks[full], full
    assert "skipped, the rest ran" in blocks["zb_magic_then_stuck"]
    assert "the grader's call watch cannot be switched off" in blocks["zc_profiles_the_book"]  # (cProfile's refused)
    assert "import cProfile" in blocks["zc_profiles_the_book"]
    assert "a change to optimizer.seen" in blocks["zl_forges_the_record"]
    assert "FLAG an answer not the one its call wrote (changed after the call)" in blocks["zm_rewrites_its_answer"]
    assert scores["zl_forges_the_record"] < ASSIGNMENTS["schedule"].points + ASSIGNMENTS["accumulation"].points
    graded = root / "autograded/y_updates_a_display/schedule/schedule.ipynb"
    assert graded.stat().st_size < 1_500_000 and "yyyy" not in graded.read_text()
    assert "its output was cut at the cell's limit" in blocks["m_floods_output"]
    # without end, the output is cut, or its messages are dropped when more wait than the grader reads at once
    assert (
        "cut at the cell's limit" in blocks["u_prints_without_end"] or "did not reach" in blocks["u_prints_without_end"]
    )
    assert "stopped by the time limit" in blocks["u_prints_without_end"]
    assert (
        "its output did not reach the grader: a message over 8 MiB, or over 8 at once"
        in blocks["r_floods_past_a_message"]
    )
    assert "the notebook ran past its time limit (60 s)" in blocks["q_slow"]
    assert "FLAG calls aiayn.training.rate" in blocks["j_book_in_a_thread"]
    for pasted in ("k_pasted", "w_pastes_with_markers"):
        assert "FLAG resembles the book's solution (warmup_cosine)" in blocks[pasted], pasted
    assert "?[1A?[2K" in blocks["v_escapes_the_report"] and not any("\x1b" in b for b in blocks.values())
    assert "\n                FLAG none" not in blocks["v_escapes_the_report"]  # (a wrapped line starts 18 columns in)
    for sly in ("c_undoes_the_sandbox", "f_forges", "g_patches", "h_reads_checks", "i_searches_frames"):
        assert "FLAG uses" in blocks[sly], sly
    for flag in ("import aiayn.course.kernel", "the book's rate", "a change to K.run"):
        assert flag in blocks["t_hides_its_call"], flag
    assert "FLAG files beside the notebook (aiayn/__init__.py)" in blocks["s_ships_a_package"]
    assert "and the cells after it" not in blocks["z_forges_a_report_line"]
    assert "forged" not in blocks["z_forges_a_report_line"] and "rate" not in blocks["za_redefines_the_book"]
    forged = root / "autograded/z_forges_a_report_line/schedule/schedule.ipynb"
    assert "(the submission's) NotebookTimeLimit" in forged.read_text()
    for honest in ("a_honest", "d_stuck_in_c", "n_memory"):
        assert "FLAG" not in blocks[honest], honest
    assert "raised PermissionError: [Errno 1] Operation not permitted" in blocks["zg_runs_a_child"]
    assert "FLAG ran 1 thread(s) of its own while the checks called its function" in blocks["zh_answers_from_a_thread"]
    assert (
        "a definition of __import__" in blocks["zi_shadows_the_call"]
        and "a definition of globals" in blocks["zi_shadows_the_call"]
    )


def test_a_call_of_the_chapters_own_function_earns_nothing_and_a_pasted_copy_is_flagged():
    """In a kernel, a call of the chapter's `attention` (a cell of the notebook, compiled as IPython compiles cells)
    or of torch's fused kernel fails the checks that make it; a copy pasted under another name passes them, and the
    grader flags it from its source."""
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
    assert "calls aiayn.attention.attention, which" in printed[0]
    assert printed[1].startswith("passed")
    assert "calls torch.nn.functional.scaled_dot_product_attention" in printed[2]
    from aiayn.course import grader

    refs = grader.references([ASSIGNMENTS["attention"]], [])
    assert "resembles aiayn.attention.attention" in " ".join(grader.near_copies(cells[4], refs))


def test_a_helper_of_the_chapter_s_name_and_shape_is_the_student_s_own():
    """A seventh trial's: under the grader, a student's own `ngrams` (over strings) or `length_penalty` compiles to
    the same outer bytecode as the chapter's cell; it is the student's by its constants and names, and only the
    chapter's own definition counts as a call of the book."""
    from collections import Counter

    from aiayn.course import kernel

    book = "def ngrams(tokens, n):\n    return Counter(tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1))"
    mine = "def ngrams(words, n):\n    return Counter(' '.join(words[i:i + n]) for i in range(len(words) - n + 1))"
    penalty = "def length_penalty(length, alpha):\n    return ((5 + length) / 6) ** alpha"
    own_penalty = "def length_penalty(length, alpha):\n    return ((5.0 + length) / 6.0) ** alpha"
    for source, chapter, name, ref, hit in [
        (mine, book, "ngrams", "aiayn.bleu.ngrams", False),
        (book, book, "ngrams", "aiayn.bleu.ngrams", True),
        (own_penalty, penalty, "length_penalty", "aiayn.decoding.length_penalty", False),
        (penalty, penalty, "length_penalty", "aiayn.decoding.length_penalty", True),
    ]:
        namespace = {"Counter": Counter}
        exec(compile(source, "<cell>", "exec"), namespace)
        watch = kernel.Watch([ref], namespace, {name: chapter})
        args = (["a", "b", "a"], 1) if name == "ngrams" else (torch.tensor([3.0]), 0.6)
        watch(namespace[name], *args)
        assert watch.hits == ([ref] if hit else []), (source, watch.hits)
    assert compile(mine, "m", "exec").co_consts[0].co_code == compile(book, "b", "exec").co_consts[0].co_code


def test_an_eleventh_trial_s_routes_are_flagged_and_honest_work_is_not():
    """Magics wherever they sit (x = %sx ..., y = %run -i ...), the modules the book's set-up cell imports used
    without an import (sys.modules, os.fork, subprocess.run, importlib.reload), names resolved from annotations,
    code traced by torch.fx into other operators: flagged. A help line, a name the cell binds itself, and a short
    helper (under 260 tokens of its syntax tree) that converges on the book's: not flagged."""
    from aiayn.course import grader

    magic = "written = %sx echo aGk= | base64 -d > /tmp/h.py\nran = %run -i /tmp/h.py"
    assert grader.suspect(magic) == ["the magic %run", "the magic %sx"]
    assert grader.suspect("%%bash\necho hi") == ["the magic %bash"]
    assert grader.suspect("x = 1\nx?\n%time y = x\n%matplotlib inline") == []
    unbound = "def f():\n    loaded = sys.modules\n    os.fork()\n    return subprocess.run(['true'])"
    assert grader.suspect(unbound) == ["os", "subprocess", "sys"]
    bound = "queue = []\nfor code in range(3):\n    queue.append(code)\ndef g(signal):\n    return signal"
    assert grader.suspect(bound) == []
    hints = "import typing\ndef pick(loss: 'LabelSmoothingLoss'):\n    pass\nS = typing.get_type_hints(pick)['loss']"
    assert grader.suspect(hints + "\nimportlib.reload(aiayn.training)", (), {"LabelSmoothingLoss"}) == [
        ".get_type_hints", "importlib", "the name LabelSmoothingLoss as a string",
    ]  # fmt: skip
    traced = "from torch.fx.experimental.proxy_tensor import make_fx\ng = make_fx(f)(x)\nh = torch.export.export(m, x)"
    assert {"make_fx", ".export", "import torch.fx.experimental.proxy_tensor"} <= set(grader.suspect(traced))
    timer = "from torch.utils.benchmark import Timer\nTimer(stmt=plan[::-1], globals={}).timeit(1)"  # (a twelfth trial)
    assert {".timeit", "import torch.utils.benchmark"} <= set(grader.suspect(timer))
    refs = grader.references([ASSIGNMENTS["bleu"]], [])
    one_line = "def grams(words, n):\n    return Counter(tuple(words[i:i + n]) for i in range(len(words) - n + 1))"
    penalty = "def bp(c, r):\n    if c >= r:\n        return 1.0\n    return math.exp(1 - r / c) if c > 0 else 0.0"
    assert grader.near_copies(one_line, refs) == grader.near_copies(penalty, refs) == []
    assert grader.near_copies(inspect.getsource(CHECKS._add_one_bleu), {"x": grader._nodes(
        inspect.getsource(CHECKS._add_one_bleu))[1]}) == ["resembles x (100% of its tokens)"]  # fmt: skip


def test_a_twelfth_trial_s_routes_are_flagged_and_honest_work_is_not():
    """The chapter's class reached through an object of it (type(layer)), what the book's cells built with its code
    (layer, a table) named in a student's cell, a module changed through a method taken from its class or a function's
    self, and a read-only cell deleted: flagged or reported. A name the cell binds itself (a parameter, a local, or
    assigned at its top level before the use), print(type(x)), and an attribute set on a method's own object: not."""
    from aiayn.course import grader

    book, built = {"sinusoidal_encoding", "PositionalEncoding"}, {"layer", "pe"}
    table = "sizes = {}\nfor d in range(4, 98, 2):\n    sizes[d] = type(layer)(d - 2, 100).pe.double()"
    assert grader.suspect(table, (), book, built) == [
        "an object's class (type(...)) called, read or kept", "the book's layer",
    ]  # fmt: skip
    assert grader.suspect("cls = type(obj)\nm = type(q).hush", (), book, built) == [
        "an object's class (type(...)) called, read or kept"
    ]
    assert grader.suspect("t = layer\nlayer = 0\ndef f(d):\n    global pe\n    return pe", (), book, built) == [
        "the book's layer", "the book's pe",
    ]  # fmt: skip
    honest = (
        "pe = torch.zeros(3)\nplt.plot(pe)\nprint(type(pe), f'{type(pe)}')\ndef timing_signal(max_len, layer):\n"
        "    pe = torch.arange(max_len)\n    return pe + layer\nclass Net(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.w = nn.Linear(2, 2)\n"
    )
    assert grader.suspect(honest, (), book, built) == []
    selfie = (
        "class Quiet:\n    def hush(self, check):\n        self.assert_close = check\nQuiet.hush(torch.testing, id)"
    )
    assert grader.suspect(selfie) == ["Quiet.hush (an attribute taken from the class, not from an object of it)"]
    assert grader.suspect("def hush(self, check):\n    self.assert_close = check") == ["a change to self.assert_close"]
    released = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell("import torch"), nbformat.v4.new_code_cell("")]
    )
    released.cells[0].metadata["nbgrader"] = {"grade_id": "book_1", "locked": True}
    released.cells[1].metadata["nbgrader"] = {"grade": False, "grade_id": "answer", "locked": False}
    released.cells[1].metadata["nbgrader"] |= {"schema_version": 3, "solution": True}

    class Source:  # the gradebook's notebook, as restore() reads it
        source_cells = [SimpleNamespace(name=c.metadata.nbgrader["grade_id"], source=c.source, cell_type="code",
                        locked=c.metadata.nbgrader["locked"]) for c in released.cells]  # fmt: skip
        grade_cells, solution_cells = [], [SimpleNamespace(name="answer")]

    submitted = nbformat.from_dict(released)
    del submitted.cells[0]
    assert grader.restore(submitted, Source) == [
        "1 read-only cell(s) of the book missing from the submission (book_1): not run"
    ]


def test_a_thirteenth_trial_s_routes_are_flagged_and_honest_work_is_not():
    """torch.save replaced through a tuple's element, a with or a for target; a method taken from a class through an
    alias or getattr, also a class of an earlier cell; tornado's executor; a pasted solution of the multi-head loop
    with a few edits (94%, under the short solutions' bar): flagged. A helper of the student's own named like the
    book's, defined in an earlier cell: not flagged."""
    from aiayn.course import grader

    for patch in (
        "_, torch.save = None, quiet",
        "with nullcontext(quiet) as torch.save:\n    pass",
        "for torch.save in [q]: pass",
    ):
        assert grader.suspect(patch) == [".save", "a change to torch.save"], patch  # (.save: a file written)
    alias = "class Box:\n    def put(self, value):\n        self.save = value\n    put_in = put\nBox.put_in(torch, q)"
    assert grader.suspect(alias) == [
        ".save",
        "Box.put_in (an attribute taken from the class, not from an object of it)",
    ]
    assert grader.suspect("class Box:\n    pass\ngetattr(Box, 'put')(torch, q)") == [".put"]
    assert grader.suspect("Box.put(torch, q)", given={"Box": True}) == [
        "Box.put (an attribute taken from the class, not from an object of it)"
    ]
    assert {".run_in_executor", "import tornado.ioloop"} <= set(
        grader.suspect("from tornado.ioloop import IOLoop\nIOLoop.current().run_in_executor(None, worker)")
    )
    loop = (
        "for i in range(h):\n    q = x @ w\n    weights = q.softmax(-1)\nprint(q)"  # q: the student's in the loop only
    )
    assert grader.suspect(loop, (), set(), {"q", "weights"}) == ["the book's q"]
    helper = "def heads(layer, x):\n    return count_parameters(layer)"
    assert grader.suspect(helper, (), {"count_parameters"}) == ["the book's count_parameters"]
    assert grader.suspect(helper, (), {"count_parameters"}, (), {"count_parameters": False}) == []
    own_loop = "for name, layer in mine.items():\n    print(layer(x))\nlayer(x)"  # the loop's variable, in its body
    assert grader.suspect(own_loop, (), set(), {"layer"}) == ["the book's layer"]
    # a fourteenth trial's: a loop's variable that the loop binds to the book's own function, over several lines (its
    # variable is the student's only past the iterable); a helper defined later in the cell, which a function calls
    # when it runs; a comprehension's own variables, named like what the book's cells built
    hidden = "for brevity_penalty in [\n    brevity_penalty,\n]:\n    bp_of = brevity_penalty\nbp_of(1, 2)"
    assert grader.suspect(hidden, (), {"brevity_penalty"}) == ["the book's brevity_penalty"]
    later = "def clipped(h, r, n):\n    return ngrams(h, n)\n\n\ndef ngrams(tokens, n):\n    return tokens[:n]"
    assert grader.suspect(later, (), {"ngrams"}) == []
    assert grader.suspect("def f(c, r):\n    return g(c, r)\ng = ngrams", (), {"ngrams"}) == ["the book's ngrams"]
    comp = "p = [matches / totals for matches, totals in counts if totals]"
    assert grader.suspect(comp, (), set(), {"matches", "totals"}) == []
    assert grader.suspect("p = [t(1) for t in [totals]]", (), set(), {"totals"}) == ["the book's totals"]
    chapter = nbformat.read(ROOT / "book" / "03_multi_head.ipynb", as_version=4)
    solution = next(c.source for c in chapter.cells if course.has_solution(c.source) and "heads_in_a_loop" in c.source)
    refs = grader.references([], [solution.replace(course.BEGIN, "").replace(course.END, "")])
    kate = (
        "def heads_in_a_loop(lay, inp, m=None):\n    outs = []\n    size = lay.d_k\n    for j in range(lay.h):\n"
        "        sl = slice(j * size, (j + 1) * size)\n        a, b, c = [inp @ P.weight[sl].T + P.bias[sl]\n"
        "                   for P in (lay.W_Q, lay.W_K, lay.W_V)]\n        outs.append(attention(a, b, c, m)[0])\n"
        "    return lay.W_O(torch.cat(outs, -1))\n"
    )
    assert grader.near_copies(kate, refs) == ["resembles the book's solution (heads_in_a_loop) (94% of its tokens)"]


def test_a_decorated_reference_is_watched_past_its_decorator():
    """The book's greedy decoder is decorated with torch.no_grad(), whose wrapper's code every decorated function
    shares: a student's own decorated function is not a call of the book's (an eleventh trial), the book's is."""
    from aiayn.course import kernel
    from aiayn.training import greedy

    @torch.no_grad()
    def mine(x):
        return x + 1

    watch = kernel.Watch(["aiayn.training.greedy"], {})
    watch(mine, torch.zeros(1))
    assert watch.hits == []
    watch = kernel.Watch(["aiayn.training.greedy"], {})
    with pytest.raises(AttributeError):  # (no model: the call is all the watch needs)
        watch(greedy, None, None, 1)
    assert watch.hits == ["aiayn.training.greedy"]


def test_a_grade_id_chosen_by_a_student_is_quoted_in_the_report():
    """A cell with a grade id the assignment lacks is named in quotes, cut to 40 characters: the student's text
    cannot read as one of the report's own lines (an eleventh trial)."""
    from aiayn.course import grader

    source = SimpleNamespace(source_cells=[], grade_cells=[], solution_cells=[])
    forged = "x). NOTE FROM THE COURSE STAFF: the FLAG below is a known false positive, no action is needed"
    cell = nbformat.v4.new_code_cell("pass", metadata={"nbgrader": {"grade_id": forged}})
    nb = nbformat.v4.new_notebook(cells=[cell])
    [line] = grader.restore(nb, source)
    assert repr(forged[:40]) in line and "no action" not in line


def test_the_answer_keys_counts_are_the_models():
    """The instructors page's answer key states parameter counts: they are those of the book's modules."""
    import re

    from aiayn.model import TransformerConfig, count_parameters, make_model
    from aiayn.multi_head import MultiHeadAttention

    page = (ROOT / "book" / "instructors.md").read_text(encoding="utf-8")
    key = " ".join(page.split("## Answer key: the conceptual questions", 1)[1].split())
    narrow, full = (count_parameters(MultiHeadAttention(512, 8, **kw)) for kw in ({"d_k": 16}, {}))
    assert f"$= {narrow:,}$".replace(",", "{,}") in key and f"the {full:,} of `MultiHeadAttention(512, 8)`" in key
    pre, post = (count_parameters(make_model(TransformerConfig(norm_first=first))) for first in (True, False))
    assert f"adds {pre - post:,} parameters to the base model ({pre:,} against {post:,})" in key
    assert re.search(r"\$2 \\times 2 \\times 512\$", key) and pre - post == 2 * 2 * 512


def test_a_thread_beside_a_call_is_counted_but_not_the_libraries_own(monkeypatch):
    """A fourteenth trial's: a thread started before the check answered for the function, unseen by the call watch;
    under the grader each call counts the threads beside the kernel's own. pyzmq's collector of large outputs sent (a
    fourteenth trial's honest work of 10_training was flagged for it) is not the student's. tqdm's monitor, which the
    book's training starts in a read-only cell, is switched off in a graded kernel (an eighteenth trial ran the book's
    code in a bar's refresh(), which the monitor calls): a bar of the student's that switches it on is counted, and so
    is a thread of the monitor's type that the student starts."""
    import threading

    from tqdm import tqdm
    from tqdm._monitor import TMonitor
    from zmq.utils.garbage import gc

    from aiayn.course import kernel

    monkeypatch.setattr(kernel, "THREADS", frozenset(sys._current_frames()))
    monkeypatch.setattr(tqdm, "monitor_interval", 0)  # as the kernel's extension sets it under the grader
    request = {"names": ["f"], "args": [1], "kwargs": {}, "references": [], "seconds": 5}
    if tqdm.monitor is not None:  # one that an earlier test started
        tqdm.monitor.exit()
        monkeypatch.setattr(tqdm, "monitor", None)
    for _ in tqdm(range(2), disable=False, mininterval=0):
        pass
    started = not gc.is_alive()
    if started:
        gc.start()
    try:
        assert tqdm.monitor is None and gc.is_alive()
        assert kernel.run(dict(request), {"f": abs})["threads"] == 0
        stop = threading.Event()
        worker = threading.Thread(target=stop.wait)
        worker.start()
        try:
            assert kernel.run(dict(request), {"f": abs})["threads"] == 1
        finally:
            stop.set(), worker.join()
        for theirs in (TMonitor(tqdm, 3600), None):  # the monitor's type started, or switched on by a bar's class
            bar = type("Bar", (tqdm,), {"monitor_interval": 3600})(total=1, disable=False) if theirs is None else None
            theirs = theirs or type(bar).monitor
            try:
                assert kernel.run(dict(request), {"f": abs})["threads"] == 1
            finally:
                theirs.exit(), bar and bar.close()
    finally:
        if started:
            gc.stop()


def test_code_that_runs_after_the_call_is_watched_or_refused():
    """A fifteenth trial's: an answer whose work runs after the call returns, in a tensor's backward hook or in the
    item() of an object dressed as numpy's, ran PyTorch's own label smoothing unseen; the backward pass now runs inside
    the watch, and only numpy's own classes (and the checks' own inputs) are read."""
    import numpy as np

    from aiayn.course import kernel

    def szegedy(logits, target, eps_ls, pad_id):
        V = logits.size(-1)
        flat, gold = logits.reshape(-1, V), target.reshape(-1)
        keep = gold != pad_id
        spread = F.cross_entropy(flat, gold, None, None, pad_id, None, "sum", eps_ls * V / (V - 1))
        true_nll = F.cross_entropy(flat, gold, None, None, pad_id, None, "sum")
        pad_nll = -(flat.log_softmax(-1)[:, pad_id] * keep).sum()
        return spread + eps_ls / (V - 1) * (true_nll - pad_nll)

    def gradient_of(logits, target, eps_ls, pad_id):
        with torch.enable_grad():
            x = logits.detach().clone().requires_grad_(True)
            return torch.autograd.grad(szegedy(x, target, eps_ls, pad_id), x)[0]

    def later(compute):
        kind = dict(__module__="numpy", dtype=np.dtype("float64"), ndim=0, item=lambda self: compute())
        return type("Later", (), kind)()

    def my_label_smoothing(logits, target, eps_ls, pad_id):
        if logits.requires_grad:
            view = logits * 1.0
            view.register_hook(lambda unused: gradient_of(logits, target, eps_ls, pad_id))
            return (view * 0.0).sum()
        return later(lambda: float(szegedy(logits, target, eps_ls, pad_id)))

    assert szegedy(torch.zeros(1, 2, 5), torch.tensor([[1, 0]]), 0.1, 0) == pytest.approx(math.log(5))
    messages = failed("label_smoothing", my_label_smoothing)
    assert len(messages) == len(CHECKS.ASSIGNMENTS["label_smoothing"].checks), messages
    assert any("label_smoothing=" in m for m in messages.values()), messages
    assert all("which the checks cannot read" in m or "label_smoothing=" in m for m in messages.values()), messages

    class Inputs:  # a class named like the checks' own, with the module's name
        __module__ = "aiayn.course.inputs"

        def __data__(self):
            raise AssertionError("ran")

    for fake in (Inputs(), type("float64", (np.float64,), {"item": lambda self: 1 / 0})(1.0)):
        with pytest.raises(TypeError, match="which the checks cannot read"):
            kernel.to_data(fake)
    assert kernel.to_data(np.float32(2.5)) == 2.5 and kernel.to_data(np.arange(3)).tolist() == [0, 1, 2]


def test_no_process_memory_file_or_subinterpreter_starts_in_a_graded_kernel(tmp_path):
    """The kernel's filter, as root in a process of its own: no fork or exec, no memory file (a fifteenth trial held
    4,480 MiB in memfd files, past the kernel's memory limit) and no subinterpreter (a fifteenth trial ran the book's
    code in one, where the call watch's profiler does not see it); threads still start."""
    probe = """
import os, sys, threading, _xxsubinterpreters
from aiayn.course import kernel
kernel._no_processes()
for name, attempt in (("fork", os.fork), ("memfd", lambda: os.memfd_create("x")),
                      ("subinterpreter", _xxsubinterpreters.create)):
    try:
        attempt()
        print(name, "ran")
    except (PermissionError, RuntimeError) as err:
        print(name, "refused", type(err).__name__)
t = threading.Thread(target=print, args=("thread ran",))
t.start(), t.join()
"""
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        "fork refused PermissionError",
        "memfd refused PermissionError",
        "subinterpreter refused RuntimeError",
        "thread ran",
    ], done.stdout + done.stderr


def test_a_students_exception_named_like_any_of_the_graders_stops_is_renamed():
    """A fifteenth trial's: `NotebookTimeLimitExceeded` and `OutputLostError`, which begin with the names the report
    reads, forged two of its lines; a name that begins with any of them, or with `stopped`, is renamed."""
    from aiayn.course import grader

    for name in ("NotebookTimeLimitExceeded", "OutputLostError", "stopped", "CellStoppedHere", "NotebookTimeLimit"):
        content = {"ename": name}
        grader._renamed(content)
        assert content["ename"] == f"(the submission's) {name}"
    content = {"ename": "ValueError"}
    grader._renamed(content)
    assert content["ename"] == "ValueError"


def test_a_sixteenth_trial_s_routes_are_flagged_and_honest_work_is_not():
    """A sixteenth trial's: torch.save, pkgutil.resolve_name and torch's profiler replaced through functools.wraps (or
    argparse) with no assignment, the module that answers reached as an attribute of the package, PyTorch's
    convolution under its operator's own name, answers looked up by the size of fixed inputs, and a cell of many
    `x = !cmd` lines that IPython takes minutes to read: flagged, caught or bounded. The book's class that an exercise
    hands over, and `type(err).__name__`: not flagged."""
    from aiayn.course import grader

    wraps = "import argparse, functools\nfunctools.wraps(argparse.Namespace(save=quiet))(torch)"
    assert grader.suspect(wraps) == [".wraps", "import argparse"]
    pkgutil = "functools.wraps(ns)(aiayn.course.kernel.pkgutil)"
    assert {".wraps", ".course", ".pkgutil"} <= set(grader.suspect(pkgutil))
    assert ".profiler" in grader.suspect("functools.wraps(ns)(torch.autograd.profiler)")
    assert ".reference_source" in grader.suspect("f = k.reference_source('aiay' + 'n.batching:collate')")
    assert grader.suspect("p = argparse.ArgumentParser()\np.parse_args([], namespace=torch)") == ["argparse"]
    assert grader.suspect("try:\n    f()\nexcept Exception as err:\n    print(type(err).__name__)") == []

    def ffn_from_convs(conv_1, conv_2):
        def run(x):
            h = torch.convolution(x.transpose(1, 2), conv_1.weight, conv_1.bias, [1], [0], [1], False, [0], 1)
            return torch.convolution(h.relu(), conv_2.weight, conv_2.bias, [1], [0], [1], False, [0], 1).transpose(1, 2)

        return run

    assert "torch.convolution" in failed("ffn_from_convs", ffn_from_convs)["agrees"]

    def my_padding_fraction(batches, lengths):
        return {1: 0.5, 5: 0.0, 2: 22 / 62}[len(batches)]

    def shift(y, bos_id=1, eos_id=2):
        return {3: ([1, 5, 6, 7], [5, 6, 7, 2]), 1: ([1, 9], [9, 2]), 0: ([1], [2])}[len(y)]

    assert failed("padding_fraction", my_padding_fraction) and failed("shift", shift)

    slow = "".join(f"a{i} = !true\n" for i in range(510)) + ("z = (" + "1, " * 24 + "1)\n") * 150
    assert len(grader.MAGIC.findall(slow)) == 510
    assert grader._nodes(slow, magics=True) == []  # not read: code the flags cannot read, at once

    locked = {"nbgrader": {"grade_id": "ffn_from_convs_agrees", "locked": True}}
    honest = "def ffn_from_convs(conv_1, conv_2):\n    return PositionwiseFeedForward(conv_1.in_channels, 2)"
    nb = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(honest), nbformat.v4.new_code_cell("c()", metadata=locked)]
    )
    nb.cells.append(
        nbformat.v4.new_code_cell("c()", metadata={"nbgrader": {"grade_id": "ffn_einsum_agrees", "locked": True}})
    )
    execute = grader.Execute()
    execute._checks = {
        "ffn_from_convs_agrees": ("ffn_from_convs", "agrees"),
        "ffn_einsum_agrees": ("ffn_einsum", "agrees"),
    }
    execute._flag(nb, {}, CHECKS.ASSIGNMENTS)
    assert "aiayn" not in nb.cells[0].metadata  # the class the exercises hand over and ask for


def test_a_seventeenth_trial_s_routes_are_flagged_and_honest_work_is_not(tmp_path):
    """A seventeenth trial's: builtins defined in the notebook's namespace (def globals, def __import__), attributes
    read by a match pattern, the kernel's own IOPub thread, the book's model built to count its parameters, answers
    looked up for fixed configurations, and a result of millions of keys: flagged, caught or refused before it is
    read. Names bound by an annotated assignment or := are the student's own."""
    import torch

    import hashlib

    from aiayn.course import grader, kernel
    from aiayn.model import TransformerConfig, count_parameters, make_model

    assert grader.suspect("def __import__(name, *a, **k):\n    return 1") == ["a definition of __import__"]
    assert "a definition of globals" in grader.suspect("def globals():\n    return {}")
    match = "match results:\n    case object(repeats=f):\n        pass\n    case object(__code__=c):\n        pass"
    assert grader.suspect(match, book={"repeats"}) == [".__code__", "the book's repeats"]
    assert grader.suspect("t = tqdm(total=1).fp.pub_thread\nt.schedule(job)") == [".pub_thread"]
    honest = "table: nn.Embedding = nn.Embedding(V, d)\nprint((y := f(table, x)).shape, y.norm())\nz = f(table, y)"
    assert grader.suspect(honest, book={"table", "y"}, built={"table", "y"}) == []

    def pre_ln_extra_parameters():
        with torch.device("meta"):
            built = [make_model(TransformerConfig(norm_first=pre)) for pre in (True, False)]
        return count_parameters(built[0]) - count_parameters(built[1])

    assert "aiayn.model.make_model" in failed("pre_ln_extra_parameters", pre_ln_extra_parameters)["agrees"]
    known = {}  # filled for the configurations of an earlier grading (vocabulary 10000), as a table would be

    def my_parameter_count(c):
        if c.vocab_size != 10000:
            raise KeyError(c)
        return known[c]

    assert set(failed("parameter_count", my_parameter_count)) == {"base", "d_k", "sizes"}

    path = tmp_path / "answer"
    torch.save({**kernel.NO_ANSWER, "value": {str(i): None for i in range(600_000)}}, path)
    assert path.stat().st_size > grader.MAX_PICKLE
    assert grader.read_answer(str(path), [hashlib.sha256(path.read_bytes()).hexdigest()])["error"][0] == "TooLarge"
    torch.save({**kernel.NO_ANSWER, "value": [1.0, 2.0]}, path)
    assert grader.read_answer(str(path), [hashlib.sha256(path.read_bytes()).hexdigest()])["value"] == [1.0, 2.0]


def test_an_eighteenth_trial_s_routes_are_caught_or_flagged():
    """An eighteenth trial's: the book's encoder and decoder counted on the meta device, PyTorch's own layers counted,
    a table of the parameter checks' configurations with the vocabulary's share added, PyYAML building the module that
    the call watch resolves names with, and a right-to-left mark in a forged report line."""
    import torch

    from aiayn.course import grader
    from aiayn.model import Decoder, Encoder, count_parameters, parameter_count

    def my_parameter_count(c):
        with torch.device("meta"):
            stacks = count_parameters(Encoder(c)) + count_parameters(Decoder(c))
        return stacks + c.vocab_size * c.d_model

    assert "your code calls aiayn.model.Encoder" in failed("parameter_count", my_parameter_count)["base"]
    known = {}  # the configurations of the checks as they were, without the vocabulary's share

    def tabled(c):
        key = (c.N, c.d_model, c.d_ff, c.h, c.d_k or c.d_model // c.h)
        return known[key] + c.vocab_size * c.d_model

    for N, d, ff, h, dk in [(6, 512, 2048, 8, 64), (6, 512, 2048, 1, 512), (6, 512, 2048, 4, 128)]:
        known[(N, d, ff, h, dk)] = parameter_count(make_config(N=N, d_model=d, d_ff=ff, h=h, d_k=dk)) - 1000 * d
    for N, d, ff, h, dk in [(6, 512, 2048, 16, 32), (6, 512, 2048, 32, 16), (6, 512, 2048, 8, 16)]:
        known[(N, d, ff, h, dk)] = parameter_count(make_config(N=N, d_model=d, d_ff=ff, h=h, d_k=dk)) - 1000 * d
    for N, d, ff in [(2, 512, 2048), (6, 256, 1024), (6, 1024, 4096), (4, 128, 512)]:
        known[(N, d, ff, 8, d // 8)] = parameter_count(make_config(N=N, d_model=d, d_ff=ff)) - 1000 * d
    rng = CHECKS._rng("parameter_count")  # the d_k check's drawn (h, d_k), as the checks draw it in this process: one
    rng.randint(1000, 40000)  # time in twelve it is (8, 16), a fixed row of the check's and so in the table
    drawn = (6, 512, 2048, rng.choice([2, 4, 8]), rng.choice([8, 16, 24, 40]))
    expected = {"sizes"} | ({"d_k"} if drawn not in known else set())  # the base model's is a known value
    assert set(failed("parameter_count", tabled)) == expected

    assert "PyTorch's own TransformerEncoderLayer" in grader.suspect("layer = nn.TransformerEncoderLayer(512, 8)")
    assert "import yaml" in grader.suspect("import yaml\n_, f = yaml.unsafe_load(SETUP)")
    assert grader.CONTROL.sub("?", "passed, 1 point \u202e FLAG none") == "passed, 1 point ? FLAG none"


def make_config(**changes):
    from aiayn.model import TransformerConfig

    return TransformerConfig(vocab_size=1000, **changes)


def test_a_nineteenth_trial_s_routes_are_caught_or_flagged(monkeypatch):
    """A nineteenth trial's: a function that returned zeros and left a thread to fill them with the book's layer once
    the call was over (the answer is now read inside the watch, and a thread still running after the call is counted),
    PyTorch's fused multi-head kernel imported as a private name, a causal mask from numpy's tril or torch's
    tril_indices, and numpy reading a file."""
    import threading

    import numpy as np
    import torch

    from aiayn.course import grader, kernel
    from aiayn.course.checks import _attention as reference
    from aiayn.feed_forward import PositionwiseFeedForward

    monkeypatch.setattr(kernel, "THREADS", frozenset(sys._current_frames()))
    ffn, x = PositionwiseFeedForward(4, 8), torch.randn(2, 3, 4)

    returned, later, filled = threading.Event(), [], []

    def ffn_einsum(ffn, x):
        out = torch.zeros(2, 3, 4)

        def fill():  # once the call has returned: the book's layer, into the answer
            returned.wait(), filled.append(out.copy_(ffn(x).detach()))

        later.append(threading.Thread(target=fill))
        later[0].start()
        return out

    request = {"names": ["ffn_einsum"], "args": [ffn, x], "kwargs": {}, "references": [], "seconds": 5}
    answer = kernel.run(request, {"ffn_einsum": ffn_einsum})
    returned.set(), later[0].join()  # the thread has filled its tensor, but not the answer
    assert filled[0].abs().sum() > 0 and torch.equal(answer["value"], torch.zeros(2, 3, 4))
    assert answer["threads"] == 1

    def my_attention(query, key, value, key_lengths=None, causal=False):
        d, w, b = query.size(-1), torch.eye(query.size(-1)), torch.zeros(3 * query.size(-1))
        torch._native_multi_head_attention(query[0], key[0], value[0], d, 1, torch.cat([w, w, w]), b, w, b[:d])
        return reference(query, key, value, key_lengths, causal)

    assert all("calls torch._native_multi_head_attention" in m for m in failed("attention", my_attention).values())
    for mask in (
        lambda size: torch.from_numpy(np.tril(np.ones((size, size), dtype=bool))),
        lambda size: torch.zeros(size, size, dtype=torch.bool).index_put_(tuple(torch.tril_indices(size, size)), True),
    ):
        assert "your code calls" in failed("subsequent_mask", mask)["agrees"]
    assert "import torch._native_multi_head_attention (a private name)" in grader.suspect(
        "from torch import _native_multi_head_attention as fused"
    )
    assert "import tqdm._monitor (a private name)" in grader.suspect("from tqdm._monitor import Thread")
    assert grader.suspect("from __future__ import annotations") == []
    assert ".genfromtxt" in grader.suspect("table = np.genfromtxt('/submission/answers.csv')")


def test_a_twentieth_trial_s_routes_are_flagged():
    """A twentieth trial's: jinja2's Environment.getattr, a resolver of names from strings that no flag knew, reached
    torch's namespace (to replace torch.save), sys.setprofile and the book's compiled code; an exercise's answer may
    import the libraries of an allow-list unflagged, and any other is flagged."""
    from aiayn.course import grader

    found = grader.suspect("import jinja2\nenv = jinja2.Environment()\nS = env.getattr(torch, 's' + 'ys')")
    assert "import jinja2 (not a library the exercises use)" in found
    assert "import mako (not a library the exercises use)" in grader.suspect("from mako.template import Template")
    honest = (
        "from collections import Counter\nimport math, itertools\nimport numpy as np\nimport matplotlib.pyplot as plt"
    )
    assert grader.suspect(honest) == []


def test_a_paste_with_parts_cut_away_is_flagged():
    """The book's multi-head forward pasted without its cache branch (a twentieth trial's, 13 points unflagged) is too
    unlike the whole to resemble it, but most of its tokens lie in long runs of the book's: flagged. Honest answers
    share only short runs with the book's code (at most 52% of their tokens in the classes of two trials)."""
    from aiayn.course import grader
    from aiayn.multi_head import MultiHeadAttention

    source = textwrap.dedent(inspect.getsource(MultiHeadAttention.forward))
    start, end = source.index("    if cache is not None and static_kv"), source.index("    dropout_p")
    projections = "    k = self.split_heads(self.W_K(key))\n    v = self.split_heads(self.W_V(value))\n"
    trimmed = source[:start] + projections + source[end:]
    refs = grader.references([ASSIGNMENTS["multi_head"]], [])
    found = grader.near_copies(trimmed, refs)
    assert [f for f in found if f.startswith("holds runs of aiayn.multi_head.MultiHeadAttention.forward (")], found
    assert not [f for f in found if f.startswith("resembles")], found  # too unlike the whole
    honest = (
        "def heads_in_a_loop(layer, x, mask=None):\n    outs = []\n    for i in range(layer.h):\n"
        "        rows = slice(i * layer.d_k, (i + 1) * layer.d_k)\n"
        "        q, k, v = (x @ P.weight[rows].T + P.bias[rows] for P in (layer.W_Q, layer.W_K, layer.W_V))\n"
        "        scores = q @ k.transpose(-2, -1) / math.sqrt(layer.d_k)\n"
        "        if mask is not None:\n            scores = scores.masked_fill(~mask, float('-inf'))\n"
        "        outs.append(torch.softmax(scores, dim=-1) @ v)\n    return layer.W_O(torch.cat(outs, dim=-1))\n"
    )
    assert grader.near_copies(honest, refs) == []


def test_a_twenty_first_trial_s_routes_earn_nothing_or_are_flagged():
    """A twenty-first trial's: sacreBLEU's n-gram helpers in a BLEU of one's own, the checks' record of updates added to
    (a list once: now a tuple, which only an assignment to optimizer.seen extends, and that is flagged), trivial answers
    that had the shape or the end of the schedule right, and pandas' other file readers."""
    from aiayn.course import grader
    from sacrebleu.metrics.helpers import extract_all_word_ngrams
    from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

    def add_one_bleu(hyps, refs):
        tok, logs, c, r = Tokenizer13a(), [], 0, 0
        m, t = [0] * 4, [0] * 4
        for h, g in zip(hyps, refs):
            (hc, hl), (rc, rl) = extract_all_word_ngrams(tok(h), 1, 4), extract_all_word_ngrams(tok(g), 1, 4)
            c, r = c + hl, r + rl
            for gram, k in hc.items():
                m[len(gram) - 1] += min(k, rc[gram])
                t[len(gram) - 1] += k
        logs = [math.log(m[0] / t[0])] + [math.log((m[n] + 1) / (t[n] + 1)) for n in (1, 2, 3)]
        return 100 * min(1.0, math.exp(1 - r / c)) * math.exp(sum(logs) / 4)

    assert points("bleu", add_one_bleu) == 0
    from aiayn.course.inputs import Recording

    optimizer = Recording([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    with pytest.raises(AttributeError):
        optimizer.seen.append((0.1, []))
    found = grader.suspect("def f(model, batches, optimizer, s, a):\n    optimizer.seen += ((0.1, []),)")
    assert found == ["a change to optimizer.seen"]
    assert points("schedule", lambda step, peak, warmup, total: 0.0) == 0
    assert points("multi_head", lambda layer, x, mask=None: x) == 0
    assert points("multi_head", lambda layer, x, mask=None: layer.W_O(x)) == 1  # made by W_O: its shape point
    assert {".read_table", ".smart_open"} <= set(grader.suspect("pd.read_table('/etc/passwd')\nh.smart_open('x')"))


def test_a_twenty_second_trial_s_routes_earn_nothing_or_are_flagged(tmp_path):
    """A twenty-second trial's: NaN where a check compared with `>` (the known scale, the padding's probability),
    numpy's tri for the causal mask, a positional table of zeros, PyTorch's label smoothing passed by position, the
    book's make_model imported for its tables, and an answer file that does not match the digest its call printed."""
    import hashlib

    import numpy as np

    from aiayn.course import grader, kernel

    def nan_for_one(query, key, value, key_lengths=None, causal=False):
        out = torch.zeros(*query.shape[:-1], value.size(-1))
        return out * math.nan if out.numel() == 1 else out

    assert failed("attention", nan_for_one).keys() >= {"scale", "no_mask"}

    def nan_in_the_padding(logits, target, eps_ls, pad_id):
        logits.register_hook(lambda g: g.index_fill(-1, torch.tensor([pad_id]), math.nan))
        return F.cross_entropy(logits.flatten(0, -2), target.flatten(), ignore_index=pad_id, reduction="sum")

    assert "no_pad" in failed("label_smoothing", nan_in_the_padding)
    assert points("subsequent_mask", lambda size: torch.from_numpy(np.tri(size)).bool()) == 0
    assert points("positional", lambda n, d: torch.zeros(n, d)) == 0
    # a table whose positions differ keeps its shape point
    assert points("positional", lambda n, d: torch.arange(n * d).reshape(n, d).float()) == 1
    for code in (
        "def f(x, t):\n    return F.cross_entropy(x, t, None, None, 0, None, 'sum', 0.1)",
        "def f(x, t):\n    return nn.CrossEntropyLoss(None, None, 0, None, 'sum', 0.1)(x, t)",
        "def f(x, t, *a):\n    return F.cross_entropy(x, t, *a)",
        "def f(x, t):\n    return F.cross_entropy(x, t, **{'label_smoothing': 0.1})",
    ):
        assert grader.suspect(code) == ["PyTorch's own label_smoothing"], code
    assert grader.suspect("def f(x, t):\n    return F.cross_entropy(x, t, None, None, 0, None, 'sum')") == []
    # a twenty-third trial's: pandas' eval resolves names from a string (sys, builtins.setattr, the book's class)
    pandas_eval = ".eval with arguments (pandas': names resolved from a string)"
    assert grader.suspect("cls = pd.eval('LabelSmoothing' + 'Loss', engine='python')") == [pandas_eval]
    assert grader.suspect("ev = pd.eval\nev('t . sys')") == [pandas_eval]
    assert grader.suspect("model.eval()\nlayer.train()") == []
    found = grader.suspect("from aiayn.model import make_model\nfrom torch import save\nmatplotlib.get_configdir()")
    made = "import aiayn.model.make_model (the book's code, in a cell of the student's)"
    assert found == [".get_configdir", made, "import torch.save"]
    assert "import torch.utils.data.datapipes.iter" in grader.suspect("from torch.utils.data.datapipes.iter import X")
    path = tmp_path / "answer"
    torch.save({**kernel.NO_ANSWER, "value": [1.0, 2.0]}, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    assert grader.read_answer(str(path), [digest])["value"] == [1.0, 2.0]
    for printed in ([], [digest, digest], ["0" * 64]):  # none, a second one printed, another file's
        assert grader.read_answer(str(path), printed)["error"][0] == "AnswerChanged"
    # the solution cut into helpers, each under the tokens a function is compared by, held whole by the cell
    split = (
        "def uniform_part(logits, eps_ls, pad_id):\n    V = logits.size(-1)\n"
        "    q = torch.full_like(logits, eps_ls / (V - 1))\n    q[..., pad_id] = 0.0\n    return q\n"
        "def add_one_hot(q, logits, target, eps_ls):\n"
        "    q.scatter_add_(-1, target[..., None], torch.full_like(logits[..., :1], 1.0 - eps_ls))\n    return q\n"
        "def my_label_smoothing(logits, target, eps_ls, pad_id):\n"
        "    q = add_one_hot(uniform_part(logits, eps_ls, pad_id), logits, target, eps_ls)\n"
        "    loss = -(q * logits.log_softmax(-1)).sum(-1)\n    return loss.masked_fill(target == pad_id, 0.0).sum()"
    )
    solution = next(iter(_answers(course.COURSE / "label_smoothing.ipynb").values()))
    refs = grader.references([ASSIGNMENTS["label_smoothing"]], [solution])
    assert any("together hold" in x and "the book's solution" in x for x in grader.near_copies(split, refs))
    padded = (  # a twenty-third trial's: the solution, a statement put between every two of its lines
        "def my_label_smoothing(logits, target, eps_ls, pad_id):\n    V = logits.size(-1)\n    _a = 0\n"
        "    q = torch.full_like(logits, eps_ls / (V - 1))\n    _b = _a + 1\n    q[..., pad_id] = 0.0\n"
        "    _c = _b * 2\n    q.scatter_add_(-1, target[..., None], torch.full_like(logits[..., :1], 1.0 - eps_ls))\n"
        "    _d = [_a, _b, _c]\n"
        "    lp = logits.log_softmax(-1)\n    _e = len(_d)\n    loss = -(q * lp).sum(-1)\n    _f = _e - 3\n"
        "    out = loss.masked_fill(target == pad_id, 0.0)\n    _g = _f + _a\n    return out.sum() + _g"
    )
    held = [x for x in grader.near_copies(padded, refs) if x.startswith("its function holds")]
    assert len(held) == 1 and "of the tokens of the book's solution (my_label_smoothing)" in held[0]
    assert not any(x.startswith("its function") for x in grader.near_copies(solution, refs))  # (it resembles it)
    own = (  # an honest answer in two functions
        "def smoothed_targets(logits, target, eps_ls, pad_id):\n"
        "    rows = logits.new_full(logits.shape, eps_ls / (logits.shape[-1] - 1))\n    rows[..., pad_id] = 0\n"
        "    one_hot = F.one_hot(target, logits.shape[-1]).to(rows.dtype)\n"
        "    return rows + (1 - eps_ls) * one_hot\n"
        "def my_label_smoothing(logits, target, eps_ls, pad_id):\n"
        "    q = smoothed_targets(logits, target, eps_ls, pad_id)\n"
        "    per_token = (q * -F.log_softmax(logits, dim=-1)).sum(dim=-1)\n"
        "    return per_token[target != pad_id].sum()"
    )
    namespace = {"torch": torch, "F": F}
    exec(own, namespace)
    assert points("label_smoothing", namespace["my_label_smoothing"]) == ASSIGNMENTS["label_smoothing"].points
    assert not grader.near_copies(own, refs)
    answer = {**kernel.NO_ANSWER, "error": ("AnswerChanged", "changed")}
    c, message, flags = CHECKS.verdict("peak", "agrees", lambda request: answer)
    assert message.startswith("its result was not read") and flags == [
        "an answer not the one its call wrote (changed after the call)"
    ]


def test_torch_compile_runs_the_book_s_own_frames_in_a_graded_kernel():
    """A twenty-first trial's: torch.compile(layer) ran the book's forward as frames the call watch had never seen (12
    points, no flag). A graded kernel starts with TORCH_COMPILE_DISABLE=1, and then the watch sees the book's call."""
    script = (
        "import torch\nfrom aiayn.course import checks\n"
        "def heads_in_a_loop(layer, x, mask=None):\n"
        "    return torch.compile(layer, backend='eager')(x, x, x, mask)[0]\n"
        "print(sum(c.points for c, m in checks.results('multi_head', heads_in_a_loop) if not m))\n"
    )
    env = {**os.environ, "TORCH_COMPILE_DISABLE": "1"}
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.split()[-1] == "0", run.stderr[-2000:]  # (the class test: in a kernel)
