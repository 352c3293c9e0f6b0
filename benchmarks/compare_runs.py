"""Do two ``qaopt optimize`` run folders reach the same decisions? (a refactor must not change them)

Reads each folder's ``result.json`` and ``region.json`` as JSON (any result version,
so a run of an older qaopt compares with a newer one) and prints, side by side: the
chosen application-aware and application-agnostic configurations (candidate keys,
knobs, backend, schedule), every closed-loop validation, the speedups, and the
calibrated region's simulator observations. Exits 1 when a decision differs.

    python benchmarks/compare_runs.py OLD_RUN_DIR NEW_RUN_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def _read(path: Path) -> dict:
    doc = json.loads(path.read_text())
    return doc["data"] if isinstance(doc, dict) and "artifact" in doc else doc


def _configuration(config: dict | None) -> object:
    if config is None:
        return None
    return {
        "trial": config["trial"],
        "schedule": config["schedule"],
        "nns": {n: (c["candidate"], c["knobs"]["dtype"], c["knobs"]["prune_ratio"], c["knobs"]["finetune_steps"],
                    c["backend"]) for n, c in config["nns"].items()},
    }


def decisions(run: Path) -> dict[str, object]:
    result, region = _read(run / "result.json"), _read(run / "region.json")
    return {
        "aware": _configuration(result["aware"]),
        "agnostic": _configuration(result["agnostic"]),
        "validations": [(v["trial"], v["runs"], v["passes"], v["failures"], v["verdict"]) for v in result["validations"]],
        "agnostic validation": (lambda v: v and (v["runs"], v["passes"], v["failures"]))(result["agnostic_validation"]),
        # The ratios alone: their intervals (result version 5) come from the side-by-side timing of each run.
        "speedups": {k: round(v, 6) if v is not None else None for k, v in result["speedups"].items()
                     if not isinstance(v, dict)},
        "calibrated observations": sorted(
            (tuple(sorted((k, round(x, 9)) for k, x in o["errors"].items())), o["passes"], o["failures"])
            for o in region["observations"] if o.get("source", "simulator") == "simulator"),
    }


def main(old: str, new: str) -> int:
    a, b = decisions(Path(old)), decisions(Path(new))
    differ = False
    for key in a:
        same = a[key] == b[key]
        differ |= not same
        print(f"{key}: {'same' if same else 'DIFFERENT'}")
        print(f"  {old}: {a[key]}")
        if not same:
            print(f"  {new}: {b[key]}")
    return int(differ)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
