"""Socket Mode end to end: the product's handler, the real SDK client, a local Socket Mode server.

The bot starts the way ``run_server`` starts it (``enable_socket_mode``), so the
SDK's ``SocketModeClient`` asks the mock Web API for a websocket URL with the
app-level token, connects, receives Slack's ``hello``, and acknowledges the
envelopes the test pushes, while answers go out through the Web API.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from slack_bolt.request.async_request import AsyncBoltRequest
from slack_bolt.response import BoltResponse
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import messages
from bot.slack.app import BOLT, enable_socket_mode

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import (  # noqa: E402
    ADMIN_ID,
    IN_DOMAIN,
    PUBLIC_URL,
    Bot,
    BotFactory,
    links,
)
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    USER_ID,
    MockSlackAPI,
    app_mention_event,
    event_payload,
    slash_command_payload,
    socket_envelope,
)

# The SDK sends the websocket through these when set, and it ignores NO_PROXY.
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy")


@dataclass
class SocketBot(Bot):
    """The bot connected in Socket Mode; ``dispatched`` lists the mode of every request bolt saw."""

    dispatched: list[str] = field(default_factory=list)


@pytest.fixture
async def socket_bot(
    make_bot: BotFactory, slack: MockSlackAPI, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[SocketBot]:
    """The bot on the fixture documents, started in Socket Mode against the mock Slack."""
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    dispatched: list[str] = []

    def prepare(app: web.Application) -> None:
        assert enable_socket_mode(app)
        bolt = app[BOLT]
        dispatch = bolt.async_dispatch

        async def recording_dispatch(req: AsyncBoltRequest) -> BoltResponse:
            dispatched.append(req.mode)
            return await dispatch(req)

        bolt.async_dispatch = recording_dispatch  # type: ignore[method-assign]

    # The signing secret stays set, so HTTP events would be accepted too: the
    # tests check that the websocket, not /slack/events, delivered everything.
    # Starting the app starts the Socket Mode connection in the background.
    bot = await make_bot(slack_app_token=slack.app_token, admin_users=ADMIN_ID, prepare=prepare)
    await slack.wait_for_socket()
    yield SocketBot(
        bot.http, bot.app, bot.slack, bot.llm, bot.settings, bot.startup_tasks, dispatched
    )
    # Shut the bot down while the mock Slack still runs, so the client hangs up
    # cleanly instead of trying to reconnect to a server that went away.
    await bot.http.close()


def _socket_mode_on(app: web.Application) -> None:
    assert enable_socket_mode(app)


async def _wait_until_disconnected(slack: MockSlackAPI, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while slack.open_sockets:
        if time.monotonic() > deadline:
            raise AssertionError(f"{slack.open_sockets} Socket Mode connection(s) still open")
        await asyncio.sleep(0.02)


async def test_connections_open_takes_only_the_app_level_token(slack: MockSlackAPI) -> None:
    client = AsyncWebClient(base_url=slack.api_url)
    for token, error in (
        (slack.bot_token, "not_allowed_token_type"),
        ("xapp-1-other", "invalid_auth"),
    ):
        with pytest.raises(SlackApiError) as raised:
            await client.apps_connections_open(app_token=token)
        assert raised.value.response["error"] == error
    opened = await client.apps_connections_open(app_token=slack.app_token)
    assert opened["url"] == slack.url.replace("http://", "ws://") + "/socket"


async def test_startup_opens_one_connection_with_the_app_token(socket_bot: SocketBot) -> None:
    # Accepted only with the app-level token, on the mock: the base URL reached the SDK client.
    assert len(socket_bot.slack.calls("apps.connections.open")) == 1
    await socket_bot.slack.wait_for_socket()
    assert socket_bot.slack.socket_connections == 1
    ready = await (await socket_bot.http.get("/readyz")).json()
    assert ready["slack"] == "socket" and ready["checks"]["slack_connected"] is True


async def test_a_wrong_app_token_leaves_the_web_server_up_and_not_ready(
    make_bot: BotFactory, slack: MockSlackAPI, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    bot = await asyncio.wait_for(
        make_bot(slack_app_token="xapp-1-wrong", prepare=lambda app: _socket_mode_on(app)),
        timeout=10,
    )
    http = bot.http
    deadline = time.monotonic() + 5
    while not slack.calls("apps.connections.open", include_rejected=True):
        assert time.monotonic() < deadline, "the bot never tried to open a Socket Mode connection"
        await asyncio.sleep(0.02)
    assert (await http.get("/healthz")).status == 200
    resp = await http.get("/readyz")
    body = await resp.json()
    assert resp.status == 503 and body["checks"]["slack_connected"] is False
    assert slack.socket_connections == 0
    await http.close()


async def test_mention_is_acked_over_the_socket_and_answered_once_in_its_thread(
    socket_bot: SocketBot,
) -> None:
    slack = socket_bot.slack
    event = app_mention_event(IN_DOMAIN)
    payload = event_payload(event, event_id="Ev0SOCKET00001")
    first = socket_envelope("events_api", payload)

    started = time.perf_counter()
    await slack.socket_send(first)
    ack = await slack.wait_for_socket_ack(first["envelope_id"])
    assert time.perf_counter() - started < 3, "Slack needs its ack within 3 seconds"
    assert ack == {"envelope_id": first["envelope_id"]}, "events are acked without a payload"

    answer = await socket_bot.answer()
    (status,) = slack.calls("assistant.threads.setStatus")
    assert status["channel_id"] == CHANNEL_ID and status["thread_ts"] == event["ts"]
    assert status["status"] == messages.STATUS_SEARCHING
    (posted,) = slack.calls("chat.postMessage")
    assert posted["channel"] == CHANNEL_ID and posted["thread_ts"] == event["ts"]
    assert answer["channel"] == CHANNEL_ID
    # The answer is the one message, in the mention's thread.
    assert slack.messages[(CHANNEL_ID, answer["ts"])]["thread_ts"] == event["ts"]
    found = links(answer)
    assert found and found[0][1] == 1
    assert all(url.startswith(PUBLIC_URL + "/d/") for url, _ in found)

    # Slack redelivers: a new envelope, retry_attempt 1, the same event_id.
    retry = socket_envelope("events_api", payload, retry_attempt=1, retry_reason="timeout")
    await slack.socket_send(retry)
    assert await slack.wait_for_socket_ack(retry["envelope_id"]) == {
        "envelope_id": retry["envelope_id"]
    }
    # A later, different mention is answered after anything the duplicate could have
    # started: once its answer is in, a second answer to the first one would show.
    later = app_mention_event(IN_DOMAIN)
    await slack.socket_send(socket_envelope("events_api", event_payload(later)))
    await socket_bot.answer(2)
    threads = [p["thread_ts"] for p in slack.calls("chat.postMessage")]
    assert threads == [event["ts"], later["ts"]]
    assert len(socket_bot.llm.requests) == 2

    assert socket_bot.dispatched == ["socket_mode"] * 3, "nothing came through /slack/events"


async def test_reindex_from_a_non_admin_is_refused_in_the_ack(socket_bot: SocketBot) -> None:
    slack = socket_bot.slack
    before = {d.id: d.indexed_at for d in socket_bot.kb.store.documents()}
    command = slash_command_payload(
        "/kb-reindex", "", USER_ID, CHANNEL_ID, slack.response_url("r1")
    )
    envelope = socket_envelope("slash_commands", command)

    await slack.socket_send(envelope)
    ack = await slack.wait_for_socket_ack(envelope["envelope_id"])

    # Over Socket Mode the ephemeral reply travels in the acknowledgement's payload.
    assert ack == {
        "envelope_id": envelope["envelope_id"],
        "payload": {"text": messages.REINDEX_NOT_ADMIN},
    }
    assert not socket_bot.services.reindexer.running
    assert slack.responses() == []
    assert {d.id: d.indexed_at for d in socket_bot.kb.store.documents()} == before
    assert socket_bot.dispatched == ["socket_mode"]


async def test_shutdown_closes_the_connection_without_reconnecting(socket_bot: SocketBot) -> None:
    slack = socket_bot.slack
    await slack.wait_for_socket()
    await socket_bot.http.close()
    await _wait_until_disconnected(slack)
    assert slack.socket_connections == 1
    assert len(slack.calls("apps.connections.open")) == 1
