"""A setting's value outside what it can mean stops ``kb`` at start, naming the setting.

An operator's mistake (``nan``, ``inf``, a negative number of seconds, a port
past 65535, a threshold no cosine distance can reach) was read as given and
became a wrong value in silence: a timeout of ``nan`` waits forever or never,
a negative one fails every call, ``KB_LINK_TTL_DAYS=-1`` crashed on the first
link with a traceback, ``KB_PORT=99999`` logged "serving on port 99999".
Each is now refused where the settings are read, in an error naming the
variable and not echoing the value.

So is a value past any a real operator could need (``KB_TOP_K=10**30``, a port
of 99999999, a million reader processes, a byte limit past any memory), which
crashed or hung later: every integer setting has an upper bound, said in its
description. So has every setting of seconds, hours, days or distance:
``KB_EXTRACT_TIMEOUT=1e10`` failed every document with an ``OverflowError``, a
wait longer than the operating system can make.
"""

from __future__ import annotations

import threading

import pytest
from annotated_types import Le
from click.testing import CliRunner
from pydantic import ValidationError
from pydantic.fields import FieldInfo

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
    ("KB_TOP_K", "101"),
    ("KB_TOP_K", str(10**30)),
    ("KB_MAX_KEPT", "101"),
    ("KB_PORT", "65536"),
    ("KB_EXTRACT_WORKERS", "65"),
    ("KB_MAX_UPLOAD_BYTES", str(1024**3 + 1)),
    ("KB_MAX_TEXT_CHARS", str(10**12)),
    ("KB_MIN_FREE_BYTES", str(10**30)),
    ("KB_LINK_TTL_DAYS", "36501"),
    ("KB_CHUNK_BUDGET", str(10**9)),
    ("KB_EXTRACT_TIMEOUT", "1e10"),
    ("KB_LLM_DEADLINE", "1e300"),
    ("KB_KEEP_MARGIN", "2.5"),
]

# Every integer setting and its bounds: a new one without an upper bound fails here.
UPPER = {
    "KB_EMBEDDING_BATCH_SIZE": 2048,
    "KB_EMBEDDING_MAX_RETRIES": 20,
    "KB_EMBEDDING_MAX_TOKENS": 131_072,
    "KB_EMBEDDING_DIMENSIONS": 16_384,
    "KB_MAX_UPLOAD_BYTES": 1024**3,
    "KB_MAX_PAGES": 100_000,
    "KB_MAX_CHUNKS": 1_000_000,
    "KB_MAX_TEXT_CHARS": 1_000_000_000,
    "KB_EXTRACT_MEMORY_MB": 65_536,
    "KB_EXTRACT_WORKERS": 64,
    "KB_CHUNK_BUDGET": 32_768,
    "KB_KEEP_VERSIONS": 1000,
    "KB_MIN_FREE_BYTES": 1024**5,
    "KB_OCR_MAX_PAGES": 100_000,
    "KB_TOP_K": 100,
    "KB_MAX_KEPT": 100,
    "KB_LLM_MAX_RETRIES": 10,
    "KB_LINK_TTL_DAYS": 36_500,
    "KB_PORT": 65_535,
    "KB_HTTP_MAX_CONNECTIONS": 1_048_576,
    "KB_MCP_CALLS_PER_MINUTE": 60_000,
    "KB_MAX_UPLOADS_PER_USER": 1000,
    "KB_MAX_QUESTIONS_PER_USER": 100,
}

# Every setting of seconds, hours, days or distance, and its bound: the same.
UPPER_FLOAT = {
    "KB_EMBEDDING_TIMEOUT": 86_400,
    "KB_EXTRACT_TIMEOUT": 86_400,
    "KB_OCR_TIMEOUT": 86_400,
    "KB_FAILED_RETENTION_DAYS": 36_500,
    "KB_KEEP_MARGIN": 2,
    "KB_SENTENCE_WEIGHT": 10,
    "KB_PROXIMITY_WEIGHT": 10,
    "KB_LATENT_WEIGHT": 10,
    "KB_THRESHOLD": 2,
    "KB_RELATED_THRESHOLD": 2,
    "KB_LLM_TIMEOUT": 86_400,
    "KB_LLM_FIRST_TOKEN_TIMEOUT": 86_400,
    "KB_LLM_DEADLINE": 86_400,
    "KB_VIEWER_SESSION_HOURS": 8_760,
    "KB_HTTP_HEADER_TIMEOUT": 86_400,
    "KB_HTTP_BODY_TIMEOUT": 86_400,
    "KB_HTTP_KEEPALIVE_TIMEOUT": 86_400,
    "KB_SYNC_SECONDS": 86_400,
    "KB_DOWNLOAD_TIMEOUT": 86_400,
    "KB_SLACK_CLAIM_LEASE": 86_400,
    "KB_UPLOAD_SWEEP_SECONDS": 86_400,
    "KB_CANVAS_SYNC_SECONDS": 2_592_000,
    "KB_SOURCE_SYNC_MINUTES": 43_200,
}

