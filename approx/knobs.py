"""The approximation knobs of one candidate NN, and which backends can run each dtype.

A :class:`Knobs` value is one point of the search space; together with the base NN,
its data and the fine-tuning recipe it determines a candidate completely, so it is
part of the candidate's cache key. Only knobs that change what really runs are
offered (DLAS, Gibson et al.: compression ratio, MACs and latency are not strongly
correlated): channel pruning removes channels, and a dtype is tied to the backends
that have native kernels for it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, NonNegativeInt, PositiveInt

from .errors import ApproxError

Dtype = Literal["fp32", "bf16", "fp16", "int8"]

RUNNABLE_ON: dict[str, tuple[str, ...]] = {
    # Every backend runs fp32; TVM imports the (pruned) torch module.
    "fp32": ("torch", "torch-compile", "onnxruntime", "tvm"),
    # oneDNN runs bf16 natively on AVX-512 BF16 CPUs (and every recent GPU).
    "bf16": ("torch", "torch-compile"),
    # fp16 is native on GPUs; x86 CPUs without AVX-512 FP16 emulate it (slower than fp32).
    "fp16": ("torch", "torch-compile"),
    # int8 runs integer (VNNI) kernels only through ONNX Runtime's static QDQ graph here:
    # see docs/quantization.md for the routes measured.
    "int8": ("onnxruntime",),
}
"""For each dtype, the backends (names as in the spec's ``target.backend``) that run it."""


class Knobs(BaseModel):
    """One setting of every approximation knob of an NN.

    ``prune_ratio`` is the fraction of channels removed from every prunable layer
    (output heads are never pruned); ``per_layer`` overrides it for named modules
    (a container's ratio applies to the layers inside it). Pruning runs in
    ``prune_steps`` equal steps with ``finetune_steps`` optimizer steps of
    distillation spread evenly after them, as ApproxCaliper did (up to 40 steps):
    each step removes less at once, so each round of fine-tuning has less to win back.
    ``rank_ratio`` below 1 then factorizes each k x k convolution into a rank-r pair
    (r = ``rank_ratio`` of the full rank, rounded to ``round_to``; see
    :mod:`qaopt.approx.lowrank`), followed by its own share of the fine-tuning.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    prune_ratio: float = 0.0
    importance: Literal["l1", "taylor"] = "l1"
    round_to: PositiveInt = 8
    prune_steps: PositiveInt = 1
    per_layer: dict[str, float] = Field(default_factory=dict)
    rank_ratio: float = 1.0
    dtype: Dtype = "fp32"
    finetune_steps: NonNegativeInt = 0
    seed: int = 0

    @property
    def prunes(self) -> bool:
        return self.prune_ratio > 0.0 or any(r > 0.0 for r in self.per_layer.values())

    @property
    def factorizes(self) -> bool:
        return self.rank_ratio < 1.0

    @property
    def runnable_on(self) -> tuple[str, ...]:
        return RUNNABLE_ON[self.dtype]

    def identity(self) -> dict:
        """The knobs as they determine a candidate: a setting counts only when the step it tunes runs."""
        skip = set() if self.prunes else {"importance", "prune_steps", "per_layer"}
        if not self.factorizes:
            skip.add("rank_ratio")
            if not self.prunes:
                skip.add("round_to")
        return self.model_dump(mode="json", exclude=skip)

    def float_part(self) -> dict:
        """The part of :meth:`identity` that shapes the float model (everything but the dtype)."""
        return {k: v for k, v in self.identity().items() if k != "dtype"}

    def check(self, nn: str) -> None:
        """Raise :class:`ApproxError` for values no model could take."""
        if not 0.0 <= self.prune_ratio < 1.0:
            raise ApproxError(nn, "prune_ratio", f"{self.prune_ratio} is outside [0, 1); 0.5 removes half the channels")
        for layer, ratio in self.per_layer.items():
            if not 0.0 <= ratio < 1.0:
                raise ApproxError(nn, f"per_layer.{layer}", f"{ratio} is outside [0, 1)")
        if not 0.0 < self.rank_ratio <= 1.0:
            raise ApproxError(nn, "rank_ratio", f"{self.rank_ratio} is outside (0, 1]; 1 leaves the convolutions whole")


def check_backend(nn: str, knobs: Knobs, backend: str) -> None:
    """Raise when ``backend`` has no kernels for the knobs' dtype (e.g. int8 on TVM)."""
    if backend not in ("auto", *knobs.runnable_on):
        raise ApproxError(
            nn,
            "dtype",
            f"{knobs.dtype} has no kernels on backend {backend!r}; it runs on {', '.join(knobs.runnable_on)}. "
            f"Choose one of those backends or drop {knobs.dtype} from approximations.quantization.dtypes",
        )
