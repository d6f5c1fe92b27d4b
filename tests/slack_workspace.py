"""A mock Slack workspace of realistic threads, and Real-time Search over it as Slack documents it.

:class:`Workspace` holds channels (public, private, a group DM and two DMs),
their members and about thirty messages in threads; :meth:`Workspace.search`
answers ``assistant.search.context`` (docs.slack.dev/reference/methods/
assistant.search.context) the way Slack's reference describes it:

* with an ``action_token`` (issued for one person by :meth:`Workspace.action_token`),
  only messages in conversations that person can read: every public channel,
  and the private channels, group DMs and DMs they are a member of;
  an unknown token is ``invalid_action_token``;
* without one (a bot token alone), public channels only;
* ``channel_types`` (comma-separated, default ``public_channel``) narrows that;
* results ``{"results": {"messages": [{author_user_id, team_id, channel_id,
  message_ts, content, is_author_bot, permalink}]}, "response_metadata":
  {"next_cursor": ...}}``, at most ``limit`` (20 at most) a page;
* about 10 requests a minute per person ("10+ requests per minute", Slack's
  reference): past :data:`SEARCHES_PER_MINUTE` in a sliding minute, HTTP 429
  ``ratelimited`` with ``Retry-After``.

The ranking is a keyword match (the words of the query each message holds),
Slack's own order, which the bot does not rely on: it judges closeness itself.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from tests.servers import TEAM_ID, USER_ID

__all__ = [
    "ALICE",
    "ALICE_BOB",
    "BOB",
    "CAROL",
    "DAVE",
    "SEARCHES_PER_MINUTE",
    "Channel",
    "Message",
    "REORG_SECRET",
    "SALARY_SECRET",
    "Workspace",
    "company_workspace",
    "roots",
]

# docs.slack.dev/reference/methods/assistant.search.context, "Rate limiting": "For most
# teams, the limit is 10+ requests per minute"; SLACK.md: "~10 requests a minute per user".
SEARCHES_PER_MINUTE = 10
# The reference: at most 20 results a page.
MAX_LIMIT = 20

ALICE = USER_ID  # the tests' default asker
BOB = "U0BOB00001"
CAROL = "U0CAROL001"
DAVE = "U0DAVE0001"
EVERYONE = (ALICE, BOB, CAROL, DAVE)

_WORD = re.compile(r"[a-z0-9_]+(?:[-.][a-z0-9_]+)*")
_STOP = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "at",
        "be",
        "by",
        "can",
        "do",
        "does",
        "for",
        "from",
        "how",
        "i",
        "in",
        "is",
        "it",
        "me",
        "my",
        "of",
        "on",
        "or",
        "the",
        "there",
        "this",
        "to",
        "we",
        "what",
        "when",
        "where",
        "who",
        "why",
        "will",
        "with",
        "you",
        "your",
        "our",
        "any",
        "anyone",
        "get",
    ]
)


@dataclass(frozen=True)
class Channel:
    """A conversation: ``kind`` is Slack's channel type (public_channel, private_channel, mpim, im)."""

    id: str
    name: str
    kind: str
    members: frozenset[str]


@dataclass(frozen=True)
class Message:
    """A person's message; ``thread_ts`` set on a reply."""

    channel: str
    ts: str
    user: str
    text: str
    thread_ts: str | None = None

    def permalink(self) -> str:
        """The permalink Slack gives it (a reply's carries its thread)."""
        link = f"https://kbtest.slack.com/archives/{self.channel}/p{self.ts.replace('.', '')}"
        if self.thread_ts and self.thread_ts != self.ts:
            link += f"?thread_ts={self.thread_ts}&cid={self.channel}"
        return link


