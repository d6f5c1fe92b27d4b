"""Shared fixtures: a clean environment, the bundled embedding model (loaded once), and the
canary check: no secret a test configures may show up in a log record or a file (tests/canaries.py).
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest
import structlog

# One BLAS thread in each worker (scripts/test: one worker per core), set before NumPy
# loads OpenBLAS, for the processes the tests start too. OpenBLAS's own team of a thread
# per core turns each small product (a query map's fit, 256 x 384 rows a batch) into
# threads spinning against the other worker's: three times the CPU and the wall time
# (measured on 2 cores). OpenMP is left alone: FAISS's setting is the product's own
# (tests/test_vectors.py).
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _blas in ("OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_blas, "1")

# Helpers several test modules share assert too: rewritten whichever module imports them first.
pytest.register_assert_rewrite("tests.conftest_bot", "tests.home_tab", "tests.signin")

from bot.logs import NOISY_LOGGERS, LogHandler, configure_logging  # noqa: E402
from index.config import IndexConfig  # noqa: E402
from index.embed import Embedder  # noqa: E402
from index.embed.onnx import DEFAULT_THREADS, OnnxEmbedder  # noqa: E402
from index.embed.pytorch import LocalEmbedder  # noqa: E402
from index.knowledge_base import KnowledgeBase  # noqa: E402
from tests.canaries import LeakRecorder, report, scan_files  # noqa: E402
from tests.evalmini import EVALMINI  # noqa: E402

# The sample documents the bot ships (``kb`` demo, suggested prompts).
SAMPLE = Path(__file__).resolve().parents[1] / "bot" / "sample"

pytest_plugins = [
    "tests.fixtures_servers",
    "tests.fixtures_engine",
    "tests.conftest_bot",
    "tests.postgres",
]

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
    "KB_ENCODER_CACHE",
    "KB_EMBEDDING_MODEL",
}
# The model the suite runs on unless a test says otherwise: the bundled MiniLM, loaded
# once per session (``embedder``), so that the tests' assertions do not follow the
# product's default (the multilingual preset; the tests of it and of the default unset
# this). Set for the whole process, so that fixtures of any scope and every ``kb`` a
# test starts run on it; never the developer's own setting.
TEST_EMBEDDING_MODEL = "bundled:all-MiniLM-L6-v2"
os.environ["KB_EMBEDDING_MODEL"] = TEST_EMBEDDING_MODEL
# One ONNX export of the bundled model for every test and session (keyed by the
# model and library versions), not one per data dir.
os.environ.setdefault("KB_ENCODER_CACHE", os.path.join(tempfile.gettempdir(), "kb-test-encoders"))


# The files that run longest (processes started, models exported, loaded or compared),
# longest first, measured with --durations: they run before every other file, so that with
# several workers (scripts/test: pytest-xdist, one file to a worker at a time, in collection
# order) none starts last while the other workers have nothing left to run.
LONGEST_FIRST = (
    "test_query_map_background.py",
    "test_embed_onnx.py",
    "test_upload_takeover.py",
    "test_embed_e5.py",
    "test_replicas.py",
    "test_viewer_render.py",
    "test_follow_model.py",
    "test_slack_faults.py",
    "test_crash.py",
    "test_eval_compare.py",
    "test_follow.py",
    "test_search_index_contract.py",
    "test_evaluation.py",
    "test_chunk.py",
    "test_imports.py",
    "test_without_pytorch.py",
    "test_mcp.py",
    "test_knowledge_base.py",
    "test_store.py",
    "test_near_copies.py",
    "test_sources_confluence.py",
    "test_slack_unfurl.py",
    "test_isolated_extract.py",
    "test_reader_sandbox.py",
    "test_hostile_uploads.py",
    "test_slack_streaming.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """``LONGEST_FIRST``'s files first, in its order; every other file after, as collected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(autouse=True)
def clean_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """No test sees the developer's Slack/OpenAI/KB settings or a stray .env."""
    for key in list(os.environ):
        if key.startswith(("KB_", "SLACK_", "OPENAI_")) and key not in _KEEP:
            monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)
    yield


@pytest.fixture(scope="session", autouse=True)
def canary_check(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LeakRecorder]:
    """Fail the run if a canary secret reached a log record or a file under the session's
    temporary directories (every data dir the product wrote is there)."""
    recorder = LeakRecorder()
    root = logging.getLogger()
    level = root.level
    root.addHandler(recorder)
    yield recorder
    root.removeHandler(recorder)
    root.setLevel(level)
    leaks = recorder.leaks + scan_files(tmp_path_factory.getbasetemp())
    if leaks:
        pytest.fail(report(leaks), pytrace=False)


