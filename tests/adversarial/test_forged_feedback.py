"""Forged feedback: a thumb counts only on the answer it names, from someone who could see it.

The real bolt app receives signed ``block_actions`` (``tests/conftest_bot.py``)
built the way Slack builds a click on the feedback buttons: the clicked message
as the mock Slack holds it (its ``thread_ts``), its channel in ``container``.
The answers are real: questions asked through signed events, answered by the
bot. Every attack below wrote a thumb before the fix: the button's value names
any logged question, and a click sent from another conversation, by someone
outside the channel, or posing as the asker in their DM, marked it.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

pytest.register_assert_rewrite("tests.conftest_bot")

from bot.slack import messages  # noqa: E402
from tests.conftest_bot import IN_DOMAIN, Bot  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DM_CHANNEL_ID,
    USER_ID,
    app_mention_event,
    block_actions_body,
    feedback_action,
    message_im_event,
)

ASKER = USER_ID
COLLEAGUE = "U0COLLEAG1"  # a member of CHANNEL_ID who did not ask
OUTSIDER = "U0OUTSIDE1"  # in the workspace, not in CHANNEL_ID
OTHER_CHANNEL = "C0OTHER001"


def _feedback_value(answer: dict[str, Any], which: str = "negative") -> str:
    (buttons,) = [b for b in answer["blocks"] if b["type"] == "context_actions"]
    return str(buttons["elements"][0][f"{which}_button"]["value"])


def _posted(bot: Bot, answer: dict[str, Any]) -> dict[str, Any]:
    """The answer's message as Slack holds it (what a click's ``message`` carries)."""
    (message,) = [m for (_, ts), m in bot.slack.messages.items() if ts == answer["ts"]]
    return message


async def _click(
    bot: Bot,
    value: str,
    *,
    user: str,
    channel: str,
    message: dict[str, Any],
    response_id: str = "fb",
) -> None:
    body = block_actions_body(
        [feedback_action("kb_feedback", value)],
        user_id=user,
        channel_id=channel,
        message=message,
        thread_ts=message.get("thread_ts"),
        response_url=bot.slack.response_url(response_id),
    )
    assert (await bot.post(body)).status == 200
    await bot.idle()


def _thumbs(bot: Bot) -> list[tuple[int, str, int]]:
    rows = bot.kb.store.db.query('SELECT query_id, "user", value FROM feedback ORDER BY id')
    return [(r["query_id"], r["user"], r["value"]) for r in rows]


async def _channel_answer(bot: Bot, count: int = 1) -> dict[str, Any]:
    """The ``count``-th answer shown: the bot's to a question the asker asked in the channel."""
    bot.slack.set_members(CHANNEL_ID, [ASKER, COLLEAGUE])
    await bot.event(app_mention_event(IN_DOMAIN, channel=CHANNEL_ID, user=ASKER))
    return await bot.answer(count)


async def _dm_answer(bot: Bot) -> dict[str, Any]:
    await bot.event(message_im_event("How do I fix the VPN?", user=ASKER))
    return await bot.answer()


