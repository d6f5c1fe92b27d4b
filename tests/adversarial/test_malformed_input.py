"""Malformed input from outside is refused with a 4xx, never a 500 or a traceback.

The attacker is anyone who can reach the server: they send raw HTTP requests
with missing, malformed or extreme Slack signature headers, bodies that are not
what Slack sends, viewer links with odd ids and tokens, over-long URLs and
headers. Someone who holds the signing secret (or Slack itself, changing its
payloads) can also send correctly signed requests whose fields have the wrong
types. Each must be answered as Slack or a browser expects (401 for an
unverifiable request, 400 for a malformed one, 403/404 for a link that opens
nothing, 200 for an event the bot ignores) and leave no traceback in the log:
a traceback per request is a log an outsider can flood and an on-call engineer
learns to ignore.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import aiohttp
import pytest

pytest.register_assert_rewrite("tests.conftest_bot")

from bot.slack.blocks import (  # noqa: E402
    ASK_A_PERSON_ACTION_ID,
    RETRY_ACTION_ID,
    UPLOAD_CALLBACK_ID,
)
from tests.conftest_bot import IN_DOMAIN, Bot, BotFactory  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DEFAULT_SIGNING_SECRET,
    USER_ID,
    app_mention_event,
    block_actions_body,
    button_action,
    event_body,
    file_input_state,
    file_share_event,
    sign_slack_request,
    slack_headers,
    slash_command_payload,
    view_submission_body,
)

EVENTS = "/slack/events"
ProductLogs = Callable[..., io.StringIO]
Send = Callable[[Bot], Awaitable[aiohttp.ClientResponse]]


@dataclass(frozen=True)
class Attack:
    """A request an outsider sends, and the statuses that are a correct answer to it."""

    send: Send
    statuses: frozenset[int]


def _post(body: bytes, headers: dict[str, str]) -> Send:
    async def send(bot: Bot) -> aiohttp.ClientResponse:
        return await bot.http.post(EVENTS, data=body, headers=headers)

    return send


def _get(path: str, headers: dict[str, str] | None = None) -> Send:
    async def send(bot: Bot) -> aiohttp.ClientResponse:
        return await bot.http.get(path, headers=headers or {}, allow_redirects=False)

    return send


def _signed(body: bytes, *, json_body: bool | None = None) -> Send:
    # Signed when sent, not when this module is loaded: a long run would otherwise send
    # timestamps past Slack's five minutes.
    async def send(bot: Bot) -> aiohttp.ClientResponse:
        headers = slack_headers(DEFAULT_SIGNING_SECRET, body, json_body=json_body)
        return await bot.http.post(EVENTS, data=body, headers=headers)

    return send


def _with_timestamp(timestamp: str | None, signature: str | None = None) -> Send:
    """A real event whose timestamp header is ``timestamp`` (absent when None)."""
    body = event_body(app_mention_event(IN_DOMAIN))
    headers = slack_headers(DEFAULT_SIGNING_SECRET, body)
    if timestamp is None:
        del headers["X-Slack-Request-Timestamp"]
    else:
        headers["X-Slack-Request-Timestamp"] = timestamp
    if signature is not None:
        headers["X-Slack-Signature"] = signature
    return _post(body, headers)


def _event(**changes: Any) -> bytes:
    event = app_mention_event(IN_DOMAIN)
    event.update(changes)
    return event_body(event)


def _event_without(field: str) -> bytes:
    event = app_mention_event(IN_DOMAIN)
    del event[field]
    return event_body(event)


def _upload_values(**values: Any) -> dict[str, Any]:
    """A submitted upload form holding one file, with ``values`` in place of its blocks'."""
    state = file_input_state("files", "files", [{"id": "F0UPLOAD01"}])
    state["values"].update(values)
    return state


def _click_without(*fields: str) -> bytes:
    """An "Ask a person" click whose payload lacks ``fields``."""
    body = block_actions_body([button_action(ASK_A_PERSON_ACTION_ID, "1")])
    payload = json.loads(dict(_parse_form(body))["payload"])
    return _form({k: v for k, v in payload.items() if k not in fields})


def _form(payload: object) -> bytes:
    return urlencode({"payload": json.dumps(payload)}).encode()


def _upload_view(**view: Any) -> bytes:
    body = view_submission_body({"callback_id": UPLOAD_CALLBACK_ID, **view})
    if "state" in view and view["state"] is None:
        payload = json.loads(dict(_parse_form(body))["payload"])
        del payload["view"]["state"]
        return _form(payload)
    return body


def _parse_form(body: bytes) -> list[tuple[str, str]]:
    from urllib.parse import parse_qsl

    return parse_qsl(body.decode())


UNAUTHORIZED = frozenset({401})
IGNORED = frozenset({200})
BAD = frozenset({400, 401})
LINK = frozenset({403, 404})

