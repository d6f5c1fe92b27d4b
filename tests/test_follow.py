"""The running bot follows what other processes commit: `kb ingest`, `kb rm`, `kb reindex`.

Each test runs the bot's app on a loopback server and the real ``kb`` command
in a second process on the same data dir, in a thread so the event loop keeps
serving Slack events and ``/readyz`` meanwhile.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bot.server.routes import REFRESH_FAILED, set_max_behind
from core.answer import Outcome
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import IN_DOMAIN, Bot, BotFactory  # noqa: E402
from tests.servers import app_mention_event  # noqa: E402

PARKING = b"""# Visitor parking

## Garage

Visitors park on level 3 of the garage behind the office; the gate code is 4711.
"""
PARKING_Q = "Where do visitors park their car, and what is the gate code?"
# KB_SYNC_SECONDS (1 s by default) plus one incremental refresh is about 1.1 s
# (docs/benchmarks.md); the rest is room for a machine shared with other test runs.
BOUND_S = 3.0
POLL_S = 0.02


def _kb_command(data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run ``kb --data-dir DATA_DIR ARGS...`` as its own process, as an operator would."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("KB_DATA_DIR", None)
    return subprocess.run(
        [sys.executable, "-m", "bot.cli", "--data-dir", str(data_dir), *args],
        env=env,
        cwd=data_dir.parent,  # no .env of the repository
        capture_output=True,
        text=True,
        timeout=180,
        check=True,
    )


async def _ready(bot: Bot) -> dict[str, Any]:
    resp = await bot.http.get("/readyz")
    body: dict[str, Any] = await resp.json()
    assert resp.status == 200, body
    return body


async def _run_and_follow(bot: Bot, *args: str) -> float:
    """Run a ``kb`` command beside the bot; seconds from its first commit to the bot having it.

    ``/readyz`` is polled throughout and must stay 200.
    """
    before = (await _ready(bot))["index"]["generation"]
    command = asyncio.create_task(asyncio.to_thread(_kb_command, bot.settings.data_dir, *args))
    committed: tuple[int, float] | None = None
    followed: float | None = None
    done_at: float | None = None
    while True:
        index = (await _ready(bot))["index"]
        now = time.monotonic()
        if committed is None and index["generation"] > before:
            committed = (index["generation"], now)
        if committed and followed is None and index["snapshot_generation"] >= committed[0]:
            followed = now - committed[1]
        if command.done():
            await command  # raises if the command failed
            assert committed, f"kb {' '.join(args)} committed nothing"
            if followed is not None and index["lag"] == 0:
                return followed
            done_at = done_at or now
            assert now - done_at <= BOUND_S, f"the bot did not follow kb {' '.join(args)}"
        await asyncio.sleep(POLL_S)


async def _ask_in_slack(bot: Bot, question: str, count: int) -> str:
    """Ask through a signed Slack event; the answer's text and blocks."""
    await bot.event(app_mention_event(question))
    return json.dumps(await bot.answer(count), ensure_ascii=False)


async def test_a_shell_ingest_and_removal_reach_the_running_bot_within_the_bound(
    bot: Bot, tmp_path: Path
) -> None:
    source = tmp_path / "parking.md"
    source.write_bytes(PARKING)
    assert "Visitor parking" not in await _ask_in_slack(bot, PARKING_Q, 1)

    took = await _run_and_follow(bot, "ingest", str(source))
    assert took <= BOUND_S, f"the bot took {took:.2f} s to see a shell ingest"
    assert "Visitor parking" in await _ask_in_slack(bot, PARKING_Q, 2)

    took = await _run_and_follow(bot, "rm", "parking.md")
    assert took <= BOUND_S, f"the bot took {took:.2f} s to see a shell removal"
    assert "Visitor parking" not in await _ask_in_slack(bot, PARKING_Q, 3)
    body = await _ready(bot)
    assert body["index"]["lag"] == 0 and body["index"]["in_sync"] is True


async def test_questions_are_answered_during_and_after_a_shell_reindex(
    bot: Bot, tmp_path: Path
) -> None:
    # More documents: a longer reindex, more of its commits land between two syncs.
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(20):
        (corpus / f"team{i}.md").write_text(f"# Team {i}\n\nTeam {i} meets on floor {i}.\n")
    await asyncio.to_thread(bot.kb.ingest_paths, [corpus])
    outcomes: list[Outcome] = []

    async def keep_asking() -> None:
        while True:
            outcomes.append((await bot.services.engine.ask(IN_DOMAIN)).outcome)
            await asyncio.sleep(0.05)

    asker = asyncio.create_task(keep_asking())
    try:
        took = await _run_and_follow(bot, "reindex")
    finally:
        asker.cancel()
    assert took <= BOUND_S
    assert outcomes and set(outcomes) == {Outcome.ANSWERED}, outcomes
    assert "handbook" in (await _ask_in_slack(bot, IN_DOMAIN, 1)).lower()


async def test_a_question_right_after_another_process_reindexed_is_answered(
    make_bot: BotFactory, embedder: Embedder
) -> None:
    bot = await make_bot(sync_seconds=3600)  # nothing follows: the engine must catch up itself
    # Another process's knowledge base on the same data dir (in this one, to keep the test quick).
    other = KnowledgeBase(bot.settings.index_config(), embedder=embedder)
    await asyncio.to_thread(other.reindex)
    assert (await _ready(bot))["index"]["lag"] > 0  # the snapshot names chunks that are gone
    answer = await bot.services.engine.ask(IN_DOMAIN)
    assert answer.outcome == Outcome.ANSWERED and answer.sources
    assert "refresh" in answer.timings_ms
    assert (await _ready(bot))["index"]["lag"] == 0


async def test_a_failing_follower_is_reported_and_recovers(
    make_bot: BotFactory, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bot = await make_bot(sync_seconds=0.1, prepare=lambda app: set_max_behind(app, 1.0))
    store = bot.kb.store
    readable = store.searchable_chunk_versions

    def broken(*args: Any) -> Any:
        raise sqlite3.DatabaseError("database disk image is malformed")

    monkeypatch.setattr(store, "searchable_chunk_versions", broken)
    store.delete_rows(bot.kb.find("oncall.md").id)  # a change the bot cannot follow
    deadline = time.monotonic() + 10
    while (resp := await bot.http.get("/readyz")).status == 200:
        assert time.monotonic() < deadline, "a stuck follower never turned /readyz 503"
        await asyncio.sleep(0.05)
    body = await resp.json()
    assert body["checks"]["index_current"] is False
    # That it failed, to anyone; why (a path, a database's host), to the log only.
    assert body["index"]["refresh_error"] == REFRESH_FAILED and body["index"]["lag"] == 1
    assert "malformed" not in json.dumps(body)
    # Still answering from the last consistent snapshot.
    assert (await bot.services.engine.ask(IN_DOMAIN)).outcome == Outcome.ANSWERED
    warnings = [r for r in caplog.records if "cannot bring the search index" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert "malformed" in caplog.text

    monkeypatch.setattr(store, "searchable_chunk_versions", readable)
    deadline = time.monotonic() + 10
    while (resp := await bot.http.get("/readyz")).status != 200:
        assert time.monotonic() < deadline, "the follower did not recover"
        await asyncio.sleep(0.05)
    body = await resp.json()
    assert body["index"]["lag"] == 0 and body["index"]["refresh_error"] is None
    assert any("caught up with the database again" in r.getMessage() for r in caplog.records)
