"""Attacks on the Slack surfaces of App Home, "Ask a person" and the saved calibration.

Each test is an attack an outsider (or a member reaching past their rights)
could make; each one failed before the fix it names.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt
from slack_sdk.web.async_client import AsyncWebClient

from bot.slack import messages
from bot.slack.approvals import Ticket
from bot.slack.blocks import (
    HOME_REFRESH_ACTION_ID,
    HOME_REINDEX_ACTION_ID,
    HOME_RETRY_ACTION_ID,
    AdminHome,
    Calibration,
    HandOff,
    MemberHome,
    Pages,
    home_view,
    render_hand_off,
    stream_markdown,
)
from bot.slack.blocks.home import clip
from bot.slack.config import SlackConfig
from bot.slack.people.directory import Directory
from bot.slack.people.roles import Roles
from bot.slack.words import words_for
from core.calibration import CalibrationRecord
from core.gaps import knowledge_gaps
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from index.models import DocState
from index.storage.store import Store

pytest.register_assert_rewrite("tests.conftest_bot", "tests.home_tab")

from tests.conftest import TEST_EMBEDDING_MODEL  # noqa: E402
from tests.conftest_bot import ADMIN_ID, Bot, BotFactory  # noqa: E402
from tests.home_tab import admin_bot, click_home, open_home  # noqa: E402
from tests.query_factory import log_question  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DEFAULT_BOT_TOKEN,
    DM_CHANNEL_ID,
    USER_ID,
    block_actions_body,
    button_action,
    slack_ts,
)

SECRET_ANSWER = "Project Falcon launches on 14 March at the Berlin office [1]."


def _text(view: dict[str, Any]) -> str:
    return json.dumps(view["blocks"], ensure_ascii=False)


def _chunk_of(bot: Bot, name: str) -> int:
    doc = bot.kb.store.find_document(name)
    return int(bot.kb.chunks(doc.id)[0]["id"])


# ---------------------------------------------------------------- channel scopes


async def test_answers_to_review_never_show_what_a_channels_documents_said(
    make_bot: BotFactory,
) -> None:
    """An admin need not be in the channel: a thumbs-down answer written from that
    channel's documents (or a related-passages reply naming them) is withheld, as the
    hand-off withholds it; an answer from documents for everyone is still shown."""
    bot = await admin_bot(make_bot)
    falcon = _chunk_of(bot, "falcon.md")
    where = {"channel": CHANNEL_ID, "thread_id": "1700000000.000100"}
    secret = log_question(
        bot.kb.store,
        "When does Project Falcon launch?",
        answer=SECRET_ANSWER,
        kept=[(falcon, 0.2)],
        cited=[falcon],
        **where,
    )
    related = log_question(
        bot.kb.store,
        "Falcon budget?",
        outcome="related",
        answer="Possibly related: falcon.md, Project Falcon > Launch",
        kept=[(falcon, 0.5)],
        **where,
    )
    public = log_question(bot.kb.store, "Why is the sky blue?", answer="Rayleigh scattering.")
    for qid in (secret, related, public):
        bot.kb.feedback.add(qid, -1, USER_ID)

    text = _text(await open_home(bot, ADMIN_ID))
    assert "When does Project Falcon launch?" in text, "the question itself is listed"
    assert "14 March" not in text and "Berlin" not in text
    assert "falcon.md" not in text
    assert "Rayleigh scattering." in text
    assert messages.HOME_ANSWER_WITHHELD in text


# ---------------------------------------------------------------- Slack Connect

OTHER_TEAM = "T0OTHERORG"
EXTERNAL_ADMIN = "U0EXTADMIN"


async def test_an_admin_of_another_organisation_is_no_admin_here(make_bot: BotFactory) -> None:
    """With Slack admins counting as admins, ``users.info`` of a partner's admin in a
    shared channel says ``is_admin`` for their own organisation: no admin section, no
    admin button, no ``/kb-reindex`` here."""
    bot = await admin_bot(make_bot, slack_admins_are_admins=True)
    bot.slack.set_user(EXTERNAL_ADMIN, is_admin=True, is_owner=True)["team_id"] = OTHER_TEAM
    bot.slack.set_user("U0OURADMIN", is_admin=True)
    qid = log_question(bot.kb.store, "Who may see this?", answer="Only admins.")
    bot.kb.feedback.add(qid, -1, USER_ID)

    assert messages.HOME_ADMIN_HEADER in _text(await open_home(bot, "U0OURADMIN"))
    text = _text(await open_home(bot, EXTERNAL_ADMIN))
    assert messages.HOME_ADMIN_HEADER not in text
    assert "Who may see this?" not in text
    before = {d.id: d.indexed_at for d in bot.kb.store.documents()}
    await click_home(bot, EXTERNAL_ADMIN, HOME_REINDEX_ACTION_ID, "reindex", team=OTHER_TEAM)
    await bot.idle()
    assert {d.id: d.indexed_at for d in bot.kb.store.documents()} == before
    assert messages.EXTERNAL_ASKER in _text(bot.slack.calls("views.publish")[-1]["view"])
    # Approvals and /kb-reindex ask the same question.
    client = AsyncWebClient(token=DEFAULT_BOT_TOKEN, base_url=bot.settings.slack_api_url)
    assert not await bot.services.roles.is_admin(client, EXTERNAL_ADMIN)
    assert await bot.services.roles.is_admin(client, "U0OURADMIN")


async def test_a_channels_failed_and_stale_documents_are_named_only_to_its_members(
    make_bot: BotFactory,
) -> None:
    """An admin need not be in a private channel: its failed and stale documents are
    listed (with who added them, and Retry), but their names and failure reasons, and
    a retry's outcome, only to an admin who is a member, as a gap's passage is."""
    bot = await admin_bot(make_bot)
    secret = b"# Layoffs 2027\n\nThe Berlin office closes in March.\n"
    doc = bot.kb.add_bytes(secret, "layoffs-2027.md", uploader=USER_ID, scope=CHANNEL_ID).document
    bot.kb.store.update_document(
        doc.id, state=DocState.FAILED.value, failure_reason="Indexing was interrupted: layoffs"
    )
    falcon = bot.kb.store.find_document("falcon.md")
    bot.kb.store.update_document(falcon.id, pipeline_version="chunker-old")
    bot.slack.set_members(CHANNEL_ID, [USER_ID])
    bot.services.access.members.ttl_seconds = 0.0  # membership asked on each view

    view = await open_home(bot, ADMIN_ID)
    text = _text(view)
    assert "layoffs" not in text.lower() and "falcon" not in text.lower()
    assert f"<#{CHANNEL_ID}>" in text and f"<@{USER_ID}>" in text
    assert any(b.get("accessory", {}).get("value") == str(doc.id) for b in view["blocks"])

    await click_home(bot, ADMIN_ID, HOME_RETRY_ACTION_ID, str(doc.id))
    await bot.idle()
    assert bot.kb.store.document(doc.id).state == DocState.INDEXED
    shown = json.dumps(bot.slack.calls("views.publish")[1:], ensure_ascii=False)
    told_admin = [c for c in bot.slack.calls("chat.postMessage") if c["channel"] == ADMIN_ID]
    assert "layoffs" not in shown.lower()
    assert "layoffs" not in json.dumps(told_admin).lower()

    bot.slack.set_members(CHANNEL_ID, [USER_ID, ADMIN_ID])
    text = _text(await open_home(bot, ADMIN_ID))
    assert "falcon.md" in text, "a member sees the names"


# ---------------------------------------------------------------- hostile text

CLOSING_BACKTICKS = [
    "see ` https://evil.example/login now",
    "a`b www.evil.example `c",
    "``` https://evil.example ```",
    "x` mailto:boss@evil.example",
]


def _texts(blocks: list[dict[str, Any]]) -> list[str]:
    return [str(b["text"]["text"]) for b in blocks if isinstance(b.get("text"), dict)]


def _outside_code(mrkdwn: str) -> str:
    """What Slack shows outside inline code: backticks pair from the left, within a line."""
    return "\n".join(re.sub(r"`[^`]*`", " ", line) for line in mrkdwn.split("\n"))


@pytest.mark.parametrize("text", CLOSING_BACKTICKS)
def test_a_persons_backticks_never_leave_a_link_outside_code(text: str) -> None:
    """A name, question or answer holding a backtick must not pair with the code an
    inert link is set in, which would leave the link itself outside code."""
    shown = [
        clip(text, 300),
        *_texts(
            render_hand_off(
                HandOff(
                    asker=USER_ID,
                    by=USER_ID,
                    channel=CHANNEL_ID,
                    question=text,
                    outcome="answered",
                    answer=text,
                ),
                words=words_for("en"),
            ).blocks
        ),
    ]
    for mrkdwn in shown:
        outside = _outside_code(mrkdwn)
        assert not re.search(r"https?:|www\.|mailto:|evil\.example", outside), mrkdwn


# ---------------------------------------------------------------- races


async def test_a_retry_racing_a_removal_says_the_document_is_gone(make_bot: BotFactory) -> None:
    """An admin clicks Retry while another indexing holds the turn; the document is
    removed before the retry's turn comes: the tab and the admin's DM say it is gone,
    not that it failed with an error message."""
    bot = await admin_bot(make_bot)
    doc = bot.kb.add_bytes(b"# Guide\n\nBadges at 09:30.\n", "guide.md", uploader=USER_ID).document
    bot.kb.store.update_document(doc.id, state=DocState.FAILED.value, failure_reason="x")
    await open_home(bot, ADMIN_ID)
    async with bot.services.uploader._turns.hold(USER_ID):  # another upload of theirs indexing
        await click_home(bot, ADMIN_ID, HOME_RETRY_ACTION_ID, str(doc.id))
        await bot.slack.wait_for("views.publish", 2)  # "Retrying…" shown
        bot.kb.remove(doc.id, actor="test")
    await bot.idle()
    last = _text(bot.slack.calls("views.publish")[-1]["view"])
    assert messages.RETRY_GONE in last
    assert "not found" not in last.lower()


# ---------------------------------------------------------------- malformed values

DEEP_JSON = "[" * 2900  # within Slack's 3000 characters of private_metadata


def test_deeply_nested_json_in_values_and_metadata_is_malformed_not_a_crash() -> None:
    assert Pages.from_metadata(DEEP_JSON) == Pages()
    assert Pages.from_metadata('{"failed":' * 900) == Pages()
    assert Ticket.decode(DEEP_JSON) is None


async def test_a_home_click_with_deeply_nested_metadata_still_shows_the_tab(
    make_bot: BotFactory,
) -> None:
    bot = await admin_bot(make_bot)
    view = {**(await open_home(bot, ADMIN_ID)), "id": "V0HOME0001", "private_metadata": DEEP_JSON}
    body = block_actions_body(
        [button_action(HOME_REFRESH_ACTION_ID, "refresh")], user_id=ADMIN_ID, view=view
    )
    assert (await bot.post(body)).status == 200
    calls = await bot.slack.wait_for("views.publish", 2)
    assert json.loads(calls[1]["view"]["private_metadata"]) == {}


async def test_a_signed_payload_nested_too_deep_is_refused_not_a_server_error(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot()
    body = ("payload=" + quote("[" * 5000)).encode()
    assert (await bot.post(body)).status == 400


# ---------------------------------------------------------------- knowledge gaps

SPAM = "Admins: the VPN is broken, DM me your password and I will fix it"
PARKING = "Where can I park my car at the office?"


def _ask(store: Store, question: str, user: str, at: float) -> None:
    qid = log_question(store, question, outcome="refused", model_called=False, user=user)
    with store.transaction() as db:
        db.execute("UPDATE query_log SET created_at = ? WHERE id = ?", [at, qid])


def test_one_persons_repeats_never_outrank_what_several_people_asked(
    index_dir: Path, embedder: Embedder
) -> None:
    """A member asking the same refused question over and over must not put their
    words at the top of the admins' list above a question several people asked."""
    kb = KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
    now = time.time()
    for i in range(8):
        _ask(kb.store, SPAM, "U0SPAMMER1", now - i)
    for i, user in enumerate(("U0ANA00001", "U0BEN00001", "U0CAT00001")):
        _ask(kb.store, PARKING, user, now - 100 - i)

    gaps = knowledge_gaps(kb, since=now - 86_400)
    assert [g.question for g in gaps] == [PARKING, SPAM]
    assert (gaps[0].count, gaps[0].people) == (3, 3)
    assert (gaps[1].count, gaps[1].people) == (8, 1)
    assert "Asked 8 times by 1 person" in messages.home_gap(SPAM, 8, "refused 8", "today", 1)


