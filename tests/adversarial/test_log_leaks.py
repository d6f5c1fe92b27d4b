"""Secrets stay secret in the log, whatever an outsider makes the bot fail on.

The attacker is anyone who can make the bot fail and the failure be logged with
its stack trace: a person asking or sharing files in Slack (a question in a
channel the bot cannot answer in, an event it cannot place, a file name far
too long), a model endpoint or a proxy in front of it sending garbage, Slack
refusing a message, or a client sending a malformed HTTP request. A traceback
that printed local variables would show the settings, bolt's context and
``Authorization: Bearer`` headers; a request line carries a citation link's
token, the credential that opens a document.

The log is configured as ``kb serve`` configures it, console and JSON, at
DEBUG, but without the secrets to redact: the secrets must not reach it at all.
Every failure must leave no secret and no link token in the log, keep its stack
trace (a text field in JSON), and no value it carries may start a line.
"""

from __future__ import annotations

import asyncio
import io
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer

pytest.register_assert_rewrite("tests.conftest_bot")

from bot.server import routes  # noqa: E402
from bot.settings import Settings  # noqa: E402
from index.embed import Embedder  # noqa: E402
from tests.canaries import CANARIES  # noqa: E402
from tests.conftest_bot import IN_DOMAIN, Bot, BotFactory, create_bot_app  # noqa: E402
from tests.servers import app_mention_event, file_share_event  # noqa: E402

FORMATS = ["console", "json"]
# A value that tries to end the line it is in, start a forged one, and reverse what follows.
FORGED_START = "2026-01-01T00:00:00.000000Z [critical ]"
FORGED = f"\r\n{FORGED_START} forged \u202etxt.exe\u2066"
QUESTION = IN_DOMAIN + FORGED
LONG_NAME = "quarterly-report-" + "x" * 3000 + FORGED + ".md"
GUIDE = b"# Onboarding\n\nPick up your badge at the front desk before 09:30.\n"
# Raw control and bidi characters; LF only separates lines the renderer writes itself.
RAW_CONTROL_RE = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028-\u202e\u2066-\u2069]")
LINK_TOKEN_RE = re.compile(r"[?&]t=([A-Za-z0-9_\-.]{12,})")

ProductLogs = Callable[..., io.StringIO]


async def _ask(bot: Bot, **event_changes: Any) -> None:
    event = app_mention_event(QUESTION)
    event.update(event_changes)
    for key in [k for k, v in event_changes.items() if v is None]:
        del event[key]
    await bot.event(event)
    await bot.idle()


async def _answer_cannot_be_shown(bot: Bot) -> None:
    bot.slack.fail("chat.update")
    await _ask(bot)


async def _nothing_can_be_posted(bot: Bot) -> None:
    bot.slack.fail("chat.postMessage")
    await _ask(bot)


async def _event_without_a_channel(bot: Bot) -> None:
    await _ask(bot, channel=None)


async def _model_sends_an_html_page(bot: Bot) -> None:
    bot.llm.answer_raw(
        b"<!DOCTYPE html><html><body><h1>502 Bad Gateway</h1></body></html>", "text/html"
    )
    await _ask(bot)


async def _model_sends_a_broken_chunk(bot: Bot) -> None:
    chunk = b'data: {"choices": [{"index": 0, "delta": {"content": "Sub'
    bot.llm.answer_raw(chunk + b"\n\ndata: [DONE]\n\n", "text/event-stream")
    await _ask(bot)


async def _file_with_a_very_long_name(bot: Bot) -> None:
    shared = bot.slack.add_file("F0LONGNAME1", LONG_NAME, GUIDE, "text/markdown")
    await bot.event(file_share_event([shared]))
    await bot.idle()


@dataclass(frozen=True)
class Failure:
    """An outsider's way to make the bot fail, and what its log must show."""

    trigger: Callable[[Bot], Awaitable[None]]
    traceback: bool = False
    # The bot sent citation links (their tokens must still not be logged).
    links: bool = False


FAILURES = {
    # The answer is posted as a new message instead: nothing fails, nothing to trace.
    "chat.update refused": Failure(_answer_cannot_be_shown, links=True),
    # The answer is computed and its post refused too: links in the refused call.
    "chat.postMessage refused": Failure(_nothing_can_be_posted, traceback=True, links=True),
    # Dropped before any listener runs (tests/adversarial/test_malformed_input.py).
    "event without a channel": Failure(_event_without_a_channel),
    "model sends HTML": Failure(_model_sends_an_html_page, links=True),
    "model sends a broken chunk": Failure(_model_sends_a_broken_chunk, links=True),
    "very long file name": Failure(_file_with_a_very_long_name),
}


def _records(out: str) -> list[dict[str, Any]]:
    """Every line of JSON output is one whole record."""
    return [json.loads(line) for line in out.split("\n") if line]


def _assert_no_secret(out: str, tokens: list[str]) -> None:
    assert [name for name, value in CANARIES.items() if value in out] == []
    assert [token[:8] for token in tokens if token in out] == []


