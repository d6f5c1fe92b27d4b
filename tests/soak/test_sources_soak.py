"""Soak of synced sources: a changing Confluence synced round after round while people ask.

A mock Confluence (``tests/confluence_server.py``) holds two spaces, ``ENG``
(read by ``confluence-users``, named as the whole organisation: public) and
``SEC`` (read by group ``eng`` only), each synced as a source of its own into
the real bot (``tests/conftest_bot.py``: the app over HTTP, the mock Slack Web
API, the local model server). Every round changes the spaces the way people do:
pages added, edited, renamed (two pages swapping their titles: a rename loop),
deleted, moved between the public space and the restricted one, restricted to
named people or a group and unrestricted, people joining and leaving ``eng``.
Confluence answers some calls with 429 (``Retry-After``) or 5xx, now and then
will not show one page's restrictions for a round (nobody may read it then),
and now and then revokes the token midway through a sync (an admin sets it
again, and the sync runs again). The sources are then synced (``index.sources.sync_source``; retries wait on a
recorded clock, never a real one, and a run that gives up is run again once its
``Retry-After`` has passed on that clock), while four people ask questions at
the same time on three surfaces:

* Slack: a DM to the bot (``message.im``), answered through ``bot.access`` and
  the engine, the answer read from what the bot posted;
* MCP: ``search_knowledge_base`` (``bot.mcp.tools.Tools.search``) as the person;
* ``kb ask --as``: the scopes ``bot.cli.access.scopes_as`` gives, asked of the engine.

People: Alice (``eng``, at first), Bob (the organisation), Dave (``eng``)
and Carol, whose Slack email Confluence does not know (she reads only what is
public). Every page holds one fact: a code word and a value unique to its
version; a question names the code word, and a passage is recognised by the value.

After each round's sync, on every surface and for every person:

* **0 documents lost**: every page the mock has and the person may read (as
  Confluence's rules say: the space's permission, and a restriction's people
  within it) is found by its fact's question;
* **0 passages served after deletion or permission removal**: no value of a
  deleted page, of an edited page's older version, or of a page the person may
  no longer read is shown to them.

While a sync runs, a question may see a page as it was or as it will be, never
more: the permissions come first, so a value the round wrote is shown only to a
person the page admits after the round, and an older one only to a person it
admitted before or admits after.

A line per round and the totals are printed (``-s``); the long run keeps the
totals as the ``soak`` property of its JUnit XML report too.

A short run (a few rounds) is part of the suite. The long one is opt-in (the
``soak`` marker)::

    SOAK_SOURCE_ROUNDS=60 SOAK_SEED=3 python -m pytest -m soak tests/soak/test_sources_soak.py -s
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from bot.cli.access import scopes_as
from bot.mcp import Person as ToolCaller
from bot.mcp.tools import Tools
from core.answer import Asker
from index.sources import SourceSyncReport, sync_source
from index.sources.confluence import ConfluenceConnector, ConfluenceSettings
from tests.clocks import Waits
from tests.confluence_server import ACCOUNT, MockConfluence, Page, Space
from tests.conftest_bot import Bot, BotFactory
from tests.servers import DEFAULT_CONFLUENCE_TOKEN, message_im_event

ALICE, BOB, CAROL, DAVE = "U0ALICE001", "U0BOB00001", "U0CAROL001", "U0DAVE0001"
EMAILS = {
    ALICE: "alice@example.com",
    BOB: "bob@example.com",
    CAROL: "carol@elsewhere.example",  # Confluence knows nobody by it
    DAVE: "dave@example.com",
}
ORGANISATION = "confluence-users"
PUBLIC, RESTRICTED = "ENG", "SEC"
SOURCES = {PUBLIC: "wiki-eng", RESTRICTED: "wiki-sec"}
SHORT_ROUNDS = 3
SAMPLE = 0.3  # of the readable facts also asked on Slack or the command line after a sync
WORDS = ("amber", "basalt", "cobalt", "drift", "ember", "fjord", "garnet", "harbor", "indigo")
WORDS += ("juniper", "kestrel", "lagoon", "marble", "nectar", "onyx", "pewter", "quartz")
FIRST_MODIFIED = datetime(2026, 12, 1, 9, 0, tzinfo=UTC)
BUDGET_S = 20.0  # of recorded time per call: a Retry-After past it fails the run


# ---------------------------------------------------------------- the world, as Confluence says


@dataclass
class World:
    """The mock's pages, each with its fact, and every value any version ever held."""

    mock: MockConfluence
    rng: random.Random
    facts: dict[str, tuple[str, str]] = field(default_factory=dict)  # page -> (code, value)
    codes: dict[str, str] = field(default_factory=dict)  # page -> its code word, ever
    values: dict[str, str] = field(default_factory=dict)  # value -> page it was of
    now: datetime = FIRST_MODIFIED
    serial: int = 0
    changes: Counter[str] = field(default_factory=Counter)
    hidden: str | None = None  # a page whose restrictions Confluence will not show this round
    new: set[str] = field(default_factory=set)  # the values this round wrote
    was: set[str] = field(default_factory=set)  # the values the pages held before it

    def _value(self) -> str:
        self.serial += 1
        value = f"KX-{self.rng.randrange(10**6, 10**7)}{self.serial:03d}"
        self.new.add(value)
        return value

    def _body(self, title: str, code: str, value: str) -> str:
        return (
            f"<h1>{title}</h1><p>The {code} door code opens the {code} room; "
            f"the {code} door code is {value}.</p>"
        )

    def add(self, space: str) -> None:
        self.serial += 1
        page_id = str(1000 + self.serial)
        code = f"{self.rng.choice(WORDS)}{page_id}"
        value = self._value()
        title = f"Room {code}"
        self.facts[page_id] = (code, value)
        self.codes[page_id] = code
        self.values[value] = page_id
        self.mock.page(
            Page(page_id, title, self._body(title, code, value), space=space, modified=self.now)
        )
        self.changes["added"] += 1

    def edit(self, page_id: str) -> None:
        page = self.mock.pages[page_id]
        code, _ = self.facts[page_id]
        value = self._value()
        self.facts[page_id] = (code, value)
        self.values[value] = page_id
        page.body, page.version, page.modified = (
            self._body(page.title, code, value),
            page.version + 1,
            self.now,
        )
        self.changes["edited"] += 1

    def swap_titles(self, a: str, b: str) -> None:
        """A rename loop: A takes B's title and B takes A's, between two syncs."""
        pa, pb = self.mock.pages[a], self.mock.pages[b]
        pa.title, pb.title = pb.title, pa.title
        for page in (pa, pb):
            code, value = self.facts[page.id]
            page.body, page.version, page.modified = (
                self._body(page.title, code, value), page.version + 1, self.now,
            )  # fmt: skip
        self.changes["renamed"] += 2

    def delete(self, page_id: str) -> None:
        del self.mock.pages[page_id]
        del self.facts[page_id]
        self.changes["deleted"] += 1

    def move(self, page_id: str) -> None:
        page = self.mock.pages[page_id]
        # A move is no edit: the page keeps its last-modified date.
        page.space = RESTRICTED if page.space == PUBLIC else PUBLIC
        self.changes[f"moved to {page.space}"] += 1

    def restrict(self, page_id: str) -> None:
        """Restrict an open page to named people or a group, or lift its restriction."""
        page = self.mock.pages[page_id]
        if page.read_users or page.read_groups:
            page.read_users, page.read_groups = [], []
            self.changes["unrestricted"] += 1
        elif self.rng.random() < 0.5:
            page.read_users = self.rng.sample(sorted(EMAILS.values()), 2)
            self.changes["restricted to people"] += 1
        else:
            page.read_groups = ["eng"]
            self.changes["restricted to eng"] += 1

    def regroup(self) -> None:
        """Someone joins or leaves ``eng``."""
        person = self.rng.choice([EMAILS[ALICE], EMAILS[BOB]])
        eng = self.mock.groups["eng"]
        if person in eng:
            eng.remove(person)
            self.changes["left eng"] += 1
        else:
            eng.append(person)
            self.changes["joined eng"] += 1

    def change(self, round_no: int) -> None:
        """One round of what people do to the spaces."""
        # A day and more: each space's checkpoint moves past the poll's day of overlap, so
        # that a page moved with its old date is one no poll from a checkpoint finds.
        self.now += timedelta(hours=26)
        self.new, self.was = set(), {v for _, v in self.facts.values()}
        rng = self.rng
        oldest = min(self.mock.pages.values(), key=lambda p: (p.modified, p.id)).id
        self.move(oldest)
        for space in (PUBLIC, RESTRICTED, rng.choice([PUBLIC, RESTRICTED])):
            self.add(space)
        ids = sorted(set(self.mock.pages) - {oldest})
        rng.shuffle(ids)
        actions: list[Callable[[str], None]] = [self.edit, self.restrict, self.restrict]
        if len(ids) > 8:
            actions.append(self.delete)
        for action in actions:
            if ids:
                action(ids.pop())
        self.hidden = ids.pop() if ids and rng.random() < 0.3 else None
        if self.hidden is not None:
            self.changes["restrictions hidden for a round"] += 1
        if len(ids) >= 2 and round_no % 2 == 0:
            self.swap_titles(ids.pop(), ids.pop())
        if rng.random() < 0.5:
            self.regroup()

    def readers(self, page: Page) -> set[str] | None:
        """The emails Confluence lets read ``page``; ``None``: everyone in the organisation."""
        if page.id == self.hidden:
            return set()  # permissions not read: nobody reads it until they are
        space = self.mock.spaces[page.space]
        members = self.mock.groups
        public = space.anonymous or ORGANISATION in space.groups
        in_space = set(space.users).union(*(members.get(g, []) for g in space.groups))
        if not (page.read_users or page.read_groups):
            return None if public else in_space
        named = set(page.read_users).union(*(members.get(g, []) for g in page.read_groups))
        return named if public else named & in_space

    def readable(self) -> dict[str, set[str]]:
        """Each person's readable values now."""
        seen: dict[str, set[str]] = {user: set() for user in EMAILS}
        for page_id, page in self.mock.pages.items():
            readers = self.readers(page)
            for user, email in EMAILS.items():
                if readers is None or email in readers:
                    seen[user].add(self.facts[page_id][1])
        return seen

    def question(self, value: str) -> str:
        """The question whose answer is ``value`` (or was, for a page since deleted or edited)."""
        return f"What is the {self.codes[self.values[value]]} door code?"


