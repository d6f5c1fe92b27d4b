"""Structured logs: one key=value line per event, or one JSON object (KB_LOG_FORMAT=json).

Every record, the product's and its libraries' (aiohttp, bolt, the Slack and
OpenAI clients) alike, goes through one handler and is made safe there:

* tracebacks are plain text without local variables (locals hold the settings,
  the clients and ``Authorization`` headers); in JSON they are the ``exception``
  string field;
* control characters (C0, C1, CR/LF) and bidi controls in every value are
  escaped, so nothing a person sends can start a forged line or reorder what a
  reader sees; a console traceback keeps its own line breaks, not its values';
* citation-link tokens (``?t=...``) and the configured secrets become ``[redacted]``.
"""

from __future__ import annotations

import logging
import re
import sys
import traceback
from collections.abc import Iterable
from typing import Any, TextIO

import structlog
from structlog.typing import EventDict, Processor, WrappedLogger

__all__ = [
    "NOISY_LOGGERS",
    "REDACTED",
    "LogHandler",
    "Redactor",
    "build_formatter",
    "configure_logging",
    "escape",
    "format_exception",
]

REDACTED = "[redacted]"
# Shorter values would garble every line they happen to occur in, and guard nothing.
MIN_SECRET_LENGTH = 6

# C0 (with CR/LF/TAB), DEL, C1 (with NEL), line/paragraph separators, bidi embeddings,
# overrides, isolates and marks.
_CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")
# A citation link's token is its access credential: any ?t= / &t= value (also HTML-escaped &amp;t=).
_LINK_TOKEN_RE = re.compile(r"(?<=[?&;]t=)[^\s&#'\"<>|\\)\]},]+")
# An MCP bearer token wherever it shows up (a path someone pasted it into, an error):
# the URL-safe base64 after index.storage.mcp_tokens.TOKEN_PREFIX (spelled out here so
# that configuring logs imports no storage; tests/test_mcp_tokens.py checks they agree).
_MCP_TOKEN_RE = re.compile(r"kbmcp_[A-Za-z0-9_\-]+")
# Keys whose value is a multi-line text the renderer prints as is.
_MULTILINE_KEYS = frozenset({"exception", "stack"})
# Libraries that log every request at INFO drown the product's own events; Slack's
# Web API client logs whole bodies at DEBUG: people's messages of the threads it reads.
NOISY_LOGGERS = (
    "httpx",
    "markdown_it",
    "httpx2",
    "sentence_transformers",
    "faiss",
    "urllib3",
    "slack_sdk.web",
)
_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def escape(text: str) -> str:
    """``text`` with every control and bidi character written as ``\\xNN`` / ``\\uNNNN``."""
    return _CONTROL_RE.sub(_escaped, text)


