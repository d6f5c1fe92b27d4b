"""The local embedding model run with ONNX Runtime instead of PyTorch (``KB_ENCODER_RUNTIME=onnx``).

The ONNX file is exported once from the configured sentence-transformers
model's own weights (offline, ``torch.onnx.export``) into ``encoders/`` in the
data dir, named by a stamp of the model's identity (its folder, the size and
time of its weights, the hash of its configuration and tokenizer files) and of
the exporting libraries' versions: when either changes, the next start exports
again. The export runs in a child process, so a server never holds PyTorch in
memory, even on its first start; it is written atomically, and a lock lets a
second process that starts at the same time wait for it instead of exporting twice.
Exporting needs the ``pytorch`` extra; without it an export made earlier of the
same model files is used, and a model with none is refused with the command
that installs the extra, before anything is embedded (``check_runnable``).
For BERT-like models the graph is then rewritten with ONNX Runtime's fused
attention and normalisation kernels, kept only when it gives PyTorch's token
embeddings on probe batches (otherwise the plain graph stays).

Tokens come from the model's fast-tokenizer file (the ``tokenizers`` package),
truncated at the model's ``max_seq_length``; pooling follows the model's
``modules.json`` and ``1_Pooling/config.json`` (CLS, mean, mean over the square
root of the length, max, or several concatenated, in sentence-transformers'
order), and vectors are L2-normalised as ``LocalEmbedder``'s are. A model with
any other module (a Dense projection, a prompt-dependent pooling) is refused
with the advice to use the torch runtime. Vectors of both runtimes agree
(cosine >= 0.9999, tested), so documents are stamped with the same model name
and nothing needs reindexing when only the runtime changes.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import inspect
import json
import logging
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from index.embed.base import (
    DEFAULT_BATCH_SIZE,
    EmbeddingModelUnavailable,
    Prefixes,
    Role,
    chosen_prefixes,
    importable,
    pytorch_missing,
    resolve_model,
    stamp_name,
)
from index.files import private_dir, write_atomic

# Bumped when the exported graph changes shape (inputs, outputs, attention, fusion).
EXPORT_FORMAT = 2
OPSET = 17
# Two intra-op threads use both cores of the small VM this targets; more only
# contend. They never spin-wait between operators: spinning threads fight every
# other process for the cores, and on a shared 2-core machine they doubled a
# query's time and cut batches by half (bench/encoder.py, docs/benchmarks.md).
DEFAULT_THREADS = 2
ENCODERS_DIR = "encoders"
# Batching for ONNX Runtime (``similar_length_batches``): padded tokens a batch
# may hold, and how much longer than its shortest text its longest may be.
BATCH_TOKENS = 2048
LENGTH_SPREAD = 1.3
# The order sentence-transformers concatenates several pooling modes in.
POOLING_MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens")
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
_MODULE_KINDS = ("Transformer", "Pooling", "Normalize")
_INPUTS = ("input_ids", "attention_mask", "token_type_ids")
_EXPORT_TIMEOUT = 1800.0
# What writes an export (onnxruntime too: its optimizer fuses the graph).
_EXPORTING_LIBRARIES = ("torch", "onnx", "onnxruntime", "transformers", "sentence-transformers")
# Distribution names whose module is named otherwise.
_MODULE_NAMES = {"sentence-transformers": "sentence_transformers"}
# Architectures ONNX Runtime's transformer optimizer fuses as BERT (its own documentation's list).
_FUSED_ARCHITECTURES = ("bert", "roberta", "xlm-roberta", "distilbert")
# The largest difference of a token embedding's value the fused graph may show against
# PyTorch's (the fused kernels reorder float sums): far inside the cosine of 0.9999
# the runtimes' agreement test asks of the pooled vectors.
_FUSION_TOLERANCE = 1e-3

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncoderLayout:
    """What of a sentence-transformers folder the ONNX encoder reproduces.

    Attributes:
        model_dir: the model's folder.
        max_seq_length: tokens the transformer reads; longer texts are truncated.
        do_lower_case: texts are lower-cased before tokenising.
        pooling: the pooling modes, in concatenation order.
        dim: size of the pooled vector.
    """

    model_dir: Path
    max_seq_length: int
    do_lower_case: bool
    pooling: tuple[str, ...]
    dim: int


def read_layout(model_dir: Path) -> EncoderLayout:
    """The layout ``model_dir``'s ``modules.json`` defines; refused when ONNX cannot reproduce it.

    Raises:
        EmbeddingModelUnavailable: a file is missing or malformed, or a module is unsupported.
    """
    modules = _json(model_dir / "modules.json")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds[:2] != ["Transformer", "Pooling"] or not set(kinds) <= set(_MODULE_KINDS):
        raise EmbeddingModelUnavailable(
            f"The embedding model in {model_dir} has modules {kinds}; the ONNX runtime "
            "runs only Transformer, Pooling and Normalize. Set KB_ENCODER_RUNTIME=torch."
        )
    pooling_path = model_dir / str(modules[1].get("path") or "1_Pooling") / "config.json"
    pooling_config = _json(pooling_path)
    modes = _pooling_modes(pooling_config)
    unsupported = [m for m in modes if m not in POOLING_MODES]
    if unsupported:
        raise EmbeddingModelUnavailable(
            f"The embedding model in {model_dir} pools with {unsupported}; the ONNX runtime "
            f"supports {list(POOLING_MODES)}. Set KB_ENCODER_RUNTIME=torch."
        )
    width = pooling_config.get(
        "embedding_dimension", pooling_config.get("word_embedding_dimension")
    )
    config = _json(model_dir / "sentence_bert_config.json")
    window = _window(model_dir, config)
    if not isinstance(width, int) or window is None:
        raise EmbeddingModelUnavailable(
            f"The embedding model in {model_dir} does not state its vector width and "
            "its window (max_seq_length). Set KB_ENCODER_RUNTIME=torch."
        )
    return EncoderLayout(
        model_dir=model_dir,
        max_seq_length=window,
        do_lower_case=bool(config.get("do_lower_case", False)),
        pooling=tuple(m for m in POOLING_MODES if m in modes),
        dim=width * len(modes),
    )


def _window(model_dir: Path, config: dict[str, Any]) -> int | None:
    # Where sentence-transformers reads it: its own config (older saves), else
    # the tokenizer's model_max_length, within the position embeddings.
    positions = _json(model_dir / "config.json").get("max_position_embeddings")
    window = config.get("max_seq_length")
    if not isinstance(window, int):
        tokenizer_config = model_dir / "tokenizer_config.json"
        window = (
            _json(tokenizer_config).get("model_max_length") if tokenizer_config.exists() else None
        )
    if isinstance(window, int) and isinstance(positions, int):
        return min(window, positions)
    return window if isinstance(window, int) else positions if isinstance(positions, int) else None


def _pooling_modes(config: dict[str, Any]) -> list[str]:
    if "pooling_mode" in config:
        mode = config["pooling_mode"]
        return [mode] if isinstance(mode, str) else [str(m) for m in mode]
    modes = [mode for key, mode in _LEGACY_POOLING_KEYS.items() if config.get(key)]
    return modes or ["mean"]


def _json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise EmbeddingModelUnavailable(
            f"Could not read {path} ({exc}); the ONNX runtime needs a sentence-transformers "
            "model folder. Set KB_ENCODER_RUNTIME=torch."
        ) from exc


def export_stamp(model_dir: Path) -> dict[str, Any]:
    """The identity of an export: the model's files and the exporting libraries' versions.

    Weights are identified by size and modification time (hashing 90 MB would
    cost half a second of every start); configuration and tokenizer files by
    their hash.
    """
    files: dict[str, str] = {}
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(model_dir).as_posix()
        stat = path.stat()
        small = path.suffix in (".json", ".txt") and stat.st_size < 8 * 1024 * 1024
        files[rel] = (
            hashlib.sha256(path.read_bytes()).hexdigest()
            if small
            else f"{stat.st_size}:{stat.st_mtime_ns}"
        )
    versions = {lib: _version(lib) for lib in _EXPORTING_LIBRARIES}
    return {
        "model": str(model_dir),
        "files": files,
        "versions": versions,
        "format": EXPORT_FORMAT,
        "opset": OPSET,
    }


def _version(dist: str) -> str:
    # A library that cannot be imported is absent, whatever its metadata says.
    if not importable(_MODULE_NAMES.get(dist, dist)):
        return "absent"
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "absent"


def exported_model(model_dir: Path, cache_dir: Path, *, name: str = "") -> Path:
    """The ONNX file of ``model_dir``'s transformer in ``cache_dir``, exported first if missing.

    ``name``: the model as people know it, for the error (else its folder's name).

    Raises:
        EmbeddingModelUnavailable: the export failed, or needs a library that is not
            installed (the reason is in the message).
    """
    stamp, target = _export_target(model_dir, cache_dir)
    found = _export_found(stamp, target, name or model_dir.name)
    if found is not None:
        return found
    with exclusive_lock(target.with_suffix(".lock")):
        # Another process may have exported while this one waited for the lock.
        if not target.exists():
            log.info("exporting the embedding model %s to ONNX (once) into %s", model_dir, target)
            write_atomic(target, lambda tmp: _export_in_child(model_dir, tmp))
            write_atomic(
                target.with_suffix(".json"),
                lambda tmp: tmp.write_text(json.dumps(stamp, indent=2, sort_keys=True)),
            )
            _remove_older(cache_dir, _slug(model_dir), keep=target)
    return target


def existing_export(model_dir: Path, cache_dir: Path, *, name: str = "") -> Path | None:
    """The ONNX file of ``model_dir`` in ``cache_dir`` if there is one, ``None`` when it is to be
    exported (never exporting it).

    Raises:
        EmbeddingModelUnavailable: there is none and a library the export needs is not installed.
    """
    return _export_found(*_export_target(model_dir, cache_dir), name or model_dir.name)


def _export_target(model_dir: Path, cache_dir: Path) -> tuple[dict[str, Any], Path]:
    """The export's stamp and the file it has in ``cache_dir`` (which is created)."""
    stamp = export_stamp(model_dir)
    key = hashlib.sha256(json.dumps(stamp, sort_keys=True).encode()).hexdigest()[:16]
    cache_dir.mkdir(parents=True, exist_ok=True)
    private_dir(cache_dir)
    return stamp, cache_dir / f"{_slug(model_dir)}-{key}.onnx"


def _slug(model_dir: Path) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", model_dir.name)[:60] or "model"


def _export_found(stamp: dict[str, Any], target: Path, name: str) -> Path | None:
    """``target`` if it exists, else an earlier export when exporting is impossible; ``None``:
    export it."""
    if target.exists():
        return target
    missing = [lib for lib, version in stamp["versions"].items() if version == "absent"]
    if missing:
        return _earlier_export(target.parent, _slug(Path(stamp["model"])), stamp, missing, name)
    return None


@contextlib.contextmanager
def exclusive_lock(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (created if missing): one process builds a cached file at a time."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _exports(cache_dir: Path, slug: str) -> list[Path]:
    # This model's exports only: another model's slug may start with this one's.
    name = re.compile(rf"{re.escape(slug)}-[0-9a-f]{{16}}\.onnx")
    return [p for p in cache_dir.glob(f"{slug}-*.onnx") if name.fullmatch(p.name)]


def _earlier_export(
    cache_dir: Path, slug: str, stamp: dict[str, Any], missing: list[str], name: str
) -> Path:
    """An export of these very model files made when the exporting libraries were installed.

    An operator may uninstall PyTorch once the model is exported; the export
    stays valid for the same weights, graph format and opset, and nothing
    could export again anyway.
    """
    same = ("model", "files", "format", "opset")
    for path in sorted(_exports(cache_dir, slug), key=_modified, reverse=True):
        with contextlib.suppress(OSError, ValueError):
            earlier = json.loads(path.with_suffix(".json").read_text(encoding="utf-8"))
            if all(earlier.get(k) == stamp[k] for k in same):
                log.info(
                    "using the ONNX export %s (%s not installed to export again)", path, missing
                )
                return path
    raise EmbeddingModelUnavailable(
        pytorch_missing(f"{name} is exported to ONNX once")
        or f"The embedding model {stamp['model']} has no ONNX export in {cache_dir} yet, and "
        f"exporting it needs {', '.join(missing)} (pip install them once), "
        "or set KB_ENCODER_RUNTIME=torch."
    )


def _modified(path: Path) -> float:
    # Another process may remove an old export while this one looks.
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _remove_older(cache_dir: Path, slug: str, *, keep: Path) -> None:
    # Exports of earlier weights or library versions are never read again. Lock
    # files stay: another process may be waiting on one.
    for old in _exports(cache_dir, slug):
        if old != keep:
            for path in (old, old.with_suffix(".json")):
                with contextlib.suppress(OSError):
                    path.unlink()


def _export_in_child(model_dir: Path, out: Path) -> None:
    # A child process: PyTorch and its ~500 MB never enter the caller.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "index.embed.onnx", str(model_dir), str(out)],
            capture_output=True,
            text=True,
            env=env,
            timeout=_EXPORT_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EmbeddingModelUnavailable(
            f"Could not export {model_dir} to ONNX ({exc}). Set KB_ENCODER_RUNTIME=torch."
        ) from exc
    if done.returncode != 0:
        tail = " ".join(done.stderr.strip().splitlines()[-3:])[-600:]
        raise EmbeddingModelUnavailable(
            f"Could not export {model_dir} to ONNX ({tail or f'exit {done.returncode}'}). "
            "Set KB_ENCODER_RUNTIME=torch."
        )


def export_onnx(model_dir: Path, out: Path, *, fuse: bool = True) -> None:
    """Write the transformer of ``model_dir`` as ONNX to ``out``: token ids in, token embeddings out.

    With ``fuse`` the graph is then fused (``fuse_transformer``) when the fused
    one gives the same token embeddings. Imports PyTorch; run in a child process
    (``python -m index.embed.onnx``).
    """
    import torch

    module, names, config = token_embeddings(model_dir)
    ids = torch.full((2, 8), 100, dtype=torch.int64)
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0  # an example with padding, so the mask is part of the graph
    example = (ids, mask, torch.zeros_like(ids))[: len(names)]
    axes = {n: {0: "batch", 1: "tokens"} for n in [*names, "token_embeddings"]}
    # The TorchScript exporter is chosen on purpose (dynamo=False): it traces these
    # encoders without the extra packages torch.export needs. Its deprecation notice
    # and the tracer's warnings about Python branches on shapes are expected: the
    # graph is checked by its outputs (same_outputs, and the runtimes' agreement tests).
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            example,
            str(out),
            input_names=names,
            output_names=["token_embeddings"],
            dynamic_axes=axes,
            opset_version=OPSET,
            dynamo=False,
        )
    if not fuse:
        return
    fused = out.with_name(out.name + ".fused")
    try:
        if fuse_transformer(out, fused, config) and same_outputs(fused, module, names):
            fused.replace(out)
    except Exception as exc:  # ORT raises its own many types on a graph it cannot load
        print(f"kept the plain graph: the fused one could not be checked ({exc})", file=sys.stderr)
    finally:
        fused.unlink(missing_ok=True)


def token_embeddings(model_dir: Path) -> tuple[Any, list[str], dict[str, Any]]:
    """``model_dir``'s transformer as a module of positional inputs, their names, and its config."""
    import torch

    from index.embed.base import load_offline

    model = load_offline("SentenceTransformer", str(model_dir), device="cpu")
    transformer = model[0].auto_model
    # Plain attention traces to a graph that holds for any padding; the fused
    # kernels branch on the example's mask.
    transformer.set_attn_implementation("eager")
    takes_types = "token_type_ids" in inspect.signature(transformer.forward).parameters
    names = list(_INPUTS if takes_types else _INPUTS[:2])

    class TokenEmbeddings(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = transformer

        def forward(self, *inputs: Any) -> Any:
            return self.model(**dict(zip(names, inputs, strict=True))).last_hidden_state

    return TokenEmbeddings().eval(), names, transformer.config.to_dict()


def fuse_transformer(plain: Path, fused: Path, config: dict[str, Any]) -> bool:
    """Write ``plain`` with ONNX Runtime's fused attention and normalisation kernels to ``fused``.

    Fewer, larger kernels for the same arithmetic: what a short query's
    embedding mostly pays for is the number of operators run. Returns False,
    leaving the plain graph in use, for an architecture the optimizer does not
    know or when it fails.
    """
    if config.get("model_type") not in _FUSED_ARCHITECTURES:
        return False
    heads = config.get("num_attention_heads", config.get("n_heads", 0))
    width = config.get("hidden_size", config.get("dim", 0))
    try:
        from onnxruntime.transformers.optimizer import optimize_model

        model = optimize_model(
            str(plain), model_type="bert", num_heads=heads, hidden_size=width, opt_level=1
        )
        model.save_model_to_file(str(fused))
    except Exception as exc:  # the optimizer raises many types on graphs it cannot fuse
        print(f"kept the plain graph: fusion failed ({exc})", file=sys.stderr)
        return False
    return True


def same_outputs(fused: Path, module: Any, names: Sequence[str]) -> bool:
    """Whether ``fused`` gives ``module``'s token embeddings on padded probe batches."""
    import onnxruntime
    import torch

    session = onnxruntime.InferenceSession(str(fused), providers=["CPUExecutionProvider"])
    generator = torch.Generator().manual_seed(0)
    for batch, tokens in ((1, 9), (3, 37)):
        ids = torch.randint(1000, 5000, (batch, tokens), generator=generator)
        mask = torch.ones_like(ids)
        mask[-1, tokens // 2 :] = 0
        inputs = (ids, mask, torch.zeros_like(ids))[: len(names)]
        with torch.inference_mode():
            expected = module(*inputs).numpy()
        (got,) = session.run(None, {n: t.numpy() for n, t in zip(names, inputs, strict=True)})
        # Padded positions are never pooled; only the real tokens must agree.
        real = mask.numpy().astype(bool)
        if np.max(np.abs(got[real] - expected[real])) > _FUSION_TOLERANCE:
            print("kept the plain graph: the fused one differs from PyTorch", file=sys.stderr)
            return False
    return True


def similar_length_batches(lengths: Sequence[int], most: int) -> Iterator[list[int]]:
    """Indices of ``lengths`` in batches of at most ``most``, shortest first.

    A batch ends where the next text is more than ``LENGTH_SPREAD`` times its
    shortest or would take it past ``BATCH_TOKENS`` padded tokens: attention
    costs the square of the padded length, and a large batch's activations
    spill out of the cache. Against fixed batches of 64 sorted by length this
    took ingestion from 33.4 to 45.9 chunks/s (docs/benchmarks.md, ingestion).
    """
    batch: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: lengths[i]):
        n = lengths[i]
        if batch and (
            len(batch) >= most
            or n * (len(batch) + 1) > BATCH_TOKENS
            or n > LENGTH_SPREAD * lengths[batch[0]]
        ):
            yield batch
            batch = []
        batch.append(i)
    if batch:
        yield batch


def pool(tokens: np.ndarray, mask: np.ndarray, modes: Sequence[str]) -> np.ndarray:
    """Pooled vectors of ``(batch, tokens, width)`` embeddings, as sentence-transformers pools."""
    weights = mask[..., None].astype(np.float32)
    parts = []
    for mode in modes:
        if mode == "cls":
            parts.append(tokens[np.arange(len(tokens)), mask.argmax(axis=1)])
        elif mode == "max":
            parts.append(np.where(weights > 0, tokens, -np.inf).max(axis=1))
        else:
            count = np.clip(weights.sum(axis=1), 1e-9, None)
            total = (tokens * weights).sum(axis=1)
            parts.append(total / (count if mode == "mean" else np.sqrt(count)))
    return np.concatenate(parts, axis=1).astype(np.float32)


def normalized(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero)."""
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.clip(norms, 1e-12, None)).astype(np.float32)


class OnnxEmbedder:
    """A sentence-transformers model's encoder run with ONNX Runtime; see the module docstring.

    Args:
        spec: a ``KB_EMBEDDING_MODEL`` value naming a local model (bundled, folder or name).
        cache_dir: where exports are kept (``encoders/`` in the data dir).
        threads: ONNX Runtime's intra-op threads.
        spinning: let them spin-wait between operators (ONNX Runtime's own
            default; off here, see ``DEFAULT_THREADS``; the benchmark compares).
        prefixes: what questions and passages are prefixed with; ``None``: the
            model family's (``index.embed.base.family_prefixes``).
    """

    def __init__(
        self,
        spec: str,
        cache_dir: Path,
        *,
        threads: int = DEFAULT_THREADS,
        spinning: bool = False,
        prefixes: Prefixes | None = None,
    ) -> None:
        self.spec = spec
        model, self._load_from = resolve_model(spec)
        self.prefixes = prefixes or chosen_prefixes(model, None, None)
        self.name = stamp_name(model, self.prefixes)
        self._cache_dir = cache_dir
        self._threads = threads
        self._spinning = spinning

    @cached_property
    def _model_dir(self) -> Path:
        if Path(self._load_from).is_dir():
            return Path(self._load_from)
        from huggingface_hub import snapshot_download

        try:  # a model name: its copy in the Hugging Face cache, never a download
            return Path(snapshot_download(self._load_from, local_files_only=True))
        except Exception as exc:  # the hub client raises several types for a missing model
            raise EmbeddingModelUnavailable(
                f"Could not find the embedding model {self.spec!r} on disk ({exc}). Set "
                "KB_EMBEDDING_MODEL to 'bundled:all-MiniLM-L6-v2' or to a local model folder."
            ) from exc

    @cached_property
    def layout(self) -> EncoderLayout:
        """What the model's files define (read on first use)."""
        return read_layout(self._model_dir)

    @cached_property
    def _session(self) -> Any:
        import onnxruntime

        _ = self.layout  # an unsupported model is refused before any export
        path = exported_model(self._model_dir, self._cache_dir, name=self._known_as)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = self._threads
        options.inter_op_num_threads = 1
        options.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if self._spinning else "0"
        )
        try:
            return onnxruntime.InferenceSession(
                str(path), options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # ORT raises its own many types for a bad file
            raise EmbeddingModelUnavailable(
                f"Could not load the ONNX export {path} ({exc}); delete it to export again."
            ) from exc

    @property
    def _known_as(self) -> str:
        # all-MiniLM-L6-v2, not sentence-transformers/all-MiniLM-L6-v2 [passage prefix ...]
        return resolve_model(self.spec)[0].rsplit("/", 1)[-1]

    def check_runnable(self) -> None:
        """See ``Embedder.check_runnable``: the model's files are readable, and its export is in
        the cache or can be made."""
        if "_session" not in self.__dict__:
            _ = self.layout
            existing_export(self._model_dir, self._cache_dir, name=self._known_as)

    @cached_property
    def _tokenizers(self) -> tuple[Any, Any]:
        # One truncating at the model's window (encoding), one not (counting).
        from tokenizers import Tokenizer

        path = self._model_dir / "tokenizer.json"
        try:
            encoding, counting = Tokenizer.from_file(str(path)), Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises a bare Exception for a bad file
            raise EmbeddingModelUnavailable(
                f"Could not read the fast tokenizer {path} ({exc}). Set KB_ENCODER_RUNTIME=torch."
            ) from exc
        encoding.no_padding()
        encoding.enable_truncation(self.layout.max_seq_length)
        counting.no_padding()
        counting.no_truncation()
        return encoding, counting

    @cached_property
    def _pad_id(self) -> int:
        padding = self._tokenizers[0].padding
        if padding:
            return int(padding["pad_id"])
        return int(self._tokenizers[0].token_to_id("[PAD]") or 0)

    @property
    def loaded(self) -> bool:
        """Whether the export is open (it loads on first use)."""
        return "_session" in self.__dict__

    @property
    def dim(self) -> int:
        """Number of dimensions of the vectors."""
        return self.layout.dim

    def expect_dimensions(self, dimensions: int) -> None:
        """See ``Embedder.expect_dimensions``: the model's files say its size."""

    @property
    def max_tokens(self) -> int:
        """The encoder window in word-pieces (special tokens included)."""
        return self.layout.max_seq_length

    def _texts(self, texts: Sequence[str], role: Role = "document") -> list[str]:
        given = self.prefixes.add(texts, role)
        return [t.lower() for t in given] if self.layout.do_lower_case else given

    def count_tokens(self, text: str) -> int:
        """Word-pieces the encoder sees for ``text``, special tokens included."""
        return self.count_tokens_many([text])[0]

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]:
        """``count_tokens`` of each text."""
        if not texts:
            return []
        return [len(e.ids) for e in self._tokenizers[1].encode_batch(self._texts(texts))]

    def encode(
        self,
        texts: Sequence[str],
        *,
        role: Role = "document",
        batch_size: int = DEFAULT_BATCH_SIZE,
        on_batch: Callable[[int], None] | None = None,
    ) -> np.ndarray:
        """Embed ``texts`` (``role``: see ``Embedder.encode``) as an ``(n, dim)`` float32
        array of unit vectors, in their order.

        Texts are batched by token length (``similar_length_batches``), so a
        batch pads to nearly nothing.
        """
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        encodings = self._tokenizers[0].encode_batch(self._texts(texts, role))
        for chosen in similar_length_batches([len(e.ids) for e in encodings], batch_size):
            out[chosen] = self._embed([encodings[i] for i in chosen])
            if on_batch:
                on_batch(len(chosen))
        return out

    def _embed(self, encodings: Sequence[Any]) -> np.ndarray:
        width = max(len(e.ids) for e in encodings)
        feeds = {name: np.zeros((len(encodings), width), dtype=np.int64) for name in _INPUTS}
        feeds["input_ids"].fill(self._pad_id)
        for row, e in enumerate(encodings):
            n = len(e.ids)
            feeds["input_ids"][row, :n] = e.ids
            feeds["attention_mask"][row, :n] = 1
            feeds["token_type_ids"][row, :n] = e.type_ids
        wanted = {i.name for i in self._session.get_inputs()}
        (tokens,) = self._session.run(None, {k: v for k, v in feeds.items() if k in wanted})
        return normalized(pool(tokens, feeds["attention_mask"], self.layout.pooling))

    def encode_query(self, text: str) -> np.ndarray:
        """Embed one question as a ``(dim,)`` unit vector."""
        return self.encode([text], role="query")[0]


if __name__ == "__main__":
    export_onnx(Path(sys.argv[1]), Path(sys.argv[2]))
