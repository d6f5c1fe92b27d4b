"""The Home tab: what everyone sees, the admins' sections, their buttons, paging and limits."""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from babel.dates import format_date, format_time

from bot.slack import messages
from bot.slack.blocks import (
    HOME_REFRESH_ACTION_ID,
    HOME_REINDEX_ACTION_ID,
    HOME_RETRY_ACTION_ID,
    RETRY_ACTION_ID,
    AdminHome,
    Calibration,
    MemberHome,
    Pages,
    Section,
    home_view,
    parse_page_value,
)
from bot.slack.home import GapCache, thread_url, workspace_url
from bot.slack.words import words_for
from core.calibration import CalibrationRecord, RateRow, save_calibration
from core.gaps import Gap
from index.knowledge_base import KnowledgeBase, ReindexReport
from index.models import EVERYONE, DocState
from index.records import ChunkRow, DocumentRow

pytest.register_assert_rewrite("tests.conftest_bot", "tests.home_tab")

from tests.conftest_bot import ADMIN_ID, THRESHOLD, BotFactory  # noqa: E402
from tests.home_tab import admin_bot, click_home, open_home, published_view  # noqa: E402
from tests.query_factory import log_question  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DM_CHANNEL_ID,
    USER_ID,
    _view_errors,
    block_actions_body,
    button_action,
)

OTHER_ID = "U0OTHER001"
DAY = 86_400.0
INTERRUPTED = "Indexing was interrupted before it finished; retry it."
GUIDE = b"# Onboarding guide\n\n## First day\n\nPick up your badge at the front desk at 09:30.\n"


# ---------------------------------------------------------------- helpers


