"""`/kb-upload`, files shared in a DM, downloads from Slack and the Retry button."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from slack_sdk.web.async_client import AsyncWebClient

from bench.near_copies import as_docx, as_html, as_pdf
from bot.slack import messages
from bot.slack.blocks import RETRY_ACTION_ID, UPLOAD_CALLBACK_ID
from bot.slack.uploads import (
    DownloadFailed,
    SlackFile,
    UploadRequest,
    check_download_url,
    download,
)
from bot.slack.words import words_for
from index.models import Publish
from tests.conftest import SAMPLE

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import Bot, BotFactory  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DEFAULT_BOT_TOKEN,
    DM_CHANNEL_ID,
    USER_ID,
    MockSlackAPI,
    block_actions_body,
    button_action,
    file_input_state,
    file_share_event,
    slash_command_body,
    view_submission_body,
)

GUIDE = b"""# Onboarding guide

## First day

Pick up your badge at the front desk before 09:30 and bring an ID.

## Accounts

Your manager requests the accounts you need; they arrive within two working days.
"""


class _LoginPageSlack(MockSlackAPI):
    """A mock Slack that can also serve a file URL that only ever answers the sign-in page."""

    def _build_app(self) -> web.Application:
        app = super()._build_app()

        async def login(request: web.Request) -> web.Response:
            page = (
                b"<!DOCTYPE html><html><head><title>Slack</title></head><body>Sign in</body></html>"
            )
            content_type = request.query.get("ct", "text/html")
            return web.Response(body=page, content_type=content_type)

        app.router.add_get("/files-login/{name}", login)
        return app


@pytest.fixture
async def slack() -> Any:
    """Override: the mock with the extra login-page route."""
    async with _LoginPageSlack() as server:
        yield server


async def _open_modal(bot: Bot, channel: str = CHANNEL_ID) -> dict[str, Any]:
    resp = await bot.post(slash_command_body("/kb-upload", "", USER_ID, channel))
    assert resp.status == 200
    (call,) = await bot.slack.wait_for("views.open")
    return dict(call["view"])


async def _submit(
    bot: Bot, files: list[dict[str, Any]], *, visibility: str | None = None, title: str = ""
) -> Any:
    view = await _open_modal(bot)
    state = file_input_state("files", "files", files)
    state["values"]["title"] = {"title": {"type": "plain_text_input", "value": title}}
    if visibility:
        state["values"]["visibility"] = {
            "visibility": {"type": "radio_buttons", "selected_option": {"value": visibility}}
        }
    return await bot.post(view_submission_body({**view, "state": state}))


async def test_upload_command_opens_a_modal_with_a_file_input(bot: Bot) -> None:
    view = await _open_modal(bot)
    assert view["callback_id"] == UPLOAD_CALLBACK_ID
    inputs = [b["element"] for b in view["blocks"] if b["type"] == "input"]
    assert inputs[0]["type"] == "file_input" and inputs[0]["max_files"] == 10
    assert any(e["type"] == "radio_buttons" for e in inputs)
    assert json.loads(view["private_metadata"]) == {"channel": CHANNEL_ID}


async def test_upload_from_a_dm_offers_no_channel_visibility(bot: Bot) -> None:
    view = await _open_modal(bot, DM_CHANNEL_ID)
    assert not any(b.get("block_id") == "visibility" for b in view["blocks"])


async def test_submitted_file_is_downloaded_with_the_token_and_indexed(bot: Bot) -> None:
    f = bot.slack.add_file("F0GUIDE001", "onboarding.md", GUIDE, "text/markdown")
    resp = await _submit(bot, [f], visibility="channel", title="Onboarding")
    assert resp.status == 200 and await resp.text() == ""
    await bot.settle()

    assert bot.slack.downloads == [("F0GUIDE001", True)]
    doc = bot.kb.store.find_document("onboarding.md")
    assert doc.state == "indexed" and doc.chunk_count > 0
    assert doc.scope == CHANNEL_ID and doc.title == "Onboarding" and doc.uploader == USER_ID
    statuses = bot.statuses()
    assert "queued" in statuses[0]
    assert any("indexing" in s for s in statuses)
    assert statuses[-1].endswith(f"indexed, {doc.chunk_count} chunks.")
    assert all(c["channel"] == CHANNEL_ID for c in bot.slack.calls("chat.postMessage"))


@pytest.mark.parametrize("metadata", [5, ["C0GENERAL1"], {"channel": "C0GENERAL1"}, None])
async def test_a_view_whose_metadata_is_not_text_is_refused_before_any_listener(
    bot: Bot, product_logs: Any, metadata: object
) -> None:
    # Slack echoes the text the bot set; a view of another type raised TypeError (json.loads
    # of an int) after the modal had closed: the upload was lost with a traceback.
    out = product_logs("console")
    f = bot.slack.add_file("F0META0001", "onboarding.md", GUIDE, "text/markdown")
    view = await _open_modal(bot)
    state = file_input_state("files", "files", [f])
    body = view_submission_body({**view, "state": state, "private_metadata": metadata})
    resp = await bot.post(body)
    assert resp.status == 400
    await bot.idle()
    assert bot.slack.downloads == [] and bot.slack.calls("chat.postMessage") == []
    assert "Traceback" not in out.getvalue() and "[error" not in out.getvalue()


@pytest.mark.parametrize("metadata", ["", "{not json", json.dumps({"channel": DM_CHANNEL_ID})])
async def test_only_this_channel_on_a_form_naming_no_channel_is_refused_not_widened(
    bot: Bot, metadata: str
) -> None:
    # The form offers "only this channel" only where there is one. A submission that
    # chose it on a form naming none (damaged, forged, or a DM) once made the files
    # everyone's: it is refused in the modal, and nothing is downloaded.
    f = bot.slack.add_file("F0NOCHAN01", "salaries.md", GUIDE, "text/markdown")
    view = await _open_modal(bot)
    state = file_input_state("files", "files", [f])
    state["values"]["visibility"] = {
        "visibility": {"type": "radio_buttons", "selected_option": {"value": "channel"}}
    }
    resp = await bot.post(
        view_submission_body({**view, "state": state, "private_metadata": metadata})
    )
    assert await resp.json() == {
        "response_action": "errors",
        "errors": {"visibility": messages.UPLOAD_CHANNEL_UNKNOWN},
    }
    await bot.idle()
    assert bot.slack.downloads == [] and bot.slack.calls("chat.postMessage") == []
    assert not any(d.name == "salaries.md" for d in bot.kb.store.documents())


async def test_submission_without_files_is_rejected_in_the_modal(bot: Bot) -> None:
    resp = await _submit(bot, [])
    body = await resp.json()
    assert body == {"response_action": "errors", "errors": {"files": messages.UPLOAD_NO_FILE}}
    assert bot.slack.calls("chat.postMessage") == []


@pytest.mark.parametrize("content_type", ["text/html", "application/octet-stream"])
async def test_login_page_instead_of_the_file_is_a_failed_download(
    bot: Bot, content_type: str
) -> None:
    f = bot.slack.add_file("F0LOGIN001", "policy.md", b"unused", "text/markdown")
    f["url_private_download"] = f"{bot.slack.url}/files-login/policy.md?ct={content_type}"
    before = len(bot.kb.store.documents())
    await _submit(bot, [f])
    await bot.settle()
    final = bot.statuses()[-1]
    assert "failed" in final and "login page" in final and "files:read" in final
    assert len(bot.kb.store.documents()) == before


async def test_file_fetched_without_a_valid_token_is_never_ingested(make_bot: BotFactory) -> None:
    # The Web API calls use a good client; the token used for downloads is not accepted.
    bot = await make_bot(slack_bot_token="xoxb-revoked")
    f = bot.slack.add_file("F0NOAUTH01", "notes.md", GUIDE, "text/markdown")
    # For the channel: with the bot token refused nobody can say who reads those for everyone.
    request = dataclasses.replace(_request(), scope=CHANNEL_ID)
    await bot.services.uploader.ingest(_client(bot), [f], request)
    await bot.settle()
    assert bot.slack.downloads == [("F0NOAUTH01", False)]
    assert "login page" in bot.statuses()[-1]
    assert not any(d.name == "notes.md" for d in bot.kb.store.documents())


async def test_corrupt_file_fails_with_reason_and_retry_reports_again(bot: Bot) -> None:
    f = bot.slack.add_file("F0CORRUPT1", "scan.pdf", os.urandom(4096), "application/pdf")
    await _submit(bot, [f])
    await bot.settle()
    doc = bot.kb.store.find_document("scan.pdf")
    assert doc.state == "failed"
    (final,) = [c for c in bot.slack.calls("chat.update") if "failed" in c["text"]]
    assert doc.failure_reason and doc.failure_reason[:20] in final["text"]
    (button,) = [e for b in final["blocks"] if b["type"] == "actions" for e in b["elements"]]
    assert button["action_id"] == RETRY_ACTION_ID and button["value"] == str(doc.id)

    updates_before = len(bot.slack.calls("chat.update"))
    body = block_actions_body(
        [button_action(RETRY_ACTION_ID, button["value"])],
        channel_id=final["channel"],
        message_ts=final["ts"],
    )
    assert (await bot.post(body)).status == 200
    updates = await bot.slack.wait_for("chat.update", updates_before + 2)
    retried = updates[updates_before:]
    assert {u["ts"] for u in retried} == {final["ts"]}, "the same status message is updated"
    assert "indexing" in retried[0]["text"] and "failed" in retried[-1]["text"]
    assert bot.kb.store.document(doc.id).updated_at > doc.updated_at


async def test_a_retry_forged_by_someone_else_is_refused_without_naming_the_document(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(admin_users="U0ADMIN001")
    f = bot.slack.add_file("F0SECRET01", "layoffs-2027.pdf", os.urandom(4096), "application/pdf")
    await _submit(bot, [f])
    await bot.settle()
    doc = bot.kb.store.find_document("layoffs-2027.pdf")
    updates_before = len(bot.slack.calls("chat.update"))
    posts_before = len(bot.slack.calls("chat.postMessage"))
    # A colleague clicks Retry on their own status message with this document's id.
    body = block_actions_body(
        [button_action(RETRY_ACTION_ID, str(doc.id))],
        user_id="U0COLLEAG01",
        channel_id=CHANNEL_ID,
        message_ts="1700000000.000100",
        response_url=bot.slack.response_url("r1"),
    )
    assert (await bot.post(body)).status == 200
    [reply] = await bot.slack.wait_for_responses(1, "r1")
    await bot.idle()
    assert reply["text"] == messages.RETRY_NOT_YOURS
    assert len(bot.slack.calls("chat.update")) == updates_before
    assert len(bot.slack.calls("chat.postMessage")) == posts_before
    assert "layoffs" not in json.dumps(bot.slack.responses("r1"))
    assert bot.kb.store.document(doc.id).updated_at == doc.updated_at
    # An admin may, from the status message.
    (final,) = [c for c in bot.slack.calls("chat.update") if "failed" in c["text"]]
    body = block_actions_body(
        [button_action(RETRY_ACTION_ID, str(doc.id))],
        user_id="U0ADMIN001",
        channel_id=final["channel"],
        message_ts=final["ts"],
    )
    assert (await bot.post(body)).status == 200
    await bot.slack.wait_for("chat.update", updates_before + 2)
    assert bot.kb.store.document(doc.id).updated_at > doc.updated_at


async def test_a_retry_forged_onto_someone_elses_answer_edits_nothing(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(admin_users="U0ADMIN001")
    # Someone's answer: a message the bot posted, but no document's status message.
    answer = await _client(bot).chat_postMessage(channel=CHANNEL_ID, text="The answer.")
    updates_before = len(bot.slack.calls("chat.update"))
    for value in ("987654", str(bot.kb.store.find_document("handbook.md").id)):
        body = block_actions_body(
            [button_action(RETRY_ACTION_ID, value)],
            user_id="U0ADMIN001",  # an admin: allowed to retry any document
            channel_id=CHANNEL_ID,
            message_ts=str(answer["ts"]),
            response_url=bot.slack.response_url(f"r{value}"),
        )
        assert (await bot.post(body)).status == 200
        [reply] = await bot.slack.wait_for_responses(1, f"r{value}")
        assert reply["text"] == messages.BUTTON_NOT_HERE
        assert reply.get("response_type") == "ephemeral"
    await bot.idle()
    assert len(bot.slack.calls("chat.update")) == updates_before
    assert bot.slack.messages[(CHANNEL_ID, str(answer["ts"]))]["text"] == "The answer."


async def test_retry_of_a_document_removed_meanwhile_says_so(bot: Bot) -> None:
    f = bot.slack.add_file("F0GONE0001", "gone.pdf", os.urandom(4096), "application/pdf")
    await _submit(bot, [f])
    await bot.settle()
    doc = bot.kb.store.find_document("gone.pdf")
    (final,) = [c for c in bot.slack.calls("chat.update") if "failed" in c["text"]]
    bot.kb.remove(doc.id)
    updates_before = len(bot.slack.calls("chat.update"))
    body = block_actions_body(
        [button_action(RETRY_ACTION_ID, str(doc.id))],
        channel_id=final["channel"],
        message_ts=final["ts"],
    )
    assert (await bot.post(body)).status == 200
    updates = await bot.slack.wait_for("chat.update", updates_before + 1)
    assert messages.RETRY_GONE in updates[-1]["text"]
    await bot.idle()


async def test_download_from_a_foreign_host_is_refused(bot: Bot) -> None:
    f = bot.slack.add_file("F0EVIL0001", "evil.md", GUIDE, "text/markdown")
    f["url_private_download"] = "https://files.evil.example/evil.md"
    await _submit(bot, [f])
    await bot.settle()
    final = bot.statuses()[-1]
    assert "failed" in final and "Refused to download from files.evil.example" in final
    assert bot.slack.downloads == []


async def test_oversized_file_fails_while_streaming(make_bot: BotFactory) -> None:
    bot = await make_bot(max_upload_bytes=2000)
    f = bot.slack.add_file("F0BIG00001", "big.md", b"# Big\n\n" + b"word " * 2000, "text/markdown")
    del f["size"]  # no declared size: the limit is enforced while reading
    await _submit(bot, [f])
    await bot.settle()
    assert "too large" in bot.statuses()[-1]
    declared = bot.slack.add_file("F0BIG00002", "big2.md", b"x" * 5000, "text/markdown")
    await bot.services.uploader.ingest(_client(bot), [declared], _request())
    await bot.settle(2)
    assert "too large" in bot.statuses()[-1]
    assert [d for d, _ in bot.slack.downloads] == ["F0BIG00001"], (
        "a declared size over the limit is not fetched"
    )


async def test_an_upload_under_the_free_space_floor_fails_with_that_reason(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(min_free_bytes=1024**5)  # the most it may be: more than any disk has
    before = bot.kb.documents()
    originals = sorted(bot.kb.store.originals_dir.rglob("*"))
    f = bot.slack.add_file("F0GUIDE001", "onboarding.md", GUIDE, "text/markdown")
    await _submit(bot, [f])
    await bot.settle()
    final = bot.statuses()[-1]
    assert "failed" in final and "The server's disk is nearly full" in final
    assert "KB_MIN_FREE_BYTES" in final and "unexpected" not in final
    assert bot.kb.documents() == before
    assert sorted(bot.kb.store.originals_dir.rglob("*")) == originals


async def test_file_shared_in_a_dm_by_a_publisher_is_ingested_for_everyone(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(publishers=USER_ID)
    f = bot.slack.add_file("F0DMFILE01", "faq.md", GUIDE, "text/markdown")
    event = file_share_event([f])
    await bot.event(event)
    await bot.settle()
    doc = bot.kb.store.find_document("faq.md")
    assert doc.state == "indexed" and doc.scope == "*"
    (status,) = bot.slack.calls("chat.postMessage")
    assert status["channel"] == DM_CHANNEL_ID and status["thread_ts"] == event["ts"]
    assert bot.statuses()[-1].endswith(f"indexed, {doc.chunk_count} chunks.")


async def test_same_file_twice_is_reported_as_already_there(bot: Bot) -> None:
    f = bot.slack.add_file("F0TWICE001", "twice.md", GUIDE, "text/markdown")
    await bot.event(file_share_event([f]))
    await bot.settle()
    await bot.event(file_share_event([f]))
    await bot.settle(2)
    assert "already in the knowledge base" in bot.statuses()[-1]


@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://files.slack.com/files-pri/T1-F1/download/a.pdf", True),
        ("https://example.slack.com/files-pri/T1-F1/a.pdf", True),
        ("http://files.slack.com/files-pri/T1-F1/a.pdf", False),
        ("https://files.slack.com.evil.example/a.pdf", False),
        ("https://evil.example/?next=files.slack.com", False),
        ("https://slack.com.evil.example/a", False),
        ("http://127.0.0.1:8080/files-pri/x", True),
        ("http://127.0.0.1:9999/files-pri/x", False),
        ("https://127.0.0.1:8080/files-pri/x", False),
        ("file:///etc/passwd", False),
        ("https://[files.slack.com/f", False),
        ("https://files.slack.com:port/f", False),
    ],
)
def test_download_hosts(url: str, allowed: bool) -> None:
    assert (
        check_download_url(url, "http://127.0.0.1:8080/api/", words=words_for("en")) is None
    ) is allowed


@pytest.mark.parametrize(
    "url", ["https://[files.slack.com/f", "https://files.slack.com:port/f", "http://[::1:8080/x"]
)
async def test_a_download_link_that_does_not_parse_is_a_reason(url: str) -> None:
    assert (
        check_download_url(url, "http://127.0.0.1:8080/api/", words=words_for("en"))
        == messages.DOWNLOAD_BAD_URL
    )
    file = SlackFile(id="F1", name="a.pdf", mimetype="", filetype="pdf", url=url, size=10)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(DownloadFailed) as caught:
            await download(
                session,
                file,
                token=DEFAULT_BOT_TOKEN,
                max_bytes=1000,
                api_url="http://127.0.0.1:8080/",
                words=words_for("en"),
            )
    assert str(caught.value) == messages.DOWNLOAD_BAD_URL


def _client(bot: Bot) -> AsyncWebClient:
    return AsyncWebClient(token=bot.slack.bot_token, base_url=bot.slack.api_url)


def _request() -> UploadRequest:
    return UploadRequest(
        channel=CHANNEL_ID, user=USER_ID, scope="*", publish=Publish.DIRECT, words=words_for("en")
    )


async def test_a_redirect_to_a_location_that_does_not_parse_is_a_reason(
    aiohttp_server: Any,
) -> None:
    # The file host answers with a redirect whose Location is not a URL.
    async def redirect(_: web.Request) -> web.Response:
        return web.Response(status=302, headers={"Location": "https://[files.slack.com/f"})

    app = web.Application()
    app.router.add_get("/files-pri/a.pdf", redirect)
    server = await aiohttp_server(app)
    base = f"http://127.0.0.1:{server.port}/"
    file = SlackFile(
        id="F1", name="a.pdf", mimetype="", filetype="pdf", url=base + "files-pri/a.pdf", size=10
    )
    async with aiohttp.ClientSession() as session:
        with pytest.raises(DownloadFailed) as caught:
            await download(
                session,
                file,
                token=DEFAULT_BOT_TOKEN,
                max_bytes=1000,
                api_url=base,
                words=words_for("en"),
            )
    assert str(caught.value) == messages.DOWNLOAD_BAD_URL


# The guide re-saved: its lines broken elsewhere, two spaces for one, a soft hyphen
# (as a PDF extraction gives): the same words (``index.normal_form.same_text``).
GUIDE_RESAVED = (
    GUIDE.replace(b"before 09:30 and", b"before 09:30\nand")
    .replace(b"requests the", b"requests  the")
    .replace(b"accounts you", "ac\u00adcounts you".encode())
)


async def _share(
    bot: Bot,
    file_id: str,
    name: str,
    data: bytes,
    final: str = ": indexed,",
    mimetype: str = "text/markdown",
) -> str:
    """Send ``data`` to the bot in a DM; its final status (the next one holding ``final``)."""
    f = bot.slack.add_file(file_id, name, data, mimetype)
    before = sum(final in t for t in bot.statuses())
    await bot.event(file_share_event([f]))
    deadline = time.monotonic() + 30
    while sum(final in t for t in bot.statuses()) <= before or bot.services.jobs:
        assert time.monotonic() < deadline, bot.statuses()
        await asyncio.sleep(0.02)
    doc = bot.kb.store.find_document(name)
    assert doc.state == "indexed", doc.failure_reason
    return bot.statuses()[-1]


async def test_an_upload_repeating_a_document_is_indexed_and_names_it_linked(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(publishers=USER_ID)
    handbook = bot.kb.ingest_bytes(GUIDE, "handbook.md", title="Staff handbook").document
    other = bot.kb.ingest_bytes(b"# Parking\n\nPark in bay 4.\n", "parking.md").document
    status = await _share(bot, "F0COPY0001", "guide-copy.md", GUIDE_RESAVED)
    copy = bot.kb.store.find_document("guide-copy.md")
    assert copy.id != handbook.id and copy.chunk_count == handbook.chunk_count
    assert status.startswith(":white_check_mark: *guide-copy.md*: indexed")
    assert "Its text is the same as that of <" in status
    assert f"/d/{handbook.id}?t=" in status and "|*Staff handbook*>" in status
    assert f"/d/{other.id}?" not in status and "already in the knowledge base" in status
    # A text that is not the same is no copy: nearly the same, it is named as such.
    changed = GUIDE.replace(b"two working days", b"three working days")
    near = await _share(bot, "F0NEAR0001", "guide-near.md", changed)
    assert "same as" not in near and "Its text is nearly that of <" in near
    assert f"/d/{handbook.id}?" in near and f"/d/{copy.id}?" in near
    assert f"/d/{other.id}?" not in near


DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
# The sample handbook's expenses page, as bench/near_copies.py measures near-copies.
EXPENSES = (SAMPLE / "expenses.md").read_text()


async def test_a_word_file_whose_pdf_export_is_there_names_it_as_a_near_copy(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(publishers=USER_ID)
    pdf = bot.kb.ingest_bytes(as_pdf(EXPENSES), "expenses.pdf", title="Expenses (PDF)").document
    other = bot.kb.ingest_bytes((SAMPLE / "oncall.md").read_bytes(), "oncall.md").document
    status = await _share(bot, "F0DOCX0001", "expenses.docx", as_docx(EXPENSES), mimetype=DOCX)
    assert status.startswith(":white_check_mark: *expenses.docx*: indexed")
    assert "Its text is nearly that of <" in status and "|*Expenses (PDF)*>" in status
    assert f"/d/{pdf.id}/file?t=" in status and f"/d/{other.id}?" not in status
    # Not a copy passage for passage: the copies' sentence is not said.
    assert "same as" not in status


async def test_a_near_copy_in_a_channel_the_uploader_is_not_in_is_never_named(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(publishers=USER_ID)
    bot.slack.set_members("C0SECRET01", ["U0SOMEONE9"])
    bot.slack.set_members("C0TEAM0001", ["U0SOMEONE9", USER_ID])
    secret = bot.kb.ingest_bytes(as_pdf(EXPENSES), "x.pdf", scope="C0SECRET01", title="Secret")
    team = bot.kb.ingest_bytes(as_html(EXPENSES), "t.html", scope="C0TEAM0001", title="Team page")
    status = await _share(bot, "F0DOCX0002", "mine.docx", as_docx(EXPENSES), mimetype=DOCX)
    assert "|*Team page*>" in status and f"/d/{team.document.id}?" in status
    assert "Secret" not in status and f"/d/{secret.document.id}/" not in status
    # With only the secret near-copy left, nothing is said at all.
    bot.kb.remove(team.document.id)
    bot.kb.remove(bot.kb.store.find_document("mine.docx").id)
    alone = await _share(bot, "F0DOCX0003", "again.docx", as_docx(EXPENSES + "\n"), mimetype=DOCX)
    assert "nearly" not in alone and "Secret" not in alone


async def test_the_repeat_is_said_in_the_uploaders_language(make_bot: BotFactory) -> None:
    bot = await make_bot(publishers=USER_ID)
    bot.slack.set_user(USER_ID, locale="fr-FR")
    bot.kb.ingest_bytes(GUIDE, "handbook.md", title="Manuel")
    status = await _share(bot, "F0COPYFR01", "guide-fr.md", GUIDE_RESAVED, "\u00a0: indexé,")
    assert "Son texte est le même que celui de <" in status and "|*Manuel*>" in status


async def test_a_copy_in_a_channel_the_uploader_is_not_in_is_never_named(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(publishers=USER_ID)
    bot.slack.set_members("C0SECRET01", ["U0SOMEONE9"])
    bot.slack.set_members("C0TEAM0001", ["U0SOMEONE9", USER_ID])
    secret = bot.kb.ingest_bytes(GUIDE, "secret.md", scope="C0SECRET01", title="Secret plan")
    team = bot.kb.ingest_bytes(GUIDE, "team.md", scope="C0TEAM0001", title="Team guide")
    status = await _share(bot, "F0COPYSC01", "mine.md", GUIDE_RESAVED)
    # The uploader reads the DM alone: the team's copy is theirs to read, the secret one is not.
    assert "|*Team guide*>" in status and f"/d/{team.document.id}?" in status
    assert "Secret plan" not in status and f"/d/{secret.document.id}?" not in status
    assert all("Secret plan" not in s for s in bot.statuses())
    # With only the secret copy left, nothing is said at all.
    bot.kb.remove(team.document.id)
    bot.kb.remove(bot.kb.store.find_document("mine.md").id)
    alone = await _share(bot, "F0COPYSC02", "mine-again.md", GUIDE_RESAVED + b"\n")
    assert "same as" not in alone and "Secret plan" not in alone


async def test_a_status_in_a_channel_names_only_copies_everyone_there_may_read(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(publishers=USER_ID)
    bot.slack.set_members("C0TEAM0001", [USER_ID])
    team = bot.kb.ingest_bytes(GUIDE, "team.md", scope="C0TEAM0001", title="Team guide")
    handbook = bot.kb.ingest_bytes(GUIDE, "handbook.md", title="Staff handbook")
    f = bot.slack.add_file("F0CHANCOPY", "posted.md", GUIDE_RESAVED, "text/markdown")
    await _submit(bot, [f])  # in CHANNEL_ID, for everyone: its status is read there
    statuses = await bot.settle()
    assert all(c["channel"] == CHANNEL_ID for c in bot.slack.calls("chat.postMessage"))
    # The uploader may read the team's copy, but the channel's other people may not.
    assert f"/d/{handbook.document.id}?" in statuses[-1] and "|*Staff handbook*>" in statuses[-1]
    assert "Team guide" not in statuses[-1] and f"/d/{team.document.id}?" not in statuses[-1]


async def test_a_status_in_a_channel_shared_with_another_organisation_names_no_copy_of_everyone(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(publishers=USER_ID)
    bot.slack.ext_shared.add(CHANNEL_ID)
    bot.slack.set_members(CHANNEL_ID, [USER_ID, "U0PARTNER1"])
    handbook = bot.kb.ingest_bytes(GUIDE, "handbook.md", title="Staff handbook").document
    own = bot.kb.ingest_bytes(GUIDE, "ours.md", scope=CHANNEL_ID, title="Channel guide").document
    f = bot.slack.add_file("F0SHARED01", "posted.md", GUIDE_RESAVED, "text/markdown")
    await _submit(bot, [f])
    statuses = await bot.settle()
    # People of other organisations read it: only the channel's own copy is named.
    assert f"/d/{own.id}?" in statuses[-1] and "|*Channel guide*>" in statuses[-1]
    assert "Staff handbook" not in statuses[-1] and f"/d/{handbook.id}?" not in statuses[-1]
    assert bot.slack.calls("conversations.info")
