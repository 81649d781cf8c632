"""Course assignments from the book's exercises, graded by nbgrader.

A coding exercise is a code cell after a chapter's "Exercises" heading with its reference solution between nbgrader's
markers (``### BEGIN SOLUTION`` / ``### END SOLUTION``); the code cell after it checks the result. This module knows
which exercises exist and what they are worth, and writes an nbgrader course from them: one assignment per notebook,
whose graded cells are the checks of ``aiayn/course/checks.py`` (one cell per check, with its points) or, for an
exercise without registered checks, the chapter's own test cell (1 point). nbgrader does the rest, with each
submission's kernel in a bubblewrap sandbox and every check run in the grader's own process (``aiayn.course.grader``):

    python -m aiayn.course list                                 # exercises, checks and points
    python -m aiayn.course course my-course [--link-chapters]   # my-course/nbgrader_config.py and source/
    cd my-course && nbgrader generate_assignment label_smoothing          # the student version, in release/
    nbgrader autograde label_smoothing && nbgrader generate_feedback label_smoothing && nbgrader export
    python -m aiayn.course report label_smoothing               # one line per submission: points, failures, errors
    python -m aiayn.course demo label_smoothing                 # three made-up submissions, to try it out

Not about the paper: the exercises and their text live in the chapters (book/) and course/.
"""

import argparse
import ast
import copy
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from aiayn import ROOT
from aiayn.course.checks import ASSIGNMENTS

BOOK = ROOT / "book"
COURSE = ROOT / "course"  # assignment notebooks beyond the chapters, with the same markers
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
REPO = "aiayn-book/aiayn"


def _slug(stem: str) -> str:
    return re.sub(r"^\d+[a-z]?_", "", stem)


# ----------------------------------------------------------------------------------------------------------
# Exercises, from the markers
# ----------------------------------------------------------------------------------------------------------


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


def has_solution(source: str) -> bool:
    return any(line.strip() == BEGIN for line in source.splitlines())


@dataclass
class Exercise:
    """A coding exercise: its solution cell, the chapter's test cell after it, and the checks that grade it."""

    notebook: str  # file stem, e.g. "02_attention"
    number: int | None  # the exercise's number in the chapter's list
    solution_cell: int
    test_cell: int | None
    names: list[str]  # what the solution cell defines
    assignments: list[str]  # keys of aiayn.checks.ASSIGNMENTS that grade it; none: the test cell does (1 point)

    @property
    def grade_id(self) -> str:
        return self.names[0] if self.names else f"cell{self.solution_cell}"