# ---------------------------------------------------------------- the surfaces


class Surfaces:
    """Asking as a person on Slack (a DM), MCP (a tool call) and ``kb ask --as``."""

    def __init__(self, bot: Bot) -> None:
        self.bot = bot
        services = bot.services
        self.tools = Tools(services.engine, services.access)
        self.asked = 0

    async def slack(self, user: str, question: str) -> str:
        """Everything the bot posted in answer to a DM from ``user`` (one question at a
        time per person: each has a DM of their own)."""
        self.asked += 1
        channel = f"D0{user[2:]}"[:10]
        ts = f"{1_800_000_000 + self.asked}.000100"
        before = len(self.bot.slack.log)
        await self.bot.event(message_im_event(question, user=user, channel=channel, ts=ts))
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            posted = [
                p
                for m, p in self.bot.slack.log[before:]
                if m in {"chat.postMessage", "chat.update", "chat.postEphemeral"}
                and p.get("channel") == channel
            ]
            final = [p for p in posted if "kb_feedback" in json.dumps(p.get("blocks", []))]
            if final:
                return json.dumps(posted, ensure_ascii=False)
            await asyncio.sleep(0.02)
        raise AssertionError(f"no answer to {user}'s DM {question!r}")

    async def mcp(self, user: str, question: str) -> str:
        """The passages ``search_knowledge_base`` gives ``user``."""
        found = await self.tools.search(ToolCaller(user, None, "soak", None), question, 10)
        return json.dumps([p.quote for p in found.passages], ensure_ascii=False)

    async def cli(self, user: str, question: str) -> str:
        """What ``kb ask --as`` shows ``user``: the answer's sources, kept and beside."""
        services = self.bot.services
        scopes = await scopes_as(services.access, services.kb, user, ())
        answer = await services.engine.ask(
            question, scopes=scopes, asker=Asker(user=user, surface="cli")
        )
        return json.dumps(
            [s.quote for s in answer.sources + answer.kept + answer.beside], ensure_ascii=False
        )


