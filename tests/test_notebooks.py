"""Every chapter is a well-formed, standalone notebook with the book's structure."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "book").glob("*.ipynb"))
REPO_URL = re.search(r"url: (https://github.com/\S+)", (ROOT / "_config.yml").read_text()).group(1)


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
    assert 'if importlib.util.find_spec("aiayn") is None:' in text(setup)
    assert f'"{REPO_URL}"' in text(setup) and 'git", "clone' in text(setup)
    assert "remove-cell" in setup["metadata"].get("tags", []), (
        f"{path.name}: tag the set-up cell `remove-cell`, so the page starts with the title"
    )


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


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_chapter_structure(path):
    markdown = "\n".join(text(c) for c in cells(path) if c["cell_type"] == "markdown")
    assert re.search(r"^# §", markdown, re.M), "the title names the paper's section"
    assert "**Paper, §" in markdown, "the chapter quotes the paper, marked as the paper's"
    assert re.search(r"^## Summary", markdown, re.M) and re.search(r"^## Exercises", markdown, re.M)