def test_one_person_cannot_crowd_everyone_else_out_of_the_window(index_dir: Path) -> None:
    """The gaps read the newest questions only: one person's flood of distinct refused
    questions must not push out what everyone else asked."""
    store = KnowledgeBase(
        IndexConfig(data_dir=index_dir, embedding_model=TEST_EMBEDDING_MODEL)
    ).store
    now = time.time()
    for i in range(30):
        _ask(store, f"junk question number {i}", "U0SPAMMER1", now - i)
    _ask(store, PARKING, "U0ANA00001", now - 1000)
    read = store.queries.by_outcome(("refused",), since=0, limit=20, per_user=10)
    assert sum(q.user == "U0SPAMMER1" for q in read) == 10
    assert PARKING in [q.question for q in read]


# ---------------------------------------------------------------- Slack unreachable


async def test_slack_unreachable_grants_nothing_and_breaks_nothing(
    unused_tcp_port: int,
) -> None:
    """A lookup that cannot reach Slack counts as "no", as a refusal does: nobody is an
    admin or a publisher because Slack could not be asked, and nothing raises."""
    client = AsyncWebClient(
        token=DEFAULT_BOT_TOKEN, base_url=f"http://127.0.0.1:{unused_tcp_port}/api/", timeout=2
    )
    directory = Directory()
    config = SlackConfig(
        bot_token=DEFAULT_BOT_TOKEN,
        workspace_admins_are_admins=True,
        publisher_ids=frozenset({"S0GROUP001"}),
    )
    roles = Roles(config, directory)
    assert await directory.user(client, "U0SOMEONE1") is None
    assert await directory.group_members(client, "S0GROUP001") is None
    assert not await roles.is_admin(client, "U0SOMEONE1")
    assert not await roles.is_publisher(client, "U0SOMEONE1")


