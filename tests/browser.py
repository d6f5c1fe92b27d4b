"""Headless Chromium for tests: load a page, let its scripts run, look at the result.

Two ways in, both with Debian's ``/usr/bin/chromium`` and no extra packages:

* :func:`dump_dom` and :func:`screenshot` run one ``chromium --headless`` process
  (``--dump-dom`` / ``--screenshot``) and return the serialised DOM or a PNG.
* :class:`Browser` drives one page over the Chrome DevTools Protocol (CDP) with
  aiohttp's websocket client, for what a DOM dump cannot show: the live scroll
  position, reactions to ``hashchange``, layout measurements.

Missing Chromium: tests marked with :data:`browser_marks` are skipped on a
developer machine, but when ``CI`` is set they run and fail, because a CI job that
silently skips the browser tests proves nothing about the viewer.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Self

import aiohttp
import pytest

from tests.environment import in_ci

__all__ = [
    "MISSING_REASON",
    "Browser",
    "CDPError",
    "ChromiumMissing",
    "browser_marks",
    "chromium_path",
    "dump_dom",
    "in_ci",
    "require_chromium",
    "requires_chromium",
    "screenshot",
    "should_skip",
]

# Overrides the lookup, e.g. to use Google Chrome or a pinned build.
CHROMIUM_ENV = "CHROMIUM_PATH"
_CANDIDATES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
MISSING_REASON = (
    "headless Chromium not found: install Debian's 'chromium' package or set CHROMIUM_PATH"
)

# Flags that keep a test browser quiet, local and quick: no first-run UI, no
# background fetches (updates, sync, QUIC probes) that would try the internet.
_BASE_FLAGS = (
    "--headless",
    "--no-sandbox",  # containers run as root without user namespaces
    "--disable-gpu",
    "--disable-dev-shm-usage",  # small /dev/shm in containers crashes renderers
    "--disable-quic",
    "--no-first-run",
    "--no-default-browser-check",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--metrics-recording-only",
    "--mute-audio",
    "--hide-scrollbars",
)


class ChromiumMissing(RuntimeError):
    """No Chromium binary was found (a test failure when running in CI)."""


def chromium_path() -> str | None:
    """Path of the Chromium binary: ``$CHROMIUM_PATH``, then the usual names on PATH."""
    override = os.environ.get(CHROMIUM_ENV)
    if override:
        return override if os.access(override, os.X_OK) else None
    for name in _CANDIDATES:
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def should_skip() -> bool:
    """Skip browser tests only when Chromium is missing AND this is not CI.

    In CI a missing browser must not turn the viewer tests into silent skips:
    the tests run, and :func:`require_chromium` fails them with a clear reason.
    """
    return chromium_path() is None and not in_ci()


requires_chromium = pytest.mark.skipif(should_skip(), reason=MISSING_REASON)
browser_marks = [pytest.mark.browser, requires_chromium]
"""Use as ``pytestmark = browser_marks`` in a module of browser tests."""


def require_chromium() -> str:
    """The Chromium path, or :class:`ChromiumMissing` (fails the test, CI or not)."""
    path = chromium_path()
    if path is None:
        raise ChromiumMissing(
            MISSING_REASON + (" (CI is set, so this is an error)" if in_ci() else "")
        )
    return path


async def _run(args: list[str], timeout: float) -> bytes:
    """Run Chromium to completion; return its stdout or raise with its stderr."""
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise TimeoutError(f"chromium did not finish within {timeout}s: {args[-1]}") from None
    if proc.returncode != 0:
        tail = err.decode(errors="replace")[-2000:]
        raise RuntimeError(f"chromium exited with {proc.returncode}: {tail}")
    return out


def _window_flag(window: tuple[int, int]) -> str:
    return f"--window-size={window[0]},{window[1]}"


async def dump_dom(
    url: str,
    *,
    budget_ms: int = 3000,
    window: tuple[int, int] = (1200, 800),
    timeout: float = 20.0,
) -> str:
    """The DOM of ``url`` serialised after its scripts ran (``--dump-dom``).

    ``budget_ms`` is virtual time: timers fire as fast as the page lets them, so a
    3000 ms budget usually costs well under a second.
    """
    with tempfile.TemporaryDirectory(prefix="kb-chromium-", ignore_cleanup_errors=True) as profile:
        args = _one_shot_args(profile, window, budget_ms, "--dump-dom", url)
        return (await _run(args, timeout)).decode("utf-8", errors="replace")


def _one_shot_args(profile: str, window: tuple[int, int], budget_ms: int, *extra: str) -> list[str]:
    """A headless Chromium command that renders one page in a fresh profile and exits."""
    return [
        require_chromium(),
        *_BASE_FLAGS,
        f"--user-data-dir={profile}",
        _window_flag(window),
        f"--virtual-time-budget={budget_ms}",
        *extra,
    ]


async def screenshot(
    url: str,
    path: Path | str,
    *,
    window: tuple[int, int] = (1200, 800),
    budget_ms: int = 3000,
    timeout: float = 20.0,
) -> Path:
    """Save a PNG of ``url`` as rendered in a ``window``-sized viewport; return the path."""
    out = Path(path).resolve()
    with tempfile.TemporaryDirectory(prefix="kb-chromium-", ignore_cleanup_errors=True) as profile:
        await _run(_one_shot_args(profile, window, budget_ms, f"--screenshot={out}", url), timeout)
    if not out.is_file():
        raise RuntimeError(f"chromium wrote no screenshot to {out}")
    return out


class CDPError(RuntimeError):
    """A DevTools command failed, or the page threw while evaluating an expression."""


class Browser:
    """One headless Chromium page, driven over the DevTools Protocol.

    ::

        async with Browser() as browser:
            await browser.goto(url)
            await browser.wait_for("document.body.dataset.ready === 'true'")
            y = await browser.evaluate("window.scrollY")
            await browser.screenshot(tmp_path / "page.png")

    Args:
        window: viewport size in CSS pixels.
        mobile: emulate a phone (touch, meta viewport honoured).
        timeout: default seconds for start-up, navigation and waits.
    """

    def __init__(
        self, *, window: tuple[int, int] = (1200, 800), mobile: bool = False, timeout: float = 10.0
    ) -> None:
        self.window = window
        self.mobile = mobile
        self.timeout = timeout
        self._proc: asyncio.subprocess.Process | None = None
        self._profile: tempfile.TemporaryDirectory[str] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._event_waiters: list[tuple[str, asyncio.Future[dict[str, Any]]]] = []

    async def __aenter__(self) -> Self:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        """Launch Chromium and attach to its first page."""
        exe = require_chromium()
        self._profile = tempfile.TemporaryDirectory(
            prefix="kb-chromium-", ignore_cleanup_errors=True
        )
        profile = Path(self._profile.name)
        stderr = (profile / "stderr.log").open("wb")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                exe,
                *_BASE_FLAGS,
                f"--user-data-dir={profile}",
                _window_flag(self.window),
                # Port 0: Chromium picks a free port and writes it to DevToolsActivePort.
                "--remote-debugging-port=0",
                "--remote-allow-origins=*",
                "about:blank",
                stdout=asyncio.subprocess.DEVNULL,
                stderr=stderr,
            )
        finally:
            stderr.close()
        port = await self._devtools_port(profile)
        self._http = aiohttp.ClientSession()
        page_ws = await self._page_websocket(port)
        # Screenshots arrive as one base64 message: lift aiohttp's 4 MB cap.
        self._ws = await self._http.ws_connect(page_ws, max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            width=self.window[0],
            height=self.window[1],
            deviceScaleFactor=1,
            mobile=self.mobile,
        )

    async def _devtools_port(self, profile: Path) -> int:
        marker = profile / "DevToolsActivePort"
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while loop.time() < deadline:
            assert self._proc is not None
            if self._proc.returncode is not None:
                break
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(marker.read_text().splitlines()[0])
            await asyncio.sleep(0.05)
        log = (profile / "stderr.log").read_text(errors="replace")[-2000:]
        raise RuntimeError(f"chromium did not open its DevTools port: {log}")

    async def _page_websocket(self, port: int) -> str:
        assert self._http is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        while loop.time() < deadline:
            with contextlib.suppress(aiohttp.ClientError):
                async with self._http.get(f"http://127.0.0.1:{port}/json/list") as resp:
                    for target in await resp.json(content_type=None):
                        if target.get("type") == "page" and "webSocketDebuggerUrl" in target:
                            return str(target["webSocketDebuggerUrl"])
            await asyncio.sleep(0.05)
        raise RuntimeError("chromium exposed no page target")

    async def _read(self) -> None:
        assert self._ws is not None
        async for msg in self._ws:
            if msg.type != aiohttp.WSMsgType.TEXT:
                continue
            data = msg.json()
            if "id" in data:
                fut = self._pending.pop(data["id"], None)
                if fut is not None and not fut.done():
                    fut.set_result(data)
            elif "method" in data:
                for waiter in [w for w in self._event_waiters if w[0] == data["method"]]:
                    self._event_waiters.remove(waiter)
                    if not waiter[1].done():
                        waiter[1].set_result(data.get("params", {}))
        for fut in self._pending.values():
            if not fut.done():
                fut.set_exception(CDPError("the DevTools connection closed"))

    async def send(self, method: str, **params: Any) -> dict[str, Any]:
        """Send one CDP command; return its ``result`` or raise :class:`CDPError`."""
        if self._ws is None:
            raise CDPError("browser is not started")
        msg_id = next(self._ids)
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[msg_id] = fut
        await self._ws.send_json({"id": msg_id, "method": method, "params": params})
        reply = await asyncio.wait_for(fut, self.timeout)
        if "error" in reply:
            raise CDPError(f"{method}: {reply['error'].get('message')}")
        return dict(reply.get("result", {}))

    def _expect_event(self, method: str) -> asyncio.Future[dict[str, Any]]:
        fut: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._event_waiters.append((method, fut))
        return fut

    async def goto(self, url: str) -> None:
        """Navigate and wait for the page's ``load`` event (scripts, styles, images done)."""
        loaded = self._expect_event("Page.loadEventFired")
        result = await self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise CDPError(f"navigation to {url} failed: {result['errorText']}")
        if "loaderId" not in result:
            # Same-document navigation (only the fragment changed): no load event.
            loaded.cancel()
            return
        await asyncio.wait_for(loaded, self.timeout)

    async def evaluate(self, expression: str) -> Any:
        """Evaluate JavaScript in the page and return its (JSON-serialisable) value.

        Promises are awaited. A thrown exception raises :class:`CDPError`.
        """
        result = await self.send(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text")
            raise CDPError(f"page threw: {text}")
        return result.get("result", {}).get("value")

    async def wait_for(self, expression: str, timeout: float | None = None) -> Any:
        """Poll ``expression`` until it is truthy; return its value (``AssertionError`` on timeout)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + (self.timeout if timeout is None else timeout)
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if loop.time() >= deadline:
                raise AssertionError(f"still falsy after waiting: {expression}")
            await asyncio.sleep(0.05)

    async def screenshot(self, path: Path | str) -> Path:
        """Save a PNG of the current viewport; return its path."""
        result = await self.send("Page.captureScreenshot", format="png")
        out = Path(path)
        out.write_bytes(base64.b64decode(result["data"]))
        return out

    async def close(self) -> None:
        """Close the connection and end the Chromium process this object started."""
        if self._ws is not None and self._proc is not None and self._proc.returncode is None:
            # Ask Chromium to quit: unlike a signal, this lets its helper processes
            # finish before the profile directory is removed underneath them.
            with contextlib.suppress(CDPError, TimeoutError, aiohttp.ClientError, ConnectionError):
                await asyncio.wait_for(self.send("Browser.close"), 3)
                await asyncio.wait_for(self._proc.wait(), 5)
        if self._ws is not None:
            await self._ws.close()
            self._ws = None
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
            self._reader = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._proc is not None and self._proc.returncode is None:
            self._proc.terminate()
            try:
                await asyncio.wait_for(self._proc.wait(), 5)
            except TimeoutError:
                self._proc.kill()
                await self._proc.wait()
        self._proc = None
        if self._profile is not None:
            self._profile.cleanup()
            self._profile = None
