"""Questions through the real bolt app: mentions, DMs, follow-ups, refusals, outages, retries."""

from __future__ import annotations

import json
import os
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from bot.app import create_app
from bot.slack import messages
from bot.slack.app import BOLT
from bot.slack.questions import strip_mention

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import (  # noqa: E402
    FALCON_Q,
    IN_DOMAIN,
    OUT_OF_DOMAIN,
    PAGER,
    PUBLIC_URL,
    Bot,
    BotFactory,
    everything_posted,
    links,
    make_settings,
)
from tests.servers import (  # noqa: E402
    BOT_USER_ID,
    CHANNEL_ID,
    CLIENT_ID,
    DEFAULT_CLIENT_SECRET,
    DEFAULT_SIGNING_SECRET,
    DM_CHANNEL_ID,
    app_mention_event,
    block_actions_body,
    closed_port_url,
    event_body,
    feedback_action,
    message_im_event,
    slack_headers,
)


async def _open_link(bot: Bot, url: str) -> str:
    """GET a citation link on the bot's server; the fragment stays in the browser."""
    assert url.startswith(PUBLIC_URL + "/d/")
    parts = urlsplit(url)
    resp = await bot.http.get(f"{parts.path}?{parts.query}")
    assert resp.status == 200
    return await resp.text()


def _text_of(message: dict[str, Any]) -> str:
    return json.dumps(message.get("blocks", []), ensure_ascii=False) + message.get("text", "")


# ---------------------------------------------------------------- answers


async def test_mention_gets_a_status_then_the_answer_with_links_to_the_passage(bot: Bot) -> None:
    event = app_mention_event(IN_DOMAIN)
    started = time.perf_counter()
    await bot.event(event)
    assert time.perf_counter() - started < 3, "Slack needs its ack within 3 seconds"

    answer = await bot.answer()
    (status,) = bot.slack.calls("assistant.threads.setStatus")
    assert status["channel_id"] == CHANNEL_ID and status["thread_ts"] == event["ts"]
    assert status["status"] == messages.STATUS_SEARCHING
    # Posting clears the status: nothing is posted before the answer (no placeholder).
    methods = bot.slack.methods()
    assert methods.index("assistant.threads.setStatus") < methods.index("chat.postMessage")
    (posted,) = bot.slack.calls("chat.postMessage")
    assert posted["blocks"] == answer["blocks"]
    assert answer["ts"] in {ts for (_, ts) in bot.slack.messages}
    assert answer["thread_ts"] == event["ts"] and answer["channel"] == CHANNEL_ID
    assert messages.PLACEHOLDER not in everything_posted(bot.slack)
    assert answer["unfurl_links"] is False  # sent as JSON: a boolean

    found = links(answer)
    assert found and found[0][1] == 1
    url = found[0][0]
    assert "#char=" in url
    page = await _open_link(bot, url)
    assert "Submit expense claims within 30 days" in page
    assert "Employee handbook" in json.dumps(answer["blocks"])

    (request,) = bot.llm.requests
    assert IN_DOMAIN in json.dumps(request["messages"])
    assert "<@" not in json.dumps(request["messages"][-1]), "the bot mention is stripped"


async def test_direct_message_is_answered_in_the_dm(bot: Bot) -> None:
    event = message_im_event("How often are API keys rotated?")
    await bot.event(event)
    answer = await bot.answer()
    assert answer["channel"] == DM_CHANNEL_ID
    assert links(answer)
    assert "Security policy" in json.dumps(answer["blocks"])


async def test_dm_only_sees_documents_for_everyone(bot: Bot) -> None:
    await bot.event(message_im_event(FALCON_Q))
    answer = await bot.answer()
    assert messages.REFUSAL in answer["text"]
    assert bot.llm.requests == []


async def test_channel_mention_sees_that_channels_documents(bot: Bot) -> None:
    await bot.event(app_mention_event(FALCON_Q))
    answer = await bot.answer()
    assert "Project Falcon" in json.dumps(answer["blocks"])
    assert len(bot.llm.requests) == 1


