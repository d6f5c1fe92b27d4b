"""Secrets stay secret: typed as secrets in the settings, out of every repr, and the canary
check of the test session (``tests/canaries.py``) really finds a leak."""

from __future__ import annotations

import logging
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import SecretStr

from bot.cli import base, main
from bot.settings import Settings, env_var_names
from core.links import SECRET_FILENAME
from tests.canaries import CANARIES, LeakRecorder, canaries_in, masked, report, scan_files

SECRETS = {
    "SLACK_BOT_TOKEN": "xoxb-typed-secret-bot",
    "SLACK_SIGNING_SECRET": "typed-secret-signing",
    "SLACK_APP_TOKEN": "xapp-typed-secret-app",
    "OPENAI_API_KEY": "sk-typed-secret-openai",
    "KB_LINK_SECRET": "typed-secret-link",
}


@pytest.fixture
def settings(monkeypatch: pytest.MonkeyPatch) -> Settings:
    for env, value in SECRETS.items():
        monkeypatch.setenv(env, value)
    return Settings()


def test_every_secret_setting_is_a_secret_str(settings: Settings) -> None:
    fields = dict(zip(env_var_names(), Settings.model_fields.values(), strict=True))
    secret = {env for env in fields if re.search(r"(TOKEN|SECRET|KEY)$", env)}
    assert set(SECRETS) <= secret
    assert [env for env in secret if fields[env].annotation is not SecretStr] == []
    assert sorted(settings.secret_values()) == sorted(SECRETS.values())


def test_no_repr_shows_a_secret(settings: Settings) -> None:
    engine, slack = settings.engine_config(), settings.slack_config()
    shown = " ".join(
        [repr(settings), str(settings), repr(engine), repr(engine.llm), repr(slack), str(slack)]
    )
    assert [v for v in SECRETS.values() if v in shown] == []


def test_each_layer_gets_its_secrets_unwrapped(settings: Settings) -> None:
    engine, slack = settings.engine_config(), settings.slack_config()
    assert engine.link_secret == SECRETS["KB_LINK_SECRET"]
    assert engine.llm.api_key == SECRETS["OPENAI_API_KEY"]
    assert (slack.bot_token, slack.signing_secret, slack.app_token) == (
        SECRETS["SLACK_BOT_TOKEN"],
        SECRETS["SLACK_SIGNING_SECRET"],
        SECRETS["SLACK_APP_TOKEN"],
    )


def test_unset_secrets_are_empty() -> None:
    settings = Settings()
    assert settings.secret_values() == []
    assert settings.slack_config().missing and settings.engine_config().link_secret == ""


def test_the_kb_command_hands_its_secrets_to_the_log(
    settings: Settings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    calls: list[Iterable[str]] = []

    def record(level: str, fmt: str, secrets: Iterable[str] = ()) -> None:
        calls.append(list(secrets))

    monkeypatch.setattr(base, "configure_logging", record)
    result = CliRunner().invoke(main, ["--data-dir", str(tmp_path / "kb"), "docs", "--json"])
    assert result.exit_code == 0, result.output
    assert [sorted(c) for c in calls] == [sorted(SECRETS.values())]


# ---------------------------------------------------------------- the canary check itself


def _isolated_logger(recorder: LeakRecorder) -> logging.Logger:
    """A logger whose records reach only ``recorder``, not the session's own check."""
    log = logging.getLogger(f"tests.canary-proof.{id(recorder)}")
    log.handlers[:] = [recorder]
    log.propagate = False
    log.setLevel(logging.DEBUG)
    return log


def test_the_check_finds_a_canary_in_a_log_message() -> None:
    recorder = LeakRecorder()
    recorder.during = "this test"
    _isolated_logger(recorder).info("calling Slack with %s", CANARIES["DEFAULT_BOT_TOKEN"])
    assert [(leak.canary, leak.where) for leak in recorder.leaks] == [
        (
            "DEFAULT_BOT_TOKEN",
            f"a INFO record of {_isolated_logger(recorder).name} during this test",
        )
    ]


def test_the_check_finds_a_canary_in_a_traceback() -> None:
    recorder = LeakRecorder()
    log = _isolated_logger(recorder)
    try:
        raise PermissionError(f"rejected key {CANARIES['DEFAULT_OPENAI_API_KEY']}")
    except PermissionError:
        log.exception("model call failed")
    assert [leak.canary for leak in recorder.leaks] == ["DEFAULT_OPENAI_API_KEY"]


def test_the_check_finds_a_canary_in_a_file_but_not_in_secret_files() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "data").mkdir()
        (root / "data" / "kb.sqlite").write_bytes(b"\x00" + CANARIES["LINK_SECRET"].encode())
        (root / "data" / SECRET_FILENAME).write_text(CANARIES["LINK_SECRET"])
        (root / ".env").write_text(f"SLACK_APP_TOKEN={CANARIES['DEFAULT_APP_TOKEN']}\n")
        leaks = scan_files(root)
    assert [(leak.canary, leak.where) for leak in leaks] == [
        ("LINK_SECRET", f"file {root / 'data' / 'kb.sqlite'}")
    ]


def test_the_check_finds_a_canary_past_a_sparse_files_holes(tmp_path: Path) -> None:
    # As Qdrant preallocates its pages: a large file, mostly holes, written here and there.
    pages = tmp_path / "page_0.dat"
    with pages.open("wb") as out:
        out.truncate(64 * 1024 * 1024)
        out.seek(40 * 1024 * 1024 - 5)  # across a block's end, after a hole
        out.write(CANARIES["DEFAULT_BOT_TOKEN"].encode())
    assert [leak.canary for leak in scan_files(tmp_path)] == ["DEFAULT_BOT_TOKEN"]
    # Two stretches of data never join into a canary across the hole between them.
    token = CANARIES["DEFAULT_OPENAI_API_KEY"].encode()
    with pages.open("wb") as out:
        out.truncate(64 * 1024 * 1024)
        out.write(token[:8])
        out.seek(32 * 1024 * 1024)
        out.write(token[8:])
    assert scan_files(tmp_path) == []


def test_the_report_names_canary_and_place_but_not_the_whole_secret() -> None:
    recorder = LeakRecorder()
    _isolated_logger(recorder).warning("signing with %s", CANARIES["DEFAULT_SIGNING_SECRET"])
    message = report(recorder.leaks)
    assert "DEFAULT_SIGNING_SECRET" in message and "WARNING record" in message
    assert masked(CANARIES["DEFAULT_SIGNING_SECRET"]) in message
    assert canaries_in(message) == []


def test_every_secret_the_tests_configure_is_a_canary() -> None:
    assert {"DEFAULT_BOT_TOKEN", "DEFAULT_APP_TOKEN", "DEFAULT_SIGNING_SECRET"} <= set(CANARIES)
    assert {"DEFAULT_OPENAI_API_KEY", "LINK_SECRET"} <= set(CANARIES)
    assert all(len(value) >= 20 for value in CANARIES.values())


def test_the_link_secret_the_data_dir_keeps_is_redacted_too(tmp_path: Path) -> None:
    from core.links import SECRET_FILENAME, load_or_create_secret

    data_dir = tmp_path / "kb"
    kept = load_or_create_secret(data_dir, "")
    assert (data_dir / SECRET_FILENAME).exists()
    assert kept in Settings(data_dir=data_dir).secret_values()
