"""Clients nobody authenticated cannot hold the server: slow requests, many connections, a log flood.

The attacker is anyone who can reach the port: before any signature, token or
session is checked, they open connections and send half a request (the head
cut short, or a body promised and never sent), as many as they like. The real
app (``bot.app.create_app``) runs as ``kb serve`` runs it, on
``bot.server.connections.GuardedRunner`` and a ``TCPSite`` on a random port;
the attacks are raw sockets. Deadlines are set short in each test and waited
on as the socket closing, within a bound that only stops a stuck test.

* half-sent requests are answered 408 and closed at their deadline, while
  ``/healthz`` and a signed Slack event are answered (in Socket Mode the same
  server serves the viewer and the health checks under the same limits);
* past the cap, the connection that has waited longest on its client makes
  room for a new one; when every connection is busy with a request, a new one
  gets 503 with ``Retry-After`` (before anything is read, once the health
  headroom is taken), and a health check still answers;
* a body over its route's size is refused before it is read, a head with too
  many headers is refused;
* a flood of such faults leaves a few log lines, counted, and no traceback.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import re
import resource
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from bot.server import bodies, routes
from bot.server.connections import GuardedRunner
from bot.server.limits import RESERVED_DESCRIPTORS, HttpLimits, connection_cap
from bot.settings import Settings
from bot.slack.app import MAX_BODY_BYTES as SLACK_MAX_BODY
from index.embed import Embedder
from tests.conftest_bot import create_bot_app
from tests.servers import (
    DEFAULT_SIGNING_SECRET,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    event_body,
    slack_headers,
)

# Bounds on a stuck test, never timings: a healthy run answers in milliseconds.
ANSWER_WAIT_S = 10.0
CLOSE_WAIT_S = 10.0
# Short deadlines, so that the tests wait on them.
SHORT = 1.0
# A deadline the test never reaches: what happens before it is the server's choice.
LONG = 120.0

# Half a request: the head cut off in a header, or a body promised and not sent.
HALF_HEAD = b"GET /healthz HTTP/1.1\r\nHost: kb\r\nX-Slow: "
HALF_BODY = (
    b"POST /slack/events HTTP/1.1\r\nHost: kb\r\nContent-Type: application/json\r\n"
    b"Content-Length: 1000\r\n\r\n" + b'{"token": "'
)


@dataclass
class Served:
    """The bot's app served as ``kb serve`` serves it, and the raw connections opened to it."""

    app: web.Application
    runner: GuardedRunner
    port: int
    raw: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def open(self, data: bytes = b"") -> asyncio.StreamReader:
        """A raw connection that sent ``data`` and nothing more; what the server sends on it."""
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        self.raw.append(writer)
        if data:
            writer.write(data)
            await writer.drain()
        return reader


Serve = Callable[..., Awaitable[Served]]


@pytest.fixture
async def serve(
    settings_for: Callable[..., Settings], embedder: Embedder, fixture_data_dir: Path
) -> AsyncIterator[Serve]:
    """Start the bot on ``GuardedRunner`` with setting overrides (``headroom``: the health
    headroom past the cap)."""
    runners: list[tuple[GuardedRunner, Served]] = []

    async def start(*, headroom: int | None = None, **overrides: Any) -> Served:
        app = create_bot_app(settings_for(**overrides), embedder, fixture_data_dir)
        if headroom is not None:
            app[bodies.LIMITS] = replace(app[bodies.LIMITS], health_headroom=headroom)
        runner = GuardedRunner(
            app,
            limits=app[bodies.LIMITS],
            faults=app[bodies.FAULTS],
            open_files=resource.getrlimit(resource.RLIMIT_NOFILE)[0],
            access_log_class=routes.AccessLogger,
        )
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        served = Served(app, runner, 0)
        runners.append((runner, served))
        await site.start()
        served.port = site.port
        return served

    yield start
    for runner, served in runners:
        for writer in served.raw:
            writer.close()
        await runner.cleanup()


async def _closed(reader: asyncio.StreamReader) -> bytes:
    """What the server wrote before closing the connection (waits for the close)."""
    async with asyncio.timeout(CLOSE_WAIT_S):
        return await reader.read()


async def _status_line(reader: asyncio.StreamReader) -> bytes:
    async with asyncio.timeout(ANSWER_WAIT_S):
        return await reader.readline()


