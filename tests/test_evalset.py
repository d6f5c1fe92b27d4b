"""The evaluation-set checker, run on the bundled set, the CI mini set and broken fixtures."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import pytest

from evaluation.inputs import (
    EvalSetError,
    bundled_set,
    bundled_set_names,
    load_ood,
    load_questions,
)
from evaluation.set_check import (
    BUNDLED_EVALSET,
    BUNDLED_MIN_PER_KIND,
    DEFAULT_SET,
    bundled_sets,
    canonical_text,
    check_evalset,
    heading_lines,
    load_corpus,
    main,
)

REPO = Path(__file__).resolve().parents[1]
EVALMINI = Path(__file__).resolve().parent / "data" / "evalmini"


def _check(root: Path, **kwargs: int) -> list[str]:
    return check_evalset(root / "corpus", root / "questions.jsonl", root / "ood.jsonl", **kwargs)


def _jsonl(path: Path) -> list[dict[str, str]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]


# --- the bundled sets --------------------------------------------------------

SETS = sorted(bundled_sets())


def test_the_default_set_is_bundled() -> None:
    assert DEFAULT_SET == "pip-black" and bundled_sets()[DEFAULT_SET] == BUNDLED_EVALSET
    assert bundled_set().corpus == BUNDLED_EVALSET / "corpus"
    assert bundled_set_names() == SETS and len(SETS) >= 1


def test_an_unknown_set_names_the_bundled_ones() -> None:
    with pytest.raises(EvalSetError, match="choose one of: .*pip-black"):
        bundled_set("no-such-set")


@pytest.mark.parametrize("name", SETS)
def test_bundled_set_passes(name: str) -> None:
    assert _check(bundled_sets()[name], min_per_kind=BUNDLED_MIN_PER_KIND) == []


@pytest.mark.parametrize("name", SETS)
def test_bundled_set_documents_its_sources(name: str) -> None:
    root = bundled_sets()[name]
    sources = (root / "SOURCES.md").read_text(encoding="utf-8")
    assert (root / "LICENSE-corpus.md").read_text(encoding="utf-8").strip()
    for path in (root / "corpus").rglob("*"):
        if path.is_file():
            rel = path.relative_to(root / "corpus").as_posix()
            assert f"`{rel}`" in sources, f"{rel} has no origin in {name}/SOURCES.md"


@pytest.mark.parametrize("name", SETS)
def test_near_misses_reuse_corpus_words(name: str) -> None:
    # A near miss is only a near miss if the corpus has its words but not its answer.
    root = bundled_sets()[name]
    corpus = "\n".join(load_corpus(root / "corpus")[0].values()).lower()
    near = [o for o in _jsonl(root / "ood.jsonl") if o["kind"] == "near_miss"]
    assert near
    for o in near:
        words = [w.strip("?,.'").lower() for w in o["question"].split() if len(w) > 4]
        assert any(w in corpus for w in words), o["id"]


def test_pip_black_has_the_documented_shape() -> None:
    texts, problems = load_corpus(BUNDLED_EVALSET / "corpus")
    assert problems == []
    assert 8 <= len(texts) <= 15
    assert 150_000 <= sum(map(len, texts.values())) <= 400_000

    questions = _jsonl(BUNDLED_EVALSET / "questions.jsonl")
    assert len(questions) >= 32
    # Needles stay on one line, so only a cut inside a line can destroy them.
    assert all("\n" not in q["needle"] for q in questions)
    # Every document is asked about.
    corpus = "\n".join(texts.values())
    assert all(q["needle"] in corpus for q in questions)
    asked = {name for name, text in texts.items() for q in questions if q["needle"] in text}
    assert asked == set(texts)

    ood = _jsonl(BUNDLED_EVALSET / "ood.jsonl")
    assert len(ood) == 30
    assert Counter(o["kind"] for o in ood) == {"adjacent": 10, "near_miss": 10, "far": 10}
    licences = (BUNDLED_EVALSET / "LICENSE-corpus.md").read_text(encoding="utf-8")
    assert licences.count("Permission is hereby granted") == 2


def test_prometheus_has_the_documented_shape() -> None:
    root = bundled_sets()["prometheus"]
    texts, problems = load_corpus(root / "corpus")
    assert problems == []
    assert sum(map(len, texts.values())) >= 300_000
    questions = _jsonl(root / "questions.jsonl")
    assert len(questions) >= 50
    assert all("\n" not in q["needle"] for q in questions)
    asked = {name for name, text in texts.items() for q in questions if q["needle"] in text}
    assert len(asked) >= 30
    ood = _jsonl(root / "ood.jsonl")
    assert len(ood) >= 30
    licences = (root / "LICENSE-corpus.md").read_text(encoding="utf-8")
    assert "Apache License" in licences and "Version 2.0, January 2004" in licences


# --- the CI mini set ---------------------------------------------------------


def test_evalmini_passes_apart_from_the_minimum_size() -> None:
    assert _check(EVALMINI, min_questions=4) == []
    problems = _check(EVALMINI)
    assert len(problems) == 2
    assert all("at least 30 needed" in p for p in problems)


def test_evalmini_is_hand_countable() -> None:
    texts, _ = load_corpus(EVALMINI / "corpus")
    assert len(texts) == 3
    assert all(1_500 <= len(t) <= 4_000 for t in texts.values())
    questions = _jsonl(EVALMINI / "questions.jsonl")
    assert len(questions) == 6
    # Two needles per document, each in its own paragraph.
    per_doc = Counter(name for q in questions for name, t in texts.items() if q["needle"] in t)
    assert sorted(per_doc.values()) == [2, 2, 2]
    paragraphs = [p for t in texts.values() for p in t.split("\n\n")]
    holders = [next(i for i, p in enumerate(paragraphs) if q["needle"] in p) for q in questions]
    assert len(set(holders)) == len(holders)
    assert len(_jsonl(EVALMINI / "ood.jsonl")) == 4


# --- broken fixtures ---------------------------------------------------------

GOOD_DOC = """# Widget service

