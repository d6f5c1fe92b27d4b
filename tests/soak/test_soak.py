"""Soak: minutes of mixed traffic against the real bot, with faults injected (opt-in).

Deselected by default (the ``soak`` marker: ``pyproject.toml`` adds
``-m "not soak"``); run it with::

    python -m pytest -m soak tests/soak -s

The real server (``python -m bot.cli serve``) runs as a child process on a
loopback port, pointed at the suite's mock Slack Web API and local
OpenAI-compatible model server (``tests/servers.py``), which live in the test's
process. Its environment is the test's own, already cleared of the developer's
``KB_``/``SLACK_``/``OPENAI_`` settings by ``tests/conftest.py``, with the suite's
canary secrets; the sample handbook is indexed first with the session's
``embedder``. For ``SOAK_MINUTES`` (3 by default) this sends, at a modest rate
for a 2-core machine:

* questions: signed ``app_mention`` and DM ``message`` events over HTTP, about
  the sample handbook, about nothing in it, and about documents uploaded
  during the run (a "probe": does the answer show the uploaded document?);
* uploads: files shared with the bot in a DM (registered on the mock Slack),
  a few of them not documents at all, a few served slowly;
* operator commands from a shell on the same data dir, one at a time:
  ``kb ingest``, ``kb rm`` and ``kb reindex``;

and injects faults: the model failing in turns (HTTP 500, a slow first
token, an HTML body, a malformed stream, a reply trickling past the deadline,
dropped connections), Slack answering single calls with 429 or 500, and a
``kill -9`` of the server every ``SOAK_KILL_EVERY`` seconds (60 by default;
restarted at once). Event deliveries that get no 200 within 3 s are
redelivered like Slack does (with ``X-Slack-Retry-Num``), on a compressed
schedule.

Printed at the end (shown with ``-s``; also the ``soak`` property of the
JUnit XML report's test suite, and ``soak.json`` in the work dir): questions
asked and how they ended (answered / evidence / related / refused / error / no
reply), errors by kind, acknowledgement latency p50/p99 (time for the HTTP POST
to return), uploads attempted / indexed / failed with reasons, restarts,
readiness, and **documents lost**: every document the run was told is indexed
(the seed, an "indexed" status message in Slack, or a successful ``kb ingest``)
and did not remove must, at the end, be ``indexed`` in the data dir with its
chunks in a fresh search snapshot. The test fails when a document was lost,
when a lane of the soak itself crashed, or when no question was acknowledged.

Every loop is bounded in time and count; every address is 127.0.0.1. The work
dir is the test's ``tmp_path`` (so the suite's canary check reads every log
the servers wrote), or ``SOAK_KEEP=DIR`` to keep it: the data dir, each server
incarnation's log (``serve-N.log``), every question and upload with its outcome
(``questions.jsonl``, ``uploads.jsonl``) and the report (``soak.json``).
``SOAK_SEED`` (1) seeds the traffic.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import random
import re
import signal
import sqlite3
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import numpy as np
import pytest

from bench.machine import describe as machine
from bot.slack import messages
from index.config import IndexConfig
from index.embed import Embedder
from index.knowledge_base import KnowledgeBase
from tests.conftest_bot import LINK_SECRET
from tests.servers import (
    DEFAULT_OPENAI_API_KEY,
    DEFAULT_SIGNING_SECRET,
    DM_CHANNEL_ID,
    USER_ID,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    closed_port_url,
    event_body,
    file_share_event,
    message_im_event,
    slack_headers,
)

pytestmark = pytest.mark.soak

SAMPLE_DIR = Path(__file__).resolve().parents[2] / "bot" / "sample"
ACK_LIMIT_S = 3.0  # Slack redelivers an event not acknowledged within 3 s
# Slack redelivers at once, after 1 minute and after 5 minutes; compressed here.
REDELIVERY_DELAYS_S = (1.0, 10.0, 60.0)
MODEL_REPLY = "Here is what the documents say [1]."
SEED_QUESTIONS = (
    "Can I deploy to production on a Friday?",
    "What do I attach to a conference ticket expense claim?",
    "What DNS server should I use when internal sites do not load over the VPN?",
    "How quickly must a page be acknowledged?",
    "How do I roll back a deploy?",
)
UNKNOWN_QUESTIONS = (
    "What is the offside rule in football?",
    "What is the capital of Australia?",
    "How long should sourdough bread proof?",
)
SYLLABLES = ("ka", "ve", "lo", "mi", "ru", "zen", "tor", "ba", "qui", "xo", "del", "fa")
TOPICS = (
    ("badge renewal", "the {code} badge is renewed every {n} days at the {place} desk"),
    ("parking permit", "the {code} parking permit is collected from the {place} office"),
    ("printer setup", "the {code} printer queue is added from the {place} portal"),
    ("lab booking", "the {code} lab is booked {n} days ahead through the {place} calendar"),
)
PLACES = ("north", "harbour", "atrium", "mezzanine", "garden", "tower")


# ---------------------------------------------------------------- configuration


@dataclass(frozen=True)
class SoakConfig:
    """How long, how often, and where."""

    minutes: float = 3.0
    kill_every_s: float = 60.0
    question_every_s: tuple[float, float] = (1.0, 2.0)
    upload_every_s: float = 20.0
    remove_every_s: float = 45.0
    cli_ingest_every_s: float = 90.0
    reindex_every_s: float = 300.0
    model_fault_gap_s: float = 30.0
    model_fault_window_s: float = 15.0
    slack_fault_every_s: tuple[float, float] = (15.0, 30.0)
    drain_s: float = 90.0
    seed: int = 1

    @property
    def seconds(self) -> float:
        """Length of the traffic phase."""
        return self.minutes * 60.0

    def most(self, every_s: float) -> int:
        """A generous cap on how many times something happening every ``every_s`` may run."""
        return int(self.seconds / max(every_s, 0.1) * 2) + 10

    @classmethod
    def from_environ(cls) -> SoakConfig:
        """``SOAK_MINUTES``, ``SOAK_KILL_EVERY`` and ``SOAK_SEED``, else the defaults."""
        default = cls()
        return cls(
            minutes=float(os.environ.get("SOAK_MINUTES", default.minutes)),
            kill_every_s=float(os.environ.get("SOAK_KILL_EVERY", default.kill_every_s)),
            seed=int(os.environ.get("SOAK_SEED", default.seed)),
        )


# ---------------------------------------------------------------- what happened


@dataclass
class Question:
    """One question sent to the bot and how it ended."""

    kind: str  # "seed", "unknown" or "probe"
    channel: str
    ts: str
    fault: str  # the model fault active when it was asked
    asked_at: float
    probe_name: str | None = None
    probe_code: str | None = None
    probe_source: str | None = None
    delivered: bool = False
    acked_at: float | None = None
    incarnation: int | None = None
    outcome: str = "not delivered"
    probe_hit: bool | None = None  # None: the document was removed before the answer
    text: str = ""


@dataclass
class Upload:
    """One file shared with the bot in a DM."""

    name: str
    good: bool
    slow: bool
    ts: str
    delivered: bool = False
    incarnation: int | None = None
    final: str = "no final status"
    reason: str = ""


@dataclass
class Told:
    """A document the run was told is indexed."""

    source: str  # "seed", "cli" or "slack"
    at: float
    code: str | None = None


@dataclass
class Tally:
    """Everything the lanes record."""

    started: float = field(default_factory=time.monotonic)
    questions: list[Question] = field(default_factory=list)
    uploads: list[Upload] = field(default_factory=list)
    told: dict[str, Told] = field(default_factory=dict)
    removed: dict[str, float] = field(default_factory=dict)  # name -> when
    acks_ms: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)
    error_samples: dict[str, str] = field(default_factory=dict)
    cli: dict[str, Counter[str]] = field(default_factory=dict)
    cli_seconds: dict[str, list[float]] = field(default_factory=dict)
    faults: Counter[str] = field(default_factory=Counter)
    restarts_s: list[float] = field(default_factory=list)
    kills: int = 0
    readiness: Counter[str] = field(default_factory=Counter)

    def error(self, kind: str, sample: str = "") -> None:
        """Count an error of ``kind``, keeping its first sample."""
        self.errors[kind] += 1
        if sample and kind not in self.error_samples:
            self.error_samples[kind] = sample[:300]

    def now(self) -> float:
        """Seconds since the run started."""
        return time.monotonic() - self.started

    def live_documents(self, older_than_s: float = 0.0) -> list[str]:
        """Names told indexed at least ``older_than_s`` ago and not removed."""
        cutoff = self.now() - older_than_s
        return [n for n, t in self.told.items() if n not in self.removed and t.at <= cutoff]


# ---------------------------------------------------------------- the server process


def product_env(
    data_dir: Path, slack: MockSlackAPI, llm: OpenAICompatServer, port: int
) -> dict[str, str]:
    """The environment of every product process: the test's (``tests/conftest.py`` cleared
    it of real settings and kept the session's encoder cache), with the suite's canaries."""
    env = dict(os.environ)
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "KB_DATA_DIR": str(data_dir),
            "KB_PORT": str(port),
            "KB_PUBLIC_URL": f"http://127.0.0.1:{port}",
            "KB_LINK_SECRET": LINK_SECRET,
            "KB_LOG_FORMAT": "json",
            "KB_LOG_LEVEL": "INFO",
            "SLACK_BOT_TOKEN": slack.bot_token,
            "SLACK_SIGNING_SECRET": DEFAULT_SIGNING_SECRET,
            "SLACK_API_URL": slack.api_url,
            "OPENAI_BASE_URL": llm.url,
            "OPENAI_API_KEY": DEFAULT_OPENAI_API_KEY,
            "KB_LLM_TIMEOUT": "5",
            "KB_LLM_FIRST_TOKEN_TIMEOUT": "3",
            "KB_LLM_DEADLINE": "8",
            "KB_LLM_MAX_RETRIES": "1",
            "KB_ADMIN_USERS": USER_ID,
            "KB_SLACK_ADMINS_ARE_ADMINS": "false",
        }
    )
    return env


class Server:
    """``python -m bot.cli serve`` as a child process: started, killed, restarted."""

    START_TIMEOUT_S = 180.0

    def __init__(self, workdir: Path, env: dict[str, str], port: int, tally: Tally) -> None:
        self.workdir = workdir
        self.env = env
        self.port = port
        self.tally = tally
        self.url = f"http://127.0.0.1:{port}"
        self.incarnation = 0
        self.lock = asyncio.Lock()  # one start / kill / stop at a time
        self._proc: asyncio.subprocess.Process | None = None
        self._log: Any = None

    @property
    def log_paths(self) -> list[Path]:
        """The log file of every incarnation so far."""
        return [self.workdir / f"serve-{i}.log" for i in range(1, self.incarnation + 1)]

    def crashed(self) -> int | None:
        """The exit status of a server that died without being told to, else ``None``."""
        if self._proc is None or self._proc.returncode is None:
            return None
        return self._proc.returncode

    async def start(self, session: aiohttp.ClientSession) -> float:
        """Start a new incarnation; seconds until ``/healthz`` answered 200."""
        self.incarnation += 1
        if self._log is not None:
            self._log.close()
        self._log = (self.workdir / f"serve-{self.incarnation}.log").open("wb")
        started = time.monotonic()
        self._proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli", "serve", "--port", str(self.port),
            cwd=self.workdir, env=self.env, stdout=self._log, stderr=self._log,
        )  # fmt: skip
        deadline = started + self.START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self._proc.returncode is not None:
                raise RuntimeError(f"the server exited with {self._proc.returncode} on start")
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"{self.url}/healthz", timeout=_timeout(1.0)) as resp:
                    if resp.status == 200:
                        return time.monotonic() - started
            await asyncio.sleep(0.25)
        raise RuntimeError(f"the server did not answer /healthz within {self.START_TIMEOUT_S} s")

    async def kill9(self) -> None:
        """``kill -9`` the current incarnation and reap it."""
        if self._proc is not None and self._proc.returncode is None:
            self._proc.send_signal(signal.SIGKILL)
            await self._proc.wait()

    async def stop(self) -> None:
        """SIGTERM, then SIGKILL after 30 s."""
        if self._proc is None or self._proc.returncode is not None:
            return
        self._proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(self._proc.wait(), 30.0)
        except TimeoutError:
            self.tally.error("server_stop_timeout")
            await self.kill9()
        if self._log is not None:
            self._log.close()
            self._log = None

    async def restart(self, session: aiohttp.ClientSession) -> None:
        """Start again at once after a kill or a crash, recording how long it took."""
        self.tally.restarts_s.append(await self.start(session))


def _timeout(seconds: float) -> aiohttp.ClientTimeout:
    return aiohttp.ClientTimeout(total=seconds)


# ---------------------------------------------------------------- Slack's side of HTTP events


@dataclass
class Delivered:
    """Whether an event got its 200, and which server incarnation gave it."""

    ok: bool
    incarnation: int | None = None


async def deliver(
    session: aiohttp.ClientSession, server: Server, tally: Tally, body: bytes
) -> Delivered:
    """POST a signed event like Slack: redelivered when there is no 200 within 3 s."""
    for attempt, delay in enumerate((0.0, *REDELIVERY_DELAYS_S)):
        await asyncio.sleep(delay)
        headers = slack_headers(DEFAULT_SIGNING_SECRET, body, retry_num=attempt or None)
        started = time.perf_counter()
        try:
            async with session.post(
                f"{server.url}/slack/events",
                data=body,
                headers=headers,
                timeout=_timeout(ACK_LIMIT_S),
            ) as resp:
                await resp.read()
                tally.acks_ms.append((time.perf_counter() - started) * 1000)
                if resp.status == 200:
                    return Delivered(True, server.incarnation)
                tally.error(f"ack_http_{resp.status}")
        except TimeoutError:
            # Counted at Slack's limit: the slowest acknowledgements must show in p99.
            tally.acks_ms.append(ACK_LIMIT_S * 1000)
            tally.error("ack_timeout_3s")
        except aiohttp.ClientError as exc:
            tally.error("ack_refused_server_down", type(exc).__name__)
    tally.error("event_never_acknowledged")
    return Delivered(False)


# ---------------------------------------------------------------- content


def codeword(rng: random.Random, n: int) -> str:
    """A made-up word that occurs in exactly one document."""
    return "".join(rng.choice(SYLLABLES) for _ in range(3)) + f"{n:03d}"


def good_document(rng: random.Random, code: str) -> tuple[bytes, str]:
    """A small Markdown document about ``code`` and the question it answers."""
    topic, sentence = rng.choice(TOPICS)
    fact = sentence.format(code=code, n=rng.randint(7, 90), place=rng.choice(PLACES))
    filler = [
        f"Questions about the {code} {topic} go to the facilities team in #help-{code}.",
        f"The {code} {topic} rules were last reviewed this quarter.",
        f"Nobody outside the {code} programme needs to act on this page.",
    ]
    sections = [f"# {code.title()} {topic}", "## Summary", fact.capitalize() + "."]
    for i in range(rng.randint(1, 4)):
        sections += [f"## Detail {i + 1}", rng.choice(filler)]
    return ("\n\n".join(sections) + "\n").encode(), f"How does the {code} {topic} work?"


BAD_FILES: tuple[tuple[str, bytes, str], ...] = (
    ("pdf", b"%PDF-1.4\n" + bytes(range(256)) * 8, "application/pdf"),
    ("png", b"\x89PNG\r\n\x1a\n" + bytes(400), "image/png"),
    ("txt", b"", "text/plain"),
)


# ---------------------------------------------------------------- reading Slack's side


def thread_messages(slack: MockSlackAPI) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """The bot's messages by ``(channel, thread_ts)``, oldest first."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for (channel, ts), msg in sorted(slack.messages.items(), key=lambda kv: kv[0][1]):
        thread = str(msg.get("thread_ts") or ts)
        out.setdefault((channel, thread), []).append(msg)
    return out


