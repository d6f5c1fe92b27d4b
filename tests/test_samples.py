"""The sample documents and every prompt the bot suggests agree: each one gets an answer.

The demo (``scripts/demo``) loads ``bot/sample``; a person trying it clicks the
manifests' suggested prompts, the Messages tab's prompts drawn from the
documents, or the example in the help text. None of them may be refused.
"""

from __future__ import annotations

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
