"""§4, Table 1 measured: forward time, peak memory and dispatched operations of each layer type as n grows.

python benchmarks/layers.py                                   # GPU: d=512, n up to 8192, results/layers_gpu.json
python benchmarks/layers.py --quick --out /tmp/layers.json    # CPU check of the script, small sizes
"""

import argparse
import time

import torch

from _common import output_path, write

from aiayn.complexity import measure_layers


def main(argv=None) -> dict:
    start = time.perf_counter()
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ns", type=int, nargs="+", default=[2**i for i in range(7, 14)], help="sequence lengths n")
    p.add_argument("--d", type=int, default=512, help="representation width d")
    p.add_argument("--k", type=int, default=3, help="kernel width of the convolutions (odd)")
    p.add_argument("--r", type=int, default=33, help="window of restricted self-attention (odd)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5, help="timed forward passes per point; the best counts")
    p.add_argument("--quick", action="store_true", help="d=64, n up to 256, batch 1 (a CPU check)")
    p.add_argument("--out", default=None, help="JSON report; default results/layers_gpu.json on a GPU")
    args = p.parse_args(argv)
    if args.quick:
        args.ns, args.d, args.batch, args.repeats = [32, 64, 128, 256], 64, 1, 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = output_path(args.out, "layers_gpu.json", device, args.quick)
    if device.type == "cpu":
        torch.set_num_threads(1)  # small operations on a shared CPU time steadier on one thread (see §4's chapter)
    results = measure_layers(args.ns, args.d, args.k, args.r, args.batch, args.repeats, device, log=print)
    config = {
        "ns": args.ns,
        "d": args.d,
        "k": args.k,
        "r": args.r,
        "batch": args.batch,
        "repeats": args.repeats,
        "dtype": "float32",
        "tf32_matmul": torch.backends.cuda.matmul.allow_tf32,
        "quick": args.quick,
        "threads": torch.get_num_threads(),
        "measured": "forward pass under torch.no_grad(), best of repeats; "
        "peak_bytes: torch.cuda.max_memory_allocated above the memory held before (GPU) or the tensors "
        "the layer creates (CPU); ops: ATen operations dispatched",
    }
    report = {"config": config, "results": results, "wall_s": time.perf_counter() - start}
    write(out, report, device)
    return report


if __name__ == "__main__":
    main()
