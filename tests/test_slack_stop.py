"""Agent sessions and their Stop button, through the real bolt app (signed HTTP events).

A question asked of an agent app (in its Messages tab or a channel) runs as an
agent session; a Stop (``agent_session_stopped``) cancels the turn at once, closing
the model's streamed request. The local model server writes a few words and
then holds its answer until the client goes away, so the tests see when the
connection closes; the mock Slack plays the click (it stops the app's streams
in the thread) and keeps each session's status.
"""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from bot.app import create_app
from bot.settings import Settings
from bot.slack import messages
from bot.slack.blocks import FEEDBACK_ACTION_ID
from bot.slack.reply import SESSION_TITLE_CHARS
from bot.slack.sessions import Stop, StopRequest, Turns, stop_request
from core.answer import Outcome
from core.gaps import knowledge_gaps
from index.knowledge_base import KnowledgeBase

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import IN_DOMAIN, Bot, BotFactory  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DM_CHANNEL_ID,
    USER_ID,
    MockSlackAPI,
    OpenAICompatServer,
    agent_session_stopped_event,
    app_mention_event,
    closed_port_url,
    message_im_event,
)
from tests.test_slack_streaming import streamed_text  # noqa: E402

# The stop must close the model's request within half a second of Slack's event.
STOP_SECONDS = 0.5
LONG_ANSWER = " ".join(["Claims are due within thirty days of the purchase."] * 6) + " [1]."
OTHER_USER = "U0OTHER001"


def as_agent(bot: Bot) -> None:
    """The app is declared an agent (Slack then takes its sessions); streams keep up at once."""
    bot.slack.agent_app = True
    bot.llm.set_reply(lambda _: LONG_ANSWER)
    bot.services.streaming.append_seconds = 0.0
    bot.services.streaming.first_text_seconds = 0.0


async def wait_until(condition: Any, what: str, timeout: float = 15.0) -> None:
    """Poll ``condition`` until it holds (a ceiling, not a sleep standing in for an event)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.005)


async def ask_and_hold(bot: Bot, pieces: int = 3) -> dict[str, Any]:
    """Ask in the DM; the model writes ``pieces`` pieces and holds. Returns the question's event."""
    as_agent(bot)
    bot.llm.hold_after(pieces)
    event = message_im_event(IN_DOMAIN)
    await bot.event(event)
    if pieces:
        await wait_until(lambda: streamed_text(bot).strip(), "the first words streamed")
    else:
        await bot.llm.wait_for_requests()
    return event


def logged(bot: Bot) -> list[Any]:
    """Every question of the query log, oldest first, as recorded."""
    rows = bot.kb.queries.by_outcome([o.value for o in Outcome], since=0.0, limit=50)
    return [bot.kb.queries.get(r.id) for r in reversed(rows)]


def thread_messages(bot: Bot, thread: str) -> list[dict[str, Any]]:
    return [
        m
        for (c, _), m in bot.slack.messages.items()
        if c == DM_CHANNEL_ID and m.get("thread_ts") == thread
    ]


# ---------------------------------------------------------------- Stop


