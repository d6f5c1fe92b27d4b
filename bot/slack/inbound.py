"""Slack's HTTP requests, checked before bolt parses them.

Bolt reads the timestamp header with ``int()`` and the body with ``json.loads``
inside its middleware, so a request with ``X-Slack-Request-Timestamp: abc``
reached the listeners' error handler before anything was verified: a 500, a
traceback, and an error notice posted to whatever channel the unsigned body
named. Bolt's listeners then trust the shape of a verified body: a ``channel``
that is a list failed in SQLite, a ``files`` that is a string in the uploader.

Here, in order, with one log line and no traceback for each refusal:

* the signature: ``X-Slack-Request-Timestamp`` is ASCII digits within five
  minutes of now, ``X-Slack-Signature`` is ``v0=`` and 64 hex digits and matches
  the body: otherwise **401**;
* the body: UTF-8; JSON that is an object, or a form that is a slash command,
  Slack's SSL check or a ``payload`` holding a JSON object: otherwise **400**;
* the fields the listeners (and bolt, building its context) read have the
  types Slack documents, nested objects included (an assistant thread, a file,
  the envelope's authorizations, a submitted form's values), and are there
  where Slack always sends them (a message's ``ts``, a command's
  ``trigger_id``, a click's ``container``): an event that does not is
  acknowledged with **200** and dropped (Slack would only deliver it again), a
  command or an interaction that does not gets **400**.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs

from slack_sdk.signature import Clock

log = logging.getLogger(__name__)

__all__ = ["Refusal", "check"]

# Slack's own bound on a request's age (its replay protection).
MAX_AGE_SECONDS = 300
_TIMESTAMP = re.compile(r"[0-9]{1,12}")
_SIGNATURE = re.compile(r"v0=[0-9a-f]{64}")
# Fields of an event the listeners read as text; Slack always sends them as strings.
_EVENT_TEXT_FIELDS = (
    "type",
    "subtype",
    "channel",
    "channel_type",
    "user",
    "text",
    "ts",
    "thread_ts",
    "team",
    "user_team",
    "client_msg_id",
    "bot_id",
    "channel_id",
    "file_id",
)
_FILE_TEXT_FIELDS = ("id", "name", "title", "mimetype", "filetype", "url_private_download")
# The most files a form's file input holds (Slack: ``max_files`` 1-10); more is forged.
FILE_INPUT_MAX_FILES = 10
# Events the bot answers in a channel: they must name one, and the message (its ts).
_CHANNEL_EVENTS = frozenset({"app_mention", "message"})
# An event's fields that are objects, and their fields the listeners read as text.
_EVENT_OBJECTS = {
    "assistant_thread": ("user_id", "channel_id", "thread_ts"),
    "file": ("id",),
}
# Fields of an assistant thread's ``context`` read as text.
_CONTEXT_TEXT_FIELDS = ("channel_id", "team_id", "enterprise_id")
# What every slash command Slack sends carries (a modal opens with its trigger_id).
_COMMAND_FIELDS = ("command", "user_id", "channel_id", "trigger_id")
# Events whose ``user`` is Slack's user object, not an id (what changed of a person).
_USER_OBJECT_EVENTS = frozenset({"user_change", "team_join"})


@dataclass(frozen=True)
class Refusal:
    """How to answer a request that goes no further, and why (for the log)."""

    status: int
    reason: str


def check(headers: Mapping[str, str], body: bytes, signing_secret: str) -> Refusal | None:
    """``None`` when bolt may have the request; else how to answer it.

    Logs every refusal as one line at INFO: an outsider can send these at will.
    """
    refusal = _unsigned(headers, body, signing_secret) or _malformed(
        headers.get("Content-Type", ""), body
    )
    if refusal is not None:
        log.info("refused a Slack request (%d): %s", refusal.status, refusal.reason)
    return refusal


def _unsigned(headers: Mapping[str, str], body: bytes, secret: str) -> Refusal | None:
    timestamp = headers.get("X-Slack-Request-Timestamp", "")
    signature = headers.get("X-Slack-Signature", "")
    if not _TIMESTAMP.fullmatch(timestamp):
        return Refusal(401, "missing or malformed X-Slack-Request-Timestamp")
    # The SDK's clock, which bolt's own check after this one reads too.
    if abs(Clock().now() - int(timestamp)) > MAX_AGE_SECONDS:
        return Refusal(401, "X-Slack-Request-Timestamp more than five minutes from now")
    if not _SIGNATURE.fullmatch(signature):
        return Refusal(401, "missing or malformed X-Slack-Signature")
    # Over the raw bytes: the SDK's verifier decodes the body first and fails on non-UTF-8.
    expected = hmac.new(secret.encode(), b"v0:%s:%s" % (timestamp.encode(), body), hashlib.sha256)
    if not hmac.compare_digest(f"v0={expected.hexdigest()}", signature):
        return Refusal(401, "X-Slack-Signature does not match the body")
    return None


def _malformed(content_type: str, body: bytes) -> Refusal | None:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return Refusal(400, "the body is not UTF-8")
    if content_type.split(";", 1)[0].strip().lower() == "application/json":
        return _json_object(text, "the JSON body", _payload_problem)
    form = parse_qs(text, keep_blank_values=True)
    if "payload" in form:
        return _json_object(form["payload"][0], "the form's payload", _payload_problem)
    if "command" in form:
        missing = [k for k in _COMMAND_FIELDS if not (form.get(k) or [""])[0]]
        return Refusal(400, f"a command without {', '.join(missing)}") if missing else None
    if "ssl_check" in form:
        return None
    return Refusal(400, "a form that is neither a command, an SSL check nor a payload")


def _json_object(text: str, what: str, problem: Any) -> Refusal | None:
    try:
        value = json.loads(text)
    except (ValueError, RecursionError):  # deep nesting exhausts the decoder's stack
        return Refusal(400, f"{what} is not JSON")
    if not isinstance(value, dict):
        return Refusal(400, f"{what} is not a JSON object")
    result: Refusal | None = problem(value)
    return result


def _payload_problem(payload: dict[str, Any]) -> Refusal | None:
    authorizations = payload.get("authorizations")
    if authorizations is not None and not (
        isinstance(authorizations, list) and all(isinstance(a, dict) for a in authorizations)
    ):
        # Bolt reads it before any listener runs.
        return Refusal(400, "'authorizations' is not a list of objects")
    if payload.get("type") == "event_callback":
        problem = _event_problem(payload.get("event"))
        return Refusal(200, f"ignored an event: {problem}") if problem else None
    problem = _interaction_problem(payload)
    return Refusal(400, f"an interaction payload: {problem}") if problem else None


def _event_problem(event: object) -> str | None:
    if not isinstance(event, dict):
        return "'event' is not an object"
    if event.get("type") in _USER_OBJECT_EVENTS:
        user = event.get("user")
        if not (isinstance(user, dict) and isinstance(user.get("id"), str)):
            return "'user' is not a user object"
        event = {k: v for k, v in event.items() if k != "user"}
    bad = [k for k in _EVENT_TEXT_FIELDS if k in event and not isinstance(event[k], str)]
    if bad:
        return f"{', '.join(bad)} not text"
    if event.get("type") in _CHANNEL_EVENTS and not event.get("channel"):
        return "no channel"
    if event.get("type") in _CHANNEL_EVENTS and not event.get("ts"):
        return "no ts"
    if "files" in event and not _are_files(event["files"]):
        return "'files' is not a list of file objects"
    for name, fields in _EVENT_OBJECTS.items():
        if name in event and not _has_text(event[name], fields):
            return f"'{name}' is not an object of its fields"
    context = (event.get("assistant_thread") or {}).get("context")
    if context is not None and not _has_text(context, _CONTEXT_TEXT_FIELDS):
        return "'assistant_thread.context' is not an object of its fields"
    return None


def _has_text(value: object, fields: tuple[str, ...]) -> bool:
    """Whether ``value`` is an object whose ``fields``, where present, are text."""
    return isinstance(value, dict) and all(isinstance(value.get(k, ""), str) for k in fields)


def _are_files(files: object) -> bool:
    return isinstance(files, list) and all(
        isinstance(f, dict) and all(isinstance(f.get(k, ""), str) for k in _FILE_TEXT_FIELDS)
        for f in files
    )


def _are_input_files(files: object) -> bool:
    return isinstance(files, list) and len(files) <= FILE_INPUT_MAX_FILES and _are_files(files)


def _interaction_problem(payload: dict[str, Any]) -> str | None:
    user = payload.get("user")
    if "user" in payload and not (isinstance(user, dict) and isinstance(user.get("id"), str)):
        return "'user' is not a user object"
    actions = payload.get("actions")
    if "actions" in payload and not (
        isinstance(actions, list)
        and all(
            isinstance(a, dict)
            and isinstance(a.get("action_id", ""), str)
            and isinstance(a.get("value", ""), str)
            for a in actions
        )
    ):
        return "'actions' is not a list of actions"
    view = payload.get("view")
    if "view" in payload and view is not None and not _is_view(view):
        return "'view' is not a view with a state"
    container = payload.get("container")
    if "container" in payload and not isinstance(container, dict):
        return "'container' is not an object"
    if payload.get("type") == "block_actions" and container is None:
        # Slack sends where every click happened; the listeners answer there.
        return "a click without its 'container'"
    return None


def _is_view(view: object) -> bool:
    if not isinstance(view, dict):
        return False
    state = view.get("state", {"values": {}})
    # private_metadata is the text the bot set; Slack echoes it as text, never another type.
    return (
        isinstance(state, dict)
        and _are_values(state.get("values", {}))
        and isinstance(view.get("private_metadata", ""), str)
    )


def _are_values(values: object) -> bool:
    """Whether a view's state values are shaped as Slack sends them: per block, per action,
    an element's state (a text input's ``value`` text, a file input's files, a choice's option)."""
    return isinstance(values, dict) and all(
        isinstance(block, dict) and all(_is_element_state(element) for element in block.values())
        for block in values.values()
    )


def _is_element_state(element: object) -> bool:
    if not isinstance(element, dict):
        return False
    value, option = element.get("value"), element.get("selected_option")
    return (
        (value is None or isinstance(value, str))
        and ("files" not in element or _are_input_files(element["files"]))
        and (option is None or _has_text(option, ("value",)))
    )