async def test_what_slack_said_about_people_is_remembered_within_a_bound(
    make_bot: BotFactory,
) -> None:
    """Every person who opens the Home tab is looked up (are they a Slack admin?): a
    long-running process in a large workspace must not remember them all."""
    bot = await make_bot(slack_admins_are_admins=True)
    directory = bot.services.roles.directory
    directory.capacity = 5
    for n in range(12):
        await open_home(bot, f"U0PERSON{n:02d}")
    assert len(directory._users) <= 5
    assert len(bot.slack.calls("users.info")) >= 12


def test_a_time_out_of_range_in_a_saved_record_still_shows_the_tab() -> None:
    """A saved calibration (or a row) whose time no calendar holds must not take the
    admins' whole tab down with it."""
    record = CalibrationRecord(
        at=1e300,
        source="log queries.jsonl",
        max_bluff_rate=0.05,
        proposed_threshold=None,
        proposed_related=None,
        rows=(),
    )
    admin = AdminHome(
        failed=(),
        stale=(),
        reindex_running=False,
        gaps=(),
        gap_links={},
        disliked=(),
        disliked_total=0,
        calibration=Calibration(0.6, 0.6, record),
    )
    member = MemberHome(documents=0, chunks=0, channel_documents=0, uploads=())
    text = json.dumps(home_view(member, admin, words=words_for("en"))["blocks"])
    assert "queries.jsonl" in text


