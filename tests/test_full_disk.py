"""A full disk degrades the knowledge base; it never makes it unreadable.

The data dir lives on a tiny tmpfs the test mounts (root only; skipped with the
reason otherwise), filled up to the last byte the way a busy server's disk is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase

HANDBOOK = b"# Handbook\n\nExpense claims are due within 30 days of purchase.\n"


def _mountable() -> str | None:
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    if shutil.which("mount") is None:
        return "no mount command"
    return None


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    reason = _mountable()
    if reason:
        pytest.skip(reason)
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], check=False)


def _fill(disk: Path) -> None:
    """Take every free byte of ``disk``."""
    fd = os.open(disk / "ballast", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        for size in (1 << 20, 1 << 12, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
    finally:
        os.close(fd)


def test_index_files_that_cannot_be_saved_leave_the_answers_in_memory(
    small_disk: Path, embedder: Embedder
) -> None:
    data_dir = small_disk / "kb"
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    kb.ingest_bytes(HANDBOOK, "handbook.md")
    # The index files go missing and the disk fills up: they cannot be written again.
    for path in (kb.indexes.vectors_path, kb.indexes.bm25_path):
        path.unlink()
    _fill(small_disk)
    reopened = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    snapshot = reopened.indexes.open()
    assert len(snapshot) == 1
    status = reopened.status()
    assert status["index"]["in_sync"] is True
    assert "could not be saved" in str(status["index"]["degraded"])
    # Freeing space ends the degraded state at the next save.
    (small_disk / "ballast").unlink()
    reopened.indexes.rebuild()
    assert reopened.status()["index"]["degraded"] is None
    assert reopened.indexes.vectors_path.exists()
