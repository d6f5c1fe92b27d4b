"""Knowledge gaps (core.gaps) and the review lists of the query log, on real SQLite files and
the bundled model."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from core.gaps import Gap, knowledge_gaps, normalise
from index.config import IndexConfig
from index.embed import Embedder, EmbeddingModelUnavailable
from index.knowledge_base import KnowledgeBase
from index.models import EVERYONE
from index.storage.store import Store
from tests.query_factory import log_question

VPN = b"# VPN\n\nThe VPN client is GlobalProtect. Sessions stay open for 12 hours.\n"
HR = b"# Parking\n\nThe office garage has forty spaces; badges open its gate.\n"
NOW = 1_800_000_000.0
DAY = 86_400.0


class CountingEmbedder:
    """The real embedder, counting the texts it is asked to embed (or failing, when told to)."""

    def __init__(self, inner: Embedder, *, name: str | None = None, fail: bool = False) -> None:
        self.inner = inner
        self.spec = inner.spec
        self.name = name or inner.name
        self.fail = fail
        self.texts: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.inner, attr)

    def encode(self, texts: Sequence[str], **kwargs: Any) -> np.ndarray:
        if self.fail:
            raise EmbeddingModelUnavailable("the embeddings endpoint is down")
        self.texts.extend(texts)
        return self.inner.encode(texts, **kwargs)


def _kb(index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    return KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)


def _ask(store: Store, question: str, outcome: str, at: float, **changes: Any) -> int:
    """Log ``question`` with ``outcome`` as asked at ``at``."""
    qid = log_question(store, question, outcome=outcome, model_called=False, **changes)
    # The log stamps the present; the fixture needs a history.
    with store.transaction() as db:
        db.execute("UPDATE query_log SET created_at = ? WHERE id = ?", [at, qid])
    return qid


def _chunk_id(kb: KnowledgeBase, doc_id: int) -> int:
    return int(kb.chunks(doc_id)[0]["id"])


@pytest.fixture
def logged(index_dir: Path, embedder: Embedder) -> tuple[KnowledgeBase, dict[str, int]]:
    """A knowledge base with two documents (one a channel's) and a month of unanswered questions."""
    kb = _kb(index_dir, CountingEmbedder(embedder))
    vpn = kb.ingest_bytes(VPN, "vpn.md").document.id
    hr = kb.ingest_bytes(HR, "parking.md", scope="C_HR").document.id
    ids = {"vpn": vpn, "vpn_chunk": _chunk_id(kb, vpn), "hr_chunk": _chunk_id(kb, hr)}
    s = kb.store
    _ask(s, "How do I reset my VPN password?", "refused", NOW - 5 * DAY, channel="C_IT")
    _ask(s, "how do I reset my VPN password", "refused", NOW - 4 * DAY, channel="D_ANA")
    _ask(s, "VPN password reset", "refused", NOW - 3 * DAY)
    _ask(
        s,
        "I forgot my VPN password, how can I reset it?",
        "related",
        NOW - 2 * DAY,
        kept=[(ids["vpn_chunk"], 0.52)],
    )
    _ask(s, "HOW DO I RESET MY VPN PASSWORD??", "refused", NOW - 1 * DAY, channel="C_IT")
    _ask(
        s,
        "Where can I park my car at the office?",
        "related",
        NOW - 6 * DAY,
        kept=[(ids["hr_chunk"], 0.48)],
    )
    _ask(s, "Is there a car park at the office?", "refused", NOW - 2.5 * DAY)
    # Near the VPN-password question, another question; it kept the same passage, farther.
    _ask(
        s,
        "How do I change my VPN settings?",
        "related",
        NOW - 1.5 * DAY,
        kept=[(ids["hr_chunk"], 0.69), (ids["vpn_chunk"], 0.61)],
    )
    _ask(s, "What is the dress code on Fridays?", "refused", NOW - 0.5 * DAY)
    # Not gaps: answered, answered citing nothing, evidence while the model was down; too old.
    _ask(s, "How do I reset my VPN password?", "answered", NOW - 0.2 * DAY)
    _ask(s, "Can I bring my dog to work?", "unsupported", NOW - 0.3 * DAY)
    _ask(s, "How long do VPN sessions stay open?", "model_unavailable", NOW - 0.4 * DAY)
    _ask(s, "What is the travel meal allowance?", "refused", NOW - 40 * DAY)
    return kb, ids


def test_wordings_of_one_question_group_and_different_questions_stay_apart(
    logged: tuple[KnowledgeBase, dict[str, int]],
) -> None:
    kb, ids = logged
    gaps = knowledge_gaps(kb, since=NOW - 30 * DAY)
    assert [g.question for g in gaps] == [
        "HOW DO I RESET MY VPN PASSWORD??",  # asked 5 times
        "Is there a car park at the office?",  # twice
        "What is the dress code on Fridays?",  # once, most recent of the single ones
        "How do I change my VPN settings?",  # near the VPN gap, yet another question
    ]
    vpn, parking, dress, settings = gaps
    assert vpn.count == 5
    assert vpn.outcomes == (("refused", 4), ("related", 1))
    # Other wordings, most recent first; "how do I reset my VPN password" is the latest's
    # own wording but for case and punctuation.
    assert vpn.examples == ("I forgot my VPN password, how can I reset it?", "VPN password reset")
    assert vpn.last_asked == NOW - 1 * DAY
    assert vpn.closest is not None and vpn.closest.id == ids["vpn_chunk"]
    assert vpn.closest.document == "VPN" and vpn.distance == 0.52
    assert vpn.scope == EVERYONE
    assert vpn.asked_in == ("C_IT", "D_ANA")  # where it was asked, most recent first
    assert parking.count == 2 and parking.outcomes == (("refused", 1), ("related", 1))
    assert parking.examples == ("Where can I park my car at the office?",)
    assert parking.closest is not None and parking.scope == "C_HR"
    assert (dress.count, dress.closest, dress.distance, dress.scope) == (1, None, None, None)
    assert dress.asked_in == ()
    assert settings.count == 1 and settings.outcomes == (("related", 1),)
    # Its own closest passage and distance, though the VPN gap kept the same chunk.
    assert settings.closest == vpn.closest and settings.distance == 0.61


def test_window_and_limit(logged: tuple[KnowledgeBase, dict[str, int]]) -> None:
    kb, _ = logged
    assert [g.count for g in knowledge_gaps(kb, since=NOW - 30 * DAY, limit=2)] == [5, 2]
    recent = knowledge_gaps(kb, since=NOW - 2 * DAY)
    assert {(g.question, g.count) for g in recent} == {
        ("HOW DO I RESET MY VPN PASSWORD??", 2),
        ("How do I change my VPN settings?", 1),
        ("What is the dress code on Fridays?", 1),
    }
    everything = knowledge_gaps(kb, since=0)
    assert "What is the travel meal allowance?" in {g.question for g in everything}
    assert knowledge_gaps(kb, since=NOW) == []


def test_a_refusal_shows_its_nearest_miss(index_dir: Path, embedder: Embedder) -> None:
    kb = _kb(index_dir, embedder)
    vpn = kb.ingest_bytes(VPN, "vpn.md").document.id
    chunk = _chunk_id(kb, vpn)
    _ask(kb.store, "Can the VPN run on a phone?", "refused", NOW - DAY, nearest=(chunk, 0.58))
    _ask(kb.store, "How do I expense a taxi?", "refused", NOW - DAY)  # logged before nearest
    gaps = {g.question: g for g in knowledge_gaps(kb, since=0)}
    phone = gaps["Can the VPN run on a phone?"]
    assert phone.closest is not None and phone.closest.id == chunk
    assert phone.distance == 0.58 and phone.scope == EVERYONE
    taxi = gaps["How do I expense a taxi?"]
    assert (taxi.closest, taxi.distance) == (None, None)


def test_at_most_three_other_wordings(index_dir: Path, embedder: Embedder) -> None:
    kb = _kb(index_dir, embedder)
    wordings = [
        "How do I reset my VPN password?",
        "VPN password reset",
        "I forgot my VPN password, how can I reset it?",
        "How can I reset the password for the VPN?",
        "Resetting my VPN password",
    ]
    for days, wording in enumerate(wordings):
        _ask(kb.store, wording, "refused", NOW - days * DAY)
    [gap] = knowledge_gaps(kb, since=0)
    assert gap.count == 5 and gap.question == wordings[0]
    assert gap.examples == tuple(wordings[1:4])


def test_a_removed_passage_is_no_longer_shown(logged: tuple[KnowledgeBase, dict[str, int]]) -> None:
    kb, ids = logged
    kb.remove(ids["vpn"])
    vpn = knowledge_gaps(kb, since=NOW - 30 * DAY)[0]
    assert vpn.count == 5
    assert (vpn.closest, vpn.distance, vpn.scope) == (None, None, None)


def test_wordings_are_embedded_once_per_process(
    logged: tuple[KnowledgeBase, dict[str, int]],
) -> None:
    kb, _ = logged
    counting = kb.embedder
    assert isinstance(counting, CountingEmbedder)
    counting.texts.clear()
    first = knowledge_gaps(kb, since=NOW - 30 * DAY)
    # Reopening the list embeds nothing again (earlier tests may have embedded these already).
    counting.texts.clear()
    assert knowledge_gaps(kb, since=NOW - 30 * DAY) == first
    assert counting.texts == []
    _ask(kb.store, "Who approves travel requests?", "refused", NOW - 0.1 * DAY)
    knowledge_gaps(kb, since=NOW - 30 * DAY)
    assert counting.texts == ["Who approves travel requests?"]


def test_without_the_embedder_questions_group_by_wording(
    index_dir: Path, embedder: Embedder
) -> None:
    kb = _kb(index_dir, CountingEmbedder(embedder, name="endpoint-down", fail=True))
    _ask(kb.store, "How do I reset my VPN password?", "refused", NOW - 2 * DAY)
    _ask(kb.store, "how do i reset my vpn password", "refused", NOW - 1 * DAY)
    _ask(kb.store, "VPN password reset", "refused", NOW - 3 * DAY)
    gaps = knowledge_gaps(kb, since=0)
    assert [(g.question, g.count) for g in gaps] == [
        ("how do i reset my vpn password", 2),
        ("VPN password reset", 1),
    ]


def test_normalise_drops_case_punctuation_and_spacing() -> None:
    assert normalise("  How do I reset my VPN-password?? ") == "how do i reset my vpn password"
    assert normalise("Où est  le parking ?") == "où est le parking"


def test_gap_fields_the_view_reads() -> None:
    gap = Gap("q", (), 1, (("refused", 1),), None, None, NOW)
    assert gap.scope is None


def test_questions_by_outcome_newest_first_within_window(index_dir: Path) -> None:
    store = Store(index_dir)
    for i, outcome in enumerate(["refused", "answered", "related", "refused", "refused"]):
        _ask(store, f"question {i}", outcome, NOW + i, kept=[(7, 0.5)] if i == 2 else [])
    rows = store.queries.by_outcome(["refused", "related"], since=NOW + 1, limit=10)
    assert [r.question for r in rows] == ["question 4", "question 3", "question 2"]
    assert rows[2].kept == ((7, 0.5),) and rows[2].outcome == "related"
    assert rows[0].created_at == NOW + 4
    assert [r.question for r in store.queries.by_outcome(["refused"], since=0, limit=2)] == [
        "question 4",
        "question 3",
    ]
    assert store.queries.by_outcome([], since=0, limit=10) == []


def test_disliked_answers_for_review(index_dir: Path) -> None:
    store = Store(index_dir)
    old = log_question(store, "How long is the VPN session?", answer="8 hours [1]")
    new = log_question(store, "Who approves leave?", answer="Your manager [1]", user="U1")
    liked = log_question(store, "Where is the office?", answer="Berlin [1]")
    store.feedback.add(old, -1, user="U2")
    store.feedback.add(liked, 1, user="U2")
    store.feedback.add(new, -1, user="U3")
    store.feedback.add(new, -1, user="U3")  # the same person twice counts once
    store.feedback.add(new, -1, user="U4")
    store.feedback.add(new, -1, user="U5")
    store.feedback.add(new, 1, user="U5")  # taken back
    changed = log_question(store, "Where do I park?", answer="Garage B [1]")
    store.feedback.add(changed, -1, user="U6")
    store.feedback.add(changed, 1, user="U6")
    rows = store.feedback.disliked_answers()
    assert [(r.id, r.dislikes) for r in rows] == [(new, 2), (old, 1)]
    assert rows[0].answer == "Your manager [1]" and rows[0].user == "U1"
    assert rows[0].question == "Who approves leave?"
    assert store.feedback.disliked_count() == 2
    assert [r.id for r in store.feedback.disliked_answers(limit=1, offset=1)] == [old]
    assert store.feedback.disliked_answers(since=time.time() + 60) == []
    assert store.feedback.disliked_count(since=time.time() + 60) == 0
    # The export still lists every question ever given a thumbs-down.
    assert [r["id"] for r in store.feedback.disliked_questions()] == [changed, new, old]
