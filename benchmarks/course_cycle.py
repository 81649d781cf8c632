"""What grading costs per submission, in the bubblewrap sandbox, without it, and with nbgrader as it comes (its own
Execute, the checks run in the student's kernel, as the book's grader never does): `nbgrader autograde` of the same
honest submissions of `label_smoothing` (the demo's right answer), the three set-ups taking turns, best round each;
and the grader's own peak memory (the nbgrader process, not its kernels) grading one honest submission and one that
prints without end.

    python benchmarks/course_cycle.py          # writes results/course_cycle.json (about 10 min on 2 cores)
    python benchmarks/course_cycle.py --submissions 2 --rounds 1 --out /tmp/course_cycle.json   # a quick check
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, write


def course(folder: Path, sandbox: bool, submissions: int, stock: bool = False) -> Path:
    """A course of one assignment with `submissions` copies of the demo's right answer (`stock`: graded by nbgrader's
    own preprocessors, as a course without the book's configuration would be)."""
    from aiayn.course import assignments as c

    c.write_course(folder, ["label_smoothing"], sandbox=sandbox)
    if stock:
        (folder / "nbgrader_config.py").write_text("c = get_config()  # noqa: F821\n")
    nbgrader(folder, "generate_assignment", "label_smoothing")
    demos = [path.parents[1] for path in c.demo_submissions(folder)]  # submitted/<student>/label_smoothing/...
    for k in range(submissions):
        shutil.copytree(folder / "submitted" / "alice", folder / "submitted" / f"student{k:02d}")
    for demo in demos:
        shutil.rmtree(demo)
    return folder


def nbgrader(folder: Path, *args: str, check: bool = True) -> int:
    """Run nbgrader in ``folder``; return the peak resident memory of the nbgrader process itself, in MiB."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen([str(bin_dir / "nbgrader"), *args, "--log-level=ERROR"], cwd=folder, env=env)
    peak = 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak = max(peak, int(status.split("VmHWM:")[1].split()[0]) // 1024)
        except (OSError, IndexError):
            pass
        time.sleep(0.2)
    if check and proc.returncode:
        raise SystemExit(f"error: nbgrader {' '.join(args)} exited with {proc.returncode}")
    return peak


def flood_memory(folder: Path) -> tuple[dict, list[str]]:
    """The grader's peak memory grading one honest submission, then one that prints 100 kB lines without end (after
    its right answer), then one that displays 7 MB without end; and the report's lines on the last two, which must
    keep all their points."""
    from aiayn.course import assignments as c
    from aiayn.course import grader

    c.write_course(folder, ["label_smoothing"])
    nbgrader(folder, "generate_assignment", "label_smoothing")
    c.demo_submissions(folder)
    for demo in ("bob", "carol"):
        shutil.rmtree(folder / "submitted" / demo)
    peaks = {"honest": nbgrader(folder, "autograde", "label_smoothing")}
    flood = folder / "submitted" / "flood" / "label_smoothing"
    shutil.copytree(folder / "submitted" / "alice" / "label_smoothing", flood)
    nb = json.loads((flood / "label_smoothing.ipynb").read_text())
    nb["cells"].insert(3, {"cell_type": "code", "metadata": {}, "execution_count": None, "outputs": [],
                           "source": "while True:\n    print('x' * 100_000)"})  # fmt: skip
    (flood / "label_smoothing.ipynb").write_text(json.dumps(nb))
    peaks["flood"] = nbgrader(folder, "autograde", "label_smoothing", "--student", "flood")
    # the same with displays of 7 MB each, under the size limit of one message: what waits to be read is bounded
    nb["cells"][3]["source"] = (
        "from IPython.display import display\nwhile True:\n    display({'text/plain': 'x' * 7_000_000}, raw=True)"
    )
    shutil.copytree(flood, folder / "submitted" / "displays" / "label_smoothing")
    (folder / "submitted" / "displays" / "label_smoothing" / "label_smoothing.ipynb").write_text(json.dumps(nb))
    peaks["display_flood"] = nbgrader(folder, "autograde", "label_smoothing", "--student", "displays")
    report = grader.report(folder, "label_smoothing")
    lines = [line for line in report if not line.startswith("alice")]
    for student in ("displays", "flood"):
        if next(line for line in report if line.startswith(student)).split()[1] != "12":
            raise SystemExit(f"error: {student}, whose answer is right, lost points:\n" + "\n".join(lines))
    return peaks, lines


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--submissions", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2, help="alternate the two set-ups this many times; the best counts")
    p.add_argument("--out", default=str(ROOT / "results" / "course_cycle.json"))
    args = p.parse_args()

    import torch

    from aiayn.course import grader
    from aiayn.course.grader import sandbox_problem

    if sandbox_problem():
        raise SystemExit(f"error: {sandbox_problem()}")
    seconds = {"sandbox": [], "plain": [], "nbgrader": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for name in seconds:
                folder = course(Path(tmp) / f"{name}{r}", name == "sandbox", args.submissions, name == "nbgrader")
                start = time.perf_counter()
                nbgrader(folder, "autograde", "label_smoothing")
                seconds[name].append(time.perf_counter() - start)
                report = grader.report(folder, "label_smoothing")
                full = [line for line in report if not line.startswith(" ") and line.split()[1] == "12"]
                if len(full) != args.submissions:
                    raise SystemExit("error: an honest submission lost points:\n" + "\n".join(report))
        memory, flood_report = flood_memory(Path(tmp) / "flood")
    per = {name: min(t) / args.submissions for name, t in seconds.items()}
    result = {
        "assignment": "label_smoothing",
        "submissions": args.submissions,
        "rounds": args.rounds,
        "autograde_seconds": seconds,
        "seconds_per_submission": per,
        "ratio_sandbox_over_plain": per["sandbox"] / per["plain"],
        "ratio_sandbox_over_nbgrader": per["sandbox"] / per["nbgrader"],
        "grader_peak_mib": memory,
        "flood_report": flood_report,
    }
    print(
        f"per submission: sandbox {per['sandbox']:.2f} s, plain {per['plain']:.2f} s, nbgrader {per['nbgrader']:.2f} s"
    )
    print(
        f"grader's peak memory: {memory['honest']} MiB (honest), {memory['flood']} MiB (prints without end), "
        f"{memory['display_flood']} MiB (displays without end)"
    )
    write(Path(args.out), result, torch.device("cpu"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
