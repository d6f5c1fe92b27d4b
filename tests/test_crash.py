"""SIGKILL a real `kb ingest` mid-way: nothing committed is lost, nothing half-indexed is visible."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase

N_DOCS = 40


def _write_corpus(folder: Path) -> None:
    folder.mkdir()
    for i in range(N_DOCS):
        paras = "\n\n".join(
            f"Paragraph {j} of document {i}: the service number {i * 100 + j} restarts nightly "
            f"and its logs rotate every {j + 1} days unless the flag keep_logs_{i} is set."
            for j in range(25)
        )
        (folder / f"doc{i:02d}.md").write_text(f"# Document {i}\n\n## Part\n\n{paras}\n")


def _indexed_count(db: Path) -> int:
    if not db.exists():
        return 0
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return conn.execute(
                "SELECT COUNT(*) FROM documents WHERE state = 'indexed'"
            ).fetchone()[0]
    except sqlite3.Error:
        return 0


def test_sigkill_mid_ingest_loses_nothing_committed(tmp_path: Path, embedder: Embedder) -> None:
    corpus = tmp_path / "corpus"
    _write_corpus(corpus)
    data_dir = tmp_path / "data"
    env = {**os.environ, "KB_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "bot.cli", "ingest", str(corpus)],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    db = data_dir / "kb.sqlite"
    deadline = time.monotonic() + 120
    try:
        while _indexed_count(db) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        assert proc.poll() is None, (
            "ingest finished before it could be killed; make the corpus larger"
        )
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    committed = _indexed_count(db)
    assert 3 <= committed < N_DOCS

    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    docs = kb.store.documents()
    assert not [d for d in docs if d.state == "indexing"], "a half-indexed document is visible"
    for d in docs:
        rows = kb.store.chunk_rows(d.id)
        if d.state == "indexed":
            assert d.chunk_count == len(rows) > 0
        else:
            assert rows == [], f"{d.name} is {d.state} but has chunks"
    assert len([d for d in docs if d.state == "indexed"]) == committed
    check = kb.indexes.check()
    assert check["in_sync"] is True
    assert check["faiss_vectors"] == check["searchable_chunks"] == kb.store.chunk_count()
    assert np.array_equal(
        np.sort(kb.snapshot.vectors.ids()), np.sort(np.asarray(kb.snapshot.bm25.chunk_ids))
    )

    # ingesting the folder again completes the rest without duplicates
    summary = kb.ingest_paths([corpus])
    assert len(summary.unchanged) == committed
    states = [d.state for d in kb.store.documents()]
    assert states.count("indexed") == N_DOCS
    assert kb.indexes.check()["in_sync"] is True
