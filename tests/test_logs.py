"""The log (``bot.logs``): plain tracebacks without locals, escaped values, redacted tokens and secrets."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Callable

import pytest
import structlog

from bot.logs import (
    REDACTED,
    LogHandler,
    Redactor,
    build_formatter,
    configure_logging,
    escape,
    format_exception,
)

FORMATS = ["console", "json"]
SECRET = "s3cret-value-in-a-local"
# What an attacker would put in a value to start a line of their own, and to reverse what follows.
FORGED = "\r\n2026-01-01T00:00:00.000000Z [critical ] forged \u202etxt.exe\u2066"
RAW_CONTROLS = ["\r", "\x1b", "\x85", "\u2028", "\u202e", "\u2066"]

ProductLogs = Callable[..., io.StringIO]


def _fail_with_a_secret_local() -> None:
    token = SECRET  # noqa: F841 - the local a traceback must not show
    headers = {"Authorization": f"Bearer {SECRET}"}  # noqa: F841
    raise RuntimeError("the model sent garbage")


def _logged_failure() -> None:
    try:
        _fail_with_a_secret_local()
    except RuntimeError:
        logging.getLogger("kb.test").exception("request failed")


def _records(out: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.splitlines()]


@pytest.mark.parametrize("fmt", FORMATS)
def test_tracebacks_show_no_local_variables(product_logs: ProductLogs, fmt: str) -> None:
    out = product_logs(fmt)
    _logged_failure()
    text = out.getvalue()
    assert "_fail_with_a_secret_local" in text and "the model sent garbage" in text
    assert SECRET not in text


def test_json_logs_carry_the_stack_trace_as_text(product_logs: ProductLogs) -> None:
    out = product_logs("json")
    _logged_failure()
    (record,) = _records(out.getvalue())
    exception = record["exception"]
    assert isinstance(exception, str)
    assert exception.startswith("Traceback (most recent call last):")
    assert "in _fail_with_a_secret_local" in exception
    assert exception.endswith("RuntimeError: the model sent garbage")
    assert record["event"] == "request failed" and record["level"] == "error"


def test_console_tracebacks_keep_their_lines(product_logs: ProductLogs) -> None:
    out = product_logs("console")
    _logged_failure()
    lines = out.getvalue().splitlines()
    assert "[error" in lines[0] and "request failed" in lines[0]
    assert lines[1] == "Traceback (most recent call last):"
    assert lines[-1] == "RuntimeError: the model sent garbage"


def _log_forged_values() -> None:
    log = logging.getLogger("kb.test")
    log.info("question: %s", FORGED)
    log.info("message itself" + FORGED)
    log.warning("nested %s", {"name": FORGED, "parts": [FORGED]})
    structlog.get_logger("kb.test").info("native", name=FORGED)
    try:
        raise ValueError(f"cannot read {FORGED!s}")
    except ValueError:
        log.exception("upload failed for %s", FORGED)


@pytest.mark.parametrize("fmt", FORMATS)
def test_no_value_can_start_a_line_or_reorder_one(product_logs: ProductLogs, fmt: str) -> None:
    out = product_logs(fmt)
    _log_forged_values()
    text = out.getvalue()
    assert text.count("[critical ] forged") == 7
    assert not [c for c in RAW_CONTROLS if c in text]
    # splitlines() breaks at every line boundary a viewer might honour, not only LF.
    assert not [line for line in text.splitlines() if line.startswith("2026-01-01")]
    if fmt == "json":
        assert len(_records(text)) == 5
    else:
        assert "\\r\\n2026-01-01" in text and "\\u202etxt.exe\\u2066" in text


def test_exception_chains_are_kept_and_escaped() -> None:
    try:
        try:
            raise KeyError("channel")
        except KeyError as exc:
            raise ValueError("line one\nline two") from exc
    except ValueError as exc:
        text = format_exception(exc)
    assert text.index("KeyError: 'channel'") < text.index("direct cause") < text.index("ValueError")
    assert "ValueError: line one\\x0aline two" in text


def test_exception_groups_show_each_exception() -> None:
    group = ExceptionGroup("two failures", [KeyError("a"), OSError("disk\nfull")])
    text = format_exception(group)
    assert "KeyError: 'a'" in text and "OSError: disk\\x0afull" in text


@pytest.mark.parametrize(
    "url",
    [
        "http://kb.test/d/12?t=eyJkIjoxMn0.Z2V0.c2ln#char=1,20",
        "/d/12/file?t=eyJkIjoxMn0.Z2V0.c2ln",
        "/d/12?x=1&t=eyJkIjoxMn0.Z2V0.c2ln",
        "<http://kb.test/d/12?t=eyJkIjoxMn0.Z2V0.c2ln|[1]>",
    ],
)
def test_citation_link_tokens_are_redacted(url: str) -> None:
    redacted = Redactor()(f"opened {url} today")
    assert "eyJkIjoxMn0" not in redacted and f"t={REDACTED}" in redacted


def test_configured_secrets_are_redacted(product_logs: ProductLogs) -> None:
    out = product_logs("console", secrets=["xoxb-configured-123", "signing-456789"])
    logging.getLogger("slack_sdk").debug("headers: Bearer xoxb-configured-123, signing-456789")
    assert out.getvalue().count(REDACTED) == 2 and "configured-123" not in out.getvalue()


def test_very_short_secrets_do_not_garble_the_log() -> None:
    assert Redactor(["x", ""])("a text with x in it") == "a text with x in it"


def test_escape_writes_control_characters_visibly() -> None:
    assert escape("a\nb\tc\x85\u202e") == "a\\x0ab\\x09c\\x85\\u202e"
    assert escape("plain café – ok") == "plain café – ok"


def test_configure_logging_replaces_only_its_own_handler() -> None:
    other = logging.NullHandler()
    root = logging.getLogger()
    root.addHandler(other)
    try:
        configure_logging("INFO", "console", stream=io.StringIO())
        configure_logging("INFO", "json", stream=io.StringIO())
        assert sum(isinstance(h, LogHandler) for h in root.handlers) == 1
        assert other in root.handlers
    finally:
        root.removeHandler(other)


def test_slacks_web_client_never_logs_the_bodies_it_reads(product_logs: ProductLogs) -> None:
    out = product_logs("json")
    # What slack_sdk logs for each call at DEBUG: a thread's messages, people's own words.
    client_log = logging.getLogger("slack_sdk.web.async_base_client")
    client_log.debug("Received the following response - body: {'text': 'a colleague wrote'}")
    client_log.warning("rate limited")
    assert "a colleague wrote" not in out.getvalue()
    assert "rate limited" in out.getvalue()


@pytest.mark.parametrize("name", ["aiohttp.server", "aiohttp.web", "aiohttp.access", "slack_bolt"])
def test_library_loggers_go_through_the_same_handler(product_logs: ProductLogs, name: str) -> None:
    out = product_logs("json")
    logging.getLogger(name).error("GET /d/3?t=abc.def HTTP/1.1\nforged")
    (record,) = _records(out.getvalue())
    assert record["logger"] == name
    assert record["event"] == f"GET /d/3?t={REDACTED} HTTP/1.1\\x0aforged"


def test_a_record_that_cannot_be_formatted_is_reported_without_its_arguments(
    capsys: pytest.CaptureFixture[str],
) -> None:
    handler = LogHandler(io.StringIO())
    handler.setFormatter(build_formatter())
    record = logging.LogRecord("kb.test", logging.INFO, __file__, 1, "%s and %s", (SECRET,), None)
    handler.handle(record)
    err = capsys.readouterr().err
    assert "a log record from kb.test could not be written" in err and SECRET not in err
