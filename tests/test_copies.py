"""Copies of one document are one document to the asker: each text once among the passages.

A handbook uploaded three times (re-saved, re-exported, posted in two channels)
is three documents; their passages with the same words must not crowd the
passages a question gets (``core.selection.distinct``). On a real knowledge
base (FAISS, the bundled model, SQLite and Postgres): three byte-different
copies of one handbook and a different document on the same subject.

``KnowledgeBase.copies`` tells the same copies at document level (passage for
passage, in the same form): an upload repeating a document is added all the
same, and ``kb ingest`` names what it repeats (the Slack upload names only what
its readers may read: tests/test_slack_upload.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.cli import main
from core.config import EngineConfig
from core.retrieve import Candidate, Mode
from core.selection import PassageSelector, Selection, distinct
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.models import EVERYONE
from index.normal_form import same_text
from index.records import ChunkRow
from tests.conftest import SAMPLE
from tests.postgres import StoreImage, store_image

QUESTION = "How long do I have to submit an expense claim?"
HANDBOOK = (SAMPLE / "expenses.md").read_bytes()
# The same handbook as other programs save it: lines wrapped elsewhere, Windows line
# ends, a no-break space, a soft hyphen and a ligature that a PDF export leaves in.
RESAVED = (
    HANDBOOK.decode()
    .replace(
        "Submit the claim in Expensify within 30 days",
        "Submit the claim in Expensify\nwithin 30 days",
    )
    .replace("with a photo of every receipt", "with a photo\u00a0of every re\u00adceipt")
    .replace("finance returns", "ﬁnance returns")
    .replace("\n", "\r\n")
    .encode()
)
# Another document on the same subject, in other words.
POLICY = b"""# Travel claims

Expense claims for travel are filed in Expensify. You have 30 days after your trip
to submit the claim; after 90 days it can no longer be paid. Keep the boarding pass.
"""
THRESHOLD = 0.75
CHANNELS = ("C_HANDBOOK_A", "C_HANDBOOK_B", "C_HANDBOOK_C")


def _config(top_k: int = 4) -> EngineConfig:
    return EngineConfig(threshold=THRESHOLD, related_threshold=THRESHOLD, top_k=top_k)


def _kb(
    data_dir: Path,
    embedder: Embedder,
    copies: dict[str, tuple[str, bytes]],
    database_url: str = "",
) -> KnowledgeBase:
    """A knowledge base of the travel policy (for everyone) and ``copies`` (name: scope, bytes)."""
    config = IndexConfig(data_dir=data_dir, database_url=database_url)
    kb = KnowledgeBase(config, embedder=embedder)
    assert kb.ingest_bytes(POLICY, "travel-claims.md", scope=EVERYONE).document.state == "indexed"
    for name, (scope, data) in copies.items():
        assert kb.ingest_bytes(data, name, scope=scope).document.state == "indexed"
    return kb


COPIES = {
    "expenses.md": (CHANNELS[0], HANDBOOK),
    "expenses (1).md": (CHANNELS[1], RESAVED),
    "Expenses handbook.md": (CHANNELS[2], HANDBOOK + b"\n\n"),
}


@pytest.fixture(scope="module", params=["sqlite", "postgres"])
def copies_image(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> StoreImage:
    """The travel policy and three byte-different copies of the handbook, each in a channel,
    built once for the module on SQLite and on Postgres (``tests.postgres``)."""
    data_dir = tmp_path_factory.mktemp("copies-kb")
    return store_image(request, data_dir, lambda url: _kb(data_dir, embedder, COPIES, url))


@pytest.fixture
def copies_kb(
    copies_image: StoreImage,
    store_copy: Callable[[StoreImage], str],
    index_dir: Path,
    embedder: Embedder,
) -> KnowledgeBase:
    """A copy of ``copies_image`` in ``index_dir``: as if ``_kb`` had ingested ``COPIES`` here."""
    url = store_copy(copies_image)
    return KnowledgeBase(IndexConfig(data_dir=index_dir, database_url=url), embedder=embedder)


def _shown(kb: KnowledgeBase, selection: Selection) -> list[tuple[str, str]]:
    """Each passage shown for the question: its document's file name and its words."""
    rows = kb.chunks_by_id([c.chunk_id for c in selection.shown])
    names = {r.document_id: kb.store.document(r.document_id).name for r in rows.values()}
    return [
        (names[r.document_id], same_text(r.content))
        for r in (rows[c.chunk_id] for c in selection.shown)
    ]