# ---------------------------------------------------------------- streamed Markdown

HOSTILE_PIECES = [
    "<!channel>", "<!here>", "@here", "@Channel", "<@U0EVIL0001>", "<#C0EVIL0001>",
    "<!subteam^S0EVIL0001>", "<https://evil.example|x>", "[click](https://evil.example)",
    "![i](https://evil.example/a.png)", "[r]: https://evil.example", "[a][r]", "[r]",
    "https://evil.example/x", "www.evil.example", "evil@example.com", "<mailto:x@y.z>",
    "`", "```", "&lt;", "&#60;", "&amp;", "\u200b", "\u202e", "[1]", " ", "\n", "\n\n",
    "**b**", "\\]", "\\[", "](", "[", "]", "(", ")", ":", "<", ">", "~~~", "    ",
    "<a href=x>", "<img src=x>", "[^1]", "#", "*", "_",
]  # fmt: skip
_ALLOWED_TAGS = re.compile(r"</?(?:p|code|pre|em|strong|br|h\d|ul|ol|li|blockquote|hr)\b[^>]*>")


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(HOSTILE_PIECES), min_size=1, max_size=12))
def test_streamed_markdown_renders_no_link_image_or_html(pieces: list[str]) -> None:
    """Whatever the model streams, read by a CommonMark renderer (Slack's streamed text is
    Markdown without ``verbatim``): no link, no image, no raw HTML, no broadcast outside
    code, and no Slack angle-bracket token."""
    streamed = stream_markdown("".join(pieces))
    html = MarkdownIt("commonmark").render(streamed)
    assert "<a " not in html and "<img" not in html
    assert not re.search(r"<", _ALLOWED_TAGS.sub("", html)), html
    assert "<" not in streamed and ">" not in streamed
    assert not re.search(r"@(?:here|channel|everyone)\b", streamed, re.IGNORECASE)


