"""Course assignments from the book's exercises: student notebooks, autograder checks, and marks.

The chapters mark each coding exercise with nbgrader's markers: the reference solution sits between the lines
``### BEGIN SOLUTION`` and ``### END SOLUTION``, and the next code cell holds ``assert``s. Everything a grading
tool needs (which cells are solutions, which are tests, how many points) is derived from those markers when the
command runs, so the chapters stay ordinary notebooks.

    python -m aiayn.course list                                 # exercises and autograded assignments
    python -m aiayn.course generate [--out _build/student]      # student notebooks, solutions stripped
    python -m aiayn.course generate --nbgrader COURSE_DIR       # also an nbgrader course directory (source/)
    python -m aiayn.course grade SUBMISSIONS [--out marks]      # execute each notebook, write marks.csv/.json

In a notebook (a student in Colab, or anyone):

    from aiayn.course import grade, feedback
    grade("attention", my_attention)       # -> Grade(points, max_points, report)
    feedback(globals())                     # every assignment whose function the notebook defines
"""
from __future__ import annotations

import argparse
import ast
import copy
import csv
import importlib
import inspect
import json
import math
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
COURSE = ROOT / "course"  # extra assignment notebooks, same markers as the chapters
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
STUB = ("# YOUR CODE HERE", "raise NotImplementedError()")  # nbgrader's stub, so both tools agree
RESULT_TAG = "AIAYN-COURSE-RESULT:"
REPO = "aiayn-book/aiayn"


# ----------------------------------------------------------------------------------------------------------
# Exercises in a notebook, found from the markers
# ----------------------------------------------------------------------------------------------------------

def _src(cell) -> str:
    s = cell.get("source", "")
    return "".join(s) if isinstance(s, list) else s


def _defined_names(source: str) -> list[str]:
    """Top-level functions, classes and assigned names of a cell, in order."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return re.findall(r"^(?:def|class)\s+([A-Za-z_]\w*)", source, re.M)
    names = []
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def _count_asserts(source: str) -> int:
    """Points of a test cell: one per assert statement or assert_* call (at least 1)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return max(1, source.count("assert"))
    n = 0
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            n += 1
        elif isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            n += name.startswith("assert")
    return max(1, n)


@dataclass
class Exercise:
    """One coding exercise: a solution cell and the test cell after it."""

    notebook: str           # file stem, e.g. "02_attention"
    number: int | None      # the exercise's number in the chapter's list, when it has one
    solution_cell: int
    test_cell: int | None
    names: list[str]        # what the solution cell defines
    points: int             # points of the visible test cell

    @property
    def grade_id(self) -> str:
        return self.names[0] if self.names else f"cell{self.solution_cell}"


def has_solution(source: str) -> bool:
    return any(line.strip() == BEGIN for line in source.splitlines())


def find_exercises(nb, notebook: str = "") -> list[Exercise]:
    """Coding exercises of a notebook: each cell with solution markers and the code cell that follows it."""
    cells = nb["cells"]
    start = next((i for i, c in enumerate(cells)
                  if c["cell_type"] == "markdown" and re.search(r"^#+\s*Exercises", _src(c), re.M)), 0)
    found, number = [], None
    for i in range(len(cells)):  # every solution region, though they belong after the "Exercises" heading
        cell = cells[i]
        if cell["cell_type"] == "markdown" and i >= start:
            numbers = re.findall(r"^\s*(\d+)\.\s", _src(cell), re.M)
            number = int(numbers[-1]) if numbers else number
            continue
        if cell["cell_type"] != "code" or not has_solution(_src(cell)):
            continue
        test = next((j for j in range(i + 1, len(cells)) if cells[j]["cell_type"] == "code"), None)
        if test is not None and (has_solution(_src(cells[test])) or "assert" not in _src(cells[test])):
            test = None
        found.append(Exercise(notebook, number, i, test, _defined_names(_src(cell)),
                              _count_asserts(_src(cells[test])) if test is not None else 0))
    return found


def strip_solution(source: str) -> str:
    """Replace every BEGIN/END SOLUTION region by nbgrader's stub, at the marker's indentation."""
    out, inside = [], False
    for line in source.splitlines():
        if line.strip() == BEGIN:
            if inside:
                raise ValueError("nested '### BEGIN SOLUTION'")
            inside, indent = True, line[: len(line) - len(line.lstrip())]
            out += [indent + s for s in STUB]
        elif line.strip() == END:
            if not inside:
                raise ValueError("'### END SOLUTION' without a BEGIN")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise ValueError("'### BEGIN SOLUTION' without an END")
    return "\n".join(out)


def _nbgrader_meta(grade_id: str, *, solution: bool, grade: bool, points: float = 0, locked: bool = False) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if grade:
        meta["points"] = points
    return meta


def _header(notebook: str) -> str:
    folder = "course" if (COURSE / f"{notebook}.ipynb").exists() else "book"
    url = f"https://colab.research.google.com/github/{REPO}/blob/main/{folder}/{notebook}.ipynb"
    return (f"**Student version.** Write your code where a cell says `# YOUR CODE HERE` (delete the "
            f"`raise NotImplementedError()` line) and run the cell after it: its `assert`s check your result. "
            f"The last cell of the notebook runs the autograder's checks on your functions and tells you what "
            f"passes. Do not rename the functions. The chapter with its solutions is [here]({url}).")


FEEDBACK_CELL = ("# Feedback: the autograder's checks on your functions (the book's own versions are locked out).\n"
                 "from aiayn.course import feedback\n"
                 "feedback(globals(), notebook={notebook!r})")


def assignment_notebook(nb, notebook: str, student: bool = True, hidden_tests: bool = False):
    """The notebook with nbgrader metadata on its exercise cells; ``student`` also strips the solutions and
    outputs and adds a header and a feedback cell. ``hidden_tests`` adds nbgrader hidden-test cells that run
    this module's checks (for an nbgrader source notebook)."""
    import nbformat

    nb = copy.deepcopy(nb)
    exercises = find_exercises(nb, notebook)
    for ex in exercises:
        sol = nb.cells[ex.solution_cell]
        sol.metadata["nbgrader"] = _nbgrader_meta(ex.grade_id, solution=True, grade=False)
        if student:
            sol.source = strip_solution(_src(sol))
        if ex.test_cell is not None:
            nb.cells[ex.test_cell].metadata["nbgrader"] = _nbgrader_meta(
                f"test_{ex.grade_id}", solution=False, grade=True, points=ex.points, locked=True)
    if hidden_tests:
        for ex in reversed(exercises):
            for a in assignments_for(notebook, ex.names):
                cell = nbformat.v4.new_code_cell(
                    "### BEGIN HIDDEN TESTS\n"
                    f"from aiayn.course import require\nrequire({a.key!r}, globals())\n"
                    "### END HIDDEN TESTS")
                cell.metadata["nbgrader"] = _nbgrader_meta(f"hidden_{a.key}", solution=False, grade=True,
                                                           points=a.max_points, locked=True)
                nb.cells.insert((ex.test_cell or ex.solution_cell) + 1, cell)
    nb.metadata["aiayn"] = {"notebook": notebook, "exercises": [e.grade_id for e in exercises]}
    if student:
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
                cell.metadata.pop("execution", None)
        nb.cells.insert(1, nbformat.v4.new_markdown_cell(_header(notebook)))
        nb.cells.append(nbformat.v4.new_code_cell(FEEDBACK_CELL.format(notebook=notebook)))
    return nb


