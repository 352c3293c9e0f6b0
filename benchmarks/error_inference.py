"""How fast a candidate's error is computed: the NN's outputs on its validation and stress frames, per batch size.

    python benchmarks/error_inference.py [--frames 512] [--threads 2] [--repeats 5] [--batches 1 4 8 16 32]

Every candidate the search builds is judged by its outputs on the NN's validation frames and on the stress
strata's frames (CropFollow's example: 640 + 1920 frames of 240x320 per NN), through
:func:`qaopt.approx.quantize.predict_torch` for a float candidate. That is a large share of a quick run (a profile
of the README's first command: about a third of the search stages' CPU time). This times the shipped compact
heading NN on ``--frames`` random frames at each batch size, in turn, ``--repeats`` rounds interleaved so that a
change in the machine's load shows in every batch size alike, and prints one JSON line: the machine, the load
average, the batch ``predict_torch`` takes on a CPU by default (``CPU_BATCH``), and per batch size the median and
every round's ms per frame. The outputs of every batch size are compared with batch 32's (their largest difference
is printed): a batch size changes which kernels oneDNN picks, not the NN.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--frames", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 4, 8, 16, 32])
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    record = provenance()

    import numpy as np
    import torch

    from qaopt.approx.quantize import CPU_BATCH, predict_torch
    from qaopt.simulators.cropfollow import reference_nn

    torch.set_num_threads(args.threads)
    model = reference_nn("heading").eval()
    x = np.random.default_rng(0).random((args.frames, 3, 240, 320), dtype=np.float32)
    outputs = {b: predict_torch(model, x, batch=b) for b in args.batches}  # also the warm-up
    rounds: dict[int, list[float]] = {b: [] for b in args.batches}
    for _ in range(args.repeats):
        for b in args.batches:
            start = time.perf_counter()
            predict_torch(model, x, batch=b)
            rounds[b].append((time.perf_counter() - start) / args.frames * 1e3)
    reference = outputs[32] if 32 in outputs else outputs[args.batches[-1]]
    print(json.dumps({
        **record, "torch": torch.__version__, "threads": args.threads, "frames": args.frames, "cpu_batch": CPU_BATCH,
        "ms_per_frame": {b: {"median": round(statistics.median(r), 3), "rounds": [round(v, 3) for v in r],
                             "max_abs_difference": float(np.abs(outputs[b] - reference).max())}
                         for b, r in rounds.items()},
    }))


if __name__ == "__main__":
    main()
