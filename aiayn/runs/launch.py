"""Several runs of ``python -m aiayn.experiment`` at once, each its own process with its own log: the one launcher that
aiayn.plan and aiayn.variations share.

Not about the paper: processes and logs only. The runs themselves are aiayn.experiment's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from aiayn import ROOT


@dataclass
class Job:
    """One experiment: its name, its command line after ``python -m aiayn.experiment``, its log, and what to do
    just before it starts and once it has ended (called with its exit code, None if it was killed)."""

    name: str
    argv: list[str]
    log: Path
    before: Callable[[], None] | None = None
    after: Callable[[int | None], None] | None = None


def start(argv: list[str], log: Path, concurrent: int) -> subprocess.Popen:
    """One run of aiayn.experiment in its own process, its output in `log`; `concurrent` runs share the machine."""
    env = {**os.environ, "AIAYN_CONCURRENT_RUNS": str(concurrent)}
    # runs side by side share the cores (on a GPU machine, the host threads that launch its kernels)
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // concurrent)))
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w", encoding="utf-8") as handle:
        return subprocess.Popen(
            [sys.executable, "-m", "aiayn.experiment", *argv],
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=ROOT,
        )


def run_all(jobs: list[Job], parallel: int, timeout: float | None = None) -> dict[str, int | None]:
    """Run the jobs in order, `parallel` at a time; a job still running after `timeout` seconds is killed (this
    only catches a hung run: each experiment keeps its own time budget). Returns name -> exit code, None if
    killed."""
    if parallel < 1:
        raise ValueError(f"parallel must be at least 1, got {parallel}")
    queue, running, codes = list(jobs), {}, {}
    concurrent = min(parallel, len(jobs))
    while queue or running:
        while queue and len(running) < parallel:
            job = queue.pop(0)
            if job.before:
                job.before()
            running[job.name] = (job, start(job.argv, job.log, concurrent), time.perf_counter())
        time.sleep(0.2)
        for name, (job, process, started) in list(running.items()):
            if process.poll() is None:
                if timeout is None or time.perf_counter() - started <= timeout:
                    continue
                process.kill()
                process.wait()
                codes[name] = None
            else:
                codes[name] = process.returncode
            del running[name]
            verdict = "ok" if codes[name] == 0 else "KILLED" if codes[name] is None else "FAILED"
            print(f"{verdict} in {time.perf_counter() - started:.0f} s: {name} [{job.log}]", flush=True)
            if job.after:
                job.after(codes[name])
    return codes