def test_the_three_copies_are_one_passage_beside_the_different_document(
    copies_kb: KnowledgeBase,
) -> None:
    selection = PassageSelector(copies_kb, _config()).select(QUESTION, frozenset(CHANNELS))
    shown = _shown(copies_kb, selection)
    texts = [text for _, text in shown]
    assert len(texts) == len(set(texts)), shown
    assert "travel-claims.md" in {name for name, _ in shown}
    claim = next(t for _, t in shown if "within 30 days of the expense" in t)
    # The three files' passage is there once, from one of the copies.
    assert sum(t == claim for t in texts) == 1
    rows = copies_kb.chunks_by_id([c.chunk_id for c in selection.searched])
    searched = [same_text(rows[c.chunk_id].content) for c in selection.searched]
    assert len(searched) == len(set(searched))


def test_the_freed_places_go_to_the_next_different_passages(copies_kb: KnowledgeBase) -> None:
    """With two passages to an answer, the second is the other document, not a copy of the first."""
    selection = PassageSelector(copies_kb, _config(top_k=2)).select(QUESTION, frozenset(CHANNELS))
    kept = _shown(copies_kb, Selection(selection.query, [], [], selection.kept, []))
    assert len(kept) == 2 and kept[0][1] != kept[1][1], kept
    assert "travel-claims.md" in {name for name, _ in kept}


def test_an_asker_who_reads_only_the_second_copy_gets_it_as_if_it_were_alone(
    copies_kb: KnowledgeBase, tmp_path: Path, embedder: Embedder
) -> None:
    only_second = frozenset({CHANNELS[1]})
    shown = _shown(copies_kb, PassageSelector(copies_kb, _config()).select(QUESTION, only_second))
    assert "expenses (1).md" in {name for name, _ in shown}
    assert not {name for name, _ in shown} & {"expenses.md", "Expenses handbook.md"}
    # Nothing tells the asker of the copies they cannot read: they get what a
    # knowledge base without them gives.
    alone = tmp_path / "alone"
    alone.mkdir()
    kb = _kb(alone, embedder, {"expenses (1).md": (CHANNELS[1], RESAVED)})
    assert shown == _shown(kb, PassageSelector(kb, _config()).select(QUESTION, only_second))


def test_of_copies_ranked_alike_the_newest_document_is_cited(copies_kb: KnowledgeBase) -> None:
    """The first and third files differ in their bytes, not in their passages' words or titles:
    their passages rank alike, and the third, added last, stands for both."""
    both = frozenset({CHANNELS[0], CHANNELS[2]})
    shown = _shown(copies_kb, PassageSelector(copies_kb, _config()).select(QUESTION, both))
    names = {name for name, _ in shown}
    assert "Expenses handbook.md" in names and "expenses.md" not in names


def test_a_search_crowded_by_copies_goes_deeper_for_different_passages(
    index_dir: Path, embedder: Embedder
) -> None:
    """Six copies of the handbook fill the first five candidates (one passage to an answer,
    ``CANDIDATES_PER_KEPT`` candidates) with one text: the search goes deeper until it has
    five different passages, all that are close enough (the handbook's four and the policy)."""
    copies = {f"expenses-{i}.md": (EVERYONE, HANDBOOK + b"\n" * i) for i in range(6)}
    kb = _kb(index_dir, embedder, copies)
    selector = PassageSelector(kb, _config(top_k=1))
    selection = selector.select(QUESTION, None)
    rows = kb.chunks_by_id([c.chunk_id for c in selection.searched])
    texts = [same_text(rows[c.chunk_id].content) for c in selection.searched]
    assert len(texts) == len(set(texts)) == 5
    assert all(c.distance <= THRESHOLD for c in selection.searched)
    # The search at the normal depth keeps its order; the deeper one only adds after it.
    vector = selector.vector(selection.query)
    first = kb.search_index.search(vector, selection.query, None, 5, Mode.HYBRID, THRESHOLD)
    ahead = distinct(first, kb.chunks_by_id([c.chunk_id for c in first]), reach=THRESHOLD)
    assert 1 <= len(ahead) < 5 and selection.searched[: len(ahead)] == ahead


def _row(
    chunk_id: int, document_id: int, content: str, *, kind: str = "md", text: str = ""
) -> ChunkRow:
    return ChunkRow(
        id=chunk_id,
        document_id=document_id,
        document="Sheet",
        kind=kind,
        scope=EVERYONE,
        ordinal=0,
        section="",
        start=0,
        end=len(content),
        page=None,
        content=content,
        text=text or f"Sheet\n{content}",
    )