def sources(book: Path = BOOK, course: Path = COURSE) -> list[Path]:
    """Every notebook with coding exercises: the chapters, then the extra assignments in course/."""
    import nbformat

    paths = sorted(book.glob("[0-9]*.ipynb")) + (sorted(course.glob("*.ipynb")) if course.is_dir() else [])
    return [p for p in paths if find_exercises(nbformat.read(p, as_version=4), p.stem)]


def generate(out: Path = ROOT / "_build" / "student", notebooks: Iterable[Path] | None = None,
             nbgrader: Path | None = None) -> list[Path]:
    """Write a student version of every notebook with coding exercises into ``out``; with ``nbgrader``, also
    an nbgrader course directory (source/<assignment>/<notebook>.ipynb with the cell metadata, and a config)."""
    import nbformat

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for path in (list(notebooks) if notebooks is not None else sources()):
        path = Path(path)
        nb = nbformat.read(path, as_version=4)
        student = assignment_notebook(nb, path.stem)
        nbformat.validate(student)
        nbformat.write(student, out / path.name)
        written.append(out / path.name)
        if nbgrader is not None:
            folder = Path(nbgrader) / "source" / path.stem
            folder.mkdir(parents=True, exist_ok=True)
            nbformat.write(assignment_notebook(nb, path.stem, student=False, hidden_tests=True), folder / path.name)
    if nbgrader is not None:
        cfg = Path(nbgrader) / "nbgrader_config.py"
        if not cfg.exists():
            cfg.write_text('c = get_config()  # noqa: F821\nc.CourseDirectory.root = "."\n'
                           'c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\\nraise NotImplementedError()"}\n')
    return written


# ----------------------------------------------------------------------------------------------------------
# Grading: checks with points, run with the book's reference implementations locked out
# ----------------------------------------------------------------------------------------------------------

class ReferenceUsed(AssertionError):
    """The student's code called the implementation it was asked to write."""


@dataclass
class CheckResult:
    name: str
    points: float
    max_points: float
    message: str = ""

    @property
    def passed(self) -> bool:
        return self.points == self.max_points


@dataclass
class Grade:
    """Result of ``grade``: unpacks as (points, max_points, report)."""

    assignment: str
    points: float
    max_points: float
    report: list[CheckResult]

    def __iter__(self):
        return iter((self.points, self.max_points, self.report))

    @property
    def failed(self) -> set[str]:
        return {r.name for r in self.report if not r.passed}

    def __str__(self) -> str:
        lines = [f"{self.assignment}: {self.points:g} / {self.max_points:g} points"]
        for r in self.report:
            mark = "ok  " if r.passed else "FAIL"
            lines.append(f"  {mark} [{r.points:g}/{r.max_points:g}] {r.name}" + (f": {r.message}" if r.message else ""))
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle):
        p.text(str(self))


@dataclass
class Assignment:
    key: str
    title: str
    notebook: str                 # the chapter slug (file stem without its number) that holds the exercise
    names: list[str]              # the student's function or class, as the exercise names it
    signature: str                # what the checks call
    checks: list[tuple[str, float, Callable]]
    forbidden: list[str] = field(default_factory=list)  # dotted paths locked while the student's code runs
    minutes: int = 30             # suggested time for the exercise

    @property
    def max_points(self) -> float:
        return sum(p for _, p, _ in self.checks)


ASSIGNMENTS: dict[str, Assignment] = {}


def _slug(stem: str) -> str:
    return re.sub(r"^\d+[a-z]?_", "", stem)


def assignments_for(notebook: str, names: Iterable[str] | None = None) -> list[Assignment]:
    names = set(names) if names is not None else None
    return [a for a in ASSIGNMENTS.values()
            if a.notebook == _slug(notebook) and (names is None or names & set(a.names))]


def _resolve(path: str):
    """'pkg.mod.obj.attr' -> (owner, attr name, object), or None when it does not exist (yet)."""
    parts = path.split(".")
    for i in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for p in parts[i:-1]:
                owner = getattr(owner, p)
            return owner, parts[-1], getattr(owner, parts[-1])
        except AttributeError:
            return None
    return None


@contextmanager
def locked(forbidden: Iterable[str], namespaces: Iterable[dict] = (), cells: Iterable = ()):
    """Within the block, the named reference implementations raise ReferenceUsed when called: in their modules,
    in the given namespaces (a notebook's globals, where a chapter defines its own copies under the same names)
    and wherever the same objects are bound in aiayn's and sacreBLEU's modules."""
    hits: list[str] = []
    namespaces = [ns for ns in namespaces if isinstance(ns, dict)]
    saved: list[tuple[Any, str, Any]] = []  # (container, key, original or _MISSING)

    def wire(path):
        def tripwire(*args, **kwargs):
            hits.append(path)
            raise ReferenceUsed(f"your code calls {path}, the implementation you are asked to write; write your own")
        tripwire.__aiayn_tripwire__ = True
        return tripwire

    def replace(container, key, path):
        if key is None:  # a closure cell
            saved.append((container, None, container.cell_contents))
            container.cell_contents = wire(path)
        elif isinstance(container, dict):
            saved.append((container, key, container[key]))
            container[key] = wire(path)
        else:
            saved.append((container, key, vars(container).get(key, _MISSING)))
            setattr(container, key, wire(path))

    try:
        objects = {}
        for path in forbidden:
            head, _, name = path.rpartition(".")
            found, owner = _resolve(path), _resolve(head)
            if found:
                objects[id(found[2])] = path
                replace(found[0], name, path)
            for ns in namespaces:
                if owner and inspect.isclass(owner[2]):  # Class.method: also the chapter's own class of that name
                    cls = ns.get(head.rsplit(".", 1)[-1])
                    if inspect.isclass(cls) and name in vars(cls) and cls is not owner[2]:
                        replace(cls, name, path)
                elif callable(ns.get(name)) and not inspect.ismodule(ns[name]) \
                        and not getattr(ns[name], "__aiayn_tripwire__", False):
                    objects[id(ns[name])] = path
                    replace(ns, name, path)
        scan = [vars(m) for n, m in list(sys.modules.items()) if m is not None and n.startswith(("aiayn", "sacrebleu"))]
        for d in scan + namespaces:
            for k, v in list(d.items()):
                if id(v) in objects and not getattr(v, "__aiayn_tripwire__", False):
                    replace(d, k, objects[id(v)])
        for cell in cells:
            try:
                v = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if id(v) in objects:
                replace(cell, None, objects[id(v)])
        yield hits
    finally:
        for container, key, original in reversed(saved):
            if key is None:
                container.cell_contents = original
            elif isinstance(container, dict):
                container[key] = original
            elif original is _MISSING:
                delattr(container, key)
            else:
                setattr(container, key, original)


