"""The answer engine against a local OpenAI-compatible server, through the real `openai` client."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from click.testing import CliRunner

from bot.cli import main
from core.answer import REFUSAL_TEXT, Engine, Outcome, build_engine
from core.config import EngineConfig, LLMConfig
from core.links import parse_char_fragment
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.models import ALL_SCOPES, EVERYONE
from tests.docs_factory import text_pdf
from tests.servers import OpenAICompatServer, closed_port_url

IN_DOMAIN = "How do I get reimbursed for a conference ticket?"
# Far inside the shipped threshold (distance ~0.36), for tests on the default settings.
CLEARLY_IN_DOMAIN = "Can I deploy to production on a Friday?"
OUT_OF_DOMAIN = "What is the offside rule in football?"


def _config(base_url: str, *, llm_timeout: float = 2.0, **kw: object) -> EngineConfig:
    values: dict[str, object] = {
        "llm": LLMConfig(base_url=base_url, max_retries=0, timeout=llm_timeout),
        "link_base_url": "https://kb.example.com",
        # The sample handbook is four short documents: its in-domain questions
        # sit near 0.47-0.5; 0.55 keeps two passages so renumbering is visible.
        "threshold": 0.55,
        **kw,
    }
    return EngineConfig(**values)  # type: ignore[arg-type]


@pytest.fixture
def kb(sample_kb: KnowledgeBase) -> KnowledgeBase:
    return sample_kb  # bot/sample ingested (a copy of the session's)


_OPEN: list[Engine] = []


def _engine(kb: KnowledgeBase, base_url: str, **kw: Any) -> Engine:
    engine = build_engine(_config(base_url, **kw), kb)
    _OPEN.append(engine)
    return engine


@pytest.fixture(autouse=True)
async def _close_engines() -> AsyncIterator[None]:
    yield
    while _OPEN:
        await _OPEN.pop().aclose()


async def test_refusal_makes_zero_model_requests(
    kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> None:
    engine = _engine(kb, openai_server.url)
    answer = await engine.ask(OUT_OF_DOMAIN)
    assert answer.outcome == Outcome.REFUSED
    assert answer.answer == REFUSAL_TEXT
    assert answer.sources == [] and answer.kept == []
    assert answer.model_called is False
    assert openai_server.requests == []
    row = kb.queries.get(answer.query_id or 0)
    assert row.outcome == "refused" and row.model_called == 0
    # Nothing kept, but the nearest miss is logged for the knowledge gaps: a real
    # chunk, at a distance beyond the threshold.
    assert row.kept == () and row.nearest is not None
    chunk_id, distance = row.nearest
    assert chunk_id in kb.store.chunks_by_id([chunk_id])
    assert engine.config.threshold < distance <= 2.0


async def test_the_log_tells_an_unrestricted_question_from_one_for_everyone(
    kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> None:
    engine = _engine(kb, openai_server.url)
    logged: dict[frozenset[str] | None, tuple[str, ...]] = {}
    for scopes in (None, frozenset(), frozenset({"C2", "C1"})):
        answer = await engine.ask(OUT_OF_DOMAIN, scopes=scopes)
        logged[scopes] = tuple(kb.queries.get(answer.query_id or 0).scopes)
    assert logged == {None: (ALL_SCOPES,), frozenset(): (), frozenset({"C1", "C2"}): ("C1", "C2")}
    assert ALL_SCOPES != EVERYONE


async def test_answer_cites_and_links_resolve_to_the_quote(
    kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> None:
    openai_server.set_reply("Attach your manager's approval email to the claim [1].")
    answer = await _engine(kb, openai_server.url).ask(IN_DOMAIN)
    assert answer.outcome == Outcome.ANSWERED and answer.grounded and answer.model_called
    assert len(openai_server.requests) == 1
    prompt = json.dumps(openai_server.requests[0]["messages"])
    for kept in answer.kept:
        assert kept.quote[:40].replace('"', '\\"') in prompt
    assert [s.n for s in answer.sources] == [1]
    src = answer.sources[0]
    assert src.chunk_id == answer.kept[0].chunk_id
    parts = urlsplit(src.url)
    assert parts.path == f"/d/{src.document_id}" and parts.query.startswith("t=")
    span = parse_char_fragment(parts.fragment)
    assert span is not None
    text = kb.canonical_text(src.document_id)
    assert text[span[0] : span[1]] == src.quote
    # the same through the CLI a person would use
    shown = CliRunner().invoke(
        main, ["--data-dir", str(kb.config.data_dir), "show", str(src.document_id), "--text"]
    )
    assert shown.exit_code == 0 and shown.stdout[span[0] : span[1]] == src.quote


async def test_only_cited_sources_are_returned_renumbered(
    kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> None:
    openai_server.set_reply(
        "Claims go in within 30 days [2]. Approval is needed [1][2]. See also [9]."
    )
    answer = await _engine(kb, openai_server.url).ask(IN_DOMAIN)
    assert len(answer.kept) >= 2
    assert [s.chunk_id for s in answer.sources] == [
        answer.kept[1].chunk_id,
        answer.kept[0].chunk_id,
    ]
    assert [s.n for s in answer.sources] == [1, 2]
    assert answer.answer.startswith("Claims go in within 30 days [1]. Approval is needed [2][1].")
    assert "[9]" in answer.answer and answer.invalid_citations == ["[9]"]


async def test_answer_without_valid_citation_is_unsupported(
    kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> None:
    openai_server.set_reply("You should ask finance, as in `claims[1]` or the 2020 policy [2020].")
    answer = await _engine(kb, openai_server.url).ask(IN_DOMAIN)
    assert answer.outcome == Outcome.UNSUPPORTED
    assert answer.grounded is False and answer.sources == []
    assert kb.queries.get(answer.query_id or 0).outcome == "unsupported"


@pytest.mark.parametrize("failure", ["no_endpoint", "refused", "http_500", "http_503", "timeout"])
async def test_model_down_returns_evidence_not_an_error(
    kb: KnowledgeBase, openai_server: OpenAICompatServer, failure: str
) -> None:
    url = {"no_endpoint": "", "refused": closed_port_url()}.get(failure, openai_server.url)
    if failure.startswith("http_"):
        openai_server.fail_with(int(failure[5:]))
    if failure == "timeout":
        openai_server.delay(5)
    answer = await _engine(kb, url, llm_timeout=0.5).ask(IN_DOMAIN)
    assert answer.outcome == Outcome.MODEL_UNAVAILABLE
    assert answer.grounded is False
    assert answer.sources and answer.sources == answer.kept
    assert all("#char=" in s.url for s in answer.sources)
    assert answer.model_error
    assert answer.model_called is (failure != "no_endpoint")


async def test_pdf_source_links_to_its_page(
    index_dir: Path, embedder: Embedder, openai_server: OpenAICompatServer
) -> None:
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    pages = [
        "Welcome to the facilities guide. The building has four floors and two lifts.",
        "Parking: employees park in garage B. Visitor badges are issued at the front desk.",
        "Bicycle storage is in the basement, next to the showers, and opens at 07:00.",
    ]
    doc = kb.ingest_bytes(text_pdf(pages), "facilities.pdf").document
    assert doc.state == "indexed"
    openai_server.set_reply("Bicycles go in the basement storage [1].")
    answer = await _engine(kb, openai_server.url).ask("Where can I store my bicycle?")
    src = answer.sources[0]
    parts = urlsplit(src.url)
    assert parts.path == f"/d/{doc.id}/file" and parts.fragment == f"page={src.page}"
    text = kb.canonical_text(doc.id)
    starts = [int(x) for x in kb.store.document(doc.id).page_starts.split(",")] + [len(text)]
    page_text = text[starts[src.page - 1] : starts[src.page]]
    assert src.quote in page_text and "Bicycle" in src.quote


async def test_channel_scoped_document_never_leaks(
    sample_kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> None:
    kb = sample_kb
    secret = b"# Layoff plan\n\nThe conference ticket budget is frozen and reimbursement of conference tickets stops in March.\n"
    doc = kb.ingest_bytes(secret, "plan.md", scope="C_EXEC").document
    engine = _engine(kb, openai_server.url)
    openai_server.set_reply("See [1].")
    q = "Is reimbursement of conference tickets stopping?"
    everywhere = await engine.ask(q, scopes=frozenset({"C_EXEC"}))
    assert doc.id in {s.document_id for s in everywhere.kept}
    for scopes in (frozenset({"C_OTHER"}), frozenset()):
        other = await engine.ask(q, scopes=scopes)
        assert doc.id not in {s.document_id for s in other.kept}
        # filtered inside the search: the scope still gets its full top-k
        candidates = engine.retrieve(q, scopes=scopes, k=4)
        assert len(candidates) == 4
        rows = kb.store.chunks_by_id([c.chunk_id for c in candidates])
        assert doc.id not in {r.document_id for r in rows.values()}
    prompts = json.dumps([r["messages"] for r in openai_server.requests[1:]])
    assert "frozen" not in prompts


def test_kb_ask_json_has_the_documented_fields(kb: KnowledgeBase) -> None:
    result = CliRunner().invoke(
        main, ["--data-dir", str(kb.config.data_dir), "ask", CLEARLY_IN_DOMAIN, "--json"]
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    for key in ("outcome", "answer", "grounded", "model_called", "sources", "kept", "timings_ms"):
        assert key in data
    assert data["outcome"] == "model_unavailable" and data["grounded"] is False
    for key in (
        "n",
        "document_id",
        "document",
        "section",
        "page",
        "start",
        "end",
        "url",
        "quote",
        "distance",
    ):
        assert key in data["sources"][0]
    assert set(data["timings_ms"]) >= {"embed", "retrieve", "gate", "total"}
    # The query log says the question came from the command line, not from Slack.
    logged = kb.store.queries.get(data["query_id"])
    assert (logged.surface, logged.client) == ("cli", None)


# ---------------------------------------------------------------- malformed and slow models

_COMPLETION = {
    "id": "chatcmpl-x",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "message": {"role": "assistant"}, "finish_reason": "stop"}],
}


def _completion_with(content: object) -> bytes:
    body = json.loads(json.dumps(_COMPLETION))
    body["choices"][0]["message"]["content"] = content
    return json.dumps(body).encode()


MALFORMED = {
    "html_page": (b"<!DOCTYPE html><html><body>Sign in</body></html>", "text/html"),
    "not_json": (b"{this is not json", "application/json"),
    "numeric_content": (_completion_with(42), "application/json"),
    "null_content": (_completion_with(None), "application/json"),
    "empty_content": (_completion_with("   "), "application/json"),
    "broken_stream_chunk": (b"data: {not json\n\ndata: [DONE]\n\n", "text/event-stream"),
    "numeric_stream_chunk": (
        b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":7},"finish_reason":null}]}\n\n'
        b"data: [DONE]\n\n",
        "text/event-stream",
    ),
    "boolean_content": (_completion_with(True), "application/json"),
    "content_of_parts": (_completion_with([{"type": "text", "text": "x [1]"}]), "application/json"),
    "content_an_object": (_completion_with({"text": "x [1]"}), "application/json"),
    "choices_null": (json.dumps({**_COMPLETION, "choices": None}).encode(), "application/json"),
    "choices_an_object": (
        json.dumps({**_COMPLETION, "choices": {"0": _COMPLETION["choices"][0]}}).encode(),  # type: ignore[index]
        "application/json",
    ),
    "message_null": (
        json.dumps({**_COMPLETION, "choices": [{"index": 0, "message": None}]}).encode(),
        "application/json",
    ),
    "stream_delta_null": (
        b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
        b'"choices":[{"index":0,"delta":null,"finish_reason":null}]}\n\n'
        b"data: [DONE]\n\n",
        "text/event-stream",
    ),
    "stream_content_true": (
        b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
        b'"choices":[{"index":0,"delta":{"content":true},"finish_reason":null}]}\n\n'
        b"data: [DONE]\n\n",
        "text/event-stream",
    ),
    "stream_choices_null": (
        b'data: {"id":"c","object":"chat.completion.chunk","created":0,"model":"m",'
        b'"choices":null}\n\n'
        b"data: [DONE]\n\n",
        "text/event-stream",
    ),
}
NOT_WELL_FORMED = "sent a reply that is not a well-formed answer"
NO_TEXT = "reply held no answer text"
# Why each reply shows the evidence (asked for whole, streamed): a reply the client cannot
# parse, or one without text. Streamed, a body that is no event stream at all (an HTML
# page, broken JSON) holds no event, so no text.
MALFORMED_REASON = {
    "html_page": (NOT_WELL_FORMED, NO_TEXT),
    "not_json": (NOT_WELL_FORMED, NO_TEXT),
    "numeric_content": (NO_TEXT, NO_TEXT),
    "null_content": (NO_TEXT, NO_TEXT),
    "empty_content": (NO_TEXT, NO_TEXT),
    "broken_stream_chunk": (NOT_WELL_FORMED, NOT_WELL_FORMED),
    "numeric_stream_chunk": (NOT_WELL_FORMED, NOT_WELL_FORMED),
    "boolean_content": (NO_TEXT, NO_TEXT),
    "content_of_parts": (NO_TEXT, NO_TEXT),
    "content_an_object": (NO_TEXT, NO_TEXT),
    "choices_null": ("returned no choices", NO_TEXT),
    "choices_an_object": (NOT_WELL_FORMED, NO_TEXT),
    "message_null": (NOT_WELL_FORMED, NO_TEXT),
    "stream_delta_null": (NOT_WELL_FORMED, NOT_WELL_FORMED),
    "stream_content_true": (NOT_WELL_FORMED, NOT_WELL_FORMED),
    "stream_choices_null": (NOT_WELL_FORMED, NO_TEXT),
}


async def _deltas(text: str) -> None:
    return None


@pytest.mark.parametrize("streamed", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("reply", sorted(MALFORMED))
async def test_a_malformed_model_reply_shows_the_evidence(
    kb: KnowledgeBase, openai_server: OpenAICompatServer, reply: str, streamed: bool
) -> None:
    openai_server.answer_raw(*MALFORMED[reply])
    engine = _engine(kb, openai_server.url)
    answer = await engine.ask(IN_DOMAIN, on_delta=_deltas if streamed else None)
    assert answer.outcome == Outcome.MODEL_UNAVAILABLE, answer.answer
    assert answer.grounded is False and answer.model_called is True
    assert answer.sources and answer.sources == answer.kept
    reason = answer.model_error or ""
    assert MALFORMED_REASON[reply][streamed] in reason, reason
    assert kb.queries.get(answer.query_id or 0).outcome == "model_unavailable"


async def test_a_trickling_model_is_cut_off_at_the_deadline(
    kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> None:
    import time

    # One word every 0.4 s never trips the per-read timeout (2 s), only the deadline.
    openai_server.set_reply("Ask finance for a conference ticket refund, see the policy [1].")
    openai_server.trickle(0.4)
    config = _config(openai_server.url)
    engine = build_engine(
        EngineConfig(
            **{**config.__dict__, "llm": LLMConfig(**{**config.llm.__dict__, "deadline": 1.0})}
        ),
        kb,
    )
    _OPEN.append(engine)
    shown: list[str] = []

    async def show(text: str) -> None:
        shown.append(text)

    started = time.monotonic()
    answer = await engine.ask(IN_DOMAIN, on_delta=show)
    elapsed = time.monotonic() - started
    assert answer.outcome == Outcome.MODEL_UNAVAILABLE and answer.sources
    assert shown, "the words that came in time were shown while waiting"
    assert elapsed < 2.5, elapsed


async def test_a_model_that_never_starts_is_cut_off_at_the_first_token_timeout(
    kb: KnowledgeBase, openai_server: OpenAICompatServer
) -> None:
    import time

    openai_server.delay(5)
    config = _config(openai_server.url, llm_timeout=10.0)
    llm = LLMConfig(**{**config.llm.__dict__, "first_token_timeout": 0.5})
    engine = build_engine(EngineConfig(**{**config.__dict__, "llm": llm}), kb)
    _OPEN.append(engine)
    started = time.monotonic()
    answer = await engine.ask(IN_DOMAIN, on_delta=_deltas)
    assert answer.outcome == Outcome.MODEL_UNAVAILABLE
    assert time.monotonic() - started < 2.0


async def test_kb_ask_shows_an_uncited_answer_with_the_passages_it_was_given(
    kb: KnowledgeBase, openai_server: OpenAICompatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from bot.slack.messages import UNCITED_FALLBACK

    openai_server.set_reply("The knowledge base does not say whether that is allowed.")
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)
    args = ["--data-dir", str(kb.config.data_dir), "ask", CLEARLY_IN_DOMAIN]
    # In a thread: the model server answers from this test's event loop.
    plain = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert plain.exit_code == 0, plain.output
    lines = plain.stdout.splitlines()
    assert lines[0] == "This answer cites no source; treat it with care."
    assert lines[1] == "The knowledge base does not say whether that is allowed."
    assert UNCITED_FALLBACK in lines
    listed = lines[lines.index(UNCITED_FALLBACK) + 1 :]
    assert listed[0].startswith("[1] ") and any("#char=" in line for line in listed)
    as_json = await asyncio.to_thread(CliRunner().invoke, main, [*args, "--json"])
    data = json.loads(as_json.stdout)
    assert data["outcome"] == "unsupported" and data["sources"] == [] and data["kept"]
    assert data["grounded"] is False and data["model_called"] is True


async def test_kb_ask_json_with_a_broken_model_prints_the_evidence(
    kb: KnowledgeBase, openai_server: OpenAICompatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    openai_server.answer_raw(*MALFORMED["html_page"])
    monkeypatch.setenv("OPENAI_BASE_URL", openai_server.url)
    monkeypatch.setenv("KB_LLM_MAX_RETRIES", "0")
    monkeypatch.setenv("KB_LLM_TIMEOUT", "5")
    args = ["--data-dir", str(kb.config.data_dir), "ask", CLEARLY_IN_DOMAIN, "--json"]
    # In a thread: the model server answers from this test's event loop.
    result = await asyncio.to_thread(CliRunner().invoke, main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["outcome"] == "model_unavailable" and data["sources"]
    assert "well-formed" in data["model_error"]
    assert len(openai_server.requests) == 1


async def test_credentials_in_the_model_url_never_reach_an_error_message(
    kb: KnowledgeBase,
) -> None:
    url = closed_port_url().replace("http://", "http://kbuser:canary-url-password@")
    answer = await _engine(kb, url).ask(IN_DOMAIN)
    assert answer.outcome == Outcome.MODEL_UNAVAILABLE
    reason = answer.model_error or ""
    assert "could not be reached" in reason
    assert "canary-url-password" not in reason and "kbuser" not in reason


async def test_every_model_client_shares_one_tls_context_that_checks_certificates() -> None:
    import ssl

    from core.llm import LLM, _tls

    clients = [LLM(LLMConfig(base_url="https://llm.example.com/v1", timeout=7.0)) for _ in "ab"]
    try:
        # Read once per process, not once per engine: the same context, verifying.
        assert _tls() is _tls()
        assert _tls().verify_mode == ssl.CERT_REQUIRED and _tls().check_hostname
        assert all(llm.configured for llm in clients)
    finally:
        for llm in clients:
            await llm.aclose()