def exercises_heading(nb) -> int:
    """Index of the markdown cell with the "Exercises" heading; every coding exercise comes after it."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and re.search(r"^#+\s*Exercises", cell.source, re.M):
            return i
    raise ValueError("no '## Exercises' heading: coding exercises go in a notebook's Exercises section")


def find_exercises(nb, notebook: str, registry: dict | None = None) -> list[Exercise]:
    """The coding exercises of a notebook: cells with solution markers after the Exercises heading."""
    registry = ASSIGNMENTS if registry is None else registry
    if not any(c.cell_type == "code" and has_solution(c.source) for c in nb.cells):
        return []
    start = exercises_heading(nb)
    early = [i for i, c in enumerate(nb.cells[:start]) if c.cell_type == "code" and has_solution(c.source)]
    if early:
        raise ValueError(f"{notebook}: cells {early} have solution markers before the Exercises heading")
    found, number = [], None
    for i in range(start, len(nb.cells)):
        cell = nb.cells[i]
        if cell.cell_type == "markdown":
            numbers = re.findall(r"^\s*(\d+)\.\s", cell.source, re.M)
            number = int(numbers[-1]) if numbers else number
            continue
        if not has_solution(cell.source):
            continue
        test = next((j for j in range(i + 1, len(nb.cells)) if nb.cells[j].cell_type == "code"), None)
        if test is not None and has_solution(nb.cells[test].source):
            test = None
        names = _defined_names(cell.source)
        graded = [a.key for a in registry.values() if a.notebook == _slug(notebook) and set(a.names) & set(names)]
        found.append(Exercise(notebook, number, i, test, names, graded))
    return found


def sources(book: Path = BOOK, course: Path = COURSE) -> list[Path]:
    """Every notebook with coding exercises: the chapters, then the assignment notebooks of course/."""
    import nbformat

    paths = sorted(book.glob("[0-9]*.ipynb")) + (sorted(course.glob("*.ipynb")) if course.is_dir() else [])
    return [
        p
        for p in paths
        if any(c.cell_type == "code" and has_solution(c.source) for c in nbformat.read(p, as_version=4).cells)
    ]


# ----------------------------------------------------------------------------------------------------------
# nbgrader source notebooks
# ----------------------------------------------------------------------------------------------------------

CHECK_CELL = """\
# Check, {points} point{s}: {what}
from aiayn.course.checks import check
check("{assignment}", "{key}", globals())"""


def _meta(grade_id: str, *, solution=False, grade=False, locked=False, points=0) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    if grade:
        meta["points"] = points
    return meta


def _header(notebook: str, link: bool) -> str:
    text = (
        "**How this assignment works.** Write your code where a cell says `# YOUR CODE HERE`, in place of the "
        "`raise NotImplementedError()` line, and keep the names of the functions. The graded cells are the "
        "cells that start with `# Check` and, for the smaller exercises, the test cell right after your answer: "
        "each earns its points when it runs without an error, and when it does not, its message says what is "
        "wrong. The book's own cells are read-only: the grader runs them as they are here. "
        "A cell that runs too long is stopped and the next ones still run. Before you submit, restart the "
        "kernel and run the whole notebook."
    )
    if link:
        folder = "course" if (COURSE / f"{notebook}.ipynb").exists() else "book"
        text += (
            f" The book's chapter is [here](https://colab.research.google.com/github/{REPO}/blob/main/"
            f"{folder}/{notebook}.ipynb)."
        )
    return text


def source_notebook(nb, notebook: str, link: bool = False, registry: dict | None = None):
    """The nbgrader source notebook (the instructor's copy) of a chapter or course notebook: the book's code cells
    read-only, solution cells marked, one graded cell per check, and a header for the student."""
    import nbformat

    registry = ASSIGNMENTS if registry is None else registry
    nb = copy.deepcopy(nb)
    exercises = find_exercises(nb, notebook, registry)
    start = exercises_heading(nb)
    for i, cell in enumerate(nb.cells):
        cell.metadata.pop("execution", None)
        cell.metadata.pop("mystnb", None)
        if "tags" in cell.metadata:
            cell.metadata["tags"] = [t for t in cell.metadata["tags"] if not t.startswith(("hide-", "remove-"))]
            if not cell.metadata["tags"]:
                del cell.metadata["tags"]
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            if i < start:  # the book's code: read-only, and run with the long time limit
                cell.metadata["nbgrader"] = _meta(f"book_{i}", locked=True)
    inserts = []
    for ex in exercises:
        nb.cells[ex.solution_cell].metadata["nbgrader"] = _meta(ex.grade_id, solution=True)
        if ex.assignments:  # the checks; the chapter's own test cell stays, ungraded, as a first try
            cells = []
            for key in ex.assignments:
                for c in registry[key].checks:
                    cell = nbformat.v4.new_code_cell(
                        CHECK_CELL.format(
                            points=c.points, s="s" * (c.points != 1), what=c.what, assignment=key, key=c.key
                        )
                    )
                    cell.metadata["nbgrader"] = _meta(f"{key}_{c.key}", grade=True, locked=True, points=c.points)
                    cells.append(cell)
            inserts.append(((ex.test_cell if ex.test_cell is not None else ex.solution_cell) + 1, cells))
        elif ex.test_cell is not None:
            nb.cells[ex.test_cell].metadata["nbgrader"] = _meta(
                f"test_{ex.grade_id}", grade=True, locked=True, points=1
            )
    for at, cells in sorted(inserts, key=lambda x: x[0], reverse=True):
        nb.cells[at:at] = cells
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(_header(notebook, link)))
    nb.metadata.pop("widgets", None)
    nbformat.validate(nb)
    return nb


NBGRADER_CONFIG = '''\
"""nbgrader's configuration for a course of the book's exercises (written by `python -m aiayn.course course`)."""
import os
import warnings

from nbconvert.preprocessors import ClearMetadataPreprocessor
from sqlalchemy.exc import SAWarning

from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, ClearOutput, DeduplicateIds, IgnorePattern,
                                    LimitOutput, OverwriteCells, OverwriteKernelspec, SaveAutoGrades)

from aiayn.course.grader import Execute, RestoreCells, refuse_odd_submissions

c = get_config()  # noqa: F821

# Time limits in seconds. A cell that runs longer is interrupted and marked with an error; the cells after it still
# run. A statement that does not stop when interrupted (a long call into C code), or that ends its kernel, is skipped
# alone: the notebook is graded again without it, so the statements before and after it count.
STUDENT_CELL = 30   # a cell the student writes
BOOK_CELL = 600     # the book's own (read-only) cells, which train small models in some chapters
CHECK_CALL = 10     # one call of the student's function by a check
NOTEBOOK = 1800     # a whole notebook, all its runs together; the cells after it are not run

# Limits of each submission's kernel, and of what its output may cost the grader.
MEMORY_MB = 4096         # address space of the kernel
PROCESSES = 64           # processes and threads of the kernel
CELL_OUTPUT = 100_000    # characters of output kept per cell; the rest is cut, with a note
NOTEBOOK_OUTPUT = 1_000_000  # characters of output kept per notebook

# Each submission's kernel runs in a bubblewrap sandbox as an unprivileged user: it sees the Python environment, the
# book's package without its course code, the data and the book's models and results, all read-only, and a copy of
# its own submission; no course folder, gradebook, solutions or network. Set this to False only to try the course on
# a machine without bubblewrap, never to grade a class.
SANDBOX = {sandbox}


def cell_timeout(cell):
    meta = cell.metadata.get("nbgrader", {{}})
    book = meta.get("locked") and not meta.get("grade") and not meta.get("solution")
    return BOOK_CELL if book else STUDENT_CELL


c.Execute.timeout_func = cell_timeout
c.Execute.interrupt_on_timeout = True
c.Execute.sandbox = SANDBOX
c.Execute.notebook_seconds = NOTEBOOK
c.Execute.cell_output = CELL_OUTPUT
c.Execute.notebook_output = NOTEBOOK_OUTPUT
c.SandboxKernelManager.memory_mb = MEMORY_MB
c.SandboxKernelManager.processes = PROCESSES
c.Execute.extra_arguments = ["--IPKernelApp.log_level=ERROR", "--HistoryManager.hist_file=:memory:"]
os.environ["AIAYN_CHECK_SECONDS"] = str(CHECK_CALL)
warnings.filterwarnings("ignore", category=SAWarning)  # nbgrader 0.9's gradebook session warns on every autograde

# A submission holding a symbolic link, a hard link or a device file is not graded, and nothing of it is read. Every
# nbgrader cell of a submission takes its metadata (points, read-only, graded) from the gradebook; nbgrader's
# OverwriteCells then restores the read-only and graded cells' source. The book's Execute runs each check in this
# process, on the student's results sent back from the kernel as data.
refuse_odd_submissions()
c.Autograde.sanitize_preprocessors = [ClearOutput, DeduplicateIds, OverwriteKernelspec, RestoreCells,
                                      OverwriteCells, CheckCellMetadata]
c.Autograde.autograde_preprocessors = [Execute, IgnorePattern, ClearMetadataPreprocessor, LimitOutput,
                                       SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
c.ClearMetadataPreprocessor.preserve_cell_metadata_mask = [("nbgrader",), ("aiayn",)]
'''


def notebook_path(name) -> Path:
    """A notebook with exercises, by path or by name: "label_smoothing", "02_attention" or "attention"."""
    if Path(name).is_file():
        return Path(name)
    found = sources()
    for path in found:
        if str(name) in (path.stem, path.name, _slug(path.stem)):
            return path
    raise FileNotFoundError(f"no notebook with exercises named {name}; they are: {', '.join(p.stem for p in found)}")


def write_course(root: Path, notebooks=None, link: bool = False, sandbox: bool = True) -> list[str]:
    """Write an nbgrader course: ``root/nbgrader_config.py`` (unless one exists) and
    ``root/source/<assignment>/<assignment>.ipynb`` for every notebook with exercises. Returns the assignment ids.
    With ``sandbox`` (the default), the machine must be able to run bubblewrap: grading a class needs it."""
    import nbformat

    from aiayn.course.grader import sandbox_problem

    problem = sandbox and sandbox_problem()
    if problem:
        raise ValueError(
            f"submissions are graded in a sandbox, and {problem}. Install it, or write the course with "
            "--no-sandbox to try the course out (never to grade a class: a submission could then change the "
            "checks, the gradebook and other students' grades)"
        )

    root = Path(root)
    registry = ASSIGNMENTS
    written = []
    for path in list(map(notebook_path, notebooks)) if notebooks else sources():
        nb = source_notebook(nbformat.read(path, as_version=4), path.stem, link, registry)
        folder = root / "source" / path.stem
        folder.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, folder / path.name)
        written.append(path.stem)
    config = root / "nbgrader_config.py"
    if not config.exists():
        config.write_text(NBGRADER_CONFIG.format(sandbox=sandbox))
    return written


# ----------------------------------------------------------------------------------------------------------
# After nbgrader autograde: a line per submission
# ----------------------------------------------------------------------------------------------------------


def _error(cell) -> str:
    """The error a cell of an autograded notebook ended with: "timed out", its message, or ""."""
    for out in cell.get("outputs", []):
        if out.get("output_type") == "error" and out.get("ename") != "KeyboardInterrupt":
            if out["ename"] == "CellTimeoutError":
                return "timed out"
            if out["ename"] == "CellStopped":
                return f"stopped: {out.get('evalue', '')}"
            lines = str(out.get("evalue", "")).strip().splitlines()
            return f"{out['ename']}: {lines[0] if lines else ''}" if out["ename"] != "Failed" else lines[0]
    return ""


def _detail(text: str) -> str:
    """A detail line of the report, indented under the submission's line and wrapped at 79 characters."""
    import textwrap

    return textwrap.fill(text, 79, initial_indent=" " * 16, subsequent_indent=" " * 18)


def _cell_lines(nb) -> list[str]:
    """The report's lines about the cells of one graded notebook: stops, cut output, failed checks and flags."""
    failed, flags, stopped_at, lines = [], {}, None, []
    for i, cell in enumerate(nb.cells):
        meta, error = cell.metadata.get("nbgrader", {}), _error(cell)
        mine = cell.metadata.get("aiayn", {})
        for flag in (mine.get("check", {}).get("flags") or []) + (mine.get("flags") or []):
            flags.setdefault(flag, []).append(meta.get("grade_id", f"cell {i}"))
        text = "".join(o.get("text", "") for o in cell.get("outputs", []))
        if mine.get("stopped"):
            lines.append(_detail(f"cell {i} {mine['stopped']}; run again one statement at a time"))
        if error == "timed out":
            lines.append(_detail(f"cell {i} stopped by the time limit; the cells after it ran"))
        elif error.startswith("stopped: "):
            lines.append(_detail(error.removeprefix("stopped: ") + "; graded again without it"))
        elif error.startswith("NotebookTimeLimit") and not stopped_at:
            stopped_at = i
            lines.append(_detail(f"cell {i} and the cells after it {error.split(': ', 1)[1]}"))
        if "[output cut: past the " in text:
            lines.append(_detail(f"cell {i}: its output was cut at the {text.split('past the ')[1][:-2]}"))
        if error and not error.startswith("stopped: ") and meta.get("grade"):
            failed.append((meta["grade_id"], error))
    if len(failed) > 2 and len({e for _, e in failed}) == 1:
        lines.append(_detail(f"{len(failed)} graded cells failed: {failed[0][1]}"))
    else:
        lines += [_detail(f"{key}: {error}") for key, error in failed]
    lines += [_detail(f"FLAG {flag} ({', '.join(where)}): read this submission") for flag, where in flags.items()]
    return lines


def report(root: Path, assignment: str) -> list[str]:
    """After ``nbgrader autograde``: a line per submission of ``assignment`` in the course at ``root`` with its points,
    then a line for each graded cell that lost its points (and why), each cell stopped by the time limit, each change
    the grader made to the submission's nbgrader metadata, and the reason a submission could not be graded."""
    import nbformat
    from nbgrader.api import Gradebook, MissingEntry

    from aiayn.course.grader import instructor_cells, odd_files, restore

    root = Path(root).resolve()
    if not (root / "gradebook.db").exists():
        raise FileNotFoundError(f"no gradebook.db in {root}: run `nbgrader autograde {assignment}` there first")
    lines = []
    with Gradebook(f"sqlite:///{root / 'gradebook.db'}") as gb:
        try:
            a = gb.find_assignment(assignment)
        except MissingEntry:
            raise ValueError(
                f"the gradebook has no assignment {assignment!r}; it has "
                f"{', '.join(x.name for x in gb.assignments) or 'none'}"
            ) from None
        if not (root / "submitted").is_dir():
            raise FileNotFoundError(
                f"no submitted/ folder in {root}: submissions go in submitted/<student>/{assignment}/"
            )
        students = sorted(p.name for p in (root / "submitted").iterdir() if (p / assignment).is_dir())
        for student in students:
            for name in sorted(nb.name for nb in a.notebooks):
                graded = root / "autograded" / student / assignment / f"{name}.ipynb"
                submitted = root / "submitted" / student / assignment / f"{name}.ipynb"
                odd = odd_files(submitted.parent)
                if odd:
                    lines.append(f"{student:14} {'-':>5} / {a.max_score:g}  not graded: {odd[0]}")
                    continue
                try:
                    notes = restore(nbformat.read(submitted, as_version=4), instructor_cells(gb, name, assignment))
                except FileNotFoundError:
                    lines.append(f"{student:14} {'-':>5} / {a.max_score:g}  not graded: nothing submitted")
                    continue
                except Exception as err:  # why nbgrader could not grade it
                    why = f"{type(err).__name__}: {str(err).strip().splitlines()[0]}"
                    lines.append(f"{student:14} {'-':>5} / {a.max_score:g}  not graded: {why[:80]}")
                    continue
                if not graded.exists():
                    lines.append(f"{student:14} {'-':>5} / {a.max_score:g}  not graded: see nbgrader autograde's log")
                    continue
                try:
                    score = gb.find_submission_notebook(name, assignment, student).score
                except MissingEntry:
                    score = 0.0
                lines.append(f"{student:14} {score:5g} / {a.max_score:g}")
                lines += [_detail(note) for note in notes]
                lines += _cell_lines(nbformat.read(graded, as_version=4))
                if score > a.max_score:
                    lines.append(_detail(f"FLAG {score:g} points of {a.max_score:g}: the gradebook was changed"))
    return lines


DEMO = {  # three made-up submissions of the label_smoothing assignment, for trying the course out
    "alice": """def my_label_smoothing(logits, target, eps_ls, pad_id):
    V = logits.size(-1)
    q = torch.full_like(logits, eps_ls / (V - 1))
    q[..., pad_id] = 0.0
    q.scatter_add_(-1, target[..., None], torch.full_like(logits[..., :1], 1.0 - eps_ls))
    return -(q * logits.log_softmax(-1)).sum(-1).masked_fill(target == pad_id, 0.0).sum()""",
    "bob": """def my_label_smoothing(logits, target, eps_ls, pad_id):
    V = logits.size(-1)
    q = torch.full_like(logits, eps_ls / (V - 2))
    q[..., pad_id] = 0.0
    q.scatter_(-1, target[..., None], 1.0 - eps_ls)
    return -(q * logits.log_softmax(-1)).sum(-1).masked_fill(target == pad_id, 0.0).sum()""",
    "carol": None,  # submitted as released
}


def demo_submissions(root: Path, assignment: str = "label_smoothing") -> list[Path]:
    """Write DEMO's submissions into ``root/submitted/<student>/<assignment>/``, from the released notebook."""
    import nbformat

    root = Path(root)
    release = root / "release" / assignment / f"{assignment}.ipynb"
    if assignment != "label_smoothing":
        raise ValueError("the demo submissions answer the label_smoothing assignment only")
    if not release.exists():
        raise FileNotFoundError(f"{release} does not exist: run `nbgrader generate_assignment {assignment}` first")
    written = []
    for student, answer in DEMO.items():
        nb = nbformat.read(release, as_version=4)
        for cell in nb.cells:
            if answer and cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = answer
        path = root / "submitted" / student / assignment / release.name
        path.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, path)
        written.append(path)
    return written


