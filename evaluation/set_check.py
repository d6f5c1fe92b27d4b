"""Validate a retrieval evaluation set before ``kb eval`` trusts it.

An evaluation set is a folder with ``corpus/`` (the documents), ``questions.jsonl``
and ``ood.jsonl``. ``kb eval`` counts a retrieval as correct when a returned
chunk's own ``content`` contains the whole needle, so the set is only as good
as its needles: a needle that occurs twice can be "found" in the wrong place, one
inside a heading line is never part of any chunk's content (the chunker puts
headings in the contextual header instead), and a phrasing that quotes its
needle turns the test into string matching. This module catches those mistakes,
and malformed optional language fields (``lang``, ``doc_lang``: ISO 639-1 codes).

Run it as ``python -m evaluation.set_check DIR`` (or ``--set NAME``); without
either it checks the default evaluation set bundled with the package.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

SETS_DIR = Path(__file__).resolve().parent / "sets"
"""The evaluation sets shipped with the package, one folder each (public documentation)."""

DEFAULT_SET = "pip-black"
"""The bundled set ``kb eval`` uses when it is given none."""

BUNDLED_EVALSET = SETS_DIR / DEFAULT_SET
"""The default bundled evaluation set."""

BUNDLED_MIN_PER_KIND = 10
"""A bundled set has at least this many far, adjacent and near-miss OOD questions."""

CORPUS_SUFFIXES = frozenset({".md", ".markdown", ".txt"})
"""Corpus files whose canonical text is the file itself with newlines normalised.

