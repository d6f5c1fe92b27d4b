"""The test servers speak the real protocols: checked with the real clients.

If these pass, a failure elsewhere that involves ``tests/servers.py`` is the
product's fault, not the harness's.
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer
from openai.types.chat import ChatCompletionMessageParam
from slack_bolt.async_app import AsyncApp
from slack_bolt.context.ack.async_ack import AsyncAck
from slack_bolt.context.respond.async_respond import AsyncRespond
from slack_bolt.context.say.async_say import AsyncSay
from slack_sdk.errors import SlackApiError
from slack_sdk.http_retry.builtin_async_handlers import AsyncRateLimitErrorRetryHandler
from slack_sdk.signature import Clock, SignatureVerifier
from slack_sdk.web.async_client import AsyncWebClient
from slack_sdk.webhook.async_client import AsyncWebhookClient

from tests.servers import (
    BOT_USER_ID,
    CHANNEL_ID,
    DEFAULT_SIGNING_SECRET,
    USER_ID,
    MockSlackAPI,
    OpenAICompatServer,
    _block_errors,
    _view_errors,
    app_mention_event,
    block_actions_body,
    button_action,
    closed_port_url,
    event_body,
    file_input_state,
    file_share_event,
    message_im_event,
    sign_slack_request,
    slack_headers,
    slack_ts,
    slash_command_body,
    view_submission_body,
)

BLOCKS: list[dict[str, Any]] = [
    {"type": "section", "text": {"type": "mrkdwn", "text": "Answer [1]"}},
    {"type": "context", "elements": [{"type": "mrkdwn", "text": "<http://x/d/1|Doc>"}]},
]


def _client(slack: MockSlackAPI, **kwargs: Any) -> AsyncWebClient:
    return AsyncWebClient(token=slack.bot_token, base_url=slack.api_url, **kwargs)


# ----------------------------------------------------------------- Slack Web API


async def test_post_message_with_blocks_is_recorded_decoded() -> None:
    async with MockSlackAPI() as slack:
        client = _client(slack)
        first = await client.chat_postMessage(channel=CHANNEL_ID, text="fallback", blocks=BLOCKS)
        second = await client.chat_postMessage(
            channel=CHANNEL_ID, text="again", thread_ts=first["ts"]
        )

        assert first["ok"] and first["channel"] == CHANNEL_ID
        assert float(second["ts"]) > float(first["ts"])
        assert first["message"]["blocks"] == BLOCKS
        calls = slack.calls("chat.postMessage")
        assert [c["text"] for c in calls] == ["fallback", "again"]
        assert calls[0]["blocks"] == BLOCKS
        assert "token" not in calls[0]
        assert calls[1]["thread_ts"] == first["ts"]


async def test_form_encoded_json_fields_are_decoded() -> None:
    async with MockSlackAPI() as slack:
        client = _client(slack)
        # The form path of the SDK, as used by methods that do not send JSON.
        await client.api_call(
            "chat.postMessage",
            data={"channel": CHANNEL_ID, "text": "[1] stays text", "blocks": json.dumps(BLOCKS)},
        )
        (call,) = slack.calls("chat.postMessage")
        assert call["blocks"] == BLOCKS
        assert call["text"] == "[1] stays text"


async def test_update_edits_the_posted_message() -> None:
    async with MockSlackAPI() as slack:
        client = _client(slack)
        posted = await client.chat_postMessage(channel=CHANNEL_ID, text="Thinking...")
        await client.chat_update(channel=CHANNEL_ID, ts=posted["ts"], text="Done", blocks=BLOCKS)
        assert slack.messages[(CHANNEL_ID, posted["ts"])]["text"] == "Done"

        with pytest.raises(SlackApiError) as err:
            await client.chat_update(channel="C0OTHER", ts=posted["ts"], text="x")
        assert err.value.response["error"] == "message_not_found"


async def test_block_kit_limits_are_enforced_like_slack() -> None:
    async with MockSlackAPI() as slack:
        client = _client(slack)
        too_long = [{"type": "section", "text": {"type": "mrkdwn", "text": "x" * 3001}}]
        with pytest.raises(SlackApiError) as err:
            await client.chat_postMessage(channel=CHANNEL_ID, text="t", blocks=too_long)
        assert err.value.response["error"] == "invalid_blocks"
        too_many = [{"type": "divider"}] * 51
        with pytest.raises(SlackApiError):
            await client.chat_postMessage(channel=CHANNEL_ID, text="t", blocks=too_many)
        assert slack.calls("chat.postMessage") == []
        assert len(slack.calls("chat.postMessage", include_rejected=True)) == 2


def _text(text: str, kind: str = "mrkdwn") -> dict[str, Any]:
    return {"type": kind, "text": text}


def _button(label: str = "Go", value: str = "1") -> dict[str, Any]:
    return {"type": "button", "action_id": "a", "text": _text(label, "plain_text"), "value": value}


def _section(text: str = "ok") -> dict[str, Any]:
    return {"type": "section", "text": _text(text)}


# Every block a limit breaks: those slack_sdk checks, then those the mock asserts itself.
_BROKEN_BLOCKS: dict[str, list[Any]] = {
    "section text over 3000": [_section("x" * 3001)],
    "section of neither text nor fields": [{"type": "section"}],
    "more than 10 fields": [{"type": "section", "fields": [_text("f")] * 11}],
    "header over 150": [{"type": "header", "text": _text("x" * 151, "plain_text")}],
    "context of 11 elements": [{"type": "context", "elements": [_text("c")] * 11}],
    "actions of 26 buttons": [{"type": "actions", "elements": [_button()] * 26}],
    "context_actions of 6": [
        {
            "type": "context_actions",
            "elements": [
                {
                    "type": "feedback_buttons",
                    "action_id": "f",
                    "positive_button": {"text": _text("+", "plain_text"), "value": "p"},
                    "negative_button": {"text": _text("-", "plain_text"), "value": "n"},
                }
            ]
            * 6,
        }
    ],
    "block_id over 255": [{**_section(), "block_id": "b" * 256}],
    "button text over 75": [{"type": "actions", "elements": [_button("x" * 76)]}],
    "markdown block over 12000": [{"type": "markdown", "text": "x" * 12001}],
    "51 blocks in a message": [{"type": "divider"}] * 51,
    "empty section text": [_section("")],
    "field over 2000": [{"type": "section", "fields": [_text("x" * 2001)]}],
    "duplicate block_id": [{**_section(), "block_id": "b"}, {**_section(), "block_id": "b"}],
    "markdown blocks over 12000 together": [{"type": "markdown", "text": "x" * 6001}] * 2,
    "block without a type": [{"text": _text("t")}],
}


@pytest.mark.parametrize("blocks", _BROKEN_BLOCKS.values(), ids=_BROKEN_BLOCKS.keys())
def test_the_mock_rejects_blocks_slack_rejects(blocks: list[Any]) -> None:
    assert _block_errors(blocks, max_blocks=50) != []


def test_the_mock_takes_the_blocks_slack_takes() -> None:
    fine = [_section("x" * 3000), {"type": "actions", "elements": [_button("x" * 75)]}] * 25
    assert _block_errors(fine, max_blocks=50) == []


_MODAL = {"type": "modal", "title": _text("Upload", "plain_text"), "blocks": [_section()]}
_BROKEN_VIEWS: dict[str, dict[str, Any]] = {
    "title over 24": {**_MODAL, "title": _text("x" * 25, "plain_text")},
    "submit over 24": {**_MODAL, "submit": _text("x" * 25, "plain_text")},
    "close over 24": {**_MODAL, "close": _text("x" * 25, "plain_text")},
    "private_metadata over 3000": {**_MODAL, "private_metadata": "x" * 3001},
    "callback_id over 255": {**_MODAL, "callback_id": "c" * 256},
    "101 blocks in a view": {**_MODAL, "blocks": [_section()] * 101},
    "a Home tab with a submit button": {
        "type": "home",
        "blocks": [_section()],
        "submit": _text("Go", "plain_text"),
    },
    "a modal without a title": {"type": "modal", "blocks": [_section()]},
    "neither a modal nor a Home tab": {**_MODAL, "type": "workflow_step"},
    "a block of the view breaking its limit": {**_MODAL, "blocks": [_section("x" * 3001)]},
}


@pytest.mark.parametrize("view", _BROKEN_VIEWS.values(), ids=_BROKEN_VIEWS.keys())
def test_the_mock_rejects_views_slack_rejects(view: dict[str, Any]) -> None:
    assert _view_errors(view) != []


def test_the_mock_takes_the_views_slack_takes() -> None:
    home = {"type": "home", "private_metadata": "x" * 3000, "blocks": [_section()] * 100}
    assert _view_errors(home) == [] and _view_errors(_MODAL) == []


async def test_other_methods_answer_in_slack_shapes() -> None:
    async with MockSlackAPI(admins=["U0ADMIN"]) as slack:
        client = _client(slack)
        auth = await client.auth_test()
        assert auth["user_id"] == BOT_USER_ID and auth["bot_id"] and auth["team_id"]

        admin = await client.users_info(user="U0ADMIN")
        plain = await client.users_info(user=USER_ID)
        assert admin["user"]["is_admin"] is True
        assert plain["user"]["is_admin"] is False and plain["user"]["is_owner"] is False

        eph = await client.chat_postEphemeral(channel=CHANNEL_ID, user=USER_ID, text="only you")
        assert eph["message_ts"]

        # A view holds 1 to 100 blocks (slack_sdk's View checks both ends).
        blocks = [{"type": "section", "text": {"type": "mrkdwn", "text": "Pick a file"}}]
        view = {
            "type": "modal",
            "title": {"type": "plain_text", "text": "Upload"},
            "blocks": blocks,
        }
        opened = await client.views_open(trigger_id="1.2.abc", view=view)
        view_id = opened["view"]["id"]
        assert opened["view"]["state"] == {"values": {}} and view_id in slack.views
        with pytest.raises(SlackApiError):  # modal titles are limited to 24 characters
            await client.views_open(
                trigger_id="1.2.abc",
                view={**view, "title": {"type": "plain_text", "text": "x" * 25}},
            )

        await client.assistant_threads_setStatus(
            channel_id="D1", thread_ts="1.1", status="is thinking..."
        )
        unknown = await client.api_call("bookmarks.list", params={"channel_id": CHANNEL_ID})
        assert unknown["ok"] is True

        f = slack.add_file("F0FILE1", "handbook.md", b"# Handbook\n", "text/markdown")
        info = await client.files_info(file="F0FILE1")
        assert info["file"]["url_private_download"] == f["url_private_download"]
        assert info["file"]["filetype"] == "markdown" and info["file"]["size"] == 11

        assert slack.methods()[:3] == ["auth.test", "users.info", "users.info"]
        assert slack.calls("assistant.threads.setStatus")[0]["status"] == "is thinking..."


async def test_bad_token_is_rejected() -> None:
    async with MockSlackAPI() as slack:
        client = AsyncWebClient(token="xoxb-wrong", base_url=slack.api_url)
        with pytest.raises(SlackApiError) as err:
            await client.chat_postMessage(channel=CHANNEL_ID, text="hi")
        assert err.value.response["error"] == "invalid_auth"
        assert slack.calls() == [] and slack.rejected[0][2] == "invalid_auth"


async def test_rate_limit_then_success_with_retry_handler() -> None:
    async with MockSlackAPI() as slack:
        slack.rate_limit("chat.update", retry_after=0)
        plain = _client(slack)
        posted = await plain.chat_postMessage(channel=CHANNEL_ID, text="a")
        with pytest.raises(SlackApiError) as err:
            await plain.chat_update(channel=CHANNEL_ID, ts=posted["ts"], text="b")
        assert err.value.response.status_code == 429
        assert err.value.response.headers["Retry-After"] == "0"

        slack.rate_limit("chat.update", retry_after=0)
        retrying = _client(
            slack, retry_handlers=[AsyncRateLimitErrorRetryHandler(max_retry_count=1)]
        )
        await retrying.chat_update(channel=CHANNEL_ID, ts=posted["ts"], text="c")
        assert [c["text"] for c in slack.calls("chat.update")] == ["c"]


async def test_scripted_failure_and_wait_for() -> None:
    async with MockSlackAPI() as slack:
        slack.fail("chat.postMessage", "not_in_channel", times=1)
        client = _client(slack)
        with pytest.raises(SlackApiError):
            await client.chat_postMessage(channel=CHANNEL_ID, text="a")
        await client.chat_postMessage(channel=CHANNEL_ID, text="b")
        assert len(await slack.wait_for("chat.postMessage", 1, timeout=1)) == 1
        with pytest.raises(AssertionError, match="chat.update"):
            await slack.wait_for("chat.update", timeout=0.05)


async def test_private_file_download_needs_the_bot_token() -> None:
    async with MockSlackAPI() as slack, aiohttp.ClientSession() as http:
        data = b"%PDF-1.4 not really"
        f = slack.add_file("F0PDF", "Policy v2.pdf", data, "application/pdf")
        assert f["url_private_download"].startswith(slack.url + "/files-pri/")

        headers = {"Authorization": f"Bearer {slack.bot_token}"}
        async with http.get(f["url_private_download"], headers=headers) as resp:
            assert resp.status == 200
            assert resp.content_type == "application/pdf"
            assert await resp.read() == data

        for bad in ({}, {"Authorization": "Bearer xoxb-wrong"}):
            async with http.get(f["url_private_download"], headers=bad) as resp:
                # Slack answers 200 with its sign-in page: only the type gives it away.
                assert resp.status == 200
                assert resp.content_type == "text/html"
                assert b"Sign in" in await resp.read()
        assert slack.downloads == [("F0PDF", True), ("F0PDF", False), ("F0PDF", False)]


async def test_response_url_records_posts() -> None:
    async with MockSlackAPI() as slack:
        hook = AsyncWebhookClient(slack.response_url("cmd-1"))
        resp = await hook.send(text="Reindexing...", response_type="ephemeral")
        assert resp.status_code == 200
        assert slack.responses("cmd-1") == [{"text": "Reindexing...", "response_type": "ephemeral"}]
        assert slack.responses("other") == []


# ----------------------------------------------------------- driving real bolt


async def test_bolt_app_driven_with_signed_requests() -> None:
    """The payload builders produce requests the real bolt app accepts and routes."""
    async with MockSlackAPI() as slack:
        app = AsyncApp(client=_client(slack), signing_secret=DEFAULT_SIGNING_SECRET)
        seen: dict[str, Any] = {}
        messages: list[dict[str, Any]] = []

        @app.event("app_mention")
        async def mention(event: dict[str, Any], say: AsyncSay) -> None:
            await say(text="hi", thread_ts=event.get("thread_ts") or event["ts"])

        @app.event("message")
        async def message(event: dict[str, Any]) -> None:
            messages.append(event)

        @app.command("/kb-reindex")
        async def reindex(ack: AsyncAck, respond: AsyncRespond, command: dict[str, Any]) -> None:
            await ack("Working on it")
            await respond(f"done for {command['user_id']}")

        @app.view("upload")
        async def upload(ack: AsyncAck, view: dict[str, Any]) -> None:
            await ack()
            seen["files"] = view["state"]["values"]["file_block"]["file_action"]["files"]

        @app.action("retry")
        async def retry(ack: AsyncAck, body: dict[str, Any]) -> None:
            await ack()
            seen["action"] = body["actions"][0]["value"]

        async with TestClient(TestServer(app.web_app())) as http:

            async def post(body: bytes) -> aiohttp.ClientResponse:
                headers = slack_headers(DEFAULT_SIGNING_SECRET, body)
                return await http.post("/slack/events", data=body, headers=headers)

            mention_event = app_mention_event("what is the leave policy?")
            assert (await post(event_body(mention_event))).status == 200
            (reply,) = await slack.wait_for("chat.postMessage")
            assert reply["thread_ts"] == mention_event["ts"] and reply["channel"] == CHANNEL_ID

            assert (await post(event_body(message_im_event("hello")))).status == 200
            f = slack.add_file("F0DOC", "a.md", b"# A", "text/markdown")
            assert (await post(event_body(file_share_event([f])))).status == 200

            resp = await post(
                slash_command_body(
                    "/kb-reindex", "", "U0ADMIN", CHANNEL_ID, slack.response_url("r1")
                )
            )
            assert resp.status == 200 and await resp.text() == "Working on it"
            assert (await slack.wait_for_responses(1, "r1"))[0]["text"] == "done for U0ADMIN"

            state = file_input_state("file_block", "file_action", [f])
            resp = await post(view_submission_body({"callback_id": "upload", "state": state}))
            assert resp.status == 200

            resp = await post(
                block_actions_body([button_action("retry", "doc-7")], message_ts=slack_ts())
            )
            assert resp.status == 200

            # A tampered body fails bolt's signature check.
            body = event_body(app_mention_event("x"))
            headers = slack_headers(DEFAULT_SIGNING_SECRET, body)
            assert (
                await http.post("/slack/events", data=body + b" ", headers=headers)
            ).status == 401

        assert seen["files"] == [f] and seen["action"] == "doc-7"
        kinds = [(e.get("subtype"), e["channel_type"]) for e in messages]
        assert kinds == [(None, "im"), ("file_share", "im")]


def test_slash_command_body_is_slack_form() -> None:
    fields = parse_qs(
        slash_command_body("/kb-upload", "a b", "U1", "C1", "http://r", "t.1").decode()
    )
    assert fields["command"] == ["/kb-upload"] and fields["text"] == ["a b"]
    assert fields["response_url"] == ["http://r"] and fields["trigger_id"] == ["t.1"]
    payload = json.loads(
        parse_qs(view_submission_body({"callback_id": "c"}).decode())["payload"][0]
    )
    assert payload["type"] == "view_submission" and payload["view"]["state"] == {"values": {}}


# ----------------------------------------------------------------------- signing

SLACK_VECTOR_SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
SLACK_VECTOR_TS = 1531420618
SLACK_VECTOR_BODY = (
    "token=xyzz0WbapA4vBCDEFasx0q6G&team_id=T1DC2JH3J&team_domain=testteamnow&channel_id=G8PSS9T3V"
    "&channel_name=foobar&user_id=U2CERLKJA&user_name=roadrunner&command=%2Fwebhook-collect&text="
    "&response_url=https%3A%2F%2Fhooks.slack.com%2Fcommands%2FT1DC2JH3J%2F397700885554%2F96rGlfmibIGlgcZRskXaIFfN"
    "&trigger_id=398738663015.47445629121.803a0bc887a14d10d2c447fce8b6703c"
)
SLACK_VECTOR_SIGNATURE = "v0=a2114d57b48eac39b9ad189dd8316235a7b4a8d21a10bd27519666489c69b503"


class _FrozenClock(Clock):
    def now(self) -> float:
        return SLACK_VECTOR_TS + 10


def test_signature_matches_slacks_published_vector() -> None:
    headers = sign_slack_request(SLACK_VECTOR_SECRET, SLACK_VECTOR_BODY.encode(), SLACK_VECTOR_TS)
    assert headers == {
        "X-Slack-Request-Timestamp": str(SLACK_VECTOR_TS),
        "X-Slack-Signature": SLACK_VECTOR_SIGNATURE,
    }
    verifier = SignatureVerifier(SLACK_VECTOR_SECRET, clock=_FrozenClock())
    assert verifier.is_valid_request(SLACK_VECTOR_BODY, headers)


def test_signature_defaults_to_now() -> None:
    headers = sign_slack_request("s", b"{}")
    assert abs(int(headers["X-Slack-Request-Timestamp"]) - time.time()) < 5
    assert SignatureVerifier("s").is_valid_request(b"{}", headers)


# ------------------------------------------------------------ OpenAI-compatible

MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": "Answer from sources."},
    {"role": "user", "content": "Leave?"},
]


def _openai(url: str, *, max_retries: int = 0, timeout: float = 10.0) -> openai.AsyncOpenAI:
    """The real client; ``max_retries=0`` keeps failure tests fast."""
    return openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=max_retries, timeout=timeout)


async def _ask(client: openai.AsyncOpenAI) -> str | None:
    done = await client.chat.completions.create(model="m", messages=MESSAGES)
    return done.choices[0].message.content


async def test_openai_completion_and_stream() -> None:
    async with OpenAICompatServer(reply="Twenty days [1].") as llm, _openai(llm.url) as client:
        done = await client.chat.completions.create(model="m", messages=MESSAGES)
        assert done.choices[0].message.content == "Twenty days [1]."
        assert done.choices[0].finish_reason == "stop" and done.usage is not None

        llm.set_reply(lambda messages: f"echo: {messages[-1]['content']}")
        stream = await client.chat.completions.create(
            model="m", messages=MESSAGES, stream=True, stream_options={"include_usage": True}
        )
        pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
        assert "".join(pieces) == "echo: Leave?" and len(pieces) > 2

        assert [r.get("stream", False) for r in llm.requests] == [False, True]
        assert llm.requests[0]["messages"] == MESSAGES
        assert llm.headers[0]["Authorization"] == "Bearer x"
        models = await client.models.list()
        assert [m.id for m in models.data] == ["test-model"]


async def test_openai_server_errors() -> None:
    async with OpenAICompatServer() as llm, _openai(llm.url) as client:
        llm.fail_with(500, times=1)
        with pytest.raises(openai.InternalServerError):
            await _ask(client)
        assert await _ask(client) == "OK [1]"

        llm.fail_with(503)
        before = len(llm.requests)
        async with _openai(llm.url, max_retries=1) as retrying:
            with pytest.raises(openai.InternalServerError):
                await _ask(retrying)
        assert len(llm.requests) - before == 2  # the client retried once


async def test_openai_timeout_and_dropped_connection() -> None:
    async with OpenAICompatServer() as llm:
        llm.delay(5)
        started = time.monotonic()
        async with _openai(llm.url, timeout=0.3) as impatient:
            with pytest.raises(openai.APITimeoutError):
                await _ask(impatient)
        assert time.monotonic() - started < 3

        llm.reset()
        llm.drop_connections(times=1)
        async with _openai(llm.url) as client:
            with pytest.raises(openai.APIConnectionError):
                await _ask(client)
            assert await _ask(client) == "OK [1]"


async def test_openai_connection_refused() -> None:
    async with _openai(closed_port_url()) as client:
        with pytest.raises(openai.APIConnectionError):
            await _ask(client)

    llm = OpenAICompatServer()
    async with llm:
        url = llm.url
    async with _openai(url) as client:
        with pytest.raises(openai.APIConnectionError):  # a closed server refuses too
            await _ask(client)


async def test_openai_api_key_checked_when_set() -> None:
    async with OpenAICompatServer(api_key="secret") as llm, _openai(llm.url) as client:
        with pytest.raises(openai.AuthenticationError):
            await _ask(client)
