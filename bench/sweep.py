"""What each replica pays to look for uploads a dead replica left, beside what it pays to follow.

Every replica looks for uploads whose claim nobody renews every
``KB_UPLOAD_SWEEP_SECONDS`` (``store.uploads.lapsed``), and renews the claim of
each upload it works on every third of ``KB_SLACK_CLAIM_LEASE``
(``store.deliveries.renew``). Beside them, in the same run, the read every
replica already makes every ``KB_SYNC_SECONDS`` to follow the store
(``store.generation``). The store holds what an hour of a busy workspace
leaves: ``--deliveries`` claimed events (each with its answered mark),
``--done`` finished uploads and ``--open`` uploads in progress, a few of them
with a lapsed claim.

Run: python -m bench.sweep [--deliveries 20000] [--done 1000] [--open 20] [--rounds 2000]
     [--database-url postgresql://...]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.machine import describe as machine
from index.storage import Store

LEASE_S = 15.0


def _fill(store: Store, deliveries: int, done: int, open_: int) -> None:
    """An hour of events and uploads; one in five open uploads was left by a dead replica."""
    now = time.time()
    with store.transaction() as db:
        for i in range(deliveries):
            at = now - 3600 * i / deliveries
            db.execute(
                "INSERT INTO deliveries (key, seen_at, holder) VALUES (?, ?, ?)",
                [f"event:Ev{i:08d}", at, "h"],
            )
            db.execute(
                "INSERT INTO deliveries (key, seen_at) VALUES (?, ?)",
                [f"answered:event:Ev{i:08d}", at],
            )
    for i in range(done + open_):
        keys = [f"upload:{i:08d}"]
        store.deliveries.claim(keys, lease_seconds=LEASE_S, holder=f"h{i}")
        [upload] = store.uploads.record(keys, [(f"F{i:08d}", {"file": {"id": f"F{i:08d}"}})])
        if i < done:
            store.uploads.settle(upload)
        elif i % 5 == 0:
            store.deliveries.release(keys, f"h{i}")


def _median_us(call: Callable[[], object], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e6)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--deliveries", type=int, default=20_000)
    parser.add_argument("--done", type=int, default=1000)
    parser.add_argument("--open", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=2000)
    parser.add_argument("--database-url", default="")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "kb", database_url=args.database_url)
        _fill(store, args.deliveries, args.done, args.open)
        lapsed = store.uploads.lapsed(lease_seconds=LEASE_S)
        held = [f"upload:{args.done + 1:08d}"]
        holder = f"h{args.done + 1}"
        results = {
            "follow read (store.generation) us": _median_us(lambda: store.generation, args.rounds),
            "sweep (uploads.lapsed) us": _median_us(
                lambda: store.uploads.lapsed(lease_seconds=LEASE_S), args.rounds
            ),
            "renewal (deliveries.renew) us": _median_us(
                lambda: store.deliveries.renew(held, holder), args.rounds
            ),
        }
        store.close()
    follow = results["follow read (store.generation) us"]
    report = {
        "machine": machine(),
        "database": "postgresql" if args.database_url else "sqlite",
        "rows": {"deliveries": 2 * args.deliveries, "uploads": args.done + args.open},
        "lapsed uploads found": len(lapsed),
        **{k: round(v, 1) for k, v in results.items()},
        "sweep / follow read": round(results["sweep (uploads.lapsed) us"] / follow, 2),
        "renewal / follow read": round(results["renewal (deliveries.renew) us"] / follow, 2),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    for key, value in report.items():
        print(f"{key}: {value}")


if __name__ == "__main__":
    main()