async def _until(predicate: Callable[[], bool]) -> None:
    """Wait until the server's own state says ``predicate``."""
    async with asyncio.timeout(ANSWER_WAIT_S):
        while not predicate():
            await asyncio.sleep(0.005)


async def _get(served: Served, path: str) -> int:
    """GET ``path`` on a connection of its own (closed after the answer); the status."""
    timeout = aiohttp.ClientTimeout(total=ANSWER_WAIT_S)
    connector = aiohttp.TCPConnector(force_close=True)
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=connector) as http,
        http.get(served.url + path) as resp,
    ):
        await resp.read()
        return resp.status


def _signed_request(text: str = "How long for an expense claim?") -> bytes:
    """A signed ``app_mention`` to ``/slack/events``, as raw bytes, closing its connection."""
    body = event_body(app_mention_event(text))
    headers = {**slack_headers(DEFAULT_SIGNING_SECRET, body), "Connection": "close"}
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return (
        f"POST /slack/events HTTP/1.1\r\nHost: kb\r\n{head}"
        f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


async def _signed_event(served: Served) -> bytes:
    """Deliver a signed Slack event on a connection of its own; the answer's status line."""
    reader = await served.open(_signed_request())
    return (await _closed(reader)).split(b"\r\n", 1)[0]


# ---------------------------------------------------------------- deadlines


@pytest.mark.parametrize("slack_mode", ["http", "socket"])
async def test_half_sent_requests_are_closed_at_their_deadline_while_health_and_slack_answer(
    serve: Serve, slack: MockSlackAPI, slack_mode: str
) -> None:
    overrides = {"slack_app_token": slack.app_token} if slack_mode == "socket" else {}
    served = await serve(http_header_timeout=SHORT, http_body_timeout=SHORT, **overrides)
    heads = [await served.open(HALF_HEAD) for _ in range(20)]
    bodies_ = [await served.open(HALF_BODY) for _ in range(20)] if slack_mode == "http" else []
    silent = [await served.open() for _ in range(5)]
    assert await _get(served, "/healthz") == 200
    if slack_mode == "http":
        assert await _signed_event(served) == b"HTTP/1.1 200 OK"
    for reader in heads + bodies_:
        answer = await _closed(reader)
        assert answer.startswith(b"HTTP/1.1 408 Request Timeout\r\n")
        assert b"\r\nConnection: close\r\n" in answer
    for reader in silent:
        assert await _closed(reader) == b""  # nothing was asked: nothing is answered
    assert await _get(served, "/healthz") == 200


async def test_a_kept_alive_connection_idle_past_the_heads_deadline_is_served(
    serve: Serve,
) -> None:
    served = await serve(http_header_timeout=SHORT, http_keepalive_timeout=LONG)
    kept = await served.open(b"GET /healthz HTTP/1.1\r\nHost: kb\r\n\r\n")
    assert (await _status_line(kept)).startswith(b"HTTP/1.1 200")
    # A connection opened after that answer, closed at its head's deadline: the
    # first one has now been idle longer than that, held by the keep-alive timeout only.
    assert await _closed(await served.open()) == b""
    served.raw[0].write(b"GET /healthz HTTP/1.1\r\nHost: kb\r\nConnection: close\r\n\r\n")
    assert (await _closed(kept)).count(b"HTTP/1.1 200 OK") == 1


async def test_a_connection_idle_after_a_body_nobody_read_makes_room_like_any_idle_one(
    serve: Serve,
) -> None:
    served = await serve(http_max_connections=1, headroom=0, http_keepalive_timeout=LONG)
    # /healthz answers 405 to a POST without reading its body, whose rest comes after
    # (aiohttp reads and drops it): then the connection is idle, waiting on its client.
    kept = await served.open(b"POST /healthz HTTP/1.1\r\nHost: kb\r\nContent-Length: 5\r\n\r\nhe")
    assert (await _status_line(kept)).startswith(b"HTTP/1.1 405")
    served.raw[0].write(b"llo")
    await _until(lambda: len(served.runner.guard.waiting) == 1)
    assert await _get(served, "/healthz") == 200
    rest = await _closed(kept)
    assert b" 408 " not in rest and b" 503 " not in rest  # closed without a word: it asked nothing


# ---------------------------------------------------------------- the cap


async def test_past_the_cap_the_client_waiting_longest_makes_room(serve: Serve) -> None:
    served = await serve(http_max_connections=6, http_header_timeout=LONG, http_body_timeout=LONG)
    guard = served.runner.guard
    assert guard.cap == 6

    async def fill() -> None:
        """Half-sent requests up to the cap, one at a time (their order is the test's)."""
        while (n := guard.open) < guard.cap:
            waiting.append(await served.open(HALF_HEAD if n % 2 else HALF_BODY))
            await _until(opened(n + 1))

    def opened(count: int) -> Callable[[], bool]:
        return lambda: guard.open == count

    waiting: list[asyncio.StreamReader] = []
    await fill()
    assert await _get(served, "/healthz") == 200
    assert (await _closed(waiting[0])).startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    await _until(lambda: guard.open == 5)  # the health check's connection closed too
    await fill()
    assert await _signed_event(served) == b"HTTP/1.1 200 OK"
    assert (await _closed(waiting[1])).startswith(b"HTTP/1.1 408 Request Timeout\r\n")
    # The others still wait: only as much room as was needed was made.
    await _until(lambda: guard.open == 5)
    assert len(guard.waiting) == 5


async def _busy_mcp_calls(
    served: Served, llm: OpenAICompatServer, count: int
) -> list[asyncio.Task[int]]:
    """``count`` MCP questions held at the model: connections the server is working for."""
    token, _ = served.app[routes.KB].store.mcp_tokens.issue("busy", user_id="U0ALICE001")
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "ask_knowledge_base",
            "arguments": {"question": "How long do I have to submit an expense claim?"},
        },
    }
    body = json.dumps(call).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: kb\r\nAuthorization: Bearer {token}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"Connection: close\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    llm.delay(LONG)

    async def ask() -> int:
        answer = await (await served.open(head.encode() + body)).read()
        return int(answer.split(b" ", 2)[1])

    calls = [asyncio.create_task(ask()) for _ in range(count)]
    await llm.wait_for_requests(count)
    return calls