## Deploying

The widget service deploys from the release branch every Tuesday at noon.

Rollbacks take about four minutes and need no approval.

## Limits

Each widget may hold at most 500 gadgets.
"""


def _question(qid: str, needle: str, **over: str) -> dict[str, str]:
    record = {
        "id": qid,
        "needle": needle,
        "doc_phrasing": f"Question {qid} in the documentation's words?",
        "ticket_phrasing": f"ticket about {qid} pls help",
    }
    record.update(over)
    return record


def _make_set(
    root: Path,
    questions: Sequence[dict[str, str] | str],
    ood: Sequence[dict[str, str] | str] | None = None,
    docs: dict[str, str] | None = None,
) -> Path:
    """Write an evaluation set; string items are written as raw JSONL lines."""
    corpus = root / "corpus"
    corpus.mkdir(parents=True)
    for name, text in (docs or {"widgets.md": GOOD_DOC}).items():
        (corpus / name).write_bytes(text.encode("utf-8"))
    if ood is None:
        ood = [{"id": "o1", "question": "How do I cook paella?", "kind": "far"}]

    def dump(items: Sequence[dict[str, str] | str]) -> str:
        return "".join((i if isinstance(i, str) else json.dumps(i)) + "\n" for i in items)

    (root / "questions.jsonl").write_text(dump(questions), encoding="utf-8")
    (root / "ood.jsonl").write_text(dump(ood), encoding="utf-8")
    return root


def _problems(root: Path) -> list[str]:
    return _check(root, min_questions=1)


def test_a_small_good_set_passes(tmp_path: Path) -> None:
    root = _make_set(
        tmp_path,
        [
            _question("q1", "deploys from the release branch every Tuesday"),
            _question("q2", "Each widget may hold at most 500 gadgets."),
        ],
    )
    assert _problems(root) == []


def test_duplicate_needle_is_reported(tmp_path: Path) -> None:
    docs = {"widgets.md": GOOD_DOC, "copy.md": "Rollbacks take about four minutes here too.\n"}
    root = _make_set(tmp_path, [_question("q1", "Rollbacks take about four minutes")], docs=docs)
    [problem] = _problems(root)
    assert "q1" in problem and "occurs 2 times" in problem


def test_needle_within_one_document_twice_is_reported(tmp_path: Path) -> None:
    doc = GOOD_DOC + "\nThe widget service deploys from the release branch again.\n"
    root = _make_set(
        tmp_path, [_question("q1", "deploys from the release branch")], docs={"w.md": doc}
    )
    assert any("occurs 2 times" in p for p in _problems(root))


def test_heading_needles_are_reported(tmp_path: Path) -> None:
    doc = GOOD_DOC + "\n### Rollback policy for widget gadgets\n\nText.\n\nSetext title here\n---\n"
    root = _make_set(
        tmp_path,
        [
            _question("whole", "Rollback policy for widget gadgets"),
            _question("inside", "policy for widget"),
            _question("setext", "Setext title here"),
        ],
        docs={"w.md": doc},
    )
    problems = _problems(root)
    assert len(problems) == 3
    assert all("heading line" in p for p in problems)


def test_missing_field_and_bad_records_are_reported(tmp_path: Path) -> None:
    no_ticket = _question("q2", "Each widget may hold at most 500 gadgets.")
    del no_ticket["ticket_phrasing"]
    root = _make_set(
        tmp_path,
        [
            _question("q1", "deploys from the release branch every Tuesday"),
            no_ticket,
            _question("q3", "Rollbacks take about four minutes", doc_phrasing="   "),
            "{not json",
            "[1, 2]",
            _question("q1", "need no approval"),
        ],
    )
    problems = _problems(root)
    assert any(":2: missing or empty field(s): ticket_phrasing" in p for p in problems)
    assert any(":3: missing or empty field(s): doc_phrasing" in p for p in problems)
    assert any(":4: invalid JSON" in p for p in problems)
    assert any(":5: expected a JSON object" in p for p in problems)
    assert any("duplicate id 'q1'" in p for p in problems)
    assert len(problems) == 5


def test_phrasing_problems_are_reported(tmp_path: Path) -> None:
    root = _make_set(
        tmp_path,
        [
            _question(
                "copies",
                "Rollbacks take about four minutes",
                ticket_phrasing="why do rollbacks take about four minutes??",
            ),
            _question(
                "same",
                "Each widget may hold at most 500 gadgets.",
                doc_phrasing="How many gadgets per widget?",
                ticket_phrasing="how many gadgets per widget?",
            ),
        ],
    )
    problems = _problems(root)
    assert any("copies" in p and "ticket_phrasing contains the needle" in p for p in problems)
    assert any("same" in p and "are the same" in p for p in problems)
    assert len(problems) == 2


def test_needle_size_and_presence_are_checked(tmp_path: Path) -> None:
    root = _make_set(
        tmp_path,
        [
            _question("short", "Tuesday"),
            _question("absent", "Widgets are deployed by carrier pigeon."),
            _question("padded", " need no approval"),
        ],
    )
    problems = _problems(root)
    assert any("short" in p and "7 characters" in p for p in problems)
    assert any("absent" in p and "not found" in p for p in problems)
    assert any("padded" in p and "whitespace" in p for p in problems)


def test_crlf_corpus_is_matched_after_newline_normalisation(tmp_path: Path) -> None:
    doc = "# Title\r\n\r\nFirst line of the answer\r\nsecond line of the answer.\r\n"
    root = _make_set(
        tmp_path,
        [_question("q1", "answer\nsecond line")],
        docs={"crlf.md": doc},
    )
    assert _problems(root) == []
    assert canonical_text("\ufeffa\r\nb\rc") == "a\nb\nc"


def test_ood_problems_are_reported(tmp_path: Path) -> None:
    root = _make_set(
        tmp_path,
        [_question("q1", "Each widget may hold at most 500 gadgets.")],
        ood=[
            {"id": "o1", "question": "How do I cook paella?", "kind": "far"},
            {"id": "o2", "question": "how do I cook paella?"},
            {"id": "o3", "question": "Offside rule?", "kind": "sports"},
            {"id": "o1", "question": "Passport renewal?"},
            {"id": "o5"},
        ],
    )
    problems = _problems(root)
    assert any("o2" in p and "same question as line 1" in p for p in problems)
    assert any("o3" in p and "kind 'sports'" in p for p in problems)
    assert any("duplicate id 'o1'" in p for p in problems)
    assert any(":5: missing or empty field(s): question" in p for p in problems)
    assert len(problems) == 4


def test_ood_kinds_are_counted_when_asked(tmp_path: Path) -> None:
    root = _make_set(
        tmp_path,
        [_question("q1", "Each widget may hold at most 500 gadgets.")],
        ood=[
            {"id": "o1", "question": "How do I cook paella?", "kind": "far"},
            {"id": "o2", "question": "How do I renew a passport?", "kind": "far"},
            {"id": "o3", "question": "How do gadgets get painted?", "kind": "near_miss"},
            {"id": "o4", "question": "What is a widget factory?"},
        ],
    )
    assert _problems(root) == []
    problems = _check(root, min_questions=1, min_per_kind=2)
    assert problems == [
        "ood.jsonl:4 (o4): no kind (adjacent, far, near_miss)",
        "ood.jsonl: 0 adjacent questions, at least 2 needed",
        "ood.jsonl: 1 near_miss questions, at least 2 needed",
    ]


def test_language_fields_are_accepted(tmp_path: Path) -> None:
    root = _make_set(
        tmp_path,
        [
            _question("q1", "deploys from the release branch every Tuesday", lang="cs"),
            _question("q2", "Each widget may hold at most 500 gadgets.", lang="da", doc_lang="en"),
            _question("q3", "Rollbacks take about four minutes", lang="en", doc_lang="en"),
            _question("q4", "need no approval"),
        ],
        ood=[
            {"id": "o1", "question": "Comment cuisiner une paella ?", "kind": "far", "lang": "fr"},
            {"id": "o2", "question": "Cum îmi reînnoiesc pașaportul?", "lang": "ro"},
            {"id": "o3", "question": "How do I cook paella?"},
        ],
    )
    assert _problems(root) == []
    questions = load_questions(root / "questions.jsonl")
    assert [(q.lang, q.doc_lang, q.cross_lingual) for q in questions] == [
        ("cs", "cs", False),  # doc_lang defaults to lang
        ("da", "en", True),
        ("en", "en", False),
        ("", "", False),
    ]
    assert [o.lang for o in load_ood(root / "ood.jsonl")] == ["fr", "ro", ""]


def test_bad_language_fields_are_reported(tmp_path: Path) -> None:
    root = _make_set(
        tmp_path,
        [
            _question("upper", "deploys from the release branch every Tuesday", lang="EN"),
            _question("three", "Each widget may hold at most 500 gadgets.", lang="ces"),
            _question("unknown", "Rollbacks take about four minutes", lang="xx"),
            _question("orphan", "need no approval", doc_lang="en"),
            {**_question("number", "The widget service deploys"), "lang": 5},  # type: ignore[dict-item]
        ],
        ood=[
            {"id": "o1", "question": "How do I cook paella?", "lang": "fr", "doc_lang": "en"},
            {"id": "o2", "question": "How do I renew a passport?", "lang": "Fr"},
        ],
    )
    assert _problems(root) == [
        "questions.jsonl:1 (upper): lang 'EN' is not an ISO 639-1 language code (lower case)",
        "questions.jsonl:2 (three): lang 'ces' is not an ISO 639-1 language code",
        "questions.jsonl:3 (unknown): lang 'xx' is not an ISO 639-1 language code",
        "questions.jsonl:4 (orphan): doc_lang without lang",
        "questions.jsonl:5 (number): lang 5 is not an ISO 639-1 language code",
        "ood.jsonl:1 (o1): doc_lang is for in-domain questions only",
        "ood.jsonl:2 (o2): lang 'Fr' is not an ISO 639-1 language code (lower case)",
    ]
    with pytest.raises(EvalSetError, match=r"questions.jsonl:1: lang 'EN' is not an ISO 639-1"):
        load_questions(root / "questions.jsonl")
    with pytest.raises(EvalSetError, match=r"ood.jsonl:1: doc_lang is for in-domain questions"):
        load_ood(root / "ood.jsonl")
    (root / "questions.jsonl").write_text(
        json.dumps(_question("orphan", "need no approval", doc_lang="en")) + "\n"
    )
    with pytest.raises(EvalSetError, match="doc_lang without lang"):
        load_questions(root / "questions.jsonl")


def test_minimum_sizes(tmp_path: Path) -> None:
    root = _make_set(tmp_path, [_question("q1", "Each widget may hold at most 500 gadgets.")])
    assert _check(root, min_questions=1) == []
    problems = _check(root, min_questions=2, min_ood=1)
    assert problems == ["questions.jsonl: 1 valid questions, at least 2 needed"]
    problems = _check(root, min_questions=1, min_ood=3)
    assert problems == ["ood.jsonl: 1 valid OOD questions, at least 3 needed"]


def test_unreadable_corpus_and_missing_files(tmp_path: Path) -> None:
    docs = {"page.html": "<p>Each widget may hold at most 500 gadgets.</p>", "w.md": GOOD_DOC}
    root = _make_set(
        tmp_path, [_question("q1", "Each widget may hold at most 500 gadgets.")], docs=docs
    )
    (root / "corpus" / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    (root / "corpus" / ".hidden.md").write_text("ignored", encoding="utf-8")
    (root / "ood.jsonl").unlink()
    problems = _problems(root)
    assert any("page.html" in p and "cannot be checked" in p for p in problems)
    assert any("latin1.txt" in p and "not UTF-8" in p for p in problems)
    assert any("ood.jsonl: file not found" in p for p in problems)
    assert not any("hidden" in p for p in problems)

    empty = tmp_path / "empty"
    (empty / "corpus").mkdir(parents=True)
    assert any("no documents" in p for p in _check(empty, min_questions=0))
    assert any("corpus folder not found" in p for p in _check(tmp_path / "nowhere"))


def test_heading_lines_include_fenced_lines_conservatively() -> None:
    text = "# Title\n\ntext\n\n```python\n# a comment\n```\n\nSetext\n===\n\n   ## indented\n#nospace\n"
    assert heading_lines(text) == {0, 5, 8, 11}


# --- the command line --------------------------------------------------------


def test_main_reports_ok_and_problems(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(BUNDLED_EVALSET)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: 15 documents")
    assert main(["--set", DEFAULT_SET]) == 0
    assert capsys.readouterr().out.endswith("(pip-black)\n")
    with pytest.raises(SystemExit):
        main(["--set", "no-such-set"])
    err = capsys.readouterr().err
    assert "bundled: " in err and "pip-black" in err.partition("bundled: ")[2]

    assert main([str(EVALMINI)]) == 1
    assert "at least 30 needed" in capsys.readouterr().out
    assert main([str(EVALMINI), "--min-questions", "4"]) == 0

    root = _make_set(tmp_path / "bad", [_question("q1", "Tuesday at noon")] * 2)
    assert main([str(root), "--min-questions", "1"]) == 1
    captured = capsys.readouterr()
    assert "duplicate id 'q1'" in captured.out
    assert "problem(s)" in captured.err


def test_module_runs_as_a_script() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "evaluation.set_check"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    # Without arguments it checks every bundled set.
    assert result.stdout.count("OK:") == len(SETS)
