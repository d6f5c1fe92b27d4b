"""What a benchmark ran on, printed with its numbers."""

from __future__ import annotations

import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU model from /proc/cpuinfo, or 'unknown CPU'."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def describe() -> str:
    """CPU model, cores, Python, torch threads and the load when the run started."""
    import torch

    return (
        f"{cpu_model()}, {os.cpu_count()} cores (nproc), Python {platform.python_version()}, "
        f"torch {torch.__version__} with {torch.get_num_threads()} threads, CPU only "
        f"(1-minute load average {os.getloadavg()[0]:.1f} at start)"
    )