# What each bound is in seconds, for the settings that are times.
SECONDS_PER_UNIT = {"HOURS": 3_600, "DAYS": 86_400, "MINUTES": 60}


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


def _env(field: FieldInfo) -> str:
    return str(field.validation_alias.choices[0])  # type: ignore[union-attr]


def test_every_integer_setting_has_an_upper_bound_its_description_gives() -> None:
    bounds = {
        _env(f): next(m.le for m in f.metadata if isinstance(m, Le))
        for f in Settings.model_fields.values()
        if f.annotation in (int, int | None) and any(isinstance(m, Le) for m in f.metadata)
    }
    integers = {
        _env(f) for f in Settings.model_fields.values() if f.annotation in (int, int | None)
    }
    assert bounds == {env: UPPER[env] for env in integers}
    for field in Settings.model_fields.values():
        if _env(field) in bounds:
            description = field.description or ""
            assert "At most " in description and str(bounds[_env(field)]) in description, field


def test_every_float_setting_has_an_upper_bound_its_description_gives() -> None:
    bounds = {
        _env(f): next((m.le for m in f.metadata if isinstance(m, Le)), None)
        for f in Settings.model_fields.values()
        if f.annotation in (float, float | None)
    }
    assert bounds == UPPER_FLOAT
    for field in Settings.model_fields.values():
        if _env(field) in bounds:
            bound = bounds[_env(field)]
            assert "At most " in (field.description or ""), field
            assert f"{bound:.0f}" in (field.description or ""), field


def test_every_time_bound_is_a_wait_the_operating_system_can_make() -> None:
    # threading's waits (a reader's result, a lock) raise OverflowError past TIMEOUT_MAX.
    not_times = {"KB_KEEP_MARGIN", "KB_THRESHOLD", "KB_RELATED_THRESHOLD"}
    for env, bound in UPPER_FLOAT.items():
        if env in not_times or env.endswith("_WEIGHT"):
            continue
        unit = next((s for u, s in SECONDS_PER_UNIT.items() if env.endswith(u)), 1)
        assert bound * unit < threading.TIMEOUT_MAX, env


@pytest.mark.parametrize("env", list(UPPER) + list(UPPER_FLOAT))
def test_each_upper_bound_is_read_as_given_and_one_past_it_is_refused(
    monkeypatch: pytest.MonkeyPatch, env: str
) -> None:
    if env == "KB_TOP_K":
        monkeypatch.setenv("KB_MAX_KEPT", str(UPPER["KB_MAX_KEPT"]))
    bound = {**UPPER, **UPPER_FLOAT}[env]
    if env == "KB_THRESHOLD":
        monkeypatch.setenv("KB_RELATED_THRESHOLD", str(bound))
    monkeypatch.setenv(env, str(bound))
    field = next(n for n, f in Settings.model_fields.items() if _env(f) == env)
    assert getattr(Settings(_env_file=None), field) == bound  # type: ignore[call-arg]
    monkeypatch.setenv(env, str(bound + 1))
    with pytest.raises(ValidationError) as raised:
        Settings(_env_file=None)  # type: ignore[call-arg]
    assert env in str(raised.value) and "less than or equal to" in str(raised.value)


@pytest.mark.parametrize(
    ("env", "value"),
    [
        ("KB_PORT", "99999999"),  # a port
        ("KB_TOP_K", str(10**30)),  # a count
        ("KB_EXTRACT_WORKERS", "1000000"),  # processes
        ("KB_MAX_UPLOAD_BYTES", str(10**15)),  # a size
        ("KB_LINK_TTL_DAYS", str(10**9)),  # a time
        ("KB_EXTRACT_TIMEOUT", "1e10"),  # a wait: failed every document with OverflowError
    ],
)
def test_kb_stops_at_start_on_a_value_past_the_bound_naming_the_setting(
    monkeypatch: pytest.MonkeyPatch, tmp_path: object, env: str, value: str
) -> None:
    monkeypatch.setenv(env, value)
    monkeypatch.chdir(tmp_path)  # type: ignore[arg-type]
    result = CliRunner().invoke(main, ["status"])
    assert result.exit_code == 1
    assert "Invalid configuration" in result.output and env in result.output
    assert "less than or equal to" in result.output
    assert value not in result.output  # never echoed
    assert "Traceback" not in result.output
    # Nothing was created in the working directory's data dir: kb stopped before it.
    assert not (tmp_path / "kb-data").exists()  # type: ignore[operator]
