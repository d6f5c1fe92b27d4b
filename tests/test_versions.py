"""Publishing rules, versions and the audit log in the knowledge base, and their `kb` commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.cli import main
from index.config import IndexConfig
from index.embed import Embedder
from index.errors import NotAwaitingApproval, NotRestorable
from index.knowledge_base import KnowledgeBase
from index.models import Publish

CHANNEL = "C0CHAN0001"
V1 = b"# Expenses\n\n## Claims\n\nSubmit expense claims within 30 days, with every receipt.\n"
V2 = b"# Expenses\n\n## Claims\n\nSubmit expense claims within 45 days, with every receipt.\n"
V3 = b"# Expenses\n\n## Claims\n\nSubmit expense claims within 60 days, with every receipt.\n"


@pytest.fixture
def kb(index_dir: Path, embedder: Embedder, database_url: str) -> KnowledgeBase:
    # On SQLite and on Postgres (tests.postgres).
    config = IndexConfig(data_dir=index_dir, database_url=database_url)
    return KnowledgeBase(config, embedder=embedder)


def _searchable_docs(kb: KnowledgeBase, query: str = "expense claims days") -> set[int]:
    """Documents whose chunks the search snapshot returns for ``query`` (dense or BM25)."""
    snap = kb.snapshot
    ids = {c for c, _ in snap.vectors.search(kb.embedder.encode_query(query), 50)}
    ids |= {c for c, _ in snap.bm25.search(query, 50)}
    return {row.document_id for row in kb.store.chunks_by_id(sorted(ids)).values()}


def _ingest(kb: KnowledgeBase, data: bytes, **kwargs: object) -> int:
    return kb.ingest_bytes(data, "expenses.md", **kwargs).document.id  # type: ignore[arg-type]


def _actions(kb: KnowledgeBase) -> list[tuple[str, str, int | None]]:
    """The audit log oldest first, as (actor, action, document id)."""
    return [(e.actor, e.action, e.document_id) for e in reversed(kb.audit_log.entries())]


def test_a_document_awaiting_approval_is_indexed_but_never_searched(kb: KnowledgeBase) -> None:
    current = _ingest(kb, V1, uploader="U0ADMIN")
    waiting = _ingest(kb, V2, uploader="U0MEMBER", publish=Publish.APPROVAL)
    row = kb.store.document(waiting)
    assert row.state == "awaiting_approval" and row.chunk_count > 0
    assert _searchable_docs(kb) == {current}
    assert kb.status()["index"]["in_sync"] is True

    published = kb.approve(waiting, actor="U0ADMIN")
    assert published.document.state == "indexed"
    assert [r.id for r in published.replaced] == [current]
    assert kb.store.document(current).state == "replaced"
    assert _searchable_docs(kb) == {waiting}
    assert _actions(kb) == [
        ("U0ADMIN", "add", current),
        ("U0MEMBER", "submit", waiting),
        ("U0ADMIN", "approve", waiting),
    ]
    approved = kb.audit_log.entries(1)[0]
    assert (approved.old_sha256, approved.new_sha256) == (
        kb.store.document(current).sha256,
        published.document.sha256,
    )
    with pytest.raises(NotAwaitingApproval):
        kb.reject(waiting, actor="U0ADMIN")


def test_a_rejected_document_is_gone_with_its_original(kb: KnowledgeBase) -> None:
    current = _ingest(kb, V1, uploader="U0ADMIN")
    waiting = kb.store.document(_ingest(kb, V2, uploader="U0MEMBER", publish=Publish.APPROVAL))
    kb.reject(waiting.id, actor="U0ADMIN")
    assert [d.id for d in kb.documents()] == [current]
    assert not kb.store.originals.has(waiting.sha256)
    (entry,) = kb.audit_log.entries(1)
    assert (entry.action, entry.actor, entry.new_sha256) == ("reject", "U0ADMIN", waiting.sha256)
    with pytest.raises(NotAwaitingApproval, match="rejected or removed"):
        kb.approve(waiting.id, actor="U0ADMIN")


def test_a_member_replaces_only_their_own_channel_document(kb: KnowledgeBase) -> None:
    theirs = _ingest(kb, V1, uploader="U0ALICE", scope=CHANNEL, publish=Publish.OWN)
    mine = _ingest(kb, V2, uploader="U0BOB", scope=CHANNEL, publish=Publish.OWN)
    assert kb.store.document(theirs).state == "indexed"
    assert kb.placement(mine).beside[0].id == theirs and kb.placement(mine).replaced == []
    newer = _ingest(kb, V3, uploader="U0BOB", scope=CHANNEL, publish=Publish.OWN)
    assert kb.store.document(mine).state == "replaced"
    assert kb.store.document(theirs).state == "indexed"
    assert [r.id for r in kb.placement(newer).replaced] == [mine]
    assert _actions(kb)[-1] == ("U0BOB", "replace", newer)


def test_restore_brings_the_previous_version_back_and_again_swaps(kb: KnowledgeBase) -> None:
    first = _ingest(kb, V1, uploader="U0ADMIN")
    second = _ingest(kb, V2, uploader="U0ADMIN")
    assert _searchable_docs(kb) == {second}

    restored = kb.restore(second, actor="cli")  # the document: its previous version comes back
    assert restored.document.id == first and [r.id for r in restored.replaced] == [second]
    assert _searchable_docs(kb) == {first}
    assert "30 days" in kb.canonical_text(first)
    assert kb.store.find_document("expenses.md").id == first, "the name finds the live version"
    entry = kb.audit_log.entries(1)[0]
    assert (entry.action, entry.actor, entry.document_id) == ("restore", "cli", first)
    assert entry.old_sha256 == kb.store.document(second).sha256

    kb.restore(second)  # the replaced version itself
    assert _searchable_docs(kb) == {second}
    with pytest.raises(NotRestorable):
        kb.restore(kb.ingest_bytes(b"# Canteen\n\nIt opens at noon.\n", "canteen.md").document.id)


def test_only_the_last_versions_are_kept(index_dir: Path, embedder: Embedder) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir, keep_versions=2), embedder=embedder)
    first = kb.store.document(_ingest(kb, V1))
    second = _ingest(kb, V2)
    third = _ingest(kb, V3)
    assert [(d.id, d.state) for d in kb.documents()] == [(second, "replaced"), (third, "indexed")]
    assert not kb.store.originals.has(first.sha256)
    assert kb.store.originals.has(kb.store.document(second).sha256)


def test_each_pruned_version_is_audited_by_whoever_caused_it(
    index_dir: Path, embedder: Embedder, database_url: str
) -> None:
    config = IndexConfig(data_dir=index_dir, keep_versions=2, database_url=database_url)
    kb = KnowledgeBase(config, embedder=embedder)
    first = kb.store.document(_ingest(kb, V1, uploader="U0ONE"))
    _ingest(kb, V2, uploader="U0TWO")
    assert "prune" not in [a for _, a, _ in _actions(kb)]
    third = _ingest(kb, V3, uploader="U0THREE")
    assert _actions(kb)[-1] == ("U0THREE", "prune", first.id)
    (entry,) = [e for e in kb.audit_log.entries() if e.action == "prune"]
    assert (entry.name, entry.scope, entry.old_sha256) == ("expenses.md", "*", first.sha256)
    assert entry.new_sha256 is None and f"after #{third}" in entry.detail
    assert "KB_KEEP_VERSIONS=2" in entry.detail


def test_kb_audit_shows_the_versions_pruned(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb"
    for i, body in enumerate((V1, V2, V3)):
        folder = tmp_path / f"v{i}"
        folder.mkdir()
        (folder / "expenses.md").write_bytes(body)
        result = CliRunner().invoke(
            main,
            ["--data-dir", str(data_dir), "ingest", str(folder)],
            env={"KB_KEEP_VERSIONS": "2"},
        )
        assert result.exit_code == 0, result.output
    entries = json.loads(_kb(data_dir, "audit", "--json"))
    assert [(e["actor"], e["action"]) for e in entries][:2] == [
        ("cli", "prune"),
        ("cli", "replace"),
    ]
    first_added = entries[-1]
    assert entries[0]["document_id"] == first_added["document_id"]
    assert entries[0]["old_sha256"] == first_added["new_sha256"]


def test_the_bytes_of_a_replaced_version_are_a_new_version(kb: KnowledgeBase) -> None:
    first = _ingest(kb, V1, uploader="U0ADMIN")
    _ingest(kb, V2, uploader="U0ADMIN")
    again = kb.add_bytes(V1, "expenses.md", uploader="U0MEMBER", publish=Publish.APPROVAL)
    assert not again.duplicate and again.document.id != first
    assert kb.index_document(again.document.id).state == "awaiting_approval"
    assert kb.store.document(first).state == "replaced"


def test_retry_never_publishes_nor_revives(kb: KnowledgeBase) -> None:
    _ingest(kb, V1)
    replaced = kb.store.find_document("expenses.md").id
    _ingest(kb, V2)
    waiting = _ingest(kb, V3, uploader="U0MEMBER", publish=Publish.APPROVAL)
    assert kb.retry(replaced).state == "replaced"
    assert kb.retry(waiting).state == "awaiting_approval"


def test_reindex_keeps_states_and_is_audited(kb: KnowledgeBase) -> None:
    _ingest(kb, V1)
    current = _ingest(kb, V2)
    waiting = _ingest(kb, V3, uploader="U0MEMBER", publish=Publish.APPROVAL)
    report = kb.reindex(actor="U0ADMIN")
    assert report.documents == 2 and report.failed == []
    assert [d.state for d in kb.documents()] == ["replaced", "indexed", "awaiting_approval"]
    assert kb.store.chunk_rows(waiting) and _searchable_docs(kb) == {current}
    entry = kb.audit_log.entries(1)[0]
    assert (entry.actor, entry.action, entry.detail) == (
        "U0ADMIN",
        "reindex",
        f"2 documents, {report.chunks} chunks, 0 failed",
    )


def test_removal_is_audited(kb: KnowledgeBase) -> None:
    doc = kb.store.document(_ingest(kb, V1))
    kb.remove(doc.id)
    entry = kb.audit_log.entries(1)[0]
    assert (entry.action, entry.actor, entry.old_sha256, entry.new_sha256) == (
        "remove",
        "cli",
        doc.sha256,
        None,
    )


# ---------------------------------------------------------------- the kb command


def _kb(data_dir: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["--data-dir", str(data_dir), *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_kb_ingest_publishes_as_an_admin_and_kb_audit_shows_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb"
    for i, body in enumerate((V1, V2)):
        folder = tmp_path / f"v{i}"
        folder.mkdir()
        (folder / "expenses.md").write_bytes(body)
        _kb(data_dir, "ingest", str(folder))
    entries = json.loads(_kb(data_dir, "audit", "--json"))
    assert [(e["actor"], e["action"], e["name"], e["scope"]) for e in entries] == [
        ("cli", "replace", "expenses.md", "*"),
        ("cli", "add", "expenses.md", "*"),
    ]
    newest, oldest = entries
    assert newest["old_sha256"] == oldest["new_sha256"] != newest["new_sha256"]
    assert set(newest) == {
        "id",
        "at",
        "actor",
        "action",
        "document_id",
        "name",
        "scope",
        "old_sha256",
        "new_sha256",
        "detail",
    }
    assert len(json.loads(_kb(data_dir, "audit", "--json", "--limit", "1"))) == 1
    assert "replace" in _kb(data_dir, "audit")

    restored = json.loads(_kb(data_dir, "restore", "expenses.md", "--json"))
    assert restored["restored"]["id"] == oldest["document_id"]
    assert [r["id"] for r in restored["replaced"]] == [newest["document_id"]]
    assert json.loads(_kb(data_dir, "audit", "--json"))[0]["action"] == "restore"
    shown = json.loads(_kb(data_dir, "show", "expenses.md", "--json"))
    assert (shown["id"], shown["state"]) == (oldest["document_id"], "indexed")


def test_kb_approve_and_reject(kb: KnowledgeBase, monkeypatch: pytest.MonkeyPatch) -> None:
    data_dir = kb.config.data_dir
    monkeypatch.setenv("KB_DATABASE_URL", kb.config.database_url)
    first = _ingest(kb, V1, uploader="U0MEMBER", publish=Publish.APPROVAL)
    second = _ingest(kb, V2, uploader="U0MEMBER", publish=Publish.APPROVAL)
    assert "Approved" in _kb(data_dir, "approve", str(first))
    assert "Rejected" in _kb(data_dir, "reject", str(second))
    assert [(d.id, d.state) for d in kb.documents()] == [(first, "indexed")]
    assert [e.actor for e in kb.audit_log.entries(2)] == ["cli", "cli"]
    failed = CliRunner().invoke(main, ["--data-dir", str(data_dir), "approve", str(first)])
    assert failed.exit_code == 1 and "no longer awaiting approval" in failed.output
