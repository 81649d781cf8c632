"""Course assignments from the book's exercises, graded by nbgrader.

A coding exercise is a code cell after a chapter's "Exercises" heading with its reference solution between nbgrader's
markers (``### BEGIN SOLUTION`` / ``### END SOLUTION``); the code cell after it, the chapter's own test, is a first
try for the student. This module knows which exercises exist and what they are worth, and writes an nbgrader course
from them: one assignment per notebook, whose graded cells are the checks of ``aiayn/course/checks.py`` (one cell per
check, with its points; every exercise needs registered checks). nbgrader does the rest, with each submission's
kernel in a bubblewrap sandbox and every check run in the grader's own process (``aiayn.course.grader``), so that no
point is decided where the student's code runs:

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
    """Top-level functions, classes and assigned names of a cell, in order (none when it is not Python)."""
    try:
        body, names = ast.parse(source).body, []
    except SyntaxError:
        return []
    for node in body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
    return names


def has_solution(source: str) -> bool:
    return any(line.strip() == BEGIN for line in source.splitlines())


def _solution_cells(cells) -> list[int]:
    return [i for i, c in enumerate(cells) if c.cell_type == "code" and has_solution(c.source)]


@dataclass
class Exercise:
    """A coding exercise: its solution cell, the chapter's test cell after it, and the checks that grade it."""

    notebook: str  # file stem, e.g. "02_attention"
    number: int | None  # the exercise's number in the chapter's list
    solution_cell: int
    test_cell: int | None
    names: list[str]  # what the solution cell defines
    assignments: list[str]  # keys of aiayn.checks.ASSIGNMENTS that grade it (none: no course can be written)

    @property
    def grade_id(self) -> str:
        return self.names[0] if self.names else f"cell{self.solution_cell}"


def exercises_heading(nb) -> int:
    """Index of the markdown cell with the "Exercises" heading; every coding exercise comes after it."""
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown" and re.search(r"^#+\s*Exercises", cell.source, re.M):
            return i
    raise ValueError("no '## Exercises' heading: coding exercises go in a notebook's Exercises section")


def find_exercises(nb, notebook: str) -> list[Exercise]:
    """The coding exercises of a notebook: cells with solution markers after the Exercises heading."""
    start = exercises_heading(nb) if _solution_cells(nb.cells) else len(nb.cells)
    if early := _solution_cells(nb.cells[:start]):
        raise ValueError(f"{notebook}: cells {early} have solution markers before the Exercises heading")
    found, number = [], None
    for i, cell in list(enumerate(nb.cells))[start:]:
        numbers = re.findall(r"^\s*(\d+)\.\s", cell.source, re.M) if cell.cell_type == "markdown" else []
        number = int(numbers[-1]) if numbers else number
        if cell.cell_type != "code" or not has_solution(cell.source):
            continue
        test = next((j for j in range(i + 1, len(nb.cells)) if nb.cells[j].cell_type == "code"), None)
        test = None if test is None or has_solution(nb.cells[test].source) else test
        names = _defined_names(cell.source)
        graded = [a.key for a in ASSIGNMENTS.values() if a.notebook == _slug(notebook) and set(a.names) & set(names)]
        found.append(Exercise(notebook, number, i, test, names, graded))
    return found


def sources(book: Path = BOOK, course: Path = COURSE) -> list[Path]:
    """Every notebook with coding exercises: the chapters, then the assignment notebooks of course/."""
    import nbformat

    paths = sorted(book.glob("[0-9]*.ipynb")) + sorted(course.glob("*.ipynb"))
    return [p for p in paths if _solution_cells(nbformat.read(p, as_version=4).cells)]


# ----------------------------------------------------------------------------------------------------------
# nbgrader source notebooks
# ----------------------------------------------------------------------------------------------------------

CHECK_CELL = """\
# Check, {points} point{s}: {what}
from aiayn.course.checks import check
check("{assignment}", "{key}", globals())"""


def _meta(grade_id: str, *, solution=False, grade=False, locked=False, points=0) -> dict:
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3, "solution": solution}
    return meta | ({"points": points} if grade else {})


