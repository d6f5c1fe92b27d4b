"""Questions per second held by 1, 2 and 3 ``kb serve`` replicas on this machine.

Each configuration starts N real ``kb serve`` processes on one store (by
default one SQLite data dir, WAL; ``--database-url`` for a Postgres database
shared by replicas each with its own data dir), pointed at one local mock Slack
and one local OpenAI-compatible server that writes its answer at a model's pace
(``--first-token-ms``, then a word every ``--word-ms``; about 60 words). Then
``--askers`` people ask at once, each the next question as soon as their last
one was answered, for ``--seconds``; their signed ``app_mention`` events go to
the replicas in turn, as a load balancer spreads them. Reported per N:

* questions per second answered over the run (finished answers / seconds);
* ack latency p50/p95 (request sent to the HTTP response);
* answer latency p50/p95 (request sent to the finished answer at the mock Slack);
* every question answered exactly once (one finished answer per thread).

Then, with the largest N, the delay from an upload being indexed (``kb ingest``
through the store, as an operator or another replica commits it) to every other
replica's search index holding it (``/readyz``: ``snapshot_generation`` at the
store's generation), ``--uploads`` times.

On 2 cores expect about the same questions per second for every N: each
replica embeds and searches on the same cores, so replicas buy availability,
not throughput, until they run on machines of their own.

Run: python -m bench.replicas [--replicas 1 2 3] [--askers 8] [--seconds 20] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from bench.machine import describe as machine
from bench.slack import DOCUMENTS, MODEL_ANSWER, QUESTIONS, percentile, thread_of
from bot.slack.blocks import FEEDBACK_ACTION_ID
from index.config import IndexConfig
from index.knowledge_base import KnowledgeBase

# The mock Slack and model servers live with the tests, which are not an installed package.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.servers import (  # noqa: E402
    DEFAULT_SIGNING_SECRET,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    closed_port_url,
    event_body,
    slack_headers,
)

START_TIMEOUT_S = 300.0
ANSWER_TIMEOUT_S = 60.0
UPLOAD = b"# Visitor parking\n\n## Garage\n\nVisitors park on level 3; the gate code is %d.\n"


@dataclass
class Run:
    """What the askers of one configuration saw."""

    acks: list[float] = field(default_factory=list)
    answers: list[float] = field(default_factory=list)
    threads: list[str] = field(default_factory=list)


def _env(
    data_dir: Path, database_url: str, slack: MockSlackAPI, llm: OpenAICompatServer, encoders: Path
) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_", "SLACK_", "OPENAI_"))}
    env.update(
        {
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "KB_DATA_DIR": str(data_dir),
            "KB_DATABASE_URL": database_url,
            "KB_ENCODER_CACHE": str(encoders),
            "SLACK_BOT_TOKEN": slack.bot_token,
            "SLACK_SIGNING_SECRET": DEFAULT_SIGNING_SECRET,
            "SLACK_API_URL": slack.api_url,
            "OPENAI_BASE_URL": llm.url,
            "KB_THRESHOLD": "0.6",
            "KB_SLACK_STREAMING": "off",
            "KB_LLM_MAX_RETRIES": "0",
            "KB_LOG_LEVEL": "WARNING",
        }
    )
    return env


@asynccontextmanager
async def replicas(
    n: int,
    root: Path,
    database_url: str,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
    http: aiohttp.ClientSession,
    encoders: Path,
) -> AsyncIterator[list[str]]:
    """``n`` ready ``kb serve`` processes on the store at ``root``; their base URLs."""
    procs: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for i in range(n):
            data_dir = root / ("kb-data" if not database_url else f"replica-{i}")
            port = int(urlsplit(closed_port_url()).port or 0)  # free right now
            log = (root / f"replica-{n}-{i}.log").open("wb")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bot.cli", "serve", "--port", str(port)],
                    env=_env(data_dir, database_url, slack, llm, encoders),
                    cwd=root,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                )
            )
            urls.append(f"http://127.0.0.1:{port}")
        await asyncio.gather(*(_until_ready(http, u, p) for u, p in zip(urls, procs, strict=True)))
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def _until_ready(
    http: aiohttp.ClientSession, url: str, proc: subprocess.Popen[bytes]
) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the replica at {url} exited with {proc.returncode}")
        try:
            async with http.get(f"{url}/readyz") as resp:
                if resp.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the replica at {url} was not ready after {START_TIMEOUT_S} s")


class Answers:
    """When each thread's finished answer reached the mock Slack (``time.perf_counter``)."""

    def __init__(self, slack: MockSlackAPI) -> None:
        self.slack = slack
        self.at: dict[str, list[float]] = {}
        self._seen = 0

    def scan(self) -> None:
        """Note the finished answers logged since the last scan."""
        log, now = self.slack.log, time.perf_counter()
        for method, params in log[self._seen :]:
            final = method in {"chat.postMessage", "chat.update"} and FEEDBACK_ACTION_ID in (
                json.dumps(params.get("blocks", []))
            )
            thread = thread_of(self.slack, method, params) if final else None
            if thread is not None:
                self.at.setdefault(thread, []).append(now)
        self._seen = len(log)

    async def wait(self, thread: str, timeout: float) -> float:
        """When ``thread`` got its answer."""
        deadline = time.monotonic() + timeout
        while thread not in self.at:
            if time.monotonic() > deadline:
                raise TimeoutError(f"no answer in thread {thread} after {timeout} s")
            await asyncio.sleep(0.01)
            self.scan()
        return self.at[thread][0]