async def test_follow_up_in_thread_sends_the_earlier_turn_as_history(bot: Bot) -> None:
    first = app_mention_event(IN_DOMAIN)
    await bot.event(first)
    await bot.answer()

    # A reply in the thread without a mention (message.channels, when subscribed).
    follow = message_im_event(
        "And what about conference tickets?", channel=CHANNEL_ID, thread_ts=first["ts"]
    )
    follow["channel_type"] = "channel"
    await bot.event(follow)
    await bot.answer(2)

    second = bot.llm.requests[1]["messages"]
    earlier = [m for m in second[:-1] if m["role"] == "user"]
    assert any(IN_DOMAIN in m["content"] for m in earlier)
    assert bot.slack.calls("chat.postMessage")[1]["thread_ts"] == first["ts"]


async def test_dm_thread_follow_up_uses_history(bot: Bot) -> None:
    first = message_im_event(IN_DOMAIN)
    await bot.event(first)
    await bot.answer()
    await bot.event(message_im_event("And conference tickets?", thread_ts=first["ts"]))
    await bot.answer(2)
    assert any(IN_DOMAIN in m["content"] for m in bot.llm.requests[1]["messages"][:-1])
    # In a DM thread the assistant status is set too (refused outside assistant threads; harmless).
    assert bot.slack.calls("assistant.threads.setStatus")


async def test_channel_messages_outside_the_bots_threads_are_ignored(bot: Bot) -> None:
    stray = message_im_event("random chatter", channel=CHANNEL_ID, thread_ts="1700000000.000100")
    stray["channel_type"] = "channel"
    await bot.event(stray)
    top = message_im_event("top level chatter", channel=CHANNEL_ID)
    top["channel_type"] = "channel"
    await bot.event(top)
    await bot.idle()
    assert bot.slack.calls("chat.postMessage") == []


async def test_empty_mention_gets_help_not_a_model_call(bot: Bot) -> None:
    await bot.event(app_mention_event(""))
    (help_msg,) = await bot.slack.wait_for("chat.postMessage")
    assert "knowledge base" in help_msg["text"]
    assert bot.llm.requests == []


# ---------------------------------------------------------------- refusal and outages


async def test_refusal_never_calls_the_model(bot: Bot) -> None:
    await bot.event(app_mention_event(OUT_OF_DOMAIN))
    answer = await bot.answer()
    assert bot.llm.requests == []
    assert "nothing on this" in answer["text"] and "/kb-upload" in answer["text"]
    assert links(answer) == []


@pytest.mark.parametrize("failure", ["closed_port", "http_500", "timeout"])
async def test_model_unavailable_shows_marked_evidence_with_links(
    make_bot: BotFactory, failure: str
) -> None:
    overrides: dict[str, Any] = {}
    if failure == "closed_port":
        overrides["openai_base_url"] = closed_port_url()
    if failure == "timeout":
        overrides["llm_timeout"] = 0.5
    bot = await make_bot(**overrides)
    if failure == "http_500":
        bot.llm.fail_with(500)
    if failure == "timeout":
        bot.llm.delay(5)

    await bot.event(app_mention_event(IN_DOMAIN))
    answer = await bot.answer()
    text = _text_of(answer)
    assert "No answer generated" in text and "here is what the knowledge base says" in text
    found = links(answer)
    assert found
    assert "Submit expense claims within 30 days" in await _open_link(bot, found[0][0])
    assert "Traceback" not in everything_posted(bot.slack)


async def test_redelivered_event_is_answered_once(bot: Bot) -> None:
    event = app_mention_event(IN_DOMAIN)
    body = event_body(event, event_id="Ev0DUPLICATE1")
    first = await bot.post(body)
    again = await bot.post(body, retry_num=1)
    assert first.status == 200 and again.status == 200
    await bot.answer()
    await bot.idle()
    assert len(bot.slack.calls("chat.postMessage")) == 1
    assert len(bot.llm.requests) == 1


