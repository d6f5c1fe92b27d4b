"""A setting's value outside what it can mean stops ``kb`` at start, naming the setting.

An operator's mistake (``nan``, ``inf``, a negative number of seconds, a port
past 65535, a threshold no cosine distance can reach) was read as given and
became a wrong value in silence: a timeout of ``nan`` waits forever or never,
a negative one fails every call, ``KB_LINK_TTL_DAYS=-1`` crashed on the first
link with a traceback, ``KB_PORT=99999`` logged "serving on port 99999".
Each is now refused where the settings are read, in an error naming the
variable and not echoing the value.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from pydantic import ValidationError

from bot.cli import main
from bot.settings import Settings

REFUSED = [
    ("KB_LLM_TIMEOUT", "nan"),
    ("KB_LLM_TIMEOUT", "inf"),
    ("KB_LLM_TIMEOUT", "-1"),
    ("KB_LLM_TIMEOUT", "0"),
    ("KB_LLM_FIRST_TOKEN_TIMEOUT", "-inf"),
    ("KB_LLM_FIRST_TOKEN_TIMEOUT", "0"),
    ("KB_LLM_DEADLINE", "-5"),
    ("KB_LLM_DEADLINE", "nan"),
    ("KB_LLM_MAX_RETRIES", "-1"),
    ("KB_LLM_MAX_RETRIES", "true"),
    ("KB_THRESHOLD", "nan"),
    ("KB_THRESHOLD", "-0.1"),
    ("KB_THRESHOLD", "2.5"),
    ("KB_RELATED_THRESHOLD", "inf"),
    ("KB_RELATED_THRESHOLD", "-1"),
    ("KB_KEEP_MARGIN", "inf"),
    ("KB_EMBEDDING_TIMEOUT", "inf"),
    ("KB_HTTP_BODY_TIMEOUT", "inf"),
    ("KB_SYNC_SECONDS", "inf"),
    ("KB_VIEWER_SESSION_HOURS", "inf"),
    ("KB_SOURCE_SYNC_MINUTES", "inf"),
    ("KB_FAILED_RETENTION_DAYS", "nan"),
    ("KB_FAILED_RETENTION_DAYS", "-1"),
    ("KB_LINK_TTL_DAYS", "-1"),
    ("KB_LINK_TTL_DAYS", "0"),
    ("KB_PORT", "99999"),
    ("KB_PORT", "-1"),
    ("KB_PORT", "true"),
    ("KB_MAX_UPLOAD_BYTES", "-1"),
    ("KB_MAX_UPLOAD_BYTES", "0"),
    ("KB_KEEP_VERSIONS", "0"),
    ("KB_KEEP_VERSIONS", "-3"),
    ("KB_MIN_FREE_BYTES", "-1"),
    ("KB_EMBEDDING_DIMENSIONS", "-1"),
    ("KB_MAX_KEPT", "0"),
    ("KB_TOP_K", "true"),
    ("KB_TOP_K", "1e3"),
    ("KB_TOP_K", "2.5"),
    ("KB_MCP", "2"),
]


@pytest.mark.parametrize(("env", "value"), REFUSED)
def test_a_value_a_setting_cannot_mean_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(ValidationError) as raised:
        Settings(_env_file=None)  # type: ignore[call-arg]
    message = str(raised.value)
    assert env in message
    assert f"input_value='{value}'" not in message  # the input may hold a token: never echoed


@pytest.mark.parametrize(
    ("env", "value", "field", "read"),
    [
        ("KB_THRESHOLD", "0", "threshold", 0.0),
        ("KB_THRESHOLD", "2", "threshold", 2.0),
        ("KB_RELATED_THRESHOLD", "0.6", "related_threshold", 0.6),
        ("KB_PORT", "65535", "port", 65535),
        ("KB_LLM_MAX_RETRIES", "0", "llm_max_retries", 0),
        ("KB_MIN_FREE_BYTES", "0", "min_free_bytes", 0),
        ("KB_FAILED_RETENTION_DAYS", "0", "failed_retention_days", 0.0),
        ("KB_EMBEDDING_DIMENSIONS", "0", "embedding_dimensions", 0),
        ("KB_KEEP_VERSIONS", "1", "keep_versions", 1),
        ("KB_SOURCE_SYNC_MINUTES", "0", "source_sync_minutes", 0.0),
        ("KB_LLM_DEADLINE", "0.5", "llm_deadline", 0.5),
    ],
)
def test_the_edges_a_setting_can_mean_are_read_as_given(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, field: str, read: float
) -> None:
    monkeypatch.setenv(env, value)
    assert getattr(Settings(_env_file=None), field) == read  # type: ignore[call-arg]


def test_kb_says_which_setting_is_wrong_without_a_traceback(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object
) -> None:
    monkeypatch.setenv("KB_LLM_TIMEOUT", "nan")
    monkeypatch.chdir(tmp_path)  # type: ignore[arg-type]
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 1
    assert "Invalid configuration" in result.output and "KB_LLM_TIMEOUT" in result.output
    assert "Traceback" not in result.output
