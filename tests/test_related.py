"""Possibly related passages between the two thresholds: no model call, labelled, linked, logged."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from bot.cli import main
from bot.slack import messages
from core.answer import RELATED_TEXT, Engine, Outcome, build_engine
from core.config import EngineConfig, LLMConfig
from core.gate import gate, related
from core.retrieve import Candidate, LocalBackend, Mode, answer_order
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from tests.conftest_bot import IN_DOMAIN, PUBLIC_URL, Bot, BotFactory, links
from tests.servers import OpenAICompatServer, app_mention_event, block_actions_body, feedback_action

QUESTION = "How do I get reimbursed for a conference ticket?"
OUT_OF_DOMAIN = "What is the offside rule in football?"
# A question whose related passages the answer order puts otherwise than the fusion.
ORDERED_OTHERWISE = "What receipts do I need for reimbursement?"


def _best_distance(kb: KnowledgeBase, question: str) -> float:
    vector = kb.embedder.encode_query(question)
    found = LocalBackend(kb.indexes).search(vector, question, None, 20, Mode.HYBRID)
    return min(c.distance for c in found)


def _related_count(kb: KnowledgeBase, question: str, related_threshold: float) -> int:
    """How many passages within ``related_threshold`` are shown (at most ``MAX_RELATED``)."""
    vector = kb.embedder.encode_query(question)
    found = LocalBackend(kb.indexes).search(vector, question, None, 20, Mode.HYBRID)
    return len(related(found, related_threshold=related_threshold))


def _between(best: float) -> dict[str, float]:
    """Thresholds that put a question whose best distance is ``best`` between them."""
    return {"threshold": round(best - 0.02, 4), "related_threshold": round(best + 0.03, 4)}


@pytest.fixture
def kb(sample_kb: KnowledgeBase) -> KnowledgeBase:
    return sample_kb  # bot/sample ingested (a copy of the session's)


EngineFor = Callable[..., Engine]


@pytest.fixture
async def engine_for(
    kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> AsyncIterator[EngineFor]:
    opened: list[Engine] = []

    def build(**kw: Any) -> Engine:
        config = EngineConfig(
            llm=LLMConfig(base_url=openai_server.url, max_retries=0, timeout=2.0),
            link_base_url="https://kb.example.com",
            **kw,
        )
        engine = build_engine(config, kb)
        opened.append(engine)
        return engine

    yield build
    for engine in opened:
        await engine.aclose()


# ---------------------------------------------------------------- the engine


async def test_between_the_thresholds_related_passages_and_no_model_call(
    kb: KnowledgeBase, engine_for: EngineFor, openai_server: OpenAICompatServer
) -> None:
    engine = engine_for(**_between(_best_distance(kb, QUESTION)))
    answer = await engine.ask(QUESTION)

    assert answer.outcome == Outcome.RELATED
    assert answer.answer == RELATED_TEXT
    assert answer.grounded is False and answer.model_called is False
    assert openai_server.requests == []
    shown = _related_count(kb, QUESTION, engine.config.related_threshold)
    assert len(answer.sources) == shown >= 1 and answer.kept == []
    assert [s.n for s in answer.sources] == list(range(1, len(answer.sources) + 1))
    assert all(s.distance <= engine.config.related_threshold for s in answer.sources)
    assert any("conference" in s.quote.lower() for s in answer.sources)
    for s in answer.sources:
        assert s.url.startswith("https://kb.example.com/d/") and "#char=" in s.url

    row = kb.queries.get(answer.query_id or 0)
    assert row.outcome == "related" and not row.model_called
    assert [cid for cid, _ in row.kept] == [s.chunk_id for s in answer.sources]
    assert kb.feedback.add(answer.query_id or 0, -1, "U1") > 0
    assert kb.feedback.disliked_questions()[0]["question"] == QUESTION


async def test_related_passages_come_in_the_order_an_answer_keeps_its_passages(
    kb: KnowledgeBase, engine_for: EngineFor
) -> None:
    question = ORDERED_OTHERWISE
    best = _best_distance(kb, question)
    engine = engine_for(threshold=best - 0.02, related_threshold=best + 0.15)
    cfg = engine.config
    vector = kb.embedder.encode_query(question)
    fused = LocalBackend(kb.indexes).search(vector, question, None, 20, Mode.HYBRID)
    ordered = answer_order(
        fused,
        vector,
        question,
        kb.store,
        sentence_weight=cfg.sentence_weight,
        proximity_weight=cfg.proximity_weight,
    )
    by_fusion = [c.chunk_id for c in related(fused, related_threshold=cfg.related_threshold)]
    by_answer = [c.chunk_id for c in related(ordered, related_threshold=cfg.related_threshold)]
    assert by_fusion != by_answer  # this question's passages are ordered otherwise
    answer = await engine.ask(question)
    assert answer.outcome == Outcome.RELATED
    assert [s.chunk_id for s in answer.sources] == by_answer


async def test_below_both_thresholds_the_plain_refusal(
    kb: KnowledgeBase, engine_for: EngineFor, openai_server: OpenAICompatServer
) -> None:
    best = _best_distance(kb, OUT_OF_DOMAIN)
    engine = engine_for(threshold=best - 0.1, related_threshold=best - 0.05)
    answer = await engine.ask(OUT_OF_DOMAIN)
    assert answer.outcome == Outcome.REFUSED and answer.sources == []
    assert openai_server.requests == []


async def test_a_related_threshold_at_the_answer_threshold_turns_related_off(
    kb: KnowledgeBase, engine_for: EngineFor
) -> None:
    best = _best_distance(kb, QUESTION)
    engine = engine_for(threshold=best - 0.02, related_threshold=best - 0.02)
    assert (await engine.ask(QUESTION)).outcome == Outcome.REFUSED


def test_kb_ask_json_carries_the_related_passages(kb: KnowledgeBase) -> None:
    between = _between(_best_distance(kb, QUESTION))
    env = {
        "KB_THRESHOLD": str(between["threshold"]),
        "KB_RELATED_THRESHOLD": str(between["related_threshold"]),
    }
    args = ["--data-dir", str(kb.config.data_dir), "ask", QUESTION]
    result = CliRunner().invoke(main, [*args, "--json"], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["outcome"] == "related"
    assert data["grounded"] is False and data["model_called"] is False
    assert data["sources"] and all(s["url"] and s["quote"] for s in data["sources"])

    plain = CliRunner().invoke(main, args, env=env)
    assert plain.exit_code == 0, plain.output
    assert plain.stdout.startswith(RELATED_TEXT)
    # The link's signature carries its expiry, so two runs a second apart differ there only.
    url = data["sources"][0]["url"]
    assert url.split("?")[0] in plain.stdout and "#" + url.split("#")[-1] in plain.stdout


# ---------------------------------------------------------------- the gate itself


def _cands(*distances: float) -> list[Candidate]:
    return [Candidate(i, d, 1.0 / i) for i, d in enumerate(distances, start=1)]


def test_more_than_top_k_are_kept_only_when_as_close_as_the_best() -> None:
    cands = _cands(0.30, 0.40, 0.45, 0.41, 0.33, 0.34, 0.60, 0.32, 0.31, 0.30)
    kept = gate(cands, threshold=0.5, top_k=4, max_kept=8, margin=0.05)
    assert [c.chunk_id for c in kept] == [1, 2, 3, 4, 5, 6, 8, 9]
    assert [c.chunk_id for c in gate(cands, threshold=0.5, top_k=4)] == [1, 2, 3, 4]
    assert gate(cands, threshold=0.2, top_k=4, max_kept=8, margin=0.05) == []


def test_related_are_the_first_within_the_looser_threshold() -> None:
    cands = _cands(0.70, 0.52, 0.58, 0.55, 0.51)
    assert [c.chunk_id for c in related(cands, related_threshold=0.56)] == [2, 4, 5]
    assert related(cands, related_threshold=0.5) == []


# ---------------------------------------------------------------- Slack


async def test_slack_shows_related_passages_labelled_with_links_and_no_model_call(
    make_bot: BotFactory, fixture_data_dir: Path, embedder: Embedder
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=fixture_data_dir), embedder=embedder)
    try:
        between = _between(_best_distance(kb, IN_DOMAIN))
        shown = _related_count(kb, IN_DOMAIN, between["related_threshold"])
    finally:
        kb.store.db.conn.close()
    bot: Bot = await make_bot(**between)

    await bot.event(app_mention_event(IN_DOMAIN))
    answer = await bot.answer()

    assert bot.llm.requests == []
    text = json.dumps(answer["blocks"], ensure_ascii=False)
    assert messages.RELATED_HEADER in text and messages.RELATED_REASON in text
    assert answer["text"].startswith(messages.RELATED_FALLBACK)
    found = links(answer)
    assert len(found) == shown >= 1
    url = found[0][0]
    assert url.startswith(PUBLIC_URL + "/d/")
    parts = urlsplit(url)
    page = await bot.http.get(f"{parts.path}?{parts.query}")
    assert page.status == 200
    assert "Submit expense claims within 30 days" in await page.text()

    (feedback,) = [b for b in answer["blocks"] if b["type"] == "context_actions"]
    value = feedback["elements"][0]["negative_button"]["value"]
    body = block_actions_body(
        [feedback_action("kb_feedback", value)],
        # The clicked message as Slack sends it: the answer, in the question's thread.
        message=bot.slack.messages[(answer["channel"], answer["ts"])],
        thread_ts=answer["thread_ts"],
        response_url=bot.slack.response_url("fb"),
    )
    assert (await bot.post(body)).status == 200
    (ack,) = await bot.slack.wait_for_responses(1, "fb")
    assert ack["text"] == messages.FEEDBACK_THANKS_NEGATIVE
    query_id = int(value.split(":")[1])
    assert bot.kb.queries.get(query_id).outcome == "related"