Other formats (HTML, PDF) would need the project's extractor to know the text a
needle is matched against; an evaluation set should ship such documents
converted, so that its needles can be checked here without indexing anything.
"""

QUESTION_FIELDS = ("id", "needle", "doc_phrasing", "ticket_phrasing")
LANG_FIELD = "lang"
DOC_LANG_FIELD = "doc_lang"
_ISO_639_1_CODES = (
    "aa ab ae af ak am an ar as av ay az ba be bg bh bi bm bn bo br bs ca ce ch co cr cs cu "
    "cv cy da de dv dz ee el en eo es et eu fa ff fi fj fo fr fy ga gd gl gn gu gv ha he hi "
    "ho hr ht hu hy hz ia id ie ig ii ik io is it iu ja jv ka kg ki kj kk kl km kn ko kr ks "
    "ku kv kw ky la lb lg li ln lo lt lu lv mg mh mi mk ml mn mr ms mt my na nb nd ne ng nl "
    "nn no nr nv ny oc oj om or os pa pi pl ps pt qu rm rn ro ru rw sa sc sd se sg si sk sl "
    "sm sn so sq sr ss st su sv sw ta te tg th ti tk tl tn to tr ts tt tw ty ug uk ur uz ve "
    "vi vo wa wo xh yi yo za zh zu"
)
ISO_639_1 = frozenset(_ISO_639_1_CODES.split())
"""The two-letter ISO 639-1 language codes (as ``iso-codes`` lists them), lower case."""
OOD_FIELDS = ("id", "question")
OOD_KINDS = frozenset({"adjacent", "near_miss", "far"})
NEEDLE_MIN_CHARS = 10
NEEDLE_MAX_CHARS = 120

# ATX headings as CommonMark writes them: up to three spaces, 1-6 '#', then a
# space or the end of the line. Checked on every line, fenced code included:
# a chunker that does not track fences would take `# comment` in a code block
# for a heading, and a needle there would then be in no chunk's content.
_ATX_HEADING = re.compile(r"^ {0,3}#{1,6}(?:[ \t]|$)")
# The underline of a setext heading (the line above it is the heading).
_SETEXT_UNDERLINE = re.compile(r"^ {0,3}(?:=+|-+)[ \t]*$")


def bundled_sets() -> dict[str, Path]:
    """The bundled evaluation sets by name: every folder of ``SETS_DIR`` holding a corpus."""
    return {
        path.name: path
        for path in sorted(SETS_DIR.iterdir())
        if path.is_dir() and (path / "corpus").is_dir()
    }


def canonical_text(raw: str) -> str:
    """The text a needle is matched against: newlines normalised, BOM dropped.

    Args:
        raw: the decoded file content.

    Returns:
        ``raw`` with ``\\r\\n`` and lone ``\\r`` turned into ``\\n`` and a leading
        byte-order mark removed, as the extractor does for markdown and text.
    """
    return raw.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")


def heading_lines(text: str) -> set[int]:
    """Indices (0-based) of the lines of ``text`` that are, or may be taken for, headings.

    Args:
        text: canonical text.

    Returns:
        ATX heading lines (``# Title``) and setext heading lines (a text line
        underlined with ``===`` or ``---``).
    """
    lines = text.split("\n")
    found: set[int] = set()
    for i, line in enumerate(lines):
        if _ATX_HEADING.match(line):
            found.add(i)
        elif (
            i > 0
            and _SETEXT_UNDERLINE.match(line)
            and lines[i - 1].strip()
            and not _SETEXT_UNDERLINE.match(lines[i - 1])
        ):
            found.add(i - 1)
    return found


def load_corpus(corpus_dir: Path) -> tuple[dict[str, str], list[str]]:
    """Read every corpus document as canonical text.

    Args:
        corpus_dir: the folder of documents (searched recursively; hidden
            files are ignored).

    Returns:
        ``(texts, problems)``: canonical text by path relative to
        ``corpus_dir``, and the problems met while reading.
    """
    problems: list[str] = []
    texts: dict[str, str] = {}
    if not corpus_dir.is_dir():
        return texts, [f"{corpus_dir}: corpus folder not found"]
    for path in sorted(corpus_dir.rglob("*")):
        rel = path.relative_to(corpus_dir)
        if not path.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        if path.suffix.lower() not in CORPUS_SUFFIXES:
            problems.append(
                f"{rel}: needles cannot be checked in a {path.suffix or 'suffix-less'} file; "
                f"ship corpus documents as {', '.join(sorted(CORPUS_SUFFIXES))}"
            )
            continue
        try:
            texts[rel.as_posix()] = canonical_text(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            problems.append(f"{rel}: not UTF-8 text ({exc.reason} at byte {exc.start})")
    if not texts and not problems:
        problems.append(f"{corpus_dir}: the corpus folder has no documents")
    return texts, problems


def _read_jsonl(
    path: Path, fields: Sequence[str], problems: list[str]
) -> list[tuple[int, dict[str, Any]]]:
    """Parse a JSONL file, keeping the records that have every required string field."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        problems.append(f"{path.name}: file not found")
        return []
    except UnicodeDecodeError as exc:
        problems.append(f"{path.name}: not UTF-8 text ({exc.reason} at byte {exc.start})")
        return []
    records: list[tuple[int, dict[str, Any]]] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"{path.name}:{lineno}"
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            problems.append(f"{where}: invalid JSON ({exc.msg})")
            continue
        if not isinstance(record, dict):
            problems.append(f"{where}: expected a JSON object, got {type(record).__name__}")
            continue
        missing = [f for f in fields if not isinstance(record.get(f), str) or not record[f].strip()]
        if missing:
            problems.append(f"{where}: missing or empty field(s): {', '.join(missing)}")
            continue
        rid = record["id"]
        if rid in seen:
            problems.append(f"{where}: duplicate id {rid!r} (first on line {seen[rid]})")
            continue
        seen[rid] = lineno
        records.append((lineno, record))
    return records


def language_problems(record: dict[str, Any], *, ood: bool = False) -> list[str]:
    """Problems of a record's optional language fields (``lang``, and ``doc_lang`` unless ``ood``).

    Each, when present, must be a lower-case ISO 639-1 code (``en``, ``cs``);
    ``doc_lang`` (the language of the document holding the needle, by default
    ``lang``) needs ``lang``. An out-of-domain question has no document, so no
    ``doc_lang``.

    Args:
        record: one parsed JSONL object.
        ood: the record is an out-of-domain question.

    Returns:
        One sentence per problem, without the file and line.
    """
    problems: list[str] = []
    for name in (LANG_FIELD, DOC_LANG_FIELD):
        value = record.get(name)
        if value is not None and value not in ISO_639_1:
            hint = " (lower case)" if isinstance(value, str) and value.lower() in ISO_639_1 else ""
            problems.append(f"{name} {value!r} is not an ISO 639-1 language code{hint}")
    if DOC_LANG_FIELD in record:
        if ood:
            problems.append(f"{DOC_LANG_FIELD} is for in-domain questions only")
        elif LANG_FIELD not in record:
            problems.append(f"{DOC_LANG_FIELD} without {LANG_FIELD}")
    return problems


