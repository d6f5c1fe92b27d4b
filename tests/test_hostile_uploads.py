"""Each small hostile file of the attack, sent to the bot in a DM through signed events,
ends with its reason (or is read, bounded), and another member's small upload sent at
the same moment is indexed meanwhile.

The files are built in ``tests.hostile``; ``tests/test_hostile_files.py`` counts the
work each one costs the extractor, ``tests/test_isolated_extract.py`` the reader's limits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest

from bot.slack import messages
from tests import hostile

pytest.register_assert_rewrite("tests.conftest_bot")

from tests.conftest_bot import Bot, BotFactory  # noqa: E402
from tests.servers import USER_ID, file_share_event  # noqa: E402

OTHER_USER = "U0OTHER001"
# The reading time limit of these bots: each hostile file must end well inside it.
READ_TIMEOUT_S = 60
# The other member's upload, sent beside the hostile one: the goal is within 10 s.
BESIDE_S = 10

# (file name, builder, what its final status says)
HOSTILE: list[tuple[str, Callable[[], bytes], str]] = [
    ("shared.xlsx", hostile.shared_string_xlsx, "KB_MAX_TEXT_CHARS"),
    ("aliased.xlsx", hostile.aliased_sheets_xlsx, "lists its sheet part"),
    ("aliased.pptx", hostile.aliased_slides_pptx, "lists one slide part 400 times"),
    # A quarter of the paragraphs of the extraction test (test_hostile_files): still
    # millions of style look-ups for a naive reader, and text this bot embeds well
    # inside the limit on a loaded machine (the whole 4,000 take it 15-30 s).
    ("styles.docx", partial(hostile.styled_docx, paragraphs=1000), ": indexed,"),
    ("spaces.csv", hostile.quoted_spaces_csv, "a CSV file with no values"),
]


@pytest.mark.parametrize(("name", "build", "said"), HOSTILE, ids=[h[0] for h in HOSTILE])
async def test_a_hostile_file_ends_with_its_reason_and_holds_no_one_up(
    make_bot: BotFactory, name: str, build: Callable[[], bytes], said: str
) -> None:
    bot = await make_bot(
        extract_timeout=READ_TIMEOUT_S, extract_workers=2, publishers=f"{USER_ID},{OTHER_USER}"
    )
    data = build()
    assert len(data) < 100 * 1024  # a small file any member can send
    bad = bot.slack.add_file("F0HOSTILE1", name, data, "application/octet-stream")
    small = bot.slack.add_file("F0SMALL001", "lunch.md", b"# Lunch\n\nAt noon.\n", "text/markdown")
    sent = time.monotonic()
    await bot.event(file_share_event([bad]))
    await bot.event(file_share_event([small], user=OTHER_USER))

    await _wait(lambda: _final_for(bot, "lunch.md") is not None, BESIDE_S)
    assert ": indexed," in str(_final_for(bot, "lunch.md"))
    await _wait(lambda: _final_for(bot, name) is not None, READ_TIMEOUT_S)
    assert time.monotonic() - sent < READ_TIMEOUT_S
    final = str(_final_for(bot, name))
    assert said in final, final
    assert "unexpected error" not in final and "Traceback" not in final


def _final_for(bot: Bot, name: str) -> str | None:
    done = [
        t
        for t in bot.statuses()
        if f"*{name}*" in t and any(w in t for w in (": indexed,", ": failed:"))
    ]
    return done[-1] if done else None


async def _wait(predicate: Any, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not true within {timeout} s")
        await asyncio.sleep(0.02)


def test_the_status_words_the_test_waits_for_are_the_bots() -> None:
    # _final_for reads the statuses by these words: they must be what the bot says.
    assert ": indexed," in messages.upload_indexed("a.md", 3)
    assert ": failed:" in messages.upload_failed("a.md", "why")
