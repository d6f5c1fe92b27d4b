"""Ack latency and answer timing of the Slack HTTP endpoint under bursts of concurrent mentions.

Slack gives an app 3 seconds to acknowledge an event and retries otherwise, so
the endpoint must answer fast even while it is busy answering earlier
questions. This runs the real server (``bot.app.create_app``) on loopback with
a small knowledge base, four times side by side: answers streamed natively
(``KB_SLACK_STREAMING=auto``), posted then edited (``off``), both by an app
that is not an agent (Slack refuses its sessions: the thread's status shows the
work), and an agent app's answers in its Messages tab (``agent``) and in a
channel (``agent-channel``), streamed as agent sessions with their steps shown.
They point their Web API client at a local mock Slack (the agent's its own,
which takes agent sessions) and their model at one local OpenAI-compatible
server that writes its answer a word every ``--word-ms`` after
``--first-token-ms`` (a model's pace, not the instant reply of a stub). Rounds
of ``--concurrency`` signed events (``app_mention``; direct messages for the
agent's Messages tab) go to each server in turn, and for each mode the bench
measures:

* ack latency: from sending the request to receiving the HTTP response;
* first sign of work: from sending the request to the first call that shows
  the question is being worked on (the thread's status, the agent session's
  ``processing``, a stream or a placeholder), every question;
* first step (agent): to the stream that shows the search step;
* first text: from sending the request to the first call at the mock Slack
  carrying the answer's words (``chat.startStream`` when streaming, the first
  ``chat.appendStream`` with text in a stream its steps started, else the
  first ``chat.postMessage`` in the thread), questions the model answers only;
* final: from sending the request to the message with the finished answer
  (posted, or edited into the message that showed it being written;
  retrieval, the model call and rendering included);
* Slack calls per model answer (appends, or edits while writing), and the
  share of model answers that were streamed (streams share a budget of 20 a
  minute, Slack's limit for ending them: past it answers are posted and edited).

A first burst warms each process up (thread pools, per-thread database
connections) and is reported on its own; medians over the following rounds
are printed with the machine. Target: ack p99 < 300 ms with streaming on.
The run is bounded: ``--rounds`` x ``--concurrency`` requests per mode, each
round waiting at most ``--round-timeout`` seconds for its answers.

Run: python -m bench.slack [--rounds 5] [--concurrency 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.machine import describe as machine
from bot.app import create_app
from bot.settings import Settings
from bot.slack import messages
from bot.slack.blocks import FEEDBACK_ACTION_ID
from index.embed import Embedder, load_embedder
from index.knowledge_base import KnowledgeBase

# The mock Slack and model servers live with the tests, which are not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import (  # noqa: E402
    DEFAULT_SIGNING_SECRET,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    event_body,
    message_im_event,
    slack_headers,
)

TARGET_P99_MS = 300.0
# KB_SLACK_STREAMING: streamed natively, posted then edited; and an agent app's DMs and
# channel mentions.
MODES = ("auto", "off", "agent", "agent-channel")
_SIGNS = frozenset(
    {
        "assistant.threads.setStatus",
        "agents.sessions.setStatus",
        "chat.startStream",
        "chat.postMessage",
    }
)
DOCUMENTS = {
    "handbook.md": b"# Employee handbook\n\n## Expenses\n\nSubmit expense claims within 30 days, "
    b"with a photo of every receipt attached.\n\n## VPN\n\nWhen internal sites do not load over the "
    b"VPN, set the DNS server to 10.20.0.53 and reconnect.\n",
    "security.md": b"# Security policy\n\n## API keys\n\nProduction API keys are rotated every 90 days "
    b"by the platform team.\n\n## Laptops\n\nLaptops use full-disk encryption and lock after five "
    b"minutes idle.\n",
}
QUESTIONS = [
    "How long do I have to submit an expense claim?",
    "What DNS server should I use on the VPN?",
    "How often are API keys rotated?",
    "What is the capital of Australia?",  # refused: exercises the no-model path
]
REFUSED = {QUESTIONS[3]}
# About 60 words, as a short answer of a real model is.
MODEL_ANSWER = (
    "Expense claims are due within 30 days of the purchase [1]. Attach a photo of every "
    "receipt to the claim; a claim without one goes back to you [1]. Conference tickets "
    "need your manager's approval email before you buy them, so ask early. When in doubt, "
    "submit what you have and add the missing receipts later within the same 30 days [1]."
)


class TimedSlackAPI(MockSlackAPI):
    """The mock Slack, also noting when each call arrived (``time.perf_counter``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.stamps: list[tuple[float, str, dict[str, Any]]] = []

    async def _record(self, method: str, params: dict[str, Any], error: str | None) -> None:
        if error is None:
            self.stamps.append((time.perf_counter(), method, params))
        await super()._record(method, params, error)


def answers(slack: MockSlackAPI) -> list[dict[str, Any]]:
    """The answers (and error notices) the bot showed so far, as their calls; progress is not one."""
    return [params for _, params in _answer_calls(slack)]


def _answer_calls(slack: MockSlackAPI) -> list[tuple[str, dict[str, Any]]]:
    return [
        (method, params)
        for method, params in slack.log
        if method in {"chat.postMessage", "chat.update"} and _is_final(params)
    ]


def _is_final(params: dict[str, Any]) -> bool:
    return (
        FEEDBACK_ACTION_ID in json.dumps(params.get("blocks", []))
        or params.get("text") == messages.ERROR_GENERIC
    )


async def wait_for_answers(slack: MockSlackAPI, count: int, timeout: float) -> list[dict[str, Any]]:
    """Wait until ``count`` answers were shown; all of them, oldest first."""
    deadline = time.monotonic() + timeout
    while len(shown := answers(slack)) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{len(shown)} of {count} answers after {timeout} s")
        await asyncio.sleep(0.01)
    return shown


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100)."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