async def test_a_person_of_another_organisation_sees_no_titles_on_either_tab(
    make_bot: BotFactory,
) -> None:
    """Slack Connect: a partner's person opening the bot's Messages or Home tab gets
    neither suggested prompts (the titles and sections of the newest documents) nor the
    knowledge base's counts; they are told it answers its own workspace's members."""
    bot = await make_bot()
    bot.slack.set_user(EXTERNAL_ADMIN)["team_id"] = OTHER_TEAM
    base = {"user": EXTERNAL_ADMIN, "channel": DM_CHANNEL_ID, "event_ts": slack_ts()}
    await bot.event({"type": "app_home_opened", "tab": "messages", **base})
    view = await open_home(bot, EXTERNAL_ADMIN)
    await bot.idle()
    shown = json.dumps(
        [bot.slack.calls(m) for m in ("assistant.threads.setSuggestedPrompts", "chat.postMessage")]
    )
    assert not bot.slack.calls("assistant.threads.setSuggestedPrompts")
    for title in ("Employee handbook", "Security policy", "On-call guide", "Falcon"):
        assert title not in shown and title not in _text(view)
    assert "searchable documents" not in _text(view)
    assert messages.EXTERNAL_ASKER in _text(view)


async def test_a_home_button_clicked_by_a_person_of_another_organisation_shows_nothing(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot()
    await click_home(bot, EXTERNAL_ADMIN, HOME_REFRESH_ACTION_ID, "refresh", team=OTHER_TEAM)
    await click_home(bot, EXTERNAL_ADMIN, "kb_home_page_next", "uploads:1", team=OTHER_TEAM)
    await bot.idle()
    views = [c["view"] for c in bot.slack.calls("views.publish")]
    assert views, "they are told"
    for view in views:
        assert "searchable documents" not in _text(view)
        assert messages.EXTERNAL_ASKER in _text(view)


BIDI_CONTROLS = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"


def test_bidi_overrides_never_reach_slack() -> None:
    """A right-to-left override makes Slack show text other than what it is
    (``pay \\u202eexe.pdf`` reads as ``pay fdp.exe``): none survives into a hand-off,
    a streamed answer or the Home tab; right-to-left marks a language needs stay."""
    spoof = "Approve invoice \u202eexe.fdp\u202c now \u2067x\u2069 \u200f"
    rendered = render_hand_off(
        HandOff(
            asker=USER_ID,
            by=USER_ID,
            channel=CHANNEL_ID,
            question=spoof,
            outcome="answered",
            answer=spoof,
        ),
        words=words_for("en"),
    )
    for shown in (
        json.dumps(rendered.blocks),
        rendered.text,
        stream_markdown(spoof),
        clip(spoof, 200),
    ):
        decoded = json.loads(shown) if shown.startswith("[") else shown
        assert not any(c in json.dumps(decoded, ensure_ascii=False) for c in BIDI_CONTROLS)
    assert "\u200f" in stream_markdown(spoof)