async def test_streamed_answer_updates_the_placeholder_at_most_once_per_interval(bot: Bot) -> None:
    bot.llm.set_reply(lambda _: " ".join(["Claims are due within thirty days"] * 30) + " [1].")
    # Posted, then edited: native streams are tests/test_slack_streaming.py's.
    bot.services.streaming.enabled = False
    await bot.event(app_mention_event(IN_DOMAIN))
    await bot.answer()
    await bot.idle()
    # The local model streams everything at once: well within one interval, so no
    # text in progress is shown, and the answer is posted once, whole.
    assert bot.slack.calls("chat.update") == []
    assert len(bot.slack.calls("chat.postMessage")) == 1

    bot.services.conversation.stream_update_seconds = 0.0
    await bot.event(app_mention_event(IN_DOMAIN))
    updates = await bot.slack.wait_for("chat.update", 3, timeout=15)
    # The first text is posted (ending the status), then edited as it grows.
    first = bot.slack.calls("chat.postMessage")[1]
    assert messages.WRITING in _text_of(first) and first["text"].startswith("Claims")
    assert any(messages.WRITING in _text_of(u) for u in updates[1:])


# ---------------------------------------------------------------- escaping


async def test_mentions_and_links_from_documents_and_model_are_escaped(bot: Bot) -> None:
    bot.llm.set_reply(
        lambda _: "Write <!here> and <@U999> then <https://evil.example|click> & go [1]."
    )
    await bot.event(app_mention_event(PAGER))
    answer = await bot.answer()
    posted = everything_posted(bot.slack)
    for forbidden in ("<!channel>", "<!here>", "<@U123>", "<@U999>", "<https://evil.example"):
        assert forbidden not in posted
    blocks = json.dumps(answer["blocks"])
    assert "&lt;!here&gt;" in blocks and "&lt;!channel&gt;" in blocks and "&lt;@U123&gt;" in blocks
    assert "&lt;!here&gt;" in answer["text"]
    assert all(url.startswith(PUBLIC_URL) for url, _ in links(answer))


async def test_evidence_from_documents_is_escaped(make_bot: BotFactory) -> None:
    bot = await make_bot(openai_base_url=closed_port_url())
    await bot.event(app_mention_event(PAGER))
    answer = await bot.answer()
    posted = everything_posted(bot.slack)
    assert "<!channel>" not in posted and "<@U123>" not in posted
    assert (
        "&lt;!channel&gt;" in json.dumps(answer["blocks"]) and "&lt;!channel&gt;" in answer["text"]
    )


# ---------------------------------------------------------------- feedback and errors


async def test_feedback_click_is_stored_and_acknowledged(bot: Bot) -> None:
    await bot.event(app_mention_event(IN_DOMAIN))
    answer = await bot.answer()
    (feedback,) = [b for b in answer["blocks"] if b["type"] == "context_actions"]
    value = feedback["elements"][0]["negative_button"]["value"]
    body = block_actions_body(
        [feedback_action("kb_feedback", value)],
        # The clicked message as Slack sends it: the answer, in the question's thread.
        message=bot.slack.messages[(answer["channel"], answer["ts"])],
        thread_ts=answer["thread_ts"],
        response_url=bot.slack.response_url("fb"),
    )
    resp = await bot.post(body)
    assert resp.status == 200
    (ack,) = await bot.slack.wait_for_responses(1, "fb")
    assert ack["text"] == messages.FEEDBACK_THANKS_NEGATIVE
    rows = list(bot.kb.store.db.query("SELECT query_id, value, user FROM feedback"))
    query_id = int(value.split(":")[1])
    assert rows == [{"query_id": query_id, "value": -1, "user": "U0USER0001"}]
    assert bot.kb.queries.get(query_id).question == IN_DOMAIN


async def test_listener_failure_gets_a_friendly_reply_not_a_trace(bot: Bot) -> None:
    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("secret internal detail")

    bot.services.engine.ask = broken  # type: ignore[method-assign]
    await bot.event(app_mention_event(IN_DOMAIN))
    (notice,) = await bot.slack.wait_for("chat.postMessage", timeout=15)
    assert notice["text"] == messages.ERROR_GENERIC
    assert "secret internal detail" not in everything_posted(bot.slack)


# ---------------------------------------------------------------- signatures and configuration


async def test_bad_signature_and_stale_timestamp_are_rejected(bot: Bot) -> None:
    body = event_body(app_mention_event(IN_DOMAIN))
    assert (await bot.post(body, secret="not-the-secret")).status == 401
    assert (await bot.post(body, timestamp=int(time.time()) - 6 * 60)).status == 401
    headers = slack_headers("x", body)
    del headers["X-Slack-Signature"]
    assert (await bot.http.post("/slack/events", data=body, headers=headers)).status == 401
    await bot.idle()
    assert bot.slack.calls("chat.postMessage") == []