_MISSING = object()


def _find_student(assignment: Assignment, student) -> tuple[Any, list[dict]]:
    """The student's callable and the namespaces to lock, from a callable or a namespace (e.g. globals())."""
    if isinstance(student, dict):
        for name in assignment.names:
            if name in student and callable(student[name]):
                return student[name], [student]
        raise LookupError(f"no {' or '.join(assignment.names)} defined; the checks call {assignment.signature}")
    ns = getattr(student, "__globals__", None) or getattr(sys.modules.get(getattr(student, "__module__", "")),
                                                          "__dict__", None)
    return student, [ns] if isinstance(ns, dict) else []


def _closure_cells(obj) -> list:
    """Closure cells of a function, or of a class's methods (where a copied reference could hide)."""
    funcs = [obj] if inspect.isfunction(obj) else [v for v in vars(obj).values() if inspect.isfunction(v)] \
        if inspect.isclass(obj) else []
    return [c for f in funcs for c in (f.__closure__ or ())]


def grade(assignment: str, student) -> Grade:
    """Run every check of ``assignment`` on the student's function or class (or on a namespace that defines it,
    such as a notebook's ``globals()``). Returns Grade(points, max_points, report)."""
    a = ASSIGNMENTS[assignment]
    try:
        fn, namespaces = _find_student(a, student)
    except LookupError as err:
        return Grade(a.key, 0, a.max_points, [CheckResult(name, 0, pts, str(err)) for name, pts, _ in a.checks])
    forbidden_classes = [o[2] for o in map(_resolve, {p.rpartition(".")[0] for p in a.forbidden}) if o and inspect.isclass(o[2])]
    report = []
    for name, pts, check in a.checks:
        def call(f, *args, **kwargs):
            with locked(a.forbidden, namespaces, _closure_cells(fn)) as hits:
                try:
                    return f(*args, **kwargs)
                finally:
                    if hits:
                        raise ReferenceUsed(f"your code calls {hits[0]}, the implementation you are asked to write")
        try:
            if inspect.isclass(fn) and any(issubclass(fn, c) for c in forbidden_classes):
                raise ReferenceUsed("your class subclasses the book's implementation; write your own")
            check(fn, call)
            report.append(CheckResult(name, pts, pts))
        except NotImplementedError:
            report.append(CheckResult(name, 0, pts, "not implemented yet"))
        except Exception as err:  # a failed check, or the student's code raising: the check gets 0
            msg = str(err).strip().splitlines()
            report.append(CheckResult(name, 0, pts, f"{type(err).__name__}: {msg[0] if msg else ''}"[:300]))
    return Grade(a.key, sum(r.points for r in report), a.max_points, report)


def require(assignment: str, student) -> None:
    """Raise AssertionError unless every check passes (nbgrader hidden tests use this)."""
    g = grade(assignment, student)
    if g.points < g.max_points:
        raise AssertionError(str(g))


def feedback(namespace: dict, notebook: str | None = None) -> list[Grade]:
    """Grade every assignment whose function ``namespace`` defines (or, given ``notebook``, every assignment of
    that notebook), print the reports, and return the grades."""
    if notebook is not None:
        todo = assignments_for(notebook)
    else:
        todo = [a for a in ASSIGNMENTS.values() if any(n in namespace for n in a.names)]
    grades = [grade(a.key, namespace) for a in todo]
    for g in grades:
        print(g, end="\n\n")
    if not grades:
        print("No autograded assignment in this notebook; its assert cells are the checks.")
    return grades


# ----------------------------------------------------------------------------------------------------------
# The checks. Each gets the student's callable and ``call`` (which runs it with the references locked out);
# expected values are computed outside the lock, from the book's package or by hand.
# ----------------------------------------------------------------------------------------------------------

def _t():
    import torch
    return torch


def _first(x):
    return x[0] if isinstance(x, (tuple, list)) else x


def _close(got, want, what: str, atol: float = 1e-5, rtol: float = 1e-4) -> None:
    torch = _t()
    got = torch.as_tensor(got).detach().to(torch.float64) if not isinstance(got, (int, float)) else torch.tensor(float(got), dtype=torch.float64)
    want = torch.as_tensor(want).to(torch.float64)
    if got.shape != want.shape:
        raise AssertionError(f"{what}: shape {tuple(got.shape)}, expected {tuple(want.shape)}")
    if not torch.allclose(got, want, atol=atol, rtol=rtol, equal_nan=False):
        err = (got - want).abs().max().item()
        raise AssertionError(f"{what}: off by up to {err:.3g}")


def _assignment(key, title, notebook, names, signature, forbidden, minutes):
    def register(checks_fn):
        ASSIGNMENTS[key] = Assignment(key, title, notebook, names, signature, checks_fn(), forbidden, minutes)
        return checks_fn
    return register


# -- §3.2.1 scaled dot-product attention ------------------------------------------------------------------

@_assignment("attention", "Scaled dot-product attention (§3.2.1)", "attention", ["my_attention"],
             "my_attention(query, key, value, mask=None) -> output (or (output, weights)); mask bool, True = may attend",
             ["aiayn.attention.attention", "aiayn.attention.attend", "torch.nn.functional.scaled_dot_product_attention",
              "aiayn.multi_head.MultiHeadAttention.forward", "torch.nn.MultiheadAttention.forward",
              "torch.nn.functional.multi_head_attention_forward"], 30)
