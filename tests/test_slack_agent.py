"""Agent messaging through the real bolt app: the Messages tab, the channel a person views,
and apps still on the assistant view."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bot.slack import messages
from bot.slack.agent import Viewing, suggested_prompts, viewed_channel
from bot.slack.words import words_for

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import FALCON_Q, Bot, BotFactory, everything_posted  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DM_CHANNEL_ID,
    TEAM_ID,
    USER_ID,
    message_im_event,
    slack_ts,
)

EVERYONES_TITLES = {"Employee handbook", "Security policy", "On-call guide"}
OTHER_MEMBER = "U0OTHER001"


def home_opened_event(tab: str = "messages", **fields: Any) -> dict[str, Any]:
    """``app_home_opened``: the person opened one of the app's tabs."""
    return {
        "type": "app_home_opened",
        "user": USER_ID,
        "channel": DM_CHANNEL_ID,
        "tab": tab,
        "event_ts": slack_ts(),
        **fields,
    }


def channel_context(channel: str) -> dict[str, Any]:
    """An ``app_context`` naming ``channel`` as what the person views."""
    return {"entities": [{"type": "slack#/types/channel_id", "value": channel, "team_id": TEAM_ID}]}


def context_changed_event(context: dict[str, Any], user: str = USER_ID) -> dict[str, Any]:
    """``app_context_changed``: the person now views what ``context`` names."""
    return {
        "type": "app_context_changed",
        "user": user,
        "channel": DM_CHANNEL_ID,
        "context": context,
        "event_ts": slack_ts(),
    }


def assistant_thread_started_event(thread_ts: str, viewing: str | None) -> dict[str, Any]:
    """``assistant_thread_started`` of the older assistant view."""
    context: dict[str, Any] = {"team_id": TEAM_ID}
    if viewing:
        context["channel_id"] = viewing
    return {
        "type": "assistant_thread_started",
        "assistant_thread": {
            "user_id": USER_ID,
            "context": context,
            "channel_id": DM_CHANNEL_ID,
            "thread_ts": thread_ts,
        },
        "event_ts": slack_ts(),
    }


def _blocks_text(message: dict[str, Any]) -> str:
    return json.dumps(message.get("blocks", []), ensure_ascii=False) + str(message.get("text", ""))


# ---------------------------------------------------------------- the Messages tab


async def test_messages_tab_greets_a_first_visit_and_suggests_what_the_kb_holds(bot: Bot) -> None:
    await bot.event(home_opened_event())
    (offer,) = await bot.slack.wait_for("assistant.threads.setSuggestedPrompts")
    (greeting,) = bot.slack.calls("chat.postMessage")
    assert greeting["channel"] == DM_CHANNEL_ID and "thread_ts" not in greeting
    assert greeting["text"] == messages.AGENT_GREETING
    methods = bot.slack.methods()
    # Prompts go with the latest message: the greeting must be posted first.
    assert methods.index("chat.postMessage") < methods.index(
        "assistant.threads.setSuggestedPrompts"
    )

    # Agent view: a thread_ts would make Slack ignore the call.
    assert offer["channel_id"] == DM_CHANNEL_ID and "thread_ts" not in offer
    prompts = offer["prompts"]
    # One per document for everyone; Slack takes at most 4 prompts.
    assert len(prompts) == len(EVERYONES_TITLES) <= 4
    assert {p["title"] for p in prompts} == EVERYONES_TITLES
    assert "Falcon" not in json.dumps(prompts), "a channel's documents never show in prompts"
    for prompt in prompts:
        assert prompt["title"] in prompt["message"] and prompt["message"].endswith("?")


async def test_a_suggested_prompt_clicked_is_answered(bot: Bot) -> None:
    await bot.event(home_opened_event())
    (offer,) = await bot.slack.wait_for("assistant.threads.setSuggestedPrompts")
    security = next(p for p in offer["prompts"] if p["title"] == "Security policy")
    await bot.event(message_im_event(security["message"]))
    answer = await bot.answer()
    assert "Security policy" in _blocks_text(answer)
    assert messages.REFUSAL not in answer["text"]


@pytest.mark.parametrize("member", [True, False])
async def test_prompts_add_the_viewed_channels_documents_for_its_members(
    bot: Bot, member: bool
) -> None:
    bot.slack.set_members(CHANNEL_ID, [USER_ID] if member else [OTHER_MEMBER])
    await bot.event(home_opened_event(app_context=channel_context(CHANNEL_ID)))
    (offer,) = await bot.slack.wait_for("assistant.threads.setSuggestedPrompts")
    titles = [p["title"] for p in offer["prompts"]]
    if member:
        assert titles[0] == "Project Falcon" and set(titles[1:]) == EVERYONES_TITLES
    else:
        assert set(titles) == EVERYONES_TITLES