def _occurrences(needle: str, texts: dict[str, str]) -> list[tuple[str, int]]:
    """Every (document, offset) where ``needle`` starts, overlapping matches included."""
    found: list[tuple[str, int]] = []
    for name, text in texts.items():
        at = text.find(needle)
        while at != -1:
            found.append((name, at))
            at = text.find(needle, at + 1)
    return found


def _check_question(
    where: str,
    record: dict[str, Any],
    texts: dict[str, str],
    headings: dict[str, set[int]],
) -> list[str]:
    """Problems of one question whose required fields are present."""
    problems = [f"{where}: {p}" for p in language_problems(record)]
    needle: str = record["needle"]
    doc: str = record["doc_phrasing"]
    ticket: str = record["ticket_phrasing"]
    if needle != needle.strip():
        # Chunk contents are trimmed, so surrounding whitespace could make a
        # correct chunk fail the containment test.
        problems.append(f"{where}: needle has leading or trailing whitespace")
    if not NEEDLE_MIN_CHARS <= len(needle) <= NEEDLE_MAX_CHARS:
        problems.append(
            f"{where}: needle is {len(needle)} characters; keep it between "
            f"{NEEDLE_MIN_CHARS} and {NEEDLE_MAX_CHARS}"
        )
    hits = _occurrences(needle, texts)
    if not hits:
        problems.append(f"{where}: needle not found in the corpus: {needle!r}")
    elif len(hits) > 1:
        places = ", ".join(f"{name}@{at}" for name, at in hits[:5])
        problems.append(f"{where}: needle occurs {len(hits)} times (must be once): {places}")
    else:
        name, at = hits[0]
        text = texts[name]
        first = text.count("\n", 0, at)
        last = first + needle.count("\n")
        if any(i in headings[name] for i in range(first, last + 1)):
            problems.append(f"{where}: needle is in a heading line of {name} (line {first + 1})")
    if doc.strip().casefold() == ticket.strip().casefold():
        problems.append(f"{where}: doc_phrasing and ticket_phrasing are the same")
    folded = needle.casefold()
    for field, phrasing in (("doc_phrasing", doc), ("ticket_phrasing", ticket)):
        if folded in phrasing.casefold():
            problems.append(f"{where}: {field} contains the needle verbatim")
    return problems


def check_evalset(
    corpus_dir: Path,
    questions: Path,
    ood: Path,
    min_questions: int = 30,
    min_ood: int | None = None,
    min_per_kind: int = 0,
) -> list[str]:
    """Check an evaluation set; an empty list means it is fit for ``kb eval``.

    Checks: both files are valid JSONL with the required non-empty string
    fields and unique ids; every needle is 10-120 characters, occurs exactly
    once in the whole corpus (after newline normalisation) and not within a
    heading line; the two phrasings of a question differ and neither contains
    its needle; OOD ``kind``, when given, is ``adjacent``, ``near_miss`` or
    ``far``; ``lang`` and ``doc_lang``, when given, are ISO 639-1 codes and
    ``doc_lang`` comes with ``lang`` (``language_problems``); and there are enough questions and OOD questions, and, when
    ``min_per_kind`` is set, every OOD question has a kind and each kind
    has at least that many.

    Args:
        corpus_dir: folder of corpus documents (``.md``, ``.markdown``, ``.txt``).
        questions: ``questions.jsonl`` with ``id``, ``needle``, ``doc_phrasing``,
            ``ticket_phrasing``, optionally ``lang`` and ``doc_lang``.
        ood: ``ood.jsonl`` with ``id``, ``question``, optionally ``kind`` and ``lang``.
        min_questions: the fewest questions accepted.
        min_ood: the fewest OOD questions accepted; ``None`` means ``min_questions``.
        min_per_kind: the fewest OOD questions of each kind accepted (0: kinds optional).

    Returns:
        One human-readable sentence per problem, prefixed with the file and line.
    """
    min_ood = min_questions if min_ood is None else min_ood
    texts, problems = load_corpus(corpus_dir)
    headings = {name: heading_lines(text) for name, text in texts.items()}

    records = _read_jsonl(questions, QUESTION_FIELDS, problems)
    for lineno, record in records:
        where = f"{questions.name}:{lineno} ({record['id']})"
        problems.extend(_check_question(where, record, texts, headings))
    if len(records) < min_questions:
        problems.append(
            f"{questions.name}: {len(records)} valid questions, at least {min_questions} needed"
        )

    ood_records = _read_jsonl(ood, OOD_FIELDS, problems)
    seen_questions: dict[str, int] = {}
    for lineno, record in ood_records:
        where = f"{ood.name}:{lineno} ({record['id']})"
        kind = record.get("kind")
        if kind is not None and kind not in OOD_KINDS:
            problems.append(f"{where}: kind {kind!r} is not one of {', '.join(sorted(OOD_KINDS))}")
        problems.extend(f"{where}: {p}" for p in language_problems(record, ood=True))
        key = record["question"].strip().casefold()
        if key in seen_questions:
            problems.append(f"{where}: same question as line {seen_questions[key]}")
        seen_questions.setdefault(key, lineno)
    if len(ood_records) < min_ood:
        problems.append(
            f"{ood.name}: {len(ood_records)} valid OOD questions, at least {min_ood} needed"
        )
    if min_per_kind:
        problems.extend(_kind_problems(ood.name, ood_records, min_per_kind))
    return problems