SURFACES = ("slack", "mcp", "cli")


@dataclass
class Tally:
    """What the soak saw."""

    rounds: int = 0
    syncs: int = 0
    failed_syncs: list[str] = field(default_factory=list)
    waited_s: float = 0.0
    questions: Counter[str] = field(default_factory=Counter)
    lost: list[str] = field(default_factory=list)
    served_after: list[str] = field(default_factory=list)
    served_during: list[str] = field(default_factory=list)
    items_failed: list[str] = field(default_factory=list)
    asked_retired: set[str] = field(default_factory=set)

    def as_dict(self, world: World) -> dict[str, Any]:
        return {
            "rounds": self.rounds,
            "syncs": self.syncs,
            "failed_syncs_retried": len(self.failed_syncs),
            "token_revoked_midway": sum("refused the credentials" in f for f in self.failed_syncs),
            "recorded_wait_s": round(self.waited_s, 1),
            "pages_now": len(world.mock.pages),
            "changes": dict(world.changes),
            "questions": dict(self.questions),
            "documents_lost": len(self.lost),
            "served_after_removal": len(self.served_after),
            "served_during_sync_beyond_what_was_or_will_be": len(self.served_during),
            "items_failed": self.items_failed,
            "examples": {
                "lost": self.lost[:10],
                "served_after": self.served_after[:10],
                "served_during": self.served_during[:10],
                "failed_syncs": self.failed_syncs[:5],
            },
        }


