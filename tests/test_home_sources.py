"""A synced source that fails says so on the admins' Home tab: its reason and its last good sync.

The sources are real: Confluence through ``atlassian-python-api`` against the
local mock (``tests/confluence_server.py``), synced into the bot's own
knowledge base; the tab is published through the mock Slack Web API.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from babel.dates import format_date, format_time

from bot.slack import messages
from bot.slack.blocks import AdminHome, Calibration, MemberHome, home_view
from bot.slack.words import available_languages, words_for
from index.knowledge_base import KnowledgeBase
from index.sources import SourceSyncReport, sync_source
from index.sources.confluence import ConfluenceConnector, ConfluenceSettings
from index.storage import SourceRow
from tests.confluence_server import ACCOUNT, SPACE, MockConfluence, Page
from tests.servers import DEFAULT_CONFLUENCE_TOKEN, USER_ID

pytest.register_assert_rewrite("tests.conftest_bot", "tests.home_tab")

from tests.conftest_bot import ADMIN_ID, BotFactory  # noqa: E402
from tests.home_tab import admin_bot, open_home  # noqa: E402

HOSTILE = "<!channel> *look* <https://evil.example/x|click here> <@U0EVIL001> & `code`"


@pytest.fixture
def confluence() -> Iterator[MockConfluence]:
    mock = MockConfluence()
    mock.groups["confluence-users"] = ["alice@example.com"]
    mock.page(Page("101", "Office hours", "<h1>Office hours</h1><p>We open at eight.</p>"))
    with mock.serve():
        yield mock


def _sync(kb: KnowledgeBase, name: str, mock: MockConfluence) -> SourceSyncReport:
    if not any(r.name == name for r in kb.store.sources.all()):
        kb.store.sources.add(name, "confluence", {"url": mock.base, "space": SPACE})
    settings = ConfluenceSettings(mock.base, SPACE, ACCOUNT, ("confluence-users",))
    return sync_source(kb, name, ConfluenceConnector(settings, DEFAULT_CONFLUENCE_TOKEN))


def _text(blocks: list[dict[str, Any]]) -> str:
    return json.dumps(blocks, ensure_ascii=False)


def _sources_part(view: dict[str, Any]) -> str:
    """The blocks under the failing sources' header, up to the next header ("" without one)."""
    part: list[dict[str, Any]] = []
    inside = False
    for block in view["blocks"]:
        if block["type"] == "header":
            inside = block["text"]["text"] == messages.HOME_SOURCES_HEADER
        elif inside:
            part.append(block)
    return _text(part) if part else ""


def _at(seconds: float) -> str:
    """A moment as the admin reads it: English (``en-US``) in Slack's time zone for them."""
    moment = datetime.fromtimestamp(seconds, ZoneInfo("Europe/Berlin"))
    return (
        f"{format_date(moment, 'medium', locale='en')}, {format_time(moment, 'short', locale='en')}"
    )


async def test_each_failing_source_shows_its_reason_and_last_good_sync_to_admins_only(
    make_bot: BotFactory, confluence: MockConfluence
) -> None:
    bot = await admin_bot(make_bot)
    assert _sync(bot.kb, "wiki-fine", confluence).error is None
    assert _sync(bot.kb, "wiki-lapsed", confluence).error is None
    confluence.token = "expired"
    lapsed = _sync(bot.kb, "wiki-lapsed", confluence)
    never = _sync(bot.kb, "wiki-never", confluence)
    assert lapsed.error and never.error and "refused the credentials (HTTP 401)" in lapsed.error
    good_at = bot.kb.store.sources.get("wiki-lapsed").last_good_at
    assert good_at is not None and bot.kb.store.sources.get("wiki-never").last_good_at is None

    view = await open_home(bot, ADMIN_ID)
    part = _sources_part(view)
    assert messages.HOME_SOURCES_INTRO in part
    assert "*wiki-lapsed* (confluence)" in part and f"last good sync: {_at(good_at)}" in part
    assert "*wiki-never* (confluence) · last good sync: never" in part
    assert part.count("refused the credentials (HTTP 401)") == 2
    assert "wiki-fine" not in part, "a source whose last sync worked is not listed"
    text = _text(view["blocks"])
    assert text.index(messages.HOME_SOURCES_HEADER) < text.index(messages.HOME_FAILED_HEADER)

    member = _text((await open_home(bot, USER_ID))["blocks"])
    assert messages.HOME_SOURCES_HEADER not in member
    assert "wiki-lapsed" not in member and "refused the credentials" not in member

    # Fixed: the next good sync takes each off the tab; with none failing, nothing is shown.
    confluence.token = DEFAULT_CONFLUENCE_TOKEN
    assert _sync(bot.kb, "wiki-lapsed", confluence).error is None
    part = _sources_part(await open_home(bot, ADMIN_ID))
    assert "wiki-never" in part and "wiki-lapsed" not in part
    assert _sync(bot.kb, "wiki-never", confluence).error is None
    fixed = _text((await open_home(bot, ADMIN_ID))["blocks"])
    assert messages.HOME_SOURCES_HEADER not in fixed and messages.HOME_SOURCES_INTRO not in fixed
    assert messages.HOME_FAILED_HEADER in fixed, "the rest of the admins' sections are there"


async def test_a_failure_reason_with_mentions_and_links_is_shown_escaped(
    make_bot: BotFactory, confluence: MockConfluence
) -> None:
    bot = await admin_bot(make_bot)
    assert _sync(bot.kb, "wiki", confluence).error is None
    # The reason a source's API gave, as the sync records it.
    bot.kb.store.sources.record_run("wiki", HOSTILE)

    view = await open_home(bot, ADMIN_ID)
    part = _sources_part(view)
    for raw in ("<!channel>", "<@U0EVIL001>", "<https://evil.example", "& `"):
        assert raw not in _text(view["blocks"])
    assert "&lt;!channel&gt;" in part and "&lt;@U0EVIL001&gt;" in part and "&amp;" in part
    assert "evil.example" in part, "the reason is shown, only inert"
    assert bot.slack.calls("views.publish", include_rejected=True) == bot.slack.calls(
        "views.publish"
    ), "Slack accepted every view"


@pytest.mark.parametrize("language", sorted(available_languages()))
def test_a_failing_source_is_told_in_every_language(language: str) -> None:
    failing = SourceRow("wiki", "confluence", {}, 1.0, 2.0, None, "refused the credentials")
    admin = AdminHome([], [], False, None, {}, [], 0, Calibration(0.5, 0.5, None))
    words = words_for(language)
    member = MemberHome(4, 12, 0, [])
    quiet = _text(home_view(member, admin, words=words)["blocks"])
    assert words.HOME_SOURCES_HEADER not in quiet
    admin = AdminHome(
        [], [], False, None, {}, [], 0, Calibration(0.5, 0.5, None), failing_sources=[failing]
    )
    text = _text(home_view(member, admin, words=words)["blocks"])
    line = words.home_failing_source(
        "wiki", "confluence", "refused the credentials", words.HOME_NEVER
    )
    assert words.HOME_SOURCES_HEADER in text and words.HOME_SOURCES_INTRO in text
    assert json.dumps(line, ensure_ascii=False)[1:-1] in text, "as the view's JSON holds it"
    if language != "en":
        english = words_for("en")
        assert words.HOME_SOURCES_HEADER != english.HOME_SOURCES_HEADER
        assert line != english.home_failing_source(
            "wiki", "confluence", "refused the credentials", english.HOME_NEVER
        )
