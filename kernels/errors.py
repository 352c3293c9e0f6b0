"""Errors of the kernels component.

Each one says which backend and which model (or operator, or device) is at
fault, and what to do about it, so that a search over many candidates can
record the failure of one and carry on with the rest.
"""

from __future__ import annotations

from qaopt.app_spec.errors import QaoptError


class KernelsError(QaoptError):
    """Base class: a model could not be compiled, run or measured on a target."""


class BackendUnavailableError(KernelsError):
    """The backend cannot be used on this machine or for this target device."""


class UnsupportedModelError(KernelsError):
    """The backend cannot take this kind of model (an ONNX file on torch, a bf16 net on onnxruntime)."""


class UnsupportedOperatorError(UnsupportedModelError):
    """The model holds an operator the backend has no implementation of."""

    def __init__(self, operator: str, backend: str, model: str = "model", hint: str = ""):
        self.operator = operator
        self.backend = backend
        fix = hint or "replace the operator in the model, or choose another backend (target.backend)"
        super().__init__(f"{model}: operator '{operator}' is not supported by backend '{backend}'; {fix}")


class BuildError(KernelsError):
    """Compiling (or tuning) a model failed inside the backend."""


class MeasurementError(KernelsError):
    """Running or timing a compiled model failed (a crash, a lost remote device)."""


def missing_engine(module: str, extra: str) -> str | None:
    """Why a backend whose engine (the Python package ``module``) is not installed cannot run, or ``None``.

    The engines are qaopt's extras, so the reason names the extra that brings the tested version.
    """
    import importlib.util

    if importlib.util.find_spec(module) is not None:
        return None
    return f"{module} is not installed; install it with: pip install 'qaopt[{extra}]'"
