"""Refresh the stored outputs of the chapters: execute notebooks in place, in a fresh kernel each.

    python -m aiayn._book execute                       # every chapter in book/
    python -m aiayn._book execute book/02_attention.ipynb

Stored outputs serve readers on GitHub and Colab, and nbval compares the cells marked
``# NBVAL_CHECK_OUTPUT`` against them.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def execute(path: Path, timeout: int = 1800) -> float:
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    start = time.perf_counter()
    NotebookClient(nb, timeout=timeout, kernel_name="python3",
                   resources={"metadata": {"path": str(path.parent)}}).execute()
    nbformat.write(nb, path)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("execute", help="execute notebooks in place")
    run.add_argument("notebooks", nargs="*", type=Path)
    args = parser.parse_args(argv)
    notebooks = args.notebooks or sorted((ROOT / "book").glob("*.ipynb"))
    for nb in notebooks:
        print(f"{nb}: executing ...", flush=True)
        print(f"{nb}: done in {execute(Path(nb).resolve()):.0f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
