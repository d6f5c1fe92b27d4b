"""Agent sessions always end, and nothing needs what Slack removes in February 2027.

Through the real bolt app (signed HTTP events) against the mock Slack Web API.
Slack leaves an agent session ``processing`` (its Stop button shown) until the
app says otherwise, so every turn of an agent app must end with its session
``active``, whatever happened to it: each path below asks and checks the
statuses the mock recorded for that session. The ``agents.sessions.*``
methods come before the ``assistant.threads.*`` ones they replace; those are
asked only where Slack refuses sessions, and a method Slack has removed
(``unknown_method``) is asked once, not on every turn.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import messages
from bot.slack.blocks import FEEDBACK_ACTION_ID
from bot.slack.reply import UNSUPPORTED_SECONDS, Streaming

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import (  # noqa: E402
    IN_DOMAIN,
    OUT_OF_DOMAIN,
    Bot,
    BotFactory,
    everything_posted,
)
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DM_CHANNEL_ID,
    MockSlackAPI,
    agent_session_stopped_event,
    app_mention_event,
    message_im_event,
)
from tests.test_slack_agent import home_opened_event  # noqa: E402
from tests.test_slack_stop import LONG_ANSWER, as_agent, wait_until  # noqa: E402
from tests.test_slack_streaming import _error, bot_messages_in, streamed_text  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PLACES: dict[str, tuple[Callable[..., dict[str, Any]], str]] = {
    "DM": (message_im_event, DM_CHANNEL_ID),
    "channel": (app_mention_event, CHANNEL_ID),
}
# The model's reply when it writes nonsense: no passage cited, markup it must not pass on.
GARBAGE = "]]{{ <!channel> [42] [0] \u202e lorem <http://evil.example|x> [[["
# What Slack answers for a method it no longer has.
REMOVED = "unknown_method"


async def ask(bot: Bot, where: str, text: str = IN_DOMAIN) -> tuple[str, str]:
    """Ask ``text`` in a DM or a channel; the channel and thread of its session."""
    make, channel = PLACES[where]
    event = make(text)
    await bot.event(event)
    return channel, str(event["ts"])


def assert_ended(bot: Bot, channel: str, thread: str) -> list[str]:
    """The session was set processing first, and active last; Slack keeps it active."""
    statuses = bot.slack.session_statuses(channel, thread)
    assert statuses[:1] == ["processing"] and statuses[-1:] == ["active"], statuses
    assert bot.slack.sessions[(channel, thread)]["status"] == "active"
    return statuses


def last_set_status(bot: Bot, channel: str, thread: str) -> str:
    """The status of the last ``agents.sessions.setStatus`` call naming that session."""
    calls = [
        c
        for c in bot.slack.calls("agents.sessions.setStatus")
        if (c["channel_id"], c["thread_ts"]) == (channel, thread)
    ]
    return str(calls[-1]["status"])


def rejected(bot: Bot, prefix: str) -> list[str]:
    """The errors of the calls refused, for the methods named ``prefix...``."""
    return [error for method, _, error in bot.slack.rejected if method.startswith(prefix)]


# ---------------------------------------------------------------- every path ends active


@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize("path", ["answered", "refused", "model down", "model garbage"])
async def test_every_answer_ends_its_session(bot: Bot, where: str, path: str) -> None:
    as_agent(bot)
    question = OUT_OF_DOMAIN if path == "refused" else IN_DOMAIN
    if path == "model down":
        bot.llm.fail_with(500)
    if path == "model garbage":
        bot.llm.set_reply(lambda _: GARBAGE)
    channel, thread = await ask(bot, where, question)
    answer = await bot.answer()
    await bot.idle()
    assert_ended(bot, channel, thread)
    assert answer["channel"] == channel
    if path == "refused":
        assert answer["text"] == messages.REFUSAL
        assert bot.llm.requests == []
    if path == "model garbage":
        assert "<!channel>" not in everything_posted(bot.slack)


@pytest.mark.parametrize("where", PLACES)
async def test_related_passages_end_the_session(make_bot: BotFactory, where: str) -> None:
    # Nothing passes the answer threshold, everything the related one: no model call.
    bot = await make_bot(threshold=0.01, related_threshold=1.99)
    as_agent(bot)
    channel, thread = await ask(bot, where)
    answer = await bot.answer()
    await bot.idle()
    assert messages.RELATED_HEADER in json.dumps(answer["blocks"], ensure_ascii=False)
    assert bot.llm.requests == []
    assert_ended(bot, channel, thread)


async def test_a_stop_in_a_channel_ends_its_session(bot: Bot) -> None:
    as_agent(bot)
    bot.llm.hold_after(3)
    channel, thread = await ask(bot, "channel")
    await wait_until(lambda: streamed_text(bot).strip(), "the first words streamed")
    stopped = bot.slack.press_stop(channel, thread)
    await bot.event(agent_session_stopped_event(channel, thread, streaming_message_ts=stopped))
    await bot.llm.wait_for_disconnect()
    await bot.idle()
    assert_ended(bot, channel, thread)
    # Slack had stopped the stream at the click: the session is ended by its own call.
    assert last_set_status(bot, channel, thread) == "active"
    (message,) = bot_messages_in(bot, channel, thread)
    assert messages.STOPPED in json.dumps(message, ensure_ascii=False)


async def test_a_stop_for_an_answer_no_process_runs_ends_its_session(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    # Slack shows Stop for a session left processing (its answer ended with a restart).
    as_agent(bot)
    thread = "1782234671.392669"
    bot.slack.sessions[(DM_CHANNEL_ID, thread)] = {"title": IN_DOMAIN, "status": "processing"}
    with caplog.at_level(logging.INFO, logger="bot.slack.sessions"):
        await bot.event(agent_session_stopped_event(DM_CHANNEL_ID, thread))
        await bot.idle()
    assert any("no question this process is answering" in r.getMessage() for r in caplog.records)
    assert bot.slack.session_statuses(DM_CHANNEL_ID, thread) == ["active"]
    assert bot.slack.sessions[(DM_CHANNEL_ID, thread)]["status"] == "active"
    assert bot.slack.calls("chat.postMessage") == []


async def test_someone_elses_stop_leaves_the_session_to_its_answer(bot: Bot) -> None:
    as_agent(bot)
    bot.llm.trickle(0.02)
    channel, thread = await ask(bot, "channel")
    await wait_until(lambda: streamed_text(bot).strip(), "the first words streamed")
    await bot.event(agent_session_stopped_event(channel, thread, user="U0OTHER001"))
    answer = await bot.answer()
    await bot.idle()
    assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    assert bot.slack.session_statuses(channel, thread) == ["processing", "active"]


@pytest.mark.parametrize("failing", ["chat.startStream", "chat.appendStream"])
async def test_a_stream_slack_refuses_still_ends_the_session(bot: Bot, failing: str) -> None:
    as_agent(bot)
    bot.llm.trickle(0.01)
    bot.slack.fail(failing, "internal_error", times=1)
    channel, thread = await ask(bot, "channel")
    answer = await bot.answer()
    await bot.idle()
    assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    assert rejected(bot, failing) == ["internal_error"]
    assert_ended(bot, channel, thread)


async def test_a_stream_slack_will_not_stop_still_ends_the_session(bot: Bot) -> None:
    as_agent(bot)
    bot.services.streaming.cleanup_seconds = 0.0  # the stream left behind, deleted at once
    bot.slack.fail("chat.stopStream", "internal_error")
    channel, thread = await ask(bot, "DM")
    answer = await bot.answer()
    await bot.idle()
    assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    assert rejected(bot, "chat.stopStream")
    assert_ended(bot, channel, thread)
    assert last_set_status(bot, channel, thread) == "active"


@pytest.mark.parametrize("streaming", ["auto", "off"])
async def test_edits_slack_refuses_still_end_the_session(
    make_bot: BotFactory, streaming: str
) -> None:
    bot = await make_bot(slack_streaming=streaming)
    as_agent(bot)
    bot.services.conversation.stream_update_seconds = 0.0
    bot.llm.trickle(0.01)
    bot.slack.fail("chat.update", "internal_error")
    channel, thread = await ask(bot, "DM")
    answer = await bot.answer()  # posted anew
    await bot.idle()
    assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    assert rejected(bot, "chat.update")
    assert_ended(bot, channel, thread)


async def test_a_turn_that_fails_after_its_stream_started_ends_the_session(bot: Bot) -> None:
    # The answer can be neither stopped, edited nor posted: the turn ends in an exception.
    as_agent(bot)
    for method in ("chat.stopStream", "chat.postMessage"):
        bot.slack.fail(method, "internal_error")
    channel, thread = await ask(bot, "channel")
    await bot.idle()
    assert bot.slack.calls("chat.startStream"), "the steps' stream had started"
    assert bot.answers_shown() == 0
    assert_ended(bot, channel, thread)
    assert last_set_status(bot, channel, thread) == "active"


async def test_a_session_slack_answers_too_late_is_ended_all_the_same(bot: Bot) -> None:
    as_agent(bot)
    bot.services.streaming.status_timeout = 0.3
    # Slack sets it processing, but answers after the bot stopped waiting.
    bot.slack.answer_late("agents.sessions.setStatus", 1.0)
    channel, thread = await ask(bot, "DM")
    answer = await bot.answer()
    await bot.idle()
    assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    assert_ended(bot, channel, thread)
    # Unsure whether there was a session, the thread's status showed the work too.
    assert len(bot.slack.calls("assistant.threads.setStatus")) == 1


async def test_a_warning_that_stop_is_not_subscribed_is_logged(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    as_agent(bot)
    bot.slack.stop_subscribed = False
    with caplog.at_level(logging.WARNING, logger="bot.slack.reply"):
        channel, thread = await ask(bot, "DM")
        await bot.answer()
        await bot.idle()
    assert any("agent_session_stopped" in r.getMessage() for r in caplog.records)
    assert_ended(bot, channel, thread)


# ---------------------------------------------------------------- successors first


@pytest.mark.parametrize("where", PLACES)
@pytest.mark.parametrize(
    "refusal", ["not_allowed", "unknown_method", "not_allowed_token_type", "missing_scope"]
)
async def test_sessions_refused_fall_back_to_the_thread_status_asked_once(
    bot: Bot, where: str, refusal: str
) -> None:
    bot.llm.set_reply(lambda _: LONG_ANSWER)
    if refusal == "not_allowed":
        bot.slack.agent_app = False  # not declared an agent: the mock's own refusal
    else:
        bot.slack.agent_app = True
        bot.slack.fail("agents.sessions.setStatus", refusal)
    for n in (1, 2):
        await ask(bot, where)
        answer = await bot.answer(n)
        await bot.idle()
        assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    assert rejected(bot, "agents.sessions") == [refusal]
    statuses = bot.slack.calls("assistant.threads.setStatus")
    assert [s["status"] for s in statuses] == [messages.STATUS_SEARCHING] * 2
    assert bot.slack.sessions == {}
    assert messages.PLACEHOLDER not in [c["text"] for c in bot.slack.calls("chat.postMessage")]


@pytest.mark.parametrize("where", PLACES)
async def test_after_february_2027_an_agent_app_asks_no_assistant_thread_method(
    bot: Bot, where: str
) -> None:
    as_agent(bot)
    for method in ("assistant.threads.setStatus", "assistant.threads.setTitle"):
        bot.slack.fail(method, REMOVED)
    channel, thread = await ask(bot, where)
    answer = await bot.answer()
    await bot.idle()
    assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    assert bot.slack.calls("assistant.threads.setStatus", include_rejected=True) == []
    assert bot.slack.calls("assistant.threads.setTitle", include_rejected=True) == []
    assert messages.PLACEHOLDER not in [c["text"] for c in bot.slack.calls("chat.postMessage")]
    assert_ended(bot, channel, thread)


@pytest.mark.parametrize("where", PLACES)
async def test_after_february_2027_an_app_without_sessions_shows_a_placeholder(
    bot: Bot, where: str
) -> None:
    # Neither sessions (not an agent app) nor the thread's status (removed): each asked once.
    bot.slack.fail("assistant.threads.setStatus", REMOVED)
    for n in (1, 2):
        await ask(bot, where)
        answer = await bot.answer(n)
        await bot.idle()
        assert "Here is what the documents say" in answer["text"]
    assert rejected(bot, "agents.sessions") == ["not_allowed"]
    assert rejected(bot, "assistant.threads") == [REMOVED]
    posted = [c["text"] for c in bot.slack.calls("chat.postMessage")]
    assert posted.count(messages.PLACEHOLDER) == 2
    assert messages.ERROR_GENERIC not in everything_posted(bot.slack)


async def test_suggested_prompts_slack_removed_leave_the_greeting_and_are_asked_once(
    bot: Bot,
) -> None:
    bot.slack.fail("assistant.threads.setSuggestedPrompts", REMOVED)
    for _ in range(2):
        await bot.event(home_opened_event())
        await bot.idle()
    (greeting,) = bot.slack.calls("chat.postMessage")  # a first visit only
    assert greeting["text"] == messages.AGENT_GREETING
    assert rejected(bot, "assistant.threads.setSuggestedPrompts") == [REMOVED]
    assert messages.ERROR_GENERIC not in everything_posted(bot.slack)


def test_a_session_refused_for_one_thread_is_tried_again_any_other_refusal_is_not() -> None:
    now = [0.0]
    sessions = Streaming(clock=lambda: now[0]).sessions
    # About that conversation only (the bot left it, it was archived): the next one tries.
    for error in ("channel_not_found", "not_in_channel", "is_archived", "invalid_thread_ts"):
        sessions.refused(CHANNEL_ID, _error(error), for_good=True)
        assert sessions.available(CHANNEL_ID)
    # Any other refusal, even one Slack has not documented, means no sessions for an hour.
    sessions.refused(CHANNEL_ID, _error("not_an_agent_app"), for_good=True)
    assert not sessions.available(CHANNEL_ID) and sessions.available(DM_CHANNEL_ID)
    now[0] = UNSUPPORTED_SECONDS
    assert sessions.available(CHANNEL_ID)


# Each assistant.threads method the bot may call, and the agents.sessions method that
# replaces it; None: Slack has none (checked against the SDK below).
SUCCESSORS = {
    "setStatus": "agents_sessions_setStatus",
    "setTitle": "agents_sessions_rename",
    "setSuggestedPrompts": None,
}


def test_every_assistant_thread_call_has_its_successor_where_slack_has_one() -> None:
    calls = 0
    for path in sorted((ROOT / "bot").rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        for method in re.findall(r"\.assistant_threads_(\w+)\(", source):
            calls += 1
            assert method in SUCCESSORS, f"{path}: assistant.threads.{method} is not known here"
            successor = SUCCESSORS[method]
            if successor is not None:
                assert f".{successor}(" in source, f"{path}: {method} without {successor}"
    assert calls == 2  # the thread's status (reply.py), the suggested prompts (agent.py)
    # No agents.* method for suggested prompts in the SDK yet: when one comes, use it.
    agents = [name for name in dir(AsyncWebClient) if name.startswith("agents_")]
    assert "agents_sessions_setStatus" in agents and "agents_sessions_rename" in agents
    assert not [name for name in agents if "prompt" in name.lower()]


# ---------------------------------------------------------------- the mock, as Slack documents it


async def test_the_mock_takes_agent_sessions_as_slack_documents_them(slack: MockSlackAPI) -> None:
    client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
    where = {"channel_id": DM_CHANNEL_ID, "thread_ts": "1782234671.392669"}
    with pytest.raises(SlackApiError) as refused:
        await client.agents_sessions_setStatus(status="processing", **where)
    assert refused.value.response["error"] == "not_allowed"  # not declared an agent
    slack.agent_app = True
    for status in ("done", "Processing", "is thinking...", ""):
        with pytest.raises(SlackApiError) as bad:
            await client.agents_sessions_setStatus(status=status, **where)
        assert bad.value.response["error"] == "invalid_arguments"
    with pytest.raises(SlackApiError) as long_title:
        await client.agents_sessions_setStatus(status="processing", title="t" * 201, **where)
    assert long_title.value.response["error"] == "invalid_arguments"
    opened = await client.agents_sessions_setStatus(status="processing", title="t" * 200, **where)
    assert opened["title"] == "t" * 200
    # The title only names a session Slack creates; rename changes it (1 to 200 characters).
    again = await client.agents_sessions_setStatus(status="processing", title="other", **where)
    assert again["title"] == "t" * 200
    for title in ("", "r" * 201):
        with pytest.raises(SlackApiError) as bad_title:
            await client.agents_sessions_rename(title=title, **where)
        assert bad_title.value.response["error"] == "invalid_arguments"
    for status in ("active", "suspended", "closed", "processing"):
        done = await client.agents_sessions_setStatus(status=status, **where)
        assert done["status"] == status
    assert slack.session_statuses(DM_CHANNEL_ID, where["thread_ts"]) == [
        "processing",
        "processing",
        "active",
        "suspended",
        "closed",
        "processing",
    ]
    slack.stop_subscribed = False
    warned = await client.agents_sessions_setStatus(status="active", **where)
    assert warned["warning"] == "missing_agent_session_stopped_event_subscription"


async def test_the_mock_takes_the_thread_status_as_slack_documents_it(
    slack: MockSlackAPI,
) -> None:
    client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
    where = {"channel_id": CHANNEL_ID, "thread_ts": "1782234671.392669"}
    await client.api_call("assistant.threads.setStatus", json={**where, "status": ""})  # clears
    for bad in ({**where}, {**where, "status": "x", "loading_messages": ["…"] * 11}):
        with pytest.raises(SlackApiError) as refused:
            await client.api_call("assistant.threads.setStatus", json=bad)
        assert refused.value.response["error"] == "invalid_arguments"
    await client.assistant_threads_setStatus(
        status="is searching…", loading_messages=["…"] * 10, **where
    )