def question_outcome(replies: list[dict[str, Any]]) -> str:
    """How a question ended, from the bot's messages in its thread."""
    kinds = [_reply_kind(m) for m in replies]
    for kind in ("answered", "answered uncited", "evidence", "related", "refused", "error"):
        if kind in kinds:
            return kind
    others = [k for k in kinds if k.startswith("other")]
    if others:
        return others[-1]
    return "unfinished" if kinds else "no reply"


def _reply_kind(msg: dict[str, Any]) -> str:
    text, blocks = str(msg.get("text", "")), json.dumps(msg.get("blocks", []))
    if text == messages.REFUSAL:
        return "refused"
    if text.startswith(messages.RELATED_FALLBACK):
        return "related"
    if text.startswith(messages.EVIDENCE_FALLBACK):
        return "evidence"
    if text.startswith(messages.UNSUPPORTED_WARNING):
        return "answered uncited"
    if json.dumps(messages.SOURCES_HEADER)[1:-1] in blocks:
        return "answered"
    if text == messages.PLACEHOLDER or json.dumps(messages.WRITING)[1:-1] in blocks:
        return "unfinished"
    if text.startswith(messages.ERROR_GENERIC[:30]):
        return "error"
    # A reply this soak does not know yet (a new error message, say): shown as it is.
    return f"other: {text[:80]}"


