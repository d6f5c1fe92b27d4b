"""One person's work waits behind their own, never behind everyone's: a line per person.

At most ``per_person`` of one person's things (questions, uploads) are worked on
at a time; the others wait in that person's line, in the order they arrived,
and start as the person's earlier ones end. A place is taken on arrival
(:meth:`PersonLines.take`, no waiting), so a person's things start in the order
they were sent whatever order their tasks run their first steps in. Nobody
else's place depends on that line: one person's flood never holds back
another's work. Only people with something in flight are remembered.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

__all__ = ["PersonLines", "Place"]


class PersonLines:
    """At most ``per_person`` things of one person at a time; the others wait their turn."""

    def __init__(self, per_person: int) -> None:
        self.per_person = max(1, per_person)
        self._lines: dict[str, list[Place]] = {}  # holding a slot, then waiting, in order

    def take(self, person: str) -> Place:
        """A place in ``person``'s line, behind their earlier things."""
        place = Place(self, person)
        self._lines.setdefault(person, []).append(place)
        return place

    def in_line(self, person: str) -> int:
        """How many of ``person``'s things are worked on or waiting."""
        return len(self._lines.get(person, []))

    def may_start(self, place: Place) -> bool:
        """Whether ``place`` is among its person's first ``per_person``."""
        line = self._lines.get(place.person, [])
        return place in line[: self.per_person]

    def leave(self, place: Place) -> None:
        """Take ``place`` out of its line and wake the places that may start now."""
        line = self._lines.get(place.person, [])
        if place not in line:
            return
        line.remove(place)
        if not line:
            del self._lines[place.person]
        for ahead in line[: self.per_person]:
            ahead.turn.set()


class Place:
    """One thing's place in its person's line (:class:`PersonLines`).

    Left once, whichever comes first: the work ends (:meth:`hold` exits) or its
    task ends without having held it (:meth:`leave`, e.g. cancelled before starting).
    """

    def __init__(self, lines: PersonLines, person: str) -> None:
        self.lines = lines
        self.person = person
        self.turn = asyncio.Event()

    @property
    def waits(self) -> bool:
        """Whether the thing has to wait for one of its person's earlier ones."""
        return not self.lines.may_start(self)

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        """Hold the slot once this place's turn comes."""
        try:
            while self.waits:
                self.turn.clear()
                await self.turn.wait()
            yield
        finally:
            self.leave()

    def leave(self, _task: object = None) -> None:
        """Leave the line (again: nothing), letting the person's next thing start.

        Also a task's done callback (``_task``, unused).
        """
        self.lines.leave(self)