async def test_prompts_leave_out_documents_that_are_not_searched(bot: Bot) -> None:
    assert {
        p["title"] for p in suggested_prompts(bot.kb, words=words_for("en"))
    } == EVERYONES_TITLES
    handbook = bot.kb.find("handbook.md")
    # Indexed with another model: stale, not searched until a reindex.
    bot.kb.store.update_document(handbook.id, embedding_model="another-model")
    assert {
        p["title"] for p in suggested_prompts(bot.kb, words=words_for("en"))
    } == EVERYONES_TITLES - {"Employee handbook"}


async def test_messages_tab_greets_only_once(bot: Bot) -> None:
    await bot.event(home_opened_event())
    await bot.slack.wait_for("assistant.threads.setSuggestedPrompts")
    await bot.event(home_opened_event())
    await bot.slack.wait_for("assistant.threads.setSuggestedPrompts", 2)
    await bot.idle()
    assert len(bot.slack.calls("chat.postMessage")) == 1
    assert len(bot.slack.calls("conversations.history")) == 2


async def test_an_empty_knowledge_base_says_how_to_add_documents(make_bot: BotFactory) -> None:
    bot = await make_bot(documents=False)
    await bot.event(home_opened_event())
    (greeting,) = await bot.slack.wait_for("chat.postMessage")
    assert greeting["text"] == messages.AGENT_GREETING_EMPTY and "/kb-upload" in greeting["text"]
    await bot.idle()
    assert bot.slack.calls("assistant.threads.setSuggestedPrompts") == []


async def test_the_home_tab_is_left_alone(bot: Bot) -> None:
    await bot.event(home_opened_event(tab="home"))
    await bot.idle()
    assert bot.slack.calls("chat.postMessage") == []
    assert bot.slack.calls("assistant.threads.setSuggestedPrompts") == []


async def test_prompts_refused_by_slack_leave_the_greeting(bot: Bot) -> None:
    bot.slack.fail("assistant.threads.setSuggestedPrompts", "missing_scope")
    await bot.event(home_opened_event())
    await bot.idle()
    (greeting,) = bot.slack.calls("chat.postMessage")
    assert greeting["text"] == messages.AGENT_GREETING
    assert messages.ERROR_GENERIC not in everything_posted(bot.slack)


# ---------------------------------------------------------------- the channel being viewed


@pytest.mark.parametrize("members", [[USER_ID, OTHER_MEMBER], [OTHER_MEMBER], None])
async def test_a_dm_question_sees_the_viewed_channels_documents_only_for_its_members(
    bot: Bot, members: list[str] | None
) -> None:
    if members is not None:  # None: the bot cannot see the channel (channel_not_found)
        bot.slack.set_members(CHANNEL_ID, members)
    await bot.event(context_changed_event(channel_context(CHANNEL_ID)))
    await bot.event(message_im_event(FALCON_Q))
    answer = await bot.answer()
    (lookup,) = bot.slack.calls("conversations.members", include_rejected=True)
    assert lookup["channel"] == CHANNEL_ID
    if members is not None and USER_ID in members:
        assert "Project Falcon" in _blocks_text(answer)
        assert "Falcon launches on 14 March" in json.dumps(bot.llm.requests)
    else:
        assert messages.REFUSAL in answer["text"]
        assert "Falcon" not in everything_posted(bot.slack)
        assert bot.llm.requests == []


async def test_the_messages_own_context_counts_over_what_was_remembered(bot: Bot) -> None:
    bot.slack.set_members(CHANNEL_ID, [USER_ID])
    await bot.event(context_changed_event(channel_context(CHANNEL_ID)))
    # The person has since moved to a DM: the message says so itself.
    moved = message_im_event(FALCON_Q)
    moved["app_context"] = channel_context(DM_CHANNEL_ID)
    await bot.event(moved)
    answer = await bot.answer()
    assert messages.REFUSAL in answer["text"]

    # And a message naming the channel needs no remembered context.
    await bot.event(context_changed_event({}))
    asked = message_im_event(FALCON_Q)
    asked["app_context"] = channel_context(CHANNEL_ID)
    await bot.event(asked)
    assert "Project Falcon" in _blocks_text(await bot.answer(2))


