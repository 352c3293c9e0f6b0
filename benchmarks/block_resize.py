"""The in-graph resize two ways: ONNX ``Resize`` against the block convolution, in CropFollow's int8 NN.

    python benchmarks/block_resize.py [--scales 0.75 0.5 0.375] [--threads 2] [--repeats 300] [--rounds 3]
        --json docs/benchmarks/block_resize.json

A scaled candidate resizes the full 240x320 frame inside its graph (``qaopt.approx.resolution``). Where the ratio
pays (``block_pays``), the resize is a strided grouped convolution and a depth-to-space (``BlockResize``), else ONNX
``Resize`` (OpenVINO's ``Interpolate``); this measurement is what set where it pays. For each scale this wraps the shipped compact heading NN (its trained weights; the
merged NN has the same backbone) in both resizes, quantizes each to int8 as the quantization pass does (100 rendered
frames to calibrate), checks that both give the same outputs as ``F.interpolate`` in torch, and times each graph on
OpenVINO's CPU plugin with ``--threads`` inference threads: ``--rounds`` rounds, each timing every graph
``--repeats`` times in turn (so that a load change hits both alike), with OpenVINO's per-op profile of the resize's
own ops. Writes ``--json``: the machine, the date, the command, and per scale and resize the median of the round
medians and the resize ops' time.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import numpy as np

FRAME = (1, 3, 240, 320)
WAYS = ("Resize", "block")


def frames() -> np.ndarray:
    """100 rendered CropFollow frames, two validation drives (the quantizer's calibration, and the outputs compared)."""
    from qaopt.simulators.cropfollow.dataset import reference_dataset

    return reference_dataset("heading", n_train=8, val_drives=2, val_frames_per_drive=50).x_val


def graphs(scale: float, tmp: Path, calibration: np.ndarray) -> dict[str, tuple[Path, float]]:
    """The int8 graph of the heading NN at ``scale`` per resize, and its largest output difference from torch's
    ``F.interpolate`` in fp32 (what quantization changes, both ways alike)."""
    import torch

    from qaopt.approx.quantize import predict_onnx, quantize_int8
    from qaopt.approx.resolution import InputResize, scaled_size
    from qaopt.kernels import onnx as toolchain
    from qaopt.simulators.cropfollow.reference import reference_nn

    nn = reference_nn("heading", train_if_missing=False)
    size = scaled_size(FRAME, scale, 2)
    with torch.no_grad():
        truth = InputResize(nn, size).eval()(torch.from_numpy(calibration[:16])).numpy()  # F.interpolate
    out = {}
    for way in WAYS:
        model = InputResize(nn, size, FRAME, block=way == "block").eval()
        path = quantize_int8(model, torch.zeros(FRAME), calibration, tmp / f"{scale:g}-{way}.onnx", "heading", toolchain)
        error = float(np.abs(predict_onnx(toolchain.ort_session(path, threads=1), calibration[:16]) - truth).max())
        out[way] = (path, error)
    return out


def timed(request, frame: np.ndarray, repeats: int) -> float:
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        request.infer({0: frame})
        seconds.append(time.perf_counter() - start)
    return float(np.median(seconds)) * 1e3


def resize_ms(request) -> float:
    """What the resize's own ops took in the last inference (OpenVINO's profile): ``Interpolate``, or the block
    convolution's ops (named for the ``resize`` module) and the reorders around them."""
    return sum(p.real_time.total_seconds() * 1e3 for p in request.profiling_info
               if p.node_type == "Interpolate" or p.node_name.startswith("/resize/"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scales", type=float, nargs="+", default=[0.75, 0.5, 0.375])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", type=Path, required=True)
    args = ap.parse_args()
    from provenance import provenance  # the machine, date, commit, command and load every benchmark JSON records
    record = provenance()

    import openvino as ov

    load = os.getloadavg()[0]
    calibration = frames()
    frame = calibration[:1].copy()
    core = ov.Core()
    with tempfile.TemporaryDirectory() as tmp:
        built = {scale: graphs(scale, Path(tmp), calibration) for scale in args.scales}
        requests = {(scale, way): core.compile_model(core.read_model(str(path)), "CPU", {
            "INFERENCE_NUM_THREADS": args.threads, "PERF_COUNT": "YES"}).create_infer_request()
            for scale, ways in built.items() for way, (path, _) in ways.items()}
        for request in requests.values():
            timed(request, frame, 50)  # warm-up
        medians: dict[tuple, list[float]] = {k: [] for k in requests}
        for _ in range(args.rounds):
            for k, request in requests.items():
                medians[k].append(timed(request, frame, args.repeats))
    rows = []
    for (scale, way), request in requests.items():
        row = {"scale": scale, "resize": way, "median_ms": round(float(np.median(medians[(scale, way)])), 4),
               "round_medians_ms": [round(m, 4) for m in medians[(scale, way)]],
               "resize_ms": round(resize_ms(request), 4),
               "max_output_difference_from_interpolate": round(built[scale][way][1], 5)}
        print(f"scale {scale:g}, {way}: {row['median_ms']} ms, the resize {row['resize_ms']} ms", flush=True)
        rows.append(row)
    out = {**record, "threads": args.threads, "repeats": args.repeats, "rounds": args.rounds, "load_before": load,
           "rows": rows}
    args.json.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