def _kind_problems(
    name: str, records: list[tuple[int, dict[str, Any]]], min_per_kind: int
) -> list[str]:
    """OOD questions without a kind, and kinds with fewer than ``min_per_kind`` questions."""
    problems = [
        f"{name}:{lineno} ({record['id']}): no kind ({', '.join(sorted(OOD_KINDS))})"
        for lineno, record in records
        if not record.get("kind")
    ]
    for kind in sorted(OOD_KINDS):
        count = sum(1 for _, record in records if record.get("kind") == kind)
        if count < min_per_kind:
            problems.append(f"{name}: {count} {kind} questions, at least {min_per_kind} needed")
    return problems


def main(argv: Sequence[str] | None = None) -> int:
    """Command line entry point: print the problems, exit 1 if there are any.

    Args:
        argv: arguments without the program name; ``None`` reads ``sys.argv``.

    Returns:
        The process exit code: 0 when the set passes, 1 otherwise.
    """
    parser = argparse.ArgumentParser(
        prog="python -m evaluation.set_check",
        description="Check an evaluation set: DIR/corpus/, DIR/questions.jsonl, DIR/ood.jsonl.",
    )
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "directory",
        nargs="?",
        type=Path,
        default=None,
        help="the evaluation set folder (default: every bundled set)",
    )
    where.add_argument("--set", dest="name", metavar="NAME", help="a bundled set, by name")
    parser.add_argument("--min-questions", type=int, default=30, metavar="N")
    parser.add_argument(
        "--min-ood", type=int, default=None, metavar="N", help="default: --min-questions"
    )
    parser.add_argument(
        "--min-per-kind",
        type=int,
        default=None,
        metavar="N",
        help=f"OOD questions of each kind (default: {BUNDLED_MIN_PER_KIND} for a bundled set, "
        "else 0: kinds optional)",
    )
    args = parser.parse_args(argv)
    sets = bundled_sets()
    if args.name is not None and args.name not in sets:
        parser.error(f"no bundled set {args.name!r}; bundled: {', '.join(sets)}")
    roots = (
        [args.directory] if args.directory else [sets[args.name]] if args.name else [*sets.values()]
    )
    status = 0
    for root in roots:
        per_kind = args.min_per_kind
        if per_kind is None:
            per_kind = BUNDLED_MIN_PER_KIND if root.resolve().parent == SETS_DIR else 0
        status |= _check_one(root, args.min_questions, args.min_ood, per_kind)
    return status


def _check_one(root: Path, min_questions: int, min_ood: int | None, min_per_kind: int) -> int:
    """Check one set folder and print its problems or its size; the exit code."""
    problems = check_evalset(
        root / "corpus",
        root / "questions.jsonl",
        root / "ood.jsonl",
        min_questions=min_questions,
        min_ood=min_ood,
        min_per_kind=min_per_kind,
    )
    for problem in problems:
        print(problem)
    if problems:
        print(f"{len(problems)} problem(s) in {root}", file=sys.stderr)
        return 1
    texts, _ = load_corpus(root / "corpus")
    counts = [
        sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
        for path in (root / "questions.jsonl", root / "ood.jsonl")
    ]
    print(
        f"OK: {len(texts)} documents, {sum(map(len, texts.values()))} characters, "
        f"{counts[0]} questions, {counts[1]} out-of-domain questions ({root.name})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
