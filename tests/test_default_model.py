"""The multilingual preset is the default model; a knowledge base built on the earlier default
(all-MiniLM-L6-v2) keeps answering on it, and says so, until ``kb reindex`` (``index.kept_model``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

pytest.register_assert_rewrite("tests.conftest_bot", "tests.home_tab")

from bot.cli import main  # noqa: E402
from bot.settings import Settings  # noqa: E402
from bot.slack.blocks.home import AdminHome, Calibration, MemberHome, home_view  # noqa: E402
from bot.slack.words import available_languages, words_for  # noqa: E402
from core.thresholds import BUNDLED, MINILM  # noqa: E402
from index.config import DEFAULT_EMBEDDING_MODEL, IndexConfig  # noqa: E402
from index.embed import MULTILINGUAL_MODEL_NAME, load_embedder  # noqa: E402
from index.kept_model import kept_model  # noqa: E402
from tests.conftest import SAMPLE, TEST_EMBEDDING_MODEL  # noqa: E402
from tests.conftest_bot import ADMIN_ID, Bot  # noqa: E402
from tests.home_tab import open_home  # noqa: E402
from tests.servers import MockSlackAPI, OpenAICompatServer, app_mention_event  # noqa: E402

NOTE = "built on all-MiniLM-L6-v2 and answers on it; run `kb reindex` to move to multilingual"


def test_the_default_is_the_multilingual_preset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KB_EMBEDDING_MODEL")
    settings = Settings(_env_file=None)  # type: ignore[call-arg]
    assert settings.embedding_model == DEFAULT_EMBEDDING_MODEL == "multilingual"
    assert IndexConfig().embedding_model == DEFAULT_EMBEDDING_MODEL


def test_the_default_models_running_name_finds_its_shipped_thresholds(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The thresholds are keyed by the model's name; the embedder that runs by default is
    stamped with a longer one (package version, runtime). The name it runs under must find
    the thresholds calibrated for it, not fall back to MiniLM's "not calibrated" pair."""
    monkeypatch.delenv("KB_EMBEDDING_MODEL")
    settings = Settings(_env_file=None, KB_DATA_DIR=str(tmp_path))  # type: ignore[call-arg]
    running = load_embedder(settings.index_config())
    thresholds = settings.thresholds()
    assert thresholds.calibrated and thresholds.origin == "bundled calibration"
    assert thresholds.model in BUNDLED and thresholds.model != MINILM
    assert running.name.startswith(thresholds.model + " "), (running.name, thresholds.model)
    assert (thresholds.answer, thresholds.related) == BUNDLED[MULTILINGUAL_MODEL_NAME]
    engine = settings.engine_config()
    assert (engine.threshold, engine.thresholds_model) == (thresholds.answer, thresholds.model)


def test_only_a_knowledge_base_wholly_on_the_earlier_default_keeps_it() -> None:
    preset = f"{MULTILINGUAL_MODEL_NAME} 0.3.0 [onnx int8]"
    kept = kept_model("multilingual", {MINILM: 4})
    assert kept is not None and kept.documents == 4 and NOTE in kept.note
    assert kept_model(" Multilingual ", {MINILM: 4}) == kept
    # Nothing built yet, or built on the default, or (a reindex that stopped half-way)
    # partly moved: the default runs, and the rest is stale until `kb reindex` ends.
    assert kept_model("multilingual", {}) is None
    assert kept_model("multilingual", {preset: 3}) is None
    assert kept_model("multilingual", {MINILM: 3, preset: 1}) is None
    # An operator who names a model gets it, as always.
    assert kept_model(TEST_EMBEDDING_MODEL, {MINILM: 4}) is None
    assert kept_model("openai:text-embedding-3-small", {MINILM: 4}) is None


def _kb(data_dir: Path, *args: str) -> Result:
    return CliRunner().invoke(
        main, ["--data-dir", str(data_dir), *args], env={"KB_MIN_FREE_BYTES": "0"}
    )


