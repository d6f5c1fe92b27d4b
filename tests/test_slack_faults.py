"""Slack misbehaving: failed and hanging Web API calls, slow downloads, busy uploaders, a locked database.

Every fault is made by the mock Slack server or a second real process; the bot
runs as in production and is driven by signed requests.
"""

from __future__ import annotations

import asyncio
import io
import json
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psycopg
import pytest
from aiohttp.test_utils import TestClient

from bot.app import create_app
from bot.settings import Settings
from bot.slack import messages
from bot.slack.blocks import RETRY_ACTION_ID
from index.knowledge_base import KnowledgeBase

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import IN_DOMAIN, Bot, BotFactory, EndpointBot  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DM_CHANNEL_ID,
    USER_ID,
    JSONDict,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    block_actions_body,
    button_action,
    event_body,
    file_share_event,
    message_im_event,
)

OTHER_USER = "U0OTHER001"
ANSWER = "Here is what the documents say"
# Short, so that a claim let go or lapsed is seen soon; long enough that a live replica's
# renewals, late on a loaded machine, still hold it.
REPLICA_LEASE_S = 3.0


def _doc(title: str, n: int = 1) -> bytes:
    body = "\n\n".join(f"Paragraph {i} of the {title} guide." for i in range(n))
    return f"# {title}\n\n{body}\n".encode()


@pytest.fixture
async def uploads(make_bot: BotFactory) -> Bot:
    """The bot, for people whose files are used at once (publishers: no approval step)."""
    return await make_bot(publishers=f"{USER_ID},{OTHER_USER}")


def _texts(calls: list[JSONDict]) -> list[str]:
    return [json.dumps(c.get("blocks", []), ensure_ascii=False) + str(c.get("text")) for c in calls]


# ---------------------------------------------------------------- answers


async def test_a_server_error_on_the_placeholder_is_retried_and_the_question_answered(
    bot: Bot,
) -> None:
    bot.slack.fail("chat.postMessage", "internal_error", times=1, status=500)
    await bot.event(app_mention_event(IN_DOMAIN))
    answer = await bot.answer()
    assert ANSWER in answer["text"]
    # (Not an agent app: Slack refuses its agent session first.)
    assert [m for m, _, _ in bot.slack.rejected] == [
        "agents.sessions.setStatus",
        "chat.postMessage",
    ]
    ((_, placeholder_ts),) = bot.slack.messages  # one message: the placeholder, retried once
    assert answer["ts"] == placeholder_ts


async def test_an_answer_that_cannot_replace_the_placeholder_is_posted_in_the_thread(
    bot: Bot,
) -> None:
    # Where Slack refuses the thread's status, a placeholder shows the progress instead.
    bot.slack.fail("assistant.threads.setStatus", "not_allowed_token_type")
    bot.slack.fail("chat.update", "message_not_found")  # the placeholder was deleted
    event = app_mention_event(IN_DOMAIN)
    await bot.event(event)
    posted = await bot.slack.wait_for("chat.postMessage", 2, timeout=15)
    await bot.idle()
    placeholder, answer = posted
    assert placeholder["text"] == messages.PLACEHOLDER
    assert ANSWER in answer["text"] and answer["thread_ts"] == event["ts"]
    assert answer["channel"] == CHANNEL_ID
    assert messages.ERROR_GENERIC not in " ".join(_texts(bot.slack.calls()))


async def test_a_rate_limited_update_is_retried_after_slacks_delay(bot: Bot) -> None:
    bot.slack.rate_limit("chat.update", retry_after=0, times=1)
    await bot.event(app_mention_event(IN_DOMAIN))
    answer = await bot.answer()
    assert ANSWER in answer["text"]
    assert len(bot.slack.calls("chat.postMessage")) == 1, "no second message was needed"


# ---------------------------------------------------------------- uploads


async def test_failing_status_updates_never_abort_an_upload(uploads: Bot) -> None:
    bot = uploads
    bot.slack.fail("chat.update", "message_not_found")  # the status message was deleted
    f = bot.slack.add_file("F0NOSTAT01", "runbook.md", _doc("Runbook"), "text/markdown")
    await bot.event(file_share_event([f]))
    await bot.settle()
    doc = bot.kb.store.find_document("runbook.md")
    assert doc.state == "indexed" and doc.chunk_count > 0
    final = bot.slack.calls("chat.postMessage")[-1]
    assert final["text"] == messages.upload_indexed("runbook.md", doc.chunk_count)
    assert final["channel"] == DM_CHANNEL_ID and final["thread_ts"]