_STATUS_NAME = re.compile(r"\*((?:soak|cli)-[^*]+)\*:")


def statuses_by_name(slack: MockSlackAPI) -> dict[str, list[str]]:
    """Texts of the bot's messages about each shared file, oldest first.

    Found by the file name rather than the thread: a status the bot could not
    post in the DM thread may arrive elsewhere (a plain DM).
    """
    out: dict[str, list[str]] = {}
    for _, msg in sorted(slack.messages.items(), key=lambda kv: kv[0][1]):
        text = str(msg.get("text", ""))
        match = _STATUS_NAME.search(text)
        if match:
            out.setdefault(match.group(1), []).append(text)
    return out


def upload_status(texts: list[str]) -> tuple[str, str]:
    """``(final, reason)`` from the status messages of one shared file."""
    for text in reversed(texts):
        if ": indexed," in text:
            return "indexed", ""
        if "already in the knowledge base" in text:
            return "duplicate", ""
        if ": failed:" in text:
            return "failed", text.split(": failed:", 1)[1].split("\n")[0].strip()
        if "for approval" in text:
            return "awaiting approval", ""
    return "no final status", texts[-1][:120] if texts else "no status message"


def record_statuses(slack: MockSlackAPI, tally: Tally) -> None:
    """Learn which uploads Slack now shows as indexed (a promise the data dir must keep)."""
    statuses = statuses_by_name(slack)
    for up in tally.uploads:
        up.final, up.reason = upload_status(statuses.get(up.name, []))
        if up.final == "indexed" and up.name not in tally.told:
            tally.told[up.name] = Told("slack", tally.now(), _code_of(up.name))