@pytest.mark.parametrize("headroom", [1, 0])
async def test_when_every_connection_is_busy_a_new_one_gets_503_and_health_still_answers(
    serve: Serve, llm: OpenAICompatServer, headroom: int
) -> None:
    served = await serve(
        mcp=True,
        headroom=headroom,
        http_max_connections=2,
        llm_timeout=LONG,
        llm_first_token_timeout=LONG,
        llm_deadline=LONG,
    )
    calls = await _busy_mcp_calls(served, llm, 2)
    guard = served.runner.guard
    assert guard.open == 2 and not guard.waiting
    if headroom:
        # Past the cap, a health check is read and answered, and only that:
        # anything else is refused, Slack's events included.
        assert await _get(served, "/healthz") == 200
        refused = await _closed(await served.open(_signed_request()))
    else:
        # No headroom: the 503 comes before the client has sent a byte.
        refused = await _closed(await served.open())
    assert refused.startswith(b"HTTP/1.1 503 Service Unavailable\r\n")
    assert b"\r\nRetry-After: 5\r\n" in refused and b"try again shortly" in refused
    await llm.close()  # the held answers end: the busy calls are answered
    assert await asyncio.gather(*calls) == [200, 200]


def test_the_cap_keeps_descriptors_for_the_servers_own_files() -> None:
    limits = HttpLimits(max_connections=1000)
    assert connection_cap(limits, 1_048_576) == 1000
    assert connection_cap(limits, 1024) + limits.health_headroom + RESERVED_DESCRIPTORS == 1024
    # A limit too small for the whole reserve still leaves half of it to clients.
    assert connection_cap(limits, 256) == 128 - limits.health_headroom


def test_serving_raises_the_soft_open_file_limit_to_the_hard_one() -> None:
    script = (
        "import resource\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 1024))\n"
        "from bot.server.connections import raise_open_file_limit\n"
        "print(*raise_open_file_limit())\n"
    )
    # This checkout's code, whatever the environment has installed.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, env=env
    )
    assert done.stdout.split() == ["1024", "1024"]


# ---------------------------------------------------------------- sizes


