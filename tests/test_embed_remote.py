"""An embedding model behind an OpenAI-compatible endpoint (``KB_EMBEDDING_MODEL=openai:<model>``).

Against the local server of ``tests/servers.py``, whose vectors are hashed bags
of words: batching, retries, time limits, replies that cannot be trusted, the
token-counting rule, and documents of two models never mixed in one query.
The embedder is synchronous (the index layer is), so every call runs in a
thread while the server answers on the test's event loop.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner, Result
from sqlite_utils import Database

from bot.cli import main
from bot.settings import Settings
from index.config import EmbeddingEndpoint, IndexConfig
from index.embed import Embedder, EmbeddingModelUnavailable, load_embedder
from index.embed.pytorch import LocalEmbedder
from index.embed.remote import RemoteEmbedder
from index.ingest.chunk import chunk_document
from index.ingest.extract import extract
from index.knowledge_base import KnowledgeBase
from tests.conftest import TEST_EMBEDDING_MODEL
from tests.servers import (
    DEFAULT_EMBEDDING_API_KEY,
    DEFAULT_OPENAI_API_KEY,
    OpenAICompatServer,
    closed_port_url,
)

MODEL = "openai:test-embed"
DOCS = {
    "parking.md": "# Parking\n\nEmployees park in garage B. Visitor badges come from the front desk.\n",
    "bikes.md": "# Bicycles\n\nBicycle storage is in the basement next to the showers.\n",
    "expenses.md": "# Expenses\n\nTravel expenses are reimbursed within thirty days of the claim.\n",
}


def _endpoint(server: OpenAICompatServer, **overrides: object) -> EmbeddingEndpoint:
    base = EmbeddingEndpoint(base_url=server.url, batch_size=3, timeout=10.0, max_retries=3)
    return replace(base, **overrides)  # type: ignore[arg-type]


def _remote(server: OpenAICompatServer, **overrides: object) -> RemoteEmbedder:
    return RemoteEmbedder(MODEL, _endpoint(server, **overrides))


async def test_texts_go_in_batches_and_come_back_as_unit_vectors(
    openai_server: OpenAICompatServer,
) -> None:
    embedder = _remote(openai_server)
    texts = [f"text number {i}" for i in range(7)] + ["text number 0"]
    vectors = await asyncio.to_thread(embedder.encode, texts)
    assert vectors.shape == (8, 64) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert np.allclose(vectors[0], vectors[7]) and not np.allclose(vectors[0], vectors[1])
    # 8 texts in batches of 3; the size was learned from the first of them.
    assert [len(r["input"]) for r in openai_server.embedding_requests] == [3, 3, 2]
    assert {r["model"] for r in openai_server.embedding_requests} == {"test-embed"}
    assert embedder.dim == 64 and embedder.loaded
    assert len(openai_server.embedding_requests) == 3


async def test_the_size_is_learned_from_the_first_reply_or_asked_for(
    openai_server: OpenAICompatServer,
) -> None:
    embedder = _remote(openai_server)
    assert not embedder.loaded
    assert await asyncio.to_thread(lambda: embedder.dim) == 64
    assert len(openai_server.embedding_requests) == 1
    asked = _remote(openai_server, dimensions=16)
    assert (await asyncio.to_thread(asked.encode_query, "garage")).shape == (16,)
    assert openai_server.embedding_requests[-1]["dimensions"] == 16


@pytest.mark.parametrize("status", [429, 500, 503])
async def test_rate_limits_and_server_errors_are_retried(
    openai_server: OpenAICompatServer, status: int
) -> None:
    openai_server.retry_after = 0.05
    openai_server.fail_with(status, times=2)
    vector = await asyncio.to_thread(_remote(openai_server).encode_query, "garage B")
    assert vector.shape == (64,)
    assert len(openai_server.embedding_requests) == 3


async def test_a_connection_dropped_once_is_retried(openai_server: OpenAICompatServer) -> None:
    openai_server.drop_connections(times=1)
    vector = await asyncio.to_thread(_remote(openai_server).encode_query, "garage B")
    assert vector.shape == (64,)
    assert len(openai_server.embedding_requests) == 2


async def test_retries_end_with_a_clear_error_that_shows_no_credentials(
    openai_server: OpenAICompatServer,
) -> None:
    openai_server.retry_after = 0.01
    openai_server.fail_with(500)
    secret_url = openai_server.url.replace("://", "://admin:canary-url-password@")
    embedder = RemoteEmbedder(
        MODEL,
        EmbeddingEndpoint(base_url=secret_url, api_key=DEFAULT_EMBEDDING_API_KEY, max_retries=2),
    )
    with pytest.raises(EmbeddingModelUnavailable) as caught:
        await asyncio.to_thread(embedder.encode_query, "garage")
    message = str(caught.value)
    assert "HTTP 500" in message and "3 attempts" in message and "KB_EMBEDDING_BASE_URL" in message
    assert "canary" not in message and "admin" not in message
    assert openai_server.url in message
    assert len(openai_server.embedding_requests) == 3


@pytest.mark.parametrize("status", [400, 401, 404])
async def test_a_refusal_is_not_retried(openai_server: OpenAICompatServer, status: int) -> None:
    openai_server.fail_with(status)
    with pytest.raises(EmbeddingModelUnavailable, match=f"HTTP {status}"):
        await asyncio.to_thread(_remote(openai_server).encode_query, "garage")
    assert len(openai_server.embedding_requests) == 1


async def test_a_wrong_key_is_refused_and_never_shown() -> None:
    async with OpenAICompatServer(api_key=DEFAULT_OPENAI_API_KEY) as server:
        wrong = _remote(server, api_key=DEFAULT_EMBEDDING_API_KEY)
        with pytest.raises(EmbeddingModelUnavailable, match="HTTP 401") as caught:
            await asyncio.to_thread(wrong.encode_query, "garage")
        assert "canary" not in str(caught.value)
        right = _remote(server, api_key=DEFAULT_OPENAI_API_KEY)
        assert (await asyncio.to_thread(right.encode_query, "garage")).shape == (64,)


async def test_an_endpoint_that_cannot_be_reached_fails_within_its_retries() -> None:
    embedder = RemoteEmbedder(
        MODEL, EmbeddingEndpoint(base_url=closed_port_url(), max_retries=1, timeout=5.0)
    )
    with pytest.raises(EmbeddingModelUnavailable, match="could not be reached, after 2 attempts"):
        await asyncio.to_thread(embedder.encode_query, "garage")


async def test_a_slow_endpoint_fails_within_the_time_limit(
    openai_server: OpenAICompatServer,
) -> None:
    openai_server.delay(5.0)
    embedder = _remote(openai_server, timeout=0.6, max_retries=5)
    started = time.monotonic()
    with pytest.raises(EmbeddingModelUnavailable, match="did not answer in time"):
        await asyncio.to_thread(embedder.encode_query, "garage")
    assert time.monotonic() - started < 3.0
    openai_server.delay(0)


async def test_an_endpoint_trickling_its_reply_fails_within_the_time_limit(
    openai_server: OpenAICompatServer,
) -> None:
    # Headers at once, then a byte every 0.1 s: every read is well within the time
    # limit, the whole reply (over a thousand bytes) far beyond it. The limit is the
    # batch's in all, not each read's.
    openai_server.trickle_embeddings(0.1)
    embedder = _remote(openai_server, timeout=0.6, max_retries=5)
    started = time.monotonic()
    with pytest.raises(EmbeddingModelUnavailable, match="did not answer in time"):
        await asyncio.wait_for(asyncio.to_thread(embedder.encode_query, "garage"), 30)
    assert time.monotonic() - started < 3.0
    openai_server.reset()


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (b"<html>Bad gateway</html>", "not JSON"),
        (b'{"data": []}', "sent 0 vectors for 1 texts"),
        (b'{"object": "list"}', "sent no vectors"),
        (b'{"data": [{"index": 0, "embedding": "AAAA"}]}', "not a list of embeddings"),
        (b'{"data": [{"index": 0, "embedding": [[1.0], [0.5]]}]}', "not flat lists"),
        (b'{"data": [{"index": 0, "embedding": [0.0, 0.0]}]}', "zero or not finite"),
        (b'{"data": [{"index": 3, "embedding": [1.0, 0.0]}]}', "numbers the vectors wrongly"),
        (b'{"data": [{"embedding": [1.0, 0.0]}]}', "not a list of embeddings"),
    ],
)
async def test_garbage_replies_are_errors(
    openai_server: OpenAICompatServer, body: bytes, reason: str
) -> None:
    openai_server.answer_raw(body, "application/json")
    with pytest.raises(EmbeddingModelUnavailable, match=reason):
        await asyncio.to_thread(_remote(openai_server).encode_query, "garage")


async def test_vectors_of_another_size_are_refused(openai_server: OpenAICompatServer) -> None:
    embedder = _remote(openai_server)
    await asyncio.to_thread(embedder.encode_query, "garage")
    openai_server.embedding_dim = 32
    with pytest.raises(EmbeddingModelUnavailable, match="32 dimensions where 64 were expected"):
        await asyncio.to_thread(embedder.encode_query, "garage")


def test_tokens_are_counted_as_utf8_bytes_and_chunks_fit_the_window() -> None:
    embedder = RemoteEmbedder(MODEL, EmbeddingEndpoint(max_tokens=120))
    assert embedder.count_tokens("") == 2
    assert embedder.count_tokens("garage") == 8
    assert embedder.count_tokens("é€") == 2 + 2 + 3
    assert embedder.count_tokens_many(["a", "bb"]) == [3, 4]
    paragraph = "Ünïcödé passages count by bytes, so they are split earlier. " * 12
    doc = extract(f"# Guide\n\n{paragraph}\n".encode(), "guide.md", max_bytes=1 << 20)
    chunking = chunk_document(
        doc, budget=512, count_tokens=embedder.count_tokens, max_tokens=embedder.max_tokens
    )
    assert len(chunking.chunks) > 1
    for chunk in chunking.chunks:
        assert len(chunk.text.encode("utf-8")) + 2 <= 120


def test_settings_fall_back_to_the_model_endpoint() -> None:
    both = Settings(
        _env_file=None,  # type: ignore[call-arg]
        OPENAI_BASE_URL="http://llm.local/v1",
        OPENAI_API_KEY=DEFAULT_OPENAI_API_KEY,
    ).embedding_endpoint()
    assert (both.base_url, both.api_key) == ("http://llm.local/v1", DEFAULT_OPENAI_API_KEY)
    own = Settings(
        _env_file=None,  # type: ignore[call-arg]
        OPENAI_BASE_URL="http://llm.local/v1",
        OPENAI_API_KEY=DEFAULT_OPENAI_API_KEY,
        KB_EMBEDDING_BASE_URL="http://embed.local/v1",
        KB_EMBEDDING_API_KEY=DEFAULT_EMBEDDING_API_KEY,
        KB_EMBEDDING_BATCH_SIZE=8,
    ).embedding_endpoint()
    assert (own.base_url, own.api_key, own.batch_size) == (
        "http://embed.local/v1",
        DEFAULT_EMBEDDING_API_KEY,
        8,
    )
    assert DEFAULT_EMBEDDING_API_KEY not in repr(own)
    with pytest.raises(ValueError, match="KB_EMBEDDING_BATCH_SIZE"):
        Settings(_env_file=None, KB_EMBEDDING_BATCH_SIZE=0)  # type: ignore[call-arg]


def test_the_model_setting_picks_the_implementation(embedder: Embedder) -> None:
    remote = load_embedder(IndexConfig(embedding_model="openai:text-embedding-3-small"))
    assert isinstance(remote, RemoteEmbedder) and remote.name == "openai:text-embedding-3-small"
    assert isinstance(
        load_embedder(IndexConfig(embedding_model=TEST_EMBEDDING_MODEL, encoder_runtime="torch")),
        LocalEmbedder,
    )
    with pytest.raises(EmbeddingModelUnavailable, match="names no model"):
        load_embedder(IndexConfig(embedding_model="openai:"))


def _write_docs(folder: Path) -> Path:
    folder.mkdir()
    for name, text in DOCS.items():
        (folder / name).write_text(text, encoding="utf-8")
    return folder


async def test_retrieval_through_the_endpoint_finds_the_document(
    tmp_path: Path, openai_server: OpenAICompatServer
) -> None:
    config = IndexConfig(
        data_dir=tmp_path / "kb", embedding_model=MODEL, embedding_endpoint=_endpoint(openai_server)
    )
    kb = await asyncio.to_thread(KnowledgeBase, config)
    await asyncio.to_thread(kb.ingest_paths, [_write_docs(tmp_path / "docs")])
    assert kb.status()["embedding_model"] == MODEL and kb.status()["dimensions"] == 64
    vector = await asyncio.to_thread(kb.embedder.encode_query, "where is bicycle storage")
    (best, _), *_ = kb.snapshot.vectors.search(vector, 3, None)
    assert kb.store.chunks_by_id([best])[best].document == "Bicycles"


def _cli(data_dir: Path, server: OpenAICompatServer | None, *args: str) -> Result:
    env = {"KB_MIN_FREE_BYTES": "0", "KB_EMBEDDING_MODEL": "bundled:all-MiniLM-L6-v2"}
    if server is not None:
        env |= {"KB_EMBEDDING_MODEL": MODEL, "KB_EMBEDDING_BASE_URL": server.url}
    return CliRunner().invoke(main, ["--data-dir", str(data_dir), *args], env=env)


async def test_documents_of_another_model_stay_stale_until_reindexed(
    tmp_path: Path, embedder: Embedder, openai_server: OpenAICompatServer
) -> None:
    data_dir = tmp_path / "kb"
    local = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    local.ingest_paths([_write_docs(tmp_path / "docs")])
    assert local.status()["stale"] == 0 and len(local.snapshot) == 3
    local.store.db.conn.close()

    # Switched to the endpoint: the MiniLM vectors are never searched with its queries.
    status = await asyncio.to_thread(_cli, data_dir, openai_server, "status", "--json")
    assert status.exit_code == 0, status.output
    assert '"stale": 3' in status.output and f'"embedding_model": "{MODEL}"' in status.output
    remote = await asyncio.to_thread(
        KnowledgeBase,
        IndexConfig(
            data_dir=data_dir, embedding_model=MODEL, embedding_endpoint=_endpoint(openai_server)
        ),
    )
    assert len(remote.snapshot) == 0
    vector = await asyncio.to_thread(remote.embedder.encode_query, "bicycle storage")
    assert remote.snapshot.vectors.search(vector, 5, None) == []
    remote.store.db.conn.close()

    reindexed = await asyncio.to_thread(_cli, data_dir, openai_server, "reindex")
    assert reindexed.exit_code == 0, reindexed.output
    after = await asyncio.to_thread(_cli, data_dir, openai_server, "status", "--json")
    assert '"stale": 0' in after.output and '"searchable_chunks": 3' in after.output

    # And back: the bundled model now sees only stale documents, and no 64-dimension vector.
    back = KnowledgeBase(IndexConfig(data_dir=data_dir), embedder=embedder)
    assert back.status()["stale"] == 3 and len(back.snapshot) == 0
    assert back.snapshot.vectors.search(embedder.encode_query("bicycle storage"), 5, None) == []


async def test_a_knowledge_base_opens_while_its_endpoint_is_down(
    tmp_path: Path, openai_server: OpenAICompatServer
) -> None:
    data_dir = tmp_path / "kb"
    config = IndexConfig(
        data_dir=data_dir, embedding_model=MODEL, embedding_endpoint=_endpoint(openai_server)
    )
    kb = await asyncio.to_thread(KnowledgeBase, config)
    await asyncio.to_thread(kb.ingest_paths, [_write_docs(tmp_path / "docs")])
    kb.store.db.conn.close()

    # The endpoint goes away: the size stamped on the documents is enough to open and report.
    # Asked once: the retries' seconds of back-off are another test's (cannot_be_reached).
    down = replace(
        config, embedding_endpoint=EmbeddingEndpoint(base_url=closed_port_url(), max_retries=0)
    )
    reopened = await asyncio.to_thread(KnowledgeBase, down)
    status = reopened.status()
    assert status["dimensions"] == 64 and status["stale"] == 0 and len(reopened.snapshot) == 3
    # Only a question needs the endpoint, and it says which.
    with pytest.raises(EmbeddingModelUnavailable, match="127.0.0.1"):
        await asyncio.to_thread(reopened.embedder.encode_query, "bicycle storage")
    reopened.store.db.conn.close()


async def test_the_endpoint_returning_another_size_than_the_documents_is_a_changed_model(
    tmp_path: Path, openai_server: OpenAICompatServer
) -> None:
    config = IndexConfig(
        data_dir=tmp_path / "kb", embedding_model=MODEL, embedding_endpoint=_endpoint(openai_server)
    )
    kb = await asyncio.to_thread(KnowledgeBase, config)
    await asyncio.to_thread(kb.ingest_paths, [_write_docs(tmp_path / "docs")])
    kb.store.db.conn.close()
    # The documents say 32 dimensions; the endpoint now sends 64.
    db = Database(tmp_path / "kb" / "kb.sqlite")
    db.execute("UPDATE documents SET dimensions = 32")
    db.conn.commit()
    db.conn.close()
    reopened = await asyncio.to_thread(KnowledgeBase, config)
    with pytest.raises(EmbeddingModelUnavailable, match="kb reindex"):
        await asyncio.to_thread(reopened.embedder.encode_query, "bicycle storage")
    reopened.store.db.conn.close()
