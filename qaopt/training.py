"""Where qaopt trains NNs: the spec's ``training.device`` made into a torch device this machine has.

Training (pruning ladders, fine-tuning) goes where the compute is; a spec written
for a GPU workstation still runs on a laptop, slower, unless it says it must not.
"""

from __future__ import annotations

from collections.abc import Callable

from qaopt.app_spec import QaoptError
from qaopt.app_spec.schema import TrainingSpec


def training_device(training: TrainingSpec, say: Callable[[str], None] = print) -> str:
    """``"cuda"`` or ``"cpu"``; ``say`` gets the one-line notice when an asked-for GPU is missing."""
    if training.device == "cpu":
        return "cpu"
    import torch

    if torch.cuda.is_available():
        return "cuda"
    if training.device == "auto":
        return "cpu"
    if training.required:
        raise QaoptError("training.device: cuda is required (training.required: true), but torch finds no CUDA device "
                         f"here (torch {torch.__version__}, torch.cuda.is_available() is False): run on a machine with "
                         "a GPU and a CUDA build of torch, or set training.device: auto to train on the CPU")
    say("training.device: cuda asked, but torch finds no CUDA device here: training on the CPU "
        "(training.required: true stops instead)")
    return "cpu"
