"""SIGKILL a real `kb ingest` mid-way: nothing committed is lost, nothing half-indexed is visible."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from tests.environment import cannot_run_here, unshare_reason

# Enough documents that the kill lands long before the last, each a few chunks long
# (the kill lands while one is being embedded); few enough to ingest the rest quickly after.
N_DOCS = 20
PARAGRAPHS = 8


def _write_corpus(folder: Path) -> None:
    folder.mkdir()
    for i in range(N_DOCS):
        paras = "\n\n".join(
            f"Paragraph {j} of document {i}: the service number {i * 100 + j} restarts nightly "
            f"and its logs rotate every {j + 1} days unless the flag keep_logs_{i} is set."
            for j in range(PARAGRAPHS)
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


# What opening a knowledge base does about interrupted work, without loading the model.
OPEN_AND_RECOVER = (
    "import json, sys; from pathlib import Path; from index.storage.store import Store; "
    "print(json.dumps(Store(Path(sys.argv[1])).recover_interrupted()))"
)


def _as_pid_1(args: list[str], data_dir: Path, **kwargs: Any) -> subprocess.Popen[bytes]:
    """``python ARGS`` as pid 1 of a fresh pid namespace, as a container starts the bot."""
    env = {**os.environ, "KB_DATA_DIR": str(data_dir), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen(
        ["unshare", "--pid", "--fork", sys.executable, *args],
        env=env,
        cwd=Path(__file__).resolve().parents[1],
        start_new_session=True,
        **kwargs,
    )


def _states(db: Path) -> dict[str, str]:
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return dict(conn.execute("SELECT name, state FROM documents").fetchall())
    except sqlite3.Error:
        return {}


def test_indexing_killed_in_a_container_is_recovered_by_the_next_pid_1(
    tmp_path: Path, embedder: Embedder
) -> None:
    reason = unshare_reason()
    if reason:
        cannot_run_here(reason)
    data_dir = tmp_path / "data"
    big = tmp_path / "big.md"
    big.write_text(
        "# Big\n\n"
        + "\n\n".join(f"Paragraph {i}: service {i} restarts at {i % 24}:00." for i in range(800))
    )
    proc = _as_pid_1(["-m", "bot.cli", "ingest", str(big)], data_dir, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    try:
        while _states(data_dir / "kb.sqlite").get("big.md") != "indexing":
            assert proc.poll() is None, "ingest ended before it was caught indexing"
            assert time.monotonic() < deadline, "ingest never started indexing"
            time.sleep(0.02)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=30)
    assert _states(data_dir / "kb.sqlite") == {"big.md": "indexing"}

    # The next process is pid 1 as well: the dead one's pid is "alive" again.
    opened = _as_pid_1(["-c", OPEN_AND_RECOVER, str(data_dir)], data_dir, stdout=subprocess.PIPE)
    out, _ = opened.communicate(timeout=60)
    assert opened.returncode == 0
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    [doc] = kb.documents()
    assert json.loads(out) == [doc.id]
    assert doc.state == "failed"
    assert doc.failure_reason == "Indexing was interrupted before it finished; retry it."
    assert [p.name for p in (data_dir / "locks").iterdir()] == []  # the dead one's is swept
    assert kb.retry(doc.id).state == "indexed"


def test_a_live_process_keeps_its_documents_indexing(
    index_dir: Path, embedder: Embedder, database_url: str
) -> None:
    config = IndexConfig(data_dir=index_dir, database_url=database_url)
    kb = KnowledgeBase(config, embedder=embedder)
    doc = kb.add_bytes(b"# Handbook\n\nClaims are due in 30 days.\n", "handbook.md").document
    with kb.store.worker.working(doc.id) as holder:
        kb.store.mark_indexing(doc.id, holder)
        # Another process (here: another opening) sees a live holder and leaves it alone.
        other = KnowledgeBase(config, embedder=embedder)
        assert other.store.document(doc.id).state == "indexing"
        assert other.store.recover_interrupted() == []
    # Its holder stopped working on it without finishing: the next recovery fails it.
    assert kb.store.recover_interrupted() == [doc.id]
    assert kb.store.document(doc.id).state == "failed"