ATTACKS: dict[str, Attack] = {
    # --- the signature headers
    "no signature headers": Attack(
        _post(_event(), {"Content-Type": "application/json"}), UNAUTHORIZED
    ),
    "timestamp abc": Attack(_with_timestamp("abc"), UNAUTHORIZED),
    "timestamp huge": Attack(_with_timestamp("9" * 40), UNAUTHORIZED),
    "timestamp negative": Attack(_with_timestamp("-1"), UNAUTHORIZED),
    "timestamp float": Attack(_with_timestamp(f"{time.time():.3f}"), UNAUTHORIZED),
    "timestamp empty": Attack(_with_timestamp(""), UNAUTHORIZED),
    "timestamp missing": Attack(_with_timestamp(None), UNAUTHORIZED),
    "timestamp in Arabic-Indic digits": Attack(
        _with_timestamp(str(int(time.time())).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))),
        UNAUTHORIZED,
    ),
    "signature not hex": Attack(_with_timestamp(str(int(time.time())), "v0=zz"), UNAUTHORIZED),
    "signature non-ASCII": Attack(
        _with_timestamp(str(int(time.time())), "v0=\u00e9\u00e9"), UNAUTHORIZED
    ),
    "signature from an hour ago": Attack(
        _post(
            _event(), sign_slack_request(DEFAULT_SIGNING_SECRET, _event(), int(time.time()) - 3600)
        ),
        UNAUTHORIZED,
    ),
    # --- correctly signed bodies that are not what Slack sends
    "JSON list": Attack(_signed(b"[1, 2]", json_body=True), BAD),
    "JSON string": Attack(_signed(b'"event"', json_body=True), BAD),
    "JSON null": Attack(_signed(b"null", json_body=True), BAD),
    "broken JSON": Attack(_signed(b'{"type": "event_callback", ', json_body=True), BAD),
    "not UTF-8": Attack(_signed(b'{"type": "\xff\xfe"}', json_body=True), BAD),
    "form without payload": Attack(_signed(b"foo=bar", json_body=False), BAD),
    "form payload not JSON": Attack(_signed(b"payload=%7Bnot", json_body=False), BAD),
    "form payload a list": Attack(_signed(_form([1, 2]), json_body=False), BAD),
    "event a string": Attack(_signed(event_body("app_mention")), IGNORED | BAD),  # type: ignore[arg-type]
    "event channel a list": Attack(_signed(_event(channel=[CHANNEL_ID])), IGNORED),
    "event text a number": Attack(_signed(_event(text=42)), IGNORED),
    "event user an object": Attack(_signed(_event(user={"id": USER_ID})), IGNORED),
    "event ts a list": Attack(_signed(_event(ts=["1"])), IGNORED),
    "event without a channel": Attack(_signed(_event(channel=None)), IGNORED),
    "files a string": Attack(
        _signed(event_body({**file_share_event([]), "files": "F0NOTALIST"})), IGNORED
    ),
    "files of strings": Attack(
        _signed(event_body({**file_share_event([]), "files": ["F0ONE", 7]})), IGNORED
    ),
    "view without state": Attack(_signed(_upload_view(state=None), json_body=False), IGNORED | BAD),
    "view state a string": Attack(_signed(_upload_view(state="x"), json_body=False), IGNORED | BAD),
    "actions a string": Attack(
        _signed(
            _form(
                {**json.loads(dict(_parse_form(block_actions_body([])))["payload"]), "actions": "x"}
            ),
            json_body=False,
        ),
        IGNORED | BAD,
    ),
    "retry value not a document id": Attack(
        _signed(block_actions_body([button_action(RETRY_ACTION_ID, "١٢")]), json_body=False),
        IGNORED,
    ),
    "retry value a number": Attack(  # Slack sends every action value as text
        _signed(
            _form(
                {
                    **json.loads(dict(_parse_form(block_actions_body([])))["payload"]),
                    "actions": [{**button_action(RETRY_ACTION_ID), "value": 12}],
                }
            ),
            json_body=False,
        ),
        BAD,
    ),
    "retry without the message it came from": Attack(
        _signed(
            _form(
                {
                    **json.loads(
                        dict(
                            _parse_form(block_actions_body([button_action(RETRY_ACTION_ID, "12")]))
                        )["payload"]
                    ),
                    "container": {},
                }
            ),
            json_body=False,
        ),
        IGNORED,
    ),
    # --- fields Slack always sends, missing or nested in another shape
    "mention without its ts": Attack(_signed(_event_without("ts")), IGNORED),
    "assistant thread a string": Attack(
        _signed(event_body({"type": "assistant_thread_started", "assistant_thread": "x"})),
        IGNORED,
    ),
    "assistant thread context a list": Attack(
        _signed(
            event_body(
                {
                    "type": "assistant_thread_started",
                    "assistant_thread": {"user_id": USER_ID, "channel_id": "D1", "context": [1]},
                }
            )
        ),
        IGNORED,
    ),
    "changed file a string": Attack(
        _signed(event_body({"type": "file_change", "file": "F0CANVAS1"})), IGNORED
    ),
    "shared file's channel a list": Attack(
        _signed(event_body({"type": "file_shared", "file_id": "F0CANVAS1", "channel_id": ["C1"]})),
        IGNORED,
    ),
    "unshared file's id an object": Attack(
        _signed(event_body({"type": "file_unshared", "file_id": {"id": "F0CANVAS1"}})), IGNORED
    ),
    "authorizations a string": Attack(
        _signed(json.dumps({**json.loads(_event()), "authorizations": "x"}).encode()), BAD
    ),
    "command without trigger_id": Attack(
        _signed(
            urlencode(
                {k: v for k, v in slash_command_payload("/kb-upload").items() if k != "trigger_id"}
            ).encode(),
            json_body=False,
        ),
        BAD,
    ),
    "view title a number": Attack(
        _signed(_upload_view(state=_upload_values(title={"title": {"value": 5}})), json_body=False),
        BAD,
    ),
    "view files of numbers": Attack(
        _signed(
            _upload_view(state=_upload_values(files={"files": {"files": [1, 2]}})), json_body=False
        ),
        BAD,
    ),
    # Slack's file input holds 1-10 files (max_files): eleven were never Slack's form.
    "view with eleven files": Attack(
        _signed(
            _upload_view(
                state=_upload_values(
                    files={"files": {"files": [{"id": f"F0FORGED{n:02d}"} for n in range(11)]}}
                )
            ),
            json_body=False,
        ),
        BAD,
    ),
    "view choice a string": Attack(
        _signed(
            _upload_view(state=_upload_values(visibility={"visibility": {"selected_option": "x"}})),
            json_body=False,
        ),
        BAD,
    ),
    "view values a list": Attack(
        _signed(_upload_view(state=_upload_values(files=[1])), json_body=False), BAD
    ),
    "click without its container": Attack(
        _signed(_click_without("container", "response_url"), json_body=False), BAD
    ),
    # --- viewer links
    "document id in Arabic-Indic digits": Attack(_get("/d/\u0661\u0662?t=abc"), LINK),
    "document id a superscript": Attack(_get("/d/\u00b2?t=abc"), LINK),
    "document id with a sign": Attack(_get("/d/+1?t=abc"), LINK),
    "document id too long": Attack(_get("/d/" + "9" * 40 + "?t=abc"), LINK),
    "file of a non-ASCII id": Attack(_get("/d/\u0661/file?t=abc"), LINK),
    "token of invalid UTF-8": Attack(_get("/d/1?t=%ff%fe%ED%A0%80"), LINK),
    "token of a lone surrogate": Attack(_get("/d/1?t=%ED%A0%80.abc.def"), LINK),
    "token of NULs": Attack(_get("/d/1?t=%00%00"), LINK),
    "token repeated": Attack(_get("/d/1?t=a&t=b"), LINK),
    "token very long": Attack(_get("/d/1?t=" + "a" * 6000), LINK | {400, 414}),
    "query string garbage": Attack(_get("/d/1?%%%=&&=;t"), LINK),
    "static name odd": Attack(_get("/static/%ff%fe"), frozenset({404})),
}


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_malformed_input_is_refused_without_a_traceback(
    make_bot: BotFactory, product_logs: ProductLogs, name: str
) -> None:
    attack = ATTACKS[name]
    bot = await make_bot()
    out = product_logs("console")
    resp = await attack.send(bot)
    await bot.idle()
    assert resp.status in attack.statuses, (resp.status, await resp.text())
    log = out.getvalue()
    assert "Traceback" not in log, log
    assert "[error" not in log and "[critical" not in log, log
    # Nothing was answered or posted on anyone's behalf.
    assert bot.slack.calls("chat.postMessage") == []


@pytest.mark.parametrize("reply", ["<" * 5000 + " [1]", "<" * 5000])
async def test_an_answer_of_angle_brackets_keeps_its_notification_text(
    make_bot: BotFactory, reply: str
) -> None:
    # Each "<" escapes to four characters: the cut to Slack's limit once left only "…".
    bot = await make_bot()
    bot.llm.set_reply(reply)
    await bot.event(app_mention_event(IN_DOMAIN))
    text = (await bot.answer())["text"]
    # No longer than a section's text: Slack's 3000 characters, written out rather than the
    # module's copy (https://api.slack.com/reference/block-kit/blocks#section).
    assert 100 < len(text) <= 3000
    assert "&lt;" * 100 in text and text.endswith("&lt;…")
