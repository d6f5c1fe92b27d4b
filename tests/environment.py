"""Where the tests run: a capability this machine lacks is a skip here and a failure in CI.

In CI a test that was never tried proves nothing, so it must not pass as a skip.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest


def in_ci() -> bool:
    """True when running in CI (``CI`` set to anything but empty/0/false)."""
    return os.environ.get("CI", "").strip().lower() not in {"", "0", "false", "no"}


def cannot_run_here(reason: str) -> NoReturn:
    """Skip on a developer machine; fail in CI, saying why."""
    if in_ci():
        pytest.fail(f"{reason} (CI is set, so this is an error)")
    pytest.skip(reason)
