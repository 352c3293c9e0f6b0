"""The backend registry: names a spec can use in ``target.backend``, and the typed reference to one.

A backend is registered under a plain name, with the variants it accepts::

    register_backend("torch", TorchBackend.factory, variants=("channels_last",))

and referred to by a :class:`BackendRef`, written ``name`` or ``name[variant]``
in YAML, JSON and tables (``torch[channels_last]``). :func:`BackendRef.parse` is
the one place that reads that text; everything else handles the typed reference.

A backend also declares what it runs: the dtypes it has kernels for and the devices
it serves (``register_backend("onnxruntime", ..., dtypes=("fp32", "int8"),
devices=("cpu", "cuda"))``), or the dtypes per device where they differ
(``dtypes={"cpu": ("fp32", "int8"), "cuda": ("fp32", "fp16")}``: TVM's integer kernels
are CPU (VNNI) kernels, its fp16 ones GPU kernels). :func:`backends_running` answers "which backends run
int8" from those declarations alone, so a plugin's backend (a vendor NPU runtime,
TensorRT) is offered int8 candidates by declaring it, and the search never hands a
backend a dtype it would only emulate.

The built-in backends are registered by :mod:`.builtin` when ``qaopt.kernels`` is
imported; this module imports no backend, so nothing here forms an import circle.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from qaopt.app_spec.schema import BACKEND_REF_PATTERN, DEVICES

from .errors import BackendUnavailableError

_REF = re.compile(BACKEND_REF_PATTERN)
HOW_TO_REGISTER = ("register one with qaopt.kernels.register_backend(name, factory) before the spec is loaded "
                   "(see docs/extending.md, 'Adding a backend')")


@dataclass(frozen=True, eq=False)
class BackendRef:
    """A backend by name, optionally one of its variants (``BackendRef("torch", "channels_last")``).

    ``str()`` gives the spec's spelling (``torch[channels_last]``), used in tables
    and JSON. A reference compares equal to that spelling too, so that code and
    specs that hold the plain string (``target.backend == "auto"``) read naturally.
    """

    name: str
    variant: str | None = None

    def __post_init__(self) -> None:
        if not _REF.match(self.name) or "[" in self.name or (self.variant is not None and not _REF.match(self.variant)):
            raise BackendUnavailableError(f"target.backend: '{self}' is not a backend name (letters, digits, '-', '_', "
                                          "'.', optionally a variant in brackets: torch[channels_last])")

    @classmethod
    def parse(cls, ref: str | BackendRef) -> BackendRef:
        """``"torch[channels_last]"`` -> ``BackendRef("torch", "channels_last")``; a reference is returned as is."""
        if isinstance(ref, BackendRef):
            return ref
        match = _REF.match(str(ref))
        if match is None:
            raise BackendUnavailableError(f"target.backend: '{ref}' is not a backend name (letters, digits, '-', '_', "
                                          "'.', optionally a variant in brackets: torch[channels_last])")
        return cls(match["name"], match["variant"])

    def __str__(self) -> str:
        return f"{self.name}[{self.variant}]" if self.variant else self.name

    def __eq__(self, other: object) -> bool:
        if isinstance(other, (BackendRef, str)):
            return str(self) == str(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(str(self))


FLOAT = "fp32"
"""The dtype every backend runs unless it declares otherwise: the float model as trained."""


@dataclass(frozen=True)
class _Entry:
    factory: Callable[..., Any]
    variants: tuple[str, ...]
    package: str | None
    dtypes: dict[str, tuple[str, ...]]
    """Device -> the dtypes the backend has kernels for there; its keys are the devices it serves."""

    @property
    def devices(self) -> tuple[str, ...]:
        return tuple(self.dtypes)

    def dtypes_on(self, device: str | None) -> tuple[str, ...]:
        """The dtypes it runs on ``device``, or on any device it serves (``None``), in declaration order."""
        if device is not None:
            return self.dtypes.get(device, ())
        return tuple(dict.fromkeys(d for dtypes in self.dtypes.values() for d in dtypes))


_REGISTRY: dict[str, _Entry] = {}


def register_backend(name: str, factory: Callable[..., Any], *, variants: Sequence[str] = (),
                     package: str | None = None, dtypes: Sequence[str] | Mapping[str, Sequence[str]] = (FLOAT,),
                     devices: Sequence[str] | None = None) -> None:
    """Add a backend (a team's own compiler, say) under ``name``; a spec can then name it in ``target.backend``.

    ``factory(**options)`` returns a :class:`~qaopt.kernels.Backend`; options are
    ``cache_dir`` and ``incumbent_ms`` (accept and ignore what you do not use), and
    ``variant`` when the spec names one of ``variants`` (``name[variant]``).
    ``package`` is the distribution that implements it: its installed version is
    part of every cache key of the backend's measurements and tuning records.
    ``dtypes`` are the dtypes it has kernels for (the names of the quantization pass:
    ``fp32``, ``bf16``, ``fp16``, ``int8``): the search gives it candidates of those
    only. ``devices`` are the target devices it serves (``cpu``, ``cuda``, ``rpc``; by
    default all of them, its ``unavailable_reason`` having the last word on this machine).
    Where its kernels differ by device, ``dtypes`` maps each device it serves to its dtypes
    there, and ``devices`` is left out.
    """
    ref = BackendRef.parse(name)
    if ref.variant:
        raise BackendUnavailableError(f"register_backend: '{name}': register the plain name and list the variant "
                                      f"in variants=('{ref.variant}',)")
    if isinstance(dtypes, Mapping):
        if devices is not None:
            raise BackendUnavailableError(f"register_backend: '{name}': dtypes per device name the devices it serves; "
                                          "leave devices out")
        per_device = {device: tuple(ds) for device, ds in dtypes.items()}
    else:
        per_device = {device: tuple(dtypes) for device in (DEVICES if devices is None else devices)}
    unknown = [d for d in per_device if d not in DEVICES]
    if unknown:
        raise BackendUnavailableError(f"register_backend: '{name}': no device named {', '.join(map(repr, unknown))}; "
                                      f"devices are {', '.join(DEVICES)}")
    _REGISTRY[ref.name] = _Entry(factory, tuple(variants), package, per_device)


def unregister_backend(name: str) -> None:
    """Remove the backend ``name`` (a test's, a plugin's); unknown names are ignored."""
    _REGISTRY.pop(BackendRef.parse(name).name, None)


def resolve(ref: str | BackendRef) -> BackendRef:
    """The reference to a registered backend; an unknown name or variant is a clear error that lists the known ones."""
    ref = BackendRef.parse(ref)
    entry = _REGISTRY.get(ref.name)
    if entry is None:
        raise BackendUnavailableError(f"target.backend: no backend named '{ref.name}'; registered: "
                                      f"{', '.join(backend_names())}. To use another, {HOW_TO_REGISTER}")
    if ref.variant is not None and ref.variant not in entry.variants:
        known = ", ".join(entry.variants) or "none"
        raise BackendUnavailableError(f"target.backend: backend '{ref.name}' has no variant '{ref.variant}' "
                                      f"(its variants: {known})")
    return ref


def get_backend(ref: str | BackendRef, **options: Any) -> Any:
    """The backend ``ref`` names ('torch', 'torch[channels_last]', 'tvm', 'onnxruntime', 'auto', …).

    ``options`` go to the backend's factory (e.g. ``cache_dir`` for 'tvm' and 'auto').
    """
    ref = resolve(ref)
    if ref.variant is not None:
        options["variant"] = ref.variant
    return _REGISTRY[ref.name].factory(**options)


def backend_names() -> list[str]:
    """Every name a spec may use in ``target.backend``, variants included."""
    return sorted(str(BackendRef(name, v)) for name, entry in _REGISTRY.items() for v in (None, *entry.variants))


def backends_running(dtype: str, device: str | None = None) -> tuple[str, ...]:
    """The backends (plain names, in registration order) that declare kernels for ``dtype`` (and serve ``device``,
    when one is given)."""
    return tuple(name for name, entry in _REGISTRY.items() if dtype in entry.dtypes_on(device))


def backend_dtypes(ref: str | BackendRef, device: str | None = None) -> tuple[str, ...]:
    """The dtypes a registered backend declares kernels for (on ``device``, or on any device it serves)."""
    return _REGISTRY[resolve(ref).name].dtypes_on(device)


def backend_devices(ref: str | BackendRef) -> tuple[str, ...]:
    """The target devices a registered backend declares it serves."""
    return _REGISTRY[resolve(ref).name].devices


def backend_version(ref: str | BackendRef) -> str:
    """``package==version`` of the distribution behind a backend ('' when it registered none, 'not installed')."""
    from importlib import metadata

    package = _REGISTRY[resolve(ref).name].package
    if package is None:
        return ""
    try:
        return f"{package}=={metadata.version(package)}"
    except metadata.PackageNotFoundError:
        return f"{package} not installed"
