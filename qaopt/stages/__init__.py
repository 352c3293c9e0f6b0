"""The stages of ``qaopt optimize``: one module each, registered with :func:`qaopt.pipeline.register_stage`.

Region (:mod:`.region`), reference (:mod:`.reference`), pruning ladders (:mod:`.ladders`),
the two studies (:mod:`.studies`, with the in-search checks of :mod:`.checks`), validation
(:mod:`.validation`), side-by-side measurement (:mod:`.comparison`), and export with the
report (:mod:`.export`, :mod:`.report`); ``docs/architecture.md`` tables each one's inputs,
artifact and the key it is recomputed under. Importing this package registers every stage
module in it, so a new stage is one new file here (or a plugin module that registers its own).

Every artifact is written through :mod:`qaopt.app_spec.store` (atomic, versioned), so
a run killed at any point resumes: a stage whose artifact exists under its key is
read back, anything torn or stale is recomputed. The calibrated region is never
rewritten by a later stage; what validation learns is its own artifact, folded in by
the region stage of the next build.
"""

from __future__ import annotations

import importlib
import pkgutil


def _register_builtin_stages() -> None:
    for module in sorted(m.name for m in pkgutil.iter_modules(__path__)):
        importlib.import_module(f"{__name__}.{module}")


_register_builtin_stages()