async def test_stop_cancels_the_model_at_once_and_leaves_what_was_shown(bot: Bot) -> None:
    event = await ask_and_hold(bot)
    thread = str(event["ts"])
    assert bot.slack.sessions[(DM_CHANNEL_ID, thread)]["status"] == "processing"
    shown = streamed_text(bot)
    calls_before = len(bot.slack.log)

    stopped = bot.slack.press_stop(DM_CHANNEL_ID, thread)
    assert stopped, "the answer was streaming when Stop was clicked"
    clicked = time.perf_counter()
    await bot.event(
        agent_session_stopped_event(DM_CHANNEL_ID, thread, streaming_message_ts=stopped)
    )
    closed = await bot.llm.wait_for_disconnect()
    assert closed - clicked < STOP_SECONDS, (
        f"the model's request closed {closed - clicked:.3f} s later"
    )
    await bot.idle()

    # What was shown stays, marked stopped; nothing else is posted in the thread.
    (message,) = thread_messages(bot, thread)
    assert message["ts"] == stopped[0]
    blocks = json.dumps(message["blocks"], ensure_ascii=False)
    assert messages.STOPPED in blocks and shown.split()[0] in blocks
    assert FEEDBACK_ACTION_ID not in blocks and messages.SOURCES_HEADER not in blocks
    after = [m for m, _ in bot.slack.log[calls_before:]]
    assert "chat.postMessage" not in after
    assert after.count("chat.update") == 1
    assert len(bot.llm.requests) == 1
    # The session is no longer processing (Slack leaves that to the app).
    assert bot.slack.sessions[(DM_CHANNEL_ID, thread)]["status"] == "active"
    (record,) = logged(bot)
    assert record.outcome == Outcome.STOPPED.value == "stopped"
    assert record.model_called and record.kept
    assert record.answer and shown.split()[0] in record.answer
    assert record.thread_id == thread and record.user == USER_ID
    # Stopping is the asker's choice, not something the knowledge base lacks.
    assert knowledge_gaps(bot.kb, since=0.0) == []


async def test_stop_before_the_first_word_says_stopped(bot: Bot) -> None:
    event = await ask_and_hold(bot, pieces=0)
    thread = str(event["ts"])
    clicked = time.perf_counter()
    stopped = bot.slack.press_stop(DM_CHANNEL_ID, thread)
    await bot.event(
        agent_session_stopped_event(DM_CHANNEL_ID, thread, streaming_message_ts=stopped)
    )
    closed = await bot.llm.wait_for_disconnect()
    assert closed - clicked < STOP_SECONDS
    await bot.idle()
    (message,) = thread_messages(bot, thread)
    assert message["text"] == messages.STOPPED
    (record,) = logged(bot)
    assert record.outcome == "stopped" and record.answer == ""


async def test_stop_without_streaming_marks_the_edited_answer(make_bot: BotFactory) -> None:
    bot = await make_bot(slack_streaming="off")  # a session needs no stream: Stop still works
    as_agent(bot)
    bot.services.conversation.stream_update_seconds = 0.0
    bot.llm.hold_after(3)
    event = message_im_event(IN_DOMAIN)
    thread = str(event["ts"])
    await bot.event(event)
    (posted,) = await bot.slack.wait_for("chat.postMessage")
    assert posted["text"].startswith("Claims")
    await bot.event(agent_session_stopped_event(DM_CHANNEL_ID, thread))
    await bot.llm.wait_for_disconnect()
    await bot.idle()
    (message,) = thread_messages(bot, thread)
    blocks = json.dumps(message["blocks"], ensure_ascii=False)
    assert messages.STOPPED in blocks and "Claims" in blocks and messages.WRITING not in blocks
    assert not bot.slack.calls("chat.startStream")
    assert bot.slack.sessions[(DM_CHANNEL_ID, thread)]["status"] == "active"
    assert [r.outcome for r in logged(bot)] == ["stopped"]


async def test_a_stop_after_the_answer_changes_nothing(bot: Bot) -> None:
    as_agent(bot)
    event = message_im_event(IN_DOMAIN)
    thread = str(event["ts"])
    await bot.event(event)
    answer = await bot.answer()
    await bot.idle()
    before = (list(bot.slack.log), copy.deepcopy(bot.slack.messages))

    await bot.event(agent_session_stopped_event(DM_CHANNEL_ID, thread))
    await bot.idle()
    assert (list(bot.slack.log), copy.deepcopy(bot.slack.messages)) == before
    assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    assert [r.outcome for r in logged(bot)] == ["answered"]
    assert bot.slack.sessions[(DM_CHANNEL_ID, thread)]["status"] == "active"


