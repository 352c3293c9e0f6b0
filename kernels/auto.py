"""``auto``: measure a candidate on every usable backend and keep the fastest, recording all figures.

Luthier's lesson: vendor libraries are strong and immediate, auto-tuning is
slow and wins only sometimes. So the vendor backends are measured first, and
TVM comes last with the best of them as its incumbent: tuning is skipped when
it cannot win (see :mod:`.tuning`). A backend that cannot run the candidate, is
not installed, or crashes, is recorded with its reason and does not stop the others.
Nor does one far slower than the fastest so far cost a full measurement: past
:data:`HOPELESS` times that backend's median it is abandoned after one warm-up
round, its per-call time kept in its recorded reason (on this project's 2-core CPU
torch's bf16 path ran the compact heading NN at 440 ms, OpenVINO's at 0.69 ms).

The choice compares only measurements of one epoch: all backends are measured in
one call, and outcomes read back from the cache (keyed by the machine and the
backends' versions, :meth:`.target.Target.machine_key`) were all recorded together.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from qaopt.app_spec.hashing import content_hash
from qaopt.app_spec.store import read_json, write_json

from .errors import KernelsError
from .measure import Measurement, Protocol
from .model import Model, model_key
from .registry import BackendRef, backend_version, get_backend
from .target import Target

CPU_BACKENDS = (BackendRef("openvino"), BackendRef("onnxruntime"), BackendRef("torch"),
                BackendRef("torch", "channels_last"), BackendRef("tvm"))
"""Default for CPU targets, the usually fastest first (so :data:`HOPELESS` can spare the others). Inductor is left
out: it took 25 s to compile a compact NavNet and ran it no faster than eager on this CPU (19.7 ms both); list it
in the spec's ``target.backends`` to include it."""
CUDA_BACKENDS = (BackendRef("torch"), BackendRef("torch", "cuda_graph"), BackendRef("torch-compile"),
                 BackendRef("onnxruntime"))
"""Default for CUDA targets: eager (cuDNN), eager replayed as one CUDA graph, Inductor replaying CUDA graphs (the
plain name's mode on a GPU), and ONNX Runtime where its CUDA provider is installed (``onnxruntime-gpu``; recorded
as unavailable otherwise). At batch 1 the replays win: the launches, not the arithmetic, set the time. TVM is left
out: untuned and after 262 tuning trials it ran a compact NavNet slower than torch's CUDA graph (docs/BENCHMARKS.md,
"TVM's CUDA target"); list it in the spec's ``target.backends`` to race it."""
RPC_BACKENDS = (BackendRef("tvm"),)
DEVICE_BACKENDS: dict[str, tuple[BackendRef, ...]] = {"cpu": CPU_BACKENDS, "cuda": CUDA_BACKENDS, "rpc": RPC_BACKENDS}
"""What ``auto`` measures on each device unless it is given its own list."""


TUNED_ONLY = ("tvm",)
"""Backends the device's own list races only where the target's budget tunes kernels: TVM's default schedules ran
CropFollow's compact NNs at 261-263 ms a frame where ONNX Runtime ran them at 3.3-3.4 ms (the README's quick run,
docs/benchmarks/readme_runs/session37-once/result.json, ``backends_measured``), so untuned it cannot win, and
compiling it cost about 8 s a candidate. A spec that lists TVM in ``target.backends`` still races it untuned."""


UNTUNED_REASON = ("not raced: the target tunes no kernels (target.tuning; the quick profile tunes none), and untuned "
                  "it cannot win")


def raced(target: Target) -> tuple[BackendRef, ...]:
    """The backends ``auto`` measures for ``target``: the spec's ``target.backends``, else the device's own list
    less :func:`untuned_out`."""
    if target.backends:
        return target.backends
    left_out = untuned_out(target)
    return tuple(r for r in DEVICE_BACKENDS[target.device] if r not in left_out)