@pytest.fixture(autouse=True)
def record_every_log(canary_check: LeakRecorder, request: pytest.FixtureRequest) -> Iterator[None]:
    """Every record of every test reaches the canary check, at DEBUG; the logging a test (or a
    ``kb`` command under test) configured is undone afterwards."""
    root = logging.getLogger()
    if canary_check not in root.handlers:
        root.addHandler(canary_check)
    root.setLevel(logging.DEBUG)
    canary_check.during = request.node.nodeid
    quiet = {name: logging.getLogger(name).level for name in NOISY_LOGGERS}
    structlog_config = structlog.get_config()
    yield
    for handler in [h for h in root.handlers if isinstance(h, LogHandler)]:
        root.removeHandler(handler)
    for name, level in quiet.items():
        logging.getLogger(name).setLevel(level)
    structlog.configure(**structlog_config)


@pytest.fixture
def product_logs() -> Callable[..., io.StringIO]:
    """Configure the product's logging (``bot.logs``, as ``kb`` does) at DEBUG into a buffer:
    ``buf = product_logs("json")``, then read ``buf.getvalue()``."""

    def start(fmt: str = "console", secrets: Iterable[str] = ()) -> io.StringIO:
        buf = io.StringIO()
        configure_logging("DEBUG", fmt, secrets, stream=buf)
        return buf

    return start


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    """The real bundled all-MiniLM-L6-v2 on the product's default runtime (ONNX Runtime, the
    session's export in ``KB_ENCODER_CACHE``), loaded once per test session. PyTorch's run of
    the same model is ``torch_embedder``: the same stamp, vectors within a cosine of 1e-4
    (tests/test_embed_onnx.py), in half the time."""
    # One core per worker: two threads in each of two workers (beside the servers the
    # tests start) spin against each other and run many times slower.
    threads = 1 if os.environ.get("PYTEST_XDIST_WORKER") else DEFAULT_THREADS
    e = OnnxEmbedder(TEST_EMBEDDING_MODEL, Path(os.environ["KB_ENCODER_CACHE"]), threads=threads)
    e.encode(["warm up"])
    return e


@pytest.fixture(scope="session")
def torch_embedder() -> Embedder:
    """The bundled all-MiniLM-L6-v2 run by PyTorch (``KB_ENCODER_RUNTIME=torch``), loaded once
    per test session: the reference the ONNX runtime is checked against."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        import torch

        torch.set_num_threads(1)
    e = LocalEmbedder(TEST_EMBEDDING_MODEL)
    e.encode(["warm up"])
    return e


@pytest.fixture
def index_dir(tmp_path: Path) -> Path:
    """An empty data directory for one test."""
    d = tmp_path / "kb-data"
    d.mkdir()
    return d


@pytest.fixture(scope="session")
def sample_data_dir(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Path:
    """A data dir with the sample documents (``bot/sample``) ingested, built once; tests get a copy."""
    data_dir = tmp_path_factory.mktemp("sample-kb")
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    assert kb.ingest_paths([SAMPLE]).chunks > 0
    # Everything into the main database file, so a plain copy is complete.
    kb.store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return data_dir


@pytest.fixture(scope="session")
def evalmini_data_dir(tmp_path_factory: pytest.TempPathFactory, embedder: Embedder) -> Path:
    """A data dir with the evalmini corpus ingested (its query map fitted), built once; tests
    get a copy (``evalmini_kb``)."""
    data_dir = tmp_path_factory.mktemp("evalmini-kb")
    kb = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    assert kb.ingest_paths([EVALMINI / "corpus"]).chunks > 0
    kb.store.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return data_dir


@pytest.fixture
def evalmini_kb(evalmini_data_dir: Path, index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    """The evalmini corpus ingested into ``index_dir``: a copy of the session's, as if
    ``kb.ingest_paths([EVALMINI / "corpus"])`` had run in this test."""
    shutil.copytree(evalmini_data_dir, index_dir, dirs_exist_ok=True)
    return KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)


@pytest.fixture
def sample_kb(sample_data_dir: Path, index_dir: Path, embedder: Embedder) -> KnowledgeBase:
    """The sample documents ingested into ``index_dir``: a copy of the session's, as if
    ``kb.ingest_paths([SAMPLE])`` had run in this test."""
    shutil.copytree(sample_data_dir, index_dir, dirs_exist_ok=True)
    return KnowledgeBase(IndexConfig(data_dir=index_dir), embedder=embedder)