async def test_a_repeated_stop_is_harmless(bot: Bot) -> None:
    event = await ask_and_hold(bot)
    thread = str(event["ts"])
    stopped = bot.slack.press_stop(DM_CHANNEL_ID, thread)
    stop = agent_session_stopped_event(DM_CHANNEL_ID, thread, streaming_message_ts=stopped)
    await bot.event(stop, event_id="EvStop0001")
    await bot.event(stop, event_id="EvStop0001", retry_num=1)  # Slack's redelivery: dropped
    await bot.event({**stop, "event_ts": str(float(stop["event_ts"]) + 0.5)})  # a second click
    await bot.llm.wait_for_disconnect()
    await bot.idle()
    (message,) = thread_messages(bot, thread)
    assert messages.STOPPED in json.dumps(message["blocks"], ensure_ascii=False)
    assert len(bot.slack.calls("chat.update")) == 1
    assert [r.outcome for r in logged(bot)] == ["stopped"]
    assert messages.ERROR_GENERIC not in json.dumps(bot.slack.log, ensure_ascii=False)


async def test_someone_elses_stop_is_ignored_and_logged(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    as_agent(bot)
    bot.llm.trickle(0.02)
    event = message_im_event(IN_DOMAIN)
    thread = str(event["ts"])
    await bot.event(event)
    await wait_until(lambda: streamed_text(bot).strip(), "the first words streamed")
    with caplog.at_level(logging.WARNING, logger="bot.slack.sessions"):
        await bot.event(agent_session_stopped_event(DM_CHANNEL_ID, thread, user=OTHER_USER))
        answer = await bot.answer()
        await bot.idle()
    assert any(OTHER_USER in r.getMessage() for r in caplog.records)
    assert bot.llm.disconnects == []
    assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    assert [r.outcome for r in logged(bot)] == ["answered"]


@pytest.mark.parametrize(
    "malformed",
    [
        {"type": "agent_session_stopped"},
        {"type": "agent_session_stopped", "channel": DM_CHANNEL_ID, "user": USER_ID},
        {
            "type": "agent_session_stopped",
            "channel": DM_CHANNEL_ID,
            "thread_ts": 17,
            "user": USER_ID,
        },
        {
            "type": "agent_session_stopped",
            "channel": [DM_CHANNEL_ID],
            "thread_ts": "1.2",
            "user": USER_ID,
        },
        {
            "type": "agent_session_stopped",
            "channel": DM_CHANNEL_ID,
            "thread_ts": "1" * 500,
            "user": USER_ID,
        },
    ],
)
async def test_a_malformed_stop_is_answered_and_ignored(
    bot: Bot, malformed: dict[str, Any]
) -> None:
    as_agent(bot)
    bot.llm.trickle(0.01)
    event = message_im_event(IN_DOMAIN)
    await bot.event(event)
    resp = await bot.event(malformed)
    assert resp.status == 200
    answer = await bot.answer()
    await bot.idle()
    assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    assert messages.ERROR_GENERIC not in json.dumps(bot.slack.log, ensure_ascii=False)
    assert [r.outcome for r in logged(bot)] == ["answered"]


# ---------------------------------------------------------------- the session itself


async def test_the_session_is_titled_with_the_question_within_slacks_limit(bot: Bot) -> None:
    as_agent(bot)
    question = "How long do I have to submit an expense claim " + "really " * 60 + "?"
    event = message_im_event(question)
    await bot.event(event)
    await bot.answer()
    await bot.idle()
    opened = bot.slack.calls("agents.sessions.setStatus")[0]
    assert opened["status"] == "processing" and opened["thread_ts"] == str(event["ts"])
    assert opened["initiator_user_id"] == USER_ID
    # Over Slack's 200 characters: cut to exactly that, ending in "…".
    assert len(opened["title"]) == SESSION_TITLE_CHARS == 200
    assert opened["title"].endswith("…")
    assert question.startswith(opened["title"].rstrip("…").rstrip())
    assert bot.slack.calls("agents.sessions.rename") == []
    # The session opened before anything was shown; its predecessor, the thread's
    # status, is not asked (Slack removes it in February 2027).
    methods = bot.slack.methods()
    assert methods.index("agents.sessions.setStatus") < methods.index("chat.startStream")
    assert bot.slack.calls("assistant.threads.setStatus", include_rejected=True) == []


async def test_a_session_slack_already_had_is_retitled_for_a_new_question(bot: Bot) -> None:
    as_agent(bot)
    event = message_im_event(IN_DOMAIN)
    thread = str(event["ts"])
    bot.slack.sessions[(DM_CHANNEL_ID, thread)] = {"title": "Untitled", "status": "active"}
    await bot.event(event)
    await bot.answer()
    await bot.idle()
    (renamed,) = bot.slack.calls("agents.sessions.rename")
    assert renamed["title"] == IN_DOMAIN and renamed["thread_ts"] == thread
    assert bot.slack.sessions[(DM_CHANNEL_ID, thread)]["title"] == IN_DOMAIN


async def test_without_agent_sessions_the_answer_goes_on_as_before(bot: Bot) -> None:
    # Not declared an agent: Slack refuses sessions; that is asked once, then remembered.
    bot.llm.set_reply(lambda _: LONG_ANSWER)
    for n in (1, 2):
        event = message_im_event(IN_DOMAIN)
        await bot.event(event)
        answer = await bot.answer(n)
        await bot.idle()
        assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    refused = [e for m, _, e in bot.slack.rejected if m.startswith("agents.sessions")]
    assert refused == ["not_allowed"]
    assert bot.slack.calls("assistant.threads.setStatus")
    assert not any(p.get("chunks") for p in bot.slack.calls("chat.startStream"))


async def test_a_channel_question_is_a_session_too(bot: Bot) -> None:
    as_agent(bot)
    event = app_mention_event(IN_DOMAIN)
    thread = str(event["ts"])
    await bot.event(event)
    await bot.answer()
    await bot.idle()
    opened = bot.slack.calls("agents.sessions.setStatus")[0]
    assert (opened["channel_id"], opened["thread_ts"]) == (CHANNEL_ID, thread)
    assert opened["status"] == "processing" and opened["initiator_user_id"] == USER_ID
    assert opened["title"] == IN_DOMAIN
    assert bot.slack.sessions[(CHANNEL_ID, thread)]["status"] == "active"
    assert bot.slack.calls("assistant.threads.setStatus", include_rejected=True) == []


# ---------------------------------------------------------------- the registry


def test_a_stop_request_needs_a_thread_and_a_person() -> None:
    good = {"channel": "D1", "thread_ts": "1.2", "user": "U1", "streaming_message_ts": []}
    assert stop_request(good) == StopRequest("D1", "1.2", "U1")
    for bad in ({}, {**good, "user": ""}, {**good, "thread_ts": 1.2}, "D1", None):
        assert stop_request(bad) is None


async def test_the_registry_tells_a_late_stop_from_an_unknown_thread() -> None:
    now = [0.0]
    turns = Turns(clock=lambda: now[0], finished_ttl=60.0)

    async def work() -> str:
        return "done"

    assert await turns.run("D1", "1.2", "U1", work()) == "done"
    assert turns.running("D1", "1.2") == 0
    assert turns.stop(StopRequest("D1", "1.2", "U1")) is Stop.FINISHED
    assert turns.stop(StopRequest("D1", "9.9", "U1")) is Stop.NOT_RUNNING
    now[0] = 61.0
    assert turns.stop(StopRequest("D1", "1.2", "U1")) is Stop.NOT_RUNNING


async def test_a_stop_once_the_answer_is_complete_lets_it_finish() -> None:
    turns = Turns()
    release = asyncio.Event()

    async def work() -> str:
        await release.wait()
        return "shown"

    running = asyncio.ensure_future(turns.run("D1", "1.2", "U1", work(), stoppable=lambda: False))
    await asyncio.sleep(0)
    assert turns.stop(StopRequest("D1", "1.2", "U1")) is Stop.FINISHING
    release.set()
    assert await running == "shown"


async def test_a_stop_cancels_only_the_askers_turns() -> None:
    turns = Turns()
    never = asyncio.Event()
    mine = asyncio.ensure_future(turns.run("C1", "1.2", "U1", never.wait()))
    theirs = asyncio.ensure_future(turns.run("C1", "1.2", "U2", never.wait()))
    await asyncio.sleep(0)
    assert turns.stop(StopRequest("C1", "1.2", "U1")) is Stop.STOPPED
    assert await mine is None  # stopped by its asker: no exception for the listener
    assert turns.stop(StopRequest("C1", "1.2", "U1")) is Stop.NOT_THE_ASKER
    assert not theirs.done() and turns.running("C1", "1.2") == 1
    theirs.cancel()


@pytest.mark.parametrize("streaming", ["off", "auto"])
async def test_a_failed_answer_leaves_no_session_processing(
    tmp_path: Path,
    aiohttp_client: Callable[..., Awaitable[TestClient]],
    settings_for: Callable[..., Settings],
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
    streaming: str,
) -> None:
    # The embeddings endpoint goes away after indexing: the question fails in the engine
    # (with streaming, once the search step's stream has started).
    settings = settings_for(
        data_dir=tmp_path / "kb",
        embedding_model="openai:test-embed",
        embedding_base_url=closed_port_url(),
        embedding_max_retries=0,
        slack_streaming=streaming,
    )
    up = settings.index_config()
    up = replace(up, embedding_endpoint=replace(up.embedding_endpoint, base_url=llm.url))
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "bikes.md").write_text("# Bicycles\n\nBicycle storage is in the basement.\n")
    indexed = await asyncio.to_thread(KnowledgeBase, up)
    await asyncio.to_thread(indexed.ingest_paths, [docs])
    indexed.store.db.conn.close()
    app = create_app(settings, kb=await asyncio.to_thread(KnowledgeBase, settings.index_config()))
    bot = Bot(await aiohttp_client(app), app, slack, llm, settings, frozenset(asyncio.all_tasks()))
    slack.agent_app = True
    event = message_im_event("Where can I leave my bicycle?")
    await bot.event(event)
    await bot.idle()
    told = [c["text"] for c in slack.calls("chat.postMessage") + slack.calls("chat.update")]
    assert messages.ERROR_SEARCH_UNAVAILABLE in told
    assert bool(slack.calls("chat.startStream")) is (streaming == "auto")
    opened, ended = slack.calls("agents.sessions.setStatus")
    assert (opened["status"], ended["status"]) == ("processing", "active")
    assert slack.sessions[(DM_CHANNEL_ID, str(event["ts"]))]["status"] == "active"


