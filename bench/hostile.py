"""The server's memory and another member's wait while hostile files are uploaded.

Runs the real bot (``bot.app.create_app``) on loopback against the tests' mock
Slack, with its default reading limits. For each small hostile file of
``tests.hostile`` (and an honest 19 MB Markdown file the reader must absorb),
one member sends it in a DM (a signed ``file_share`` event) and another member
sends a small file at the same moment. Sampled every 20 ms meanwhile: this
process's resident memory. Reported per file: how it ended, how long it took,
the server's peak resident memory above its size before the file (goal: under
100 MB while only reading; a file that is read and indexed is embedded in the
server, which costs what its passages cost),
and how long the other member's small upload took (goal: under 10 s).

Run: python -m bench.hostile
"""

from __future__ import annotations

import asyncio
import re
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp

from bench.machine import describe as machine
from bench.slack import bench_settings, loaded_kb, serve

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests import hostile  # noqa: E402
from tests.servers import (  # noqa: E402
    DEFAULT_SIGNING_SECRET,
    USER_ID,
    MockSlackAPI,
    OpenAICompatServer,
    event_body,
    file_share_event,
    slack_headers,
)

OTHER_USER = "U0OTHER001"
GOAL_RSS_MB = 100
GOAL_BESIDE_S = 10.0
TIMEOUT_S = 180.0


def big_markdown() -> bytes:
    """An honest 19 MB Markdown file: over KB_MAX_TEXT_CHARS, read whole by the reader first."""
    paragraphs = (f"Paragraph {i} tells how the office works on day {i}." for i in range(350_000))
    return ("# Guide\n\n" + "\n\n".join(paragraphs)).encode()


FILES: dict[str, Callable[[], bytes]] = {
    "shared-string.xlsx": hostile.shared_string_xlsx,
    "aliased-sheets.xlsx": hostile.aliased_sheets_xlsx,
    "aliased-slides.pptx": hostile.aliased_slides_pptx,
    "styles.docx": hostile.styled_docx,
    "paragraphs.docx": hostile.plain_docx,
    "spaces.csv": hostile.quoted_spaces_csv,
    "big.md": big_markdown,
}


def rss_mb() -> float:
    """This process's resident memory now, in MB."""
    status = Path("/proc/self/status").read_text()
    return int(re.search(r"VmRSS:\s+(\d+)", status).group(1)) / 1024  # type: ignore[union-attr]


def final(slack: MockSlackAPI, name: str) -> str | None:
    """The final status the bot gave ``name``, if any yet."""
    for method, params in reversed(slack.log):
        text = str(params.get("text", ""))
        ended = ": indexed," in text or ": failed:" in text
        if method in {"chat.postMessage", "chat.update"} and f"*{name}*" in text and ended:
            return text
    return None


async def until(predicate: Callable[[], object], samples: list[float]) -> float:
    """Seconds until ``predicate`` holds, sampling the memory meanwhile."""
    started = time.perf_counter()
    while not predicate():
        samples.append(rss_mb())
        if time.perf_counter() - started > TIMEOUT_S:
            raise TimeoutError(f"no final status within {TIMEOUT_S} s")
        await asyncio.sleep(0.02)
    return time.perf_counter() - started


async def run() -> None:
    with tempfile.TemporaryDirectory(prefix="kb-bench-hostile-") as tmp:
        async with MockSlackAPI() as slack, OpenAICompatServer(reply="ok [1]") as llm:
            settings = bench_settings(Path(tmp) / "kb", slack, llm).model_copy(
                update={"publishers": f"{USER_ID},{OTHER_USER}"}
            )
            kb = loaded_kb(settings)
            runner, url = await serve(settings, kb)
            try:
                async with aiohttp.ClientSession() as http:
                    await send(http, url, slack, "warm.md", b"# Warm\n\nup\n", OTHER_USER)
                    await until(lambda: final(slack, "warm.md"), [])
                    idle = rss_mb()
                    print(f"idle server: {idle:.0f} MB resident")
                    print(
                        f"{'file':<22}{'size':>8}{'ended':>10}{'took':>8}{'+RSS':>8}{'beside':>8}"
                    )
                    for n, (name, build) in enumerate(FILES.items()):
                        data = build()
                        small = f"small-{n}.md"
                        before = rss_mb()
                        samples: list[float] = []
                        await send(http, url, slack, name, data, USER_ID)
                        await send(
                            http,
                            url,
                            slack,
                            small,
                            f"# Lunch {n}\n\nAt noon on day {n}.\n".encode(),
                            OTHER_USER,
                        )
                        beside = await until(lambda s=small: final(slack, s), samples)
                        took = await until(lambda f=name: final(slack, f), samples)
                        ended = "failed" if ": failed:" in str(final(slack, name)) else "indexed"
                        grew = max(samples, default=before) - before
                        print(
                            f"{name:<22}{len(data) / 1024:>7.0f}K{ended:>10}{took + beside:>7.1f}s"
                            f"{grew:>7.0f}M{beside:>7.1f}s"
                        )
            finally:
                await runner.cleanup()
    print(f"goals: +RSS under {GOAL_RSS_MB} MB, the other member's upload under {GOAL_BESIDE_S} s")


_sent = 0


async def send(
    http: aiohttp.ClientSession, url: str, slack: MockSlackAPI, name: str, data: bytes, user: str
) -> None:
    """One member sends one file to the bot in a DM."""
    global _sent
    _sent += 1
    file = slack.add_file(f"F0BENCH{_sent:04d}", name, data, "application/octet-stream", user=user)
    body = event_body(file_share_event([file], user=user), event_id=f"Ev0BENCH{_sent:04d}")
    headers = slack_headers(DEFAULT_SIGNING_SECRET, body)
    async with http.post(url, data=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()


def main() -> None:
    print(f"machine: {machine()}")
    asyncio.run(run())


if __name__ == "__main__":
    main()