@dataclass
class Workspace:
    """Channels and messages, and who may search what (see the module docstring)."""

    channels: dict[str, Channel] = field(default_factory=dict)
    messages: list[Message] = field(default_factory=list)
    _tokens: dict[str, str] = field(default_factory=dict)
    _searches: dict[str, list[float]] = field(default_factory=dict)

    def action_token(self, user: str) -> str:
        """An ``action_token`` as a message event of ``user`` carries it."""
        token = f"{len(self._tokens) + 1}.{abs(hash(user)) % 10**6}.action{len(self._tokens)}"
        self._tokens[token] = user
        return token

    def thread(self, ts: str) -> list[Message]:
        """The messages of the thread rooted at ``ts``."""
        return [m for m in self.messages if m.ts == ts or m.thread_ts == ts]

    def visible_to(self, user: str | None) -> set[str]:
        """The conversations ``user`` may search (``None``: a bot token alone: public ones)."""
        return {
            c.id
            for c in self.channels.values()
            if c.kind == "public_channel" or (user is not None and user in c.members)
        }

    def search(self, params: dict[str, Any], now: float) -> tuple[dict[str, Any], int, float]:
        """Slack's answer to ``assistant.search.context``: ``(body, HTTP status, Retry-After)``."""
        token = params.get("action_token") or None
        user: str | None = None
        if token is not None:
            user = self._tokens.get(str(token))
            if user is None:
                return {"ok": False, "error": "invalid_action_token"}, 200, 0.0
        if not str(params.get("query") or "").strip():
            return {"ok": False, "error": "invalid_arguments"}, 200, 0.0
        retry_after = self._spend(user or "bot", now)
        if retry_after:
            return {"ok": False, "error": "ratelimited"}, 429, retry_after
        types = set(str(params.get("channel_types") or "public_channel").split(","))
        allowed = {c for c in self.visible_to(user) if self.channels[c].kind in types}
        ranked = self._ranked(str(params["query"]), allowed)
        start = _offset(params.get("cursor"))
        limit = min(int(params.get("limit") or MAX_LIMIT), MAX_LIMIT)
        page = ranked[start : start + limit]
        more = start + limit < len(ranked)
        body = {
            "ok": True,
            "results": {"messages": [_result(m) for m in page]},
            "response_metadata": {"next_cursor": _cursor(start + limit) if more else ""},
        }
        return body, 200, 0.0

    def _spend(self, who: str, now: float) -> float:
        """Count one search of ``who``; past the limit, the seconds until the next is allowed."""
        recent = [t for t in self._searches.get(who, []) if now - t < 60.0]
        if len(recent) >= SEARCHES_PER_MINUTE:
            self._searches[who] = recent
            return max(1.0, 60.0 - (now - recent[0]))
        self._searches[who] = [*recent, now]
        return 0.0

    def _ranked(self, query: str, allowed: set[str]) -> list[Message]:
        terms = _terms(query)
        scored = []
        for m in self.messages:
            if m.channel not in allowed:
                continue
            score = len(terms & _terms(m.text))
            if score:
                scored.append((-score, -float(m.ts), m))
        return [m for *_, m in sorted(scored, key=lambda s: (s[0], s[1]))]


def _terms(text: str) -> set[str]:
    words = {w.rstrip(".") for w in _WORD.findall(text.lower())}
    return {w[:-1] if w.endswith("s") and len(w) > 3 else w for w in words - _STOP}


def _result(m: Message) -> dict[str, Any]:
    return {
        "author_user_id": m.user,
        "team_id": TEAM_ID,
        "channel_id": m.channel,
        "message_ts": m.ts,
        "content": m.text,
        "is_author_bot": False,
        "permalink": m.permalink(),
    }


def _cursor(offset: int) -> str:
    return base64.b64encode(f"CURRENT_PAGE:{offset}".encode()).decode()


def _offset(cursor: Any) -> int:
    if not cursor:
        return 0
    try:
        return int(base64.b64decode(str(cursor)).decode().rpartition(":")[2])
    except ValueError:
        return 0


# --------------------------------------------------------------------------- the company

IT_HELP = "C0ITHELP01"
DEPLOYS = "C0DEPLOY01"
OFFICE = "C0OFFICE01"
PAYROLL = "G0PAYROL01"  # private: Carol and Dave
PLATFORM = "G0PLATFM01"  # private: Alice and Bob
OFFSITE = "G0MPIMABC1"  # a group DM: Alice, Bob and Carol
ALICE_BOB = "D0ALIBOB01"  # Alice's DM with Bob
BOB_CAROL = "D0BOBCAR01"  # Bob's DM with Carol: Alice is not in it

# A private message to Alice that must never reach anyone else.
REORG_SECRET = "Between us: the reorg announcement is next Thursday, keep the new team names quiet."
# Bob's and Carol's private messages: Alice can never search them.
SALARY_SECRET = (
    "My salary review moved to Wednesday; HR confirmed the 4% raise for the expense team."
)

