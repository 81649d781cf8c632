"""The Colab route: a chapter opened on its own installs the book the way its first cell does and finds the stored
results and the shipped models.

A fresh virtual environment stands in for Colab's: it sees the installed libraries (torch, pandas, ...) but not this
checkout's package. The chapter's own set-up cell clones the repository (here a local clone of this checkout's
commit, through AIAYN_REPO) and installs it; then the §6.1 results chapter runs top to bottom and prints the stored
test 2016 BLEU of the CPU run.
"""

import json
import os
import re
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aiayn import results

ROOT = Path(__file__).resolve().parents[1]


def code_cells(name: str) -> list[str]:
    nb = json.loads((ROOT / "book" / f"{name}.ipynb").read_text(encoding="utf-8"))
    return ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a checkout")
def test_a_chapter_alone_finds_the_stored_results(tmp_path):
    metrics = json.loads((ROOT / "results" / "cpu-en-de" / "metrics.json").read_text(encoding="utf-8"))
    env_dir, work = tmp_path / "venv", tmp_path / "colab"
    work.mkdir()
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    # the libraries Colab would have, but not this checkout's package (its editable hook is a .pth file that a path
    # added this way does not run)
    Path(purelib, "libraries.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    probe = subprocess.run(
        [python, "-c", "import importlib.util as u; print(u.find_spec('aiayn') is None)"],
        capture_output=True,
        text=True,
        cwd=work,
    )
    assert probe.stdout.strip() == "True", "the fresh environment must not see this checkout's package"

    setup, *rest = code_cells("12_results")
    # display() prints nothing outside a kernel: the chapter's BLEU table is printed at the end
    script = "\n\n".join(
        [setup, "import aiayn.provenance\nprint('ROOT', aiayn.provenance.ROOT)", *rest, "print(table.to_string())"]
    )
    env = {**os.environ, "AIAYN_REPO": str(ROOT), "MPLBACKEND": "Agg", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("AIAYN_RESULTS", None)
    run = subprocess.run([python, "-c", script], capture_output=True, text=True, cwd=work, env=env, timeout=900)
    assert run.returncode == 0, textwrap.shorten(run.stderr[-3000:], 3000)
    assert f"ROOT {work / 'aiayn-book'}" in run.stdout  # the clone, with its results/ and pretrained/
    # the clone finds every stored run; "not stored yet" is said only of what results/ lacks
    absent = re.findall(r"([\w.-]+): not stored yet", run.stdout)
    assert not set(absent) & set(results.RUNS), absent
    assert not any((ROOT / "results" / name).exists() for name in absent), absent
    score = metrics["bleu"]["test2016"]["tok_lc"]["score"]
    assert f"{score:.2f}" in run.stdout  # the stored BLEU, in the comparison table
    assert " -> " in run.stdout  # the shipped model translated a sentence
