"""Where and how a result was made, recorded beside every stored GPU result (results/README.md lists the fields)."""
from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def provenance(command: str, device: torch.device) -> dict:
    """Device, versions, git commit (with a dirty flag), date, command line, and how many runs shared the device
    (AIAYN_CONCURRENT_RUNS, set by whoever starts several at once)."""
    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    return {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
            "torch": torch.__version__, "cuda": torch.version.cuda if device.type == "cuda" else None,
            "python": platform.python_version(), "git_commit": git("rev-parse", "HEAD") or os.environ.get("AIAYN_GIT_COMMIT"),
            "git_dirty": bool(git("status", "--porcelain", "--untracked-files=no")),  # a copy without .git: the
            # commit comes from AIAYN_GIT_COMMIT, set by whoever copied a clean checkout there
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "command": command,
            "concurrent_runs": int(os.environ.get("AIAYN_CONCURRENT_RUNS", "1"))}  # runs sharing the device
