"""Answers streamed natively (chat.startStream / appendStream / stopStream), and the fallback.

Through the real bolt app (signed HTTP events) against the mock Slack Web API
and the local model server streaming its answer a few words at a time.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable
from typing import Any

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.web.async_slack_response import AsyncSlackResponse

from bot.slack import messages
from bot.slack.blocks import FEEDBACK_ACTION_ID, stream_markdown
from bot.slack.reply import (
    STOP_TIMEOUT_SECONDS,
    TRANSIENT_SECONDS,
    UNSUPPORTED_SECONDS,
    Streaming,
    settled_text,
)

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import IN_DOMAIN, OUT_OF_DOMAIN, Bot, BotFactory, links  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DM_CHANNEL_ID,
    TEAM_ID,
    USER_ID,
    MockSlackAPI,
    app_mention_event,
    message_im_event,
    slack_ts,
)

STREAM_METHODS = {"chat.startStream", "chat.appendStream", "chat.stopStream"}
LONG_ANSWER = " ".join(["Claims are due within thirty days of the purchase."] * 6) + " [1]."
HOSTILE = (
    "Tell <!channel> and <@U123> to [click](http://evil.example/x) or <http://evil.example|x>, "
    "see www.evil.example and @here; the rule [1] holds [2](http://evil.example) too [1]."
)


def streaming_slowly(bot: Bot, reply: str = LONG_ANSWER) -> None:
    """The model writes ``reply`` a word every 20 ms; streams and edits keep up with it."""
    bot.llm.set_reply(lambda _: reply)
    bot.llm.trickle(0.02)
    bot.services.conversation.stream_update_seconds = 0.0
    bot.services.streaming.append_seconds = 0.05
    bot.services.streaming.first_text_seconds = 0.0


def streamed_text(bot: Bot) -> str:
    """What the streams sent, start and appends joined."""
    return "".join(
        str(p.get("markdown_text", ""))
        for m, p in bot.slack.log
        if m in {"chat.startStream", "chat.appendStream"}
    )


def bot_messages_in(bot: Bot, channel: str, thread: str) -> list[dict[str, Any]]:
    """The bot's messages Slack keeps in ``thread`` (the question itself is a person's)."""
    return [
        m
        for (c, _), m in bot.slack.messages.items()
        if c == channel and m.get("thread_ts") == thread
    ]


def assert_one_rendered_answer(bot: Bot, channel: str, thread: str) -> dict[str, Any]:
    """The thread holds one message of the bot: the rendered answer, links and buttons."""
    (message,) = bot_messages_in(bot, channel, thread)
    blocks = json.dumps(message.get("blocks", []))
    assert FEEDBACK_ACTION_ID in blocks and messages.SOURCES_HEADER in blocks
    assert links(message), "the citations resolved into links"
    assert message.get("streaming_state", "completed") == "completed"
    return message


# ---------------------------------------------------------------- native streaming


@pytest.mark.parametrize("where", ["channel", "DM"])
async def test_an_answer_streams_after_its_status_and_ends_rendered(bot: Bot, where: str) -> None:
    streaming_slowly(bot)
    if where == "channel":
        event, channel = app_mention_event(IN_DOMAIN), CHANNEL_ID
    else:
        event, channel = message_im_event(IN_DOMAIN), DM_CHANNEL_ID
    thread = str(event["ts"])
    await bot.event(event)
    final = await bot.answer()
    await bot.idle()

    methods = bot.slack.methods()
    status = methods.index("assistant.threads.setStatus")
    start = methods.index("chat.startStream")
    # The status stays until the first streamed text: nothing in the thread before it.
    assert status < start
    assert "chat.postMessage" not in methods[:start]
    (started,) = bot.slack.calls("chat.startStream")
    assert started["channel"] == channel and started["thread_ts"] == thread
    assert started["recipient_user_id"] == USER_ID and started["recipient_team_id"] == TEAM_ID
    assert started["markdown_text"].startswith("Claims")
    assert bot.slack.calls("chat.appendStream"), "later text appended"
    # Only what is new each time: together a prefix of the answer, never a repeat.
    sent = streamed_text(bot)
    assert LONG_ANSWER.startswith(sent) and len(sent) > len(started["markdown_text"])
    # Stopped, then the same message replaced by the rendered answer.
    (stopped,) = bot.slack.calls("chat.stopStream")
    assert methods.index("chat.stopStream") < len(methods) - 1 - methods[::-1].index("chat.update")
    assert final["ts"] == stopped["ts"] and "blocks" not in stopped
    assert_one_rendered_answer(bot, channel, thread)


async def test_a_stream_starts_at_the_first_words_and_coalesces_the_rest(bot: Bot) -> None:
    streaming_slowly(bot)
    # However long the conversation would hold back partial answers, a stream does not wait.
    bot.services.conversation.stream_update_seconds = 60.0
    bot.services.streaming.append_seconds = 0.3
    await bot.event(app_mention_event(IN_DOMAIN))
    await bot.answer()
    await bot.idle()
    (started,) = bot.slack.calls("chat.startStream")
    assert started["markdown_text"] == "Claims "  # the first whole word
    appends = bot.slack.calls("chat.appendStream")
    # About a second of writing, 54 words: a few appends, each carrying several words.
    words = [len(a["markdown_text"].split()) for a in appends]
    assert appends and sum(words) / len(words) >= 3, words


async def test_citation_numbers_stream_plain_and_model_output_stays_inert(bot: Bot) -> None:
    streaming_slowly(bot, HOSTILE)
    await bot.event(app_mention_event(IN_DOMAIN))
    final = await bot.answer()
    await bot.idle()

    sent = streamed_text(bot)
    assert "[1]" in sent, "citation numbers are streamed as written"
    for forbidden in ("<!channel>", "<@U123>", "<http", "](", "][", "@here"):
        assert forbidden not in sent, forbidden
    # Every URL the model wrote is in code, so Slack makes nothing of it.
    for url in re.findall(r"\S*evil\.example\S*", sent):
        assert re.search(r"`[^`\s]*evil\.example[^`\s]*`", url), url
    assert "`http://evil.example/x`" in sent and "`www.evil.example`" in sent
    # The final answer: the server's links only.
    assert links(final) and "evil.example|" not in json.dumps(final)


async def test_an_answer_written_at_once_is_posted_whole(bot: Bot) -> None:
    # The local model writes its one sentence within milliseconds: a stream would add nothing.
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    answer = await bot.answer()
    await bot.idle()
    assert not STREAM_METHODS & set(bot.slack.methods())
    (posted,) = bot.slack.calls("chat.postMessage")
    assert answer == {**posted, "ts": answer["ts"]}  # the post is the answer, with its ts
    assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))


async def test_a_refusal_is_posted_whole_without_a_stream(bot: Bot) -> None:
    await bot.event(app_mention_event(OUT_OF_DOMAIN))
    answer = await bot.answer()
    await bot.idle()
    assert answer["text"] == messages.REFUSAL
    assert not STREAM_METHODS & set(bot.slack.methods())


async def test_related_passages_are_posted_whole_without_a_stream(make_bot: BotFactory) -> None:
    # Nothing passes the answer threshold, everything the related one: no model call.
    bot = await make_bot(threshold=0.01, related_threshold=1.99)
    streaming_slowly(bot)
    await bot.event(app_mention_event(IN_DOMAIN))
    answer = await bot.answer()
    await bot.idle()
    assert messages.RELATED_HEADER in json.dumps(answer["blocks"], ensure_ascii=False)
    assert bot.llm.requests == []
    assert not STREAM_METHODS & set(bot.slack.methods())


async def test_streaming_off_posts_and_edits(make_bot: BotFactory) -> None:
    bot = await make_bot(slack_streaming="off")
    streaming_slowly(bot)
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    await bot.answer()
    await bot.idle()
    assert not STREAM_METHODS & set(bot.slack.methods())
    first = bot.slack.calls("chat.postMessage")[0]
    assert first["text"].startswith("Claims")  # the text being written, then edited
    assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))


# ---------------------------------------------------------------- fallback


async def test_without_streaming_in_the_workspace_the_answer_is_posted_and_edited(
    bot: Bot,
) -> None:
    bot.slack.fail("chat.startStream", "unknown_method")
    streaming_slowly(bot)
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    await bot.answer()
    await bot.idle()
    refused = [m for m, _, _ in bot.slack.rejected if m in STREAM_METHODS]
    assert refused == ["chat.startStream"]
    first = bot.slack.calls("chat.postMessage")[0]
    assert messages.WRITING in json.dumps(first["blocks"], ensure_ascii=False)
    assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))

    # Remembered: the next answer does not ask again.
    second = app_mention_event(IN_DOMAIN)
    await bot.event(second)
    await bot.answer(2)
    await bot.idle()
    assert len(bot.slack.calls("chat.startStream", include_rejected=True)) == 1
    assert_one_rendered_answer(bot, CHANNEL_ID, str(second["ts"]))


async def test_a_start_rate_limited_past_the_retries_falls_back_for_a_while(bot: Bot) -> None:
    bot.slack.rate_limit("chat.startStream", retry_after=0, times=10)
    streaming_slowly(bot)
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    await bot.answer()
    await bot.idle()
    assert bot.slack.calls("chat.startStream") == []
    assert bot.slack.calls("chat.postMessage"), "posted and edited instead"
    assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))
    assert not bot.services.streaming.available(CHANNEL_ID)  # for half a minute
    assert bot.services.streaming.available(DM_CHANNEL_ID)


async def test_a_stream_failing_midway_becomes_one_complete_answer(bot: Bot) -> None:
    bot.slack.fail("chat.appendStream", "internal_error", times=1)
    streaming_slowly(bot)
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    final = await bot.answer()
    await bot.idle()

    (started,) = bot.slack.calls("chat.startStream")
    (stopped,) = bot.slack.calls("chat.stopStream")
    assert bot.slack.calls("chat.appendStream") == [], "no append after the failed one"
    # The streamed message carried on: edited as the text grew, then replaced.
    assert final["ts"] == stopped["ts"]
    edits = bot.slack.calls("chat.update")
    assert len(edits) >= 2 and all(e["ts"] == stopped["ts"] for e in edits)
    assert messages.WRITING in json.dumps(edits[0]["blocks"], ensure_ascii=False)
    assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))
    assert started["markdown_text"] and not bot.services.streaming.available(CHANNEL_ID)


async def test_an_append_slack_does_not_accept_in_time_gives_the_stream_up(bot: Bot) -> None:
    streaming_slowly(bot)
    bot.services.streaming.append_timeout = 0.2
    bot.slack.stall("chat.appendStream", 1.0)
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    final = await bot.answer()
    await bot.idle()
    (stopped,) = bot.slack.calls("chat.stopStream")
    assert final["ts"] == stopped["ts"]
    assert not bot.services.streaming.available(CHANNEL_ID)  # a timeout: for half a minute
    assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))


async def test_a_stream_that_cannot_be_edited_is_replaced_by_a_new_message(bot: Bot) -> None:
    bot.slack.fail("chat.update", "cant_update_message")
    streaming_slowly(bot)
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    final = await bot.answer()
    await bot.idle()
    (stopped,) = bot.slack.calls("chat.stopStream")
    (deleted,) = bot.slack.calls("chat.delete")
    assert deleted["ts"] == stopped["ts"] != final["ts"]
    assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))


async def test_a_failure_midway_stops_the_stream_and_says_so_in_its_message(bot: Bot) -> None:
    streaming_slowly(bot)
    words = ["Claims ", "Claims are ", "Claims are due "]

    async def breaks_midway(*args: Any, on_delta: Any, **kwargs: Any) -> Any:
        for text in words:
            await on_delta(text)
        raise RuntimeError("secret internal detail")

    bot.services.engine.ask = breaks_midway  # type: ignore[method-assign]
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    (notice,) = await bot.slack.wait_for("chat.update")
    await bot.idle()
    (started,) = bot.slack.calls("chat.startStream")
    (stopped,) = bot.slack.calls("chat.stopStream")
    assert notice["text"] == messages.ERROR_GENERIC and notice["ts"] == stopped["ts"]
    methods = bot.slack.methods()
    assert methods.index("chat.stopStream") < methods.index("chat.update")
    (message,) = bot_messages_in(bot, CHANNEL_ID, str(event["ts"]))
    assert message["text"] == messages.ERROR_GENERIC and started["markdown_text"] == "Claims "


# ---------------------------------------------------------------- the parts


async def test_the_mock_slack_streams_as_slack_documents_it(slack: MockSlackAPI) -> None:
    client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
    thread = slack_ts()

    async def error_of(call: Any) -> str:
        with pytest.raises(SlackApiError) as failure:
            await call
        return str(failure.value.response["error"])

    # In a channel Slack must know who the stream is for; a DM needs no recipient.
    start = client.chat_startStream(channel=CHANNEL_ID, thread_ts=thread, markdown_text="a")
    assert await error_of(start) == "missing_recipient_user_id"
    dm = await client.chat_startStream(channel=DM_CHANNEL_ID, thread_ts=thread, markdown_text="a")
    started = await client.chat_startStream(
        channel=CHANNEL_ID,
        thread_ts=thread,
        markdown_text="Hello ",
        recipient_user_id=USER_ID,
        recipient_team_id=TEAM_ID,
    )
    ts = str(started["ts"])
    await client.chat_appendStream(channel=CHANNEL_ID, ts=ts, markdown_text="world")
    too_long = client.chat_appendStream(channel=CHANNEL_ID, ts=ts, markdown_text="x" * 12001)
    assert await error_of(too_long) == "msg_too_long"
    assert await error_of(client.chat_appendStream(channel=CHANNEL_ID, ts=ts)) == "no_text"
    stopped = await client.chat_stopStream(channel=CHANNEL_ID, ts=ts)
    assert stopped["message"]["text"] == "Hello world"
    # A stopped stream takes no more text, and is a message like any other.
    again = client.chat_appendStream(channel=CHANNEL_ID, ts=ts, markdown_text="!")
    assert await error_of(again) == "message_not_in_streaming_state"
    slack.add_person_message({"channel": CHANNEL_ID, "ts": thread, "text": "q", "user": USER_ID})
    replies = await client.conversations_replies(channel=CHANNEL_ID, ts=thread)
    assert [m["text"] for m in replies["messages"]] == ["q", "Hello world"]
    assert dm["channel"] == DM_CHANNEL_ID
    # Scripted failures work on the new methods as on any other.
    slack.fail("chat.startStream", "unknown_method", times=1)
    refused = client.chat_startStream(channel=DM_CHANNEL_ID, thread_ts=thread, markdown_text="a")
    assert await error_of(refused) == "unknown_method"


@pytest.mark.parametrize("text", [LONG_ANSWER, HOSTILE, "See `a http://x` and [b](www.c.de) ok"])
def test_streamed_markdown_only_grows(text: str) -> None:
    sent = ""
    for end in range(len(text) + 1):
        markdown = stream_markdown(settled_text(text[:end]))
        assert markdown.startswith(sent), (text[:end], sent, markdown)
        sent = markdown
    # Every word but the one being written was sent.
    assert sent == stream_markdown(settled_text(text))


ATTACKS = [
    "<!channel> <!here> <!everyone> <@U123> <@W123|boss> <#C123> <!subteam^S123>",
    "&lt;!channel&gt; &#60;@U123&#62; written pre-escaped",
    "[click](http://evil.example) [x](evil) ![img](http://evil.example/i.png) [a] [b]",
    "[text][ref] and [ref]: http://evil.example and [ref]:evil",
    "<http://evil.example> <http://evil.example|label> <mailto:a@evil.example|mail>",
    "see http://evil.example/p?q=1&r=2, www.evil.example, evil.example/x, boss@evil.example.",
    "`code http://evil.example` ``two http://evil.example`` ```fence\nhttp://evil.example\n```",
    "@here @channel @everyone @Here (@channel) <img src=x onerror=alert(1)> <b>bold</b>",
]
_LINKISH = re.compile(
    r"(?:[a-z]+://|www\.|mailto:)[^\s`]+|[^\s`]+@[^\s`]+\.[^\s`]+|\b[a-z0-9-]+\.example[^\s`]*",
    re.IGNORECASE,
)


@pytest.mark.parametrize("text", ATTACKS)
def test_hostile_streamed_text_forms_no_link_or_mention(text: str) -> None:
    assert_inert_markdown(stream_markdown(text + " "))


def assert_inert_markdown(markdown: str) -> None:
    """Streamed Markdown that forms no mention, link or markup."""
    assert "<" not in markdown and ">" not in markdown  # no Slack markup, autolink or HTML
    assert not re.search(r"\][(\[:]", markdown), "no Markdown link or reference"
    assert not re.search(r"@(?:here|channel|everyone)\b", markdown, re.IGNORECASE)
    # Only backticks the render put there: every link-like token sits between two of them.
    for match in _LINKISH.finditer(markdown):
        before, after = markdown[: match.start()], markdown[match.end() :]
        assert before.count("`") % 2 == 1 and "`" in after, (match.group(0), markdown)


def test_settled_text_stops_before_the_word_being_written() -> None:
    assert settled_text("Claims are du") == "Claims are "
    assert settled_text("Claims are\n\n") == "Claims "
    assert settled_text("Claims") == ""


def _error(code: str, status: int = 200) -> SlackApiError:
    response = AsyncSlackResponse(
        client=None,  # type: ignore[arg-type]
        http_verb="POST",
        api_url="chat.startStream",
        req_args={},
        data={"ok": False, "error": code},
        headers={},
        status_code=status,
    )
    return SlackApiError(code, response)


def test_refusals_switch_streaming_off_for_as_long_as_they_mean() -> None:
    now = [0.0]
    streaming = Streaming(clock=lambda: now[0])
    streaming.refused(CHANNEL_ID, _error("unknown_method"))
    assert not streaming.available(CHANNEL_ID) and streaming.available(DM_CHANNEL_ID)
    now[0] = UNSUPPORTED_SECONDS - 1
    assert not streaming.available(CHANNEL_ID)
    now[0] = UNSUPPORTED_SECONDS
    assert streaming.available(CHANNEL_ID)

    streaming.refused(DM_CHANNEL_ID, _error("ratelimited", 429))
    assert not streaming.available(DM_CHANNEL_ID)
    now[0] += TRANSIENT_SECONDS
    assert streaming.available(DM_CHANNEL_ID)

    # About one channel only: the next answer tries again.
    streaming.refused(CHANNEL_ID, _error("is_archived"))
    assert streaming.available(CHANNEL_ID)
    assert not Streaming(False).available(CHANNEL_ID)


async def test_past_the_streams_budget_answers_are_posted_and_edited(bot: Bot) -> None:
    streaming_slowly(bot)
    while bot.services.streaming.take_start():
        pass  # a minute of streams already spent
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    await bot.answer()
    await bot.idle()
    assert not STREAM_METHODS & set(bot.slack.methods())
    first = bot.slack.calls("chat.postMessage")[0]
    assert messages.WRITING in json.dumps(first["blocks"], ensure_ascii=False)
    assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))


async def test_a_stop_held_up_by_a_rate_limit_does_not_hold_the_answer(bot: Bot) -> None:
    streaming_slowly(bot)
    bot.services.streaming.cleanup_seconds = 0.5
    bot.slack.rate_limit("chat.stopStream", retry_after=30)
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    started = time.monotonic()
    answer = await bot.answer(timeout=STOP_TIMEOUT_SECONDS + 10)
    assert time.monotonic() - started < STOP_TIMEOUT_SECONDS + 5
    # A stream still open can be neither edited nor deleted: the answer is a new message.
    assert answer["ts"] not in {p["ts"] for p in bot.slack.calls("chat.update")}
    rejected = [(m, e) for m, _, e in bot.slack.rejected]
    assert ("chat.update", "streaming_state_conflict") in rejected
    await bot.idle()
    # The delete right after the answer is refused (the stream is still open); it runs
    # after the answer was posted, so it is looked for once the bot is idle.
    assert ("chat.delete", "cant_delete_message") in [(m, e) for m, _, e in bot.slack.rejected]
    # Later the stream is stopped and deleted: one answer is left in the thread.
    (stopped,) = bot.slack.calls("chat.stopStream")
    (deleted,) = bot.slack.calls("chat.delete")
    assert deleted["ts"] == stopped["ts"] != answer["ts"]
    assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))


# Slack's numbers, written out: compared with the module's own constants, raising one past
# Slack's limit would still pass. Each stream ends with one chat.stopStream, which is Tier 2
# (https://api.slack.com/methods/chat.stopStream); chat.appendStream is Tier 4 (its page,
# https://docs.slack.dev/reference/methods/chat.appendStream, as bot/slack/reply.py reads it).
# Tier 2 is "20+ per minute", Tier 4 "100+ per minute" (https://docs.slack.dev/apis/web-api/rate-limits).


def _steady(take: Callable[[], bool], now: list[float], seconds: float = 60.0) -> int:
    """How many of the calls asked for every tenth of a second for ``seconds`` are granted."""
    start, granted = now[0], 0
    for tenth in range(1, int(seconds * 10) + 1):
        now[0] = start + tenth / 10
        granted += take()
    return granted


def test_streams_share_a_budget_below_the_stop_limit() -> None:
    now = [0.0]
    streaming = Streaming(clock=lambda: now[0])
    assert sum(streaming.take_start() for _ in range(25)) == 20  # a burst: one minute of Tier 2
    now[0] = 30.0
    assert sum(streaming.take_start() for _ in range(50)) == 10  # half a minute: 20 a minute
    # Asked for without pause, a minute grants no more stops than Tier 2's 20.
    assert _steady(streaming.take_start, now) <= 20


def test_appends_share_a_budget_below_slacks_limit() -> None:
    now = [0.0]
    streaming = Streaming(clock=lambda: now[0])
    assert sum(streaming.take_append() for _ in range(30)) == 20  # a burst, a fifth of Tier 4
    now[0] = 60.0
    granted = sum(streaming.take_append() for _ in range(200))
    assert granted == 20  # refilled to the burst, never beyond
    now[0] = 120.0
    assert sum(streaming.take_append() for _ in range(200)) <= 100  # Tier 4: 100 a minute
    # Asked for without pause, a minute grants fewer appends than Tier 4's 100.
    assert _steady(streaming.take_append, now) < 100


# ---------------------------------------------------------------- hostile or hanging models, 429 storms


def _hang_after(bot: Bot, pieces: int) -> None:
    """The model streams ``pieces`` pieces, then sends nothing more until the server closes."""
    sent = [0]
    closing = bot.llm._closing

    async def trickle_then_hang(seconds: float) -> None:
        sent[0] += 1
        if sent[0] > pieces:
            await closing.wait()
        await asyncio.sleep(seconds)

    bot.llm._sleep = trickle_then_hang  # type: ignore[method-assign]


async def test_a_model_hanging_midstream_is_cut_at_the_deadline_and_the_stream_finished(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(llm_deadline=2.0, llm_first_token_timeout=1.0)
    streaming_slowly(bot)
    _hang_after(bot, 20)
    event = app_mention_event(IN_DOMAIN)
    started = time.monotonic()
    await bot.event(event)
    final = await bot.answer(timeout=15)
    assert time.monotonic() - started < 2.0 + 5, "finished at the deadline, not the hang's end"
    await bot.idle()
    (began,) = bot.slack.calls("chat.startStream")
    (stopped,) = bot.slack.calls("chat.stopStream")
    assert began["markdown_text"].startswith("Claims")
    # The stream is stopped, then its message replaced by what the bot says without the model.
    assert final["ts"] == stopped["ts"]
    methods = bot.slack.methods()
    assert methods.index("chat.stopStream") < len(methods) - 1 - methods[::-1].index("chat.update")
    (message,) = bot_messages_in(bot, CHANNEL_ID, str(event["ts"]))
    assert message.get("streaming_state", "completed") == "completed", "nothing left streaming"
    shown = json.dumps(message.get("blocks", []), ensure_ascii=False)
    assert messages.EVIDENCE_HEADER in shown and messages.EVIDENCE_REASON in shown
    assert message["text"].startswith(messages.EVIDENCE_FALLBACK) and links(message)
    assert "Claims are due" not in shown, "the half-written answer is gone"


async def test_hostile_model_output_stays_inert_in_every_stream_call_and_the_answer(
    bot: Bot,
) -> None:
    flood = "`" * 300 + " ``` ` `` " + "`" * 77
    hostile = " ".join([*ATTACKS, flood, "[1] <!channel> [click](http://evil.example) @here"])
    streaming_slowly(bot, hostile.replace("\n", " ") + " [1].")
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    final = await bot.answer(timeout=30)
    await bot.idle()

    assert bot.slack.calls("chat.appendStream"), "streamed"
    for method, params in bot.slack.log:
        if method in {"chat.startStream", "chat.appendStream", "chat.stopStream"}:
            assert "blocks" not in params and "chunks" not in params, method
    # Each piece, and what they form together, is inert.
    pieces = [
        str(p["markdown_text"])
        for m, p in bot.slack.log
        if m in STREAM_METHODS and "markdown_text" in p
    ]
    for piece in pieces:
        assert not re.search(r"<[!@#]|<https?:|<mailto:", piece), piece
    assert_inert_markdown(streamed_text(bot))
    # The final answer, and every edit on the way: no live mention, no link but the server's.
    for params in [final, *bot.slack.calls("chat.update"), *bot.slack.calls("chat.postMessage")]:
        shown = json.dumps(params.get("blocks", []), ensure_ascii=False) + str(params.get("text"))
        for forbidden in ("<!channel>", "<!here>", "<!everyone>", "<@U123>", "<@W123", "<#C123>"):
            assert forbidden not in shown, forbidden
        assert "<!subteam" not in shown and "<mailto:" not in shown and "|label>" not in shown
        assert not re.search(r"<https?://[^>]*evil", shown), shown
    assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))


def _timed(bot: Bot, method: str) -> list[float]:
    """When the mock Slack answered each call to ``method`` (accepted or refused)."""
    times: list[float] = []
    record = bot.slack._record

    async def recording(called: str, params: dict[str, Any], error: str | None) -> None:
        if called == method:
            times.append(time.monotonic())
        await record(called, params, error)

    bot.slack._record = recording  # type: ignore[method-assign]
    return times


async def test_a_429_storm_on_appends_ends_the_stream_once_and_the_answer_arrives_whole(
    bot: Bot,
) -> None:
    streaming_slowly(bot)
    bot.slack.rate_limit("chat.appendStream", retry_after=1, times=None)
    times = _timed(bot, "chat.appendStream")
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    final = await bot.answer(timeout=30)
    await bot.idle()

    # The client waited Retry-After before each retry, then the stream was given up.
    refused = [e for m, _, e in bot.slack.rejected if m == "chat.appendStream"]
    assert refused and set(refused) == {"ratelimited"}
    assert len(times) == len(refused) <= 3, "retried a bounded number of times, then given up"
    gaps = [b - a for a, b in zip(times, times[1:], strict=False)]
    assert all(gap >= 1.0 for gap in gaps), gaps
    assert not bot.slack.calls("chat.appendStream")
    (stopped,) = bot.slack.calls("chat.stopStream")
    assert final["ts"] == stopped["ts"]
    whole = assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))
    assert json.dumps(whole["blocks"]).count("Claims are due within thirty days") == 6
    assert not bot.services.streaming.available(CHANNEL_ID), "no stream for a while"

    # The storm goes on: the next answer is posted and edited, not streamed.
    second = app_mention_event(IN_DOMAIN)
    await bot.event(second)
    await bot.answer(2, timeout=30)
    await bot.idle()
    assert len(times) == len(refused), "no append asked for while streaming is off"
    assert len(bot.slack.calls("chat.startStream")) == 1
    assert_one_rendered_answer(bot, CHANNEL_ID, str(second["ts"]))


async def test_a_429_with_a_long_retry_after_gives_the_stream_up_without_waiting_it_out(
    bot: Bot,
) -> None:
    streaming_slowly(bot)
    bot.services.streaming.append_timeout = 0.5
    bot.slack.rate_limit("chat.appendStream", retry_after=30, times=None)
    times = _timed(bot, "chat.appendStream")
    event = app_mention_event(IN_DOMAIN)
    started = time.monotonic()
    await bot.event(event)
    final = await bot.answer(timeout=20)
    assert time.monotonic() - started < 10, "the answer did not wait out the Retry-After"
    await bot.idle()
    assert len(times) == 1, "nothing asked again before Retry-After said"
    (stopped,) = bot.slack.calls("chat.stopStream")
    assert final["ts"] == stopped["ts"]
    assert_one_rendered_answer(bot, CHANNEL_ID, str(event["ts"]))
