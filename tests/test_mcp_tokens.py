"""MCP bearer tokens: ``kb mcp-token`` and the store part behind it, and the per-caller limit.

The store part runs on SQLite and on a real Postgres server (``tests.postgres``);
the CLI is driven through click's runner on a real data dir. The query log's
new columns (surface, client) are checked on both databases too.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from bot.cli import main
from bot.logs import REDACTED, Redactor
from bot.mcp.limits import WINDOW_SECONDS, CallLimiter
from index.storage import McpTokenError
from index.storage.store import Store
from tests.clocks import FakeTime
from tests.query_factory import log_question

USER = "U0ALICE001"
CHANNEL = "C0CHAN0001"


@pytest.fixture
def store(tmp_path: Path, database_url: str) -> Store:
    return Store(tmp_path / "kb-data", database_url=database_url, clock=FakeTime().clock)


def _run(data_dir: Path, *args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["--data-dir", str(data_dir), "mcp-token", *args])
    return result.exit_code, result.stdout, result.stderr


# ------------------------------------------------------------------ the store part


def test_an_issued_token_is_verified_as_its_person_and_scopes(store: Store) -> None:
    token, record = store.mcp_tokens.issue("alice", user_id=USER, scopes=(CHANNEL, CHANNEL))
    assert token.startswith("kbmcp_") and len(token) > 40
    found = store.mcp_tokens.verify(token)
    assert found == record
    assert (found.user_id, found.scopes, found.expires_at) == (USER, (CHANNEL,), None)


def test_only_the_tokens_hash_is_stored(store: Store, tmp_path: Path) -> None:
    token, _ = store.mcp_tokens.issue("alice", user_id=USER)
    [row] = list(store.db.query("SELECT * FROM mcp_tokens"))
    assert row["token_sha256"] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in json.dumps(row)
    store.close()
    for path in (tmp_path / "kb-data").rglob("*"):
        if path.is_file():
            assert token.encode() not in path.read_bytes(), path


@pytest.mark.parametrize(
    "presented",
    ["", "kbmcp_", "kbmcp_" + "A" * 43, "Bearer kbmcp_x", "x" * 300, "kbmcp_" + "é" * 10],
)
def test_a_token_never_issued_is_refused(store: Store, presented: str) -> None:
    store.mcp_tokens.issue("alice", user_id=USER)
    assert store.mcp_tokens.verify(presented) is None


def test_a_revoked_token_is_refused_and_stays_listed(store: Store) -> None:
    token, _ = store.mcp_tokens.issue("alice", user_id=USER)
    revoked = store.mcp_tokens.revoke("alice")
    assert revoked.revoked_at is not None and revoked.state(revoked.revoked_at) == "revoked"
    assert store.mcp_tokens.verify(token) is None
    assert [t.name for t in store.mcp_tokens.tokens()] == ["alice"]
    # Revoking again changes nothing; the name is never issued again.
    assert store.mcp_tokens.revoke("alice").revoked_at == revoked.revoked_at
    with pytest.raises(McpTokenError, match="exists already"):
        store.mcp_tokens.issue("alice", user_id=USER)


def test_a_token_is_refused_once_it_expires(tmp_path: Path, database_url: str) -> None:
    fake = FakeTime()
    store = Store(tmp_path / "kb-data", database_url=database_url, clock=fake.clock)
    token, record = store.mcp_tokens.issue("alice", user_id=USER, expires_in_days=2)
    assert record.expires_at == fake.now + 2 * 86400
    fake.now += 2 * 86400 - 1
    assert store.mcp_tokens.verify(token) is not None
    fake.now += 1
    assert store.mcp_tokens.verify(token) is None
    assert store.mcp_tokens.tokens()[0].state(fake.now) == "expired"


@pytest.mark.parametrize(
    ("name", "user", "scopes", "days", "message"),
    [
        ("has space", USER, (), None, "is not usable"),
        ("", USER, (), None, "is not usable"),
        ("alice", "alice", (), None, "is not a Slack user id"),
        ("alice", USER, ("#general",), None, "is not a Slack channel id"),
        ("alice", USER, ("*",), None, "always searchable"),
        ("alice", USER, (), 0, "positive number of days"),
        ("alice", USER, (), -3, "positive number of days"),
    ],
)
def test_bad_token_requests_are_refused_with_what_to_change(
    store: Store,
    name: str,
    user: str,
    scopes: tuple[str, ...],
    days: float | None,
    message: str,
) -> None:
    with pytest.raises(McpTokenError, match=message):
        store.mcp_tokens.issue(name, user_id=user, scopes=scopes, expires_in_days=days)
    assert store.mcp_tokens.tokens() == []


def test_revoking_a_token_nobody_issued_says_so(store: Store) -> None:
    with pytest.raises(McpTokenError, match="No MCP token is named 'ghost'"):
        store.mcp_tokens.revoke("ghost")


def test_the_query_log_keeps_surface_and_client(store: Store) -> None:
    mcp = log_question(store, "from an agent", surface="mcp", client="claude-alice")
    slack = log_question(store, "from Slack")
    assert (store.queries.get(mcp).surface, store.queries.get(mcp).client) == (
        "mcp",
        "claude-alice",
    )
    assert (store.queries.get(slack).surface, store.queries.get(slack).client) == ("slack", None)


# ------------------------------------------------------------------ kb mcp-token


def test_create_prints_the_token_once_and_list_never_shows_it(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb-data"
    code, out, err = _run(
        data_dir, "create", "--user", USER, "--name", "claude-alice", "--scope", CHANNEL,
        "--expires-days", "30",
    )  # fmt: skip
    assert code == 0, err
    token = out.strip()
    assert token.startswith("kbmcp_") and "\n" not in token
    assert "not shown again" in err and CHANNEL in err
    store = Store(data_dir)
    assert store.mcp_tokens.verify(token) is not None
    store.close()
    code, listed, _ = _run(data_dir, "list")
    assert code == 0 and "claude-alice" in listed and "active" in listed
    code, as_json, _ = _run(data_dir, "list", "--json")
    [row] = json.loads(as_json)
    assert row["name"] == "claude-alice" and row["scopes"] == [CHANNEL]
    digest = hashlib.sha256(token.encode()).hexdigest()
    for shown in (listed, as_json):
        assert token not in shown and digest not in shown


def test_revoke_stops_the_token(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb-data"
    _, out, _ = _run(data_dir, "create", "--user", USER, "--name", "t1")
    code, revoked, _ = _run(data_dir, "revoke", "t1")
    assert code == 0 and "Revoked 't1'" in revoked
    store = Store(data_dir)
    assert store.mcp_tokens.verify(out.strip()) is None
    store.close()
    code, listed, _ = _run(data_dir, "list")
    assert "revoked" in listed


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["create", "--user", "bob", "--name", "t"], "is not a Slack user id"),
        (["create", "--user", USER, "--name", "t", "--scope", "general"], "not a Slack channel"),
        (["create", "--user", USER, "--name", "t", "--expires-days", "0"], "positive number"),
        (["revoke", "ghost"], "No MCP token is named 'ghost'"),
    ],
)
def test_the_cli_refuses_bad_input_in_one_sentence(
    tmp_path: Path, args: list[str], message: str
) -> None:
    code, out, err = _run(tmp_path / "kb-data", *args)
    assert code == 1 and out == ""
    assert err.startswith("Error: ") and message in err and "Traceback" not in err


def test_a_name_is_never_issued_twice(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb-data"
    assert _run(data_dir, "create", "--user", USER, "--name", "t")[0] == 0
    code, out, err = _run(data_dir, "create", "--user", USER, "--name", "t")
    assert code == 1 and out == "" and "exists already" in err


# ------------------------------------------------------------------ the rate limit


def test_the_limit_admits_n_calls_in_any_minute_per_caller() -> None:
    fake = FakeTime()
    limiter = CallLimiter(3, clock=fake.clock)
    assert [limiter.admit("a") for _ in range(3)] == [None, None, None]
    assert limiter.admit("a") == WINDOW_SECONDS
    assert limiter.admit("b") is None  # another caller has its own window
    fake.now += 20
    assert limiter.admit("a") == 40
    fake.now += 40
    # The first three calls left the window; one more is admitted, then the limit holds.
    assert [limiter.admit("a") for _ in range(4)] == [None, None, None, WINDOW_SECONDS]


@pytest.mark.parametrize("days", [float("inf"), float("nan")])
def test_an_endless_or_undefined_expiry_is_refused(store: Store, days: float) -> None:
    with pytest.raises(McpTokenError, match="positive number of days"):
        store.mcp_tokens.issue("forever", user_id=USER, expires_in_days=days)
    assert store.mcp_tokens.tokens() == []


@pytest.mark.parametrize(
    "presented",
    [
        "kbmcp_" + "A" * 195,  # longer than any token: refused without a lookup
        " kbmcp_x",
        "KBMCP_x",
        "kbmcp_x\x00",
    ],
)
def test_a_tokens_hash_or_a_variant_of_it_is_refused(store: Store, presented: str) -> None:
    token, _ = store.mcp_tokens.issue("real", user_id=USER)
    digest = hashlib.sha256(token.encode()).hexdigest()
    for attempt in (
        presented,
        digest,
        "kbmcp_" + digest,
        token + "\x00",
        token.upper(),
        token[:-1],
    ):
        assert store.mcp_tokens.verify(attempt) is None
    assert store.mcp_tokens.verify(token) is not None


def test_a_token_is_redacted_from_any_log_line(store: Store) -> None:
    # A token pasted into a path (/mcp/<token>) reaches the access log as text.
    tokens = [store.mcp_tokens.issue(f"t{i}", user_id=USER)[0] for i in range(20)]
    line = " ".join(f"GET /mcp/{t} 404;" for t in tokens)
    redacted = Redactor()(line)
    assert not any(t in redacted for t in tokens)
    assert redacted.count(REDACTED) == len(tokens)
