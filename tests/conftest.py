"""Shared fixtures. Tests run single-threaded: CI machines have 2 cores."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_SPEC = REPO / "examples" / "cropfollow.yaml"
APPS = REPO / "tests" / "apps"
# Test applications (tests/apps/*.py) are named in specs as `module:attr` entry points.
sys.path.insert(0, str(APPS))

from specs import CALIBRATE_SPEC  # noqa: E402 - tests/apps is on the path only now


# Commands run their simulator runs in this process unless a test asks for a pool or a cluster
# (tests/test_scale_out.py): a pool per test would cost seconds and hide monkeypatched objects.
os.environ.setdefault("QAOPT_WORKERS", "1")


@pytest.fixture(autouse=True, scope="session")
def _single_threaded_torch():
    try:
        import torch
    except ImportError:  # the field tests run without torch in a subprocess
        return
    torch.set_num_threads(1)


@pytest.fixture
def example_spec_path() -> Path:
    """The shipped CropFollow spec."""
    return EXAMPLE_SPEC





@pytest.fixture
def spec_file(tmp_path, monkeypatch):
    """``spec_file(limits)`` writes a small ``qaopt calibrate`` spec on the synthetic app (runs in seconds)."""
    monkeypatch.setenv("QAOPT_CACHE_DIR", str(tmp_path / "cache"))

    def write(limits: str = "{heading: 10.0, distance: 0.1}"):
        path = tmp_path / "app.yaml"
        path.write_text(textwrap.dedent(CALIBRATE_SPEC).replace("{LIMITS}", limits))
        return path

    return write