async def test_membership_is_asked_once_for_a_burst_of_questions(bot: Bot) -> None:
    bot.slack.set_members(CHANNEL_ID, [USER_ID])
    await bot.event(context_changed_event(channel_context(CHANNEL_ID)))
    await bot.event(message_im_event(FALCON_Q))
    await bot.answer()
    await bot.event(message_im_event(FALCON_Q))
    await bot.answer(2)
    assert len(bot.slack.calls("conversations.members")) == 1


async def test_someone_elses_context_grants_nothing(bot: Bot) -> None:
    bot.slack.set_members(CHANNEL_ID, [USER_ID, OTHER_MEMBER])
    await bot.event(context_changed_event(channel_context(CHANNEL_ID), user=OTHER_MEMBER))
    await bot.event(message_im_event(FALCON_Q))
    answer = await bot.answer()
    assert messages.REFUSAL in answer["text"]
    assert bot.slack.calls("conversations.members") == []


def test_viewed_channel_reads_the_most_relevant_entity() -> None:
    message = {"type": "slack#/types/message_context", "value": {"channel_id": "G0PRIV0001"}}
    canvas = {"type": "slack#/types/canvas_id", "value": "F0CANVAS01"}
    assert viewed_channel(channel_context(CHANNEL_ID)) == CHANNEL_ID
    assert viewed_channel({"entities": [canvas, message]}) == "G0PRIV0001"
    # The most relevant conversation is a DM: it has no documents, and nothing else counts.
    assert (
        viewed_channel({"entities": [*channel_context(DM_CHANNEL_ID)["entities"], message]}) is None
    )
    for nothing in ({}, None, "C0CHAN0001", {"entities": "x"}, {"entities": [{"value": 3}]}):
        assert viewed_channel(nothing) is None


def test_a_viewed_channel_is_forgotten_after_a_while() -> None:
    now = [1000.0]
    viewing = Viewing(ttl_seconds=60, capacity=2, clock=lambda: now[0])
    viewing.see("U1", CHANNEL_ID)
    assert viewing.channel("U1") == CHANNEL_ID and viewing.channel("U2") is None
    now[0] += 61
    assert viewing.channel("U1") is None
    viewing.see("U1", CHANNEL_ID)
    viewing.see("U1", None)  # now viewing something without documents
    assert viewing.channel("U1") is None
    for user in ("U1", "U2", "U3"):
        viewing.see(user, CHANNEL_ID)
    assert viewing.channel("U1") is None and viewing.channel("U3") == CHANNEL_ID


# ---------------------------------------------------------------- the assistant view


async def test_assistant_view_thread_is_greeted_and_its_context_used(bot: Bot) -> None:
    bot.slack.set_members(CHANNEL_ID, [USER_ID])
    thread_ts = slack_ts()
    await bot.event(assistant_thread_started_event(thread_ts, viewing=CHANNEL_ID))
    (offer,) = await bot.slack.wait_for("assistant.threads.setSuggestedPrompts")
    (greeting,) = bot.slack.calls("chat.postMessage")
    assert greeting["thread_ts"] == thread_ts and greeting["channel"] == DM_CHANNEL_ID
    assert offer["thread_ts"] == thread_ts
    # The member views the channel: its document comes first.
    assert [p["title"] for p in offer["prompts"]][0] == "Project Falcon"
    assert {p["title"] for p in offer["prompts"]} == EVERYONES_TITLES | {"Project Falcon"}

    await bot.event(message_im_event(FALCON_Q, thread_ts=thread_ts))
    answer = await bot.answer()
    assert "Project Falcon" in _blocks_text(answer)
    assert bot.slack.calls("chat.postMessage")[1]["thread_ts"] == thread_ts


async def test_assistant_view_context_of_a_non_member_grants_nothing(bot: Bot) -> None:
    bot.slack.set_members(CHANNEL_ID, [OTHER_MEMBER])
    thread_ts = slack_ts()
    await bot.event(assistant_thread_started_event(thread_ts, viewing=None))
    await bot.slack.wait_for("assistant.threads.setSuggestedPrompts")
    changed = {
        "type": "assistant_thread_context_changed",
        "assistant_thread": {
            "user_id": USER_ID,
            "context": {"channel_id": CHANNEL_ID, "team_id": TEAM_ID},
            "channel_id": DM_CHANNEL_ID,
            "thread_ts": thread_ts,
        },
        "event_ts": slack_ts(),
    }
    await bot.event(changed)
    await bot.event(message_im_event(FALCON_Q, thread_ts=thread_ts))
    answer = await bot.answer()
    assert messages.REFUSAL in answer["text"]
    assert bot.slack.calls("conversations.members")
    assert "Falcon" not in everything_posted(bot.slack)
