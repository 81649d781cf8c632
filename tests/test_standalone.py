"""A chapter opened on its own, on a fresh Jupyter: its set-up cell installs everything the chapter needs.

A fresh virtual environment holds torch and a Jupyter kernel (ipykernel) and nothing else. The §6.1 results chapter,
copied alone into an empty folder, runs there top to bottom in that kernel: its own set-up cell clones the repository
(a local clone of this checkout's commit, through AIAYN_REPO) and installs it with its `book` extra; then the chapter
reads the stored runs, the Multi30k test set (the primed cache, through AIAYN_DATA) and the shipped models, and draws.

It needs the network: pip resolves the package's dependencies on PyPI, taking the wheels already on the machine
(pip's cache, its configured find-links) where it can. Without PyPI the test is skipped. It takes a few minutes.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import nbformat
import pytest
import torch
from nbclient import NotebookClient

from aiayn import results

ROOT = Path(__file__).resolve().parents[1]
CHAPTER = ROOT / "book" / "12_results.ipynb"
PYPI = "https://pypi.org/simple/pip/"


def reachable(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=10):
            return True
    except OSError:
        return False


def outputs_text(nb) -> str:
    """Every stream and every plain-text or HTML display of the executed notebook, as one string."""
    parts = []
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.output_type == "stream":
                parts.append(out.text)
            for kind in ("text/plain", "text/html"):
                parts.append(out.get("data", {}).get(kind, ""))
    return "\n".join(parts)


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="needs git and a checkout")
def test_results_chapter_runs_alone_on_a_fresh_jupyter(tmp_path, multi30k_cache, monkeypatch):
    if not reachable(PYPI):
        pytest.skip(f"needs PyPI ({PYPI} did not answer): the set-up cell installs the package's dependencies")
    env_dir, work, kernels = tmp_path / "venv", tmp_path / "reader", tmp_path / "jupyter" / "kernels" / "fresh"
    work.mkdir()
    kernels.mkdir(parents=True)
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", str(env_dir)], check=True)
    python = str(env_dir / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, f"torch=={torch.__version__}", "ipykernel"], check=True)
    probe = [python, "-c", "import importlib.util as u; print([m for m in ('aiayn', 'pandas') if u.find_spec(m)])"]
    seen = subprocess.run(probe, capture_output=True, text=True, cwd=work).stdout.strip()
    assert seen == "[]", f"the fresh environment must hold torch and the kernel only, yet it finds {seen}"

    # the fresh environment's kernel, by a name no other Jupyter folder uses
    spec = {"argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"], "language": "python"}
    (kernels / "kernel.json").write_text(json.dumps({**spec, "display_name": "fresh"}))
    monkeypatch.setenv("JUPYTER_PATH", str(kernels.parents[1]))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "MPLBACKEND", "AIAYN_RESULTS")}
    env.update(AIAYN_REPO=str(ROOT), AIAYN_DATA=str(multi30k_cache), PIP_DISABLE_PIP_VERSION_CHECK="1")

    shutil.copy(CHAPTER, work / CHAPTER.name)
    nb = nbformat.read(work / CHAPTER.name, as_version=4)
    client = NotebookClient(nb, timeout=600, kernel_name="fresh", resources={"metadata": {"path": str(work)}})
    client.execute(env=env)  # raises on the first cell that fails, with its traceback

    located = subprocess.run(
        [python, "-c", "import aiayn; print(aiayn.ROOT)"], capture_output=True, text=True, cwd=work
    )
    assert located.stdout.strip() == str(work / "aiayn-book")  # the clone, with its results/ and pretrained/
    text = outputs_text(nb)
    # the clone finds every stored run; "not stored yet" is said only of what results/ lacks
    absent = re.findall(r"([\w.-]+): not stored yet", text)
    assert not set(absent) & set(results.RUNS), absent
    assert not any((ROOT / "results" / name).exists() for name in absent), absent
    metrics = json.loads((ROOT / "results" / "cpu-en-de" / "metrics.json").read_text(encoding="utf-8"))
    assert f"{metrics['bleu']['test2016']['tok_lc']['score']:.2f}" in text  # the stored BLEU, in the comparison table
    assert "  -> " in text  # the shipped model translated a sentence
    drawn = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert len(drawn) >= 3, "matplotlib's figures"
    assert "vega" in text, "altair's charts"
