"""What both benchmarks share: the package on the path, where results go, and their provenance."""

import json
import shlex
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from aiayn.runs.provenance import provenance  # noqa: E402  (needs torch alone, so the benchmarks run without spaCy)


def output_path(out: str | None, name: str, device, quick: bool) -> Path:
    """results/<name> for a full run on a GPU; a CPU or --quick run must be sent elsewhere (never into results/)."""
    real = device.type == "cuda" and not quick
    path = Path(out) if out else (ROOT / "results" / name if real else Path("/tmp") / f"aiayn_{name}")
    if not real and path.resolve().is_relative_to((ROOT / "results").resolve()):
        raise SystemExit(
            f"error: {path} is in results/, which holds full GPU runs only; this run is "
            f"{'--quick' if quick else 'on the CPU'}: pass --out with a path outside results/"
        )
    return path


def write(path: Path, report: dict, device) -> None:
    """Add provenance (device, versions, git commit, date, command line) and write the report as JSON."""
    report["provenance"] = provenance(" ".join(map(shlex.quote, ["python", *sys.argv])), device)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
