"""`/kb-reindex`: admins only, progress and a final report, one at a time, questions keep flowing."""

from __future__ import annotations

import asyncio
import fcntl
import threading
from typing import Any

import pytest

from bot.slack import messages
from bot.slack.reindex import render_reindex_report
from bot.slack.words import words_for
from index.knowledge_base import FailedDocument, ReindexReport
from index.models import DocState
from index.records import DocumentRow

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import ADMIN_ID, IN_DOMAIN, Bot, BotFactory  # noqa: E402
from tests.servers import CHANNEL_ID, USER_ID, app_mention_event, slash_command_body  # noqa: E402


async def _reindex(bot: Bot, user: str, response_id: str = "r1") -> str:
    body = slash_command_body(
        "/kb-reindex", "", user, CHANNEL_ID, bot.slack.response_url(response_id)
    )
    resp = await bot.post(body)
    assert resp.status == 200
    return await resp.text()


async def _final_report(bot: Bot, response_id: str = "r1") -> list[dict[str, Any]]:
    for _ in range(300):
        posts = bot.slack.responses(response_id)
        if any("Reindex finished" in p["text"] for p in posts):
            return posts
        await asyncio.sleep(0.05)
    raise AssertionError(f"no final report in {bot.slack.responses(response_id)}")


def _indexed_at(bot: Bot) -> dict[int, float]:
    return {d.id: d.indexed_at for d in bot.kb.store.documents()}


async def test_non_admin_gets_an_ephemeral_refusal_and_nothing_runs(make_bot: BotFactory) -> None:
    bot = await make_bot(admin_users=ADMIN_ID)
    # A workspace admin in Slack: refused all the same, Slack's admins are not admins here.
    bot.slack.set_user(USER_ID, is_admin=True)
    before = _indexed_at(bot)
    assert await _reindex(bot, USER_ID) == messages.REINDEX_NOT_ADMIN
    await bot.idle()
    assert bot.slack.responses() == []
    assert _indexed_at(bot) == before
    # users.info is asked once, for the person's locale (the language of the refusal).
    (asked,) = bot.slack.calls("users.info")
    assert asked["include_locale"] == "1"


async def test_configured_admin_gets_progress_and_the_final_report(make_bot: BotFactory) -> None:
    bot = await make_bot(admin_users=f"U0OTHER001, {ADMIN_ID}")
    bot.services.reindexer.progress_seconds = 0.0
    before = _indexed_at(bot)
    assert await _reindex(bot, ADMIN_ID) == messages.REINDEX_STARTED
    posts = await _final_report(bot)
    assert any("Reindexing…" in p["text"] for p in posts[:-1])
    final = posts[-1]
    docs = bot.kb.store.documents()
    chunks = sum(d.chunk_count for d in docs)
    assert final["text"].startswith(
        f":white_check_mark: Reindex finished: {len(docs)} documents, {chunks} chunks; 0 failed"
    )
    assert "stale documents before 0, after 0" in final["text"]
    assert final["response_type"] == "ephemeral"
    after = _indexed_at(bot)
    assert all(after[i] > before[i] for i in before)


async def test_slack_workspace_admins_count_when_enabled(make_bot: BotFactory) -> None:
    bot = await make_bot(slack_admins_are_admins=True)
    assert await _reindex(bot, USER_ID) == messages.REINDEX_NOT_ADMIN
    assert await _reindex(bot, ADMIN_ID) == messages.REINDEX_STARTED
    await _final_report(bot)
    assert await _reindex(bot, ADMIN_ID, "r2") == messages.REINDEX_STARTED
    await _final_report(bot, "r2")
    looked_up = [c["user"] for c in bot.slack.calls("users.info")]
    assert sorted(looked_up) == sorted([USER_ID, ADMIN_ID]), "answers are cached"


async def test_second_reindex_while_one_runs_is_refused(make_bot: BotFactory) -> None:
    bot = await make_bot(admin_users=ADMIN_ID)
    # Another process (`kb reindex` in a shell) holds the lock.
    with open(bot.settings.data_dir / "reindex.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert await _reindex(bot, ADMIN_ID) == messages.REINDEX_RUNNING
        fcntl.flock(lock, fcntl.LOCK_UN)
    await bot.idle()
    assert bot.slack.responses() == []


async def test_questions_are_answered_while_a_reindex_runs(make_bot: BotFactory) -> None:
    bot = await make_bot(admin_users=ADMIN_ID)
    release = threading.Event()
    real = bot.kb.reindex

    def slow_reindex(**kwargs: Any) -> ReindexReport:
        assert release.wait(15)
        return real(**kwargs)

    bot.kb.reindex = slow_reindex  # type: ignore[method-assign]
    try:
        assert await _reindex(bot, ADMIN_ID) == messages.REINDEX_STARTED
        assert await _reindex(bot, ADMIN_ID, "r2") == messages.REINDEX_RUNNING
        await bot.event(app_mention_event(IN_DOMAIN))
        answer = await bot.answer()
        assert "<http://kb.test/d/" in str(answer["blocks"])
        assert bot.slack.responses() == []
    finally:
        release.set()
    await _final_report(bot)


def _failed(doc_id: int, name: str, reason: str) -> FailedDocument:
    row = DocumentRow(
        id=doc_id,
        name=name,
        title="",
        sha256="0" * 64,
        kind="pdf",
        size=1,
        uploader="",
        scope="*",
        state=DocState.INDEXED,
        failure_reason=None,
        chunk_count=1,
        window_splits=0,
        text_length=1,
        page_starts="0",
        embedding_model=None,
        dimensions=None,
        pipeline_version=None,
        extractor_version=None,
        replaces=None,
        worker_pid=None,
        created_at=0.0,
        updated_at=0.0,
        indexed_at=0.0,
    )
    return FailedDocument(row, reason)


def test_report_lists_failures_escaped_and_bounded() -> None:
    failed = [_failed(i, f"<!channel> doc {i}.pdf", "bad <@U1> bytes") for i in range(12)]
    text = render_reindex_report(
        ReindexReport(documents=3, chunks=9, failed=failed, stale_before=2, stale_after=0),
        words=words_for("en"),
        named=frozenset({"*"}),
    )
    assert "3 documents, 9 chunks; 12 failed; stale documents before 2, after 0" in text
    assert "<!channel>" not in text and "<@U1>" not in text and "&lt;!channel&gt;" in text
    assert text.count("•") == 10 and "and 2 more" in text
