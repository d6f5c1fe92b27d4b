"""Slack guests read along: an answer a member asks for in a channel is posted there.

The attacker is a guest of the workspace (a single- or multi-channel guest:
``users.info`` ``is_restricted``) in a channel with members of the
organisation. They cannot ask for the documents for everyone themselves; they
wait for a member to ask in the channel and read the answer. Driven through the
real bolt app against the mock Slack Web API: which document's passage reaches
the channel.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient

from bot.app import create_app
from bot.settings import Settings
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import FALCON_Q, IN_DOMAIN, Bot, ingest_fixture_documents  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    USER_ID,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    message_im_event,
)

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


async def test_what_one_replica_heard_counts_on_the_other_at_once(
    tmp_path: Path,
    aiohttp_client: Callable[..., Awaitable[TestClient]],
    settings_for: Callable[..., Settings],
    embedder: Embedder,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
    database_url: str,
) -> None:
    """Two replicas on one store (one SQLite data dir; Postgres with a data dir each). Slack
    tells replica A alone that a guest joined the channel, then that a colleague there was
    made a guest, then that the asker was: replica B's next answers there, and then in the
    asker's DM, hold no document for everyone, though the members, guests and profiles it
    listed before are still within their time."""

    async def replica(name: str) -> tuple[TestClient, Settings]:
        settings = settings_for(
            data_dir=tmp_path / (name if database_url else "kb"), database_url=database_url
        )
        kb = await asyncio.to_thread(KnowledgeBase, settings.index_config(), embedder=embedder)
        if name == "a":
            await asyncio.to_thread(ingest_fixture_documents, kb)
        return await aiohttp_client(create_app(settings, kb=kb)), settings

    started = [await replica("a"), await replica("b")]
    own = frozenset(asyncio.all_tasks())  # both replicas' own tasks, from the start
    a, b = (Bot(client, client.app, slack, llm, settings, own) for client, settings in started)
    elsewhere = "C0ELSEWHERE"
    _guest_in_the_channel(b)  # the workspace has a guest: each replica lists the guests
    slack.set_members(CHANNEL_ID, [USER_ID, COLLEAGUES[0]])
    slack.set_members(elsewhere, [USER_ID, COLLEAGUES[1]])
    for bot, count in ((a, 1), (b, 2)):  # both list the guests and the channel's members
        await bot.event(app_mention_event(IN_DOMAIN, user=USER_ID))
        assert "Employee handbook" in json.dumps((await bot.answer(count))["blocks"])

    # The guest joins the channel; Slack tells replica A.
    slack.set_members(CHANNEL_ID, [USER_ID, COLLEAGUES[0], GUEST])
    await a.event({"type": "member_joined_channel", "user": GUEST, "channel": CHANNEL_ID})
    await a.idle()
    await b.event(app_mention_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" not in json.dumps((await b.answer(3))["blocks"])

    # In another channel B has listed, a colleague is made a guest; Slack tells replica A.
    await b.event(app_mention_event(IN_DOMAIN, user=USER_ID, channel=elsewhere))
    assert "Employee handbook" in json.dumps((await b.answer(4))["blocks"])
    changed = slack.set_user(COLLEAGUES[1])
    changed.update(is_restricted=True)
    await a.event({"type": "user_change", "user": changed})
    await a.idle()
    await b.event(app_mention_event(IN_DOMAIN, user=USER_ID, channel=elsewhere))
    assert "Employee handbook" not in json.dumps((await b.answer(5))["blocks"])
    # B asked Slack nothing more for it: the store told it.
    assert len(slack.calls("users.list")) == 4  # two pages, once per replica

    # The asker is made a guest; Slack tells replica A. What B remembered of them from
    # users.info (five minutes) is asked again: in a DM too they read nothing for everyone.
    await b.event(message_im_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" in json.dumps((await b.answer(6))["blocks"])
    asker = slack.set_user(USER_ID)
    asker.update(is_restricted=True)
    await a.event({"type": "user_change", "user": asker})
    await a.idle()
    await b.event(message_im_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" not in json.dumps((await b.answer(7))["blocks"])


async def test_when_the_store_cannot_say_what_other_replicas_heard_a_guest_is_assumed(
    bot: Bot,
) -> None:
    bot.slack.set_members(CHANNEL_ID, [USER_ID, COLLEAGUES[0]])
    bot.slack.set_user(GUEST).update(is_restricted=True)  # a guest, in another channel
    await bot.event(app_mention_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" in json.dumps((await bot.answer())["blocks"])
    # The shared record of what the replicas heard is damaged: nothing can be read of it.
    with sqlite3.connect(bot.settings.data_dir / "kb.sqlite") as db:
        db.execute("DROP TABLE people_heard")
    await bot.event(app_mention_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" not in json.dumps((await bot.answer(2))["blocks"])
    await bot.event(app_mention_event(FALCON_Q, user=USER_ID))
    assert "Project Falcon" in json.dumps((await bot.answer(3))["blocks"])


async def test_a_member_made_a_guest_reads_no_document_for_everyone_from_the_moment_slack_says_so(
    bot: Bot,
) -> None:
    """users.info is remembered five minutes; Slack's user_change says at once that the person
    asking in a DM was made a guest, and a guest reads no document for everyone."""
    await bot.event(message_im_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" in json.dumps((await bot.answer())["blocks"])
    changed = bot.slack.set_user(USER_ID)
    changed.update(is_restricted=True)
    await bot.event({"type": "user_change", "user": changed})
    await bot.idle()
    await bot.event(message_im_event(IN_DOMAIN, user=USER_ID))
    assert "Employee handbook" not in json.dumps((await bot.answer(2))["blocks"])
