"""The package is generated from the chapters' export cells; it must match them exactly."""
import json

from aiayn import _export


def test_package_in_sync_with_chapters(capsys):
    assert _export.main(["--check"]) == 0, capsys.readouterr().err


def test_export_collects_marked_cells_in_order(tmp_path):
    cells = [
        {"cell_type": "code", "source": "#| default_exp toy\nimport math"},
        {"cell_type": "markdown", "source": "#| export\nnot code"},
        {"cell_type": "markdown", "source": "## The toy\n\nProse."},
        {"cell_type": "code", "source": "#| export\ndef f():\n    return 1\n"},
        {"cell_type": "code", "source": "print('not exported')"},
        {"cell_type": "code", "source": ["#| export other\n", "X = 2"]},
        {"cell_type": "code", "source": "#| export\ndef g():\n    return 2"},
    ]
    (tmp_path / "01_toy.ipynb").write_text(json.dumps({"cells": cells}))
    modules = _export.collect(tmp_path)
    where = "# book/01_toy.ipynb: The toy\n"  # the chapter and section each block comes from
    assert modules == {"toy": (["book/01_toy.ipynb"], [where + "def f():\n    return 1", where + "def g():\n    return 2"]),
                       "other": (["book/01_toy.ipynb"], [where + "X = 2"])}
    text = _export.render(*modules["toy"])
    assert text.startswith("# Generated from book/01_toy.ipynb")
    assert text.endswith("def g():\n    return 2\n")
