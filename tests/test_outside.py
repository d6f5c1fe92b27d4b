"""Passages found outside the knowledge base (``core.outside``), through the engine.

Narrow tests of the engine's side with a plain search behind the
``OutsideSearch`` contract; the Slack path is tested end to end in
``tests/test_slack_search.py``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import numpy as np
import pytest

from core.answer import Engine, Outcome, build_engine
from core.config import EngineConfig, LLMConfig
from core.gate import gate
from core.outside import Found, OutsidePassage, close_passages
from core.retrieve import Candidate
from index.knowledge_base import KnowledgeBase
from tests.servers import OpenAICompatServer

QUESTION = "How do I get reimbursed for a conference ticket?"
CLOSE = OutsidePassage(
    text="To get reimbursed for a conference ticket, attach the receipt to an expense claim.",
    author="U0BOB00001",
    posted=1_764_000_000.0,
    url="https://kbtest.slack.com/archives/C0ITHELP01/p1764000000000100",
    place="C0ITHELP01",
)
FAR = OutsidePassage(
    text="Team lunch on Friday is at Luigi's at 12:30.",
    author="U0DAVE0001",
    posted=1_764_000_100.0,
    url="https://kbtest.slack.com/archives/C0OFFICE01/p1764000100000100",
    place="C0OFFICE01",
)


class Listed:
    """Finds the passages it was given, whatever the query; remembers the queries."""

    def __init__(self, *passages: OutsidePassage, fail: bool = False) -> None:
        self.passages = list(passages)
        self.fail = fail
        self.queries: list[str] = []

    async def search(self, query: str) -> Found:
        self.queries.append(query)
        if self.fail:
            raise RuntimeError("a bug in the surface's search")
        return Found(self.passages, reach="as_asker")


@pytest.fixture
async def engine(
    sample_kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> AsyncIterator[Engine]:
    config = EngineConfig(
        llm=LLMConfig(base_url=openai_server.url, max_retries=0, timeout=2.0),
        link_base_url="https://kb.example.com",
        threshold=0.55,
    )
    built = build_engine(config, sample_kb)
    yield built
    await built.aclose()


async def test_outside_passages_are_numbered_after_the_knowledge_bases_and_cited(
    engine: Engine, openai_server: OpenAICompatServer
) -> None:
    search = Listed(FAR, CLOSE)
    openai_server.set_reply(lambda chat: f"Attach the receipt [{_number_of(chat, CLOSE)}].")
    answer = await engine.ask(QUESTION, outside=search, quote_outside=True)

    assert search.queries == [QUESTION]
    assert answer.outcome == Outcome.ANSWERED and answer.sources == []
    assert answer.outside is not None and answer.outside.quoted
    # Only the close one is shown (the gate's distance), cited as the answer's first source.
    assert [(r.passage, r.n) for r in answer.outside.shown] == [(CLOSE, 1)]
    assert "[1]" in answer.answer
    assert FAR.text not in json.dumps(openai_server.requests)
    # Logged without the text the model wrote from it.
    record = engine.kb.queries.get(answer.query_id or 0)
    assert record.answer == "" and record.question == QUESTION


async def test_not_quoted_the_model_never_reads_them_but_they_are_shown(
    engine: Engine, openai_server: OpenAICompatServer
) -> None:
    answer = await engine.ask(QUESTION, outside=Listed(CLOSE), quote_outside=False)
    assert CLOSE.text not in json.dumps(openai_server.requests)
    assert answer.outside is not None and not answer.outside.quoted
    assert [r.passage for r in answer.outside.shown] == [CLOSE]
    assert all(r.n == 0 for r in answer.outside.shown)
    assert engine.kb.queries.get(answer.query_id or 0).answer == answer.answer != ""


async def test_a_failing_search_costs_only_its_group(
    engine: Engine, openai_server: OpenAICompatServer
) -> None:
    openai_server.set_reply("Attach your manager's approval email to the claim [1].")
    answer = await engine.ask(QUESTION, outside=Listed(CLOSE, fail=True), quote_outside=True)
    assert answer.outcome == Outcome.ANSWERED and answer.sources
    assert answer.outside is not None and answer.outside.failure == "error"
    assert answer.outside.shown == []


def test_a_passage_found_outside_is_judged_as_a_chunk_at_its_distance(
    sample_kb: KnowledgeBase,
) -> None:
    """The gate's one rule, its boundary included: what passes, how many, in the order found."""
    embedder = sample_kb.embedder
    question = embedder.encode_query(QUESTION)
    passages = [FAR, CLOSE]
    vectors = embedder.encode([p.text for p in passages], role="document")
    far, close = (float(d) for d in np.clip(1.0 - vectors @ question, 0.0, 2.0))
    assert close < far
    expected = {
        (close - 1e-4, 2): [],  # nothing close: nothing to answer from
        (close, 2): [CLOSE],  # exactly at the threshold passes, as a chunk does
        (far, 2): [FAR, CLOSE],  # in the order found, not by distance
        (far, 1): [FAR],  # at most top_k
    }
    for (threshold, limit), shown in expected.items():
        chunks = [Candidate(0, far, 0.0), Candidate(1, close, 0.0)]
        by_gate = [passages[c.chunk_id] for c in gate(chunks, threshold=threshold, top_k=limit)]
        found = close_passages(embedder, question, passages, threshold=threshold, limit=limit)
        assert [r.passage for r in found] == by_gate == shown, (threshold, limit)
        assert [r.distance for r in found] == [round(far if p is FAR else close, 4) for p in shown]


def _number_of(chat: list[dict[str, str]], passage: OutsidePassage) -> int:
    prompt = chat[-1]["content"]
    head = prompt[: prompt.index(passage.text[:30])]
    return int(head.rsplit('<source n="', 1)[1].split('"', 1)[0])