def _attention_checks():
    def att(call, f, q, k, v, mask=None):
        return _first(call(f, q, k, v, mask) if mask is not None else call(f, q, k, v))

    def data(seed=0):
        g = _t().Generator().manual_seed(seed)
        r = lambda *s: _t().randn(*s, generator=g)  # noqa: E731
        return r(2, 3, 5, 8), r(2, 3, 7, 8), r(2, 3, 7, 4)

    def shape(f, call):
        q, k, v = data()
        out = att(call, f, q, k, v)
        assert tuple(out.shape) == (2, 3, 5, 4), f"output shape {tuple(out.shape)}, expected (2, 3, 5, 4) = (..., len_q, d_v)"

    def scale(f, call):
        torch = _t()
        q = torch.ones(1, 1, 4)                                  # d_k = 4: q.k1 = 4, q.k2 = 0
        k = torch.tensor([[[1.0, 1, 1, 1], [0, 0, 0, 0]]])
        v = torch.tensor([[[1.0], [0.0]]])
        got = att(call, f, q, k, v).flatten()[0].item()
        want = math.exp(2) / (math.exp(2) + 1)                  # softmax(4/sqrt(4), 0)[0] = 0.8808
        hints = {round(math.exp(4) / (math.exp(4) + 1), 4): "the scores are not divided by sqrt(d_k)",
                 round(math.exp(1) / (math.exp(1) + 1), 4): "the scores are divided by d_k instead of sqrt(d_k)"}
        if abs(got - want) > 1e-5:
            raise AssertionError(hints.get(round(got, 4), f"got {got:.4f}, expected {want:.4f}"))

    def reference(f, call):
        from aiayn.attention import attention
        q, k, v = data(1)
        _close(att(call, f, q, k, v), attention(q, k, v)[0], "output without a mask")

    def one_key(f, call):
        torch = _t()
        q, k, v = data(2)
        j = torch.arange(5) % 7                                  # query i may attend to key i only
        mask = torch.nn.functional.one_hot(j, 7).bool()          # (len_q, len_k)
        _close(att(call, f, q, k, v, mask), v[:, :, j], "with one allowed key per query the output must be that key's value")

    def padding(f, call):
        torch = _t()
        q, k, v = data(3)
        mask = torch.tensor([[True] * 7, [True] * 4 + [False] * 3])[:, None, None, :]  # (batch, 1, 1, len_k)
        out = att(call, f, q, k, v, mask)
        k2, v2 = k.clone(), v.clone()
        k2[1, :, 4:] += 5 * torch.randn(3, 3, 8)
        v2[1, :, 4:] += 5
        _close(att(call, f, q, k2, v2, mask), out, "changing masked (padding) keys and values changed the output")
        v3 = v.clone()
        v3[1, :, :4] += 1.0
        diff = (att(call, f, q, k, v3, mask) - out)[1]
        _close(diff, torch.ones_like(diff), "shifting every allowed value by 1 must shift the output by 1 (weights over the allowed keys sum to 1)")

    def causal(f, call):
        torch = _t()
        q, _, _ = data(4)
        k, v = q.clone(), torch.randn(2, 3, 5, 4)
        mask = torch.ones(5, 5, dtype=torch.bool).tril()
        out = att(call, f, q, k, v, mask)
        v2 = v.clone()
        v2[..., 3:, :] += 10.0                                   # the future of positions 0..2
        _close(att(call, f, q, k, v2, mask)[..., :3, :], out[..., :3, :], "a position saw values after it (causal mask)")
        _close(out[..., 0, :], v[..., 0, :], "position 0 may only attend to itself")

    def reference_masked(f, call):
        torch = _t()
        from aiayn.attention import attention
        q, k, v = data(5)
        k, v = k[..., :5, :], v[..., :5, :]
        mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]).bool()[:, None, None, :] & torch.ones(5, 5).bool().tril()
        _close(att(call, f, q, k, v, mask), attention(q, k, v, mask)[0], "output with padding and causal masks")

    return [("output shape (..., len_q, d_v)", 1, shape),
            ("scores divided by sqrt(d_k) (known value 0.8808)", 3, scale),
            ("matches the book's attention, no mask", 2, reference),
            ("a mask with one allowed key returns that key's value", 2, one_key),
            ("padding mask (batch, 1, 1, len_k): masked keys have no influence", 2, padding),
            ("causal mask (len, len): no position sees the future", 2, causal),
            ("matches the book's attention with padding and causal masks", 2, reference_masked)]


# -- §3.2.2 multi-head attention --------------------------------------------------------------------------

@_assignment("multi_head", "Multi-head attention, one head at a time (§3.2.2)", "multi_head", ["heads_in_a_loop"],
             "heads_in_a_loop(layer: MultiHeadAttention, x, mask=None) -> (batch, len, d_model), self-attention of x",
             ["aiayn.multi_head.MultiHeadAttention.forward", "torch.nn.MultiheadAttention.forward",
              "torch.nn.functional.multi_head_attention_forward"], 45)
def _multi_head_checks():
    def layer_and_x(d_model=24, h=3, d_k=None, seed=0, length=6):
        torch = _t()
        from aiayn.multi_head import MultiHeadAttention
        torch.manual_seed(seed)
        return MultiHeadAttention(d_model, h, d_k).eval(), torch.randn(2, length, d_model)

    def run(call, f, layer, x, mask=None):
        return _first(call(f, layer, x, mask) if mask is not None else call(f, layer, x))

    def shape(f, call):
        layer, x = layer_and_x()
        out = run(call, f, layer, x)
        assert tuple(out.shape) == (2, 6, 24), f"output shape {tuple(out.shape)}, expected (2, 6, 24)"

    def known(f, call):
        torch = _t()
        layer, _ = layer_and_x(4, 1)
        with torch.no_grad():
            for W in (layer.W_Q, layer.W_K, layer.W_V, layer.W_O):
                W.weight.copy_(torch.eye(4))
                W.bias.zero_()
        x = torch.tensor([[[1.0, 0, 0, 0], [0, 1.0, 0, 0]]])
        a = math.exp(0.5) / (math.exp(0.5) + 1)                  # softmax(x x^T / sqrt(4)) = softmax(0.5, 0)
        want = torch.tensor([[[a, 1 - a, 0, 0], [1 - a, a, 0, 0]]])
        _close(run(call, f, layer, x), want, "one head with identity projections must be plain attention")

    def plain(f, call):
        layer, x = layer_and_x(seed=1)
        _close(run(call, f, layer, x), layer(x, x, x)[0].detach(), "output without a mask")

    def causal(f, call):
        from aiayn.attention import subsequent_mask
        layer, x = layer_and_x(seed=2)
        m = subsequent_mask(6)
        _close(run(call, f, layer, x, m), layer(x, x, x, m)[0].detach(), "output with a causal mask")

    def any_mask(f, call):
        torch = _t()
        layer, x = layer_and_x(seed=3)
        m = (torch.rand(6, 6, generator=torch.Generator().manual_seed(3)) > 0.5) | torch.eye(6, dtype=torch.bool)
        _close(run(call, f, layer, x, m), layer(x, x, x, m)[0].detach(), "output with a (len, len) mask")

    def other_shapes(f, call):
        layer, x = layer_and_x(16, 4, d_k=8, seed=4, length=5)  # h * d_k = 32 != d_model
        _close(run(call, f, layer, x), layer(x, x, x)[0].detach(), "d_model=16, h=4, d_k=8")
        layer, x = layer_and_x(12, 6, seed=5, length=3)
        _close(run(call, f, layer, x), layer(x, x, x)[0].detach(), "d_model=12, h=6")

    return [("output shape (batch, len, d_model)", 1, shape),
            ("one head, identity projections: known values", 2, known),
            ("equals the layer, no mask", 3, plain),
            ("equals the layer with a causal mask", 2, causal),
            ("equals the layer with any (len, len) mask", 2, any_mask),
            ("any h and d_k (h * d_k != d_model too)", 2, other_shapes)]


# -- §3.5 positional encoding -----------------------------------------------------------------------------

