"""Write the chapters' export cells into the package: the code a reader sees is the code that runs.

A chapter names its module once, in its notebook metadata (``"aiayn": {"default_exp": "attention"}``). Every code
cell tagged ``export`` (or ``export:other_module``) is copied, in order, into ``aiayn/<module>.py``, under a comment
that names its chapter and section, so that a reader of the module finds the prose. The marks are cell tags, not
comments, so that the reader's code shows only the idea; the site labels the exported cells "package code".

    python -m aiayn._export           # regenerate the package from book/*.ipynb
    python -m aiayn._export --check   # exit 1 if the package differs from the chapters

Not about the paper: a tool of the book's build. What it copies is the chapters' code (book/), the one source of truth.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from aiayn import ROOT

BOOK, PACKAGE = ROOT / "book", ROOT / "aiayn"
HEADER = "# Generated from {sources} by `python -m aiayn._export`. Edit the chapter, not this file.\n"
_HEADING = re.compile(r"^#{1,4}\s+(.+)$", re.M)


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else src


def collect(book: Path = BOOK) -> dict[str, tuple[list[str], list[str]]]:
    """Map module name -> (source notebooks, code blocks), in chapter order."""
    modules: dict[str, tuple[list[str], list[str]]] = {}
    for nb_path in sorted(book.glob("*.ipynb")):
        notebook = json.loads(nb_path.read_text(encoding="utf-8"))
        cells, default = notebook["cells"], notebook.get("metadata", {}).get("aiayn", {}).get("default_exp")
        heading = ""  # the section a cell sits in: the generated module names it above the cell's code
        for cell in cells:
            if cell["cell_type"] == "markdown":
                titles = _HEADING.findall(_source(cell))
                heading = titles[-1].strip() if titles else heading
                continue
            tags = [t for t in cell.get("metadata", {}).get("tags", []) if t == "export" or t.startswith("export:")]
            if not tags:
                continue
            module = tags[0].partition(":")[2] or default
            if module is None:
                raise SystemExit(
                    f"{nb_path.name}: a cell tagged 'export' names no module and the notebook metadata "
                    f"has no aiayn.default_exp"
                )
            body = _source(cell)
            sources, blocks = modules.setdefault(module, ([], []))
            rel = f"book/{nb_path.name}"
            if rel not in sources:
                sources.append(rel)
            where = f"# {rel}: {heading}" if heading else f"# {rel}"
            if len(where) > 79:  # the modules keep to 79 columns, as the chapters' code does
                where = where[:76] + "..."
            blocks.append(where + "\n" + body.strip("\n"))
    return modules


def render(sources: list[str], blocks: list[str]) -> str:
    return HEADER.format(sources=", ".join(sources)) + "\n" + "\n\n\n".join(blocks) + "\n"


def generated_files(package: Path = PACKAGE) -> set[str]:
    return {p.stem for p in package.glob("*.py") if p.read_text(encoding="utf-8").startswith("# Generated from ")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="only compare; exit 1 on any difference")
    args = parser.parse_args(argv)
    if not BOOK.is_dir():
        print(f"no chapters at {BOOK}: run this from a clone of the book's repository", file=sys.stderr)
        return 2
    wanted = {name: render(*parts) for name, parts in collect().items()}
    stale = generated_files() - set(wanted)
    differ = [
        n
        for n, text in wanted.items()
        if not (PACKAGE / f"{n}.py").exists() or (PACKAGE / f"{n}.py").read_text(encoding="utf-8") != text
    ]
    if args.check:
        for name in sorted(differ):
            print(f"aiayn/{name}.py differs from its chapter's export cells", file=sys.stderr)
        for name in sorted(stale):
            print(f"aiayn/{name}.py is generated but no chapter exports it any more", file=sys.stderr)
        if differ or stale:
            print("run `python -m aiayn._export` and commit the result", file=sys.stderr)
            return 1
        print(f"package in sync with the chapters ({len(wanted)} modules)")
        return 0
    for name in sorted(differ):
        (PACKAGE / f"{name}.py").write_text(wanted[name], encoding="utf-8")
        print(f"wrote aiayn/{name}.py")
    for name in sorted(stale):
        (PACKAGE / f"{name}.py").unlink()
        print(f"removed aiayn/{name}.py")
    return 0


if __name__ == "__main__":
    sys.exit(main())