def untuned_out(target: Target) -> tuple[BackendRef, ...]:
    """The :data:`TUNED_ONLY` backends of the device's own list that ``auto`` leaves out because ``target`` tunes
    nothing (none where the spec lists its backends, or where nothing else would be left)."""
    refs = DEVICE_BACKENDS[target.device]
    out = tuple(r for r in refs if r.name in TUNED_ONLY)
    return () if target.backends or target.tuning.tunes or len(out) == len(refs) else out


OUTCOMES_ARTIFACT, OUTCOMES_VERSION = "kernels-outcomes", 1
HOPELESS = 10.0
"""A backend whose first warm-up round runs slower than this many times the fastest backend's median so far is not
measured further: no measurement noise or warm-up effect spans a factor of ten, so it cannot win."""


@dataclass
class Outcome:
    """One backend's result for one candidate: a measurement, or the reason there is none."""

    backend: str
    measurement: Measurement | None = None
    error: str | None = None
    tuning: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"backend": self.backend, "error": self.error, "tuning": self.tuning,
                "measurement": self.measurement.to_dict() if self.measurement else None}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Outcome:
        m = data.get("measurement")
        if m:
            ci = m.get("ci_ms")
            m = Measurement(**{**m, "samples_ms": tuple(m["samples_ms"]), "ci_ms": tuple(ci) if ci else None})
        return cls(backend=data["backend"], measurement=m, error=data.get("error"), tuning=data.get("tuning"))


@dataclass
class AutoCompiled:
    """The fastest backend's compiled model, plus every backend's outcome."""

    best: Any  # Compiled
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def backend(self) -> str:
        return self.best.backend

    @property
    def target(self) -> Target:
        return self.best.target

    @property
    def best_outcome(self) -> Outcome:
        return next(o for o in self.outcomes if o.backend == self.best.backend and o.measurement)

    def run(self, *inputs: np.ndarray) -> list[np.ndarray]:
        return self.best.run(*inputs)

    def inference(self) -> Callable[[], Any]:
        return self.best.inference()

    def measure(self, protocol: Protocol = Protocol()) -> Measurement:
        return self.best.measure(protocol)

    def export(self, path: str | Path) -> Path:
        return self.best.export(path)

    def table(self) -> list[dict[str, Any]]:
        """One row per backend: median, its interval and trust, spread, memory, or the error."""
        return [{"backend": o.backend, "median_ms": o.measurement.median_ms if o.measurement else None,
                 "ci_ms": o.measurement.ci_ms if o.measurement else None,
                 "trusted": o.measurement.trusted if o.measurement else None,
                 "spread_ms": o.measurement.spread_ms if o.measurement else None,
                 "peak_mem_bytes": o.measurement.peak_mem_bytes if o.measurement else None,
                 "error": o.error} for o in self.outcomes]


