"""``kb questions``: who asked what, where and when, from the query log."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from bot.cli import main
from index.storage.store import Store
from tests.clocks import FakeTime
from tests.query_factory import log_question


def _store(tmp_path: Path, database_url: str = "") -> tuple[Store, FakeTime]:
    clock = FakeTime()
    return Store(tmp_path / "kb-data", database_url=database_url, clock=clock.clock), clock


def _logged(store: Store, clock: FakeTime) -> dict[str, int]:
    ids = {}
    for question, surface, client in (
        ("How do I claim expenses?", "slack", None),
        ("What is the VPN address?", "mcp", "claude-alice"),
        ("Who is on call?", "cli", None),
    ):
        ids[question] = log_question(
            store, question, surface=surface, client=client, user="U0ALICE001"
        )
        clock.now += 60
    return ids


def test_the_latest_questions_come_newest_first_and_by_surface(
    tmp_path: Path, database_url: str
) -> None:
    store, clock = _store(tmp_path, database_url)
    ids = _logged(store, clock)
    latest = store.queries.latest(10)
    assert [q.record.question for q in latest] == [
        "Who is on call?",
        "What is the VPN address?",
        "How do I claim expenses?",
    ]
    assert latest[0].at - latest[1].at == 60
    assert [q.id for q in store.queries.latest(1)] == [ids["Who is on call?"]]
    [agent] = store.queries.latest(10, surface="mcp")
    assert (agent.id, agent.record.client) == (ids["What is the VPN address?"], "claude-alice")
    assert store.queries.latest(10, surface="nowhere") == []


def _run(data_dir: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, ["--data-dir", str(data_dir), "questions", *args])
    return result.exit_code, result.output


def test_kb_questions_says_who_asked_what_where(tmp_path: Path) -> None:
    store, clock = _store(tmp_path)
    _logged(store, clock)
    store.close()
    code, out = _run(tmp_path / "kb-data")
    assert code == 0, out
    lines = out.splitlines()
    assert len(lines) == 3
    assert "Who is on call?" in lines[0] and " cli " in lines[0]
    assert "mcp:claude-alice" in lines[1] and "U0ALICE001" in lines[1]
    code, out = _run(tmp_path / "kb-data", "--surface", "mcp", "--json")
    [row] = json.loads(out)
    assert (row["question"], row["surface"], row["client"]) == (
        "What is the VPN address?",
        "mcp",
        "claude-alice",
    )


def test_a_hostile_question_is_shown_inert_on_one_line(tmp_path: Path) -> None:
    store, _ = _store(tmp_path)
    log_question(store, "line one\nFAKE 1 2026-01-01 slack ok\x1b[2J\x1b]8;;https://evil\x07x")
    store.close()
    code, out = _run(tmp_path / "kb-data")
    assert code == 0
    assert len(out.splitlines()) == 1
    assert "\x1b" not in out and "\x07" not in out and "\\x1b" in out


def test_no_questions_and_bad_options_say_so(tmp_path: Path) -> None:
    assert _run(tmp_path / "kb-data") == (0, "No questions asked yet.\n")
    code, out = _run(tmp_path / "kb-data", "--surface", "teams")
    assert code == 2 and "'teams' is not one of" in out
    code, out = _run(tmp_path / "kb-data", "--limit", "0")
    assert code == 2 and "--limit" in out
