"""Other users of the server's machine read nothing of the knowledge base.

The attacker is a local account on the same host: with a permissive umask
every file the bot creates would be world-readable (document text, questions,
user ids). The data dir is 0700 and every file in it 0600, whatever the umask,
and a data dir made with looser permissions is tightened when it is opened.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from core.config import EngineConfig
from core.links import load_or_create_secret
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase


@pytest.fixture
def open_umask() -> Iterator[None]:
    old = os.umask(0o000)
    try:
        yield
    finally:
        os.umask(old)


def _modes(root: Path) -> dict[str, int]:
    out = {".": stat.S_IMODE(root.stat().st_mode)}
    for path in root.rglob("*"):
        out[str(path.relative_to(root))] = stat.S_IMODE(path.lstat().st_mode)
    return out


def _loose(modes: dict[str, int], root: Path) -> dict[str, str]:
    return {
        name: oct(mode)
        for name, mode in modes.items()
        if mode & 0o077 or ((root / name).is_dir() and mode != 0o700)
    }


def test_everything_the_bot_writes_is_private(
    tmp_path: Path, embedder: Embedder, open_umask: None
) -> None:
    data_dir = tmp_path / "kb-data"
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    kb.ingest_bytes(b"# Payroll\n\nSalaries are paid on the 25th.\n", "payroll.md")
    kb.reindex()
    load_or_create_secret(data_dir, EngineConfig().link_secret)
    modes = _modes(data_dir)
    # The database, its WAL, an original, the derived indexes and the lock all exist...
    names = set(modes)
    assert {"kb.sqlite", "kb.sqlite-wal", "reindex.lock", "link-secret"} <= names
    assert any(n.startswith("originals/") and len(n) > 20 for n in names)
    assert any(n.startswith("index/") for n in names)
    # ...and none of them is readable by anyone but the bot's user.
    assert _loose(modes, data_dir) == {}


def test_a_loose_data_dir_is_tightened_when_opened(tmp_path: Path, embedder: Embedder) -> None:
    data_dir = tmp_path / "kb-data"
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    kb.ingest_bytes(b"# Payroll\n\nSalaries are paid on the 25th.\n", "payroll.md")
    del kb
    os.chmod(data_dir, 0o755)
    os.chmod(data_dir / "kb.sqlite", 0o644)
    KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert stat.S_IMODE((data_dir / "kb.sqlite").stat().st_mode) == 0o600