def _header(notebook: str, link: bool) -> str:
    text = (
        "**How this assignment works.** Write your code where a cell says `# YOUR CODE HERE`, in place of the "
        "`raise NotImplementedError()` line, and keep the names of the functions. The graded cells are the "
        "cells that start with `# Check`: each earns its points when it runs without an error, and when it does "
        "not, its message says what is wrong. The cell right after your answer, the book's own test, is a first "
        "try, worth no points. The book's other cells are read-only: the grader runs them as they are here. "
        "A cell that runs too long is stopped and the next ones still run. Before you submit, restart the "
        "kernel and run the whole notebook."
    )
    folder = "course" if (COURSE / f"{notebook}.ipynb").exists() else "book"
    url = f"https://colab.research.google.com/github/{REPO}/blob/main/{folder}/{notebook}.ipynb"
    return text + (f" The book's chapter is [here]({url})." if link else "")


def source_notebook(nb, notebook: str, link: bool = False):
    """The nbgrader source notebook (the instructor's copy) of a chapter or course notebook: the book's code cells
    read-only, solution cells marked, one graded cell per check, and a header for the student. Every exercise must
    have registered checks: no point is decided by a cell that runs in the student's kernel."""
    import nbformat

    nb = copy.deepcopy(nb)
    exercises, start = find_exercises(nb, notebook), exercises_heading(nb)
    if unchecked := [ex for ex in exercises if not ex.assignments]:
        raise ValueError(
            f"{notebook}: no checks grade exercise "
            + ", ".join(f"{ex.number or '?'} ({', '.join(ex.names) or f'cell {ex.solution_cell}'})" for ex in unchecked)
            + f": register checks in aiayn/course/checks.py, an _assignment with notebook {_slug(notebook)!r} and "
            "one of the names its solution cell defines"
        )
    for i, cell in enumerate(nb.cells):
        cell.metadata.pop("execution", None), cell.metadata.pop("mystnb", None)
        tags = [t for t in cell.metadata.pop("tags", []) if not t.startswith(("hide-", "remove-"))]
        cell.metadata |= {"tags": tags} if tags else {}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
            if i < start:  # the book's code: read-only, and run with the long time limit
                cell.metadata["nbgrader"] = _meta(f"book_{i}", locked=True)
    for ex in reversed(exercises):  # from the last, so that inserted cells move no index still to come
        nb.cells[ex.solution_cell].metadata["nbgrader"] = _meta(ex.grade_id, solution=True)
        cells = []  # the checks, after the chapter's own test cell, which stays, ungraded, as a first try
        for key, c in [(key, c) for key in ex.assignments for c in ASSIGNMENTS[key].checks]:
            text = dict(points=c.points, s="s" * (c.points != 1), what=c.what, assignment=key, key=c.key)
            cells.append(nbformat.v4.new_code_cell(CHECK_CELL.format(**text)))
            cells[-1].metadata["nbgrader"] = _meta(f"{key}_{c.key}", grade=True, locked=True, points=c.points)
        at = (ex.test_cell if ex.test_cell is not None else ex.solution_cell) + 1
        nb.cells[at:at] = cells
    nb.cells.insert(1, nbformat.v4.new_markdown_cell(_header(notebook, link)))
    nb.metadata.pop("widgets", None)
    nbformat.validate(nb)
    return nb


NBGRADER_CONFIG = Path(__file__).with_name("nbgrader_config.py")  # a new course's configuration


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

    if problem := sandbox and sandbox_problem():
        raise ValueError(
            f"submissions are graded in a sandbox, and {problem}. Install it, or write the course with "
            "--no-sandbox to try the course out (never to grade a class: a submission could then change the "
            "checks, the gradebook and other students' grades)"
        )

    written = []
    paths = list(map(notebook_path, notebooks)) if notebooks else sources()
    made = [source_notebook(nbformat.read(path, as_version=4), path.stem, link) for path in paths]  # all, or none
    for path, nb in zip(paths, made):
        (Path(root) / "source" / path.stem).mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, Path(root) / "source" / path.stem / path.name)
        written.append(path.stem)
    config = Path(root) / "nbgrader_config.py"
    if not config.exists():
        config.write_text(NBGRADER_CONFIG.read_text().replace("SANDBOX = True", f"SANDBOX = {sandbox}"))
    return written


