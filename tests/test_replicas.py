"""Three real ``kb serve`` processes sharing one store answer as one bot.

Each replica is its own process (``python -m bot.cli serve``), on one store: a
shared data dir (SQLite in WAL mode, the single-machine way to run replicas),
then a real PostgreSQL server (``tests.postgres``) with a data dir per replica
for its derived index files. They talk to the local mock Slack Web API and
OpenAI-compatible server of ``tests/servers.py``.
Signed Slack events go to any replica, and Slack's redeliveries
(``X-Slack-Retry-Num``) of the same event to the others, as a load balancer in
front of the replicas spreads them. What is checked is what the people in Slack
see: one answer per question, an upload through one replica answered by
another, a replica killed mid-answer while the others keep answering.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from bot.slack.blocks import FEEDBACK_ACTION_ID
from bot.slack.deliveries import Deliveries
from index.config import IndexConfig
from index.embed import Embedder
from index.errors import DocumentNotFound
from index.knowledge_base import KnowledgeBase
from index.records import DocumentRow
from index.storage import APPROVAL, STATUS, PostedMessage, Upload
from index.storage.store import Store

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.clocks import FakeTime  # noqa: E402
from tests.conftest_bot import (  # noqa: E402
    HANDBOOK,
    IN_DOMAIN,
    SECURITY,
    THRESHOLD,
    default_reply,
)
from tests.postgres import create_database  # noqa: E402
from tests.replicas import Replica, replica_env, start_replica, until_ready  # noqa: E402
from tests.servers import (  # noqa: E402
    DEFAULT_OPENAI_API_KEY,
    DEFAULT_SIGNING_SECRET,
    MockSlackAPI,
    OpenAICompatServer,
    app_mention_event,
    event_body,
    file_share_event,
    slack_headers,
)

# The replicas start once per store for the tests that share them.
on_cluster = pytest.mark.asyncio(loop_scope="module")

REPLICAS = 3
SYNC_SECONDS = 0.25
# Short, so that a killed replica's claim lapses within the test (15 s by default).
CLAIM_LEASE_S = 2.0
REPLICA_SETTINGS = {
    "KB_THRESHOLD": str(THRESHOLD),
    "KB_SYNC_SECONDS": str(SYNC_SECONDS),
    "KB_SLACK_STREAMING": "off",
    "KB_LLM_MAX_RETRIES": "0",
    "KB_SLACK_CLAIM_LEASE": str(CLAIM_LEASE_S),
    # One person asks every question at once, and none waits for their own: each thread
    # then holds the answer alone (a question waiting is told so: test_fair_questions.py).
    "KB_MAX_QUESTIONS_PER_USER": "10",
}
# KB_SYNC_SECONDS plus one incremental refresh of a few chunks (docs/benchmarks.md), with
# room for a 2-core machine running three replicas and other tests.
FOLLOW_BOUND_S = 3.0
ANSWER_TIMEOUT_S = 20.0
# How long a duplicate answer gets to show up after the expected ones did.
SETTLE_S = 1.0
PARKING = b"""# Visitor parking

## Garage

