"""Where and how qaopt trains NNs: the spec's ``training`` section made into a torch device this machine has and
the fine-tuning recipe for it.

Training (pruning ladders, fine-tuning) goes where the compute is; a spec written
for a GPU workstation still runs on a laptop, slower, unless it says it must not.
"""

from __future__ import annotations

from collections.abc import Callable

from qaopt.app_spec import QaoptError
from qaopt.app_spec.schema import TrainingSpec
from qaopt.approx import FinetuneRecipe, native_bf16


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


def finetune_recipe(training: TrainingSpec, device: str, say: Callable[[str], None] = print) -> FinetuneRecipe:
    """The recipe every NN of a run is fine-tuned and distilled with on ``device`` (from :func:`training_device`).

    ``auto`` trains in bf16 mixed precision on a CPU that computes bf16 in hardware (a step of CropFollow's compact
    NN 2.3x faster on an AVX-512 BF16 CPU; docs/knobs.md) and in fp32 elsewhere: a CPU without bf16 instructions
    would emulate it, and on a GPU the gain has not been measured, while fp32 there keeps the candidates of a run
    begun before this choice existed. ``say`` gets one line when bf16 is chosen or asked for where it is emulated.
    """
    native = native_bf16(device)
    if training.precision == "auto":
        precision = "bf16" if native and device == "cpu" else "fp32"
        if precision == "bf16":
            say("training.precision: auto: fine-tuning in bf16 mixed precision (this CPU has bf16 instructions; "
                "training.precision: fp32 trains in fp32)")
    else:
        precision = training.precision
        if precision == "bf16" and not native:
            say(f"training.precision: bf16 on {device}, which has no bf16 instructions: torch emulates it, slower "
                "than fp32 (training.precision: auto chooses)")
    return FinetuneRecipe(precision=precision)