def shown_values(text: str, world: World) -> set[str]:
    return {v for v in world.values if v in text}


# ---------------------------------------------------------------- syncing


def inject_faults(mock: MockConfluence, rng: random.Random) -> None:
    """Some of the next calls answered 429 with a Retry-After, 500 or 503."""
    paths = ("/rest/api/search", "/rest/api/content/", "/rest/api/space/", "/rest/api/group/")
    for _ in range(rng.randint(1, 3)):
        path = rng.choice(paths)
        kind = rng.random()
        if kind < 0.4:
            mock.fail(path, 429, retry_after=str(rng.choice([1, 5, 30])))
        else:
            mock.fail(path, rng.choice([500, 502, 503]), times=rng.randint(1, 2))


def sync_all(
    bot: Bot, world: World, waits: Waits, tally: Tally, rng: random.Random | None = None
) -> None:
    """Sync both spaces, each with faults from ``rng`` queued before its first run (now and
    then the token revoked midway); a run that gave up runs again once its Retry-After has
    passed, or once the token is set again."""
    mock = world.mock
    for space, name in SOURCES.items():
        mock.faults.clear()
        if world.hidden is not None:
            mock.fail(f"/rest/api/content/{world.hidden}/restriction", 403, times=10**6)
        if rng is not None:
            inject_faults(mock, rng)
            if mock.pages and rng.random() < 0.15:
                mock.revoke_at = f"/rest/api/content/{rng.choice(sorted(mock.pages))}"
        for _ in range(5):
            settings = ConfluenceSettings(mock.base, space, ACCOUNT, (ORGANISATION,))
            connector = ConfluenceConnector(
                settings, DEFAULT_CONFLUENCE_TOKEN, sleep=waits.sleep, budget_seconds=BUDGET_S
            )
            report: SourceSyncReport = sync_source(bot.kb, name, connector, clock=waits.clock)
            tally.syncs += 1
            tally.items_failed += [f"{name}/{i}: {r}" for i, r in report.failed]
            if report.ok:
                mock.revoke_at = None  # revoked at a page this run never asked for
                break
            tally.failed_syncs.append(f"{name}: {report.error}")
            if not mock.token:  # revoked midway: an admin sets a new one
                mock.token, mock.revoke_at = DEFAULT_CONFLUENCE_TOKEN, None
            waits.now += report.retry_after or 60.0
        else:
            raise AssertionError(f"{name} did not sync in 5 runs: {tally.failed_syncs[-5:]}")
    tally.waited_s = sum(waits.waits)