async def _until(check: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "the condition never held"
        await asyncio.sleep(0.02)


def _text(view: dict[str, Any]) -> str:
    """Every text of the view, as Slack would render its mrkdwn source."""
    return json.dumps(view["blocks"], ensure_ascii=False)


def _part(view: dict[str, Any], header: str) -> str:
    """The text of the blocks under ``header``, up to the next header."""
    blocks: list[dict[str, Any]] = []
    inside = False
    for block in view["blocks"]:
        if block["type"] == "header":
            inside = block["text"]["text"] == header
        elif inside:
            blocks.append(block)
    return _text({"blocks": blocks})


def _buttons(view: dict[str, Any], action_id: str) -> list[dict[str, Any]]:
    found = []
    for block in view["blocks"]:
        elements = [*block.get("elements", []), block.get("accessory") or {}]
        found += [e for e in elements if e.get("action_id") == action_id]
    return found


def _failed(kb: KnowledgeBase, name: str, uploader: str, reason: str = INTERRUPTED) -> int:
    """A stored document that failed for a reason a retry fixes (indexing was interrupted)."""
    doc = kb.add_bytes(GUIDE + name.encode(), name, uploader=uploader).document
    kb.store.update_document(doc.id, state=DocState.FAILED.value, failure_reason=reason)
    return doc.id


def _log(kb: KnowledgeBase, question: str, outcome: str, days_ago: float, **changes: Any) -> int:
    qid = log_question(kb.store, question, outcome=outcome, model_called=False, **changes)
    with kb.store.transaction() as db:
        db.execute(
            "UPDATE query_log SET created_at = ? WHERE id = ?", [time.time() - days_ago * DAY, qid]
        )
    return qid


def _chunk_of(kb: KnowledgeBase, name: str) -> int:
    doc = kb.store.find_document(name)
    return int(kb.chunks(doc.id)[0]["id"])


# ---------------------------------------------------------------- everyone


async def test_a_member_sees_how_to_use_it_the_counts_and_only_their_uploads(
    make_bot: BotFactory,
) -> None:
    bot = await admin_bot(make_bot)
    mine = bot.kb.ingest_bytes(GUIDE, "onboarding.md", uploader=USER_ID).document
    _failed(bot.kb, "broken.md", USER_ID, reason="The PDF has no text layer")
    bot.kb.ingest_bytes(b"# Travel\n\nBook trains.\n", "travel.md", uploader=OTHER_ID)

    view = await open_home(bot, USER_ID)
    text = _text(view)
    assert view["type"] == "home"
    searchable = [d for d in bot.kb.store.documents() if d.state == "indexed"]
    chunks = sum(d.chunk_count for d in searchable)
    assert f"*{len(searchable)}* searchable documents ({chunks} passages)" in text
    assert "1 of them for one channel only" in text  # falcon.md
    assert "/kb-upload" in text and "Mention me" in text and "follow-up" in text
    assert "onboarding.md" in text and "broken.md" in text
    assert "The PDF has no text layer" in text
    assert text.index("broken.md") < text.index("onboarding.md"), "newest first"
    assert "travel.md" not in text and "handbook.md" not in text, "only their own uploads"
    assert messages.HOME_ADMIN_HEADER not in text and messages.HOME_GAPS_HEADER not in text
    assert not _buttons(view, HOME_RETRY_ACTION_ID) and not _buttons(view, HOME_REINDEX_ACTION_ID)
    assert mine.state == "indexed"
    assert bot.slack.calls("views.publish", include_rejected=True) == bot.slack.calls(
        "views.publish"
    ), "Slack accepted every view"


async def test_a_member_sees_their_uploads_times_in_their_language_and_time_zone(
    make_bot: BotFactory,
) -> None:
    bot = await admin_bot(make_bot)
    bot.slack.set_user(USER_ID, locale="cs-CZ", tz="Asia/Tokyo")
    doc = bot.kb.ingest_bytes(GUIDE, "onboarding.md", uploader=USER_ID).document
    text = _text(await open_home(bot, USER_ID))
    moment = datetime.fromtimestamp(doc.created_at, ZoneInfo("Asia/Tokyo"))
    # Czech writes the date day first, "7. 12. 2026", and the time on the 24-hour clock.
    czech = (
        f"{format_date(moment, 'medium', locale='cs')} {format_time(moment, 'short', locale='cs')}"
    )
    assert czech.startswith(f"{moment.day}. {moment.month}. {moment.year} ")
    assert czech in text and "UTC" not in text


async def test_the_messages_tab_still_greets_and_publishes_no_home(make_bot: BotFactory) -> None:
    bot = await make_bot()
    await bot.event(
        {"type": "app_home_opened", "user": USER_ID, "channel": DM_CHANNEL_ID, "tab": "messages"}
    )
    await bot.slack.wait_for("assistant.threads.setSuggestedPrompts")
    await bot.idle()
    assert bot.slack.calls("views.publish") == []


# ---------------------------------------------------------------- admins


async def test_an_admin_sees_every_section(make_bot: BotFactory) -> None:
    bot = await admin_bot(make_bot)
    failed = _failed(bot.kb, "scan.pdf", USER_ID, reason="No text in <@U0EVIL001>'s scan")
    stale = bot.kb.store.find_document("security.md")
    bot.kb.store.update_document(stale.id, pipeline_version="chunker-old")
    qid = _log(bot.kb, "Why is the sky blue?", "answered", 1, answer="Because [1].")
    bot.kb.feedback.add(qid, -1, USER_ID)
    thread = {"channel": CHANNEL_ID, "thread_id": "1700000000.000100"}
    bot.kb.feedback.add(_log(bot.kb, "Asked in a channel?", "answered", 1, **thread), -1)
    dm = {"channel": DM_CHANNEL_ID, "thread_id": "1700000000.000200"}
    bot.kb.feedback.add(_log(bot.kb, "Asked in a DM?", "answered", 1, **dm), -1)

    view = await open_home(bot, ADMIN_ID)
    text = _text(view)
    for header in (
        messages.HOME_ADMIN_HEADER,
        messages.HOME_FAILED_HEADER,
        messages.HOME_STALE_HEADER,
        messages.HOME_GAPS_HEADER,
        messages.HOME_DISLIKED_HEADER,
        messages.HOME_CALIBRATION_HEADER,
    ):
        assert header in text
    (retry,) = _buttons(view, HOME_RETRY_ACTION_ID)
    assert retry["value"] == str(failed)
    assert "&lt;@U0EVIL001&gt;" in text and "<@U0EVIL001>" not in text
    assert f"<@{USER_ID}>" in text, "the uploader, as a mention the server wrote"
    assert "security.md" in text and len(_buttons(view, HOME_REINDEX_ACTION_ID)) == 1
    assert "Why is the sky blue?" in text and "not helpful to 1 person" in text
    disliked = _part(view, messages.HOME_DISLIKED_HEADER)
    link = f"<https://example.slack.com/archives/{CHANNEL_ID}/p1700000000000100|"
    assert link in disliked and disliked.count("<https://") == 1
    assert messages.HOME_IN_A_DM in disliked
    assert messages.HOME_NO_GAPS in text
    assert messages.HOME_NO_CALIBRATION in text
    assert f"Threshold in force: *{THRESHOLD:.3f}*" in text


async def test_workspace_admins_see_the_admin_sections_when_they_count(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(slack_admins_are_admins=True)
    assert messages.HOME_ADMIN_HEADER in _text(await open_home(bot, ADMIN_ID))
    assert messages.HOME_ADMIN_HEADER not in _text(await open_home(bot, USER_ID))


async def test_retry_from_home_indexes_the_document_and_shows_its_new_state(
    make_bot: BotFactory,
) -> None:
    # Its uploader is a publisher: a document for everyone, indexed at once.
    bot = await admin_bot(make_bot, publishers=USER_ID)
    doc_id = _failed(bot.kb, "onboarding.md", USER_ID)
    view = await open_home(bot, ADMIN_ID)
    (retry,) = _buttons(view, HOME_RETRY_ACTION_ID)
    published = len(bot.slack.calls("views.publish"))

    await click_home(bot, ADMIN_ID, HOME_RETRY_ACTION_ID, retry["value"])
    await bot.idle()
    doc = bot.kb.store.document(doc_id)
    assert doc.state == "indexed" and doc.chunk_count > 0
    views = [c["view"] for c in bot.slack.calls("views.publish")[published:]]
    assert "Retrying *onboarding.md*" in _text(views[0])
    final = views[-1]
    assert "*onboarding.md*: indexed." in _text(final)
    assert not _buttons(final, HOME_RETRY_ACTION_ID), "no longer among the failed uploads"
    dm = [c for c in bot.slack.calls("chat.postMessage") if c["channel"] == ADMIN_ID]
    assert dm and "onboarding.md" in dm[-1]["text"] and "indexed" in dm[-1]["text"]


async def test_a_retry_that_fails_again_says_why_and_offers_retry_in_the_dm(
    make_bot: BotFactory,
) -> None:
    bot = await admin_bot(make_bot)
    doc = bot.kb.add_bytes(os.urandom(4096), "scan.pdf", uploader=USER_ID).document
    assert bot.kb.index_document(doc.id).state == "failed"
    view = await open_home(bot, ADMIN_ID)
    (retry,) = _buttons(view, HOME_RETRY_ACTION_ID)

    await click_home(bot, ADMIN_ID, HOME_RETRY_ACTION_ID, retry["value"])
    await bot.idle()
    row = bot.kb.store.document(doc.id)
    assert row.state == "failed" and row.updated_at > doc.updated_at
    final = bot.slack.calls("views.publish")[-1]["view"]
    assert f":warning: *scan.pdf*: failed: {row.failure_reason}" in _text(final)
    assert ".." not in _text(final)
    assert [b["value"] for b in _buttons(final, HOME_RETRY_ACTION_ID)] == [str(doc.id)]
    (dm,) = [c for c in bot.slack.calls("chat.postMessage") if c["channel"] == ADMIN_ID]
    assert "failed" in dm["text"] and RETRY_ACTION_ID in json.dumps(dm["blocks"])
    # The DM's own Retry edits that DM: it is the document's status message now.
    ((channel, ts),) = [k for k, m in bot.slack.messages.items() if m.get("text") == dm["text"]]
    updates = len(bot.slack.calls("chat.update"))
    body = block_actions_body([button_action(RETRY_ACTION_ID, str(doc.id))], ADMIN_ID, channel, ts)
    assert (await bot.post(body)).status == 200
    edits = (await bot.slack.wait_for("chat.update", updates + 2))[updates:]
    assert {(e["channel"], e["ts"]) for e in edits} == {(channel, ts)}
    await bot.idle()
    assert bot.kb.store.document(doc.id).updated_at > row.updated_at


async def test_odd_clicks_say_what_happened_or_change_nothing(
    make_bot: BotFactory, caplog: pytest.LogCaptureFixture
) -> None:
    bot = await admin_bot(make_bot)
    gone = _failed(bot.kb, "gone.md", USER_ID)
    done = _failed(bot.kb, "done.md", USER_ID)
    await open_home(bot, ADMIN_ID)
    bot.kb.remove(gone)
    bot.kb.retry(done)

    await click_home(bot, ADMIN_ID, HOME_REFRESH_ACTION_ID, "refresh")
    assert "gone.md" not in _text(await published_view(bot, ADMIN_ID, 2))
    await click_home(bot, ADMIN_ID, HOME_RETRY_ACTION_ID, str(gone))
    assert messages.RETRY_GONE in _text(await published_view(bot, ADMIN_ID, 3))
    await click_home(bot, ADMIN_ID, HOME_RETRY_ACTION_ID, str(done))
    assert "*done.md*: indexed." in _text(await published_view(bot, ADMIN_ID, 4))
    await click_home(bot, ADMIN_ID, HOME_RETRY_ACTION_ID, "7; DROP TABLE")
    # A Home button in a message (not the Home tab): not ours to act on.
    body = block_actions_body([button_action(HOME_RETRY_ACTION_ID, str(done))], user_id=ADMIN_ID)
    assert (await bot.post(body)).status == 200
    await bot.idle()
    assert len(bot.slack.calls("views.publish")) == 4
    assert "malformed value '7; DROP TABLE'" in caplog.text
    assert "outside the Home tab" in caplog.text

    bot.slack.fail("views.publish", "invalid_arguments")
    await click_home(bot, ADMIN_ID, HOME_REFRESH_ACTION_ID, "refresh")
    await bot.idle()
    assert "could not publish the Home tab" in caplog.text
    assert bot.slack.calls("chat.postMessage") == [], "nobody is told about a refresh"


async def test_reindex_from_home_runs_once_and_reports_on_the_tab(make_bot: BotFactory) -> None:
    bot = await admin_bot(make_bot)
    bot.services.reindexer.progress_seconds = 0.0
    stale = bot.kb.store.find_document("security.md")
    bot.kb.store.update_document(stale.id, pipeline_version="chunker-old")
    release = threading.Event()
    real = bot.kb.reindex

    def slow_reindex(**kwargs: Any) -> ReindexReport:
        assert release.wait(15)
        return real(**kwargs)

    bot.kb.reindex = slow_reindex  # type: ignore[method-assign]
    view = await open_home(bot, ADMIN_ID)
    (button,) = _buttons(view, HOME_REINDEX_ACTION_ID)
    try:
        await click_home(bot, ADMIN_ID, HOME_REINDEX_ACTION_ID, button["value"])
        started = await published_view(bot, ADMIN_ID, 2)
        assert messages.REINDEX_STARTED in _text(started)
        assert messages.HOME_REINDEX_RUNNING_NOW in _text(started)
        assert not _buttons(started, HOME_REINDEX_ACTION_ID), "no second Reindex while one runs"
        await click_home(bot, ADMIN_ID, HOME_REINDEX_ACTION_ID, button["value"])  # a stale view's
        running = await published_view(bot, ADMIN_ID, 3)
        assert messages.REINDEX_RUNNING in _text(running)
    finally:
        release.set()
    await bot.idle()
    final = bot.slack.calls("views.publish")[-1]["view"]
    assert "Reindex finished" in _text(final)
    assert messages.HOME_NO_STALE in _text(final) and not _buttons(final, HOME_REINDEX_ACTION_ID)
    assert bot.kb.stale_documents() == []
    dm = [c for c in bot.slack.calls("chat.postMessage") if c["channel"] == ADMIN_ID]
    assert len(dm) == 1 and "Reindex finished" in dm[0]["text"]


async def test_a_reindex_reporting_on_the_tab_keeps_the_admins_place(
    make_bot: BotFactory,
) -> None:
    bot = await admin_bot(make_bot)
    for i in range(12):
        _failed(bot.kb, f"broken {i:02}.md", USER_ID)
    stale = bot.kb.store.find_document("security.md")
    bot.kb.store.update_document(stale.id, pipeline_version="chunker-old")
    release = threading.Event()
    real = bot.kb.reindex

    def slow_reindex(**kwargs: Any) -> ReindexReport:
        assert release.wait(15)
        return real(**kwargs)

    bot.kb.reindex = slow_reindex  # type: ignore[method-assign]
    await open_home(bot, ADMIN_ID)
    try:
        await click_home(bot, ADMIN_ID, HOME_REINDEX_ACTION_ID, "reindex")
        await published_view(bot, ADMIN_ID, 2)
        await click_home(bot, ADMIN_ID, "kb_home_page_next", "failed:1")
        assert "Page 2 of 3" in _part(
            await published_view(bot, ADMIN_ID, 3), messages.HOME_FAILED_HEADER
        )
    finally:
        release.set()
    await bot.idle()
    final = bot.slack.calls("views.publish")[-1]["view"]
    assert "Reindex finished" in _text(final)
    assert json.loads(final["private_metadata"]) == {"failed": 1}, "still on the page it was"


async def test_admin_buttons_forged_by_a_member_change_nothing(make_bot: BotFactory) -> None:
    bot = await admin_bot(make_bot)
    doc_id = _failed(bot.kb, "onboarding.md", USER_ID)
    before = {d.id: d.indexed_at for d in bot.kb.store.documents()}
    view = await open_home(bot, USER_ID)
    assert not _buttons(view, HOME_RETRY_ACTION_ID)

    await click_home(bot, USER_ID, HOME_RETRY_ACTION_ID, str(doc_id))
    await click_home(bot, USER_ID, HOME_REINDEX_ACTION_ID, "reindex")
    await click_home(bot, USER_ID, "kb_home_page_next", "failed:1")
    await bot.idle()
    assert bot.kb.store.document(doc_id).state == "failed"
    assert {d.id: d.indexed_at for d in bot.kb.store.documents()} == before
    refusals = [c for c in bot.slack.calls("chat.postMessage") if c["channel"] == USER_ID]
    assert [c["text"] for c in refusals] == [messages.HOME_NOT_ADMIN] * 2
    for call in bot.slack.calls("views.publish"):
        assert messages.HOME_ADMIN_HEADER not in _text(call["view"])


# ---------------------------------------------------------------- knowledge gaps, calibration


async def test_knowledge_gaps_are_grouped_with_counts_and_closest_passages(
    make_bot: BotFactory,
) -> None:
    bot = await admin_bot(make_bot)
    kb = bot.kb
    handbook = _chunk_of(kb, "handbook.md")
    falcon = _chunk_of(kb, "falcon.md")
    _log(kb, "How do I reset my VPN password?", "refused", 5)
    _log(kb, "how do I reset my VPN password", "refused", 4)
    _log(kb, "VPN password reset", "refused", 3)
    _log(kb, "I forgot my VPN password, how can I reset it?", "related", 2, kept=[(handbook, 0.52)])
    _log(kb, "HOW DO I RESET MY VPN PASSWORD??", "refused", 1)
    _log(kb, "Where is the <@U0EVIL001> launch party? <!here>", "related", 1, kept=[(falcon, 0.5)])
    _log(kb, "What is the travel meal allowance?", "refused", 40)  # older than 30 days

    view = await open_home(bot, ADMIN_ID)
    text = _text(view)
    vpn = next(b["text"]["text"] for b in view["blocks"] if "RESET MY VPN" in json.dumps(b))
    assert "Asked 5 times (refused 4, possibly related shown 1)" in vpn
    assert "I forgot my VPN password, how can I reset it?" in vpn
    assert "<http://kb.test/d/" in vpn and "Employee handbook" in vpn and "0.520" in vpn
    party = next(b["text"]["text"] for b in view["blocks"] if "launch party" in json.dumps(b))
    assert f"a passage in <#{CHANNEL_ID}>" in party and "0.500" in party
    assert "Falcon" not in party and "Berlin" not in party, "a channel's passage stays unnamed"
    assert "&lt;@U0EVIL001&gt;" in party and "&lt;!here&gt;" in party
    assert "<@U0EVIL001>" not in text and "<!here>" not in text
    assert "travel meal allowance" not in text
    assert text.index("RESET MY VPN") < text.index("launch party"), "largest group first"


async def test_slow_knowledge_gaps_show_as_coming_and_are_published_when_ready(
    make_bot: BotFactory,
) -> None:
    bot = await admin_bot(make_bot)
    cache = bot.services.home.gaps
    cache.wait_seconds = 0.0
    # The real grouping, held until the first view is out: one question groups
    # fast enough to finish inside a zero wait on a busy machine.
    release, group = threading.Event(), cache.compute

    def slow() -> list[Gap]:
        release.wait(30)
        return group()

    cache.compute = slow
    _log(bot.kb, "What is the dress code on Fridays?", "refused", 1)
    first = await open_home(bot, ADMIN_ID)
    assert messages.HOME_GAPS_PENDING in _part(first, messages.HOME_GAPS_HEADER)
    assert messages.HOME_FAILED_HEADER in _text(first), "the rest does not wait"
    release.set()
    ready = await published_view(bot, ADMIN_ID, 2)
    gaps = _part(ready, messages.HOME_GAPS_HEADER)
    assert "dress code on Fridays" in gaps and messages.HOME_GAPS_PENDING not in gaps
    await bot.idle()
    assert len(bot.slack.calls("views.publish")) == 2, "published again once, not forever"


async def test_gap_cache_keeps_a_result_or_a_failure_while_fresh() -> None:
    now = [0.0]
    calls: list[int] = []

    def failing() -> list[Gap]:
        calls.append(1)
        raise ValueError("the log could not be read")

    cache = GapCache(failing, wait_seconds=15, fresh_seconds=60, clock=lambda: now[0])
    failure = await cache.get()
    assert isinstance(failure, ValueError) and await cache.get() is failure and len(calls) == 1
    now[0] = 61.0
    assert isinstance(await cache.get(), ValueError) and len(calls) == 2
    view = home_view(
        MemberHome(0, 0, 0, []),
        AdminHome([], [], False, None, {}, [], 0, Calibration(0.6, 0.6, None), gaps_failed=True),
        words=words_for("en"),
    )
    assert messages.HOME_GAPS_FAILED in _part(view, messages.HOME_GAPS_HEADER)


async def test_calibration_in_force_with_a_saved_record(make_bot: BotFactory) -> None:
    bot = await admin_bot(make_bot, related_threshold=0.7)
    row = RateRow(THRESHOLD, 3, 40, (0.026, 0.199), 5, 60, (0.036, 0.181))
    record = CalibrationRecord(
        at=time.time() - DAY,
        source="log <!channel>.jsonl",
        max_bluff_rate=0.05,
        proposed_threshold=0.55,
        proposed_related=0.68,
        rows=(row,),
    )
    save_calibration(bot.kb.store, record)
    text = _text(await open_home(bot, ADMIN_ID))
    assert f"Threshold in force: *{THRESHOLD:.3f}*" in text and "related passages: *0.700*" in text
    assert "bluff budget 5%" in text and "threshold *0.550*, related *0.680*" in text
    assert "3/40 = 7.5% [2.6%, 19.9%]" in text and "5/60 = 8.3% [3.6%, 18.1%]" in text
    assert "&lt;!channel&gt;" in text and "<!channel>" not in text
    assert messages.HOME_NO_CALIBRATION not in text


async def test_calibration_that_measured_other_thresholds_says_so(make_bot: BotFactory) -> None:
    bot = await admin_bot(make_bot)
    row = RateRow(0.4, 0, 40, (0.0, 0.09), 30, 60, (0.37, 0.62))
    save_calibration(bot.kb.store, CalibrationRecord(time.time(), "set x", 0.05, 0.4, None, (row,)))
    text = _text(await open_home(bot, ADMIN_ID))
    assert messages.home_no_rates(THRESHOLD) in text and "related *none*" in text


# ---------------------------------------------------------------- paging, limits, hostile input


async def test_long_lists_are_paged_within_slacks_limits(make_bot: BotFactory) -> None:
    bot = await admin_bot(make_bot)
    ids = [
        _failed(bot.kb, f"<!channel> report {i:03}.md", ADMIN_ID, reason="<@U0EVIL001> " * 80)
        for i in range(200)
    ]
    for i in range(30):
        qid = _log(bot.kb, f"<!here> question {i} " + "x" * 400, "answered", 1, answer="<" * 900)
        bot.kb.feedback.add(qid, -1, USER_ID)

    view = await open_home(bot, ADMIN_ID)
    assert _view_errors(view) == []  # slack_sdk's View among them: at most 100 blocks
    text = _text(view)
    assert "<!channel>" not in text and "<@U0EVIL001>" not in text and "<!here>" not in text
    uploads = _part(view, messages.HOME_UPLOADS_HEADER)
    assert "199.md" in uploads and "190.md" in uploads and "189.md" not in uploads, "newest first"
    assert "Page 1 of 20 · 200 in all" in text and "Page 1 of 40 · 200 in all" in text
    assert [b["value"] for b in _buttons(view, HOME_RETRY_ACTION_ID)] == [
        str(i) for i in reversed(ids[-5:])
    ]
    (next_uploads,) = [
        b for b in _buttons(view, "kb_home_page_next") if b["value"].startswith("uploads:")
    ]
    await click_home(bot, ADMIN_ID, "kb_home_page_next", next_uploads["value"])
    second = await published_view(bot, ADMIN_ID, 2)
    uploads = _part(second, messages.HOME_UPLOADS_HEADER)
    assert "189.md" in uploads and "180.md" in uploads and "190.md" not in uploads
    assert "Page 2 of 20" in uploads
    assert "Page 1 of 40" in _part(second, messages.HOME_FAILED_HEADER), "the others stay put"
    assert _buttons(second, "kb_home_page_previous")

    # Hostile page values and metadata: ignored, or brought back to the last page.
    await click_home(bot, ADMIN_ID, "kb_home_page_next", "uploads:99999")
    last = await published_view(bot, ADMIN_ID, 3)
    assert "Page 20 of 20" in _part(last, messages.HOME_UPLOADS_HEADER)
    assert "000.md" in _part(last, messages.HOME_UPLOADS_HEADER)
    for value in ("uploads:-1", "nonsense:2", "uploads:1e3", "uploads:" + "9" * 50):
        await click_home(bot, ADMIN_ID, "kb_home_page_next", value)
    await bot.idle()
    assert len(bot.slack.calls("views.publish")) == 3
    assert bot.slack.calls("views.publish", include_rejected=True) == bot.slack.calls(
        "views.publish"
    )


def test_thread_links_are_only_slacks_and_only_for_channels() -> None:
    assert workspace_url("https://example.slack.com/") == "https://example.slack.com/"
    for bad in ("http://example.slack.com/", "https://slack.com.evil.example/", None, 3):
        assert workspace_url(bad) == ""
    site = "https://example.slack.com/"
    assert thread_url(site, "C0CHAN0001", "1.2") == f"{site}archives/C0CHAN0001/p12"
    assert thread_url(site, "G0PRIV0001", "1.2") is not None
    for channel, ts in (("D0DM000001", "1.2"), ("C0CHAN0001", "1.2>x"), ("C0|x", "1.2")):
        assert thread_url(site, channel, ts) is None
    assert thread_url(None, "C0CHAN0001", "1.2") is None


def test_page_values_and_metadata_are_read_as_hostile_input() -> None:
    assert parse_page_value("gaps:3") == (Section.GAPS, 3)
    for bad in ("gaps", "gaps:", "gaps:-1", "gaps:٣", "GAPS:1", None, 7, "x" * 100):
        assert parse_page_value(bad) is None
    pages = Pages.from_metadata('{"gaps": 2, "uploads": "9", "evil": 1, "failed": 1e9}')
    assert pages.numbers == {Section.GAPS: 2}
    assert Pages.from_metadata("[1, 2]") == Pages() == Pages.from_metadata("{not json")
    assert Pages.from_metadata(pages.to_metadata()) == pages


def _doc(i: int, **changes: Any) -> DocumentRow:
    fields: dict[str, Any] = {
        "id": i,
        "name": f"<!channel> {'&' * 300} doc {i}.md",
        "title": "",
        "sha256": "0" * 64,
        "kind": "md",
        "size": 1,
        "uploader": USER_ID,
        "scope": EVERYONE,
        "state": DocState.FAILED,
        "failure_reason": "<@U1> " * 200,
        "chunk_count": 1,
        "window_splits": 0,
        "text_length": 1,
        "page_starts": None,
        "embedding_model": "<!subteam^S1> model",
        "dimensions": 384,
        "pipeline_version": "old",
        "extractor_version": "old",
        "replaces": None,
        "worker_pid": None,
        "created_at": 1_800_000_000.0 + i,
        "updated_at": 1_800_000_000.0 + i,
        "indexed_at": 1_800_000_000.0 + i,
    }
    return DocumentRow(**{**fields, **changes})


def _gap(i: int) -> Gap:
    chunk = ChunkRow(
        id=i,
        document_id=i,
        document="<!everyone> " * 40,
        kind="md",
        scope=EVERYONE if i % 2 else CHANNEL_ID,
        ordinal=0,
        section="A > <@U2> " * 30,
        start=0,
        end=10,
        page=None,
        content="secret passage text",
        text="secret passage text",
    )
    return Gap(
        question="<@U3> " * 100,
        examples=("<!here> " * 60,) * 3,
        count=60 - i,
        outcomes=(("refused", 60 - i),),
        closest=chunk,
        distance=0.5,
        last_asked=1_800_000_000.0,
        scope=chunk.scope,
    )


def test_the_fullest_view_stays_within_block_kit_limits() -> None:
    docs = [_doc(i) for i in range(200)]
    admin = AdminHome(
        failed=docs,
        stale=[_doc(i, state=DocState.INDEXED) for i in range(200)],
        reindex_running=False,
        gaps=[_gap(i) for i in range(60)],
        gap_links={i: f"http://kb.test/d/{i}?t=tok|en#char=0,10" for i in range(1, 60, 2)},
        disliked=[],
        disliked_total=0,
        calibration=Calibration(0.6, 0.6, None),
    )
    member = MemberHome(documents=10, chunks=100, channel_documents=0, uploads=docs)
    notice = "x" * 4000 + "\n\n" + "y" * 9000
    # The first page, and a page past the end, which shows the last one.
    for pages, page in ((Pages(), 1), (Pages({s: 10_000 for s in Section}), 12)):
        view = home_view(member, admin, pages=pages, notice=notice, words=words_for("en"))
        assert _view_errors(view) == []
        text = _text(view)
        for raw in ("<!channel>", "<@U1>", "<@U2>", "<@U3>", "<!here>", "<!everyone>", "<!subteam"):
            assert raw not in text
        assert "secret passage text" not in text
        assert f"Page {page} of 12 · 60 in all" in text
        assert "tok%7Cen" in text, "a link is one token whatever its URL holds"
