"""The steps shown while an answer is worked on: task cards in the answer's native stream.

Through the real bolt app (signed HTTP events) against the mock Slack Web API,
which checks every chunk the way Slack's streaming reference describes them,
and the local model server. Steps belong to agent sessions (an app declared as
an agent: its Messages tab and channel threads alike).
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit

import pytest
from slack_sdk.errors import SlackApiError
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import messages
from bot.slack.blocks import FEEDBACK_ACTION_ID, step_chunks
from bot.slack.words import words_for
from core.answer import Step, StepKind, StepSource

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import IN_DOMAIN, OUT_OF_DOMAIN, PUBLIC_URL, Bot, links  # noqa: E402
from tests.servers import (  # noqa: E402
    DM_CHANNEL_ID,
    MockSlackAPI,
    message_im_event,
    slack_ts,
)

LONG_ANSWER = " ".join(["Claims are due within thirty days of the purchase."] * 4) + " [1]."


def as_agent(bot: Bot) -> None:
    """An agent app; the model writes a word every 20 ms, streams keep up with it."""
    bot.slack.agent_app = True
    bot.llm.set_reply(lambda _: LONG_ANSWER)
    bot.llm.trickle(0.02)
    bot.services.streaming.append_seconds = 0.05
    bot.services.streaming.first_text_seconds = 0.0


def stream_calls(bot: Bot) -> list[tuple[str, dict[str, Any]]]:
    return [(m, p) for m, p in bot.slack.log if m.startswith("chat.") and "Stream" in m]


def tasks(bot: Bot) -> list[dict[str, Any]]:
    """Every task_update chunk the streams sent, in order."""
    return [
        c
        for _, p in stream_calls(bot)
        for c in p.get("chunks") or []
        if c.get("type") == "task_update"
    ]


async def test_an_answer_shows_its_steps_with_the_documents_linked(bot: Bot) -> None:
    as_agent(bot)
    event = message_im_event(IN_DOMAIN)
    await bot.event(event)
    final = await bot.answer()
    await bot.idle()

    calls = stream_calls(bot)
    method, started = calls[0]
    # The stream starts with the first step, before any text: a plan with its title.
    assert method == "chat.startStream" and "markdown_text" not in started
    assert started["task_display_mode"] == "plan"
    assert started["thread_ts"] == str(event["ts"])
    plan, searching = started["chunks"]
    assert plan == {"type": "plan_update", "title": words_for("en").STEPS_TITLE}
    assert searching["title"] == messages.PLACEHOLDER and searching["status"] == "in_progress"

    steps = [(t["id"], t["status"], t["title"]) for t in tasks(bot)]
    found_title = words_for("en").step_found(1, 1)
    assert steps == [
        ("search", "in_progress", messages.PLACEHOLDER),
        ("search", "complete", found_title),
        ("write", "in_progress", messages.WRITING),
    ]
    assert found_title == "Found 1 passage in one document"
    # The documents behind the answer, each with the signed link the answer cites.
    (found,) = [t for t in tasks(bot) if t["status"] == "complete"]
    (source,) = found["sources"]
    assert source["type"] == "url" and source["text"] == "Employee handbook"
    assert source["url"] in {url for url, _ in links(final)}
    # A real signed link: the viewer opens it.
    parts = urlsplit(source["url"])
    assert source["url"].startswith(PUBLIC_URL + "/d/") and parts.query
    opened = await bot.http.get(f"{parts.path}?{parts.query}")
    assert opened.status == 200

    # Steps come first, then the text in the same stream; then stopped, rendered in place.
    kinds = [("chunks" in p, "markdown_text" in p) for m, p in calls if m != "chat.stopStream"]
    first_text = kinds.index((False, True))
    # (what was found and writing share one append: the appends are the words' budget too)
    assert all(chunks for chunks, _ in kinds[:first_text]) and first_text == 2
    assert not any(chunks for chunks, _ in kinds[first_text:])
    streamed = "".join(str(p.get("markdown_text", "")) for _, p in calls)
    assert LONG_ANSWER.startswith(streamed) and streamed
    (stopped,) = bot.slack.calls("chat.stopStream")
    assert stopped["session_status"] == "active"
    assert final["ts"] == stopped["ts"]
    assert bot.slack.messages[(DM_CHANNEL_ID, final["ts"])]["thread_ts"] == str(event["ts"])
    assert FEEDBACK_ACTION_ID in json.dumps(final["blocks"])
    assert bot.slack.sessions[(DM_CHANNEL_ID, str(event["ts"]))]["status"] == "active"


async def test_a_refusal_shows_the_search_and_never_a_writing_step(bot: Bot) -> None:
    as_agent(bot)
    await bot.event(message_im_event(OUT_OF_DOMAIN))
    final = await bot.answer()
    await bot.idle()
    steps = [(t["id"], t["status"], t["title"]) for t in tasks(bot)]
    assert steps == [
        ("search", "in_progress", messages.PLACEHOLDER),
        ("search", "complete", words_for("en").STEP_NOTHING_FOUND),
    ]
    assert bot.llm.requests == []
    assert final["text"] == messages.REFUSAL
    assert not any("markdown_text" in p for _, p in stream_calls(bot))


async def test_steps_refused_fall_back_to_the_status_and_are_not_asked_again(bot: Bot) -> None:
    as_agent(bot)
    bot.slack.fail("chat.startStream", "invalid_arguments", times=1)
    for n in (1, 2):
        await bot.event(message_im_event(IN_DOMAIN))
        answer = await bot.answer(n)
        await bot.idle()
        assert FEEDBACK_ACTION_ID in json.dumps(answer["blocks"])
    (refused,) = [p for m, p, _ in bot.slack.rejected if m == "chat.startStream"]
    assert refused["chunks"], "the refused start carried the steps"
    assert tasks(bot) == [], "no step was shown"
    # The session showed the progress, and both answers streamed their text as before.
    opened = [
        c for c in bot.slack.calls("agents.sessions.setStatus") if c["status"] == "processing"
    ]
    assert len(opened) == 2
    assert bot.slack.calls("assistant.threads.setStatus") == []
    starts = bot.slack.calls("chat.startStream")
    assert len(starts) == 2 and all(s["markdown_text"] and "chunks" not in s for s in starts)


async def test_a_step_refused_midway_leaves_the_answer_to_the_edits(bot: Bot) -> None:
    as_agent(bot)
    bot.slack.fail("chat.appendStream", "invalid_arguments", times=1)
    event = message_im_event(IN_DOMAIN)
    await bot.event(event)
    await bot.idle()  # (the edits while writing are not the answer: wait for the end)
    stops = bot.slack.calls("chat.stopStream")
    final = bot.slack.messages[(DM_CHANNEL_ID, stops[0]["ts"])]
    assert FEEDBACK_ACTION_ID in json.dumps(final["blocks"])
    assert [s["session_status"] for s in stops] == ["processing"], "Stop stays while it works"
    assert final["ts"] == stops[0]["ts"], "the stream's message carries the answer"
    assert not bot.slack.calls("chat.appendStream"), "no more appends after the refusal"
    assert bot.slack.sessions[(DM_CHANNEL_ID, str(event["ts"]))]["status"] == "active"


async def test_steps_speak_the_askers_language(bot: Bot) -> None:
    as_agent(bot)
    bot.slack.set_user("U0FRANCAIS", locale="fr-FR")
    await bot.event(message_im_event(IN_DOMAIN, user="U0FRANCAIS"))
    await bot.answer()
    await bot.idle()
    french = words_for("fr")
    titles = [t["title"] for t in tasks(bot)]
    assert titles == [french.PLACEHOLDER, french.step_found(1, 1), french.WRITING]
    assert titles[1] != words_for("en").step_found(1, 1)


@pytest.mark.parametrize(
    ("lang", "counts", "expected"),
    [
        ("cs", (1, 1), "Nalezena 1 pasáž v jednom dokumentu"),
        ("cs", (3, 1), "Nalezeny 3 pasáže v jednom dokumentu"),
        ("cs", (5, 1), "Nalezeno 5 pasáží v jednom dokumentu"),
        ("cs", (3, 2), "Nalezeny 3 pasáže ve 2 dokumentech"),
        ("cs", (5, 5), "Nalezeno 5 pasáží v 5 dokumentech"),
        ("ro", (3, 20), "Am găsit 3 pasaje în 20 de documente"),
        ("en", (4, 2), "Found 4 passages in 2 documents"),
        ("ro", (2, 1), "Am găsit 2 pasaje într-un document"),
    ],
)
def test_the_found_step_counts_in_each_language(
    lang: str, counts: tuple[int, int], expected: str
) -> None:
    assert words_for(lang).step_found(*counts) == expected


# ---------------------------------------------------------------- the mock checks chunks


@pytest.mark.parametrize(
    "chunk",
    [
        {"type": "task_update", "id": "t", "title": "x", "status": "done"},
        {"type": "task_update", "id": "t", "status": "complete"},
        {
            "type": "task_update",
            "id": "t",
            "title": "x",
            "status": "complete",
            "sources": [{"type": "url", "text": "a", "url": "javascript:alert(1)"}],
        },
        {"type": "plan_update"},
        {"type": "reasoning", "text": "x"},
    ],
)
async def test_the_mock_refuses_chunks_slack_would_refuse(chunk: dict[str, Any]) -> None:
    async with MockSlackAPI() as slack:
        client = AsyncWebClient(token=slack.bot_token, base_url=slack.api_url)
        with pytest.raises(SlackApiError) as refused:
            await client.chat_startStream(
                channel=DM_CHANNEL_ID, thread_ts=slack_ts(), chunks=[chunk]
            )
        assert refused.value.response["error"] == "invalid_arguments"
        good = {"type": "task_update", "id": "t", "title": "x", "status": "complete"}
        started = await client.chat_startStream(
            channel=DM_CHANNEL_ID, thread_ts=slack_ts(), chunks=[good]
        )
        assert started["ok"]


def test_hostile_document_names_stay_one_short_line_in_the_found_step() -> None:
    hostile = "<!channel> *bold* `code`\x07\x1b[31m\u202e\r\nsecond line " + "x" * 300
    sources = tuple(StepSource(f"{hostile}{n}", f"{PUBLIC_URL}/d/{n}?s=1") for n in range(12))
    (task,) = [
        c.to_dict()
        for c in step_chunks(Step(StepKind.FOUND, 12, 12, sources), words=words_for("en"))
    ]
    assert len(task["sources"]) == 8  # a card names a handful of documents, not all
    for source in task["sources"]:
        label = source["text"]
        # Every name here is longer than a label: each is cut to exactly 80, marked as cut.
        assert len(label) == 80 and label.endswith("…")
        assert not any(ord(ch) < 32 or ch == "\u202e" for ch in label)
        assert source["url"].startswith(PUBLIC_URL + "/d/")
    assert task["title"] == words_for("en").step_found(12, 12)