# ---------------------------------------------------------------- the soak


async def soak(bot: Bot, mock: MockConfluence, rounds: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)  # what changes and fails: the same every run of a seed
    asking = random.Random(-seed)  # who asks what on which surface (more while syncs are slow)
    world = World(mock, rng)
    waits = Waits()
    tally = Tally()
    surfaces = Surfaces(bot)
    for space in (PUBLIC, PUBLIC, PUBLIC, RESTRICTED, RESTRICTED):
        world.add(space)
    for space, name in SOURCES.items():
        bot.kb.store.sources.add(name, "confluence", {"url": mock.base, "space": space})
    await asyncio.to_thread(sync_all, bot, world, waits, tally)
    await check_after(surfaces, world, tally, asking)
    for round_no in range(1, rounds + 1):
        before = world.readable()
        world.change(round_no)
        after = world.readable()
        # The world's rng is the sync's alone while it runs: the same faults every run of a seed.
        syncing = asyncio.create_task(asyncio.to_thread(sync_all, bot, world, waits, tally, rng))
        while not syncing.done():
            await check_during(surfaces, world, tally, asking, before, after)
        await syncing
        mock.faults.clear()  # each sync queues its own
        await check_after(surfaces, world, tally, asking)
        tally.rounds += 1
        asked = sum(tally.questions.values())
        print(
            f"round {round_no}: {len(mock.pages)} pages, {tally.syncs} syncs, {asked} questions, "
            f"lost {len(tally.lost)}, served after removal {len(tally.served_after)}",
            flush=True,
        )
    return tally.as_dict(world)


async def check_during(
    surfaces: Surfaces,
    world: World,
    tally: Tally,
    rng: random.Random,
    before: dict[str, set[str]],
    after: dict[str, set[str]],
) -> None:
    """Three people at once while the sync runs, each shown only what they may see then.

    The sync takes the pages from how they were to how they are, in its order:
    permissions (a page's, and its groups' members) before content. So a value
    the round wrote is shown only to a person the page admits after the round;
    an older one, to a person it admitted before the round or admits after it
    (a reader of a page may read its earlier versions too).
    """
    pages = {user: {world.values[v] for v in before[user] | after[user]} for user in before}
    older = world.was  # the values the pages held before the round

    def allowed(user: str, value: str) -> bool:
        if value in world.new:
            return value in after[user]
        return value in older and world.values[value] in pages[user]

    async def one(user: str) -> None:
        values = sorted(before[user] | after[user])
        if not values:
            return
        value = rng.choice(values)
        surface = rng.choice(SURFACES)
        text = await getattr(surfaces, surface)(user, world.question(value))
        tally.questions[f"{surface} during sync"] += 1
        for shown in shown_values(text, world):
            if not allowed(user, shown):
                page = world.values[shown]
                tally.served_during.append(f"{surface}: {user} shown {shown} (page {page})")

    await asyncio.gather(*(one(u) for u in rng.sample(sorted(EMAILS), 3)))


