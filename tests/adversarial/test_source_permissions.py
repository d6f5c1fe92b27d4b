"""What a source's permissions mean in a real tenant: each read as the source documents it.

The attacker is a person of the organisation with a Slack account and a
verified email, who reads through the product what their source would not
show them: a document shared with a group of the same name in another
source, a file shared with the domain only to those holding its link, a
permission of a role the source added since, a sharing that has expired, a
group named like the one standing for everyone. Each source is its local
mock (``tests/*_server.py``), synced by its real connector into a real
knowledge base, and the access rule is the real one, with Slack (the mock
Web API) as the directory of people, asked through ``kb access explain`` and
the scopes every search is filtered by. Each attack here worked before its fix.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.access import Person
from index.knowledge_base import KnowledgeBase
from index.sources import source_scope
from index.sources.confluence import ConfluenceConnector, ConfluenceSettings
from tests import sources_harness
from tests.clocks import Waits
from tests.confluence_server import ACCOUNT, SPACE, MockConfluence, Page, Space
from tests.servers import DEFAULT_CONFLUENCE_TOKEN, MockSlackAPI
from tests.sources_harness import ALICE, BOB, SECRET, access_over, kb_cli, sync

kb, slack = sources_harness.kb, sources_harness.slack


# ------------------------------------------------------------------ groups of two sources


@pytest.fixture
def two_sites() -> Iterator[tuple[MockConfluence, MockConfluence]]:
    """Two Confluence sites, each with a group ``developers`` of its own people: alice on
    the first, bob on the second. Each site's space is read by its ``developers``."""
    first, second = MockConfluence(), MockConfluence()
    for mock, member, title, text in (
        (first, "alice@example.com", "Nightjar", SECRET),
        (second, "bob@example.com", "Lobby", "The lobby is on the ground floor."),
    ):
        mock.spaces[SPACE] = Space(SPACE, groups=["developers"])
        mock.groups["developers"] = [member]
        mock.page(Page(title.lower(), title, f"<h1>{title}</h1><p>{text}</p>"))
    with first.serve(), second.serve():
        yield first, second


def _sync_site(kb: KnowledgeBase, name: str, mock: MockConfluence) -> None:
    settings = ConfluenceSettings(mock.base, SPACE, ACCOUNT, ())
    connector = ConfluenceConnector(settings, DEFAULT_CONFLUENCE_TOKEN, sleep=Waits().sleep)
    report = sync(kb, name, "confluence", {"url": mock.base, "space": SPACE}, connector)
    assert report.error is None and report.added


async def test_a_group_of_another_source_with_the_same_name_admits_nobody(
    kb: KnowledgeBase,
    index_dir: Path,
    two_sites: tuple[MockConfluence, MockConfluence],
    slack: MockSlackAPI,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Bob is in the second site's developers, never the first's: the first site's page,
    # read by its own developers, is not his to open (the viewer asks the same rule).
    first, second = two_sites
    _sync_site(kb, "wiki-one", first)
    _sync_site(kb, "wiki-two", second)
    monkeypatch.setenv("SLACK_BOT_TOKEN", slack.bot_token)
    monkeypatch.setenv("SLACK_API_URL", slack.api_url)

    def explain(user: str, name: str) -> dict[str, object]:
        result = kb_cli(index_dir, "access", "explain", "--user", user, name, "--json")
        assert result.exit_code == 0, result.output
        decision: dict[str, object] = json.loads(result.stdout)
        return decision

    bob = await asyncio.to_thread(explain, BOB, "Nightjar.html")
    assert (bob["may_read"], bob["rule"]) == (False, "source")
    assert "developers" not in str(bob["reason"])
    alice = await asyncio.to_thread(explain, ALICE, "Nightjar.html")
    assert alice["may_read"] is True and "developers" in str(alice["reason"])
    lobby = await asyncio.to_thread(explain, BOB, "Lobby.html")
    assert lobby["may_read"] is True
    # A search was always filtered by the source's own groups: it stays so.
    access = access_over(slack, kb)
    assert source_scope("wiki-one", "nightjar") not in await access.search_scopes(Person(BOB))
    assert source_scope("wiki-one", "nightjar") in await access.search_scopes(Person(ALICE))
