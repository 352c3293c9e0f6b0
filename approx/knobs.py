"""The knobs of one candidate NN: every registered pass's knobs, flat, plus the seed.

A :class:`Knobs` value is one point of the search space; together with the base NN,
its data and the fine-tuning recipe it determines a candidate completely, so its
:meth:`~Knobs.identity` is part of the candidate's cache key. Which knobs exist is
not written here: each pass declares its own (:mod:`qaopt.approx.passes`), and a
knob left out keeps the setting that leaves the NN as it is.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

from .passes import knob_owners, passes


class Knobs(BaseModel):
    """One setting of every approximation knob of an NN, e.g. ``Knobs(prune_ratio=0.5, dtype="int8")``.

    Knobs are read as attributes (``knobs.prune_ratio``); :func:`knob_names` lists
    them. ``seed`` seeds everything random in building the candidate.
    """

    model_config = ConfigDict(extra="allow", frozen=True)

    seed: int = 0

    @model_validator(mode="before")
    @classmethod
    def _validate_per_pass(cls, data: Any) -> dict[str, Any]:
        data = dict(data.model_dump() if isinstance(data, BaseModel) else data or {})
        out: dict[str, Any] = {"seed": data.pop("seed", 0)}
        unknown = sorted(set(data) - set(knob_owners()))
        if unknown:
            raise ValueError(f"no such knob {', '.join(map(repr, unknown))}; knobs are {', '.join(knob_names())}")
        for p in passes():
            try:
                out.update(p.Knobs.model_validate({k: data[k] for k in p.Knobs.model_fields if k in data}).model_dump())
            except ValidationError as exc:
                err = exc.errors()[0]
                raise ValueError(f"{'.'.join(map(str, err['loc']))}: {err['msg']}") from None
        return out

    @property
    def runnable_on(self) -> tuple[str, ...]:
        """The backends (names as in the spec's ``target.backend``) with kernels for this candidate."""
        allowed: tuple[str, ...] | None = None
        for p in passes():
            mine = p.runnable_on(self)
            if mine is not None:
                allowed = mine if allowed is None else tuple(b for b in allowed if b in mine)
        return allowed if allowed is not None else ()

    def identity(self) -> dict:
        """The knobs as they determine a candidate: a pass adds its knobs only when it changes the model."""
        return self._identity(passes())

    def float_part(self) -> dict:
        """The part of :meth:`identity` that shapes the float model (everything the export passes set is left out)."""
        return self._identity(passes("float"))

    def _identity(self, chosen: list) -> dict:
        out: dict[str, Any] = {}
        for p in chosen:
            out.update(p.identity(self))
        return {**out, "seed": self.seed}

    def check(self, nn: str, backend: str | None = None) -> None:
        """Raise :class:`~qaopt.approx.ApproxError` for values no model could take, or a backend without kernels for them."""
        for p in passes():
            p.check(self, nn, None if backend == "auto" else backend)


def knob_names() -> list[str]:
    """Every knob of every registered pass, in pass order, then ``seed``."""
    return [*knob_owners(), "seed"]


def describe(knobs: Knobs | dict[str, Any]) -> dict[str, str]:
    """Report columns for one NN's knobs: label -> value as text, every registered pass in order.

    Accepts a :class:`Knobs` or its ``model_dump`` (as ``result.json`` stores it).
    """
    knobs = knobs if isinstance(knobs, Knobs) else Knobs.model_validate(knobs)
    out: dict[str, str] = {}
    for p in passes():
        out.update(p.describe(knobs))
    return out
