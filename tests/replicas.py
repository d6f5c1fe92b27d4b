"""Real ``kb serve`` processes for the tests: a replica's environment, its start, its readiness.

A replica runs this checkout's code (``PYTHONPATH``: the virtualenv's editable
install may point at another checkout), from a directory of its own (no
``.env`` of the repository), against the local servers of ``tests/servers.py``.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

import aiohttp

from tests.conftest_bot import LINK_SECRET
from tests.servers import (
    DEFAULT_OPENAI_API_KEY,
    DEFAULT_SIGNING_SECRET,
    USER_ID,
    MockSlackAPI,
    OpenAICompatServer,
    closed_port_url,
)

__all__ = ["START_TIMEOUT_S", "Replica", "replica_env", "start_replica", "until_ready"]

REPO = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 90.0


@dataclass
class Replica:
    """One ``kb serve`` process and where it listens."""

    name: str
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def events(self) -> str:
        return f"{self.url}/slack/events"


def replica_env(
    data_dir: Path,
    database_url: str,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
    settings: Mapping[str, str],
) -> dict[str, str]:
    """The environment of a replica on the store ``data_dir``/``database_url``, with ``settings``.

    ``USER_ID`` is an admin; nothing else of the test's environment's ``KB_``,
    ``SLACK_`` or ``OPENAI_`` settings reaches it.
    """
    # The session's ONNX export of the model (tests/conftest.py) is shared, not redone.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("KB_", "SLACK_", "OPENAI_"))
        or k in ("KB_ENCODER_CACHE", "KB_EMBEDDING_MODEL")
    }
    env.update(
        {
            "PYTHONPATH": str(REPO),
            "HF_HUB_OFFLINE": "1",
            "TOKENIZERS_PARALLELISM": "false",
            "KB_DATA_DIR": str(data_dir),
            "KB_DATABASE_URL": database_url,
            "SLACK_BOT_TOKEN": slack.bot_token,
            "SLACK_SIGNING_SECRET": DEFAULT_SIGNING_SECRET,
            "SLACK_API_URL": slack.api_url,
            "OPENAI_BASE_URL": llm.url,
            "OPENAI_API_KEY": DEFAULT_OPENAI_API_KEY,
            "KB_LINK_SECRET": LINK_SECRET,
            "KB_ADMIN_USERS": USER_ID,
            "KB_SLACK_ADMINS_ARE_ADMINS": "false",
            **settings,
        }
    )
    return env


def start_replica(name: str, env: dict[str, str], logs: Path) -> Replica:
    """Start ``kb serve`` on a free port; its output goes to ``logs/<name>.log``."""
    port = int(urlsplit(closed_port_url()).port or 0)
    with (logs / f"{name}.log").open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "bot.cli", "serve", "--port", str(port)],
            env=env,
            cwd=logs,  # no .env of the repository
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return Replica(name, port, proc)


async def until_ready(
    replica: Replica, http: aiohttp.ClientSession, timeout: float = START_TIMEOUT_S
) -> None:
    """Wait until ``replica`` answers ``/readyz`` with 200; fail if it exits or takes too long."""
    deadline = time.monotonic() + timeout
    last: object = "no answer"
    while time.monotonic() < deadline:
        assert replica.proc.poll() is None, f"{replica.name} exited with {replica.proc.returncode}"
        try:
            async with http.get(f"{replica.url}/readyz") as resp:
                if resp.status == 200:
                    return
                last = await resp.text()
        except aiohttp.ClientError as exc:
            last = exc
        await asyncio.sleep(0.2)
    raise AssertionError(f"{replica.name} not ready after {timeout} s: {last}")
