"""Who may read what is decided in one room (``bot.access``), the same on every surface.

The real bolt app receives signed events, the viewer serves signed-in readers,
``/mcp`` serves bearer tokens, all in one process over one mock Slack Web API
that records every ``conversations.members`` call: each surface's decision for
each (person, document) pair is the rule's ``may_read``, and a channel's members
are asked of Slack once for all of them. Then the rule itself, over the real
``SlackDirectory``: what unknown means, the cache's bound, Slack Connect.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

pytest.register_assert_rewrite("tests.conftest_bot", "tests.signin", "tests.home_tab")

from bot.access import (  # noqa: E402
    GUESTS_TTL_SECONDS,
    Access,
    AccessCheckUnavailable,
    Guests,
    Memberships,
    Person,
    Rule,
    SlackDirectory,
    Where,
    visible,
    web_client,
)
from bot.cli import main  # noqa: E402
from index.models import EVERYONE, OnlyScopes  # noqa: E402
from index.records import DocumentRow  # noqa: E402
from index.storage import Store  # noqa: E402
from index.storage.people_heard import PeopleHeard  # noqa: E402
from tests.adversarial.test_forged_feedback import _click, _feedback_value, _posted  # noqa: E402
from tests.clocks import FakeTime  # noqa: E402
from tests.conftest_bot import FALCON_Q, IN_DOMAIN, Bot, BotFactory  # noqa: E402
from tests.home_tab import open_home  # noqa: E402
from tests.servers import (  # noqa: E402
    CHANNEL_ID,
    DEFAULT_OPENAI_API_KEY,
    DM_CHANNEL_ID,
    TEAM_ID,
    MockSlackAPI,
    app_mention_event,
    event_body,
    message_im_event,
)
from tests.signin import SIGN_IN, link, sign_in  # noqa: E402
from tests.test_slack_agent import channel_context, home_opened_event  # noqa: E402
from tests.test_slack_unfurl import _link, details_event, link_shared_event  # noqa: E402

MEMBER = "U0MEMBER01"  # in CHANNEL_ID
OUTSIDER = "U0OUTSIDE1"  # of the workspace, not in CHANNEL_ID
ASKER = "U0ASKER001"  # in CHANNEL_ID: asks the channel question others mark
PEOPLE = (MEMBER, OUTSIDER)
OTHER_TEAM = "T0OTHER001"

Decisions = dict[tuple[str, str], bool]


def _docs(bot: Bot) -> dict[str, DocumentRow]:
    """The document for everyone and the channel's document every surface is asked about."""
    return {name: bot.kb.store.find_document(name) for name in ("handbook.md", "falcon.md")}


def _freeze_memberships(bot: Bot) -> None:
    """Stop the membership cache's clock: its minute cannot run out on a slow machine."""
    members = bot.services.access.members
    assert members is not None
    now = members.clock()
    members.clock = lambda: now


def _members_calls(bot: Bot) -> list[str]:
    return [str(c["channel"]) for c in bot.slack.calls("conversations.members")]


# ---------------------------------------------------------------- each surface, as Slack drives it


async def _viewer(bot: Bot, docs: dict[str, DocumentRow]) -> Decisions:
    """A signed-in reader opens each citation link: 200 or the 403 page."""
    seen = {}
    for person in PEOPLE:
        assert (await sign_in(bot, person)).status == 200
        for name, doc in docs.items():
            status = (await bot.http.get(link(bot, doc))).status
            assert status in (200, 403), status
            seen[person, name] = status == 200
    return seen


async def _mcp_search(bot: Bot, token: str, query: str) -> set[str]:
    headers = {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
    }
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "search_knowledge_base", "arguments": {"query": query, "limit": 20}},
    }
    resp = await bot.http.post("/mcp", data=json.dumps(call), headers=headers)
    assert resp.status == 200, await resp.text()
    result = (await resp.json())["result"]
    assert not result.get("isError"), result
    return {p["document"] for p in result["structuredContent"]["passages"]}