@_assignment("positional", "Sinusoidal positional encoding (§3.5)", "positional_encoding",
             ["my_encoding", "my_sinusoidal_encoding"], "my_encoding(max_len, d_model) -> (max_len, d_model)",
             ["aiayn.positional.sinusoidal_encoding", "aiayn.positional.PositionalEncoding.__init__",
              "aiayn.positional.shift_matrix"], 30)
def _positional_checks():
    def pe(call, f, n, d):
        return _t().as_tensor(call(f, n, d)).double()

    def shape(f, call):
        out = pe(call, f, 7, 10)
        assert tuple(out.shape) == (7, 10), f"shape {tuple(out.shape)}, expected (max_len, d_model) = (7, 10)"

    def zero(f, call):
        _close(pe(call, f, 3, 8)[0], _t().tensor([0.0, 1] * 4), "position 0 must be (0, 1, 0, 1, ...)")

    def interleave(f, call):
        out = pe(call, f, 3, 8)
        _close(out[1, :2], _t().tensor([math.sin(1), math.cos(1)]),
               "PE(1, 0) = sin(1) and PE(1, 1) = cos(1): sines on even dimensions, cosines on odd ones")

    def frequency(f, call):
        out = pe(call, f, 3, 4)                                 # 2i = 2: wavelength 10000^(2/4) = 100
        _close(out[2, 2:], _t().tensor([math.sin(0.02), math.cos(0.02)]), "PE(2, 2:4) = (sin(2/100), cos(2/100))")

    def reference(f, call):
        from aiayn.positional import sinusoidal_encoding
        _close(pe(call, f, 50, 64), sinusoidal_encoding(50, 64), "max_len 50, d_model 64", atol=1e-4)

    def norm(f, call):
        out = pe(call, f, 20, 16)
        _close(out.norm(dim=-1), _t().full((20,), math.sqrt(8.0)), "every position has norm sqrt(d_model / 2)", atol=1e-4)

    return [("shape (max_len, d_model)", 1, shape), ("position 0 is (0, 1, 0, 1, ...)", 1, zero),
            ("sine on even, cosine on odd dimensions", 2, interleave),
            ("frequencies 1 / 10000^(2i / d_model)", 2, frequency),
            ("matches the book's sinusoidal_encoding", 2, reference),
            ("norm sqrt(d_model / 2) at every position", 1, norm)]


# -- §5.3 learning-rate schedule --------------------------------------------------------------------------

@_assignment("schedule", "The learning-rate schedule, Equation (3) (§5.3)", "schedule", ["my_rate"],
             "my_rate(step, d_model, warmup, factor=1.0) -> float, step = optimizer updates counted from 1",
             ["aiayn.training.rate", "aiayn.training.make_optimizer"], 20)
def _schedule_checks():
    def r(call, f, *args):
        return float(call(f, *args))

    def peak(f, call):
        _close(r(call, f, 4000, 512, 4000), 512**-0.5 * 4000**-0.5, "rate(4000, 512, 4000) = 512^-0.5 * 4000^-0.5", rtol=1e-6, atol=0)

    def warm(f, call):
        p = 512**-0.5 * 4000**-0.5
        _close(r(call, f, 2000, 512, 4000), p / 2, "half-way through warmup the rate is half the peak", rtol=1e-6, atol=0)
        _close(r(call, f, 1, 512, 4000), p / 4000, "rate(1) = peak / warmup", rtol=1e-6, atol=0)

    def decay(f, call):
        p = 512**-0.5 * 4000**-0.5
        _close(r(call, f, 16000, 512, 4000), p / 2, "at 4 x warmup the rate is half the peak (step^-0.5)", rtol=1e-6, atol=0)

    def factor(f, call):
        _close(float(call(f, 100, 256, 1000, 2.0)), 2.0 * 256**-0.5 * 100 * 1000**-1.5, "factor multiplies the rate", rtol=1e-6, atol=0)

    def reference(f, call):
        from aiayn.training import rate
        steps = [1, 2, 3, 10, 99, 100, 101, 500, 999, 1000, 1001, 5000, 20000]
        for d_model, warmup in [(512, 4000), (256, 100), (64, 1000)]:
            got = [r(call, f, s, d_model, warmup) for s in steps]
            _close(_t().tensor(got), _t().tensor([rate(s, d_model, warmup) for s in steps]),
                   f"d_model {d_model}, warmup {warmup}", rtol=1e-6, atol=0)

    return [("peak value at step = warmup", 2, peak), ("linear warmup", 2, warm),
            ("decay as step^-0.5", 2, decay), ("factor", 1, factor),
            ("matches the book's rate", 2, reference)]


# -- §5.3 stepping the schedule per optimizer update, with gradient accumulation ----------------------------

@_assignment("accumulation", "Gradient accumulation and the schedule per update (§5.3)", "schedule", ["my_train_epoch"],
             "my_train_epoch(model, batches, optimizer, scheduler, accum) -> None; model(batch) returns the mean "
             "loss of a micro-batch; one optimizer update per `accum` micro-batches", ["aiayn.training.train"], 30)
def _accumulation_checks():
    def setup(n_batches=8):
        torch = _t()
        from aiayn.training import rate

        class Recording(torch.optim.SGD):
            def step(self, closure=None):
                self.seen.append((self.param_groups[0]["lr"], [p.grad.clone() for p in self.param_groups[0]["params"]]))
                return super().step(closure)

        torch.manual_seed(0)
        net = torch.nn.Linear(3, 1)
        w0 = [p.detach().clone() for p in net.parameters()]
        model = lambda b: (net(b[0]) - b[1]).pow(2).mean()  # noqa: E731
        batches = [(torch.randn(4, 3), torch.randn(4, 1)) for _ in range(n_batches)]
        opt = Recording(net.parameters(), lr=1.0)
        opt.seen = []
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: rate(s + 1, 16, 10, 100.0))
        return net, w0, model, batches, opt, sched

    def updates(f, call):
        net, w0, model, batches, opt, sched = setup()
        call(f, model, batches, opt, sched, 4)
        assert len(opt.seen) == 2, f"8 micro-batches with accum=4 must give 2 optimizer updates, got {len(opt.seen)}"

    def per_update(f, call):
        from aiayn.training import rate
        net, w0, model, batches, opt, sched = setup()
        call(f, model, batches, opt, sched, 4)
        lrs = [lr for lr, _ in opt.seen]
        want = [rate(1, 16, 10, 100.0), rate(2, 16, 10, 100.0)]
        if len(lrs) != 2 or any(abs(a - b) > 1e-12 for a, b in zip(lrs, want)):
            raise AssertionError(f"updates 1 and 2 must use rate(1) and rate(2) = {want[0]:.4g}, {want[1]:.4g}; "
                                 f"they used {', '.join(f'{x:.4g}' for x in lrs)} (scheduler stepped per micro-batch?)")
        assert sched.last_epoch == 2, f"the scheduler was stepped {sched.last_epoch} times for 2 updates"

    def averaged(f, call):
        torch = _t()
        net, w0, model, batches, opt, sched = setup()
        call(f, model, batches, opt, sched, 4)
        assert len(opt.seen) == 2, "expected 2 optimizer updates"
        params, w = list(net.parameters()), [p.clone() for p in w0]
        for n, (lr, grads) in enumerate(opt.seen):
            for p in w:
                p.requires_grad_(True)
            group = batches[4 * n: 4 * n + 4]
            loss = sum(((b[0] @ w[0].T + w[1]) - b[1]).pow(2).mean() for b in group) / 4
            want = torch.autograd.grad(loss, w)
            for g, gw in zip(grads, want):
                _close(g, gw, f"update {n + 1}: the gradient must be the mean over its 4 micro-batches")
            w = [(p - lr * g).detach() for p, g in zip(w, want)]
        for p, q in zip(params, w):
            _close(p.detach(), q, "final weights")

    return [("one optimizer update per accum micro-batches", 2, updates),
            ("schedule stepped once per optimizer update, not per micro-batch", 3, per_update),
            ("gradients averaged over an update's micro-batches, then zeroed", 2, averaged)]


