"""Slack acknowledgement latency while another process holds the database's write lock.

Slack gives an app 3 seconds to acknowledge an event and redelivers it
otherwise. A second process writing to the same SQLite database (``kb ingest``,
``kb reindex``, another replica) holds the write lock for as long as its
transaction lasts; nothing on the acknowledgement path may wait for it.

This runs the real server (``bot.app.create_app``) on loopback against the
local mock Slack and OpenAI-compatible servers, starts a second process that
takes the write lock (``BEGIN IMMEDIATE``) for ``--hold`` seconds, releases it
for ``--gap`` seconds, and again, and meanwhile sends ``--events`` signed
``app_mention`` events at a steady ``--rate`` per second. It reports ack
latency p50/p99/max (request sent to HTTP response), how many acks took over
Slack's 3 s, and whether every question was answered exactly once. With
``--no-writer`` the same run has no competing process.

Run: python -m bench.ack [--events 60] [--rate 5] [--hold 2] [--gap 0.5] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.machine import describe as machine
from bench.slack import (
    QUESTIONS,
    bench_settings,
    loaded_kb,
    percentile,
    post,
    serve,
    wait_for_answers,
)

# The mock Slack and model servers live with the tests, which are not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import (  # noqa: E402
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    event_body,
)

SLACK_LIMIT_MS = 3000.0
# Holds the write lock in turns until killed; says when it first has it.
_WRITER = """
import sqlite3, sys, time
conn = sqlite3.connect(sys.argv[1], timeout=60, isolation_level=None)
hold, gap = float(sys.argv[2]), float(sys.argv[3])
first = True
while True:
    conn.execute("BEGIN IMMEDIATE")
    if first:
        print("locked", flush=True)
        first = False
    time.sleep(hold)
    conn.execute("COMMIT")
    time.sleep(gap)
"""


async def _send_at_rate(
    session: aiohttp.ClientSession, url: str, events: int, rate: float
) -> list[float]:
    """Send ``events`` mentions, one every ``1/rate`` s whatever the acks do; their ack times."""
    tasks = []
    for i in range(events):
        body = event_body(app_mention_event(QUESTIONS[i % len(QUESTIONS)]))
        tasks.append(asyncio.create_task(post(session, url, body)))
        await asyncio.sleep(1 / rate)
    return list(await asyncio.gather(*tasks))


def _start_writer(db: Path, hold: float, gap: float) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(db), str(hold), str(gap)],
        stdout=subprocess.PIPE,
        text=True,
    )
    if proc.stdout is None or proc.stdout.readline().strip() != "locked":
        proc.kill()
        raise RuntimeError("the competing writer could not take the write lock")
    return proc


async def run(
    events: int, rate: float, hold: float, gap: float, writer: bool, answer_timeout: float
) -> dict[str, Any]:
    """Start everything, send the events beside the writer, return the figures."""
    with tempfile.TemporaryDirectory(prefix="kb-bench-ack-") as tmp:
        async with (
            MockSlackAPI() as slack,
            OpenAICompatServer(reply="Claims are due within 30 days [1].") as llm,
        ):
            settings = bench_settings(Path(tmp), slack, llm)
            kb = loaded_kb(settings)
            runner, url = await serve(settings, kb)
            proc = None
            try:
                async with aiohttp.ClientSession() as session:
                    # Warm up (auth.test, thread pools) before the lock is taken.
                    await post(session, url, event_body(app_mention_event(QUESTIONS[0])))
                    await wait_for_answers(slack, 1, answer_timeout)
                    proc = _start_writer(kb.store.path, hold, gap) if writer else None
                    started = time.perf_counter()
                    acks = await _send_at_rate(session, url, events, rate)
                    await wait_for_answers(slack, events + 1, answer_timeout)
                    answered = (time.perf_counter() - started) * 1000
                    placeholders = len(slack.calls("chat.postMessage")) - 1
            finally:
                if proc is not None:
                    proc.kill()
                    proc.wait()
                await runner.cleanup()
    return {
        "machine": machine(),
        "writer": {"hold_s": hold, "gap_s": gap} if writer else None,
        "events": events,
        "rate_per_s": rate,
        "ack_p50_ms": statistics.median(acks),
        "ack_p99_ms": percentile(acks, 99),
        "ack_max_ms": max(acks),
        "acks_over_3s": sum(a > SLACK_LIMIT_MS for a in acks),
        "answered_once": placeholders == events,
        "all_answered_ms": answered,
    }


def main() -> None:
    """Parse arguments, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=60, help="Mentions to send (default 60).")
    parser.add_argument("--rate", type=float, default=5.0, help="Mentions per second (default 5).")
    parser.add_argument(
        "--hold", type=float, default=2.0, help="Seconds the writer holds the lock."
    )
    parser.add_argument("--gap", type=float, default=0.5, help="Seconds between two holds.")
    parser.add_argument("--no-writer", action="store_true", help="No competing process.")
    parser.add_argument(
        "--answer-timeout", type=float, default=180.0, help="Seconds to wait for all answers."
    )
    parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
    args = parser.parse_args()
    report = asyncio.run(
        run(args.events, args.rate, args.hold, args.gap, not args.no_writer, args.answer_timeout)
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"machine: {report['machine']}")
    writer = report["writer"]
    beside = (
        f"a writer holding the lock {writer['hold_s']} s every {writer['hold_s'] + writer['gap_s']} s"
        if writer
        else "no competing writer"
    )
    print(f"{report['events']} signed app_mention events at {report['rate_per_s']}/s, {beside}")
    print(
        f"ack p50 {report['ack_p50_ms']:.1f} ms, p99 {report['ack_p99_ms']:.1f} ms, "
        f"max {report['ack_max_ms']:.1f} ms; {report['acks_over_3s']} over Slack's 3 s"
    )
    once = "each answered once" if report["answered_once"] else "NOT each answered once"
    print(f"{once}; all answered after {report['all_answered_ms']:.0f} ms")


if __name__ == "__main__":
    main()
