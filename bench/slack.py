"""Ack latency of the Slack HTTP endpoint under bursts of concurrent mentions.

Slack gives an app 3 seconds to acknowledge an event and retries otherwise, so
the endpoint must answer fast even while it is busy answering earlier
questions. This runs the real server (``bot.app.create_app``) on loopback with
a small knowledge base, points its Web API client at the local mock Slack and
its model at a local OpenAI-compatible server, then sends rounds of
``--concurrency`` signed ``app_mention`` events at once and measures:

* ack latency: from sending the request to receiving the HTTP response;
* answer latency: from sending the request to the message with the answer
  (posted, or edited into the message that showed it being written;
  retrieval, the model call and rendering included).

A first burst warms the process up (thread pools, per-thread database
connections) and is reported on its own; medians over the following rounds
are printed with the machine. Target: ack p99 < 300 ms.
The run is bounded: ``--rounds`` x ``--concurrency`` requests, each round
waiting at most ``--round-timeout`` seconds for its answers.

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
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.machine import describe as machine
from bot.app import create_app
from bot.settings import Settings
from bot.slack import messages
from bot.slack.render import FEEDBACK_ACTION_ID
from index.embed import load_embedder
from index.knowledge_base import KnowledgeBase

# The mock Slack and model servers live with the tests, which are not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import (  # noqa: E402
    DEFAULT_SIGNING_SECRET,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    event_body,
    slack_headers,
)

TARGET_P99_MS = 300.0
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


def answers(slack: MockSlackAPI) -> list[dict[str, Any]]:
    """The answers (and error notices) the bot showed so far, as their calls; progress is not one."""
    return [
        params
        for method, params in slack.log
        if method in {"chat.postMessage", "chat.update"}
        and (
            FEEDBACK_ACTION_ID in json.dumps(params.get("blocks", []))
            or params.get("text") == messages.ERROR_GENERIC
        )
    ]


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


async def _round(
    session: aiohttp.ClientSession, url: str, slack: MockSlackAPI, concurrency: int, timeout: float
) -> dict[str, float]:
    before = len(answers(slack))
    bodies = [
        event_body(app_mention_event(QUESTIONS[i % len(QUESTIONS)])) for i in range(concurrency)
    ]
    started = time.perf_counter()
    acks = await asyncio.gather(*(post(session, url, b) for b in bodies))
    updates = await wait_for_answers(slack, before + concurrency, timeout)
    answered = (time.perf_counter() - started) * 1000
    failed = sum(u.get("text") == messages.ERROR_GENERIC for u in updates[before:])
    return {
        "failed_answers": failed,
        "ack_p50_ms": statistics.median(acks),
        "ack_p99_ms": percentile(acks, 99),
        "ack_max_ms": max(acks),
        "all_answered_ms": answered,
    }


def bench_settings(data_dir: Path, slack: MockSlackAPI, llm: OpenAICompatServer) -> Settings:
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
        }
    )


def loaded_kb(settings: Settings) -> KnowledgeBase:
    """The knowledge base of ``settings`` with the benchmark's documents in it."""
    kb = KnowledgeBase(settings.index_config(), embedder=load_embedder(settings.index_config()))
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


async def run(rounds: int, concurrency: int, round_timeout: float) -> dict[str, Any]:
    """Start everything, run the rounds, return the per-round and median figures."""
    with tempfile.TemporaryDirectory(prefix="kb-bench-slack-") as tmp:
        async with (
            MockSlackAPI() as slack,
            OpenAICompatServer(reply="Claims are due within 30 days [1].") as llm,
        ):
            settings = bench_settings(Path(tmp), slack, llm)
            runner, url = await serve(settings, loaded_kb(settings))
            try:
                async with aiohttp.ClientSession() as session:
                    # The first request pays for auth.test and lazy imports; the first
                    # burst for growing thread pools and per-thread connections. The
                    # cold burst is reported on its own, the medians are steady state.
                    await _round(session, url, slack, 1, round_timeout)
                    cold = await _round(session, url, slack, concurrency, round_timeout)
                    results = [
                        await _round(session, url, slack, concurrency, round_timeout)
                        for _ in range(rounds)
                    ]
            finally:
                await runner.cleanup()
    medians = {key: statistics.median(r[key] for r in results) for key in results[0]}
    return {
        "machine": machine(),
        "rounds": rounds,
        "concurrency": concurrency,
        "cold_burst": cold,
        "per_round": results,
        "median": medians,
        "target_ack_p99_ms": TARGET_P99_MS,
        "meets_target": medians["ack_p99_ms"] < TARGET_P99_MS,
    }


def main() -> None:
    """Parse arguments, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="Bursts to send (default 5).")
    parser.add_argument(
        "--concurrency", type=int, default=20, help="Mentions per burst (default 20)."
    )
    parser.add_argument(
        "--round-timeout", type=float, default=120.0, help="Seconds to wait for a burst's answers."
    )
    parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
    args = parser.parse_args()
    report = asyncio.run(run(args.rounds, args.concurrency, args.round_timeout))
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"machine: {report['machine']}")
    print(f"{args.rounds} rounds of {args.concurrency} concurrent signed app_mention events")
    rows = [("cold", report["cold_burst"])] + [
        (f"round {i}", r) for i, r in enumerate(report["per_round"], 1)
    ]
    for label, r in rows:
        print(
            f"  {label}: ack p50 {r['ack_p50_ms']:.1f} ms, p99 {r['ack_p99_ms']:.1f} ms, "
            f"max {r['ack_max_ms']:.1f} ms; all answered after {r['all_answered_ms']:.0f} ms"
            f" ({r['failed_answers']:.0f} failed)"
        )
    m = report["median"]
    verdict = "meets" if report["meets_target"] else "MISSES"
    print(
        f"median: ack p50 {m['ack_p50_ms']:.1f} ms, p99 {m['ack_p99_ms']:.1f} ms "
        f"({verdict} the {TARGET_P99_MS:.0f} ms target); all answered after {m['all_answered_ms']:.0f} ms"
    )


if __name__ == "__main__":
    main()