async def post(session: aiohttp.ClientSession, url: str, body: bytes) -> float:
    """POST a signed Slack body; return how long the acknowledgement took, in ms."""
    started = time.perf_counter()
    async with session.post(
        url, data=body, headers=slack_headers(DEFAULT_SIGNING_SECRET, body)
    ) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"the endpoint answered HTTP {resp.status}")
    return (time.perf_counter() - started) * 1000


@dataclass
class Sent:
    """One question of a round: its thread, whether the model answers it, when it was sent."""

    thread: str
    model: bool
    at: float
    ack_ms: float = 0.0


@dataclass
class Timings:
    """When each question of a round showed its first words and its finished answer (ms)."""

    first_text: list[float] = field(default_factory=list)
    first_sign: list[float] = field(default_factory=list)
    first_step: list[float] = field(default_factory=list)
    final: list[float] = field(default_factory=list)
    calls_while_writing: list[int] = field(default_factory=list)
    streamed: int = 0


def thread_of(slack: MockSlackAPI, method: str, params: dict[str, Any]) -> str | None:
    """The thread a recorded call showed something in (an edit's, from the message it edited)."""
    if "thread_ts" in params:
        return str(params["thread_ts"])
    message = slack.messages.get((str(params.get("channel", "")), str(params.get("ts", ""))))
    return str(message["thread_ts"]) if message and "thread_ts" in message else None


def timings(slack: TimedSlackAPI, sent: list[Sent]) -> Timings:
    """First text, final answer and the calls in between, for each question of ``sent``."""
    by_thread: dict[str, list[tuple[float, str, dict[str, Any]]]] = {}
    for at, method, params in slack.stamps:
        thread = thread_of(slack, method, params)
        if thread is not None:
            by_thread.setdefault(thread, []).append((at, method, params))
    out = Timings()
    for question in sent:
        calls = by_thread.get(question.thread, [])
        final = next(
            at for at, m, p in calls if m in {"chat.postMessage", "chat.update"} and _is_final(p)
        )
        out.final.append((final - question.at) * 1000)
        out.first_sign.append((min(at for at, m, _ in calls if m in _SIGNS) - question.at) * 1000)
        steps = [at for at, m, p in calls if m == "chat.startStream" and p.get("chunks")]
        if steps:
            out.first_step.append((steps[0] - question.at) * 1000)
        if not question.model:
            continue
        words = [at for at, m, p in calls if _carries_words(m, p)]
        # Past the shared append budget a stream shows no words until the answer itself.
        out.first_text.append((min(words, default=final) - question.at) * 1000)
        out.streamed += any(m == "chat.startStream" for _, m, _ in calls)
        writing = {"chat.appendStream", "chat.update"}
        out.calls_while_writing.append(sum(m in writing and at < final for at, m, _ in calls))
    return out


def _carries_words(method: str, params: dict[str, Any]) -> bool:
    if method in {"chat.startStream", "chat.appendStream"}:
        # A stream an agent session started with its steps gets its words appended.
        return bool(params.get("markdown_text"))
    return method == "chat.postMessage" and params.get("text") != messages.PLACEHOLDER


