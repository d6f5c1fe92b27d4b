"""One person's flood of questions never holds back another person's answer.

Through the real bolt app (signed HTTP events) and the local OpenAI-compatible
server, which here works like a model server with a few parallel slots: it
answers at most ``MODEL_SLOTS`` requests at a time, the others waiting in order
of arrival, and it holds person A's questions until the test releases them.
Person A asks more questions than they may have answered at once; person B's
question, asked after all of them, is answered while A's are still held, and
A's further questions wait their turn behind A's own and are told so.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import pytest

from bot.slack import messages

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import IN_DOMAIN, Bot, BotFactory, mcp_session  # noqa: E402
from tests.servers import DM_CHANNEL_ID, USER_ID, message_im_event  # noqa: E402

OTHER_USER = "U0OTHER001"
OTHER_DM = "D0DMOTHER1"
PER_PERSON = 3  # questions of one person answered at once
MODEL_SLOTS = PER_PERSON + 1  # the model server's parallel slots: one more than that
ASKED_BY_A = 5  # more than PER_PERSON, and than MODEL_SLOTS
WAIT_S = 60.0  # answering on a loaded 2-core machine


def _by_a(messages: list[dict[str, Any]]) -> bool:
    return any("(from A," in str(m.get("content")) for m in messages)


def _notices(bot: Bot, channel: str) -> list[str]:
    """What the bot posted in ``channel`` naming the per-person cap of questions."""
    return [
        str(p.get("text"))
        for m, p in bot.slack.log
        if m == "chat.postMessage"
        and p.get("channel") == channel
        and "KB_MAX_QUESTIONS_PER_USER" in json.dumps(p, ensure_ascii=False)
    ]


async def _until(predicate: Callable[[], bool], what: Callable[[], str]) -> None:
    """Wait, as the bot works, until ``predicate()`` holds; ``what()`` says what it saw."""
    deadline = time.monotonic() + WAIT_S
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(what())
        await asyncio.sleep(0.02)


async def test_a_flood_of_one_persons_questions_never_holds_back_anothers_answer(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(llm_timeout=WAIT_S, llm_deadline=WAIT_S, llm_first_token_timeout=WAIT_S)
    bot.llm.answer_at_once(MODEL_SLOTS)
    bot.llm.hold_completions(_by_a)
    for i in range(ASKED_BY_A):
        await bot.event(message_im_event(f"{IN_DOMAIN} (from A, {i})", user=USER_ID))
    await bot.llm.wait_for_held_completions(1, timeout=WAIT_S)

    def at_the_model() -> int:
        return sum(_by_a(r["messages"]) for r in bot.llm.requests)

    # Every one of A's questions has reached the model or been told to wait.
    await _until(
        lambda: at_the_model() + len(_notices(bot, DM_CHANNEL_ID)) >= ASKED_BY_A,
        lambda: f"{at_the_model()} at the model, told {_notices(bot, DM_CHANNEL_ID)}",
    )
    await bot.event(
        message_im_event(IN_DOMAIN, user=OTHER_USER, channel=OTHER_DM),
    )
    answer = await bot.answer(1, timeout=WAIT_S / 2)  # A's are held for longer

    assert answer["channel"] == OTHER_DM, answer
    assert len(bot.llm.held_completions) == PER_PERSON, "A's questions at the model"
    assert at_the_model() == PER_PERSON
    assert _notices(bot, OTHER_DM) == []  # B is never told to wait for A's load
    told = messages.question_waiting_for_yours(PER_PERSON)
    assert _notices(bot, DM_CHANNEL_ID) == [told] * (ASKED_BY_A - PER_PERSON)

    bot.llm.release_completions()
    await bot.answer(1 + ASKED_BY_A, timeout=WAIT_S)
    await bot.idle(timeout=WAIT_S)
    assert at_the_model() == ASKED_BY_A


async def test_a_persons_questions_wait_for_their_own_on_every_surface_and_for_nobody_elses(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(
        mcp=True,
        max_questions_per_user=1,
        llm_timeout=WAIT_S,
        llm_deadline=WAIT_S,
        llm_first_token_timeout=WAIT_S,
    )
    line = bot.services.engine.askers
    bot.llm.hold_completions(_by_a)
    await bot.event(message_im_event(f"{IN_DOMAIN} (from A, in Slack)", user=USER_ID))
    await bot.llm.wait_for_held_completions(1, timeout=WAIT_S)
    async with (
        mcp_session(bot, "a-agent", USER_ID) as theirs,
        mcp_session(bot, "b-agent", OTHER_USER) as others,
    ):
        asked = {"question": f"{IN_DOMAIN} (from A, through MCP)"}
        waiting = asyncio.create_task(theirs.call_tool("ask_knowledge_base", asked))
        await _until(lambda: line.in_line(USER_ID) == 2, lambda: f"{line.in_line(USER_ID)} in line")
        answered = await others.call_tool("ask_knowledge_base", {"question": IN_DOMAIN})

        assert not answered.is_error, answered
        assert not waiting.done()
        assert [_by_a(r["messages"]) for r in bot.llm.requests] == [True, False]
        bot.llm.release_completions()
        mine = await asyncio.wait_for(waiting, WAIT_S)
    assert not mine.is_error, mine
    assert [_by_a(r["messages"]) for r in bot.llm.requests] == [True, False, True]
    assert line.in_line(USER_ID) == 0