async def test_a_failed_update_at_indexing_still_ends_indexed(uploads: Bot) -> None:
    bot = uploads

    def update(params: JSONDict) -> JSONDict:
        if "indexing" in str(params.get("text")):
            return {"ok": False, "error": "ratelimited"}
        return bot.slack._m_chat_update(params)

    bot.slack.on("chat.update", update)
    f = bot.slack.add_file("F0IDXFAIL1", "travel.md", _doc("Travel"), "text/markdown")
    await bot.event(file_share_event([f]))
    await bot.settle()
    doc = bot.kb.store.find_document("travel.md")
    assert doc.state == "indexed"
    assert "indexed, " in bot.statuses()[-1]


async def test_a_failure_after_the_file_was_stored_ends_failed_with_retry(
    uploads: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    bot = uploads
    real = bot.kb.index_document

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("worker crashed")

    monkeypatch.setattr(bot.kb, "index_document", broken)
    f = bot.slack.add_file("F0CRASH001", "payroll.md", _doc("Payroll"), "text/markdown")
    await bot.event(file_share_event([f]))
    await bot.settle()
    doc = bot.kb.store.find_document("payroll.md")
    (final,) = [c for c in bot.slack.calls("chat.update") if "failed" in c["text"]]
    (button,) = [e for b in final["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert button["action_id"] == RETRY_ACTION_ID and button["value"] == str(doc.id)

    monkeypatch.setattr(bot.kb, "index_document", real)
    body = block_actions_body(
        [button_action(RETRY_ACTION_ID, button["value"])],
        channel_id=final["channel"],
        message_ts=final["ts"],
    )
    assert (await bot.post(body)).status == 200
    await bot.idle()
    assert bot.kb.store.document(doc.id).state == "indexed"
    assert "indexed, " in bot.statuses()[-1]


async def test_a_hanging_files_info_fails_within_the_deadline_naming_the_file(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(download_timeout=1)
    f = bot.slack.add_file("F0HANG0001", "benefits.md", _doc("Benefits"), "text/markdown")
    # Shared from another organisation: the event carries no download link.
    del f["url_private"], f["url_private_download"]
    bot.slack.stall("files.info", 30)
    started = time.monotonic()
    await bot.event(file_share_event([f]))
    await bot.settle()
    assert time.monotonic() - started < 10
    final = bot.statuses()[-1]
    assert "benefits.md" in final and "failed" in final and "1 s" in final
    assert "F0HANG0001" not in " ".join(bot.statuses())


async def test_a_file_slack_names_only_by_id_is_never_shown_by_its_id(uploads: Bot) -> None:
    bot = uploads
    f = bot.slack.add_file("F0BYID0001", "perks.md", _doc("Perks"), "text/markdown")
    await bot.event(file_share_event([{"id": f["id"], "file_access": "check_file_info"}]))
    await bot.settle()
    assert bot.kb.store.find_document("perks.md").state == "indexed"
    statuses = bot.statuses()
    assert "F0BYID0001" not in " ".join(statuses)
    assert messages.UNNAMED_FILE in statuses[0] and "perks.md" in statuses[-1]


async def test_a_slow_download_does_not_hold_up_anyone_elses_upload(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(download_timeout=8, publishers=f"{USER_ID},{OTHER_USER}")
    slow = bot.slack.add_file("F0SLOW0001", "slow.md", _doc("Slow", 40), "text/markdown")
    bot.slack.trickle("F0SLOW0001", seconds=0.5)  # about 10 s for the whole file
    fast = bot.slack.add_file("F0FAST0001", "fast.md", _doc("Fast"), "text/markdown")
    await bot.event(file_share_event([slow]))
    await _wait(lambda: any(d == "F0SLOW0001" for d, _ in bot.slack.downloads))
    await bot.event(file_share_event([fast], user=OTHER_USER))

    await _wait(lambda: _final_for(bot, "fast.md") is not None, timeout=6)
    assert _final_for(bot, "slow.md") is None, "the fast file did not wait for the slow one"
    assert "indexed" in str(_final_for(bot, "fast.md"))

    await bot.settle(2)
    slow_final = str(_final_for(bot, "slow.md"))
    assert "failed" in slow_final and "8 s" in slow_final
    assert not any(d.name == "slow.md" for d in bot.kb.store.documents())


async def test_one_person_has_at_most_the_cap_of_uploads_at_a_time(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(max_uploads_per_user=2, publishers=f"{USER_ID},{OTHER_USER}")
    mine = [
        bot.slack.add_file(f"F0MINE000{i}", f"mine{i}.md", _doc(f"Mine {i}", 12), "text/markdown")
        for i in range(3)
    ]
    for f in mine:
        bot.slack.trickle(f["id"], seconds=0.3)  # about 2.5 s each
    theirs = bot.slack.add_file("F0THEIRS01", "theirs.md", _doc("Theirs"), "text/markdown")
    await bot.event(file_share_event(mine))
    await _wait(lambda: len(bot.slack.downloads) >= 2)
    await bot.event(file_share_event([theirs], user=OTHER_USER))
    await _wait(lambda: _final_for(bot, "theirs.md") is not None, timeout=5)

    assert [d for d, _ in bot.slack.downloads][:2] == ["F0MINE0000", "F0MINE0001"]
    assert "F0MINE0002" not in [d for d, _ in bot.slack.downloads][:3]
    waiting = [t for t in bot.statuses() if "mine2.md" in t]
    assert any(messages.upload_waiting_for_yours("mine2.md", 2) in t for t in waiting)

    await bot.settle(4, timeout=30)
    for i in range(3):
        assert bot.kb.store.find_document(f"mine{i}.md").state == "indexed"


def _scanned_pdf(pages: int) -> bytes:
    """A PDF of ``pages`` scanned pages (only pictures): each a second or more of OCR."""
    from PIL import Image, ImageDraw, ImageFont

    page = Image.new("L", (1240, 1754), color=255)
    draw = ImageDraw.Draw(page)
    for i in range(12):
        draw.text(
            (100, 150 + i * 60),
            f"Line {i} of the scanned policy.",
            fill=0,
            font=ImageFont.load_default(size=34),
        )
    out = io.BytesIO()
    page.save(out, format="PDF", resolution=150, save_all=True, append_images=[page] * (pages - 1))
    return out.getvalue()


@pytest.mark.skipif(shutil.which("tesseract") is None, reason="needs Tesseract")
async def test_a_slow_document_being_read_does_not_hold_up_anyone_elses_upload(
    make_bot: BotFactory,
) -> None:
    """One member's document that is slow to read (pages of OCR) holds one reader;
    another member's upload sent meanwhile is indexed first, and the slow one
    still ends indexed within its own reading budget (OCR included)."""
    # A budget the eight OCR pages fit in on a busy machine: this is about who waits, not limits.
    bot = await make_bot(
        extract_timeout=120, extract_workers=2, publishers=f"{USER_ID},{OTHER_USER}"
    )
    slow = bot.slack.add_file("F0SLOWPDF1", "scan.pdf", _scanned_pdf(8), "application/pdf")
    fast = bot.slack.add_file("F0FAST0002", "fast.md", _doc("Fast"), "text/markdown")
    await bot.event(file_share_event([slow]))
    await _wait(lambda: any(messages.upload_indexing("scan.pdf") in t for t in bot.statuses()))
    await bot.event(file_share_event([fast], user=OTHER_USER))

    await _wait(lambda: _final_for(bot, "fast.md") is not None, timeout=30)
    assert _final_for(bot, "scan.pdf") is None, "the fast file waited for the slow one"
    assert "indexed" in str(_final_for(bot, "fast.md"))

    await bot.settle(2, timeout=120)
    assert "indexed" in str(_final_for(bot, "scan.pdf"))
    assert bot.kb.store.find_document("scan.pdf").state == "indexed"


async def test_documents_being_indexed_never_hold_up_readyz(
    on_the_endpoint: EndpointBot,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
) -> None:
    """As many documents as the process has threads, each waiting on a slow embeddings
    endpoint: /readyz (and every other short step in a thread) is not queued behind them."""
    threads = 4  # a small machine's default pool of threads (cores + 4)
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(threads))
    bot = await on_the_endpoint(
        extract_workers=threads,
        max_uploads_per_user=threads // 2,
        publishers=f"{USER_ID},{OTHER_USER}",
    )
    llm.hold_embeddings()
    for person in (USER_ID, OTHER_USER):
        files = [
            slack.add_file(
                f"F0{person}{i}", f"{person}-{i}.md", _doc(f"{person} {i}"), "text/markdown"
            )
            for i in range(threads // 2)
        ]
        await bot.event(file_share_event(files, user=person))
    await llm.wait_for_held_embeddings(threads)

    async with asyncio.timeout(10):
        resp = await bot.http.get("/readyz")
    assert resp.status == 200, await resp.text()
    llm.release_embeddings()
    await bot.settle(threads, timeout=60)


async def test_an_upload_whose_document_is_removed_while_it_is_indexed_says_so(
    on_the_endpoint: EndpointBot,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
) -> None:
    bot = await on_the_endpoint(
        publishers=USER_ID,
    )
    llm.hold_embeddings()
    file = slack.add_file("F0GONE0001", "gone.md", _doc("Gone"), "text/markdown")
    await bot.event(file_share_event([file]))
    await llm.wait_for_held_embeddings(1)
    # An admin removes it (`kb rm`, from another process) while its passages are embedded.
    doc = bot.kb.store.find_document("gone.md")
    await asyncio.to_thread(bot.kb.remove, doc.id)
    llm.release_embeddings()
    await bot.idle(timeout=30)

    final = bot.statuses()[-1]
    assert messages.RETRY_GONE in final, final
    assert "No document matches" not in final
    assert RETRY_ACTION_ID not in json.dumps(bot.slack.calls("chat.update")[-1])
    assert [d.name for d in bot.kb.documents() if d.name == "gone.md"] == []


async def test_the_same_file_shared_by_two_people_at_once_is_indexed_once_and_asked_once(
    on_the_endpoint: EndpointBot,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
) -> None:
    admin = "U0ADMIN001"
    bot = await on_the_endpoint(
        admin_users=admin,
    )
    llm.hold_embeddings()
    data = _doc("Shared twice", 3)
    first = slack.add_file("F0SAME0001", "same.md", data, "text/markdown")
    second = slack.add_file("F0SAME0002", "copy.md", data, "text/markdown", user=OTHER_USER)
    await bot.event(file_share_event([first]))
    await llm.wait_for_held_embeddings(1)
    await bot.event(file_share_event([second], user=OTHER_USER))
    waiting = messages.upload_waiting("copy.md")
    # It waits for the first (or, as it used to, is embedded beside it).
    await _wait(
        lambda: any(waiting in t for t in bot.statuses()) or llm.held_embedding_requests > 1,
        timeout=30,
    )
    llm.release_embeddings()
    await bot.idle(timeout=30)

    assert llm.held_embedding_requests == 1, "the same bytes were embedded twice"
    asked = [c for c in slack.calls("chat.postMessage") if c.get("channel") == admin]
    assert len(asked) == 1, asked
    finals = [t for t in bot.statuses() if "sent to the knowledge-base admins" in t]
    assert len(finals) == 1, bot.statuses()
    duplicate = messages.upload_awaiting_duplicate("same.md")
    assert any(duplicate in t for t in bot.statuses()), bot.statuses()
    assert [d.state for d in bot.kb.documents() if d.name == "same.md"] == ["awaiting_approval"]


async def test_an_upload_waiting_for_the_same_bytes_holds_no_indexing_slot(
    on_the_endpoint: EndpointBot,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
) -> None:
    """A second upload of a file being indexed waits for it without one of the process's
    indexing slots: a third person's file is indexed meanwhile."""
    third = "U0THIRD001"
    bot = await on_the_endpoint(extract_workers=2, publishers=f"{USER_ID},{OTHER_USER},{third}")
    llm.hold_embeddings()
    data = _doc("Shared twice", 3)
    await bot.event(
        file_share_event([slack.add_file("F0SAME0001", "same.md", data, "text/markdown")])
    )
    await llm.wait_for_held_embeddings(1)
    copy = slack.add_file("F0SAME0002", "copy.md", data, "text/markdown", user=OTHER_USER)
    await bot.event(file_share_event([copy], user=OTHER_USER))
    await _wait(lambda: any(messages.upload_waiting("copy.md") in t for t in bot.statuses()))
    other = slack.add_file("F0OTHER001", "other.md", _doc("Other"), "text/markdown", user=third)
    await bot.event(file_share_event([other], user=third))

    # Two slots: the first upload holds one, the copy none, so the third file takes the other.
    await llm.wait_for_held_embeddings(2)
    llm.release_embeddings()
    await bot.idle(timeout=30)

    assert llm.held_embedding_requests == 2, "the same bytes were embedded twice"
    assert bot.kb.store.find_document("other.md").state == "indexed"


async def test_the_same_file_shared_to_two_replicas_at_once_is_indexed_once_and_asked_once(
    tmp_path: Path,
    aiohttp_client: Callable[..., Awaitable[TestClient]],
    settings_for: Callable[..., Settings],
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
    database_url: str,
) -> None:
    """Two replicas on one store (one SQLite data dir; Postgres with a data dir each): the
    second to get the bytes waits for the first's indexing and tells what became of it."""
    admin = "U0ADMIN001"

    async def replica(name: str) -> Bot:
        settings = settings_for(
            data_dir=tmp_path / (name if database_url else "kb"),
            database_url=database_url,
            embedding_model="openai:test-embed",
            embedding_base_url=llm.url,
            embedding_timeout=120.0,
            slack_claim_lease=REPLICA_LEASE_S,
            admin_users=admin,
        )
        kb = await asyncio.to_thread(KnowledgeBase, settings.index_config())
        if name == "a":  # the store's first document: its vectors' size
            docs = tmp_path / "docs"
            docs.mkdir()
            (docs / "bikes.md").write_text("# Bicycles\n\nBicycle storage is in the basement.\n")
            await asyncio.to_thread(kb.ingest_paths, [docs])
        client = await aiohttp_client(create_app(settings, kb=kb))
        return Bot(client, client.app, slack, llm, settings, frozenset(asyncio.all_tasks()))

    first_replica = await replica("a")
    second_replica = await replica("b")
    llm.hold_embeddings()
    data = _doc("Shared to two replicas", 3)
    first = slack.add_file("F0REPL0001", "same.md", data, "text/markdown")
    second = slack.add_file("F0REPL0002", "copy.md", data, "text/markdown", user=OTHER_USER)
    await first_replica.event(file_share_event([first]))
    await llm.wait_for_held_embeddings(1)
    await second_replica.event(file_share_event([second], user=OTHER_USER))
    waiting = messages.upload_waiting("copy.md")
    # It waits for the first replica (or, as it used to, is embedded beside it).
    await _wait(
        lambda: (
            any(waiting in t for t in second_replica.statuses()) or llm.held_embedding_requests > 1
        ),
        timeout=30,
    )
    llm.release_embeddings()
    await second_replica.idle(timeout=60)  # the first's work too (started after its own start)

    assert llm.held_embedding_requests == 1, "the same bytes were embedded twice"
    asked = [c for c in slack.calls("chat.postMessage") if c.get("channel") == admin]
    assert len(asked) == 1, asked
    statuses = first_replica.statuses()
    finals = [t for t in statuses if "sent to the knowledge-base admins" in t]
    assert len(finals) == 1, statuses
    assert any(messages.upload_awaiting_duplicate("same.md") in t for t in statuses), statuses
    for kb in (first_replica.kb, second_replica.kb):
        assert [d.state for d in kb.documents() if d.name == "same.md"] == ["awaiting_approval"]


async def test_an_indexing_claim_left_by_a_replica_that_died_lapses_and_the_upload_goes_on(
    on_the_endpoint: EndpointBot, slack: MockSlackAPI
) -> None:
    bot = await on_the_endpoint(slack_claim_lease=REPLICA_LEASE_S)
    following = max(d.id for d in bot.kb.documents()) + 1  # the upload's document
    # Left by a replica killed while it indexed the same bytes: never renewed, nor let go.
    key = f"indexing:{following}"
    assert bot.kb.store.deliveries.claim([key], lease_seconds=REPLICA_LEASE_S, holder="killed")
    file = slack.add_file("F0ORPHAN01", "orphan.md", _doc("Orphaned", 3), "text/markdown")
    await bot.event(file_share_event([file]))
    await bot.idle(timeout=60)

    statuses = bot.statuses()
    waited = [i for i, t in enumerate(statuses) if messages.upload_waiting("orphan.md") in t]
    indexing = [i for i, t in enumerate(statuses) if messages.upload_indexing("orphan.md") in t]
    assert waited and indexing and waited[0] < indexing[-1], statuses
    (document,) = [d for d in bot.kb.documents() if d.name == "orphan.md"]
    assert (document.id, document.state) == (following, "awaiting_approval")


async def test_a_retry_while_an_upload_of_the_same_bytes_indexes_them_waits_and_tells_the_end(
    on_the_endpoint: EndpointBot,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
) -> None:
    bot = await on_the_endpoint()
    data = _doc("Retried while shared again", 3)
    llm.fail_with(400, times=1)
    first = slack.add_file("F0RACE0001", "race.md", data, "text/markdown")
    await bot.event(file_share_event([first]))
    await bot.idle(timeout=30)
    (failed,) = [c for c in slack.calls("chat.update") if ": failed:" in c["text"]]
    (button,) = [e for b in failed["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert button["action_id"] == RETRY_ACTION_ID

    llm.hold_embeddings()
    second = slack.add_file("F0RACE0002", "again.md", data, "text/markdown", user=OTHER_USER)
    await bot.event(file_share_event([second], user=OTHER_USER))
    await llm.wait_for_held_embeddings(1)
    body = block_actions_body(
        [button_action(RETRY_ACTION_ID, button["value"])],
        channel_id=failed["channel"],
        message_ts=failed["ts"],
    )
    assert (await bot.post(body)).status == 200
    waiting = messages.upload_waiting("race.md")
    # It waits for the upload (or, as it used to, says the document is indexing and stops).
    await _wait(
        lambda: any(
            waiting in c["text"] for c in slack.calls("chat.update") if c["ts"] == failed["ts"]
        ),
        timeout=30,
    )
    llm.release_embeddings()
    await bot.idle(timeout=30)

    assert llm.held_embedding_requests == 1, "the same bytes were embedded twice"
    retried = [c["text"] for c in slack.calls("chat.update") if c["ts"] == failed["ts"]]
    # Told what the upload made of it (members' uploads wait for an admin here).
    assert [d.state for d in bot.kb.documents() if d.name == "race.md"] == ["awaiting_approval"]
    assert messages.upload_awaiting_duplicate("race.md") in retried[-1], retried


def _final_for(bot: Bot, name: str) -> str | None:
    done = [
        t
        for t in bot.statuses()
        if f"*{name}*" in t and any(w in t for w in (": indexed,", ": failed:"))
    ]
    return done[-1] if done else None


async def _wait(predicate: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s")
        await asyncio.sleep(0.02)


# ---------------------------------------------------------------- acknowledgement

_HOLD_LOCK = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], timeout=30, isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
print("locked", flush=True)
time.sleep(float(sys.argv[2]))
conn.execute("COMMIT")
"""


@pytest.fixture
def write_lock(bot: Bot) -> Iterator[subprocess.Popen[str]]:
    """Another process holding the database's write lock for 4 s."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(bot.kb.store.path), "4"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        yield proc
    finally:
        proc.kill()
        proc.wait()


async def test_acknowledgement_never_waits_on_a_database_lock(
    bot: Bot, write_lock: subprocess.Popen[str]
) -> None:
    body = event_body(app_mention_event(IN_DOMAIN), event_id="Ev0LOCKED001")
    started = time.monotonic()
    resp = await bot.post(body)
    acked = time.monotonic() - started
    assert resp.status == 200
    assert acked < 2.0, f"the ack took {acked:.2f} s while another process held the write lock"
    assert write_lock.poll() is None, "the lock was still held when Slack got its ack"
    again = await bot.post(body, retry_num=1)  # Slack's redelivery meanwhile
    assert again.status == 200
    answer = await bot.answer()
    await bot.idle()
    assert ANSWER in answer["text"]
    assert len(bot.slack.calls("chat.postMessage")) == 1


async def test_a_question_while_another_process_holds_the_lock_longer_than_sqlite_waits_is_answered(
    bot: Bot,
) -> None:
    # A long command in a shell holding the write lock: past SQLite's 30 s the
    # question's log cannot be written, and the answer must reach the asker anyway.
    proc = subprocess.Popen(
        [sys.executable, "-c", _HOLD_LOCK, str(bot.kb.store.path), "120"],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "locked"
        started = time.monotonic()
        await bot.event(app_mention_event(IN_DOMAIN))
        await bot.idle(timeout=60)
        waited = time.monotonic() - started
        assert proc.poll() is None, "the answer waited for the lock to be let go"
    finally:
        proc.kill()
        proc.wait()
    # Posted whole, without feedback buttons: a question not logged cannot be rated.
    assert any(ANSWER in t for t in _texts(bot.slack.calls("chat.postMessage"))), waited
    assert waited < 20.0, f"the asker waited {waited:.1f} s"
    assert bot.kb.queries.latest(10) == []


async def test_an_answer_written_while_postgres_dropped_the_connections_reaches_the_asker(
    make_bot: BotFactory, postgres_url: str, tmp_path: Path
) -> None:
    bot = await _bot_on_postgres(make_bot, postgres_url, tmp_path)

    def restarted(messages: object) -> str:
        _end_connections(postgres_url)  # while the model writes
        return ANSWER

    bot.llm.set_reply(restarted)
    await bot.event(message_im_event("Where can I leave my bicycle?"))
    await bot.idle(timeout=30)
    assert len(bot.llm.requests) == 1
    told = _texts(bot.slack.calls("chat.postMessage") + bot.slack.calls("chat.update"))
    assert any(ANSWER in t for t in told), told
    assert not any(messages.ERROR_GENERIC in t for t in told), told


async def test_a_question_after_postgres_ended_the_connections_is_answered_and_logged(
    make_bot: BotFactory, postgres_url: str, tmp_path: Path
) -> None:
    bot = await _bot_on_postgres(make_bot, postgres_url, tmp_path)
    _end_connections(postgres_url)  # a restart, a failover: the server is back at once
    await bot.event(message_im_event("Where can I leave my bicycle?"))
    answer = await bot.answer(timeout=30)
    assert ANSWER in answer["text"]
    assert len(bot.kb.queries.latest(10)) == 1
    # A write first after the connections ended too: the knowledge base's own.
    _end_connections(postgres_url)
    bot.kb.store.set_meta("probe", "written")
    assert bot.kb.store.get_meta("probe") == "written"


async def _bot_on_postgres(make_bot: BotFactory, postgres_url: str, tmp_path: Path) -> Bot:
    """The bot on Postgres with one document, its threads one (the same connection each time)."""
    asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(1))
    bot = await make_bot(documents=False, database_url=postgres_url)
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "bikes.md").write_text("# Bicycles\n\nBicycle storage is in the basement.\n")
    await asyncio.to_thread(bot.kb.ingest_paths, [docs])
    bot.llm.set_reply(ANSWER)
    return bot


def _end_connections(url: str) -> None:
    """The server ends every other connection to the database (as a restart does)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )


async def test_replicas_sharing_the_database_answer_an_event_once(
    make_bot: BotFactory, bot: Bot
) -> None:
    replica = await make_bot()
    assert replica.kb.store.path == bot.kb.store.path
    body = event_body(app_mention_event(IN_DOMAIN), event_id="Ev0TWOREPL01")
    first, second = await asyncio.gather(bot.post(body), replica.post(body, retry_num=1))
    assert first.status == second.status == 200
    await bot.answer()
    await replica.idle()  # also waits for the first bot's work, which started meanwhile
    assert len(bot.slack.calls("chat.postMessage")) == 1
    assert len(bot.llm.requests) == 1


async def test_the_delivery_record_failing_never_loses_the_question(
    bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    claims: list[object] = []

    def unavailable(keys: object, **kwargs: Any) -> bool:
        claims.append(keys)
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(bot.kb.deliveries, "claim", unavailable)
    await bot.event(app_mention_event(IN_DOMAIN))
    answer = await bot.answer()
    assert ANSWER in answer["text"]
    assert len(claims) == 1  # the record really was asked for, and failed
