"""The §5 chapter's copy task, timed: the same model, data, seeds and schedule as the chapter trains, several times in
one process, as seconds per training and the updates it took.

    python benchmarks/copy_task.py                  # writes results/copy_task.json (about a minute, 2 cores)
    python benchmarks/copy_task.py --repeats 1 --out /tmp/copy_task.json   # a quick check

The chapter reads this file for the time it quotes, so that its text does not depend on how busy the machine that
builds the site is.
"""

import argparse
import sys
import time
from pathlib import Path

from _common import ROOT, write


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3, help="trainings, one after another; the fastest counts")
    p.add_argument("--out", default=str(ROOT / "results" / "copy_task.json"))
    args = p.parse_args()

    import torch

    from aiayn.model import TransformerConfig, make_model
    from aiayn.runs.provenance import cpu_features
    from aiayn.training import COPY_MODEL, COPY_TRAIN, TrainConfig, copy_task_data, train

    train_data, val_data = copy_task_data()
    seconds, updates, val_loss = [], None, None
    for _ in range(args.repeats):
        torch.manual_seed(0)
        model = make_model(TransformerConfig(**COPY_MODEL))
        start = time.perf_counter()
        history = train(model, train_data, val_data, TrainConfig(**COPY_TRAIN, progress=False, log=False))
        seconds.append(time.perf_counter() - start)
        updates, val_loss = history["step"][-1], history["val_loss"][-1]
    report = {
        "config": {
            "model": COPY_MODEL,
            "train": COPY_TRAIN,
            "repeats": args.repeats,
            "threads": torch.get_num_threads(),
        },
        "results": {"seconds": min(seconds), "rounds": seconds, "updates": updates, "val_loss": val_loss},
        "cpu_features": cpu_features(),
    }
    write(Path(args.out), report, torch.device("cpu"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
