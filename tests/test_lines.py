"""One person's things (uploads, questions) start in the order they were sent, at most the cap
at a time.

``PersonLines`` hands out places when the things arrive; the tasks that work on
them may run their first steps in any order (an upload records its start in the
store on a thread first), and must still start in the order of their places.
"""

from __future__ import annotations

import asyncio

from core.lines import PersonLines, Place


async def _run(
    place: Place,
    name: str,
    started: list[str],
    release: asyncio.Event,
    running: asyncio.Event | None = None,
) -> None:
    async with place.hold():
        started.append(name)
        if running is not None:
            running.set()
        await release.wait()


async def test_places_start_in_the_order_taken_whatever_order_their_tasks_run() -> None:
    slots = PersonLines(2)
    places = {name: slots.take("U1") for name in ("first", "second", "third")}
    releases = {name: asyncio.Event() for name in places}
    running = {name: asyncio.Event() for name in places}
    started: list[str] = []
    # The tasks run their first steps last-sent first.
    tasks = {
        name: asyncio.create_task(_run(places[name], name, started, releases[name], running[name]))
        for name in ("third", "second", "first")
    }
    await asyncio.wait_for(running["first"].wait(), 5)
    await asyncio.wait_for(running["second"].wait(), 5)
    assert sorted(started) == ["first", "second"]
    assert places["third"].waits

    releases["first"].set()
    await tasks["first"]
    await asyncio.wait_for(running["third"].wait(), 5)
    assert started[2] == "third"

    releases["second"].set()
    releases["third"].set()
    await asyncio.gather(*tasks.values())
    assert not slots.may_start(Place(slots, "U1"))  # a place never taken is in no line
    assert not slots.take("U1").waits  # everyone left: the next upload starts at once


async def test_another_persons_upload_does_not_wait_for_a_full_line() -> None:
    slots = PersonLines(1)
    mine = [slots.take("U1"), slots.take("U1")]
    theirs = slots.take("U2")
    assert not mine[0].waits
    assert mine[1].waits
    assert not theirs.waits


async def test_a_task_cancelled_before_its_first_step_gives_its_place_back() -> None:
    slots = PersonLines(1)
    first = slots.take("U1")
    second = slots.take("U1")
    release = asyncio.Event()
    started: list[str] = []
    task = asyncio.create_task(_run(first, "first", started, release))
    task.add_done_callback(first.leave)
    task.cancel()  # before it ever ran: its ``finally`` never runs
    await asyncio.gather(task, return_exceptions=True)
    assert started == []
    assert not second.waits

    async with second.hold():
        started.append("second")
    assert started == ["second"]