def test_a_knowledge_base_built_on_minilm_answers_on_it_until_kb_reindex(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "kb-data"
    # Built with MiniLM named (the test environment names it).
    assert _kb(data, "ingest", str(SAMPLE)).exit_code == 0
    monkeypatch.delenv("KB_EMBEDDING_MODEL")  # then started with no setting at all

    status = _kb(data, "status", "--json")
    assert status.exit_code == 0, status.output
    facts = json.loads(status.stdout)
    assert facts["embedding_model"] == MINILM and facts["stale"] == 0
    assert NOTE in facts["kept_model"]["note"] and facts["kept_model"]["documents"] == 4
    assert facts["thresholds"]["calibrated_for"] == MINILM
    assert NOTE in status.stderr, "the log says so too"
    assert NOTE in _kb(data, "status").stdout

    asked = _kb(data, "ask", "What do I attach to a conference ticket expense claim?", "--json")
    answer = json.loads(asked.stdout)
    # No model endpoint: the evidence, from MiniLM's vectors at MiniLM's threshold.
    assert answer["outcome"] == "model_unavailable"
    assert answer["sources"][0]["document"] == "Expenses and Reimbursement"

    reindexed = _kb(data, "reindex", "--json")
    assert reindexed.exit_code == 0, reindexed.output
    assert json.loads(reindexed.stdout)["documents"] == 4

    moved = json.loads(_kb(data, "status", "--json").stdout)
    assert moved["embedding_model"].startswith(MULTILINGUAL_MODEL_NAME + " ")
    assert moved["kept_model"] is None and moved["stale"] == 0
    assert moved["thresholds"]["calibrated_for"] == MULTILINGUAL_MODEL_NAME
    again = json.loads(_kb(data, "ask", "Can I deploy to production on a Friday?", "--json").stdout)
    assert again["sources"][0]["document"] == "Deploying to Production"


async def test_the_server_on_a_kept_model_says_so_at_start_in_readyz_and_on_home(
    aiohttp_client: Any,
    settings_for: Any,
    slack: MockSlackAPI,
    llm: OpenAICompatServer,
    fixture_data_dir: Path,
    index_dir: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    from bot.app import create_app

    # The fixture documents, embedded by MiniLM; the server started on the default.
    shutil.copytree(fixture_data_dir, index_dir, dirs_exist_ok=True)
    settings = settings_for(embedding_model=DEFAULT_EMBEDDING_MODEL, admin_users=ADMIN_ID)
    with caplog.at_level(logging.WARNING):
        app = create_app(settings)
    assert any(NOTE in r.getMessage() for r in caplog.records), "one line at start"
    bot = Bot(await aiohttp_client(app), app, slack, llm, settings, frozenset(asyncio.all_tasks()))

    resp = await bot.http.get("/readyz")
    ready = await resp.json()
    assert resp.status == 200 and ready["ready"] is True
    assert ready["embedding_model"] == MINILM and NOTE in ready["kept_model"]["note"]

    bot.services.home.gaps.wait_seconds = 15.0
    home = json.dumps((await open_home(bot, ADMIN_ID))["blocks"], ensure_ascii=False)
    assert "built on all-MiniLM-L6-v2" in home and "`kb reindex`" in home

    # Questions are answered from MiniLM's vectors: one model, no stale documents.
    assert bot.kb.stale_documents() == []
    await bot.event(app_mention_event("How many days do I have to submit an expense claim?"))
    answered = json.dumps(await bot.answer(), ensure_ascii=False)
    assert "Employee handbook" in answered and "#char=" in answered


@pytest.mark.parametrize("language", sorted(available_languages()))
def test_the_home_tab_says_which_model_it_runs_in_every_language(language: str) -> None:
    admin = AdminHome(
        [],
        [],
        False,
        None,
        {},
        [],
        0,
        Calibration(0.475, 0.55, None, kept_model=("all-MiniLM-L6-v2", "multilingual")),
    )
    words = words_for(language)
    view = home_view(MemberHome(4, 12, 0, []), admin, words=words)
    text = json.dumps(view["blocks"], ensure_ascii=False)
    line = words.home_kept_model("all-MiniLM-L6-v2", "multilingual")
    assert line in text
    assert "all-MiniLM-L6-v2" in line and "multilingual" in line and "`kb reindex`" in line
    if language != "en":
        assert line != words_for("en").home_kept_model("all-MiniLM-L6-v2", "multilingual")
