"""Shared fixtures. Tests run single-threaded: CI machines have 2 cores."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE_SPEC = REPO / "examples" / "cropfollow.yaml"
APPS = REPO / "tests" / "apps"
# Test applications (tests/apps/*.py) are named in specs as `module:attr` entry points.
sys.path.insert(0, str(APPS))


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
