"""The package is generated from the chapters' export cells; it must match them exactly."""

import json

import pytest

from aiayn import _export


def test_package_in_sync_with_chapters(capsys):
    assert _export.main(["--check"]) == 0, capsys.readouterr().err


def test_export_collects_tagged_cells_in_order(tmp_path):
    def code(source, *tags):
        return {"cell_type": "code", "metadata": {"tags": list(tags)}, "source": source}

    cells = [
        code("import math"),
        {"cell_type": "markdown", "metadata": {"tags": ["export"]}, "source": "not code"},
        {"cell_type": "markdown", "source": "## The toy\n\nProse."},
        code("def f():\n    return 1\n", "export"),
        code("print('not exported')", "nbval-check-output"),
        code(["X = 2"], "export:other"),
        code("def g():\n    return 2", "hide-input", "export"),
    ]
    notebook = {"cells": cells, "metadata": {"aiayn": {"default_exp": "toy"}}}
    (tmp_path / "01_toy.ipynb").write_text(json.dumps(notebook))
    modules = _export.collect(tmp_path)
    where = "# book/01_toy.ipynb: The toy\n"  # the chapter and section each block comes from
    assert modules == {
        "toy": (["book/01_toy.ipynb"], [where + "def f():\n    return 1", where + "def g():\n    return 2"]),
        "other": (["book/01_toy.ipynb"], [where + "X = 2"]),
    }
    text = _export.render(*modules["toy"])
    assert text.startswith("# Generated from book/01_toy.ipynb")
    assert text.endswith("def g():\n    return 2\n")


def test_a_chapter_shows_no_marker_comments():
    """The marks for nbval and the exporter are cell tags: the reader's code carries no marker comments."""
    for path in sorted(_export.BOOK.glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            source = _export._source(cell)
            assert "NBVAL_" not in source and "#| " not in source, (path.name, source[:80])


def test_the_formatter_leaves_exactly_the_generated_modules_alone():
    """ruff formats the hand-written code; the modules the chapters write keep the chapters' form."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    config = tomllib.loads((_export.ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["ruff"]
    excluded = {p for p in config["extend-exclude"] if p.startswith("aiayn/")}
    assert excluded == {f"aiayn/{name}.py" for name in _export.generated_files()}
    # a bare name excludes every file and folder of that name ("course", the assignments', once hid aiayn/course/)
    names = {p for p in config["extend-exclude"] if "/" not in p}
    assert not names & {part for path in _export.PACKAGE.rglob("*.py") for part in path.relative_to(_export.ROOT).parts}


def test_no_function_outside_the_checks_is_longer_than_80_lines():
    """A function a maintainer reads in one screen; the checks (long tables of cases) excepted."""
    import ast

    long = []
    for path in sorted(_export.PACKAGE.rglob("*.py")):  # every folder of the package
        if path.name == "checks.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno - node.lineno >= 80:
                long.append(f"{path.name}:{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not long, long


MACHINERY = {"experiment", "variations", "plan", "browser", "runs", "course"}  # what runs experiments and grades
READERS = {"pretrained", "data", "corpus", "glue"}  # what readers and chapters load, beside the generated
COMMANDS = {"experiment", "variations", "plan", "browser"}  # the recorded commands: python -m aiayn.<name>
SITE = {"_book", "_export"}  # the book's own tools: execute the chapters, write the generated modules


def test_the_top_level_holds_the_chapters_readers_and_commands():
    """The layout's one rule: the top level holds what the chapters write, what a chapter or a reader imports, and
    the recorded commands; the machinery they share lives in runs/, the grading in course/."""
    top = {p.stem for p in _export.PACKAGE.glob("*.py")} - {"__init__"}
    generated = {p.stem for p in _export.PACKAGE.glob("*.py") if p.read_text().startswith("# Generated from book/")}
    assert top - generated - READERS - COMMANDS - SITE == set()
    folders = {p.name for p in _export.PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert folders == {"runs", "course"}


def test_no_chapter_imports_the_machinery_folders():
    """A chapter imports what the book builds and the recorded commands it explains, never runs/ or course/."""
    import re

    found = []
    for path in sorted((_export.ROOT / "book").glob("*.ipynb")):
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            source = "".join(cell["source"]) if cell["cell_type"] == "code" else ""
            imports = re.findall(r"^.*\b(?:import|from) aiayn\.(?:runs|course)\b.*$", source, re.M)
            found += [f"{path.name}: {line}" for line in imports]
    assert not found, found


def loaded_by(modules) -> set[str]:
    """The package's modules that importing ``modules`` (names in aiayn) loads, in a fresh interpreter."""
    import subprocess
    import sys

    imports = "; ".join(f"import aiayn.{name}" for name in sorted(modules))
    code = f"import sys, json; {imports}; print(json.dumps([m for m in sys.modules if m.startswith('aiayn.')]))"
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {m.split(".")[1] for m in json.loads(loaded)}


def test_what_readers_load_imports_no_machinery():
    """The chapters' modules and the ones a reader imports (the shipped models, the data, the results pages) load
    nothing that runs experiments or grades: the attention analysis lives with the model loader, the cache paths with
    the data."""
    generated = {p.stem for p in _export.PACKAGE.glob("*.py") if p.read_text().startswith("# Generated from book/")}
    assert generated, "the chapters' modules start with '# Generated from book/'"
    found = MACHINERY & loaded_by(generated | READERS)
    assert not found, f"{sorted(found)} loaded by the chapters' modules or {sorted(READERS)}"


def test_the_results_pages_import_nothing_that_trains():
    assert not {"training", "experiment", "plan", "variations"} & loaded_by({"results", "glue"})