async def _ignored_click(
    bot: Bot,
    caplog: pytest.LogCaptureFixture,
    value: str,
    *,
    user: str,
    channel: str,
    message: dict[str, Any],
) -> str:
    """Click, expect the click ignored (nothing written, nothing said); its log line."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="bot.slack.feedback"):
        await _click(bot, value, user=user, channel=channel, message=message)
    assert _thumbs(bot) == []
    assert bot.slack.responses("fb") == [], "an ignored click is told nothing"
    (line,) = _ignored(caplog)
    return line


def _ignored(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "bot.slack.feedback" and r.getMessage().startswith("ignoring feedback")
    ]


async def test_the_asker_and_a_member_of_the_channel_mark_the_answer(bot: Bot) -> None:
    answer = await _channel_answer(bot)
    message = _posted(bot, answer)
    value = _feedback_value(answer)
    query_id = int(value.split(":")[1])
    await _click(bot, value, user=ASKER, channel=CHANNEL_ID, message=message)
    await _click(
        bot,
        _feedback_value(answer, "positive"),
        user=COLLEAGUE,
        channel=CHANNEL_ID,
        message=message,
        response_id="fb2",
    )
    assert _thumbs(bot) == [(query_id, ASKER, -1), (query_id, COLLEAGUE, 1)]
    assert bot.slack.responses("fb")[0]["text"] == messages.FEEDBACK_THANKS_NEGATIVE
    assert bot.slack.responses("fb2")[0]["text"] == messages.FEEDBACK_THANKS_POSITIVE


async def test_a_value_naming_a_dm_question_marks_nothing_from_a_channel(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    # Someone's DM question, and a colleague's click in the channel with a value naming it.
    dm_value = _feedback_value(await _dm_answer(bot))
    channel_answer = await _channel_answer(bot, 2)
    line = await _ignored_click(
        bot,
        caplog,
        dm_value,
        user=COLLEAGUE,
        channel=CHANNEL_ID,
        message=_posted(bot, channel_answer),
    )
    assert COLLEAGUE in line and DM_CHANNEL_ID in line and CHANNEL_ID in line


async def test_a_click_in_another_thread_of_the_same_channel_marks_nothing(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    first = await _channel_answer(bot)
    await bot.event(app_mention_event("Who rotates the API keys?", channel=CHANNEL_ID, user=ASKER))
    second = await bot.answer(2)
    # The first answer's value, clicked on the second answer's message.
    line = await _ignored_click(
        bot,
        caplog,
        _feedback_value(first),
        user=ASKER,
        channel=CHANNEL_ID,
        message=_posted(bot, second),
    )
    assert second["thread_ts"] in line and first["thread_ts"] in line


async def test_someone_outside_the_channel_cannot_mark_its_answer(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    answer = await _channel_answer(bot)
    # The right message, channel and thread; the clicker is not among the members.
    line = await _ignored_click(
        bot,
        caplog,
        _feedback_value(answer),
        user=OUTSIDER,
        channel=CHANNEL_ID,
        message=_posted(bot, answer),
    )
    assert OUTSIDER in line and "cannot see its answer" in line
    asked = [p.get("channel") for m, p in bot.slack.log if m == "conversations.members"]
    assert CHANNEL_ID in asked


async def test_only_the_asker_marks_an_answer_in_their_dm(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    answer = await _dm_answer(bot)
    message = _posted(bot, answer)
    value = _feedback_value(answer)
    line = await _ignored_click(
        bot, caplog, value, user=COLLEAGUE, channel=DM_CHANNEL_ID, message=message
    )
    assert COLLEAGUE in line and "cannot see its answer" in line
    await _click(bot, value, user=ASKER, channel=DM_CHANNEL_ID, message=message)
    assert _thumbs(bot) == [(int(value.split(":")[1]), ASKER, -1)]


async def test_a_click_without_its_message_or_with_a_foreign_value_marks_nothing(
    bot: Bot, caplog: pytest.LogCaptureFixture
) -> None:
    answer = await _channel_answer(bot)
    value = _feedback_value(answer)
    bare = block_actions_body(
        [feedback_action("kb_feedback", value)], user_id=ASKER, channel_id=CHANNEL_ID
    )
    with caplog.at_level(logging.WARNING, logger="bot.slack.feedback"):
        assert (await bot.post(bare)).status == 200  # Slack's shape, but no thread: not bound
        await bot.idle()
        for forged in ("negative:\u0663", "negative:" + "9" * 40, "negative:0", "neutral:1"):
            await _click(bot, forged, user=ASKER, channel=CHANNEL_ID, message=_posted(bot, answer))
    assert _thumbs(bot) == []
    assert len(_ignored(caplog)) == 5
    logged = json.dumps([r.getMessage() for r in caplog.records])
    assert "9" * 32 not in logged, "a hostile value is logged cut short"