def test_a_better_ranked_copy_is_kept_whatever_its_age_and_far_ones_are_not_compared() -> None:
    rows = {
        1: _row(1, 1, "Claims are paid monthly."),
        2: _row(2, 9, "Claims  are paid\nmonthly."),
        3: _row(3, 5, "Something else."),
        4: _row(4, 7, "claims are paid monthly."),  # case is kept: other words
        5: _row(5, 8, "Claims are paid monthly."),
    }
    found = [
        Candidate(1, 0.20, 1.4),
        Candidate(2, 0.21, 1.3),
        Candidate(3, 0.30, 1.0),
        Candidate(4, 0.31, 0.9),
        Candidate(5, 0.90, 0.1),
    ]
    kept = distinct(found, rows, reach=0.8)
    assert [c.chunk_id for c in kept] == [1, 3, 4, 5]


def test_sheet_rows_with_the_same_cells_under_other_columns_are_different_passages() -> None:
    rows = {
        1: _row(1, 1, "Oslo, 95", kind="csv", text="Sheet > City, Allowance\nOslo, 95"),
        2: _row(2, 2, "Oslo, 95", kind="csv", text="Sheet > City, Floor\nOslo, 95"),
        3: _row(3, 3, "Oslo, 95", kind="csv", text="Sheet > City, Allowance\nOslo, 95"),
    }
    found = [Candidate(1, 0.2, 1.0), Candidate(2, 0.2, 0.9), Candidate(3, 0.2, 0.8)]
    assert [c.chunk_id for c in distinct(found, rows, reach=1.0)] == [1, 2]


# ---------------------------------------------------------------- whole documents


def test_copies_are_the_documents_of_the_same_passages_newest_first(
    copies_kb: KnowledgeBase,
) -> None:
    kb = copies_kb
    ids = {d.name: d.id for d in kb.documents()}
    handbook, resaved, again = (
        ids["expenses.md"],
        ids["expenses (1).md"],
        ids["Expenses handbook.md"],
    )
    assert [d.id for d in kb.copies(handbook)] == [again, resaved]
    assert [d.id for d in kb.copies(resaved)] == [again, handbook]
    assert kb.copies(ids["travel-claims.md"]) == []
    # As many passages, one word other: no copy.
    near = kb.ingest_bytes(HANDBOOK.replace(b"30 days", b"31 days"), "near.md").document
    assert near.chunk_count == kb.document(handbook).chunk_count
    assert kb.copies(near.id) == []
    assert near.id not in [d.id for d in kb.copies(handbook)]
    # A removed document is no copy any more.
    kb.remove(again)
    assert [d.id for d in kb.copies(handbook)] == [resaved]


def _cli(data_dir: Path, *args: str) -> str:
    result = CliRunner().invoke(main, ["--data-dir", str(data_dir), *args])
    assert result.exit_code == 0, result.output
    return result.stdout


def test_kb_ingest_adds_a_repeating_file_and_names_every_document_it_repeats(
    tmp_path: Path,
) -> None:
    data_dir = tmp_path / "kb"
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    (first / "expenses.md").write_bytes(HANDBOOK)
    (second / "copy.md").write_bytes(RESAVED)
    (second / "travel.md").write_bytes(POLICY)
    _cli(data_dir, "ingest", str(first))
    _cli(data_dir, "ingest", "--scope", CHANNELS[0], str(first))
    text = _cli(data_dir, "ingest", str(second))
    docs = {d["name"]: d for d in json.loads(_cli(data_dir, "docs", "--json"))}
    assert docs["copy.md"]["state"] == docs["travel.md"]["state"] == "indexed"
    title = docs["expenses.md"]["title"] or "expenses.md"
    # Both copies, the channel's too: whoever runs kb reads every document.
    assert [line for line in text.splitlines() if line.startswith("repeats")] == [
        f"repeats  copy.md: the same text as {title} (id 2, scope {CHANNELS[0]}), "
        f"{title} (id 1, scope *)"
    ]
    assert "2 indexed" in text
    (second / "again.md").write_bytes(HANDBOOK + b"\n")
    data = json.loads(_cli(data_dir, "ingest", "--json", str(second / "again.md")))
    (repeat,) = data["repeats"]
    assert repeat["name"] == "again.md"
    assert [c["id"] for c in repeat["copies"]] == [docs["copy.md"]["id"], 2, 1]
    assert {c["scope"] for c in repeat["copies"]} == {"*", CHANNELS[0]}