async def _round(
    session: aiohttp.ClientSession,
    url: str,
    slack: TimedSlackAPI,
    concurrency: int,
    timeout: float,
    *,
    direct: bool = False,
) -> dict[str, float]:
    before = len(answers(slack))
    ask = message_im_event if direct else app_mention_event
    events = [ask(QUESTIONS[i % len(QUESTIONS)]) for i in range(concurrency)]
    sent = [
        Sent(str(e["ts"]), e["text"].split("> ", 1)[-1] not in REFUSED, time.perf_counter())
        for e in events
    ]
    started = time.perf_counter()
    acks = await asyncio.gather(*(post(session, url, event_body(e)) for e in events))
    updates = await wait_for_answers(slack, before + concurrency, timeout)
    answered = (time.perf_counter() - started) * 1000
    await asyncio.sleep(0.05)  # let the last calls of each answer land
    failed = sum(u.get("text") == messages.ERROR_GENERIC for u in updates[before:])
    shown = timings(slack, sent)
    return {
        "failed_answers": failed,
        "ack_p50_ms": statistics.median(acks),
        "ack_p99_ms": percentile(acks, 99),
        "ack_max_ms": max(acks),
        "first_sign_p50_ms": statistics.median(shown.first_sign),
        "first_sign_p95_ms": percentile(shown.first_sign, 95),
        "first_step_p50_ms": statistics.median(shown.first_step) if shown.first_step else math.nan,
        "first_step_p95_ms": percentile(shown.first_step, 95) if shown.first_step else math.nan,
        "first_text_p50_ms": statistics.median(shown.first_text),
        "first_text_p90_ms": percentile(shown.first_text, 90),
        "final_p50_ms": statistics.median(shown.final),
        "final_p90_ms": percentile(shown.final, 90),
        "calls_while_writing": statistics.median(shown.calls_while_writing),
        "streamed_share": shown.streamed / len(shown.first_text),
        "all_answered_ms": answered,
    }


def bench_settings(
    data_dir: Path, slack: MockSlackAPI, llm: OpenAICompatServer, streaming: str = "auto"
) -> Settings:
    streaming = "auto" if streaming.startswith("agent") else streaming
    """The bot's settings against the local Slack and model servers."""
    return Settings.model_validate(
        {
            "KB_DATA_DIR": data_dir,
            "SLACK_BOT_TOKEN": slack.bot_token,
            "SLACK_SIGNING_SECRET": DEFAULT_SIGNING_SECRET,
            "SLACK_API_URL": slack.api_url,
            "OPENAI_BASE_URL": llm.url,
            "OPENAI_API_KEY": llm.api_key or "",
            "KB_LLM_MAX_RETRIES": 0,
            "KB_THRESHOLD": 0.6,
            "KB_SLACK_STREAMING": streaming,
        }
    )


def loaded_kb(settings: Settings, embedder: Embedder | None = None) -> KnowledgeBase:
    """The knowledge base of ``settings`` with the benchmark's documents in it."""
    embedder = embedder or load_embedder(settings.index_config())
    kb = KnowledgeBase(settings.index_config(), embedder=embedder)
    for name, data in DOCUMENTS.items():
        kb.ingest_bytes(data, name, uploader="bench")
    return kb


