"""Refresh the chapters' stored outputs (execute notebooks in place, a fresh kernel each) and their set-up cells.

    python -m aiayn._book execute                       # every chapter in book/
    python -m aiayn._book execute book/02_attention.ipynb
    python -m aiayn._book set-up                        # write SETUP_CELL into every chapter

Stored outputs serve readers on GitHub and Colab, and nbval compares the cells tagged
``nbval-check-output`` against them.

Not about the paper: a tool of the book's build. The chapters' code lives in book/ and the modules they write.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from aiayn import ROOT

# Every chapter's first code cell (tagged remove-cell): what makes it run on its own, in Colab or a fresh Jupyter.
# The `book` extra (pyproject.toml) adds what the chapters import beyond the package's own dependencies.
SETUP_CELL = """\
# Set-up for running this chapter on its own (Colab, a fresh Jupyter): if the package is missing, clone the book's
# repository (the package, its stored results and trained models) and install it from the clone, with the libraries
# the chapters draw with (its `book` extra).
import importlib, importlib.util, os, subprocess, sys
if importlib.util.find_spec("aiayn") is None:
    repo = os.environ.get("AIAYN_REPO", "https://github.com/aiayn-book/aiayn")
    if not os.path.isdir("aiayn-book"):
        subprocess.run(["git", "clone", "-q", "--depth", "1", repo, "aiayn-book"], check=True)
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", "aiayn-book[book]"], check=True)
    sys.path.insert(0, os.path.abspath("aiayn-book"))  # importable now, without restarting the kernel
    importlib.invalidate_caches()  # and so are the libraries pip has just installed"""


def execute(path: Path, timeout: int = 1800, into: Path | None = None) -> float:
    """Run a notebook in a fresh kernel (from its folder) and write it back, or to `into`; the seconds it took.

    On an error the notebook in place is left as it was; a copy written `into` keeps the cells run so far."""
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    try:
        NotebookClient(
            nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}}
        ).execute()
    finally:
        if into is not None:
            Path(into).parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, into)
    seconds = time.perf_counter() - start
    record = nb.metadata.setdefault("aiayn", {})["executed"] = {**run_record(seconds), "code": code_digest(nb)}
    restamp(nb, record)
    if into is None:
        nbformat.write(nb, path)
    return seconds


def restamp(nb, record: dict) -> None:
    """Make the ``run_s`` and ``run_on`` that a chapter's first cell glued (from the run before, which was all it could
    read) those of the run that has just made its outputs."""
    from aiayn.glue import run_on

    values = {"run_s": float(round(record["seconds"])), "run_on": run_on(record)}
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            glued = out.get("metadata", {}).get("scrapbook", {})
            if glued.get("name") in values:
                out["data"] = {f"{glued['mime_prefix']}text/plain": repr(values[glued["name"]])}


def code_digest(nb) -> str:
    """A digest of a notebook's code cells: the site shows stored outputs, so a test compares this with the digest
    recorded when they were made, and a chapter whose code changed since asks for `make outputs`."""
    import hashlib

    code = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]  # a str, or its lines on disk
    return hashlib.sha256("\0".join(code).encode()).hexdigest()[:16]


def run_record(seconds: float) -> dict:
    """What a chapter's first lines say about its stored run: the seconds it took, the machine and its cores."""
    import os

    import torch

    from aiayn.runs.provenance import cpu_name

    gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    return {
        "seconds": round(seconds, 1),
        "device": gpu or cpu_name(),
        "cores": os.cpu_count(),
        "gpu": gpu is not None,
        "torch": torch.__version__,
    }


def write_setup(path: Path) -> bool:
    """Make a notebook's first code cell SETUP_CELL, leaving every other cell as it is; True if it changed."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    if cell.source == SETUP_CELL:
        return False
    cell.source = SETUP_CELL
    nbformat.write(nb, path)
    return True


def vendor_vega() -> None:
    """Copy the vega, vega-lite and vega-embed builds that the installed altair asks for into book/_static/vega."""
    import shutil
    import subprocess
    import tarfile
    import tempfile

    import altair as alt

    dest = ROOT / "book" / "_static" / "vega"
    wanted = {"vega": alt.VEGA_VERSION, "vega-lite": alt.VEGALITE_VERSION, "vega-embed": alt.VEGAEMBED_VERSION}
    with tempfile.TemporaryDirectory() as tmp:
        for lib, version in wanted.items():
            out = subprocess.run(
                ["npm", "pack", f"{lib}@{version}", "--pack-destination", tmp],
                check=True,
                capture_output=True,
                text=True,
            ).stdout.split()[-1]
            with tarfile.open(Path(tmp) / out) as tar:
                tar.extractall(Path(tmp) / lib, filter="data")
            shutil.copyfile(Path(tmp) / lib / "package" / "build" / f"{lib}.min.js", dest / f"{lib}.min.js")
            shutil.copyfile(Path(tmp) / lib / "package" / "LICENSE", dest / f"LICENSE.{lib}")
    (dest / "vega-versions.js").write_text(
        "// Tells altair's chart loader that the vendored libraries are present, so no chart fetches them from a CDN.\n"
        f"// Versions as altair {alt.__version__} asks for them; refresh with `make vendor-vega`.\n"
        f'var VEGA_DEBUG = {{vega_version: "{alt.VEGA_VERSION}", vegalite_version: "{alt.VEGALITE_VERSION}", '
        f'vegaembed_version: "{alt.VEGAEMBED_VERSION}"}};\n'
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("execute", help="execute notebooks in place")
    run.add_argument("notebooks", nargs="*", type=Path)
    setup = sub.add_parser("set-up", help="write SETUP_CELL into the notebooks' first code cell")
    setup.add_argument("notebooks", nargs="*", type=Path)
    sub.add_parser("vendor-vega", help="refresh book/_static/vega from the npm registry")
    args = parser.parse_args(argv)
    if args.command == "vendor-vega":
        vendor_vega()
        return 0
    notebooks = args.notebooks or sorted((ROOT / "book").glob("*.ipynb"))
    if args.command == "set-up":
        for nb in notebooks:
            print(f"{nb}: {'wrote the set-up cell' if write_setup(Path(nb)) else 'set-up cell unchanged'}")
        return 0
    for nb in notebooks:
        print(f"{nb}: executing ...", flush=True)
        print(f"{nb}: done in {execute(Path(nb).resolve()):.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
