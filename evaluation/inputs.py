"""The evaluation set ``kb eval`` reads: in-domain questions, out-of-domain questions.

``questions.jsonl`` holds one question per line (``id``, ``needle``: the
verbatim passage that answers it, ``doc_phrasing``, ``ticket_phrasing``,
optional ``lang``: the phrasings' language, and ``doc_lang``: the needle's
document's, by default ``lang``); ``ood.jsonl`` the questions the knowledge
base should refuse (``id``, ``question``, optional ``kind`` and ``lang``). This module reads them and refuses a
missing, malformed or unlabelled line with ``EvalSetError``;
``evaluation.set_check`` checks that a set's needles are fit to measure with.
The sets bundled with the package live in ``evaluation/sets/NAME/``;
``bundled_set`` finds one by name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from evaluation.set_check import (
    BUNDLED_EVALSET,
    DEFAULT_SET,
    DOC_LANG_FIELD,
    LANG_FIELD,
    bundled_sets,
    language_problems,
)
from index.errors import KBError

__all__ = [
    "BUNDLED_CORPUS",
    "BUNDLED_OOD",
    "BUNDLED_QUESTIONS",
    "DEFAULT_SET",
    "PHRASINGS",
    "EvalSetError",
    "EvalSetPaths",
    "OODQuestion",
    "Question",
    "bundled_set",
    "bundled_set_names",
    "load_ood",
    "load_questions",
    "read_jsonl",
]

PHRASINGS = ("doc", "ticket")

BUNDLED_CORPUS = BUNDLED_EVALSET / "corpus"
BUNDLED_QUESTIONS = BUNDLED_EVALSET / "questions.jsonl"
BUNDLED_OOD = BUNDLED_EVALSET / "ood.jsonl"


class EvalSetError(KBError):
    """An evaluation file is missing, malformed or unlabelled."""


@dataclass(frozen=True)
class EvalSetPaths:
    """Where one evaluation set's documents and questions are."""

    corpus: Path
    questions: Path
    ood: Path

    @classmethod
    def of(cls, root: Path) -> EvalSetPaths:
        """The files of a set folder laid out as ``corpus/``, ``questions.jsonl``, ``ood.jsonl``."""
        return cls(root / "corpus", root / "questions.jsonl", root / "ood.jsonl")


def bundled_set_names() -> list[str]:
    """The names of the evaluation sets shipped with the package, sorted."""
    return list(bundled_sets())


def bundled_set(name: str = DEFAULT_SET) -> EvalSetPaths:
    """The files of the bundled evaluation set called ``name``.

    Raises:
        EvalSetError: no bundled set has that name (the message lists the names).
    """
    sets = bundled_sets()
    if name not in sets:
        raise EvalSetError(
            f"No bundled evaluation set called {name!r}; choose one of: {', '.join(sets)}."
        )
    return EvalSetPaths.of(sets[name])


@dataclass(frozen=True)
class Question:
    """An in-domain question and the verbatim passage that answers it.

    ``lang`` is the phrasings' ISO 639-1 code and ``doc_lang`` the needle's
    document's (``""``: not given; ``doc_lang`` defaults to ``lang``).
    """

    id: str
    needle: str
    doc_phrasing: str
    ticket_phrasing: str
    lang: str = ""
    doc_lang: str = ""

    @property
    def cross_lingual(self) -> bool:
        """Asked in another language than its document's."""
        return bool(self.lang) and self.lang != (self.doc_lang or self.lang)

    def phrasings(self) -> tuple[str, str]:
        """The two ways the question is asked, in ``PHRASINGS`` order."""
        return self.doc_phrasing, self.ticket_phrasing


@dataclass(frozen=True)
class OODQuestion:
    """A question the knowledge base should refuse."""

    id: str
    question: str
    kind: str = ""
    lang: str = ""


def read_jsonl(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """The objects of a JSON-lines file with their line numbers; blank lines skipped.

    Raises:
        EvalSetError: the file cannot be read or a line is not a JSON object.
    """
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise EvalSetError(f"Cannot read {path}: {exc.strerror or exc}.") from exc
    rows: list[tuple[int, dict[str, Any]]] = []
    for no, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise EvalSetError(f"{path}:{no}: not valid JSON ({exc.msg}).") from exc
        if not isinstance(obj, dict):
            raise EvalSetError(f"{path}:{no}: expected a JSON object.")
        rows.append((no, obj))
    return rows


def _fields(path: Path, no: int, obj: dict[str, Any], names: Sequence[str]) -> list[str]:
    values = []
    for name in names:
        value = obj.get(name)
        if not isinstance(value, str) or not value.strip():
            hint = " (label exported candidates before using them)" if obj.get("label") else ""
            raise EvalSetError(f"{path}:{no}: field {name!r} must be a non-empty string{hint}.")
        values.append(value if name == "needle" else value.strip())
    return values


def _languages(path: Path, no: int, obj: dict[str, Any], *, ood: bool = False) -> tuple[str, str]:
    """The line's ``(lang, doc_lang)``, ``doc_lang`` defaulting to ``lang``; ``""`` when not given.

    Raises:
        EvalSetError: a code is not ISO 639-1, or ``doc_lang`` comes without ``lang``.
    """
    problems = language_problems(obj, ood=ood)
    if problems:
        raise EvalSetError(f"{path}:{no}: {'; '.join(problems)}.")
    lang = str(obj.get(LANG_FIELD) or "")
    return lang, str(obj.get(DOC_LANG_FIELD) or lang)


def _unique(path: Path, ids: list[str]) -> None:
    seen: set[str] = set()
    for i in ids:
        if i in seen:
            raise EvalSetError(f"{path}: id {i!r} appears twice.")
        seen.add(i)


def load_questions(path: Path) -> list[Question]:
    """Read ``questions.jsonl``.

    Raises:
        EvalSetError: a required field is missing or empty, a language code is
            malformed, or an id repeats.
    """
    out = []
    for no, obj in read_jsonl(path):
        qid, needle, doc, ticket = _fields(
            path, no, obj, ("id", "needle", "doc_phrasing", "ticket_phrasing")
        )
        out.append(Question(qid, needle, doc, ticket, *_languages(path, no, obj)))
    _unique(path, [q.id for q in out])
    if not out:
        raise EvalSetError(f"{path} holds no questions.")
    return out


def load_ood(path: Path) -> list[OODQuestion]:
    """Read ``ood.jsonl``.

    Raises:
        EvalSetError: a required field is missing or empty, a language code is
            malformed, or an id repeats.
    """
    out = []
    for no, obj in read_jsonl(path):
        qid, question = _fields(path, no, obj, ("id", "question"))
        lang, _ = _languages(path, no, obj, ood=True)
        out.append(OODQuestion(qid, question, str(obj.get("kind") or ""), lang))
    _unique(path, [q.id for q in out])
    if not out:
        raise EvalSetError(f"{path} holds no out-of-domain questions.")
    return out