_THREADS: list[tuple[str, list[tuple[str, str]]]] = [
    (
        IT_HELP,
        [
            (ALICE, "The printer on floor 3 keeps jamming, anyone know why?"),
            (
                DAVE,
                "The floor 3 printer takes paper in tray 2 only: the tray 1 roller is broken, "
                "facilities ticket FAC-311 is open.",
            ),
            (ALICE, "thanks!"),
        ],
    ),
    (
        IT_HELP,
        [
            (BOB, "How do I get access to the staging database?"),
            (
                DAVE,
                "Request the staging-db-readonly role in the access portal; the platform lead "
                "approves it, usually within a day.",
            ),
        ],
    ),
    (
        IT_HELP,
        [
            (CAROL, "What's the guest wifi password this week?"),
            (
                DAVE,
                "The guest Wi-Fi password rotates every Monday and is shown on the reception screen.",
            ),
        ],
    ),
    (
        IT_HELP,
        [
            (BOB, "The Zoom room calendar in Oslo stopped syncing"),
            (DAVE, "Re-link the room calendar in the Zoom admin console under Rooms > Calendar."),
        ],
    ),
    (
        DEPLOYS,
        [
            (BOB, "Is there a deploy freeze over the holidays?"),
            (
                ALICE,
                "Yes: no production deploys from 20 December to 3 January, except hotfixes the "
                "on-call lead approves.",
            ),
        ],
    ),
    (
        DEPLOYS,
        [
            (DAVE, "Staging deploy failing with ERR_MIGRATION_LOCK again"),
            (
                BOB,
                "Run `make unlock-migrations` on the staging bastion, then retry the pipeline: a "
                "cancelled job leaves the migration lock behind.",
            ),
            (DAVE, "that worked, thanks"),
        ],
    ),
    (
        DEPLOYS,
        [
            (ALICE, "What percentages does the canary rollout go through?"),
            (
                BOB,
                "Canary rollout: 5% for 30 minutes, then 50%, then 100% while the error rate "
                "stays under 0.1%.",
            ),
        ],
    ),
    (
        OFFICE,
        [
            (CAROL, "Did the bike storage room move?"),
            (DAVE, "The bike room moved to level -1 of the east garage; you need badge access."),
        ],
    ),
    (OFFICE, [(DAVE, "Team lunch on Friday is at Luigi's at 12:30, all welcome.")]),
    (
        OFFICE,
        [
            (BOB, "Where can visitors park?"),
            (
                CAROL,
                "Visitors park in the P2 lot; register their plates at reception 24 hours ahead.",
            ),
        ],
    ),
    (OFFICE, [(CAROL, "good morning everyone")]),
    (
        PAYROLL,
        [
            (CAROL, "The payroll cutoff this month is the 24th because of the holiday."),
            (DAVE, "Bonus payments go out with the January payroll."),
        ],
    ),
    (
        PLATFORM,
        [
            (BOB, "On-call handover happens on Mondays at 10:00 in the platform standup."),
            (ALICE, "And an unacknowledged page escalates to the secondary after 15 minutes."),
        ],
    ),
    (ALICE_BOB, [(BOB, REORG_SECRET), (ALICE, "Understood, I won't say a word.")]),
    (BOB_CAROL, [(CAROL, SALARY_SECRET), (BOB, "Congrats! Keep it between us.")]),
    (
        OFFSITE,
        [
            (CAROL, "The offsite is in Aarhus on 3-4 March; book your trains by Friday."),
            (BOB, "Booked."),
        ],
    ),
]


def company_workspace() -> Workspace:
    """A small company's Slack: five channels, a group DM and two DMs, sixteen threads, 33 messages."""
    ws = Workspace()
    for channel in (
        Channel(IT_HELP, "it-help", "public_channel", frozenset(EVERYONE)),
        Channel(DEPLOYS, "eng-deploys", "public_channel", frozenset(EVERYONE)),
        Channel(OFFICE, "office", "public_channel", frozenset(EVERYONE)),
        Channel(PAYROLL, "payroll", "private_channel", frozenset({CAROL, DAVE})),
        Channel(PLATFORM, "team-platform", "private_channel", frozenset({ALICE, BOB})),
        Channel(OFFSITE, "mpdm-alice--bob--carol", "mpim", frozenset({ALICE, BOB, CAROL})),
        Channel(ALICE_BOB, "alice-bob", "im", frozenset({ALICE, BOB})),
        Channel(BOB_CAROL, "bob-carol", "im", frozenset({BOB, CAROL})),
    ):
        ws.channels[channel.id] = channel
    ts = 1_764_000_000
    for channel, thread in _THREADS:
        root = f"{ts}.000100"
        for i, (user, text) in enumerate(thread):
            msg_ts = root if i == 0 else f"{ts + 60 * i}.000100"
            ws.messages.append(
                Message(channel, msg_ts, user, text, thread_ts=root if len(thread) > 1 else None)
            )
        ts += 3600
    return ws


def roots(ws: Workspace, texts: Iterable[str]) -> list[str]:
    """The ``ts`` of the thread roots holding each of ``texts``."""
    out = []
    for text in texts:
        m = next(m for m in ws.messages if text in m.text)
        out.append(m.thread_ts or m.ts)
    return out