async def test_without_slack_settings_the_viewer_and_health_still_run(
    aiohttp_client: Any, index_dir: Any, embedder: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from index.knowledge_base import KnowledgeBase

    settings = make_settings(data_dir=index_dir)
    with caplog.at_level("WARNING"):
        app = create_app(settings, kb=KnowledgeBase(settings.index_config(), embedder=embedder))
    assert "SLACK_BOT_TOKEN" in caplog.text and "SLACK_SIGNING_SECRET" in caplog.text
    http = await aiohttp_client(app)
    assert (await http.get("/healthz")).status == 200
    resp = await http.post("/slack/events", data=b"{}")
    assert resp.status == 503 and "SLACK_SIGNING_SECRET" in await resp.text()


def test_strip_mention() -> None:
    assert strip_mention(f"<@{BOT_USER_ID}>  what is  up? ", BOT_USER_ID) == "what is up?"
    assert strip_mention(f"hey <@{BOT_USER_ID}|kb> ask <@U2>", BOT_USER_ID) == "hey ask <@U2>"
    assert strip_mention("<@U1> question", None) == "question"


# Slack's published example (docs: "Verifying requests from Slack").
VECTOR_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
VECTOR_TIMESTAMP = 1531420618
VECTOR_BODY = (
    "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V"
    "&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text="
    "&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
    "&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
VECTOR_SIGNATURE = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"


async def test_the_app_accepts_slacks_published_signature_example(
    make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from slack_sdk.signature import Clock

    bot = await make_bot(slack_signing_secret=VECTOR_SECRET)
    monkeypatch.setattr(Clock, "now", lambda self: VECTOR_TIMESTAMP + 30.0)
    headers = {
        "X-Slack-Request-Timestamp": str(VECTOR_TIMESTAMP),
        "X-Slack-Signature": VECTOR_SIGNATURE,
        "Content-Type": "application/x-www-form-urlencoded",
    }
    resp = await bot.http.post("/slack/events", data=VECTOR_BODY.encode(), headers=headers)
    # Verified, then unhandled: the bot has no /webhook-collect command.
    assert resp.status == 404
    headers["X-Slack-Signature"] = VECTOR_SIGNATURE[:-1] + "0"
    resp = await bot.http.post("/slack/events", data=VECTOR_BODY.encode(), headers=headers)
    assert resp.status == 401


@pytest.mark.parametrize("secret", ["", DEFAULT_SIGNING_SECRET])
async def test_socket_mode_accepts_no_http_events(make_bot: BotFactory, secret: str) -> None:
    # With the signing secret set too (as a manifest's comments may suggest),
    # a correctly signed HTTP event must still find no door.
    bot = await make_bot(slack_app_token="xapp-test", slack_signing_secret=secret)
    body = event_body(app_mention_event(IN_DOMAIN))
    resp = await bot.http.post("/slack/events", data=body, headers=slack_headers(secret, body))
    assert resp.status == 404
    await bot.idle()
    assert bot.slack.calls("chat.postMessage") == []
    ready = await (await bot.http.get("/readyz")).json()
    assert ready["slack"] == "socket"


async def test_oauth_credentials_in_the_environment_serve_sign_in_and_never_reach_bolt(
    make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Set in the environment for the viewer's sign-in, where bolt would find them too
    # and become a multi-workspace OAuth app that ignores SLACK_BOT_TOKEN.
    monkeypatch.setenv("SLACK_CLIENT_ID", CLIENT_ID)
    monkeypatch.setenv("SLACK_CLIENT_SECRET", DEFAULT_CLIENT_SECRET)
    bot = await make_bot(viewer_auth="slack")
    assert bot.app[BOLT].oauth_flow is None
    assert os.environ["SLACK_CLIENT_ID"] == CLIENT_ID, "the environment is left as it was"
    ready = await (await bot.http.get("/readyz")).json()
    assert ready["slack"] == "http" and ready["viewer_auth"] == "slack"
    await bot.event(app_mention_event(IN_DOMAIN))
    assert links(await bot.answer()), "answered with the bot token, as a one-workspace app"