# -- §5.4 label smoothing ---------------------------------------------------------------------------------

@_assignment("label_smoothing", "Label-smoothed loss (§5.4)", "label_smoothing",
             ["MyLabelSmoothingLoss", "my_label_smoothing"],
             "MyLabelSmoothingLoss(eps_ls, pad_id)(logits, target) or my_label_smoothing(logits, target, eps_ls, pad_id) "
             "-> summed loss over non-pad positions",
             ["aiayn.training.LabelSmoothingLoss.forward", "aiayn.training.LabelSmoothingLoss.target_distribution"], 30)
def _label_smoothing_checks():
    def loss(call, f, logits, target, eps=0.1, pad=0):
        if inspect.isclass(f):
            return call(lambda: f(eps, pad)(logits, target))
        return call(f, logits, target, eps, pad)

    def data(seed=0, V=11):
        torch = _t()
        g = torch.Generator().manual_seed(seed)
        logits = torch.randn(2, 5, V, generator=g)
        target = torch.randint(1, V, (2, 5), generator=g)
        target[1, 3:] = 0
        return logits, target

    def q_from_grad(call, f, V=11):
        """The target distribution, read off the gradient: d loss / d logits = softmax - q per non-pad row."""
        logits, target = data(1, V)
        logits.requires_grad_(True)
        out = loss(call, f, logits, target)
        (grad,) = _t().autograd.grad(out, logits)
        return (logits.softmax(-1) - grad).detach(), target

    def uniform(f, call):
        torch = _t()
        target = torch.tensor([[3, 4, 0]])
        _close(loss(call, f, torch.zeros(1, 3, 5), target), 2 * math.log(5),
               "uniform logits: log V per non-pad token, summed (2 tokens, V = 5)")

    def true_token(f, call):
        q, target = q_from_grad(call, f)
        keep = target != 0
        _close(q.gather(-1, target[..., None])[..., 0][keep], _t().full((int(keep.sum()),), 0.9),
               "the true token's target probability must be 1 - eps_ls = 0.9")

    def no_pad(f, call):
        q, target = q_from_grad(call, f)
        keep = target != 0
        got = q[..., 0][keep]
        if got.abs().max() > 1e-6:
            raise AssertionError(f"the padding token gets target probability {got.max():.4g}; it must get 0")

    def spread(f, call):
        torch = _t()
        q, target = q_from_grad(call, f)
        keep = target != 0
        other = torch.ones_like(q, dtype=torch.bool)
        other[..., 0] = False
        other.scatter_(-1, target[..., None], False)
        _close(q[other & keep[..., None]], torch.full((int((other & keep[..., None]).sum()),), 0.1 / 9),
               "the other V - 2 tokens get eps_ls / (V - 2) each")

    def padding_rows(f, call):
        torch = _t()
        logits, target = data(2)
        logits.requires_grad_(True)
        (grad,) = torch.autograd.grad(loss(call, f, logits, target), logits)
        _close(grad[target == 0], torch.zeros_like(grad[target == 0]), "positions whose target is padding must not contribute")

    def finite(f, call):
        torch = _t()
        logits = torch.full((1, 3, 7), -1e4)
        logits[0, :, 2] = 1e4
        out = loss(call, f, logits, torch.tensor([[2, 5, 0]]))
        assert torch.isfinite(torch.as_tensor(out)).all(), f"the loss is {out} for confident logits (log 0?)"

    def reference(f, call):
        from aiayn.training import LabelSmoothingLoss
        for eps, V in [(0.1, 11), (0.3, 6)]:
            logits, target = data(3, V)
            _close(loss(call, f, logits, target, eps), LabelSmoothingLoss(eps, 0)(logits, target), f"eps_ls {eps}, V {V}")

    def plain(f, call):
        torch = _t()
        logits, target = data(4)
        want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=0, reduction="sum")
        _close(loss(call, f, logits, target, 0.0), want, "eps_ls = 0 must be the plain cross-entropy")

    return [("uniform logits: log V per token (known value)", 2, uniform),
            ("true token gets 1 - eps_ls", 1, true_token),
            ("no probability on the padding token", 3, no_pad),
            ("eps_ls spread over the V - 2 other tokens", 1, spread),
            ("padding positions contribute nothing", 2, padding_rows),
            ("finite for confident logits (no log 0)", 1, finite),
            ("matches the book's LabelSmoothingLoss", 2, reference),
            ("eps_ls = 0 is the cross-entropy", 1, plain)]


# -- §6.1 greedy decoding ---------------------------------------------------------------------------------

BOS, EOS, PAD = 1, 2, 0


def _as_sequences(out) -> list[list[int]]:
    """Decoder output (tensor or lists, with or without BOS, padded or not) -> token lists up to EOS."""
    out = _first(out) if isinstance(out, tuple) else out
    rows = out.tolist() if hasattr(out, "tolist") else [list(r) for r in out]
    seqs = []
    for row in rows:
        row = [int(t) for t in (row.tolist() if hasattr(row, "tolist") else row)]
        if row and row[0] == BOS:
            row = row[1:]
        if EOS in row:
            row = row[: row.index(EOS)]
        seqs.append([t for t in row if t != PAD])
    return seqs


