"""Slack Connect: people of other organisations get nothing internal by default.

The attacker is a user of another organisation in a channel shared with this
workspace (or in a DM with the bot). They mention the bot, ask in a thread or
send it files, the way any Slack user would.
"""

from __future__ import annotations

import json

import pytest

pytest.register_assert_rewrite("tests.conftest_bot")

from bot.slack import messages  # noqa: E402
from tests.conftest_bot import FALCON_Q, IN_DOMAIN, Bot, BotFactory  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DM_CHANNEL_ID,
    TEAM_ID,
    app_mention_event,
    file_input_state,
    file_share_event,
    message_im_event,
    slash_command_body,
    view_submission_body,
)

OTHER_TEAM = "T0OTHERORG"
EXTERNAL_USER = "U0EXTERNAL"


def _all_text(bot: Bot) -> str:
    calls = bot.slack.calls("chat.postMessage") + bot.slack.calls("chat.update")
    return json.dumps(calls)


async def test_an_external_mention_gets_a_clear_no_and_no_knowledge(bot: Bot) -> None:
    await bot.event(app_mention_event(IN_DOMAIN, user=EXTERNAL_USER, team=OTHER_TEAM))
    await bot.idle()
    posted = bot.slack.calls("chat.postMessage")
    assert len(posted) == 1 and messages.EXTERNAL_ASKER in posted[0]["text"]
    assert bot.slack.calls("chat.update") == []
    assert bot.llm.requests == []
    # Nothing from the handbook, and no citation link, reached the channel.
    assert "30 days" not in _all_text(bot) and "/d/" not in _all_text(bot)


async def test_the_team_comes_from_users_info_when_the_event_omits_it(bot: Bot) -> None:
    bot.slack.set_user(EXTERNAL_USER)["team_id"] = OTHER_TEAM
    event = message_im_event(IN_DOMAIN, user=EXTERNAL_USER)
    event.pop("team", None)
    await bot.event(event)
    await bot.idle()
    assert bot.llm.requests == []
    assert messages.EXTERNAL_ASKER in _all_text(bot)
    assert bot.slack.calls("users.info")


async def test_an_external_persons_files_are_not_ingested(bot: Bot) -> None:
    file = bot.slack.add_file("F0EXT0001", "expenses.md", b"# Expenses\n\nPay me.\n", "text/plain")
    before = len(bot.kb.documents())
    event = file_share_event([file], user=EXTERNAL_USER, channel=DM_CHANNEL_ID)
    event["team"] = OTHER_TEAM
    await bot.event(event)
    await bot.idle()
    assert len(bot.kb.documents()) == before
    assert bot.slack.downloads == []
    assert messages.EXTERNAL_ASKER in _all_text(bot)


async def test_a_shared_channel_sees_only_its_own_documents(bot: Bot) -> None:
    # A member of this workspace asks, but the answer is read by the other organisation too.
    await bot.event(app_mention_event(IN_DOMAIN), is_ext_shared_channel=True)
    answer = await bot.answer()
    assert "Employee handbook" not in json.dumps(answer["blocks"])
    assert messages.SHARED_CHANNEL_NOTE in json.dumps(answer["blocks"])
    # The channel's own documents still answer.
    await bot.event(app_mention_event(FALCON_Q), is_ext_shared_channel=True)
    second = await bot.answer(2)
    assert "Project Falcon" in json.dumps(second["blocks"])


async def test_allowing_external_people_answers_them(make_bot: BotFactory) -> None:
    bot = await make_bot(allow_external=True)
    await bot.event(app_mention_event(IN_DOMAIN, user=EXTERNAL_USER, team=OTHER_TEAM))
    answer = await bot.answer()
    assert messages.EXTERNAL_ASKER not in _all_text(bot)
    assert "30 days" in json.dumps(answer["blocks"])


async def test_an_external_person_cannot_upload_through_the_modal(bot: Bot) -> None:
    resp = await bot.post(slash_command_body("/kb-upload", "", EXTERNAL_USER, CHANNEL_ID))
    assert resp.status == 200
    (call,) = await bot.slack.wait_for("views.open")
    file = bot.slack.add_file("F0EXT0002", "policy.md", b"# Policy\n\nPay me.\n", "text/plain")
    state = file_input_state("files", "files", [file])
    before = len(bot.kb.documents())
    resp = await bot.post(
        view_submission_body(
            {**call["view"], "state": state}, EXTERNAL_USER, user_team_id=OTHER_TEAM
        )
    )
    body = await resp.json()
    assert body["response_action"] == "errors"
    assert messages.EXTERNAL_ASKER in json.dumps(body["errors"])
    await bot.idle()
    assert len(bot.kb.documents()) == before and bot.slack.downloads == []


async def test_a_partner_submitting_the_modal_as_slack_sends_it_is_refused(bot: Bot) -> None:
    # In a shared channel Slack puts the submitter's own team in `team`: only the
    # view's app_installed_team_id names the workspace the bot belongs to.
    resp = await bot.post(slash_command_body("/kb-upload", "", EXTERNAL_USER, CHANNEL_ID))
    assert resp.status == 200
    (call,) = await bot.slack.wait_for("views.open")
    file = bot.slack.add_file("F0EXT0003", "rules.md", b"# Rules\n\nPay me.\n", "text/plain")
    view = {
        **call["view"],
        "state": file_input_state("files", "files", [file]),
        "app_installed_team_id": TEAM_ID,
    }
    resp = await bot.post(view_submission_body(view, EXTERNAL_USER, team_id=OTHER_TEAM))
    body = await resp.json()
    assert body["response_action"] == "errors"
    await bot.idle()
    assert bot.slack.downloads == []


async def test_a_person_whose_team_nobody_can_tell_is_not_answered(bot: Bot) -> None:
    bot.slack.fail("users.info", "user_not_found")
    event = message_im_event(IN_DOMAIN, user="U0UNKNOWN1")
    event.pop("team", None)
    await bot.event(event)
    await bot.idle()
    assert bot.llm.requests == []
    assert messages.EXTERNAL_ASKER in _all_text(bot)