async def _ask(
    http: aiohttp.ClientSession, url: str, question: str, shown: Answers, run: Run
) -> None:
    event = app_mention_event(question)
    body = event_body(event)
    started = time.perf_counter()
    headers = slack_headers(DEFAULT_SIGNING_SECRET, body)
    async with http.post(f"{url}/slack/events", data=body, headers=headers) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"the replica answered HTTP {resp.status}")
    run.acks.append((time.perf_counter() - started) * 1000)
    answered = await shown.wait(str(event["ts"]), ANSWER_TIMEOUT_S)
    run.answers.append((answered - started) * 1000)
    run.threads.append(str(event["ts"]))


async def _load(
    http: aiohttp.ClientSession, urls: list[str], shown: Answers, askers: int, seconds: float
) -> tuple[Run, float]:
    run = Run()
    turn = iter(range(10**9))
    deadline = time.perf_counter() + seconds

    async def asker(k: int) -> None:
        while time.perf_counter() < deadline:
            i = next(turn)
            await _ask(http, urls[i % len(urls)], QUESTIONS[(i + k) % len(QUESTIONS)], shown, run)

    started = time.perf_counter()
    await asyncio.gather(*(asker(k) for k in range(askers)))
    return run, time.perf_counter() - started


async def _upload_delays(
    http: aiohttp.ClientSession, urls: list[str], kb: KnowledgeBase, count: int
) -> list[float]:
    """Seconds from a document indexed in the store to every replica's index holding it."""
    delays = []
    for i in range(count):
        data = UPLOAD % (1000 + i)
        await asyncio.to_thread(kb.ingest_bytes, data, f"parking-{i}.md", uploader="bench")
        committed = time.perf_counter()
        generation = await asyncio.to_thread(lambda: kb.store.generation)
        for url in urls:
            while True:
                async with http.get(f"{url}/readyz") as resp:
                    index = (await resp.json())["index"]
                if (index["snapshot_generation"] or 0) >= generation:
                    break
                await asyncio.sleep(0.01)
        delays.append(time.perf_counter() - committed)
    return delays