async def check_after(surfaces: Surfaces, world: World, tally: Tally, rng: random.Random) -> None:
    """Every person, every fact: found where readable, never shown where not."""
    readable = world.readable()
    current = {v for _, v in world.facts.values()}
    for user in sorted(EMAILS):
        # Every readable fact on MCP, and a sample on Slack or the command line: a round
        # stays short, and over the rounds every surface is asked about every kind of page.
        for value in sorted(readable[user]):
            which = ["mcp"]
            if rng.random() < SAMPLE:
                which.append(rng.choice(["slack", "cli"]))
            for surface in which:
                text = await getattr(surfaces, surface)(user, world.question(value))
                tally.questions[surface] += 1
                shown = shown_values(text, world)
                if value not in shown:
                    page = world.values[value]
                    tally.lost.append(f"{surface}: {user} cannot find {value} (page {page})")
                for bad in shown - readable[user]:
                    why = "its page is gone or edited" if bad not in current else "not readable"
                    tally.served_after.append(f"{surface}: {user} shown {bad} ({why})")
    # Every value this round retired (a deleted page's, an edited page's older one), and
    # every fact a person may not read: asked by each person, on every surface.
    retired = set(world.values) - current - tally.asked_retired
    tally.asked_retired |= retired
    for user in sorted(EMAILS):
        for value in sorted(retired | (current - readable[user])):
            for surface in SURFACES if value in retired else (rng.choice(SURFACES),):
                text = await getattr(surfaces, surface)(user, world.question(value))
                tally.questions[surface] += 1
                for bad in shown_values(text, world) - readable[user]:
                    why = "its page is gone or edited" if bad not in current else "not readable"
                    tally.served_after.append(f"{surface}: {user} shown {bad} ({why})")


# ---------------------------------------------------------------- the tests


@pytest.fixture
def spaces() -> Iterator[MockConfluence]:
    mock = MockConfluence()
    mock.page_cap = 10
    mock.spaces = {
        PUBLIC: Space(PUBLIC, groups=[ORGANISATION]),
        RESTRICTED: Space(RESTRICTED, groups=["eng"]),
    }
    mock.groups = {
        ORGANISATION: [EMAILS[ALICE], EMAILS[BOB], EMAILS[DAVE]],
        "eng": [EMAILS[ALICE], EMAILS[DAVE]],
    }
    with mock.serve():
        yield mock


async def soaked(
    make_bot: BotFactory, spaces: MockConfluence, rounds: int, seed: int, record: Any
) -> dict[str, Any]:
    bot = await make_bot(documents=False, threshold=2.0, related_threshold=2.0)
    for user, email in EMAILS.items():
        profile = bot.slack.set_user(user, name=email.split("@")[0])
        profile["profile"]["email"] = email
    started = time.monotonic()
    report = await soak(bot, spaces, rounds, seed)
    await bot.idle()
    report["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(report, indent=2))
    if record is not None:
        record("soak", json.dumps(report))
    return report


def assert_clean(report: dict[str, Any]) -> None:
    examples = report["examples"]
    assert report["documents_lost"] == 0, examples["lost"]
    assert report["served_after_removal"] == 0, examples["served_after"]
    assert report["served_during_sync_beyond_what_was_or_will_be"] == 0, examples["served_during"]


async def test_a_changing_confluence_loses_nothing_and_shows_nothing_removed(
    make_bot: BotFactory, spaces: MockConfluence
) -> None:
    report = await soaked(make_bot, spaces, SHORT_ROUNDS, 1, None)
    assert report["rounds"] == SHORT_ROUNDS
    assert_clean(report)


@pytest.mark.soak
async def test_a_long_soak_of_a_changing_confluence(
    make_bot: BotFactory, spaces: MockConfluence, record_testsuite_property: Any
) -> None:
    rounds = int(os.environ.get("SOAK_SOURCE_ROUNDS", "40"))
    seed = int(os.environ.get("SOAK_SEED", "1"))
    report = await soaked(make_bot, spaces, rounds, seed, record_testsuite_property)
    assert report["rounds"] == rounds
    assert_clean(report)