Visitors park on level 3 of the garage behind the office; the gate code is 4711.
"""
PARKING_Q = "Where do visitors park their car, and what is the gate code?"
QUESTIONS = [
    IN_DOMAIN,
    "What DNS server should I use on the VPN?",
    "How often are production API keys rotated?",
    "Do laptops need full-disk encryption?",
    "What does a conference ticket need?",
    "When do laptops lock?",
]


@dataclass
class Cluster:
    """The replicas, the servers they talk to, and the store they share."""

    replicas: list[Replica]
    slack: MockSlackAPI
    llm: OpenAICompatServer
    config: IndexConfig  # the store's, as a process beside the replicas opens it
    http: aiohttp.ClientSession

    @property
    def live(self) -> list[Replica]:
        return [r for r in self.replicas if r.proc.poll() is None]

    async def deliver(self, replica: Replica, body: bytes, retry: int | None = None) -> int:
        """POST a signed Slack body to ``replica`` (``retry``: Slack's redelivery number)."""
        headers = slack_headers(DEFAULT_SIGNING_SECRET, body, retry_num=retry)
        async with self.http.post(replica.events, data=body, headers=headers) as resp:
            await resp.read()
            return resp.status

    async def readiness(self, replica: Replica) -> tuple[int, dict[str, Any]]:
        async with self.http.get(f"{replica.url}/readyz") as resp:
            return resp.status, await resp.json()


@pytest_asyncio.fixture(scope="module", loop_scope="module", params=["sqlite", "postgres"])
async def cluster(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, embedder: Embedder
) -> AsyncIterator[Cluster]:
    """Three replicas on one store holding the handbook and the security policy."""
    root = tmp_path_factory.mktemp(f"replicas-{request.param}")
    database_url = ""
    if request.param == "postgres":
        database_url = create_database(request.getfixturevalue("postgres_server"))
    config = IndexConfig(data_dir=root / "observer", database_url=database_url)
    kb = KnowledgeBase(config, embedder=embedder)
    for name, data in (("handbook.md", HANDBOOK), ("security.md", SECURITY)):
        kb.ingest_bytes(data, name, uploader="fixture")
    kb.store.close()
    async with (
        MockSlackAPI() as slack,
        OpenAICompatServer(reply=default_reply, api_key=DEFAULT_OPENAI_API_KEY) as llm,
        aiohttp.ClientSession() as http,
    ):
        replicas = []
        for name in ("replica-a", "replica-b", "replica-c"):
            # SQLite: the one data dir is the store. Postgres: each its own, as on its own machine.
            data_dir = config.data_dir if not database_url else root / name
            env = replica_env(data_dir, database_url, slack, llm, REPLICA_SETTINGS)
            replicas.append(start_replica(name, env, root))
        cluster = Cluster(replicas, slack, llm, config, http)
        try:
            await asyncio.gather(*(until_ready(r, http) for r in replicas))
            yield cluster
        finally:
            for replica in replicas:
                if replica.proc.poll() is None:
                    replica.proc.terminate()
            for replica in replicas:
                try:
                    replica.proc.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    replica.proc.kill()
                    replica.proc.wait()


# ------------------------------------------------------------------ what Slack saw


def _thread_of(slack: MockSlackAPI, params: dict[str, Any]) -> str | None:
    if "thread_ts" in params:
        return str(params["thread_ts"])
    message = slack.messages.get((str(params.get("channel", "")), str(params.get("ts", ""))))
    return str(message["thread_ts"]) if message and "thread_ts" in message else None


def _answers_per_thread(slack: MockSlackAPI) -> Counter[str]:
    """Finished answers (the message with feedback buttons) shown in each thread."""
    shown: Counter[str] = Counter()
    for method, params in slack.log:
        if method in {"chat.postMessage", "chat.update"} and FEEDBACK_ACTION_ID in json.dumps(
            params.get("blocks", [])
        ):
            thread = _thread_of(slack, params)
            if thread is not None:
                shown[thread] += 1
    return shown


def _posts_per_thread(slack: MockSlackAPI) -> Counter[str]:
    """New messages the bot posted in each thread (a second answerer posts its own)."""
    return Counter(
        str(p["thread_ts"]) for m, p in slack.log if m == "chat.postMessage" and "thread_ts" in p
    )


def _model_calls(llm: OpenAICompatServer, question: str) -> int:
    return sum(question in json.dumps(r.get("messages", [])) for r in llm.requests)


def _document(store: Store, name: str) -> DocumentRow | None:
    try:
        return store.find_document(name)
    except DocumentNotFound:
        return None


async def _answered(cluster: Cluster, threads: list[str]) -> None:
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while not all(_answers_per_thread(cluster.slack)[t] for t in threads):
        assert time.monotonic() < deadline, f"unanswered threads after {ANSWER_TIMEOUT_S} s"
        await asyncio.sleep(0.05)
    await asyncio.sleep(SETTLE_S)


# ------------------------------------------------------------------ tests


@on_cluster
async def test_every_replica_reports_the_shared_store_and_its_lag(cluster: Cluster) -> None:
    generations = set()
    for replica in cluster.replicas:
        status, ready = await cluster.readiness(replica)
        assert status == 200, ready
        kind = "postgresql" if cluster.config.database_url else "sqlite"
        assert ready["store"]["kind"] == kind and ready["store"]["reachable"] is True
        assert ready["engine"] == "local"
        assert ready["index"]["lag"] == 0
        generations.add(ready["store"]["generation"])
    assert len(generations) == 1 and generations.pop() > 0


@on_cluster
async def test_events_spread_with_retries_are_answered_exactly_once(cluster: Cluster) -> None:
    replicas = cluster.live
    events = [app_mention_event(q) for q in QUESTIONS]
    deliveries = []
    for i, event in enumerate(events):
        body = event_body(event)
        # The first delivery and Slack's two redeliveries, each to another replica, at once.
        for retry in range(REPLICAS):
            target = replicas[(i + retry) % len(replicas)]
            deliveries.append(cluster.deliver(target, body, retry or None))
    statuses = await asyncio.gather(*deliveries)
    assert set(statuses) == {200}

    threads = [str(e["ts"]) for e in events]
    await _answered(cluster, threads)
    answers, posts = _answers_per_thread(cluster.slack), _posts_per_thread(cluster.slack)
    assert [answers[t] for t in threads] == [1] * len(threads)
    assert [posts[t] for t in threads] == [1] * len(threads)
    # The model was asked once for each question the gate let through, never twice.
    calls = [_model_calls(cluster.llm, q) for q in QUESTIONS]
    assert max(calls) == 1 and sum(calls) >= len(QUESTIONS) // 2, calls


@on_cluster
async def test_an_upload_through_one_replica_is_answered_by_another(cluster: Cluster) -> None:
    uploader, asker = cluster.live[0], cluster.live[1]
    file = cluster.slack.add_file("F0PARKING1", "parking.md", PARKING, "text/markdown")
    assert await cluster.deliver(uploader, event_body(file_share_event([file]))) == 200

    store = Store(cluster.config.data_dir, database_url=cluster.config.database_url)
    deadline = time.monotonic() + ANSWER_TIMEOUT_S
    while (doc := _document(store, "parking.md")) is None or doc.state != "indexed":
        assert time.monotonic() < deadline, "the upload was not indexed"
        await asyncio.sleep(0.05)
    indexed_at, generation = time.monotonic(), store.generation
    store.close()
    while (await cluster.readiness(asker))[1]["index"]["snapshot_generation"] < generation:
        await asyncio.sleep(0.02)
    followed = time.monotonic() - indexed_at
    assert followed < FOLLOW_BOUND_S

    event = app_mention_event(PARKING_Q)
    assert await cluster.deliver(asker, event_body(event)) == 200
    await _answered(cluster, [str(event["ts"])])
    answer = next(
        p
        for m, p in cluster.slack.log
        if m in {"chat.postMessage", "chat.update"}
        and _thread_of(cluster.slack, p) == event["ts"]
        and FEEDBACK_ACTION_ID in json.dumps(p.get("blocks", []))
    )
    assert "parking" in json.dumps(answer["blocks"]).lower()


@on_cluster
async def test_a_replica_killed_mid_answer_leaves_the_others_answering(cluster: Cluster) -> None:
    *survivors, victim = cluster.live
    event = app_mention_event(IN_DOMAIN)
    body, thread = event_body(event), str(event["ts"])
    cluster.llm.delay(30)  # the model is slow: the victim is mid-answer when it dies
    try:
        before = len(cluster.llm.requests)
        assert await cluster.deliver(victim, body) == 200
        await cluster.llm.wait_for_requests(before + 1, timeout=ANSWER_TIMEOUT_S)
        victim.proc.send_signal(signal.SIGKILL)
        victim.proc.wait(timeout=10)
        killed_at = time.monotonic()
    finally:
        cluster.llm.delay(0)

    # Slack's redelivery while the victim's claim still holds is dropped as a duplicate.
    assert await cluster.deliver(survivors[0], body, retry=1) == 200
    # The others keep answering new questions.
    fresh = [app_mention_event(q) for q in QUESTIONS[:2]]
    for replica, e in zip(survivors, fresh, strict=True):
        assert await cluster.deliver(replica, event_body(e)) == 200
    await _answered(cluster, [str(e["ts"]) for e in fresh])
    assert _answers_per_thread(cluster.slack)[thread] == 0

    # Nobody renews the dead replica's claim: once it lapsed, the next redelivery (to the
    # replica that dropped the first one) is answered, once.
    await asyncio.sleep(max(0.0, killed_at + CLAIM_LEASE_S - time.monotonic()))
    assert await cluster.deliver(survivors[0], body, retry=2) == 200
    await _answered(cluster, [thread])
    assert _answers_per_thread(cluster.slack)[thread] == 1


# ------------------------------------------------------------------ the claim itself

KEYS = ["event:Ev1", "msg:app_mention:m1"]
LEASE = 0.8  # seconds, on the tests' own clock: the steps below decide what has lapsed
# Each Store is its own connection, as each replica's is; on SQLite they share one data dir.
# They read one clock, as replicas read one time of day.


def _stores(tmp_path: Path, database_url: str, fake: FakeTime, count: int = 2) -> list[Store]:
    return [
        Store(tmp_path / "kb", database_url=database_url, clock=fake.clock) for _ in range(count)
    ]


def test_a_claim_is_held_while_renewed_and_taken_over_once_it_lapses(
    tmp_path: Path, database_url: str
) -> None:
    fake = FakeTime()
    holder, other = _stores(tmp_path, database_url, fake)
    assert holder.deliveries.claim(KEYS, lease_seconds=LEASE)
    assert not other.deliveries.claim(KEYS, lease_seconds=LEASE)
    fake.now += LEASE * 0.5
    holder.deliveries.renew(KEYS)
    fake.now += LEASE * 0.75  # past the lease from the claim, not from the renewal
    assert not other.deliveries.claim(KEYS, lease_seconds=LEASE)
    fake.now += LEASE * 0.5  # nobody renewed: the holder is gone
    assert other.deliveries.claim(KEYS, lease_seconds=LEASE)
    assert not holder.deliveries.claim(KEYS, lease_seconds=LEASE)


def test_an_answered_delivery_is_never_claimed_again(tmp_path: Path, database_url: str) -> None:
    fake = FakeTime()
    holder, other = _stores(tmp_path, database_url, fake)
    assert holder.deliveries.claim(KEYS, lease_seconds=LEASE)
    holder.deliveries.finish(KEYS)
    fake.now += LEASE * 1.5
    assert not other.deliveries.claim(KEYS, lease_seconds=LEASE)
    # Nor under another of its keys (the message's, delivered as another event).
    assert not other.deliveries.claim(["event:Ev2", KEYS[1]], lease_seconds=LEASE)


def test_of_replicas_taking_over_a_lapsed_claim_at_once_exactly_one_wins(
    tmp_path: Path, database_url: str
) -> None:
    fake = FakeTime()
    (holder,) = _stores(tmp_path, database_url, fake, 1)
    holder.deliveries.claim(KEYS, lease_seconds=LEASE)
    fake.now += LEASE * 1.2
    stores = _stores(tmp_path, database_url, fake, 6)
    start = threading.Barrier(len(stores))

    def claim(store: Store) -> bool:
        start.wait()
        # Some see the keys in the other order, as two event types of one message would.
        keys = KEYS if stores.index(store) % 2 else KEYS[::-1]
        return store.deliveries.claim(keys, lease_seconds=LEASE)

    with ThreadPoolExecutor(len(stores)) as pool:
        won = list(pool.map(claim, stores))
    assert won.count(True) == 1, won


async def test_a_claim_is_renewed_while_its_task_runs_and_answered_when_it_ends(
    tmp_path: Path, database_url: str
) -> None:
    fake = FakeTime()
    store, other = _stores(tmp_path, database_url, fake)
    answered = asyncio.Event()
    with ThreadPoolExecutor(2) as pool:
        deliveries = Deliveries(store, pool, lease_seconds=LEASE, sleep=fake.sleep)

        async def answer() -> bool:
            won = await deliveries.claim(list(KEYS))
            await answered.wait()  # a slow answer: three leases long (below)
            return won is not None

        task = asyncio.create_task(answer())
        await fake.sleeping(1)  # claimed: its renewal waits for its first turn
        await fake.advance(LEASE * 2)  # renewed every third of the lease meanwhile
        assert not await asyncio.to_thread(other.deliveries.claim, KEYS, lease_seconds=LEASE)
        await fake.advance(LEASE)
        answered.set()
        assert await task
    # The answered mark is written after the task ends, by the pool the block waited for.
    fake.now += LEASE * 1.5
    assert not other.deliveries.claim(KEYS, lease_seconds=LEASE)


def test_a_holder_whose_claim_was_taken_over_neither_renews_nor_answers_it(
    tmp_path: Path, database_url: str
) -> None:
    fake = FakeTime()
    stalled, other = _stores(tmp_path, database_url, fake)
    assert stalled.deliveries.claim(KEYS, lease_seconds=LEASE, holder="a")
    assert stalled.deliveries.renew(KEYS, "a")
    fake.now += LEASE * 1.2  # its holder stalled past the lease
    assert other.deliveries.claim(KEYS, lease_seconds=LEASE, holder="b")
    assert not stalled.deliveries.renew(KEYS, "a")
    assert not stalled.deliveries.finish(KEYS, "a")
    fake.now += LEASE * 0.5  # neither the renewal nor the finish gave it back to "a"
    assert not stalled.deliveries.claim(KEYS, lease_seconds=LEASE, holder="c")
    assert other.deliveries.finish(KEYS, "b")
    fake.now += LEASE * 2
    assert not stalled.deliveries.claim(KEYS, lease_seconds=LEASE, holder="c")


def test_a_claim_let_go_by_its_holder_is_taken_at_once(tmp_path: Path, database_url: str) -> None:
    fake = FakeTime()
    holder, other = _stores(tmp_path, database_url, fake)
    assert holder.deliveries.claim(KEYS, lease_seconds=LEASE, holder="a")
    other.deliveries.release(KEYS, "b")  # not its claim: nothing changes
    assert not other.deliveries.claim(KEYS, lease_seconds=LEASE, holder="b")
    holder.deliveries.release(KEYS, "a")  # a replica shutting down mid-upload
    assert other.deliveries.claim(KEYS, lease_seconds=LEASE, holder="b")
    assert not holder.deliveries.renew(KEYS, "a")


def test_an_uploads_files_are_recorded_once_and_offered_for_takeover_once_its_claim_lapsed(
    tmp_path: Path, database_url: str
) -> None:
    fake = FakeTime()
    first, second = _stores(tmp_path, database_url, fake)
    keys = ["event:Ev9"]
    assert first.deliveries.claim(keys, lease_seconds=LEASE, holder="a")
    one, two = first.uploads.record(keys, [("F1", {"n": 1}), ("F2", {"n": 2})])
    first.uploads.set_status(one, "D1", "1.000100")
    first.uploads.set_document(one, 7)
    assert first.uploads.started(one) == 1
    fake.now += LEASE * 0.5
    assert first.deliveries.renew(keys, "a")
    fake.now += LEASE * 0.75
    assert second.uploads.lapsed(lease_seconds=LEASE) == [], "renewed: its holder is alive"
    fake.now += LEASE * 0.5  # its holder died
    assert second.uploads.lapsed(lease_seconds=LEASE) == [tuple(keys)]

    # Taking it over records nothing new: the first holder's files, with their steps.
    assert second.deliveries.claim(keys, lease_seconds=LEASE, holder="b")
    assert second.uploads.record(keys, [("F1", {"n": 99}), ("F2", {"n": 99})]) == [
        Upload("event:Ev9", "F1", ("event:Ev9",), {"n": 1}, "D1", "1.000100", 7, attempts=1),
        Upload("event:Ev9", "F2", ("event:Ev9",), {"n": 2}),
    ]
    assert second.uploads.lapsed(lease_seconds=LEASE) == []
    assert second.uploads.started(one) == 2
    second.uploads.settle(one)
    fake.now += LEASE * 2  # "b" died too, with one file done
    assert first.uploads.lapsed(lease_seconds=LEASE) == [tuple(keys)]
    assert [u.done for u in first.uploads.of(keys)] == [True, False]
    first.uploads.settle(two)
    assert first.uploads.lapsed(lease_seconds=LEASE) == [], "every file done: nothing to take"


# ------------------------------------------------------------------ shared by every replica


def test_a_sign_in_state_used_on_one_replica_is_refused_by_every_other(
    tmp_path: Path, database_url: str
) -> None:
    fake = FakeTime()
    first, second = _stores(tmp_path, database_url, fake)
    assert first.used_states.claim("state-a", ttl_seconds=600)
    assert not second.used_states.claim("state-a", ttl_seconds=600)  # the replay, elsewhere
    assert not first.used_states.claim("state-a", ttl_seconds=600)
    assert second.used_states.claim("state-b", ttl_seconds=600)
    fake.now += 599
    assert not second.used_states.claim("state-a", ttl_seconds=600)
    # Past its lifetime the state's cookie is refused for its age: its claim is dropped.
    fake.now += 2
    assert first.used_states.claim("state-c", ttl_seconds=600)
    assert first.used_states.count() == 1 and second.used_states.count() == 1


def test_every_copy_of_a_documents_messages_is_known_to_every_replica(
    tmp_path: Path, database_url: str
) -> None:
    fake = FakeTime()
    first, second = _stores(tmp_path, database_url, fake)
    first.messages.record(7, APPROVAL, "D0ADMIN001", "1.000100")
    fake.now += 1
    first.messages.record(7, APPROVAL, "D0ADMIN002", "1.000200")
    first.messages.record(7, STATUS, "D0USER0001", "1.000050")
    assert second.messages.of(7, APPROVAL) == [
        PostedMessage("D0ADMIN001", "1.000100"),
        PostedMessage("D0ADMIN002", "1.000200"),
    ]
    assert second.messages.is_of(7, STATUS, "D0USER0001", "1.000050")
    assert not second.messages.is_of(8, STATUS, "D0USER0001", "1.000050")
    assert not second.messages.is_of(7, APPROVAL, "D0USER0001", "1.000050")
