"""The sample documents and every prompt the bot suggests agree: each one gets an answer.

The demo (``scripts/demo``) loads ``bot/sample`` (and, on the default model, the
pages in other languages of ``bot/sample_languages``); a person trying it clicks the
manifests' suggested prompts, the Messages tab's prompts drawn from the
documents, or the example in the help text. None of them may be refused.
"""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import yaml

from bot.slack import messages
from bot.slack.agent import suggested_prompts
from bot.slack.words import words_for
from core.answer import Engine, Outcome, build_engine
from index.knowledge_base import KnowledgeBase
from tests.conftest_bot import make_settings
from tests.servers import DEFAULT_OPENAI_API_KEY, OpenAICompatServer

ROOT = Path(__file__).resolve().parents[1]


def manifest_prompts() -> list[str]:
    """The suggested prompts of both Slack app manifests."""
    out = []
    for variant in ("socket", "http"):
        text = (ROOT / "deploy" / f"slack-manifest.{variant}.yaml").read_text(encoding="utf-8")
        out += [
            p["message"]
            for p in yaml.safe_load(text)["features"]["agent_view"]["suggested_prompts"]
        ]
    return out


def help_example() -> str:
    """The question the help text offers as an example."""
    (example,) = re.findall(r"“([^”]+)”", messages.EMPTY_QUESTION)
    return example


# ``sample_kb`` (tests/conftest.py): the sample documents ingested, as the demo has them.


@pytest.fixture
async def engine(
    sample_kb: KnowledgeBase, llm: OpenAICompatServer, index_dir: Path
) -> AsyncIterator[Engine]:
    # The product's defaults (thresholds included), as the demo runs them.
    settings = make_settings(
        data_dir=index_dir, openai_base_url=llm.url, openai_api_key=DEFAULT_OPENAI_API_KEY
    )
    engine = build_engine(settings.engine_config(), sample_kb)
    yield engine
    await engine.aclose()


async def test_every_suggested_prompt_is_answered_by_the_sample_documents(
    sample_kb: KnowledgeBase, engine: Engine
) -> None:
    drawn = [p["message"] for p in suggested_prompts(sample_kb, words=words_for("en"))]
    assert len(drawn) == 4, "one prompt per sample document"
    questions = list(dict.fromkeys([*manifest_prompts(), *drawn, help_example()]))
    for question in questions:
        answer = await engine.ask(question)
        closest = min((s.distance for s in answer.kept or answer.sources), default=None)
        assert answer.outcome == Outcome.ANSWERED, (question, closest)


# ---------------------------------------------------------------- the demo, on the default model

DEMO = (ROOT / "scripts" / "demo").read_text(encoding="utf-8")
# Nothing in the sample documents is about football.
UNRELATED_CZECH = "Jaké je pravidlo ofsajdu ve fotbale?"


def demo_folders() -> list[Path]:
    """The folders ``scripts/demo`` ingests."""
    (line,) = re.findall(r"^kb ingest (.+)$", DEMO, re.MULTILINE)
    return [ROOT / folder for folder in line.split()]


def demo_questions() -> list[str]:
    """The questions ``scripts/demo`` asks."""
    return re.findall(r'^kb ask "([^"]+)"$', DEMO, re.MULTILINE)


@pytest.fixture(scope="module")
def demo_kb(tmp_path_factory: pytest.TempPathFactory) -> KnowledgeBase:
    """The demo's documents on the default model, as ``bash scripts/demo`` ingests them
    (its ONNX graphs in the session's encoder cache, built once)."""
    from index.config import DEFAULT_EMBEDDING_MODEL, IndexConfig
    from index.embed.e5 import E5Embedder

    cache = Path(os.environ["KB_ENCODER_CACHE"])
    config = IndexConfig(data_dir=tmp_path_factory.mktemp("demo") / "kb-data", min_free_bytes=0)
    assert config.embedding_model == DEFAULT_EMBEDDING_MODEL == "multilingual"
    kb = KnowledgeBase(config, embedder=E5Embedder(DEFAULT_EMBEDDING_MODEL, cache, threads=1))
    summary = kb.ingest_paths(demo_folders())
    assert not summary.failed and len(summary.indexed) == 8
    return kb


@pytest.fixture
async def demo_engine(
    demo_kb: KnowledgeBase, llm: OpenAICompatServer, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Engine]:
    # No settings at all, as the demo runs: the default model's thresholds.
    monkeypatch.delenv("KB_EMBEDDING_MODEL")
    settings = make_settings(openai_base_url=llm.url, openai_api_key=DEFAULT_OPENAI_API_KEY)
    config = settings.engine_config()
    assert config.thresholds_origin == "bundled calibration"
    engine = build_engine(config, demo_kb)
    yield engine
    await engine.aclose()


def test_the_demo_loads_pages_in_each_language_of_the_people_it_serves() -> None:
    from index.languages import detect_language

    pages = [p for folder in demo_folders() for p in sorted(folder.glob("*.md"))]
    languages = {detect_language(p.read_text(encoding="utf-8")) for p in pages}
    assert languages == {"en", "cs", "da", "fr", "ro"}
    asked = {detect_language(q) for q in demo_questions()}
    assert "cs" in asked


async def test_the_demos_czech_question_is_answered_from_the_czech_page_with_a_link(
    demo_engine: Engine, llm: OpenAICompatServer
) -> None:
    from index.languages import detect_language

    (czech,) = [q for q in demo_questions() if detect_language(q) == "cs"]
    answer = await demo_engine.ask(czech)
    assert answer.outcome == Outcome.ANSWERED
    (cited,) = answer.sources
    assert cited.document == "Služební cesty a cestovní náhrady"
    assert "do deseti pracovních dnů po návratu" in cited.quote
    assert cited.url and "#char=" in cited.url
    (request,) = llm.requests
    assert "Write the answer in Czech." in request["messages"][-1]["content"]


async def test_an_unrelated_czech_question_is_refused_without_calling_the_model(
    demo_engine: Engine, llm: OpenAICompatServer
) -> None:
    answer = await demo_engine.ask(UNRELATED_CZECH)
    assert answer.outcome == Outcome.REFUSED and not answer.sources
    assert llm.requests == []


async def test_a_question_whose_language_cannot_be_told_is_answered_on_the_default_model(
    demo_engine: Engine, llm: OpenAICompatServer
) -> None:
    from index.languages import detect_language

    question = "shipit rollback --service api"
    assert detect_language(question) is None
    answer = await demo_engine.ask(question)
    assert answer.outcome == Outcome.ANSWERED
    assert answer.sources[0].document == "Deploying to Production"
    (request,) = llm.requests
    # No language named for the answer: the model is not told a wrong one.
    assert "Write the answer in" not in request["messages"][-1]["content"]