async def _mcp(bot: Bot, docs: dict[str, DocumentRow]) -> Decisions:
    """Each person's agent searches with a token of theirs: which documents it finds."""
    titles = {
        "handbook.md": ("Employee handbook", IN_DOMAIN),
        "falcon.md": ("Project Falcon", FALCON_Q),
    }
    seen = {}
    for person in PEOPLE:
        token, _ = bot.kb.store.mcp_tokens.issue(f"agent-{person}", user_id=person)
        for name in docs:
            title, query = titles[name]
            seen[person, name] = title in await _mcp_search(bot, token, query)
    return seen


async def _flexpane(bot: Bot, docs: dict[str, DocumentRow]) -> Decisions:
    """A link posted in CHANNEL_ID unfurls; each person opens its flexpane."""
    seen = {}
    for name, doc in docs.items():
        chunk = bot.kb.chunks(doc.id)[0]
        event = link_shared_event([_link(bot, doc, chunk)], user=MEMBER)
        bot.slack.share_links(event)
        assert (await bot.post(event_body(event))).status == 200
        await bot.idle()
        entity = bot.slack.calls("chat.unfurl")[-1]["metadata"]["entities"][0]
        for person in PEOPLE:
            before = len(bot.slack.calls("entity.presentDetails"))
            trigger = bot.slack.entity_trigger(entity["external_ref"]["id"])
            await bot.event(details_event(entity, trigger, user=person))
            await bot.idle()
            (call,) = bot.slack.calls("entity.presentDetails")[before:]
            seen[person, name] = "metadata" in call
    return seen


def _logged_scopes(bot: Bot, user: str) -> frozenset[str]:
    (row,) = bot.kb.store.db.query(
        'SELECT scopes FROM query_log WHERE "user" = ? ORDER BY id DESC LIMIT 1', [user]
    )
    return frozenset(json.loads(row["scopes"]))


async def _dm(bot: Bot, docs: dict[str, DocumentRow]) -> Decisions:
    """Each person asks in the DM while viewing CHANNEL_ID: the scopes their question searched."""
    seen = {}
    for n, person in enumerate(PEOPLE, start=1):
        event = message_im_event(FALCON_Q, user=person)
        event["app_context"] = channel_context(CHANNEL_ID)
        await bot.event(event)
        await bot.answer(n)
        searched = _logged_scopes(bot, person)
        for name, doc in docs.items():
            seen[person, name] = visible(searched, doc.scope)
    return seen


async def _prompts(bot: Bot, docs: dict[str, DocumentRow]) -> Decisions:
    """Each person opens the Messages tab viewing CHANNEL_ID: the documents it suggests."""
    titles = {"handbook.md": "Employee handbook", "falcon.md": "Project Falcon"}
    seen = {}
    for person in PEOPLE:
        before = len(bot.slack.calls("assistant.threads.setSuggestedPrompts"))
        await bot.event(home_opened_event(user=person, app_context=channel_context(CHANNEL_ID)))
        offers = await bot.slack.wait_for("assistant.threads.setSuggestedPrompts", count=before + 1)
        suggested = {p["title"] for p in offers[before]["prompts"]}
        for name in docs:
            seen[person, name] = titles[name] in suggested
    return seen


async def _home(bot: Bot, docs: dict[str, DocumentRow]) -> Decisions:
    """Both are admins; the documents turned stale: whose names each one's Home tab shows."""
    for doc in docs.values():
        bot.kb.store.update_document(doc.id, pipeline_version="chunker-old")
    seen = {}
    for person in PEOPLE:
        shown = json.dumps(await open_home(bot, person))
        for name in docs:
            seen[person, name] = name in shown
    return seen


async def _feedback(bot: Bot) -> dict[str, bool]:
    """ASKER's answer in CHANNEL_ID: whose thumbs on it are written."""
    await bot.event(app_mention_event(IN_DOMAIN, channel=CHANNEL_ID, user=ASKER))
    answer = await bot.answer(len(PEOPLE) + 1)
    message, value = _posted(bot, answer), _feedback_value(answer, "positive")
    for person in PEOPLE:
        await _click(
            bot, value, user=person, channel=CHANNEL_ID, message=message, response_id=person
        )
    marked = {r["user"] for r in bot.kb.store.db.query('SELECT "user" FROM feedback')}
    return {person: person in marked for person in PEOPLE}