# ----------------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiayn.course", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the coding exercises, their checks and points")
    c = sub.add_parser("course", help="write an nbgrader course directory from the book's exercises")
    c.add_argument("root", type=Path, help="the course directory (created if needed)")
    c.add_argument("notebooks", nargs="*", help="names or paths (default: every notebook with coding exercises)")
    c.add_argument(
        "--no-sandbox",
        action="store_true",
        help="grade without the bubblewrap sandbox (to try the course out, never to grade a class)",
    )
    c.add_argument(
        "--link-chapters",
        action="store_true",
        help="link each student notebook to its chapter (which shows the solutions)",
    )
    r = sub.add_parser("report", help="after nbgrader autograde: one line per submission")
    r.add_argument("assignment")
    r.add_argument("--course", type=Path, default=Path("."), help="the course directory (default: here)")
    d = sub.add_parser("demo", help="three made-up submissions of label_smoothing, to try the course out")
    d.add_argument("assignment", choices=["label_smoothing"])
    d.add_argument("--course", type=Path, default=Path("."), help="the course directory (default: here)")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            import nbformat

            registry = ASSIGNMENTS
            for path in sources():
                for e in find_exercises(nbformat.read(path, as_version=4), path.stem, registry):
                    graded = (
                        ", ".join(
                            f"{k} ({registry[k].points} point{'s' * (registry[k].points != 1)})" for k in e.assignments
                        )
                        or "its test cell (1 point)"
                    )
                    print(f"{path.stem:24} ex. {e.number or '?':>2}  {', '.join(e.names):22} graded by {graded}")
            print("\nChecks:")
            for a in registry.values():
                print(f"  {a.key} ({a.points} points{f', about {a.minutes} min' if a.minutes else ''}): {a.signature}")
                for chk in a.checks:
                    print(f"    {chk.points}  {chk.key:13} {chk.what}")
        elif args.command == "course":
            written = write_course(args.root, args.notebooks, args.link_chapters, not args.no_sandbox)
            print(
                f"wrote {len(written)} assignment{'s' * (len(written) != 1)} to {args.root / 'source'}: "
                f"{', '.join(written)}"
            )
            print(f"next: cd {args.root} && nbgrader generate_assignment {written[0] if written else '<assignment>'}")
        elif args.command == "demo":
            for path in demo_submissions(args.course, args.assignment):
                print(f"wrote {path.relative_to(args.course)}")
        else:
            for line in report(args.course, args.assignment):
                print(line)
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