class AutoBackend:
    """Compiles and measures on each backend in ``backends`` (default: the target's ``backends``, the spec's
    ``target.backends``, else the device's own list), keeps the fastest.

    With ``cache_dir`` the outcomes are stored under the candidate's content hash,
    so a resumed run measures nothing twice (it recompiles only the winner).
    ``incumbent_ms`` is the caller's best latency so far (the Pareto front's),
    used to skip tuning that cannot win.
    """

    name = "auto"

    def __init__(self, backends: Sequence[str | BackendRef] | None = None, cache_dir: str | Path | None = None,
                 protocol: Protocol = Protocol(), incumbent_ms: float | None = None,
                 runnable_on: Sequence[str] | None = None):
        self.backends = tuple(BackendRef.parse(b) for b in backends) if backends else None
        self.cache_dir = Path(cache_dir) if cache_dir else None
        self.protocol = protocol
        self.incumbent_ms = incumbent_ms
        self.runnable_on = tuple(runnable_on) if runnable_on is not None else None

    def unavailable_reason(self, target: Target) -> str | None:
        return None

    def _refs(self, target: Target) -> tuple[BackendRef, ...]:
        refs = self.backends or raced(target)
        if self.runnable_on is None:
            return refs
        kept = tuple(r for r in refs if r.name in self.runnable_on)
        if not kept:
            raise KernelsError(f"target.backend: auto: none of the backends {', '.join(map(str, refs))} can run this "
                               f"model (its dtype runs on {', '.join(self.runnable_on)})")
        return kept

    def compile(self, model: Model, example_inputs: Sequence[Any], target: Target) -> AutoCompiled:
        refs = self._refs(target)
        cache = self._cache_file(model, example_inputs, target, refs)
        outcomes = self._cached(cache)
        if outcomes:
            best = BackendRef.parse(min((o for o in outcomes if o.measurement), key=lambda o: o.measurement.median_ms).backend)
            compiled = self._backend(best, None).compile(model, example_inputs, target.with_backend(best))
            return AutoCompiled(compiled, outcomes)
        outcomes = []
        best_compiled, best_ms = None, float("inf")
        for ref in refs:
            incumbent = min(best_ms, self.incumbent_ms if self.incumbent_ms is not None else float("inf"))
            outcome, compiled = self._try(ref, model, example_inputs, target, incumbent, best_ms)
            outcomes.append(outcome)
            if outcome.measurement and outcome.measurement.median_ms < best_ms:
                best_compiled, best_ms = compiled, outcome.measurement.median_ms
        if best_compiled is None:
            raise KernelsError("no backend could run the model: " + "; ".join(f"{o.backend}: {o.error}" for o in outcomes))
        if self.backends is None:
            outcomes += [Outcome(str(r), error=UNTUNED_REASON) for r in untuned_out(target)]
        if cache is not None:
            write_json(cache, OUTCOMES_ARTIFACT, OUTCOMES_VERSION, [o.to_dict() for o in outcomes])
        return AutoCompiled(best_compiled, outcomes)

    def _backend(self, ref: BackendRef, incumbent_ms: float | None) -> Any:
        return get_backend(ref, cache_dir=self.cache_dir, incumbent_ms=incumbent_ms)

    def _try(self, ref: BackendRef, model: Model, example_inputs: Sequence[Any], target: Target,
             incumbent_ms: float, best_ms: float) -> tuple[Outcome, Any]:
        """Compile and measure on ``ref``; ``incumbent_ms`` bounds tuning, ``best_ms`` (this model's fastest backend so
        far) the measurement (:data:`HOPELESS`)."""
        name = str(ref)
        try:
            backend = self._backend(ref, incumbent_ms if incumbent_ms < float("inf") else None)
            reason = backend.unavailable_reason(target)
            if reason:
                return Outcome(name, error=f"unavailable: {reason}"), None
            compiled = backend.compile(model, example_inputs, target.with_backend(ref))
            ceiling = HOPELESS * best_ms if best_ms < float("inf") else None
            measurement = compiled.measure(replace(self.protocol, ceiling_ms=ceiling))
        except KernelsError as exc:
            return Outcome(name, error=str(exc)), None
        except Exception as exc:  # a crash in one backend is recorded, never fatal to the caller
            return Outcome(name, error=f"crashed: {type(exc).__name__}: {exc}"), None
        tuning = getattr(compiled, "tuning", None)
        return Outcome(name, measurement, tuning=tuning.to_dict() if tuning is not None else None), compiled

    def _cache_file(self, model: Model, example_inputs: Sequence[Any], target: Target,
                    refs: Sequence[BackendRef]) -> Path | None:
        if self.cache_dir is None:
            return None
        key = content_hash(model_key(model, example_inputs), target.to_dict(), target.machine_key(),
                           {str(r): backend_version(r) for r in refs}, self.protocol.__dict__)
        return self.cache_dir / "kernels" / "outcomes" / f"{key}.json"

    @staticmethod
    def _cached(cache: Path | None) -> list[Outcome]:
        """The recorded outcomes; none when the file is absent, torn, of another version, or holds no measurement."""
        data = read_json(cache, OUTCOMES_ARTIFACT, OUTCOMES_VERSION) if cache is not None else None
        try:
            outcomes = [Outcome.from_dict(d) for d in data or ()]
        except (KeyError, TypeError, ValueError):
            return []
        return outcomes if any(o.measurement for o in outcomes) else []
