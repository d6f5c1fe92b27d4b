"""The passages an answer is written from, and those beside it.

Once the best passage passes the answer threshold, the answer is written from
its first top_k within the related threshold; those a reranker left out, too far
to pass alone, are shown beside it as possibly related, never given to the model.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from bot.cli import main
from bot.slack import messages
from bot.slack.blocks import render_answer
from bot.slack.words import words_for
from core.answer import Answer, Engine, Outcome, SourceRef, build_engine
from core.config import EngineConfig
from core.gate import CANDIDATES_PER_KEPT, MAX_RELATED, beside_answer, gate
from core.retrieve import Candidate, LocalBackend, Mode, answer_order
from evaluation.outcomes import Replay
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from tests.conftest_bot import IN_DOMAIN, PUBLIC_URL, BotFactory
from tests.servers import OpenAICompatServer, app_mention_event
from tests.tiny_models import tiny_cross_encoder as tiny_model

QUESTION = "How do I get reimbursed for a conference ticket?"
HOSTILE = "<!channel> <@U123> <https://evil.example|click> & <#C1>"
BESIDE_LINK_RE = re.compile(r"• <(https?://[^|>]+)\|([^>]*)>")


def _cands(*distances: float) -> list[Candidate]:
    return [Candidate(i, d, 1.0 / i) for i, d in enumerate(distances, start=1)]


def _ids(cands: list[Candidate]) -> list[int]:
    return [c.chunk_id for c in cands]


# ---------------------------------------------------------------- the rule


def test_beside_are_the_answers_top_ranks_it_was_not_written_from() -> None:
    #             1     2     3     4     5     6     7
    cands = _cands(0.45, 0.55, 0.65, 0.40, 0.52, 0.30, 0.58)

    def near(kept: list[int], related: float, within: int) -> list[int]:
        chosen = [c for c in cands if c.chunk_id in kept]
        return _ids(
            beside_answer(cands, chosen, threshold=0.5, related_threshold=related, within=within)
        )

    # 3 is beyond the related threshold; 5 and 7 are ranked below the answer's top 4.
    assert near([1, 4], 0.6, 4) == [2]
    assert near([1, 4], 0.7, 4) == [2, 3]
    assert near([1, 4], 0.6, 7) == [2, 5, 7]
    assert near([1, 4], 0.65, 4) == [2, 3]  # the related threshold itself is within
    assert near([1, 4], 0.5, 7) == []  # related threshold at the answer threshold: off
    # The passages the answer was written from are never listed beside it.
    assert near([1, 2, 4, 5], 0.6, 7) == [7]


def test_no_passing_passage_is_shown_beside_an_answer() -> None:
    # Whether the answer was written from 1 and 2 or a reranker chose 2 alone,
    # a passage that passed is no "too far" pointer.
    cands = _cands(0.30, 0.35, 0.55)
    kept = cands[1:2]
    assert _ids(beside_answer(cands, kept, threshold=0.5, related_threshold=0.6, within=4)) == [3]
    assert _ids(beside_answer(cands, kept, threshold=0.5, related_threshold=0.6, within=2)) == []


def test_beside_shows_at_most_the_related_limit() -> None:
    cands = _cands(0.3, *([0.55] * 10))
    near = beside_answer(cands, cands[:1], threshold=0.5, related_threshold=0.6, within=11)
    assert len(near) == MAX_RELATED and _ids(near) == [2, 3, 4, 5]


def test_the_gate_decides_on_the_best_and_writes_from_the_related_ranks() -> None:
    #             1     2     3     4     5
    cands = _cands(0.55, 0.45, 0.70, 0.58, 0.52)
    # The best (2) passes: the first 4 within the related threshold, in the order given.
    assert _ids(gate(cands, threshold=0.5, top_k=4, related_threshold=0.6)) == [1, 2, 4, 5]
    assert _ids(gate(cands, threshold=0.5, top_k=2, related_threshold=0.6)) == [1, 2]
    # Without a looser related threshold only the passing ones.
    assert _ids(gate(cands, threshold=0.5, top_k=4, related_threshold=0.5)) == [2]
    assert _ids(gate(cands, threshold=0.5, top_k=4)) == [2]
    # Nothing passes: refused, however many are related (no model call).
    assert gate(cands, threshold=0.44, top_k=4, related_threshold=0.6) == []
    # Past top_k, only passing passages as close as the best join.
    more = _cands(0.30, 0.55, 0.56, 0.57, 0.58, 0.32, 0.40)
    kept = gate(more, threshold=0.5, top_k=4, max_kept=8, margin=0.05, related_threshold=0.6)
    assert _ids(kept) == [1, 2, 3, 4, 6]


# ---------------------------------------------------------------- the engine


@pytest.fixture
def kb(sample_kb: KnowledgeBase) -> KnowledgeBase:
    return sample_kb  # bot/sample ingested (a copy of the session's)


def _only_the_best_passes(kb: KnowledgeBase, question: str) -> dict[str, float]:
    """Thresholds that pass the closest candidate alone and relate every other one."""
    vector = kb.embedder.encode_query(question)
    found = LocalBackend(kb.indexes).search(vector, question, None, 20, Mode.HYBRID)
    best, second = sorted(c.distance for c in found)[:2]
    assert second - best > 1e-3, "the sample's two closest passages tie"
    return {"threshold": round(best + 5e-4, 5), "related_threshold": 1.5}


# A reranker whose random choice (seed 3) leaves out, for both questions here,
# some of the answer's first RERANKED_TOP_K that were too far to pass alone.
RERANKED_TOP_K = 3


@pytest.fixture(scope="module")
def tiny_cross_encoder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("tiny-cross-encoder"), seed=3)


def _prompt(openai_server: OpenAICompatServer) -> str:
    (request,) = openai_server.requests
    return json.dumps(request["messages"], ensure_ascii=False).replace("\\n", "\n")


async def test_an_answer_whose_best_passes_is_written_from_the_related_passages_ranked_with_it(
    kb: KnowledgeBase, engine_for: Callable[..., Engine], openai_server: OpenAICompatServer
) -> None:
    engine = engine_for(**_only_the_best_passes(kb, QUESTION))
    answer = await engine.ask(QUESTION)

    # One passage passes the answer threshold; the related threshold (1.5) takes
    # in every other candidate, so the model reads the first top_k (4).
    assert answer.outcome == Outcome.ANSWERED and len(answer.kept) == engine.config.top_k
    passing = [s for s in answer.kept if s.distance <= engine.config.threshold]
    assert len(passing) == 1
    prompt = _prompt(openai_server)
    for s in answer.kept:
        assert s.quote[:60] in prompt
    assert answer.beside == []
    row = kb.queries.get(answer.query_id or 0)
    assert [cid for cid, _ in row.kept] == [s.chunk_id for s in answer.kept]
    assert list(row.beside) == []


async def test_a_reranker_leaves_related_passages_beside_the_answer_never_given_to_the_model(
    kb: KnowledgeBase,
    engine_for: Callable[..., Engine],
    openai_server: OpenAICompatServer,
    tiny_cross_encoder: Path,
) -> None:
    engine = engine_for(
        **_only_the_best_passes(kb, QUESTION),
        top_k=RERANKED_TOP_K,
        reranker=str(tiny_cross_encoder),
    )
    answer = await engine.ask(QUESTION)

    assert answer.outcome == Outcome.ANSWERED and len(answer.kept) == RERANKED_TOP_K
    # The reranker chose among every related candidate; those of the first
    # top_k it left out, too far to pass alone, are listed beside.
    assert answer.beside
    assert {s.chunk_id for s in answer.beside}.isdisjoint(s.chunk_id for s in answer.kept)
    assert all(engine.config.threshold < s.distance for s in answer.beside)
    for s in answer.beside:
        assert s.url.startswith("https://kb.example.com/d/") and "#char=" in s.url
    prompt = _prompt(openai_server)
    assert answer.kept[0].quote[:60] in prompt
    for s in answer.beside:
        assert s.quote[:60] not in prompt
    row = kb.queries.get(answer.query_id or 0)
    assert list(row.beside) == [(s.chunk_id, s.distance) for s in answer.beside]


async def test_with_the_related_threshold_off_nothing_is_shown_beside(
    kb: KnowledgeBase, engine_for: Callable[..., Engine]
) -> None:
    threshold = _only_the_best_passes(kb, QUESTION)["threshold"]
    answer = await engine_for(threshold=threshold, related_threshold=threshold).ask(QUESTION)
    assert answer.outcome == Outcome.ANSWERED and answer.beside == []


async def test_evidence_without_a_model_shows_the_passages_it_would_be_written_from(
    kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> None:
    config = EngineConfig(
        link_base_url="https://kb.example.com", **_only_the_best_passes(kb, QUESTION)
    )
    engine = build_engine(config, kb)
    try:
        answer = await engine.ask(QUESTION)
    finally:
        await engine.aclose()
    assert answer.outcome == Outcome.MODEL_UNAVAILABLE
    assert len(answer.kept) == config.top_k and answer.beside == []
    assert openai_server.requests == []


PARITY_QUESTIONS = (
    QUESTION,
    "What do I do when the pager fires twice?",
    "How do I connect to the VPN from home?",
    "Who approves a production deploy on Friday?",
)


async def test_kb_eval_replays_exactly_what_the_engine_gives_the_model(
    kb: KnowledgeBase, engine_for: Callable[..., Engine]
) -> None:
    """The replay behind `kb eval`'s "needle kept" against the engine, on the same candidates.

    A small top_k and several thresholds per question, so that the answer's
    order (its best sentences, term proximity) and its first top_k decide what is shown.
    """
    shown = 0
    for question in PARITY_QUESTIONS:
        vector = kb.embedder.encode_query(question)
        cands = kb.search_index.search(vector, question, None, 2 * CANDIDATES_PER_KEPT, Mode.HYBRID)
        best = min(c.distance for c in cands)
        for step in (0.005, 0.02, 0.05):
            engine = engine_for(
                threshold=best + step, related_threshold=best + step + 0.15, top_k=2
            )
            cfg = engine.config
            answer = await engine.ask(question)
            ordered = answer_order(
                cands,
                vector,
                question,
                kb.store,
                sentence_weight=cfg.sentence_weight,
                proximity_weight=cfg.proximity_weight,
            )
            replay = Replay(
                [cands],
                [],
                [set()],
                {},
                top_k=2,
                max_kept=cfg.max_kept,
                margin=cfg.keep_margin,
                kept_order=[ordered],
            )
            assert replay.outcomes(cfg.threshold, cfg.related_threshold).answered == [True]
            expected = _ids(replay.kept(ordered, cfg.threshold, cfg.related_threshold))
            assert [s.chunk_id for s in answer.kept] == expected, (question, step)
            assert answer.beside == []
            shown += any(s.distance > cfg.threshold for s in answer.kept)
    assert shown >= 3  # the model was given passages only the related threshold let in


def test_kb_ask_prints_the_passages_beside_unnumbered_and_json_carries_them(
    kb: KnowledgeBase, tiny_cross_encoder: Path
) -> None:
    thresholds = _only_the_best_passes(kb, QUESTION)
    env = {
        "KB_THRESHOLD": str(thresholds["threshold"]),
        "KB_RELATED_THRESHOLD": str(thresholds["related_threshold"]),
        "KB_TOP_K": str(RERANKED_TOP_K),
        "KB_RERANKER": str(tiny_cross_encoder),
    }
    args = ["--data-dir", str(kb.config.data_dir), "ask", QUESTION]
    result = CliRunner().invoke(main, [*args, "--json"], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["beside"] and all(s["url"] and s["quote"] for s in data["beside"])
    beside_ids = {s["chunk_id"] for s in data["beside"]}
    assert beside_ids.isdisjoint(s["chunk_id"] for s in data["kept"])

    plain = CliRunner().invoke(main, args, env=env)
    assert plain.exit_code == 0, plain.output
    _, below = plain.stdout.split(messages.BESIDE_HEADER)
    listed = [line for line in below.splitlines() if line and not line.startswith(" ")]
    assert len(listed) == len(data["beside"]) and all(line.startswith("- ") for line in listed)


# ---------------------------------------------------------------- Slack


def _passage(n: int, document: str = "Handbook", section: str = "Expenses") -> SourceRef:
    quote = "Submit claims within 30 days."
    return SourceRef(
        n=n,
        chunk_id=10 + n,
        document_id=n,
        document=document,
        section=section,
        page=None,
        start=0,
        end=len(quote),
        url=f"https://kb.example/d/{n}?t=tok-{n}#char=0,10",
        quote=quote,
        distance=0.55,
    )


def _answered(beside: list[SourceRef], outcome: Outcome = Outcome.ANSWERED) -> Answer:
    return Answer(
        question="q",
        outcome=outcome,
        answer="Within 30 days [1].",
        grounded=outcome == Outcome.ANSWERED,
        model_called=True,
        sources=[_passage(1)],
        kept=[_passage(1)],
        beside=beside,
    )


@pytest.mark.parametrize(
    "outcome", [Outcome.ANSWERED, Outcome.UNSUPPORTED, Outcome.MODEL_UNAVAILABLE]
)
def test_slack_lists_the_passages_beside_an_answer_under_their_own_label(outcome: Outcome) -> None:
    rendered = render_answer(_answered([_passage(2), _passage(3)], outcome), words=words_for("en"))
    (block,) = [b for b in rendered.blocks if messages.BESIDE_HEADER in json.dumps(b)]
    assert block["type"] == "context"
    found = BESIDE_LINK_RE.findall(block["elements"][0]["text"])
    assert [url for url, _ in found] == [_passage(2).url, _passage(3).url]
    # Numbers belong to the answer's citations; these are unnumbered.
    assert all("[" not in label for _, label in found)
    assert messages.BESIDE_HEADER not in json.dumps(
        render_answer(_answered([]), words=words_for("en")).blocks
    )


def test_hostile_names_beside_an_answer_stay_inert() -> None:
    rendered = render_answer(
        _answered([_passage(2, document=HOSTILE, section=HOSTILE)]), words=words_for("en")
    )
    text = json.dumps(rendered.blocks)
    for token in ("<!channel>", "<@U123>", "<https://evil.example", "<#C1>"):
        assert token not in text
    assert "&lt;!channel&gt;" in text


def test_long_names_beside_an_answer_drop_a_link_rather_than_cut_one() -> None:
    # Names are cut to a display length, but "<" escapes to four characters.
    long = "<" * 1400
    passages = [_passage(n, document=long, section=long) for n in (2, 3, 4)]
    rendered = render_answer(_answered(passages), words=words_for("en"))
    (block,) = [b for b in rendered.blocks if messages.BESIDE_HEADER in json.dumps(b)]
    text = block["elements"][0]["text"]
    # Slack's limit, not the module's copy: a text object holds at most 3000 characters
    # (https://api.slack.com/reference/block-kit/composition-objects#text).
    assert len(text) <= 3000
    found = BESIDE_LINK_RE.findall(text)
    # Links are dropped only when the next would not fit (each is as long as the first).
    first_url, first_label = found[0]
    link = len(f"• <{first_url}|{first_label}>")
    assert len(found) < len(passages)
    assert len(text) + 1 + link > 3000
    assert [url for url, _ in found] == [p.url for p in passages[: len(found)]]
    assert text.count("• <") == len(found)  # no link left open


def test_a_link_too_long_for_slack_is_left_out_and_the_next_still_shown() -> None:
    # Longer than the 3000 characters Slack allows a text object (see above).
    too_long = replace(_passage(3), url="https://kb.example/d/3?t=" + "a" * 3000)
    rendered = render_answer(_answered([_passage(2), too_long, _passage(4)]), words=words_for("en"))
    (block,) = [b for b in rendered.blocks if messages.BESIDE_HEADER in json.dumps(b)]
    found = BESIDE_LINK_RE.findall(block["elements"][0]["text"])
    assert [url for url, _ in found] == [_passage(2).url, _passage(4).url]


async def test_slack_answer_links_the_passages_beside_it_to_the_viewer(
    make_bot: BotFactory, fixture_data_dir: Path, embedder: Embedder, tiny_cross_encoder: Path
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=fixture_data_dir), embedder=embedder)
    try:
        thresholds = _only_the_best_passes(kb, IN_DOMAIN)
    finally:
        kb.store.db.conn.close()
    bot = await make_bot(**thresholds, top_k=RERANKED_TOP_K, reranker=str(tiny_cross_encoder))

    await bot.event(app_mention_event(IN_DOMAIN))
    answer = await bot.answer()

    (request,) = bot.llm.requests
    user = request["messages"][-1]["content"]
    # The reranker chose top_k related passages to write from.
    assert re.findall(r"^\[(\d+)\] ", user, re.M) == ["1", "2", "3"]
    (block,) = [b for b in answer["blocks"] if messages.BESIDE_HEADER in json.dumps(b)]
    found = BESIDE_LINK_RE.findall(block["elements"][0]["text"])
    assert found
    # The links are the passages the query log says were listed, in their order.
    (feedback,) = [b for b in answer["blocks"] if b["type"] == "context_actions"]
    query_id = int(feedback["elements"][0]["negative_button"]["value"].split(":")[1])
    logged = [cid for cid, _ in bot.kb.queries.get(query_id).beside]
    rows = bot.kb.store.chunks_by_id(logged)
    assert [url.split("#")[1] for url, _ in found] == [
        f"char={rows[cid].start},{rows[cid].end}" for cid in logged
    ]
    for url, _ in found:
        assert url.startswith(PUBLIC_URL + "/d/")
        parts = urlsplit(url)
        page = await bot.http.get(f"{parts.path}?{parts.query}")
        assert page.status == 200
