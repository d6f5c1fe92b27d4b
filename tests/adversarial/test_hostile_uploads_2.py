"""Uploads that race each other or carry names that fool a comparison end as their
uploaders were told, and never put an earlier document in the place of a later one.

An attacker (or only an unlucky team) uploads a new version of a document while
the earlier one is still being read (a slow PDF, a Retry of an old failure, a
takeover after a replica died): whichever finishes last must not decide which
version answers. File names that look the same to people (one typed on macOS, whose
names are decomposed Unicode, one on Windows) are one document's versions; names
too long to show whole that differ where they are cut are different documents.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import messages
from bot.slack.blocks import RETRY_ACTION_ID
from bot.slack.uploads import SlackFile
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.models import DocState, Publish
from index.names import MAX_NAME_CHARS, document_name
from index.records import DocumentRow
from index.storage import STATUS

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import BotFactory  # noqa: E402
from tests.servers import (  # noqa: E402
    DM_CHANNEL_ID,
    USER_ID,
    block_actions_body,
    button_action,
    file_share_event,
)

OLD = b"# Travel policy\n\nTrain tickets are booked through the travel desk.\n"
NEW = b"# Travel policy\n\nTrain tickets are booked in the Trips app since March.\n"


@pytest.fixture
def kb(index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    return KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)


def _failed(kb: KnowledgeBase, data: bytes, name: str) -> DocumentRow:
    """``data`` added as ``name`` by U1, and its indexing failed (the disk was full)."""
    row = kb.add_bytes(data, name, uploader="U1").document
    kb.store.update_document(row.id, state=DocState.FAILED.value, failure_reason="disk full")
    return row


def test_an_earlier_upload_indexed_last_does_not_replace_the_later_one(kb: KnowledgeBase) -> None:
    # The earlier upload's reading takes longer: the later one is indexed first.
    earlier = kb.add_bytes(OLD, "travel.md", uploader="U1").document
    later = kb.add_bytes(NEW, "travel.md", uploader="U1").document
    assert kb.index_document(later.id).state == DocState.INDEXED

    row = kb.index_document(earlier.id)

    assert row.state == DocState.REPLACED and row.replaced_by == later.id
    assert kb.document(later.id).state == DocState.INDEXED
    assert [d.id for d in kb.documents(DocState.INDEXED)] == [later.id]
    # Kept, as an earlier version is: an admin can bring it back.
    assert kb.restore(earlier.id, actor="admin").document.state == DocState.INDEXED


def test_a_retry_of_an_old_failure_does_not_replace_the_version_uploaded_since(
    kb: KnowledgeBase,
) -> None:
    earlier = _failed(kb, OLD, "travel.md")
    later = kb.ingest_bytes(NEW, "travel.md", uploader="U1").document
    assert later.state == DocState.INDEXED

    row = kb.retry(earlier.id)

    assert row.state == DocState.REPLACED and row.replaced_by == later.id
    assert [d.id for d in kb.documents(DocState.INDEXED)] == [later.id]


def test_a_reindex_does_not_put_an_old_failure_in_the_place_of_the_version_since(
    kb: KnowledgeBase,
) -> None:
    earlier = _failed(kb, OLD, "travel.md")
    later = kb.ingest_bytes(NEW, "travel.md", uploader="U1").document

    kb.reindex()

    assert kb.document(earlier.id).state == DocState.REPLACED
    assert [d.id for d in kb.documents(DocState.INDEXED)] == [later.id]


async def test_a_retry_of_an_old_failure_tells_its_uploader_the_newer_version_answers(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(publishers=USER_ID)
    old = bot.slack.add_file("F0TRAVEL01", "travel.md", OLD, "text/markdown")
    await bot.event(file_share_event([old]))
    await bot.settle()
    earlier = bot.kb.store.find_document("travel.md")
    # Its indexing failed (a full disk, say): its status offers a Retry.
    bot.kb.store.update_document(earlier.id, state=DocState.FAILED.value, failure_reason="disk")
    new = bot.slack.add_file("F0TRAVEL02", "travel.md", NEW, "text/markdown")
    await bot.event(file_share_event([new]))
    await bot.settle(2)
    [later] = [d for d in bot.kb.documents(DocState.INDEXED) if d.name == "travel.md"]
    assert later.id != earlier.id
    [posted] = bot.kb.messages.of(earlier.id, STATUS)
    channel, ts = posted.channel, posted.ts

    body = block_actions_body(
        [button_action(RETRY_ACTION_ID, str(earlier.id))], channel_id=channel, message_ts=ts
    )
    assert (await bot.post(body)).status == 200
    await bot.idle()

    told = bot.slack.messages[(channel, ts)]["text"]
    assert messages.UPLOAD_KEPT_EARLIER in told, told
    assert bot.kb.document(earlier.id).state == DocState.REPLACED
    assert bot.kb.document(later.id).state == DocState.INDEXED


def test_a_name_typed_on_another_system_is_the_same_documents_next_version(
    kb: KnowledgeBase,
) -> None:
    # macOS hands over decomposed names (e + U+0301), Windows and Linux composed ones (é).
    decomposed, composed = "Re\u0301sume\u0301.md", "R\u00e9sum\u00e9.md"
    first = kb.ingest_bytes(OLD, decomposed, uploader="U1").document
    second = kb.ingest_bytes(NEW, composed, uploader="U1").document

    assert second.name == first.name == composed
    assert kb.document(first.id).state == DocState.REPLACED
    assert [d.id for d in kb.documents(DocState.INDEXED)] == [second.id]


def test_long_names_that_differ_past_the_shown_length_are_different_documents(
    kb: KnowledgeBase,
) -> None:
    stem = "Minutes of the finance committee meeting on the travel policy review " * 3
    january = kb.ingest_bytes(OLD, stem + "2026-01.md", uploader="U1").document
    february = kb.ingest_bytes(NEW, stem + "2026-02.md", uploader="U1").document

    assert january.name != february.name
    assert len(january.name) <= MAX_NAME_CHARS and january.name.endswith(".md")
    assert {d.id for d in kb.documents(DocState.INDEXED)} == {january.id, february.id}
    # The same long name again is the same document's next version.
    again = kb.ingest_bytes(OLD + b"\nUpdated.\n", stem + "2026-01.md", uploader="U1").document
    assert again.name == january.name
    assert kb.document(january.id).state == DocState.REPLACED


def test_a_slack_file_is_named_as_the_knowledge_base_names_it() -> None:
    long = "Quarterly report " * 12 + "A.pdf"
    for name in (long, "Re\u0301sume\u0301.md"):
        assert SlackFile.from_payload({"id": "F1", "name": name}).name == document_name(name)


async def test_a_retry_after_its_uploader_lost_the_publishing_right_asks_the_admins(
    make_bot: BotFactory,
) -> None:
    # Uploaded while the person was a publisher; it failed. Since then they are one no
    # more (taken off KB_PUBLISHERS, out of the publishers' group): this bot has none.
    bot = await make_bot(admin_users="U0ADMIN001")
    current = bot.kb.ingest_bytes(OLD, "travel.md", uploader="U0ADMIN001").document
    theirs = bot.kb.add_bytes(NEW, "travel.md", uploader=USER_ID, publish=Publish.DIRECT).document
    bot.kb.store.update_document(theirs.id, state=DocState.FAILED.value, failure_reason="disk")
    client = AsyncWebClient(token=bot.slack.bot_token, base_url=bot.slack.api_url)
    posted = await client.chat_postMessage(channel=DM_CHANNEL_ID, text="travel.md: failed")
    bot.kb.messages.record(theirs.id, STATUS, str(posted["channel"]), str(posted["ts"]))

    body = block_actions_body(
        [button_action(RETRY_ACTION_ID, str(theirs.id))],
        channel_id=str(posted["channel"]),
        message_ts=str(posted["ts"]),
    )
    assert (await bot.post(body)).status == 200
    await bot.idle()

    assert bot.kb.document(theirs.id).state == DocState.AWAITING_APPROVAL
    assert bot.kb.document(current.id).state == DocState.INDEXED


async def test_a_download_cut_short_fails_rather_than_index_part_of_the_file(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(publishers=USER_ID)
    whole = OLD + b"\n## Hotels\n\nHotels are booked by the travel desk too.\n"
    f = bot.slack.add_file("F0CUTSHORT", "cut.md", whole, "text/markdown")
    # What arrived ends early (a proxy closing a connection that had no Content-Length):
    # Slack's file object still says how many bytes the file has.
    f["size"] = len(whole) + 4096
    await bot.event(file_share_event([f]))
    await bot.settle()

    final = bot.statuses()[-1]
    assert messages.DOWNLOAD_CUT_SHORT in final and ": failed:" in final, final
    assert not [d for d in bot.kb.documents() if d.name == "cut.md"]


def test_an_old_failure_sent_again_after_a_newer_version_is_the_current_version(
    kb: KnowledgeBase,
) -> None:
    # The same bytes sent again are a new upload: the latest, whatever their earlier failure.
    _failed(kb, OLD, "travel.md")
    newer = kb.ingest_bytes(NEW, "travel.md", uploader="U1").document

    again = kb.ingest_bytes(OLD, "travel.md", uploader="U1")

    assert not again.duplicate and again.document.state == DocState.INDEXED
    assert kb.document(newer.id).state == DocState.REPLACED
    assert [d.id for d in kb.documents(DocState.INDEXED)] == [again.document.id]