def _chain_model(chain: dict[int, int], V: int = 10):
    """A stand-in with the Transformer's interface whose next token is chain[previous token], whatever the source."""
    torch = _t()
    from types import SimpleNamespace

    class Chain(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.config = SimpleNamespace(pad_id=PAD, vocab_size=V, max_len=64, N=1, d_model=V)
            self.generator = torch.nn.Identity()
            table = torch.full((V, V), -5.0)
            for a, b in chain.items():
                table[a, b] = 5.0
            self.register_buffer("table", table)

        def encode(self, src):
            return torch.zeros(src.size(0), src.size(1), V), (src != PAD)[:, None, None, :]

        def decode(self, tgt, memory, src_mask, cache=None, start=0):
            return self.table[tgt]                               # (batch, T, V): "hidden state" = next-token logits

        def new_cache(self):
            return [{}]

        def forward(self, src, tgt):
            return self.generator(self.decode(tgt, *self.encode(src)))

    return Chain().eval()


def _greedy_reference(model, src, max_len):
    """Greedy decoding written plainly, for comparison: <s>, then the most probable token other than <pad> and <s>,
    until </s> or max_len tokens."""
    torch = _t()
    memory, src_mask = model.encode(src)
    ys = torch.full((src.size(0), 1), BOS, dtype=torch.long)
    for _ in range(max_len):
        logits = model.generator(model.decode(ys, memory, src_mask)[:, -1])
        logits[:, [PAD, BOS]] = -math.inf                        # never <pad> or <s>, as the book's greedy_decode
        ys = torch.cat([ys, logits.argmax(-1, keepdim=True)], dim=1)
        if (ys == EOS).any(1).all():
            break
    return ys


@_assignment("greedy", "Greedy decoding (§6.1)", "greedy_and_bleu", ["my_greedy_decode"],
             "my_greedy_decode(model, src, max_len) -> token ids (batch, T) or lists: from <s> (id 1), the most probable token "
             "other than <pad> (0) and <s> at each step, until </s> (id 2) or max_len tokens",
             ["aiayn.decoding.greedy_decode", "aiayn.decoding.beam_search"], 40)
def _greedy_checks():
    def decode(call, f, model, src, max_len):
        return _as_sequences(call(f, model, src, max_len))

    def chain(f, call):
        torch = _t()
        model = _chain_model({BOS: 5, 5: 7, 7: 4, 4: EOS})
        got = decode(call, f, model, torch.tensor([[3, 4, 5]]), 20)
        assert got == [[5, 7, 4]], f"the most likely next tokens are 5, 7, 4 then EOS; got {got}"

    def batch(f, call):
        torch = _t()
        model = _chain_model({BOS: 6, 6: EOS, 3: 3})
        got = decode(call, f, model, torch.tensor([[3, 4, 5], [6, 7, 0]]), 20)
        assert got == [[6], [6]], f"two sentences must give two outputs [6] and [6]; got {got}"

    def stops(f, call):
        torch = _t()
        model = _chain_model({BOS: 5, 5: 6, 6: 5})               # never ends
        got = decode(call, f, model, torch.tensor([[3, 4]]), 7)
        assert len(got) == 1 and 6 <= len(got[0]) <= 7 and got[0][:6] == [5, 6, 5, 6, 5, 6], \
            f"without EOS the output must stop at max_len = 7 tokens; got {got}"

    def real(f, call):
        torch = _t()
        from aiayn.model import make_model
        torch.manual_seed(0)
        model = make_model("base", vocab_size=16, N=1, d_model=32, d_ff=64, h=4, P_drop=0.0, max_len=64).eval()
        src = torch.tensor([[5, 6, 7, 8, 9], [9, 8, 7, 0, 0]])
        with torch.no_grad():
            want = _as_sequences(_greedy_reference(model, src, 10))
            got = decode(call, f, model, src, 10)
        assert got == want, f"on a small random model: got {got}, expected {want}"

    return [("follows the most likely token (known chain)", 3, chain), ("one output per source sentence", 1, batch),
            ("stops at max_len when no EOS comes", 1, stops), ("matches greedy decoding on a small model", 2, real)]


# -- §6.1 BLEU --------------------------------------------------------------------------------------------

@_assignment("bleu", "Corpus BLEU from scratch (§6.1)", "greedy_and_bleu", ["my_corpus_bleu"],
             "my_corpus_bleu(hyps: list[str], refs: list[str]) -> BLEU in [0, 100], sacreBLEU's 13a tokenisation",
             ["aiayn.bleu.corpus_bleu", "aiayn.bleu.sentence_bleu", "sacrebleu.corpus_bleu", "sacrebleu.sentence_bleu",
              "sacrebleu.metrics.bleu.BLEU.corpus_score", "sacrebleu.metrics.bleu.BLEU.sentence_score",
              "nltk.translate.bleu_score.corpus_bleu"], 45)
def _bleu_checks():
    def score(call, f, hyps, refs):
        out = call(f, hyps, refs)
        return float(getattr(out, "score", out))

    def want(hyps, refs):
        import sacrebleu
        return sacrebleu.corpus_bleu(hyps, [refs]).score

    refs = ["The cat sat on the mat .", "A man is riding a red bicycle down the street .",
            "Two dogs play in the snow .", "Children are watching a puppet show in the park ."]

    def identical(f, call):
        _close(score(call, f, refs, refs), 100.0, "identical hypotheses and references score 100")

    def brevity(f, call):
        hyps = ["The cat sat on", "A man is riding a red bicycle", "Two dogs play in the snow .", "Children are watching"]
        _close(score(call, f, hyps, refs), want(hyps, refs), "short hypotheses: the brevity penalty", atol=1e-4)

    def corpus(f, call):
        hyps = ["The cat sat on a mat .", "A man rides a red bike down the street .", "Two dogs are in snow .",
                "Kids watch a show in the park ."]
        _close(score(call, f, hyps, refs), want(hyps, refs), "corpus BLEU pools n-gram counts over sentences", atol=1e-4)

    def zero(f, call):
        hyps, rs = ["a b c d e", "f g h"], ["a x c y e", "z z z"]
        _close(score(call, f, hyps, rs), want(hyps, rs), "no matching 4-grams", atol=1e-4)

    def random_corpus(f, call):
        import random
        rng = random.Random(0)
        words = "a man woman dog cat runs sits on the in park street red blue , .".split()
        rs = [" ".join(rng.choice(words) for _ in range(rng.randint(4, 14))) for _ in range(40)]
        hyps = [" ".join(w for w in r.split() if rng.random() > 0.2) + (" blue" if rng.random() > 0.5 else "") for r in rs]
        _close(score(call, f, hyps, rs), want(hyps, rs), "a random corpus of 40 sentences", atol=1e-4)

    return [("identical corpus scores 100", 1, identical), ("brevity penalty", 2, brevity),
            ("corpus-level counts", 2, corpus), ("no 4-gram matches", 1, zero),
            ("matches sacreBLEU on a random corpus", 2, random_corpus)]


# ----------------------------------------------------------------------------------------------------------
# Grading submitted notebooks
# ----------------------------------------------------------------------------------------------------------

GRADER_CELL = """\
import importlib as _il, json as _json, sys as _sys
_sys.modules.pop("aiayn.course", None)
_course = _il.import_module("aiayn.course")
print(_course.RESULT_TAG + _json.dumps(_course._grade_namespace(globals(), {notebook!r})))
"""


def _grade_namespace(namespace: dict, notebook: str) -> list[dict]:
    out = []
    for a in assignments_for(notebook):
        g = grade(a.key, namespace)
        out += [{"assignment": a.key, "check": r.name, "points": r.points, "max_points": r.max_points,
                 "message": r.message} for r in g.report]
    return out


def _notebook_of(nb, path: Path) -> str:
    return nb.metadata.get("aiayn", {}).get("notebook") or path.stem


def _reference_tests(notebook: str) -> dict[str, tuple[str, int]]:
    """Source of each visible test cell in the book's notebook -> (grade id, points), to recognise test cells of a
    submission that lost its metadata."""
    import nbformat

    for folder in (BOOK, COURSE):
        path = folder / f"{notebook}.ipynb"
        if path.exists():
            nb = nbformat.read(path, as_version=4)
            return {_src(nb.cells[e.test_cell]).strip(): (f"test_{e.grade_id}", e.points)
                    for e in find_exercises(nb, notebook) if e.test_cell is not None}
    return {}


def grade_notebook(path: Path, timeout: int = 600, kernel: str = "python3") -> dict:
    """Execute a submitted notebook (errors allowed), then score its visible test cells (all or nothing each,
    as nbgrader does) and the hidden checks of its assignments, in the same kernel."""
    import nbformat
    from nbclient import NotebookClient

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    notebook = _notebook_of(nb, path)
    own = [e for e in find_exercises(nb, notebook) if e.test_cell is not None]  # a notebook with its markers
    known = {_src(nb.cells[e.test_cell]).strip(): (f"test_{e.grade_id}", e.points) for e in own} \
        or _reference_tests(notebook)
    tests = []
    for i, cell in enumerate(nb.cells):
        meta = cell.metadata.get("nbgrader", {})
        if cell.cell_type == "code" and meta.get("grade") and not meta.get("solution") \
                and not meta.get("grade_id", "").startswith("hidden_"):
            tests.append((i, meta["grade_id"], meta.get("points", 1)))
        elif cell.cell_type == "code" and _src(cell).strip() in known:
            tests.append((i, *known[_src(cell).strip()]))
    nb.cells = [c for c in nb.cells if "from aiayn.course import feedback" not in _src(c)]  # the student's feedback cell
    nb.cells.append(nbformat.v4.new_code_cell(GRADER_CELL.format(notebook=notebook)))
    cwd = BOOK if (BOOK / f"{notebook}.ipynb").exists() else path.parent
    error = ""
    try:
        NotebookClient(nb, timeout=timeout, kernel_name=kernel, allow_errors=True,
                       resources={"metadata": {"path": str(cwd)}}).execute()
    except Exception as err:  # a timeout or a dead kernel: what ran so far still counts
        error = f"{type(err).__name__}: {str(err).strip().splitlines()[0] if str(err).strip() else ''}"[:300]
    rows = []
    for i, grade_id, pts in tests:
        outputs = nb.cells[i].get("outputs", [])
        ran = nb.cells[i].get("execution_count") is not None
        failed = [o for o in outputs if o.get("output_type") == "error"]
        msg = "" if ran and not failed else ("did not run" if not ran else f"{failed[0]['ename']}: {failed[0]['evalue']}"[:300])
        rows.append({"assignment": "visible tests", "check": grade_id, "points": pts if ran and not failed else 0,
                     "max_points": pts, "message": msg})
    hidden = None
    for o in nb.cells[-1].get("outputs", []):
        for line in o.get("text", "").splitlines():
            if line.startswith(RESULT_TAG):
                hidden = json.loads(line[len(RESULT_TAG):])
    if hidden is None:
        hidden = [{"assignment": a.key, "check": name, "points": 0, "max_points": pts,
                   "message": error or "the notebook did not reach the grader"} for a in assignments_for(notebook)
                  for name, pts, _ in a.checks]
    rows += hidden
    return {"file": str(path), "notebook": notebook, "error": error, "checks": rows,
            "points": sum(r["points"] for r in rows), "max_points": sum(r["max_points"] for r in rows)}


def grade_folder(folder: Path, out: Path, timeout: int = 600) -> list[dict]:
    """Grade every notebook under ``folder`` (the student is the first folder below it, or the file name) and
    write ``out``.csv (one row per check) and ``out``.json (everything, with a total per notebook)."""
    folder, out = Path(folder), Path(out)
    results = []
    for path in sorted(folder.rglob("*.ipynb")):
        if ".ipynb_checkpoints" in path.parts:
            continue
        rel = path.relative_to(folder)
        student = rel.parts[0] if len(rel.parts) > 1 else path.stem
        print(f"grading {rel} ...", flush=True)
        result = grade_notebook(path, timeout)
        result["student"] = student
        results.append(result)
        print(f"  {result['points']:g} / {result['max_points']:g}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(results, indent=1))
    with out.with_suffix(".csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["student", "notebook", "assignment", "check", "points", "max_points", "message"])
        for r in results:
            for c in r["checks"]:
                w.writerow([r["student"], r["notebook"], c["assignment"], c["check"], c["points"], c["max_points"], c["message"]])
            w.writerow([r["student"], r["notebook"], "TOTAL", "", r["points"], r["max_points"], r["error"]])
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiayn.course", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="list the coding exercises and autograded assignments")
    g = sub.add_parser("generate", help="write student notebooks (solutions stripped, tests kept)")
    g.add_argument("notebooks", nargs="*", type=Path, help="default: every notebook with coding exercises")
    g.add_argument("--out", type=Path, default=ROOT / "_build" / "student")
    g.add_argument("--nbgrader", type=Path, help="also write an nbgrader course directory here")
    s = sub.add_parser("grade", help="grade a folder of submitted notebooks")
    s.add_argument("submissions", type=Path)
    s.add_argument("--out", type=Path, default=Path("marks"), help="writes OUT.csv and OUT.json (default: marks)")
    s.add_argument("--timeout", type=int, default=600, help="seconds per cell")
    args = parser.parse_args(argv)
    if args.command == "list":
        import nbformat
        for path in sources():
            for e in find_exercises(nbformat.read(path, as_version=4), path.stem):
                auto = ", ".join(f"{a.key} ({a.max_points:g} pts)" for a in assignments_for(path.stem, e.names))
                print(f"{path.stem:28} ex. {e.number or '?':>2} {', '.join(e.names):28} test {e.points} pts"
                      + (f"; autograded: {auto}" if auto else ""))
        print("\nAutograded assignments:")
        for a in ASSIGNMENTS.values():
            print(f"  {a.key:16} {a.max_points:4g} pts  ~{a.minutes} min  {a.signature}")
    elif args.command == "generate":
        written = generate(args.out, args.notebooks or None, args.nbgrader)
        print(f"wrote {len(written)} student notebooks to {args.out}")
    else:
        results = grade_folder(args.submissions, args.out, args.timeout)
        print(f"graded {len(results)} notebooks: {args.out.with_suffix('.csv')}, {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
