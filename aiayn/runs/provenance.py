"""Where and how a result was made, recorded beside every stored result, CPU or GPU (results/README.md lists the
fields).

Not about the paper: bookkeeping of where a result was made.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from pathlib import Path

import torch

from aiayn import ROOT


def _changes(changed: list[str]) -> dict:
    return {"git_dirty": bool(changed), "git_changed": changed}


def cpu_name() -> str:
    """The CPU's model name as the operating system reports it (Linux: /proc/cpuinfo), else platform's."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_features() -> list[str]:
    """The CPU features that decide the precision of CPU training: AVX2, AVX-512, AVX512-BF16 and AMX."""
    checks = {
        "avx2": "_is_avx2_supported",
        "avx512": "_is_avx512_supported",
        "avx512_bf16": "_is_avx512_bf16_supported",
        "amx": "_is_amx_tile_supported",
    }
    return [name for name, fn in checks.items() if getattr(torch.cpu, fn, lambda: False)()]


def provenance(command: str, device: torch.device) -> dict:
    """Device, versions, git commit (with a dirty flag), date, command line, and how many runs shared the device
    (AIAYN_CONCURRENT_RUNS, set by whoever starts several at once)."""

    def git(*args):
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    cpu = {"cpu": cpu_name(), "cpu_cores": os.cpu_count(), "cpu_features": cpu_features()}
    declared = os.environ.get("AIAYN_GIT_COMMIT")
    return {
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU: {cpu['cpu']}",
        **cpu,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if device.type == "cuda" else None,
        # a copy of a checkout (no .git, or another history): AIAYN_GIT_COMMIT names the commit it holds, set by
        # whoever copied it there, and the changes are counted against that commit where git knows it
        "python": platform.python_version(),
        "git_commit": declared or git("rev-parse", "HEAD"),
        **_changes(git("diff", "--name-only", declared or "HEAD").splitlines()),  # the tracked files that differ
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "concurrent_runs": int(os.environ.get("AIAYN_CONCURRENT_RUNS", "1")),
    }  # runs sharing the device