async def test_every_surface_decides_as_may_read_and_asks_slack_once_per_channel(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(**SIGN_IN, mcp=True, admin_users=f"{MEMBER},{OUTSIDER}")
    bot.services.home.gaps.wait_seconds = 15.0
    bot.slack.set_members(CHANNEL_ID, [MEMBER, ASKER])
    _freeze_memberships(bot)
    docs = _docs(bot)

    surfaces: dict[str, Callable[[Bot, dict[str, DocumentRow]], Awaitable[Decisions]]] = {
        "viewer": _viewer,
        "mcp": _mcp,
        "work objects": _flexpane,
        "dm answers": _dm,
        "suggested prompts": _prompts,
        "home": _home,
    }
    decided = {}
    for name, surface in surfaces.items():
        decided[name] = await surface(bot, docs)
        # The first surface asked Slack; every later one found the answer remembered.
        assert _members_calls(bot) == [CHANNEL_ID], name
    thumbs = await _feedback(bot)
    assert _members_calls(bot) == [CHANNEL_ID]

    access = bot.services.access
    rule = {
        (person, name): (await access.may_read(Person(person), doc)).allowed
        for person in PEOPLE
        for name, doc in docs.items()
    }
    assert rule == {
        (MEMBER, "handbook.md"): True,
        (MEMBER, "falcon.md"): True,
        (OUTSIDER, "handbook.md"): True,
        (OUTSIDER, "falcon.md"): False,
    }
    assert {name: seen for name, seen in decided.items()} == {name: rule for name in surfaces}
    # A thumb on an answer posted in the channel: whoever may read the channel's documents.
    assert thumbs == {person: rule[person, "falcon.md"] for person in PEOPLE}
    assert _members_calls(bot) == [CHANNEL_ID], "the rule itself found it remembered too"


async def test_membership_is_asked_again_once_the_minute_is_over(make_bot: BotFactory) -> None:
    bot = await make_bot(**SIGN_IN)
    bot.slack.set_members(CHANNEL_ID, [MEMBER])
    members = bot.services.access.members
    assert members is not None
    now = [members.clock()]
    members.clock = lambda: now[0]
    falcon = _docs(bot)["falcon.md"]
    await sign_in(bot, MEMBER)
    assert (await bot.http.get(link(bot, falcon))).status == 200
    bot.slack.set_members(CHANNEL_ID, [ASKER])  # MEMBER leaves the channel
    now[0] += 59.9
    assert (await bot.http.get(link(bot, falcon))).status == 200
    assert (await bot.services.access.in_channel(Person(MEMBER), CHANNEL_ID)).member is True
    now[0] += 0.2
    assert (await bot.http.get(link(bot, falcon))).status == 403
    assert _members_calls(bot) == [CHANNEL_ID, CHANNEL_ID]


# ---------------------------------------------------------------- the rule over Slack itself


@pytest.fixture
async def directory(slack: MockSlackAPI) -> SlackDirectory:
    return SlackDirectory(web_client(slack.bot_token, slack.api_url))


async def test_a_channel_the_bot_cannot_see_has_no_members_and_a_failure_is_hidden(
    slack: MockSlackAPI, directory: SlackDirectory
) -> None:
    access = Access(directory, allow_external=False)
    person = Person(MEMBER)
    unseen = await access.in_channel(person, "C0PRIVATE1")  # channel_not_found
    assert (unseen.allowed, unseen.member, unseen.unknown) == (False, False, False)
    slack.set_members(CHANNEL_ID, [MEMBER])
    slack.fail("conversations.members", "internal_error", times=3)
    failed = await access.in_channel(person, CHANNEL_ID)
    assert (failed.allowed, failed.member, failed.unknown) == (False, None, True)
    assert "Unknown is hidden" in failed.reason
    assert await access.readable_channels(person, [CHANNEL_ID]) == frozenset()
    with pytest.raises(AccessCheckUnavailable):
        await access.readable_channels(person, [CHANNEL_ID], strict=True)
    # Not remembered: the next lookup asks again, and Slack answers now.
    slack.reset()
    assert (await access.may_read(person, CHANNEL_ID)).allowed
    assert len(slack.calls("conversations.members")) == 1


async def test_what_is_remembered_is_bounded_by_member_ids(
    slack: MockSlackAPI, directory: SlackDirectory
) -> None:
    members = Memberships(directory, capacity=100)
    for n in range(10):
        slack.set_members(f"C0CHAN{n:04d}", [f"U{n:02d}{i:07d}" for i in range(30)])
        await members.of(f"C0CHAN{n:04d}")
    assert members.remembered <= 100
    big = [f"U{i:09d}" for i in range(150)]
    slack.set_members("C0HUGE0001", big)
    assert await members.of("C0HUGE0001") == frozenset(big)  # larger than the cache: not kept
    assert await members.of("C0HUGE0001") == frozenset(big)
    asked = [c["channel"] for c in slack.calls("conversations.members")]
    assert asked.count("C0HUGE0001") == 2 and members.remembered <= 100


async def test_the_workspaces_guests_are_listed_once_a_while_and_a_failure_is_not_asked_again_at_once(
    slack: MockSlackAPI, directory: SlackDirectory
) -> None:
    time = FakeTime()
    guests = Guests(directory, clock=time.clock)
    access = Access(directory, allow_external=False, guests=guests)
    slack.set_user("U0GUEST001").update(is_restricted=True)
    slack.set_user("U0GUEST002", deleted=True).update(is_ultra_restricted=True)
    slack.set_members(CHANNEL_ID, [MEMBER, "U0GUEST001"])
    slack.set_members("C0STAFF001", [MEMBER, "U0GUEST002"])  # a deactivated guest reads nothing
    assert await guests.ids() == frozenset({"U0GUEST001"})
    there = await access.explain(Person(MEMBER), EVERYONE, Where(CHANNEL_ID))
    assert not there[-1].allowed and "guest" in there[-1].reason
    assert (await access.may_read(Person(MEMBER), EVERYONE, Where("C0STAFF001"))).allowed
    assert len(slack.calls("users.list")) == 1
    # Past its time the list is asked again; a failure is not remembered as "no guests"
    # and, for a minute, not asked again: every channel is taken as having one.
    time.now += GUESTS_TTL_SECONDS
    slack.fail("users.list", "ratelimited", times=1)
    assert (await access.may_read(Person(MEMBER), EVERYONE, Where("C0STAFF001"))).allowed
    await guests.settled()  # the last listing served while this one ran, and failed
    assert not (await access.may_read(Person(MEMBER), EVERYONE, Where("C0STAFF001"))).allowed
    assert not (await access.may_read(Person(MEMBER), EVERYONE, Where("C0STAFF001"))).allowed
    assert len(slack.calls("users.list", include_rejected=True)) == 2
    time.now += guests.retry_seconds
    assert (await access.may_read(Person(MEMBER), EVERYONE, Where("C0STAFF001"))).allowed
    assert len(slack.calls("users.list", include_rejected=True)) == 3


async def test_a_question_does_not_wait_for_a_slow_listing_of_the_guests(
    slack: MockSlackAPI, directory: SlackDirectory
) -> None:
    # A large workspace's pages, or a rate limit's Retry-After: the listing runs on, and the
    # question meanwhile is answered as where a guest reads.
    guests = Guests(directory, wait_seconds=0.5)
    slack.set_user("U0GUEST001").update(is_restricted=True)
    slack.stall("users.list", 3.0)
    with pytest.raises(AccessCheckUnavailable):
        await guests.ids()
    await slack.wait_for("users.list")
    assert await guests.ids() == frozenset({"U0GUEST001"})
    assert len(slack.calls("users.list")) == 1


async def test_a_question_does_not_wait_for_the_guests_listed_again(
    slack: MockSlackAPI, directory: SlackDirectory
) -> None:
    # The list is asked again every ten minutes: meanwhile the last listing serves, so a
    # large workspace's pages (minutes at Tier 2) add nothing to any question.
    time = FakeTime()
    guests = Guests(directory, clock=time.clock)
    slack.set_user("U0GUEST001").update(is_restricted=True)
    assert await guests.ids() == frozenset({"U0GUEST001"})
    time.now += GUESTS_TTL_SECONDS
    slack.set_user("U0GUEST002").update(is_restricted=True)
    slack.stall("users.list", 3.0)  # well within the five seconds a first listing is waited for

    assert await guests.ids() == frozenset({"U0GUEST001"})  # the last listing, not waited for

    await guests.settled()
    assert await guests.ids() == frozenset({"U0GUEST001", "U0GUEST002"})
    assert len(slack.calls("users.list")) == 2


async def test_who_is_served_people_of_other_organisations_and_the_deactivated(
    slack: MockSlackAPI, directory: SlackDirectory
) -> None:
    slack.set_members(CHANNEL_ID, [MEMBER, "U0PARTNER1"])
    partner = slack.set_user("U0PARTNER1")
    partner["team_id"] = partner["profile"]["team"] = OTHER_TEAM
    slack.set_user("U0LEFT0001", deleted=True)
    access = Access(directory, allow_external=False)
    assert (await access.served(Person(MEMBER))).allowed
    other = await access.may_read(Person("U0PARTNER1"), EVERYONE)
    assert (other.allowed, other.rule) == (False, Rule.ORGANISATION) and OTHER_TEAM in other.reason
    left = await access.served(Person("U0LEFT0001"))
    assert not left.allowed and "deactivated" in left.reason
    # A workspace Slack signed for needs no lookup; another one is not served.
    assert not (await access.served(Person(MEMBER, team_id=OTHER_TEAM))).allowed
    assert (await Access(directory, allow_external=True).served(Person("U0PARTNER1"))).allowed


async def test_a_place_shared_with_another_organisation_reads_only_its_own(
    slack: MockSlackAPI, directory: SlackDirectory
) -> None:
    slack.set_members(CHANNEL_ID, [MEMBER])
    access = Access(directory, allow_external=False)
    # In a channel its own documents need no lookup: everyone there reads the answer.
    here = await access.search_scopes(Person(OUTSIDER), Where(CHANNEL_ID), [CHANNEL_ID])
    assert here == frozenset({CHANNEL_ID}) and slack.calls("conversations.members") == []
    shared = Where(CHANNEL_ID, shared=True)
    assert await access.search_scopes(Person(MEMBER), shared) == OnlyScopes({CHANNEL_ID})
    assert isinstance(await access.search_scopes(Person(MEMBER), shared), OnlyScopes)
    assert not (await access.may_read(Person(MEMBER), EVERYONE, shared)).allowed
    assert (await access.may_read(Person(MEMBER), CHANNEL_ID, shared)).allowed
    allowed = Access(directory, allow_external=True)
    assert await allowed.search_scopes(Person(MEMBER), shared) == frozenset({CHANNEL_ID})
    assert not isinstance(await allowed.search_scopes(Person(MEMBER), shared), OnlyScopes)


async def test_without_a_directory_only_the_documents_for_everyone_are_read() -> None:
    access = Access(None, allow_external=False)
    named = Person(MEMBER)  # a token's person, or kb ask --as: named by an admin
    assert (await access.may_read(named, EVERYONE)).allowed
    hidden = await access.may_read(named, CHANNEL_ID)
    assert (hidden.allowed, hidden.unknown) == (False, True) and "SLACK_BOT_TOKEN" in hidden.reason
    assert await access.search_scopes(named, None, [CHANNEL_ID], strict=True) == frozenset()
    signed = await access.served(Person(MEMBER, team_id=TEAM_ID))  # says its workspace
    assert not signed.allowed and signed.unknown


def test_the_place_is_decided_by_the_same_rule_as_the_search() -> None:
    for where in (Where(CHANNEL_ID), Where(DM_CHANNEL_ID), Where(None), Where(CHANNEL_ID, True)):
        for allow in (False, True):
            access = Access(None, allow_external=allow)
            scopes = access.shown_at(where)
            for scope in (EVERYONE, CHANNEL_ID, "C0ELSEWHERE"):
                assert visible(scopes, scope) == (
                    (scope == EVERYONE and not (where.shared and not allow))
                    or scope == where.channel
                ), (where, allow, scope)
    assert visible(None, CHANNEL_ID) and visible(frozenset(), EVERYONE)
    assert not visible(OnlyScopes(), EVERYONE)


# ---------------------------------------------------------------- the command line


def _kb(bot: Bot, *args: str) -> Any:
    """``kb --data-dir <the bot's> *args`` in process (in a thread: Slack answers from this loop)."""
    return CliRunner().invoke(main, ["--data-dir", str(bot.settings.data_dir), *args])


async def _explain(bot: Bot, user: str, doc: str, *extra: str) -> dict[str, Any]:
    result = await asyncio.to_thread(
        _kb, bot, "access", "explain", "--user", user, doc, *extra, "--json"
    )
    assert result.exit_code == 0, result.output
    data: dict[str, Any] = json.loads(result.stdout)
    return data


async def test_kb_access_explain_says_whether_and_why(
    bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLACK_BOT_TOKEN", bot.slack.bot_token)
    monkeypatch.setenv("SLACK_API_URL", bot.slack.api_url)
    bot.slack.set_members(CHANNEL_ID, [MEMBER])
    partner = bot.slack.set_user("U0PARTNER1")
    partner["team_id"] = partner["profile"]["team"] = OTHER_TEAM

    member = await _explain(bot, MEMBER, "falcon.md")
    assert member["may_read"] is True and member["member"] is True
    assert (member["rule"], member["channel"], member["unknown"]) == ("channel", CHANNEL_ID, False)
    assert member["document"]["name"] == "falcon.md" and member["searchable"] is True
    assert [c["rule"] for c in member["checks"]] == ["organisation", "channel"]
    assert f"Slack lists {MEMBER} among its members now" in member["reason"]

    outsider = await _explain(bot, OUTSIDER, "falcon.md")
    assert (outsider["may_read"], outsider["member"]) == (False, False)
    assert f"Slack does not list {OUTSIDER}" in outsider["reason"]
    everyone = await _explain(bot, OUTSIDER, "handbook.md")
    assert (everyone["may_read"], everyone["rule"]) == (True, "everyone")
    other = await _explain(bot, "U0PARTNER1", "handbook.md")
    assert (other["may_read"], other["rule"]) == (False, "organisation")
    assert OTHER_TEAM in other["reason"] and "KB_ALLOW_EXTERNAL" in other["reason"]
    elsewhere = await _explain(bot, MEMBER, "falcon.md", "--in", "C0ELSEWHERE")
    assert (elsewhere["may_read"], elsewhere["rule"]) == (False, "place")
    shared = await _explain(bot, MEMBER, "handbook.md", "--in", CHANNEL_ID, "--shared")
    assert (shared["may_read"], shared["rule"]) == (False, "place")
    assert "shared with another organisation" in shared["reason"]

    bot.slack.fail("conversations.members", "missing_scope", times=1)
    unknown = await _explain(bot, MEMBER, "falcon.md")
    assert (unknown["may_read"], unknown["unknown"], unknown["member"]) == (False, True, None)
    assert "missing_scope" in unknown["reason"] and "Unknown is hidden" in unknown["reason"]

    shown = await asyncio.to_thread(_kb, bot, "access", "explain", "--user", OUTSIDER, "falcon.md")
    assert shown.exit_code == 0, shown.output
    lines = shown.stdout.splitlines()
    assert lines[0] == f"{OUTSIDER} may not read document {member['document']['id']} (falcon.md)."
    assert lines[-1].split()[:2] == ["no", "channel"]

    monkeypatch.delenv("SLACK_BOT_TOKEN")
    blind = await _explain(bot, MEMBER, "falcon.md")
    assert (blind["may_read"], blind["unknown"]) == (False, True)
    assert "SLACK_BOT_TOKEN" in blind["reason"]
    missing = await asyncio.to_thread(_kb, bot, "access", "explain", "--user", MEMBER, "nope.md")
    assert missing.exit_code == 1 and "Error:" in missing.output


async def test_kb_ask_as_a_person_reads_what_they_may(
    bot: Bot, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", bot.llm.url)
    monkeypatch.setenv("OPENAI_API_KEY", DEFAULT_OPENAI_API_KEY)
    monkeypatch.setenv("SLACK_API_URL", bot.slack.api_url)
    monkeypatch.setenv("KB_THRESHOLD", str(bot.settings.threshold))
    bot.slack.set_members(CHANNEL_ID, [MEMBER])
    partner = bot.slack.set_user("U0PARTNER1")
    partner["team_id"] = partner["profile"]["team"] = OTHER_TEAM

    def ask(user: str) -> Any:
        return _kb(bot, "ask", FALCON_Q, "--as", user, "--json")

    blind = await asyncio.to_thread(ask, MEMBER)
    assert blind.exit_code == 0, blind.output
    assert "SLACK_BOT_TOKEN is not set" in blind.stderr
    assert "14 March" not in blind.stdout

    monkeypatch.setenv("SLACK_BOT_TOKEN", bot.slack.bot_token)
    member = await asyncio.to_thread(ask, MEMBER)
    assert member.exit_code == 0, member.output
    assert "Project Falcon" in {s["document"] for s in json.loads(member.stdout)["sources"]}
    assert "14 March" in member.stdout
    outsider = await asyncio.to_thread(ask, OUTSIDER)
    assert outsider.exit_code == 0, outsider.output
    assert "14 March" not in outsider.stdout
    refused = await asyncio.to_thread(ask, "U0PARTNER1")
    assert refused.exit_code == 1 and "another organisation" in refused.output
    logged = list(bot.kb.store.db.query('SELECT "user", surface, scopes FROM query_log'))
    assert [(r["user"], r["surface"], json.loads(r["scopes"])) for r in logged] == [
        (MEMBER, "cli", []),
        (MEMBER, "cli", [CHANNEL_ID]),
        (OUTSIDER, "cli", []),
    ]


# ------------------------------------------------------------------ one cache of users.info

NEWCOMER = "U0NEWCOME1"


@pytest.mark.parametrize("where", ["dm", "channel"])
async def test_a_question_from_a_new_person_asks_users_info_once(bot: Bot, where: str) -> None:
    # Who they are (the access rule: guest, workspace, email) and how they are spoken to
    # (the words' locale, the audience) are one users.info answer, remembered once.
    bot.slack.set_user(NEWCOMER, locale="fr-FR")
    bot.slack.set_members(CHANNEL_ID, [NEWCOMER])
    if where == "dm":
        await bot.event(message_im_event(IN_DOMAIN, user=NEWCOMER))
    else:
        await bot.event(app_mention_event(IN_DOMAIN, user=NEWCOMER))
    answer = await bot.answer()
    assert "Employee handbook" in json.dumps(answer["blocks"])
    asked = bot.slack.calls("users.info")
    assert [c["user"] for c in asked] == [NEWCOMER]
    # The bot's own words come from the locale that one answer gave: French.
    assert '"Utile"' in json.dumps(answer["blocks"])


async def test_a_guest_heard_of_while_the_guests_are_listed_is_not_lost_to_that_listing(
    slack: MockSlackAPI, directory: SlackDirectory
) -> None:
    # Invited (team_join) or made a guest (user_change) after users.list read their page:
    # the listing that ends after the event must not put it out of date for a whole TTL.
    guests = Guests(directory, wait_seconds=0.2)
    slack.set_members(CHANNEL_ID, [MEMBER, "U0GUEST009"])
    slack.stall("users.list", 1.0)
    with pytest.raises(AccessCheckUnavailable):
        await guests.ids()  # the first listing runs on
    guests.heard({"id": "U0GUEST009", "is_restricted": True})
    guests.wait_seconds = 30.0
    assert await guests.ids() == frozenset({"U0GUEST009"})
    access = Access(directory, allow_external=False, guests=guests)
    assert not (await access.may_read(Person(MEMBER), EVERYONE, Where(CHANNEL_ID))).allowed


async def test_a_channel_forgotten_while_its_members_are_asked_is_not_remembered_as_before(
    slack: MockSlackAPI, directory: SlackDirectory
) -> None:
    # member_joined_channel while conversations.members is on its way: the answer may
    # predate the join, so it serves the question that asked but is not remembered.
    members = Memberships(directory)
    slack.set_members(CHANNEL_ID, [MEMBER])
    slack.stall("conversations.members", 0.5)
    asking = asyncio.create_task(members.of(CHANNEL_ID))
    await slack.wait_for("conversations.members")
    members.forget(CHANNEL_ID)  # a guest joined meanwhile
    slack.set_members(CHANNEL_ID, [MEMBER, "U0GUEST009"])
    assert await asking == frozenset({MEMBER})
    assert await members.of(CHANNEL_ID) == frozenset({MEMBER, "U0GUEST009"})


async def test_the_channels_a_person_reads_cost_one_look_at_what_other_replicas_heard(
    slack: MockSlackAPI, directory: SlackDirectory, tmp_path: Path
) -> None:
    """Every channel holding documents is checked for each question: what the other replicas
    heard (people_heard) is read once for all of them, not once a channel."""
    reads = 0

    def clock() -> float:  # each look at what was heard reads the time
        nonlocal reads
        reads += 1
        return time.time()

    store = Store(tmp_path)
    channels = [f"C0CHAN{n:04d}" for n in range(50)]
    for channel in channels[::2]:
        slack.set_members(channel, [MEMBER])
    looks = []
    for some in (channels[:1], channels):
        reads = 0
        access = Access(directory, allow_external=False, heard=PeopleHeard(store.database, clock))
        readable = await access.readable_channels(Person(MEMBER), some)
        assert readable == frozenset(some[::2])
        looks.append(reads)
    assert looks[0] > 0
    assert looks[1] == looks[0]  # was 50 times as many


async def test_a_replica_that_looked_before_the_store_let_go_of_its_news_lists_the_guests_again(
    slack: MockSlackAPI, directory: SlackDirectory, tmp_path: Path
) -> None:
    """What the replicas heard is kept an hour (people_heard): a replica that last looked
    longer ago may have missed a member made a guest, so its old listing of the guests
    (past its ten minutes, served while the next one runs) is not used; it waits for the
    next one (was: one answer in the channel from the listing of hours before)."""
    time = FakeTime()
    store = Store(tmp_path)
    guests = Guests(directory, clock=time.clock)
    quiet = Access(
        directory,
        allow_external=False,
        guests=guests,
        heard=PeopleHeard(store.database, time.clock),
    )
    other = Access(directory, allow_external=False, heard=PeopleHeard(store.database, time.clock))
    slack.set_members(CHANNEL_ID, [MEMBER, OUTSIDER])
    assert not await quiet.guests_at(Where(CHANNEL_ID))  # no guest there: listed
    # Two hours later, through the other replica: the outsider was made a guest, and
    # an hour after that the store let go of it while writing other news.
    time.now += 7200
    made_guest = slack.set_user(OUTSIDER)
    made_guest.update(is_restricted=True)
    await other.person_changed(made_guest)
    time.now += 3601
    await other.channel_changed("C0ELSEWHER")
    assert await quiet.guests_at(Where(CHANNEL_ID))
