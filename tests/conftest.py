"""Shared fixtures: a clean environment, the bundled embedding model (loaded once)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from index.embed import Embedder

pytest_plugins = ["tests.fixtures_servers", "tests.conftest_bot"]

_KEEP = {
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "VIRTUAL_ENV",
    "PYTHONPATH",
    "OPENBLAS_CORETYPE",
    "OPENBLAS_L2_SIZE",
    "HF_HUB_OFFLINE",
    "TOKENIZERS_PARALLELISM",
}


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No test sees the developer's Slack/OpenAI/KB settings or a stray .env."""
    for key in list(os.environ):
        if key.startswith(("KB_", "SLACK_", "OPENAI_")) and key not in _KEEP:
            monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    yield


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real bundled all-MiniLM-L6-v2, loaded once per test session."""
    e = Embedder("bundled:all-MiniLM-L6-v2")
    e.encode(["warm up"])
    return e


@pytest.fixture
def index_dir(tmp_path: Path) -> Path:
    """An empty data directory for one test."""
    d = tmp_path / "kb-data"
    d.mkdir()
    return d