async def serve(settings: Settings, kb: KnowledgeBase) -> tuple[web.AppRunner, str]:
    """The bot's web server on a free loopback port, and its Slack events URL."""
    runner = web.AppRunner(create_app(settings, kb=kb), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{runner.addresses[0][1]}/slack/events"


async def run(
    rounds: int,
    concurrency: int,
    round_timeout: float,
    *,
    word_ms: float = 20.0,
    first_token_ms: float = 300.0,
) -> dict[str, Any]:
    """Start everything, run the rounds for both modes in turn, return their figures."""
    with tempfile.TemporaryDirectory(prefix="kb-bench-slack-") as tmp:
        async with (
            TimedSlackAPI() as slack,
            TimedSlackAPI() as agent_slack,
            OpenAICompatServer(reply=MODEL_ANSWER) as llm,
        ):
            agent_slack.agent_app = True
            slacks = {"auto": slack, "off": slack, "agent": agent_slack}
            slacks["agent-channel"] = agent_slack
            llm.trickle(word_ms / 1000)
            llm.delay(first_token_ms / 1000)
            embedder: Embedder | None = None
            urls: dict[str, str] = {}
            runners: list[web.AppRunner] = []
            try:
                for mode in MODES:
                    settings = bench_settings(Path(tmp) / mode, slacks[mode], llm, mode)
                    kb = loaded_kb(settings, embedder)
                    embedder = kb.embedder
                    runner, urls[mode] = await serve(settings, kb)
                    runners.append(runner)
                async with aiohttp.ClientSession() as session:
                    # The first request pays for auth.test and lazy imports; the first
                    # burst for growing thread pools and per-thread connections. The
                    # cold burst is reported on its own, the medians are steady state.
                    cold: dict[str, dict[str, float]] = {}
                    for mode in MODES:
                        direct = mode == "agent"
                        await _round(
                            session, urls[mode], slacks[mode], 1, round_timeout, direct=direct
                        )
                        cold[mode] = await _round(
                            session,
                            urls[mode],
                            slacks[mode],
                            concurrency,
                            round_timeout,
                            direct=direct,
                        )
                    # The modes take turns, so a busy moment of the machine hits both.
                    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
                    for _ in range(rounds):
                        for mode in MODES:
                            results[mode].append(
                                await _round(
                                    session,
                                    urls[mode],
                                    slacks[mode],
                                    concurrency,
                                    round_timeout,
                                    direct=mode == "agent",
                                )
                            )
            finally:
                for runner in runners:
                    await runner.cleanup()
    medians = {
        mode: {key: statistics.median(r[key] for r in rs) for key in rs[0]}
        for mode, rs in results.items()
    }
    return {
        "machine": machine(),
        "rounds": rounds,
        "concurrency": concurrency,
        "model": {"first_token_ms": first_token_ms, "word_ms": word_ms},
        "cold_burst": cold,
        "per_round": results,
        "median": medians,
        "target_ack_p99_ms": TARGET_P99_MS,
        "meets_target": medians["auto"]["ack_p99_ms"] < TARGET_P99_MS,
    }


LABELS = {
    "auto": "streaming",
    "off": "post + edit",
    "agent": "agent session + steps",
    "agent-channel": "agent session + steps, channel",
}


def _line(label: str, r: dict[str, float]) -> str:
    return (
        f"  {label:<34} ack p50 {r['ack_p50_ms']:6.1f} p99 {r['ack_p99_ms']:6.1f} ms | "
        f"first sign p50 {r['first_sign_p50_ms']:5.0f} p95 {r['first_sign_p95_ms']:5.0f} ms | "
        f"first step p50 {r['first_step_p50_ms']:5.0f} p95 {r['first_step_p95_ms']:5.0f} ms | "
        f"first text p50 {r['first_text_p50_ms']:6.0f} p90 {r['first_text_p90_ms']:6.0f} ms | "
        f"final p50 {r['final_p50_ms']:6.0f} p90 {r['final_p90_ms']:6.0f} ms | "
        f"{r['calls_while_writing']:.0f} calls while writing, "
        f"{r['streamed_share']:.0%} streamed | "
        f"all after {r['all_answered_ms']:.0f} ms ({r['failed_answers']:.0f} failed)"
    )


def main() -> None:
    """Parse arguments, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="Bursts per mode (default 5).")
    parser.add_argument(
        "--concurrency", type=int, default=20, help="Mentions per burst (default 20)."
    )
    parser.add_argument(
        "--round-timeout", type=float, default=120.0, help="Seconds to wait for a burst's answers."
    )
    parser.add_argument(
        "--word-ms", type=float, default=20.0, help="The model writes a word every N ms (20)."
    )
    parser.add_argument(
        "--first-token-ms",
        type=float,
        default=300.0,
        help="The model starts answering after N ms (300).",
    )
    parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
    args = parser.parse_args()
    report = asyncio.run(
        run(
            args.rounds,
            args.concurrency,
            args.round_timeout,
            word_ms=args.word_ms,
            first_token_ms=args.first_token_ms,
        )
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"machine: {report['machine']}")
    print(
        f"{args.rounds} rounds per mode of {args.concurrency} concurrent signed app_mention "
        f"events; the model starts after {args.first_token_ms:.0f} ms, a word every "
        f"{args.word_ms:.0f} ms"
    )
    for mode in MODES:
        print(_line(f"{LABELS[mode]}, cold", report["cold_burst"][mode]))
        for i, r in enumerate(report["per_round"][mode], 1):
            print(_line(f"{LABELS[mode]}, round {i}", r))
    for mode in MODES:
        print(_line(f"{LABELS[mode]}, median", report["median"][mode]))
    verdict = "meets" if report["meets_target"] else "MISSES"
    print(f"streaming: {verdict} the ack p99 < {TARGET_P99_MS:.0f} ms target")


if __name__ == "__main__":
    main()