async def test_a_body_over_the_routes_size_is_refused_before_it_is_read(serve: Serve) -> None:
    served = await serve(http_body_timeout=LONG)
    # The head alone: a server that waited for the body would answer nothing.
    slack_event = await served.open(
        b"POST /slack/events HTTP/1.1\r\nHost: kb\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {SLACK_MAX_BODY + 1}\r\n\r\n".encode()
    )
    assert (await _status_line(slack_event)).startswith(b"HTTP/1.1 413")
    # A route without a size of its own takes 64 KiB.
    health = await served.open(
        b"GET /healthz HTTP/1.1\r\nHost: kb\r\n"
        + f"Content-Length: {bodies.DEFAULT_MAX_BODY + 1}\r\n\r\n".encode()
    )
    assert (await _status_line(health)).startswith(b"HTTP/1.1 413")


async def test_a_head_with_too_many_headers_is_refused(serve: Serve) -> None:
    served = await serve()
    limit = served.app[bodies.LIMITS].max_headers

    async def with_headers(count: int) -> bytes:
        extra = "".join(f"X-Header-{n}: {n}\r\n" for n in range(count - 2))
        head = f"GET /healthz HTTP/1.1\r\nHost: kb\r\n{extra}Connection: close\r\n\r\n"
        return await _status_line(await served.open(head.encode()))

    assert (await with_headers(limit)).startswith(b"HTTP/1.1 200")
    assert (await with_headers(limit + 1)).startswith(b"HTTP/1.0 400")


# ---------------------------------------------------------------- the log


async def test_a_flood_of_client_faults_leaves_a_few_counted_lines_and_no_traceback(
    serve: Serve, product_logs: Callable[..., io.StringIO]
) -> None:
    out = product_logs("console")
    served = await serve(http_header_timeout=SHORT, http_body_timeout=SHORT)
    doc = served.app[routes.KB].store.find_document("handbook.md")
    token = served.app[routes.ENGINE].signer.token(doc.id, doc.scope)
    malformed = f"GET /d/{doc.id}?t={token}&pad={'x' * 9000} HTTP/1.1\r\nHost: kb\r\n\r\n"
    too_large = b"POST /slack/events HTTP/1.1\r\nHost: kb\r\nContent-Length: 9999999\r\n\r\n"
    for _ in range(10):
        await served.open(HALF_BODY)
    server = served.runner.server
    assert server is not None
    await _until(lambda: server.requests_count == 10)  # their handlers wait for the body
    for writer in served.raw:
        writer.close()  # these ten go away in the middle of their body
    answered = (
        [await served.open(HALF_HEAD) for _ in range(30)]
        + [await served.open(HALF_BODY) for _ in range(30)]
        + [await served.open(malformed.encode()) for _ in range(10)]
        + [await served.open(too_large) for _ in range(10)]
    )
    for reader in answered:
        assert await _closed(reader)
    served.app[bodies.FAULTS].close()  # what is still counted is logged now
    text = out.getvalue()
    assert "Traceback" not in text and token not in text
    lines = text.splitlines()
    assert len(lines) <= 40, text
    for sentence, count in [
        ("request head not complete in time", 30),
        ("request body not complete in time", 30),
        ("malformed request", 10),
        ("request body over the route's limit", 10),
        ("client went away", 10),
    ]:
        kind = [line for line in lines if sentence in line]
        assert len(kind) == 4, kind  # three on their own, then the count of the rest
        assert f": {count - 3} more in the last" in kind[-1]


def test_accept_failing_for_want_of_descriptors_is_a_counted_line_not_a_traceback_each() -> None:
    # A process out of descriptors whatever the cap (something else of it holds them all):
    # asyncio's accept() fails and retries, its failures reported to the server's handler.
    script = """
import asyncio, os, resource, socket, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
from bot.logs import configure_logging
from bot.server.connections import accept_failures
from bot.server.faults import ClientFaults, Fault

async def main():
    configure_logging("INFO")
    faults = ClientFaults()
    asyncio.get_running_loop().set_exception_handler(accept_failures(faults))
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port)) for _ in range(3)]
    held = []
    while True:
        try:
            held.append(os.dup(0))
        except OSError:
            break
    async with asyncio.timeout(20):
        while faults.seen(Fault.ACCEPT_FAILED) < 50:
            await asyncio.sleep(0.01)
    faults.close()

asyncio.run(main())
"""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr
    failed = [line for line in lines if "could not accept a connection" in line]
    # Three on their own, each saying why, then one count of the rest.
    assert len(failed) == 4 and all("Too many open files" in line for line in failed[:3])
    assert re.search(r": \d+ more in the last", failed[-1])