async def run(
    counts: list[int],
    askers: int,
    seconds: float,
    uploads: int,
    database_url: str,
    *,
    first_token_ms: float,
    word_ms: float,
) -> dict[str, Any]:
    """Start each configuration in turn, load it, return the figures."""
    results: dict[str, Any] = {}
    delays: list[float] = []
    with tempfile.TemporaryDirectory(prefix="kb-bench-replicas-") as tmp:
        async with (
            MockSlackAPI() as slack,
            OpenAICompatServer(reply=MODEL_ANSWER) as llm,
            aiohttp.ClientSession() as http,
        ):
            llm.delay(first_token_ms / 1000)
            llm.trickle(word_ms / 1000)
            # One export of the model for every replica and configuration (the encoder runtime's cache).
            encoders = Path(os.environ.get("KB_ENCODER_CACHE") or Path(tmp) / "encoders")
            for n in counts:
                root = Path(tmp) / f"n{n}"
                root.mkdir()
                config = IndexConfig(
                    data_dir=root / "kb-data", database_url=database_url, encoder_cache=encoders
                )
                kb = KnowledgeBase(config)
                for name, data in DOCUMENTS.items():
                    kb.ingest_bytes(data, name, uploader="bench")
                async with replicas(n, root, database_url, slack, llm, http, encoders) as urls:
                    shown = Answers(slack)
                    # One question per replica first: auth.test, thread pools, connections.
                    warm = Run()
                    await asyncio.gather(*(_ask(http, u, QUESTIONS[0], shown, warm) for u in urls))
                    done, elapsed = await _load(http, urls, shown, askers, seconds)
                    await asyncio.sleep(1.0)  # a duplicate answer would show by now
                    shown.scan()
                    results[str(n)] = {
                        "questions": len(done.answers),
                        "questions_per_s": len(done.answers) / elapsed,
                        "ack_p50_ms": statistics.median(done.acks),
                        "ack_p95_ms": percentile(done.acks, 95),
                        "answer_p50_ms": statistics.median(done.answers),
                        "answer_p95_ms": percentile(done.answers, 95),
                        "answered_once": all(len(shown.at[t]) == 1 for t in done.threads),
                    }
                    if n == max(counts) and n > 1 and uploads:
                        delays = await _upload_delays(http, urls, kb, uploads)
                kb.store.close()
    return {
        "machine": machine(),
        "store": "postgres" if database_url else "sqlite (one data dir)",
        "askers": askers,
        "seconds": seconds,
        "model": {"first_token_ms": first_token_ms, "word_ms": word_ms},
        "replicas": results,
        "upload_to_all_replicas_s": {
            "replicas": max(counts),
            "median": statistics.median(delays) if delays else None,
            "max": max(delays) if delays else None,
            "runs": delays,
        },
    }


def main() -> None:
    """Parse arguments, run, print."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--replicas", type=int, nargs="+", default=[1, 2, 3], help="Replica counts (1 2 3)."
    )
    parser.add_argument("--askers", type=int, default=8, help="People asking at once (8).")
    parser.add_argument(
        "--seconds", type=float, default=20.0, help="Seconds of load per count (20)."
    )
    parser.add_argument("--uploads", type=int, default=5, help="Uploads timed across replicas (5).")
    parser.add_argument(
        "--database-url", default="", help="A Postgres URL; empty: one SQLite data dir."
    )
    parser.add_argument(
        "--first-token-ms", type=float, default=300.0, help="Model's first token (300)."
    )
    parser.add_argument("--word-ms", type=float, default=20.0, help="Model's pace per word (20).")
    parser.add_argument("--json", action="store_true", help="Print the results as JSON.")
    args = parser.parse_args()
    report = asyncio.run(
        run(
            args.replicas,
            args.askers,
            args.seconds,
            args.uploads,
            args.database_url,
            first_token_ms=args.first_token_ms,
            word_ms=args.word_ms,
        )
    )
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"machine: {report['machine']}")
    print(
        f"store: {report['store']}; {report['askers']} askers for {report['seconds']:.0f} s per "
        f"count; model: first token {args.first_token_ms:.0f} ms, a word every {args.word_ms:.0f} ms"
    )
    for n, r in report["replicas"].items():
        once = "each answered once" if r["answered_once"] else "NOT each answered once"
        print(
            f"  {n} replica(s): {r['questions_per_s']:5.2f} questions/s ({r['questions']}) | "
            f"ack p50 {r['ack_p50_ms']:6.1f} p95 {r['ack_p95_ms']:6.1f} ms | "
            f"answer p50 {r['answer_p50_ms']:6.0f} p95 {r['answer_p95_ms']:6.0f} ms | {once}"
        )
    up = report["upload_to_all_replicas_s"]
    if up["median"] is not None:
        print(
            f"upload indexed -> in every one of {up['replicas']} replicas' indexes: "
            f"median {up['median']:.2f} s, max {up['max']:.2f} s over {len(up['runs'])} uploads"
        )


if __name__ == "__main__":
    main()
