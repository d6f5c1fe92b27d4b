"""Slack guests read along: an answer a member asks for in a channel is posted there.

The attacker is a guest of the workspace (a single- or multi-channel guest:
``users.info`` ``is_restricted``) in a channel with members of the
organisation. They cannot ask for the documents for everyone themselves; they
wait for a member to ask in the channel and read the answer. Driven through the
real bolt app against the mock Slack Web API: which document's passage reaches
the channel.
"""

from __future__ import annotations

import json

import pytest

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import FALCON_Q, IN_DOMAIN, Bot  # noqa: E402
from tests.servers import CHANNEL_ID, USER_ID, app_mention_event  # noqa: E402

GUEST = "U0GUEST001"
# More people than one page of users.list (200): the guest is on the second page.
COLLEAGUES = [f"U0COLL{n:04d}" for n in range(250)]


def _channel_text(bot: Bot) -> str:
    return json.dumps(bot.slack.calls("chat.postMessage") + bot.slack.calls("chat.update"))


def _guest_in_the_channel(bot: Bot) -> None:
    for colleague in COLLEAGUES:
        bot.slack.set_user(colleague)
    bot.slack.set_user(GUEST, name="gina").update(is_restricted=True, is_ultra_restricted=True)
    bot.slack.set_members(CHANNEL_ID, [USER_ID, *COLLEAGUES[:5], GUEST])


async def test_a_members_answer_where_a_guest_reads_holds_no_document_for_everyone(
    bot: Bot,
) -> None:
    _guest_in_the_channel(bot)
    await bot.event(app_mention_event(IN_DOMAIN, user=USER_ID))
    answer = await bot.answer()
    # The handbook is for everyone in the organisation, which the guest is not.
    assert "Employee handbook" not in json.dumps(answer["blocks"])
    assert "30 days" not in _channel_text(bot)
    # The channel's own documents still answer: the guest is in it.
    await bot.event(app_mention_event(FALCON_Q, user=USER_ID))
    second = await bot.answer(2)
    assert "Project Falcon" in json.dumps(second["blocks"])
    # Both questions cost one listing of the workspace, page by page.
    assert [c.get("cursor") is None for c in bot.slack.calls("users.list")] == [True, False]
    assert len(bot.slack.calls("conversations.members")) == 1


async def test_once_the_guest_left_the_channel_reads_the_documents_for_everyone(
    bot: Bot,
) -> None:
    _guest_in_the_channel(bot)
    await bot.event(app_mention_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" not in json.dumps((await bot.answer())["blocks"])
    # Slack says the guest left (member_left_channel): the channel is asked again at once.
    bot.slack.set_members(CHANNEL_ID, [USER_ID, *COLLEAGUES[:5]])
    left = {"type": "member_left_channel", "user": GUEST, "channel": CHANNEL_ID}
    await bot.event(left)
    await bot.idle()
    await bot.event(app_mention_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" in json.dumps((await bot.answer(2))["blocks"])


async def test_a_member_made_a_guest_counts_at_once(bot: Bot) -> None:
    bot.slack.set_members(CHANNEL_ID, [USER_ID, COLLEAGUES[0]])
    await bot.event(app_mention_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" in json.dumps((await bot.answer())["blocks"])
    # An admin turns the colleague into a guest: Slack sends user_change with the person.
    changed = bot.slack.set_user(COLLEAGUES[0])
    changed.update(is_restricted=True)
    await bot.event({"type": "user_change", "user": changed})
    await bot.idle()
    await bot.event(app_mention_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" not in json.dumps((await bot.answer(2))["blocks"])
    assert len(bot.slack.calls("users.list")) == 1  # the event, not a second listing


@pytest.mark.parametrize("error", ["missing_scope", "ratelimited"])
async def test_when_slack_cannot_say_who_is_a_guest_the_channel_is_taken_as_having_one(
    bot: Bot, error: str
) -> None:
    bot.slack.set_members(CHANNEL_ID, [USER_ID])
    bot.slack.fail("users.list", error)
    await bot.event(app_mention_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" not in json.dumps((await bot.answer())["blocks"])
    assert "30 days" not in _channel_text(bot)
    # Not a broken bot: the channel's own documents answer there all the same.
    await bot.event(app_mention_event(FALCON_Q, user=USER_ID))
    assert "Project Falcon" in json.dumps((await bot.answer(2))["blocks"])


async def test_when_slack_cannot_say_who_is_in_the_channel_it_is_taken_as_having_a_guest(
    bot: Bot,
) -> None:
    _guest_in_the_channel(bot)
    bot.slack.fail("conversations.members", "internal_error", status=500)
    await bot.event(app_mention_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" not in json.dumps((await bot.answer())["blocks"])
    assert "30 days" not in _channel_text(bot)
    # Not a broken bot: the channel's own documents answer there all the same.
    await bot.event(app_mention_event(FALCON_Q, user=USER_ID))
    assert "Project Falcon" in json.dumps((await bot.answer(2))["blocks"])
