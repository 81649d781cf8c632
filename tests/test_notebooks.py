"""Every chapter is a well-formed, standalone notebook with the book's structure."""

import ast
import json
import re
import sys
from pathlib import Path

import pytest

from aiayn._book import SETUP_CELL, code_digest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))
REPO_URL = re.search(r"url: (https://github.com/\S+)", (ROOT / "_config.yml").read_text()).group(1)
# the distribution that provides an imported module, where the two names differ
DISTRIBUTIONS = {"IPython": "ipython", "PIL": "pillow", "sklearn": "scikit-learn", "yaml": "pyyaml"}


def cells(path):
    return json.loads(path.read_text(encoding="utf-8"))["cells"]


def text(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_title_then_set_up_cell(path):
    """Every chapter opens the same way: the title and the paper's words (cell 0, Markdown), then the cell that
    installs the package when it is missing (cell 1, tagged remove-cell, so readers of the website never see it)."""
    title, setup = cells(path)[:2]
    assert title["cell_type"] == "markdown" and re.match(r"# §\S+ \S", text(title)), (
        f"{path.name}: cell 0 must be the title, '# §x.y Title', followed by the paper's words"
    )
    assert "**Paper, §" in text(title), f"{path.name}: the title cell quotes the paper, marked **Paper, §x.y:**"
    assert setup["cell_type"] == "code", f"{path.name}: cell 1 must be the set-up code cell"
    assert text(setup) == SETUP_CELL, f"{path.name}: run `python -m aiayn._book set-up` to write the set-up cell"
    assert "remove-cell" in setup["metadata"].get("tags", []), (
        f"{path.name}: tag the set-up cell `remove-cell`, so the page starts with the title"
    )


def test_set_up_cell_clones_the_book():
    assert 'if importlib.util.find_spec("aiayn") is None:' in SETUP_CELL
    assert f'"{REPO_URL}"' in SETUP_CELL and 'git", "clone' in SETUP_CELL
    assert '"-e", "aiayn-book[book]"' in SETUP_CELL  # with the libraries the chapters import


def imported(source: str) -> set[str]:
    """The top-level modules a cell imports (lines of IPython magic or shell left out)."""
    code = "\n".join(line for line in source.splitlines() if not line.lstrip().startswith(("%", "!")))
    names = set()
    for node in ast.walk(ast.parse(code)):
        if isinstance(node, ast.Import):
            names |= {alias.name.partition(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.partition(".")[0])
    return names


def distribution(requirement: str) -> str:
    return re.match(r"[A-Za-z0-9._-]+", requirement).group(0).lower().replace("_", "-")


def test_book_extra_is_what_the_chapters_import():
    """pyproject's `book` extra, which the set-up cell installs, holds exactly the distributions the chapters import
    beyond the package's own dependencies; requirements.txt (the book's build and tests) holds them too."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    modules = {name for path in CHAPTERS for c in cells(path) if c["cell_type"] == "code" for name in imported(text(c))}
    modules -= set(sys.stdlib_module_names) | {"aiayn"}
    needed = {distribution(DISTRIBUTIONS.get(name, name)) for name in modules}
    needed -= {distribution(r) for r in project["dependencies"]}
    extra = {distribution(r) for r in project["optional-dependencies"]["book"]}
    assert extra == needed, f"the chapters import {sorted(needed)}; the `book` extra holds {sorted(extra)}"
    lines = (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
    required = {distribution(line) for line in lines if line.strip() and not line.startswith("#")}
    assert extra <= required, f"requirements.txt lacks {sorted(extra - required)}"


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_in_table_of_contents(path):
    assert f"file: book/{path.stem}\n" in (ROOT / "_toc.yml").read_text()


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_stored_outputs_are_clean(path):
    assert path.stat().st_size < 3_000_000, "large outputs belong in results/ or as compact figures"
    for i, cell in enumerate(cells(path)):
        if cell["cell_type"] != "code":
            continue
        if text(cell).strip():
            assert cell["execution_count"] is not None, f"cell {i} was never run: run `make outputs`"
        assert not any(o["output_type"] == "error" for o in cell["outputs"]), f"cell {i} stored an error"
    nb = json.loads(path.read_text(encoding="utf-8"))
    assert nb["metadata"].get("aiayn", {}).get("executed", {}).get("code") == code_digest(nb), (
        f"{path.name}: its code changed since its outputs were stored, and the site shows the stored outputs: run "
        f"`python -m aiayn._book execute book/{path.name}`"
    )


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_structure(path):
    markdown = "\n".join(text(c) for c in cells(path) if c["cell_type"] == "markdown")
    assert re.search(r"^# §", markdown, re.M), "the title names the paper's section"
    assert "**Paper, §" in markdown, "the chapter quotes the paper, marked as the paper's"
    assert re.search(r"^## Summary", markdown, re.M) and re.search(r"^## Exercises", markdown, re.M)