def _escaped(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def _escape_lines(text: str) -> str:
    return "\n".join(escape(line) for line in text.split("\n"))


class Redactor:
    """Replaces citation-link tokens, MCP tokens and the given secrets with ``[redacted]``."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        values = sorted({s for s in secrets if len(s) >= MIN_SECRET_LENGTH}, key=len, reverse=True)
        self._secrets = re.compile("|".join(map(re.escape, values))) if values else None

    def __call__(self, text: str) -> str:
        """``text`` without tokens or secrets."""
        if self._secrets is not None:
            text = self._secrets.sub(REDACTED, text)
        return _MCP_TOKEN_RE.sub(REDACTED, _LINK_TOKEN_RE.sub(REDACTED, text))


# ---------------------------------------------------------------- tracebacks


def format_exception(exc: BaseException) -> str:
    """A plain traceback of ``exc`` and its chain, without locals, its messages on one line each."""
    parts: list[str] = []
    for link, joiner in reversed(_chain(exc)):
        parts += [joiner, _format_one(link)]
    return "".join(parts).rstrip("\n")


def _chain(exc: BaseException) -> list[tuple[BaseException, str]]:
    """``exc`` and the exceptions behind it, newest first, each with the line that leads to it."""
    chain: list[tuple[BaseException, str]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if current.__cause__ is not None:
            older, joiner = current.__cause__, _CAUSE
        elif current.__context__ is not None and not current.__suppress_context__:
            older, joiner = current.__context__, _CONTEXT
        else:
            older, joiner = None, ""
        chain.append((current, joiner if older is not None and id(older) not in seen else ""))
        current = older
    return chain


def _format_one(exc: BaseException) -> str:
    stack = ""
    if exc.__traceback__ is not None:
        frames = "".join(traceback.format_tb(exc.__traceback__))
        stack = _escape_lines("Traceback (most recent call last):\n" + frames.rstrip("\n")) + "\n"
    # The message is anyone's text (a file name, a server's reply): one line, escaped.
    message = escape("".join(traceback.format_exception_only(exc)).rstrip("\n"))
    text = stack + message + "\n"
    if isinstance(exc, BaseExceptionGroup):
        for n, sub in enumerate(exc.exceptions, 1):
            text += f"+---- sub-exception {n} ----\n" + format_exception(sub) + "\n"
    return text


def _exception_of(exc_info: Any) -> BaseException | None:
    if isinstance(exc_info, BaseException):
        return exc_info
    if isinstance(exc_info, tuple) and len(exc_info) == 3:
        return exc_info[1] if isinstance(exc_info[1], BaseException) else None
    if exc_info is True:
        return sys.exc_info()[1]
    return None


def _render_exception(_: WrappedLogger, __: str, event: EventDict) -> EventDict:
    """``exc_info`` as the ``exception`` text, ``stack_info`` as ``stack``."""
    exc = _exception_of(event.pop("exc_info", None))
    if exc is not None:
        event["exception"] = format_exception(exc)
    stack = event.pop("stack_info", None)
    if isinstance(stack, str) and stack:
        event["stack"] = stack
    return event


# ---------------------------------------------------------------- values


class _Sanitize:
    """Redact and escape every value of an event, nested ones included."""

    def __init__(self, redact: Redactor) -> None:
        self.redact = redact

    def __call__(self, _: WrappedLogger, __: str, event: EventDict) -> EventDict:
        return {
            key: self._text(value, multiline=True)
            if key in _MULTILINE_KEYS and isinstance(value, str)
            else self._value(value)
            for key, value in event.items()
        }

    def _text(self, text: str, *, multiline: bool = False) -> str:
        text = self.redact(text)
        return _escape_lines(text) if multiline else escape(text)

    def _value(self, value: Any) -> Any:
        if value is None or isinstance(value, bool | int | float):
            return value
        if isinstance(value, str):
            return self._text(value)
        if isinstance(value, dict):
            return {self._key(k): self._value(v) for k, v in value.items()}
        if isinstance(value, list | tuple | set | frozenset):
            return [self._value(v) for v in value]
        # What the renderers would have shown: the repr, made safe like any text.
        return self._text(repr(value))

    def _key(self, key: Any) -> str:
        return self._text(key if isinstance(key, str) else repr(key))


# ---------------------------------------------------------------- set-up

_PRE_CHAIN: list[Processor] = [
    structlog.stdlib.add_log_level,
    structlog.stdlib.add_logger_name,
    structlog.processors.TimeStamper(fmt="iso"),
]


def build_formatter(fmt: str = "console", secrets: Iterable[str] = ()) -> logging.Formatter:
    """The formatter of every record: ``fmt`` is ``console`` or ``json``; ``secrets`` are redacted."""
    renderer: Processor = (
        structlog.processors.JSONRenderer()
        if fmt == "json"
        # Never rich's or better-exceptions' formatter (they print locals), should an
        # exc_info ever get past _render_exception.
        else structlog.dev.ConsoleRenderer(
            colors=False, exception_formatter=structlog.dev.plain_traceback
        )
    )
    return structlog.stdlib.ProcessorFormatter(
        processors=[
            structlog.stdlib.ProcessorFormatter.remove_processors_meta,
            _render_exception,
            _Sanitize(Redactor(secrets)),
            renderer,
        ],
        foreign_pre_chain=_PRE_CHAIN,
    )


class LogHandler(logging.StreamHandler[TextIO]):
    """The one handler :func:`configure_logging` installs."""

    def handleError(self, record: logging.LogRecord) -> None:
        """Say a record was lost; the default would print its raw message and arguments."""
        sys.stderr.write(f"--- a log record from {escape(record.name)} could not be written ---\n")


def configure_logging(
    level: str = "INFO",
    fmt: str = "console",
    secrets: Iterable[str] = (),
    *,
    stream: TextIO | None = None,
) -> None:
    """Route stdlib and structlog records through one safe renderer.

    Args:
        level: the root log level.
        fmt: ``console`` (key=value lines) or ``json`` (one object per line).
        secrets: values never to print (tokens, keys); each becomes ``[redacted]``.
        stream: where lines go; stderr by default.

    Replaces the handler an earlier call installed; handlers others added stay.
    """
    handler = LogHandler(stream or sys.stderr)
    handler.setFormatter(build_formatter(fmt, secrets))
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, LogHandler)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in NOISY_LOGGERS:
        logging.getLogger(noisy).setLevel(logging.WARNING)
    # structlog's own default would print tracebacks with their locals, to stdout.
    structlog.configure(
        processors=[*_PRE_CHAIN, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
    )
