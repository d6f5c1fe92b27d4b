"""With the ONNX runtime and its export in place, the server and the query-side commands never
load PyTorch or sentence-transformers: checked in real processes, by ``sys.modules`` for the
commands and by the shared libraries mapped into a running ``kb serve``."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from index.config import IndexConfig
from index.embed.onnx import OnnxEmbedder
from index.knowledge_base import KnowledgeBase
from tests.conftest import TEST_EMBEDDING_MODEL
from tests.evalmini import EVALSET_OPTIONS
from tests.servers import DEFAULT_SIGNING_SECRET, MockSlackAPI

SAMPLE = Path(__file__).resolve().parents[1] / "bot" / "sample"
HEAVY = ("torch", "sentence_transformers", "transformers")
_EVAL = ["eval", *EVALSET_OPTIONS, "--json"]
READY_TIMEOUT_S = 120.0


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir holding the sample documents, embedded with the ONNX runtime."""
    data = tmp_path_factory.mktemp("lean") / "kb-data"
    cache = Path(os.environ["KB_ENCODER_CACHE"])
    config = IndexConfig(
        data_dir=data,
        embedding_model=TEST_EMBEDDING_MODEL,
        encoder_runtime="onnx",
        encoder_cache=cache,
    )
    kb = KnowledgeBase(config, embedder=OnnxEmbedder(config.embedding_model, cache))
    assert kb.ingest_paths([SAMPLE]).chunks > 0
    return data


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_", "SLACK_", "OPENAI_"))}
    return {
        **env,
        "HF_HUB_OFFLINE": "1",
        "KB_DATA_DIR": str(data_dir),
        "KB_ENCODER_RUNTIME": "onnx",
        "KB_ENCODER_CACHE": os.environ["KB_ENCODER_CACHE"],
        "KB_EMBEDDING_MODEL": TEST_EMBEDDING_MODEL,
        **extra,
    }


def test_query_and_evaluation_commands_do_not_import_pytorch(
    data_dir: Path, tmp_path: Path
) -> None:
    script = (
        "import json, sys\n"
        "from bot.cli import main\n"
        f"for args in (['status'], ['ask', 'How do I get VPN access?'], ['docs'], {_EVAL!r}):\n"
        "    try:\n"
        "        main(args, standalone_mode=False)\n"
        "    except SystemExit:\n"
        "        pass\n"
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules] + ['onnxruntime' in sys.modules]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        env=_env(data_dir),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "vpn" in done.stdout.lower()  # the question really was answered from the documents
    assert '"recall' in done.stdout.lower()  # and the evaluation ran
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _ready(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


@pytest.mark.asyncio
async def test_kb_serve_does_not_load_pytorch(data_dir: Path, tmp_path: Path) -> None:
    port = _free_port()
    async with MockSlackAPI() as slack:
        env = _env(
            data_dir,
            KB_PORT=str(port),
            SLACK_BOT_TOKEN=slack.bot_token,
            SLACK_SIGNING_SECRET=DEFAULT_SIGNING_SECRET,
            SLACK_API_URL=slack.api_url,
        )
        with (tmp_path / "serve.log").open("wb") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "bot.cli", "serve", "--port", str(port)],
                env=env,
                cwd=tmp_path,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        try:
            deadline = time.monotonic() + READY_TIMEOUT_S
            while not _ready(port):
                assert proc.poll() is None, (tmp_path / "serve.log").read_text()
                assert time.monotonic() < deadline, "kb serve not ready"
                await asyncio.sleep(0.3)
            maps = Path(f"/proc/{proc.pid}/maps").read_text()
        finally:
            proc.terminate()
            proc.wait(timeout=30)
    assert "onnxruntime" in maps  # the encoder really is loaded ...
    assert "libtorch" not in maps and "/torch/" not in maps  # ... and PyTorch is not


# Each group must stand without the Slack surface: MCP, the viewer's server, the access rule.
SURFACE_FREE = [
    ["bot.mcp"],
    ["bot.server.routes", "bot.server.readers", "bot.server.render"],
    ["bot.access"],
]


def test_mcp_the_web_server_and_the_access_rule_do_not_import_the_slack_surface(
    tmp_path: Path,
) -> None:
    """MCP tools, the viewer and the rule they ask stand without the Slack surface (bolt,
    its listeners, its Block Kit): checked in a fresh interpreter, by ``sys.modules`` after
    each group's imports. What a group imports stays in ``sys.modules``, so every group
    finding nothing is each group finding nothing on its own; the first to pull the
    surface in is named."""
    script = (
        "import importlib, json, sys\n"
        "found = {}\n"
        f"for group in {SURFACE_FREE!r}:\n"
        "    for name in group:\n"
        "        importlib.import_module(name)\n"
        "    found[group[0]] = sorted(m for m in sys.modules\n"
        "        if m == 'bot.slack' or m.startswith(('bot.slack.', 'slack_bolt')))\n"
        "print(json.dumps(found))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {group[0]: [] for group in SURFACE_FREE}


# What `kb serve` needs only when it is used: the document parsers, Tesseract's wrapper and
# Pillow (readers load them in their own processes), the MCP SDK (KB_MCP), the model client
# (a configured model), SciPy (grouping unanswered questions: `kb gaps`, the Home tab), the
# Markdown parser (the viewer's first Markdown document), the HTTP client of `kb sync` and
# the sources, the progress bars of the commands.
LOADED_WHEN_USED = (
    *("bs4", "pypdf", "openpyxl", "pptx", "docx", "pytesseract", "PIL", "mcp", "openai"),
    *("scipy", "markdown_it", "httpx", "tqdm"),
)


def test_kb_serves_modules_leave_what_they_use_rarely_to_first_use(
    tmp_path: Path,
) -> None:
    """A fresh interpreter imports the command line, the app and the names the Slackbot skill
    and the MCP surface export; none of the libraries above is loaded by that."""
    script = (
        "import json, sys\n"
        "import bot.cli, bot.app, bot.mcp, index.ingest\n"
        "bot.mcp.SERVER_ID, bot.mcp.SKILL, bot.mcp.SlackbotBlocks\n"
        f"print(json.dumps(sorted(m for m in {LOADED_WHEN_USED!r} if m in sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


def test_the_mcp_surface_exports_every_name_it_lists() -> None:
    import bot.mcp

    assert all(getattr(bot.mcp, name) is not None for name in bot.mcp.__all__)
    with pytest.raises(AttributeError):
        _ = bot.mcp.NOT_A_NAME