# ---------------------------------------------------------------- races


async def test_a_late_click_for_an_earlier_answer_does_not_stop_the_next_question(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    as_agent(bot)
    first = message_im_event(IN_DOMAIN)
    thread = str(first["ts"])
    await bot.event(first)
    await bot.answer()
    await bot.idle()
    # A click on the first answer's Stop that Slack delivers only once a follow-up
    # in the same thread is being answered: its event_ts is older than the follow-up.
    late = agent_session_stopped_event(DM_CHANNEL_ID, thread)
    bot.llm.hold_after(3)
    await bot.event(message_im_event(IN_DOMAIN, thread_ts=thread))
    await bot.llm.wait_for_requests(2)
    with caplog.at_level(logging.INFO, logger="bot.slack.sessions"):
        await bot.event(late)
        await wait_until(
            lambda: any("before its question" in r.getMessage() for r in caplog.records),
            "the late click to be handled",
        )
    assert bot.llm.disconnects == []
    assert bot.services.turns.running(DM_CHANNEL_ID, thread) == 1
    # A click made now stops the follow-up.
    await bot.event(agent_session_stopped_event(DM_CHANNEL_ID, thread))
    await bot.llm.wait_for_disconnect()
    await bot.idle()
    assert [r.outcome for r in logged(bot)] == ["answered", "stopped"]


def test_a_stop_request_keeps_when_it_was_clicked() -> None:
    event = {"channel": "D1", "thread_ts": "1.2", "user": "U1", "event_ts": "1782234671.3926"}
    assert stop_request(event) == StopRequest("D1", "1.2", "U1", (1782234671, 392600000))
    for bad in ("soon", "1.2.3", "-1.0", 17.5, "1" * 40):
        assert stop_request({**event, "event_ts": bad}) == StopRequest("D1", "1.2", "U1")


async def test_the_registry_ignores_a_click_older_than_the_question() -> None:
    turns = Turns()
    never = asyncio.Event()
    running = asyncio.ensure_future(
        turns.run("D1", "1.2", "U1", never.wait(), asked="1782234700.000200")
    )
    await asyncio.sleep(0)
    older = StopRequest("D1", "1.2", "U1", (1782234700, 100000))
    assert turns.stop(older) is Stop.FINISHED and not running.done()
    newer = StopRequest("D1", "1.2", "U1", (1782234700, 300000))
    assert turns.stop(newer) is Stop.STOPPED
    assert await running is None
    assert turns.running("D1", "1.2") == 0


async def test_a_stop_while_the_thread_is_read_is_logged_and_never_calls_the_model(
    bot: Bot,
) -> None:
    as_agent(bot)
    first = message_im_event(IN_DOMAIN)
    thread = str(first["ts"])
    await bot.event(first)
    await bot.answer()
    await bot.idle()
    calls_before = len(bot.slack.log)
    bot.slack.stall("conversations.replies", 60.0)  # Slack slow to return the thread
    await bot.event(message_im_event(IN_DOMAIN, thread_ts=thread))
    await wait_until(
        lambda: bot.slack.methods()[calls_before:].count("agents.sessions.setStatus") == 1,
        "the follow-up's session to be processing",
    )
    await bot.event(agent_session_stopped_event(DM_CHANNEL_ID, thread))
    await bot.idle()
    assert len(bot.llm.requests) == 1  # the first question's only
    assert bot.slack.sessions[(DM_CHANNEL_ID, thread)]["status"] == "active"
    assert [r.outcome for r in logged(bot)] == ["answered", "stopped"]
    stopped = logged(bot)[-1]
    assert not stopped.model_called and stopped.answer == "" and stopped.thread_id == thread


def stalled_call_arrived(bot: Bot, method: str) -> bool:
    """Whether the call :meth:`MockSlackAPI.stall` holds has reached the mock (it records it later)."""
    return bot.slack._overrides[method][-1].remaining == 0


async def test_a_stop_while_the_writing_step_is_shown_logs_no_model_call(bot: Bot) -> None:
    as_agent(bot)
    bot.slack.stall("chat.appendStream", 60.0)  # the first append: what was found, and writing
    event = message_im_event(IN_DOMAIN)
    thread = str(event["ts"])
    await bot.event(event)
    await wait_until(lambda: stalled_call_arrived(bot, "chat.appendStream"), "the writing step")
    await bot.event(agent_session_stopped_event(DM_CHANNEL_ID, thread))
    await bot.idle()
    assert bot.llm.requests == []
    (record,) = logged(bot)
    assert record.outcome == "stopped" and record.kept and not record.model_called


async def test_a_stop_while_the_answer_is_being_shown_lets_it_finish(bot: Bot) -> None:
    as_agent(bot)
    bot.slack.stall("chat.stopStream", 1.0)  # the answer complete, its stream being stopped
    event = message_im_event(IN_DOMAIN)
    thread = str(event["ts"])
    await bot.event(event)
    await wait_until(lambda: stalled_call_arrived(bot, "chat.stopStream"), "the answer's end")
    await bot.event(agent_session_stopped_event(DM_CHANNEL_ID, thread))
    answer = await bot.answer()
    await bot.idle()
    assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    assert messages.STOPPED not in json.dumps(bot.slack.log, ensure_ascii=False)
    assert [r.outcome for r in logged(bot)] == ["answered"]
    assert bot.slack.sessions[(DM_CHANNEL_ID, thread)]["status"] == "active"


async def test_a_stop_while_the_stream_starts_ends_that_stream_and_posts_nothing_else(
    bot: Bot,
) -> None:
    as_agent(bot)
    bot.slack.stall("chat.startStream", 1.0)  # Slack slow to start the steps' stream
    event = message_im_event(IN_DOMAIN)
    thread = str(event["ts"])
    await bot.event(event)
    await wait_until(lambda: stalled_call_arrived(bot, "chat.startStream"), "the stream's start")
    await bot.event(agent_session_stopped_event(DM_CHANNEL_ID, thread))
    await bot.idle()
    # The stream Slack started after all is the one marked stopped; no second message.
    (message,) = thread_messages(bot, thread)
    assert message.get("streaming_state") == "completed"
    assert messages.STOPPED in json.dumps(message, ensure_ascii=False)
    assert bot.slack.calls("chat.postMessage") == []
    assert bot.llm.requests == []
    assert [r.outcome for r in logged(bot)] == ["stopped"]


async def test_a_stop_names_one_thread_of_one_channel() -> None:
    turns = Turns()
    never = asyncio.Event()
    here = asyncio.ensure_future(turns.run("D1", "1.2", "U1", never.wait()))
    there = asyncio.ensure_future(turns.run("D2", "1.2", "U1", never.wait()))
    other_thread = asyncio.ensure_future(turns.run("D1", "1.3", "U1", never.wait()))
    await asyncio.sleep(0)
    assert turns.stop(StopRequest("D2", "1.2", "U1")) is Stop.STOPPED
    assert await there is None
    assert not here.done() and not other_thread.done()
    assert (turns.running("D1", "1.2"), turns.running("D1", "1.3")) == (1, 1)
    here.cancel()
    other_thread.cancel()
    for task in (here, other_thread):
        with pytest.raises(asyncio.CancelledError):
            await task
    # A cancellation that is not a stop (a shutdown) goes on, and nothing stays registered.
    assert (turns.running("D1", "1.2"), turns.running("D1", "1.3")) == (0, 0)


def test_a_stop_request_names_slack_ids_only() -> None:
    good = {"channel": "D1", "thread_ts": "1782234671.392669", "user": "U1"}
    assert stop_request(good) == StopRequest("D1", "1782234671.392669", "U1")
    forged = [
        {**good, "user": "U1\nERROR forged log line"},
        {**good, "channel": "D1 C2"},
        {**good, "thread_ts": "1.2\n"},
        {**good, "thread_ts": "soon"},
        {**good, "user": "U" * 33},
    ]
    for bad in forged:
        assert stop_request(bad) is None


async def test_a_stop_while_the_session_opens_leaves_it_active(bot: Bot) -> None:
    as_agent(bot)
    bot.slack.stall("agents.sessions.setStatus", 1.0)  # Slack's answer to "processing" is slow
    event = message_im_event(IN_DOMAIN)
    thread = str(event["ts"])
    await bot.event(event)
    await wait_until(
        lambda: stalled_call_arrived(bot, "agents.sessions.setStatus"), "the session to open"
    )
    await bot.event(agent_session_stopped_event(DM_CHANNEL_ID, thread))
    await bot.idle()
    # Slack may have set it processing already: it is set active again, not left with Stop.
    assert bot.slack.calls("agents.sessions.setStatus")[-1]["status"] == "active"
    assert bot.slack.sessions[(DM_CHANNEL_ID, thread)]["status"] == "active"
    assert bot.llm.requests == []
    assert [r.outcome for r in logged(bot)] == ["stopped"]


async def test_a_stop_while_the_first_words_are_posted_marks_that_message(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(slack_streaming="off")  # the answer is posted, then edited
    as_agent(bot)
    bot.services.conversation.stream_update_seconds = 0.0
    bot.llm.hold_after(3)
    bot.slack.stall("chat.postMessage", 1.0)  # Slack slow to post the first words
    event = message_im_event(IN_DOMAIN)
    thread = str(event["ts"])
    await bot.event(event)
    await wait_until(lambda: stalled_call_arrived(bot, "chat.postMessage"), "the first post")
    await bot.event(agent_session_stopped_event(DM_CHANNEL_ID, thread))
    await bot.llm.wait_for_disconnect()
    await bot.idle()
    # The message Slack posted after the click shows its words, marked stopped; no other.
    (message,) = thread_messages(bot, thread)
    blocks = json.dumps(message["blocks"], ensure_ascii=False)
    assert "Claims" in blocks and messages.STOPPED in blocks
    assert len(bot.slack.calls("chat.postMessage")) == 1
    assert [r.outcome for r in logged(bot)] == ["stopped"]