def _code_of(name: str) -> str | None:
    stem = name.rsplit(".", 1)[0]
    return stem.split("-", 2)[2] if stem.count("-") >= 2 else None


# ---------------------------------------------------------------- the lanes


@dataclass
class Soak:
    """The running soak: servers, the bot's process, the lanes and what they record."""

    config: SoakConfig
    workdir: Path
    slack: MockSlackAPI
    llm: OpenAICompatServer
    server: Server
    session: aiohttp.ClientSession
    tally: Tally
    rng: random.Random
    end: float  # monotonic time the traffic stops
    model_fault: str = "none"
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    killed: set[int] = field(default_factory=set)  # incarnations that died (kill -9 or crash)
    codes: dict[str, str] = field(default_factory=dict)  # code -> probe question

    def running(self) -> bool:
        """Whether traffic is still being sent."""
        return time.monotonic() < self.end

    async def pause(self, seconds: float) -> None:
        """Sleep, but never past the end of the traffic phase."""
        await asyncio.sleep(max(0.0, min(seconds, self.end - time.monotonic())))

    def spawn(self, coro: Awaitable[Any]) -> None:
        """Run ``coro`` in the background, held until it finishes."""
        task: asyncio.Task[Any] = asyncio.ensure_future(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    # ------------------------------------------------------------ questions

    async def questions(self) -> None:
        """One question every 1-2 s: the handbook, nothing known, or a fresh upload."""
        for _ in range(self.config.most(self.config.question_every_s[0])):
            if not self.running():
                return
            self.spawn(self.ask())
            await self.pause(self.rng.uniform(*self.config.question_every_s))

    async def ask(self) -> None:
        """Build, send and record one question."""
        q, text = self.next_question()
        q.text = text
        if self.rng.random() < 0.5:
            event = app_mention_event(text, ts=q.ts, channel=q.channel)
        else:
            q.channel = DM_CHANNEL_ID
            event = message_im_event(text, ts=q.ts)
        self.tally.questions.append(q)
        sent = await deliver(self.session, self.server, self.tally, event_body(event))
        q.delivered, q.incarnation = sent.ok, sent.incarnation
        q.acked_at = self.tally.now() if sent.ok else None

    def next_question(self) -> tuple[Question, str]:
        """A question of a random kind (a probe only once some upload is indexed)."""
        ts = f"{time.time():.6f}"
        # The bot follows the store within about 2 s; 5 s leaves room on a busy machine.
        fresh = [n for n in self.tally.live_documents(5.0) if self.tally.told[n].code]
        roll = self.rng.random()
        q = Question("seed", "C0SOAK0001", ts, self.model_fault, self.tally.now())
        if fresh and roll < 0.35:
            name = self.rng.choice(fresh)
            told = self.tally.told[name]
            q.kind, q.probe_name, q.probe_code = "probe", name, told.code
            q.probe_source = told.source
            return q, self.codes[str(told.code)]
        if roll < 0.55:
            q.kind = "unknown"
            return q, self.rng.choice(UNKNOWN_QUESTIONS)
        return q, self.rng.choice(SEED_QUESTIONS)

    # ------------------------------------------------------------ uploads

    async def uploads(self) -> None:
        """One file shared in a DM every ~20 s; one in six is not a document."""
        for n in range(self.config.most(self.config.upload_every_s)):
            if not self.running():
                return
            self.spawn(self.upload(n))
            await self.pause(self.config.upload_every_s * self.rng.uniform(0.75, 1.25))

    async def upload(self, n: int) -> None:
        """Register one file on the mock Slack and share it with the bot."""
        good = self.rng.random() > 1 / 6
        file_id = f"F{n:09d}SOAK"
        if good:
            code = codeword(self.rng, n)
            data, question = good_document(self.rng, code)
            self.codes[code] = question
            name, mimetype = f"soak-{n:04d}-{code}.md", "text/markdown"
        else:
            ext, data, mimetype = self.rng.choice(BAD_FILES)
            name = f"soak-{n:04d}-bad.{ext}"
        obj = self.slack.add_file(file_id, name, data, mimetype)
        slow = good and self.rng.random() < 0.15
        if slow:
            self.slack.trickle(file_id, 0.5, piece=max(64, len(data) // 16))
            self.tally.faults["slack: slow download"] += 1
        up = Upload(name, good, slow, f"{time.time():.6f}")
        self.tally.uploads.append(up)
        event = file_share_event([obj], ts=up.ts)
        sent = await deliver(self.session, self.server, self.tally, event_body(event))
        up.delivered, up.incarnation = sent.ok, sent.incarnation

    async def watch_statuses(self) -> None:
        """Read the uploads' status messages every second (what Slack promised)."""
        for _ in range(int(self.config.seconds) + 10):
            record_statuses(self.slack, self.tally)
            if not self.running():
                return
            await self.pause(1.0)

    # ------------------------------------------------------------ the operator's shell

    async def operator(self) -> None:
        """``kb rm``, ``kb ingest`` and ``kb reindex`` on their schedules, one at a time."""
        c = self.config
        due = {
            "rm": c.remove_every_s,
            "ingest": c.cli_ingest_every_s / 2,
            "reindex": min(c.reindex_every_s, c.seconds / 2),
        }
        every = {
            "rm": c.remove_every_s,
            "ingest": c.cli_ingest_every_s,
            "reindex": c.reindex_every_s,
        }
        for _ in range(sum(c.most(s) for s in every.values())):
            op = min(due, key=lambda k: due[k])
            await self.pause(due[op] - self.tally.now())
            if not self.running():
                return
            await {"rm": self.remove, "ingest": self.cli_ingest, "reindex": self.reindex}[op]()
            due[op] = self.tally.now() + every[op]

    async def cli(self, op: str, *args: str, timeout: float = 300.0) -> tuple[int, str, str]:
        """Run ``kb`` on the data dir; ``(status, stdout, stderr)``, recorded under ``op``."""
        started = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bot.cli", *args,
            cwd=self.workdir, env=self.server.env,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except TimeoutError:
            proc.kill()
            out, err = await proc.communicate()
            self.tally.error(f"cli_{op}_timeout")
        rc = proc.returncode if proc.returncode is not None else -1
        self.tally.cli.setdefault(op, Counter())["ok" if rc == 0 else "failed"] += 1
        self.tally.cli_seconds.setdefault(op, []).append(time.monotonic() - started)
        stderr = err.decode(errors="replace")
        if rc != 0:
            self.tally.error(f"cli_{op}_failed", _last_line(stderr))
        return rc, out.decode(errors="replace"), stderr

    async def remove(self) -> None:
        """``kb rm`` a document uploaded or ingested earlier in the run."""
        candidates = [
            n for n in self.tally.live_documents(3.0) if self.tally.told[n].source != "seed"
        ]
        if not candidates:
            return
        name = self.rng.choice(candidates)
        rc, _, _ = await self.cli("rm", "rm", name)
        if rc == 0:
            self.tally.removed[name] = self.tally.now()

    async def cli_ingest(self) -> None:
        """``kb ingest`` one new document, as the README tells operators to."""
        n = 5000 + int(self.tally.cli.get("ingest", Counter()).total())
        code = codeword(self.rng, n)
        data, question = good_document(self.rng, code)
        self.codes[code] = question
        path = self.workdir / "cli-docs" / f"cli-{n:04d}-{code}.md"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(data)
        rc, out, _ = await self.cli("ingest", "ingest", str(path), "--json")
        for row in _json_or(out, {}).get("indexed", []):
            self.tally.told[str(row["name"])] = Told("cli", self.tally.now(), code)

    async def reindex(self) -> None:
        """``kb reindex`` while the bot answers."""
        rc, out, _ = await self.cli("reindex", "reindex", "--json", timeout=900.0)
        live = set(self.tally.live_documents())
        for failure in _json_or(out, {}).get("failed", []):
            if failure.get("name") in live:  # a document that was failed already may fail again
                why = f"{failure.get('name')}: {failure.get('reason')}"
                self.tally.error("reindex_failed_an_indexed_document", why)

    # ------------------------------------------------------------ faults

    async def model_faults(self) -> None:
        """The model misbehaving in turns, ~15 s of every ~45 s."""
        kinds = list(MODEL_FAULTS)
        for i in range(self.config.most(self.config.model_fault_gap_s)):
            await self.pause(self.config.model_fault_gap_s)
            if not self.running():
                return
            name = kinds[i % len(kinds)]
            MODEL_FAULTS[name](self.llm)
            self.model_fault = name
            self.tally.faults[f"model: {name}"] += 1
            await self.pause(self.config.model_fault_window_s)
            self.llm.reset()
            self.model_fault = "none"

    async def slack_faults(self) -> None:
        """Single Slack calls answered 429 or 500 every 15-30 s."""
        for _ in range(self.config.most(self.config.slack_fault_every_s[0])):
            await self.pause(self.rng.uniform(*self.config.slack_fault_every_s))
            if not self.running():
                return
            method = self.rng.choice(("chat.postMessage", "chat.update"))
            if self.rng.random() < 0.5:
                self.slack.rate_limit(method, retry_after=1, times=1)
                self.tally.faults[f"slack: {method} 429"] += 1
            else:
                self.slack.fail(method, "internal_error", times=1, status=500)
                self.tally.faults[f"slack: {method} 500"] += 1

    async def killer(self) -> None:
        """``kill -9`` the server every few minutes and start it again at once."""
        every = self.config.kill_every_s
        for _ in range(self.config.most(every)):
            await self.pause(every * self.rng.uniform(0.75, 1.25))
            if not self.running():
                return
            async with self.server.lock:
                self.killed.add(self.server.incarnation)
                await self.server.kill9()
                self.tally.kills += 1
                await self.restart_server()

    async def restart_server(self) -> None:
        """Start the server again at once (three tries); traffic stops if it cannot start."""
        for _ in range(3):
            try:
                await self.server.restart(self.session)
                return
            except RuntimeError as exc:
                self.tally.error("server_start_failed", str(exc))
        self.end = time.monotonic()

    async def readiness(self) -> None:
        """``/readyz`` every 5 s; a server that died on its own is counted and restarted."""
        for _ in range(int(self.config.seconds / 5) + 10):
            await self.probe_ready()
            if not self.running():
                return
            await self.pause(5.0)

    async def probe_ready(self) -> None:
        """One ``/readyz`` request, recorded by outcome."""
        if self.server.lock.locked():
            self.tally.readiness["restarting"] += 1
            return
        crashed = self.server.crashed()
        if crashed is not None:
            self.tally.error("server_crashed", f"exit status {crashed}")
            self.killed.add(self.server.incarnation)
            async with self.server.lock:
                await self.restart_server()
            return
        try:
            async with self.session.get(f"{self.server.url}/readyz", timeout=_timeout(3.0)) as resp:
                body = _json_or(await resp.text(), {})
                failing = sorted(k for k, v in (body.get("checks") or {}).items() if not v)
                self.tally.readiness[
                    "ready" if resp.status == 200 else f"{resp.status} {failing}"
                ] += 1
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.tally.readiness[f"unreachable ({type(exc).__name__})"] += 1


def _fail_500(llm: OpenAICompatServer) -> None:
    llm.fail_with(500)


def _slow_first_token(llm: OpenAICompatServer) -> None:
    llm.delay(5.0)  # past KB_LLM_FIRST_TOKEN_TIMEOUT=3


def _html_body(llm: OpenAICompatServer) -> None:
    llm.answer_raw(b"<html><body><h1>502 Bad Gateway</h1></body></html>", "text/html")


def _bad_stream(llm: OpenAICompatServer) -> None:
    chunk = b'data: {"choices": [{"index": 0, "delta": {"content": 42}}]}\n\ndata: {oops\n\n'
    llm.answer_raw(chunk, "text/event-stream")


def _trickle(llm: OpenAICompatServer) -> None:
    llm.trickle(2.0)  # 7 pieces, 14 s: past KB_LLM_DEADLINE=8


def _drop(llm: OpenAICompatServer) -> None:
    llm.drop_connections()


MODEL_FAULTS: dict[str, Callable[[OpenAICompatServer], None]] = {
    "http 500": _fail_500,
    "slow first token": _slow_first_token,
    "html body": _html_body,
    "bad stream chunk": _bad_stream,
    "trickle past deadline": _trickle,
    "dropped connection": _drop,
}


def _json_or(text: str, default: Any) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return default


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


# ---------------------------------------------------------------- the end: what is true


async def drain(soak: Soak) -> None:
    """Faults off; wait (bounded) for deliveries, answers and uploads to settle."""
    soak.llm.reset()
    soak.model_fault = "none"
    deadline = time.monotonic() + soak.config.drain_s
    while soak.tasks and time.monotonic() < deadline:
        await asyncio.wait(list(soak.tasks), timeout=max(0.1, deadline - time.monotonic()))
    while time.monotonic() < deadline:
        record_statuses(soak.slack, soak.tally)
        threads = thread_messages(soak.slack)
        open_questions = [
            q for q in soak.tally.questions
            if q.delivered and question_outcome(threads.get((q.channel, q.ts), [])) in ("unfinished", "no reply")
        ]  # fmt: skip
        open_uploads = [
            u for u in soak.tally.uploads if u.delivered and u.final == "no final status"
        ]
        if not open_questions and not open_uploads:
            break
        await asyncio.sleep(1.0)
    for task in list(soak.tasks):
        task.cancel()
    record_statuses(soak.slack, soak.tally)


def classify_questions(soak: Soak) -> None:
    """Give every question its outcome (and a probe whether it showed its document)."""
    threads = thread_messages(soak.slack)
    for q in soak.tally.questions:
        if not q.delivered:
            continue
        replies = threads.get((q.channel, q.ts), [])
        q.outcome = question_outcome(replies)
        if q.outcome in ("no reply", "unfinished") and q.incarnation in soak.killed:
            q.outcome += " (server killed)"
        removed_at = soak.tally.removed.get(str(q.probe_name), math.inf)
        # A redelivery can arrive after the document was removed: then there is nothing to show.
        if q.probe_code and (q.acked_at or 0.0) + 10.0 < removed_at:
            q.probe_hit = q.probe_code in json.dumps(replies).lower()


def read_states(data_dir: Path) -> dict[str, str]:
    """Every document's state, read-only and straight from SQLite (no recovery runs)."""
    uri = f"file:{data_dir / 'kb.sqlite'}?mode=ro"
    with contextlib.closing(sqlite3.connect(uri, uri=True, timeout=30)) as db:
        return {
            str(name): str(state) for name, state in db.execute("SELECT name, state FROM documents")
        }


def searchable_in_fresh_snapshot(
    data_dir: Path, names: list[str], embedder: Embedder
) -> dict[str, str]:
    """Why each of ``names`` is not searchable in a fresh snapshot of the data dir ('' when it is).

    The knowledge base is opened anew, after every server stopped: its snapshot is
    loaded from the data dir as a new process would load it.
    """
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    ids = set(np.asarray(kb.snapshot.chunk_ids).tolist())
    rows = {d.name: d for d in kb.documents() if d.state == "indexed"}
    verdict: dict[str, str] = {}
    for name in names:
        row = rows.get(name)
        if row is None:
            verdict[name] = "not indexed in SQLite"
            continue
        chunk_ids = {int(c["id"]) for c in kb.chunks(row.id)}
        missing = len(chunk_ids - ids)
        verdict[name] = (
            "no chunks"
            if not chunk_ids
            else f"{missing} chunks not in the snapshot"
            if missing
            else ""
        )
    kb.store.close()
    return verdict


async def verify(soak: Soak, embedder: Embedder) -> dict[str, Any]:
    """The documents the run was told are indexed, checked against the data dir."""
    data_dir = Path(soak.server.env["KB_DATA_DIR"])
    states = await asyncio.to_thread(read_states, data_dir)
    in_flight = sorted(n for n, s in states.items() if s in ("pending", "indexing"))
    rc, status_out, _ = await soak.cli("status", "status", "--json")
    rc_docs, docs_out, _ = await soak.cli("docs", "docs", "--json")
    docs = {str(d["name"]): d for d in _json_or(docs_out, [])}
    expected = sorted(soak.tally.live_documents())
    fresh = await asyncio.to_thread(searchable_in_fresh_snapshot, data_dir, expected, embedder)
    lost = {
        n: fresh[n] or f"state {docs.get(n, {}).get('state', 'absent')}"
        for n in expected
        if fresh[n] or docs.get(n, {}).get("state") != "indexed"
    }
    status = _json_or(status_out, {})
    return {
        "told_indexed": len(soak.tally.told),
        "removed": len(soak.tally.removed),
        "expected": len(expected),
        "lost": len(lost),
        "lost_documents": lost,
        "by_state": status.get("by_state", {}),
        "in_sync": (status.get("index") or {}).get("in_sync"),
        "degraded": (status.get("index") or {}).get("degraded"),
        "pending_or_indexing_at_end": in_flight,
        "status_disagrees_with_data_dir": _disagreements(soak, states),
    }


def _disagreements(soak: Soak, states: dict[str, str]) -> list[str]:
    """Uploads whose Slack status contradicts the data dir, or that never got a final one."""
    out = []
    tally = soak.tally
    for up in tally.uploads:
        state = states.get(up.name, "absent")
        if not up.delivered or up.name in tally.removed:
            continue
        if up.final in ("indexed", "duplicate") and state != "indexed":
            out.append(f"{up.name}: Slack shows {up.final}, the data dir has {state}")
        elif up.final == "failed" and state == "indexed":
            out.append(f"{up.name}: Slack shows failed ({up.reason}), the data dir has indexed")
        elif up.final == "no final status":
            killed = (
                " (the server that took it was killed)" if up.incarnation in soak.killed else ""
            )
            out.append(
                f"{up.name}: Slack still shows '{up.reason}', the data dir has {state}{killed}"
            )
    return out


# ---------------------------------------------------------------- the report


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100); 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def server_log_errors(paths: list[Path]) -> dict[str, int]:
    """Error records in the server's logs, counted by logger and event."""
    counts: Counter[str] = Counter()
    for path in paths:
        if not path.exists():
            continue
        for line in path.read_text(errors="replace").splitlines():
            record = _json_or(line, None)
            if not isinstance(record, dict):
                if "Traceback" in line:
                    counts["(raw traceback on stderr)"] += 1
                continue
            if str(record.get("level", "")).lower() in ("error", "critical"):
                counts[f"{record.get('logger', '?')}: {str(record.get('event', ''))[:100]}"] += 1
    return dict(counts.most_common())


def report(soak: Soak, documents: dict[str, Any], elapsed_s: float) -> dict[str, Any]:
    """Everything measured, JSON-ready."""
    t = soak.tally
    delivered = [q for q in t.questions if q.delivered]
    by_fault: dict[str, Counter[str]] = {}
    for q in delivered:
        by_fault.setdefault(q.fault, Counter())[q.outcome] += 1
    probes = [q for q in delivered if q.kind == "probe" and q.probe_hit is not None]
    reasons = Counter(u.reason for u in t.uploads if u.final == "failed")
    for outcome, n in Counter(q.outcome for q in delivered).items():
        if outcome not in ("answered", "evidence", "related", "refused"):
            t.errors[f"question: {outcome}"] += n
    return {
        "machine": machine(),
        "config": {k: v for k, v in asdict(soak.config).items()},
        "elapsed_s": round(elapsed_s, 1),
        "questions": {
            "asked": len(t.questions),
            "delivered": len(delivered),
            "outcomes": dict(Counter(q.outcome for q in delivered).most_common()),
            "by_model_fault": {k: dict(v) for k, v in sorted(by_fault.items())},
            "probes": {
                "asked": len(probes),
                "void_document_removed_first": sum(
                    q.kind == "probe" and q.probe_hit is None for q in delivered
                ),
                "showed_the_document": sum(q.probe_hit is True for q in probes),
                "by_source": {
                    src: f"{sum(q.probe_hit is True for q in probes if q.probe_source == src)}"
                    f"/{sum(q.probe_source == src for q in probes)}"
                    for src in ("slack", "cli")
                },
            },
        },
        "ack_ms": {
            "count": len(t.acks_ms),
            "p50": round(percentile(t.acks_ms, 50), 1),
            "p99": round(percentile(t.acks_ms, 99), 1),
            "max": round(max(t.acks_ms, default=0.0), 1),
        },
        "uploads": {
            "attempted": len(t.uploads),
            "documents": sum(u.good for u in t.uploads),
            "not_documents": sum(not u.good for u in t.uploads),
            "slow_downloads": sum(u.slow for u in t.uploads),
            "final": dict(Counter(u.final for u in t.uploads).most_common()),
            "failed_reasons": dict(reasons.most_common()),
        },
        "cli": {
            op: {**dict(c), "median_s": round(statistics.median(t.cli_seconds.get(op) or [0]), 1)}
            for op, c in sorted(t.cli.items())
        },
        "server": {
            "starts": soak.server.incarnation,
            "kills": t.kills,
            "restart_s": [round(s, 1) for s in t.restarts_s],
            "readyz": dict(t.readiness.most_common()),
            "log_errors": server_log_errors(soak.server.log_paths),
        },
        "faults_injected": dict(sorted(t.faults.items())),
        "slack_calls_refused": dict(
            Counter(f"{m}: {e}" for m, _, e in soak.slack.rejected).most_common()
        ),
        "errors": dict(t.errors.most_common()),
        "error_samples": t.error_samples,
        "documents": documents,
        "documents_lost": documents["lost"],
    }


def print_report(r: dict[str, Any]) -> None:
    """The report as text."""
    q, a, u, d, s = r["questions"], r["ack_ms"], r["uploads"], r["documents"], r["server"]
    print(f"machine: {r['machine']}")
    print(f"soak: {r['config']['minutes']} min of traffic, {r['elapsed_s']} s in all")
    print(f"questions: {q['asked']} asked, {q['delivered']} acknowledged; {_pairs(q['outcomes'])}")
    for fault, outcomes in q["by_model_fault"].items():
        print(f"  model {fault}: {_pairs(outcomes)}")
    p = q["probes"]
    print(
        f"  probes (questions about uploaded documents): {p['showed_the_document']}/{p['asked']} "
        f"showed the document (from Slack {p['by_source']['slack']}, from kb ingest {p['by_source']['cli']})"
    )
    print(f"ack: {a['count']} POSTs, p50 {a['p50']} ms, p99 {a['p99']} ms, max {a['max']} ms")
    print(
        f"uploads: {u['attempted']} ({u['not_documents']} not documents, {u['slow_downloads']} slow); {_pairs(u['final'])}"
    )
    for reason, n in u["failed_reasons"].items():
        print(f"  failed x{n}: {reason}")
    print("cli: " + "; ".join(f"{op} {_pairs(c)}" for op, c in r["cli"].items()))
    print(
        f"server: {s['starts']} starts, {s['kills']} kill -9, restart s {s['restart_s']}; readyz {_pairs(s['readyz'])}"
    )
    for what, n in s["log_errors"].items():
        print(f"  log error x{n}: {what}")
    print(f"faults injected: {_pairs(r['faults_injected'])}")
    print(f"slack calls refused: {_pairs(r['slack_calls_refused'])}")
    print(f"errors: {_pairs(r['errors']) or 'none'}")
    for kind, sample in r["error_samples"].items():
        print(f"  {kind}: {sample}")
    print(
        f"documents: told indexed {d['told_indexed']}, removed {d['removed']}, expected {d['expected']}, "
        f"in sync {d['in_sync']}, degraded {d['degraded']}; by state {_pairs(d['by_state'])}"
    )
    for line in d["status_disagrees_with_data_dir"]:
        print(f"  status vs data dir: {line}")
    if d["pending_or_indexing_at_end"]:
        print(f"  still pending/indexing at the end: {d['pending_or_indexing_at_end']}")
    for name, why in d["lost_documents"].items():
        print(f"  LOST {name}: {why}")
    print(f"DOCUMENTS LOST: {r['documents_lost']} (must be 0)")


def _pairs(counts: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in counts.items())


# ---------------------------------------------------------------- running it


def seed(soak: Soak, embedder: Embedder) -> None:
    """Index the sample handbook in the data dir before the server starts."""
    kb = KnowledgeBase(
        IndexConfig(data_dir=Path(soak.server.env["KB_DATA_DIR"])), embedder=embedder
    )
    try:
        summary = kb.ingest_paths([SAMPLE_DIR])
    finally:
        kb.store.close()
    assert summary.indexed and not summary.failed, f"the sample handbook did not index: {summary}"
    for row in summary.indexed:
        soak.tally.told[row.name] = Told("seed", 0.0)


async def run(config: SoakConfig, workdir: Path, embedder: Embedder) -> dict[str, Any]:
    """Start everything, send traffic for ``config.minutes``, settle, verify, report."""
    tally = Tally()
    async with (
        MockSlackAPI(admins=[USER_ID]) as slack,
        OpenAICompatServer(reply=MODEL_REPLY, api_key=DEFAULT_OPENAI_API_KEY) as llm,
        aiohttp.ClientSession() as session,
    ):
        port = int(urlsplit(closed_port_url()).port or 0)  # free right now
        env = product_env(workdir / "kb-data", slack, llm, port)
        server = Server(workdir, env, port, tally)
        soak = Soak(
            config, workdir, slack, llm, server, session, tally, random.Random(config.seed), 0.0
        )
        try:
            await asyncio.to_thread(seed, soak, embedder)
            await server.start(session)
            tally.started = time.monotonic()
            soak.end = tally.started + config.seconds
            lanes = (soak.questions, soak.uploads, soak.watch_statuses, soak.operator,
                     soak.model_faults, soak.slack_faults, soak.killer, soak.readiness)  # fmt: skip
            await asyncio.gather(*(_guarded(soak, lane) for lane in lanes))
            await drain(soak)
            classify_questions(soak)
            soak.tally.readiness["final " + ("ready" if await _ready(soak) else "not ready")] += 1
        finally:
            await server.stop()
        documents = await verify(soak, embedder)
        dump_records(soak)
        return report(soak, documents, time.monotonic() - tally.started)


def dump_records(soak: Soak) -> None:
    """Every question and upload as JSON lines in the work dir (kept with ``SOAK_KEEP``)."""
    for name, rows in (("questions", soak.tally.questions), ("uploads", soak.tally.uploads)):
        lines = (json.dumps(asdict(row)) for row in rows)
        (soak.workdir / f"{name}.jsonl").write_text("\n".join(lines) + "\n")


async def _guarded(soak: Soak, lane: Callable[[], Awaitable[None]]) -> None:
    """Run one lane; a bug in it ends the traffic early but still yields a report."""
    try:
        await lane()
    except Exception as exc:
        soak.tally.error(f"soak_lane_crashed: {lane.__name__}", repr(exc))
        soak.end = time.monotonic()


async def _ready(soak: Soak) -> bool:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with soak.session.get(f"{soak.server.url}/readyz", timeout=_timeout(5.0)) as resp:
            return resp.status == 200
    return False


def _lanes_crashed(result: dict[str, Any]) -> dict[str, str]:
    return {
        kind: result["error_samples"].get(kind, "")
        for kind in result["errors"]
        if kind.startswith("soak_lane_crashed")
    }


async def test_soak(
    tmp_path: Path,
    embedder: Embedder,
    record_testsuite_property: Callable[[str, object], None],
) -> None:
    """Minutes of traffic and faults: no document the run was told is indexed may be lost."""
    config = SoakConfig.from_environ()
    keep = os.environ.get("SOAK_KEEP")
    workdir = Path(keep).resolve() if keep else tmp_path
    workdir.mkdir(parents=True, exist_ok=True)
    result = await run(config, workdir, embedder)
    (workdir / "soak.json").write_text(json.dumps(result, indent=2) + "\n")
    record_testsuite_property("soak", json.dumps(result))
    print()
    print_report(result)

    assert result["questions"]["delivered"] > 0, "no question was acknowledged"
    assert not _lanes_crashed(result), f"a lane of the soak crashed: {_lanes_crashed(result)}"
    assert result["documents_lost"] == 0, (
        f"{result['documents_lost']} documents lost: {result['documents']['lost_documents']}"
    )