def demo_submissions(root: Path, assignment: str = "label_smoothing") -> list[Path]:
    """Made-up submissions, to try the course out: for each ``course/demo/<assignment>/<student>.py``, the released
    notebook with that answer in its solution cell (an empty file: handed in as released), written to
    ``root/submitted/<student>/<assignment>/``."""
    import nbformat

    release = Path(root) / "release" / assignment / f"{assignment}.ipynb"
    if not release.exists():
        raise FileNotFoundError(f"{release} does not exist: run `nbgrader generate_assignment {assignment}` first")
    written = []
    for answer in sorted((COURSE / "demo" / assignment).glob("*.py")):
        nb = nbformat.read(release, as_version=4)
        for cell in nb.cells:
            if answer.read_text().strip() and cell.metadata.get("nbgrader", {}).get("solution"):
                cell.source = answer.read_text().strip()
        written.append(Path(root) / "submitted" / answer.stem / assignment / release.name)
        written[-1].parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, written[-1])
    return written


# ----------------------------------------------------------------------------------------------------------


def _list() -> None:
    """Every coding exercise with what grades it, then every assignment's checks and their points."""
    import nbformat

    def pts(n):
        return f"{n} point{'s' * (n != 1)}"

    for path in sources():
        for e in find_exercises(nbformat.read(path, as_version=4), path.stem):
            graded = ", ".join(f"{k} ({pts(ASSIGNMENTS[k].points)})" for k in e.assignments)
            print(f"{path.stem:24} ex. {e.number or '?':>2}  {', '.join(e.names):22} graded by ", end="")
            print(graded or "nothing: register checks in aiayn/course/checks.py")
    print("\nChecks:")
    for a in ASSIGNMENTS.values():
        print(f"  {a.key} ({pts(a.points)}{f', about {a.minutes} min' if a.minutes else ''}): {a.signature}")
        for chk in a.checks:
            print(f"    {chk.points}  {chk.key:13} {chk.what}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m aiayn.course", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list", help="the coding exercises, their checks and points")
    c = sub.add_parser("course", help="write an nbgrader course directory from the book's exercises")
    c.add_argument("root", type=Path, help="the course directory (created if needed)")
    c.add_argument("notebooks", nargs="*", help="names or paths (default: every notebook with coding exercises)")
    c.add_argument("--no-sandbox", action="store_true", help="grade without the bubblewrap sandbox (to try the "
                   "course out, never to grade a class)")  # fmt: skip
    c.add_argument("--link-chapters", action="store_true", help="link each student notebook to its chapter (which "
                   "shows the solutions)")  # fmt: skip
    r = sub.add_parser("report", help="after nbgrader autograde: one line per submission")
    d = sub.add_parser("demo", help="made-up submissions (course/demo/<assignment>/), to try the course out")
    r.add_argument("assignment")
    d.add_argument("assignment", choices=sorted(p.name for p in (COURSE / "demo").iterdir()))
    for p in (r, d):
        p.add_argument("--course", type=Path, default=Path("."), help="the course directory (default: here)")
    args = parser.parse_args(argv)
    try:
        if args.command == "list":
            _list()
        elif args.command == "course":
            written = write_course(args.root, args.notebooks, args.link_chapters, not args.no_sandbox)
            print(f"wrote {len(written)} assignment{'s' * (len(written) != 1)} to {args.root / 'source'}: "
                  f"{', '.join(written)}\nnext: cd {args.root} && nbgrader generate_assignment "
                  f"{written[0] if written else '<assignment>'}")  # fmt: skip
        elif args.command == "demo":
            for path in demo_submissions(args.course, args.assignment):
                print(f"wrote {path.relative_to(args.course)}")
        else:
            from aiayn.course.grader import report

            print("\n".join(report(args.course, args.assignment)))
    except (FileNotFoundError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
