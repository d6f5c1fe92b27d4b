"""Slack itself as knowledge, attacked from outside: Real-time Search results as hostile input.

What Slack's search finds was written by any member, a guest or a partner
organisation, and the answer it feeds is read by people who may not read it.
Through the signed-event harness and the mock Slack API's Real-time Search
(``tests/slack_workspace.py``).
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import Any

import pytest

pytest.register_assert_rewrite("tests.conftest_bot")

from bot.slack.search import MAX_TEXT_CHARS, messages  # noqa: E402
from tests.conftest_bot import BotFactory, everything_posted  # noqa: E402
from tests.servers import (  # noqa: E402
    MockSlackAPI,
    message_im_event,
)
from tests.slack_workspace import Message, Workspace, company_workspace  # noqa: E402

DEPLOY_FREEZE = "Is there a production deploy freeze over the holidays?"
FREEZE_REPLY = "no production deploys from 20 December to 3 January"
OTHER_TEAM = "T0OTHERORG"
PARTNER = "U0PARTNER1"
PERMALINK = "https://kbtest.slack.com/archives/C0GENERAL1/p1700000000000100"


@pytest.fixture
def workspace(slack: MockSlackAPI) -> Workspace:
    ws = company_workspace()
    slack.workspace = ws
    return ws


def freeze_reply(ws: Workspace) -> Message:
    return next(m for m in ws.messages if FREEZE_REPLY in m.text)


def replace_freeze_reply(ws: Workspace, **changes: Any) -> Message:
    old = freeze_reply(ws)
    new = dataclasses.replace(old, **changes)
    ws.messages[ws.messages.index(old)] = new
    return new


def cite_every_source(chat: list[dict[str, Any]]) -> str:
    prompt = chat[-1]["content"]
    numbers = re.findall(r'<source n="(\d+)">', prompt)
    return "Here it is " + "".join(f"[{n}]" for n in numbers) + "."


# ---------------------------------------------------------------- who is searched for


async def test_a_person_of_another_organisation_is_never_shown_this_workspaces_public_channels(
    make_bot: BotFactory, workspace: Workspace
) -> None:
    """With ``KB_ALLOW_EXTERNAL`` a partner is answered; without the event's action_token
    Slack is searched with the bot's token, in this workspace's public channels, which a
    person of another organisation does not read."""
    bot = await make_bot(slack_search=True, allow_external=True)
    bot.slack.set_user(PARTNER)["team_id"] = OTHER_TEAM
    await bot.event(message_im_event(DEPLOY_FREEZE, user=PARTNER, team=OTHER_TEAM))
    await bot.answer()
    await bot.idle()
    shown = everything_posted(bot.slack) + json.dumps(bot.llm.requests)
    assert "20 December" not in shown
    assert bot.slack.calls("assistant.search.context") == []


# ---------------------------------------------------------------- what a result may hold


def result(**fields: Any) -> dict[str, Any]:
    base = {
        "author_user_id": "U0BOB00001",
        "team_id": "T0TEAM0001",
        "channel_id": "C0GENERAL1",
        "message_ts": "1700000000.000100",
        "content": "The freeze starts on 20 December.",
        "is_author_bot": False,
        "permalink": PERMALINK,
    }
    return {**base, **fields}


@pytest.mark.parametrize(
    "fields",
    [
        {"permalink": None},
        {"permalink": ["https://kbtest.slack.com/x"]},
        {"permalink": "javascript:alert(1)"},
        {"permalink": "http://kbtest.slack.com/archives/C0GENERAL1/p1"},
        {"channel_id": ["C0GENERAL1", "C0SECRET01"]},
        {"channel_id": None},
        {"author_user_id": {"id": "U0BOB00001"}},
        {"content": None},
        {"content": {"text": "nested"}},
        {"content": ""},
    ],
    ids=repr,
)
def test_a_result_missing_what_opens_or_attributes_it_is_left_out(fields: dict[str, Any]) -> None:
    assert messages({"results": {"messages": [result(**fields), result()]}}) == messages(
        {"results": {"messages": [result()]}}
    )
    assert len(messages({"results": {"messages": [result()]}})) == 1


@pytest.mark.parametrize(
    "body", [None, [], "results", {"results": []}, {"results": {"messages": {}}}]
)
def test_an_answer_of_another_shape_finds_nothing(body: Any) -> None:
    assert messages(body) == []


def test_a_huge_message_is_quoted_cut_and_a_numeric_time_is_a_time() -> None:
    (found,) = messages(
        {"results": {"messages": [result(content="x" * 100_000, message_ts=1.7e9)]}}
    )
    assert len(found.text) == MAX_TEXT_CHARS and found.posted == 1.7e9
