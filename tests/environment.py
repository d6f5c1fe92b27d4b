"""Where the tests run: a capability this machine lacks is a skip here and a failure in CI.

In CI a test that was never tried proves nothing, so it must not pass as a skip.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
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


def unshare_reason() -> str | None:
    """Why a process cannot start in a new pid namespace here (``unshare --pid``); ``None``: it can."""
    if shutil.which("unshare") is None:
        return "no unshare command"
    probe = subprocess.run(
        ["unshare", "--pid", "--fork", sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0 or probe.stdout.strip() != "1":
        return f"cannot start a process in a new pid namespace here: {probe.stderr.strip()}"
    return None