def _assert_no_forged_line(out: str) -> None:
    assert RAW_CONTROL_RE.findall(out) == []
    # splitlines() breaks at every boundary some viewer honours, not only LF.
    assert [line for line in out.splitlines() if line.startswith(FORGED_START)] == []


def _assert_stack_trace(out: str, fmt: str) -> None:
    if fmt == "json":
        exceptions = [r["exception"] for r in _records(out) if "exception" in r]
        assert exceptions and all(isinstance(e, str) for e in exceptions)
        assert any(e.startswith("Traceback (most recent call last):") for e in exceptions)
    else:
        assert "\nTraceback (most recent call last):\n" in out


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("name", list(FAILURES))
async def test_a_failure_an_outsider_causes_leaks_nothing(
    make_bot: BotFactory, product_logs: ProductLogs, name: str, fmt: str
) -> None:
    failure = FAILURES[name]
    bot = await make_bot()
    out = product_logs(fmt)
    await failure.trigger(bot)
    text = out.getvalue()
    tokens = LINK_TOKEN_RE.findall(json.dumps(bot.slack.calls(include_rejected=True)))
    assert bool(tokens) == failure.links
    _assert_no_secret(text, tokens)
    _assert_no_forged_line(text)
    if fmt == "json":
        _records(text)
    if failure.traceback:
        _assert_stack_trace(text, fmt)


# ---------------------------------------------------------------- malformed HTTP


@pytest.fixture
async def served(
    settings_for: Callable[..., Settings], embedder: Embedder, fixture_data_dir: Path
) -> AsyncIterator[TestServer]:
    """The bot's web server as ``kb serve`` runs it: with the product's access log."""
    app = create_bot_app(settings_for(), embedder, fixture_data_dir)
    server = TestServer(app, host="127.0.0.1", port=0)
    await server.start_server(access_log_class=routes.AccessLogger)
    yield server
    await server.close()


def _valid_link(server: TestServer) -> tuple[int, str]:
    doc = server.app[routes.KB].store.find_document("handbook.md")
    return doc.id, server.app[routes.ENGINE].signer.token(doc.id, doc.scope)


async def _send(server: TestServer, raw: bytes) -> bytes:
    """Send ``raw`` as is on a new connection; the response's status line."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
    writer.write(raw)
    await writer.drain()
    status = await reader.readline()
    writer.close()
    await writer.wait_closed()
    return status


async def _logged(out: io.StringIO, text: str, timeout: float = 5.0) -> str:
    """The log once ``text`` is in it: the access line comes after the response."""
    async with asyncio.timeout(timeout):
        while text not in out.getvalue():
            await asyncio.sleep(0.01)
    return out.getvalue()


def _overlong_line(doc_id: int, token: str) -> bytes:
    return f"GET /d/{doc_id}?t={token}&pad={'x' * 9000} HTTP/1.1\r\nHost: kb\r\n\r\n".encode()


def _bad_char_in_url(doc_id: int, token: str) -> bytes:
    return f"GET /d/{doc_id}?t={token}\x00 HTTP/1.1\r\nHost: kb\r\n\r\n".encode()


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("request_line", [_overlong_line, _bad_char_in_url])
async def test_a_malformed_request_never_logs_the_link_token(
    served: TestServer,
    product_logs: ProductLogs,
    fmt: str,
    request_line: Callable[[int, str], bytes],
) -> None:
    doc_id, token = _valid_link(served)
    out = product_logs(fmt)
    assert (await _send(served, request_line(doc_id, token))).startswith(b"HTTP/1.0 400")
    text = await _logged(out, "UNKNOWN / 400")
    # aiohttp logged the failure with the URL, through the product's handler.
    assert "Error handling request" in text and "t=[redacted]" in text
    _assert_no_secret(text, [token])
    _assert_no_forged_line(text)
    _assert_stack_trace(text, fmt)
    if fmt == "json":
        (failure,) = [r for r in _records(text) if r["logger"] == "aiohttp.server"]
        assert "http_exceptions" in failure["exception"]


@pytest.mark.parametrize("fmt", FORMATS)
async def test_a_forged_path_cannot_start_an_access_log_line(
    served: TestServer, product_logs: ProductLogs, fmt: str
) -> None:
    path = "/d/%0D%0A2026-01-01T00:00:00.000000Z%20[critical%20]%20forged%20%E2%80%AEtxt.exe"
    out = product_logs(fmt)
    assert (await _send(served, f"GET {path} HTTP/1.1\r\nHost: kb\r\n\r\n".encode())).startswith(
        b"HTTP/1.1 403"
    )
    text = await _logged(out, " 403 ")
    events = [r["event"] for r in _records(text)] if fmt == "json" else text.splitlines()
    (access,) = [e for e in events if "GET /d/" in e]
    assert "GET /d/\\x0d\\x0a2026-01-01" in access and "\\u202etxt.exe 403" in access
    _assert_no_forged_line(text)
