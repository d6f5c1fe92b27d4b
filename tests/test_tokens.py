"""The BM25 tokeniser keeps identifiers whole and splits them into words."""

from __future__ import annotations

import doctest
from types import ModuleType

import pytest

from index import languages
from index.search import tokens
from index.search.tokens import ANALYZER, PLAIN, TOKENIZER_VERSION, Analyzer, tokenize

CASES = [
    # plain prose: lower-cased words, punctuation dropped
    ("How do I reset my VPN password?", ["how", "do", "i", "reset", "my", "vpn", "password"]),
    ("The end. Next", ["the", "end", "next"]),
    # snake_case and constants: whole, then parts
    ("snake_case", ["snake_case", "snake", "case"]),
    ("action=store_true", ["action", "store_true", "store", "true"]),
    ("ERR_42", ["err_42", "err", "42"]),
    ("MAX_RETRY_COUNT", ["max_retry_count", "max", "retry", "count"]),
    # hyphen and dot joined identifiers
    ("utf-8-sig", ["utf-8-sig", "utf", "8", "sig"]),
    ("foo.bar", ["foo.bar", "foo", "bar"]),
    ("os.path.join", ["os.path.join", "os", "path", "join"]),
    ("2024-01-15", ["2024-01-15", "2024", "01", "15"]),
    ("10.0.0.1", ["10.0.0.1", "10", "0", "0", "1"]),
    ("state-of-the-art", ["state-of-the-art", "state", "of", "the", "art"]),
    ("kb-help", ["kb-help", "kb", "help"]),
    # versions: letters+digits also split (v2 -> v, 2)
    ("v2.3", ["v2.3", "v2", "v", "2", "3"]),
    ("python3", ["python3", "python", "3"]),
    ("2fa", ["2fa", "2", "fa"]),
    ("a3f9c2", ["a3f9c2"]),  # a hash: not split into noise
    # command-line flags and dotfiles keep their leading punctuation
    ("python -bb x.py", ["python", "-bb", "bb", "x.py", "x", "py"]),
    ("--dry-run", ["--dry-run", "dry", "run"]),
    ("(.env)", [".env", "env"]),
    ("~/.bashrc", [".bashrc", "bashrc"]),
    ("- item", ["item"]),  # a list bullet is not a flag
    ("foo--bar", ["foo", "bar"]),  # a double-hyphen dash is not a flag
    # language names with symbols
    ("C++", ["c++", "c"]),
    ("g++ and C#", ["g++", "g", "and", "c#", "c"]),
    ("x+y", ["x", "y"]),
    # markdown underscores are not part of the word
    ("_important_", ["important"]),
    ("__init__", ["init"]),
    ("fill in ____ here", ["fill", "in", "here"]),
    # sentence punctuation around identifiers
    ("see ERR_42.", ["see", "err_42", "err", "42"]),
    ("e.g. this", ["e.g", "e", "g", "this"]),
    ("wait...what", ["wait", "what"]),
    ("alice@example.com", ["alice", "example.com", "example", "com"]),
    # Unicode letters are word characters
    ("Café Über", ["café", "über"]),
    ("cafe\u0301", ["café"]),  # decomposed accent is composed
    ("Straße", ["strasse"]),
    ("İstanbul", ["istanbul"]),
    ("안녕하세요", ["안녕하세요"]),
    ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),
    ("ＡＰＩ", ["api"]),  # full-width forms
    # CJK: each character, then the pair it starts (reading order, for core.proximity)
    ("東京都", ["東", "東京", "京", "京都", "都"]),
    ("APIの設定", ["api", "の", "の設", "設", "設定", "定"]),
    ("", []),
    ("?!", []),
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[c[0] or "empty" for c in CASES])
def test_tokenize(text: str, expected: list[str]) -> None:
    assert tokenize(text) == expected


MATCHES = [
    # (document text, query, a token both must share)
    ("Set the encoding to utf-8-sig in the export dialog.", "what is utf-8-sig", "utf-8-sig"),
    ("Set the encoding to utf-8-sig in the export dialog.", "utf 8 sig encoding", "sig"),
    ("The job fails with ERR_42 when the token expires.", "what does err_42 mean", "err_42"),
    ("The job fails with ERR_42 when the token expires.", "error 42", "42"),
    ("Pass store_true to the --verbose option.", "Store_True flag", "store_true"),
    ("Run python with -bb to turn warnings into errors.", "what does -bb do", "-bb"),
    ("Run python with -bb to turn warnings into errors.", "bb option", "bb"),
    ("Upgrade the client to v2.3 before Monday.", "v2.3 upgrade", "v2.3"),
    ("Import it from foo.bar, not from foo.", "foo.bar module", "foo.bar"),
    ("Our services are written in C++ and Go.", "Which services use C++?", "c++"),
    ("Keep secrets in .env, never in git.", "where is .env", ".env"),
    ("Le café ouvre à 8h.", "Café", "café"),
    ("会議室の予約方法", "予約", "予約"),
]


@pytest.mark.parametrize(("doc", "query", "shared"), MATCHES)
def test_query_tokenised_the_same_way_matches(doc: str, query: str, shared: str) -> None:
    assert shared in set(tokenize(doc)) & set(tokenize(query))


def test_whole_identifier_is_more_specific_than_its_parts() -> None:
    # Only the document that has the identifier shares the whole token.
    query = set(tokenize("ERR_42"))
    assert "err_42" in query & set(tokenize("fails with ERR_42"))
    assert "err_42" not in set(tokenize("err 42"))


def test_repeated_terms_are_kept_as_frequencies() -> None:
    assert tokenize("vpn VPN Vpn").count("vpn") == 3


# ---------------------------------------------------------------- the analysis BM25 indexes


@pytest.mark.parametrize(
    ("words", "stem"),
    [
        (["install", "installs", "installing", "installed"], "instal"),
        (["badge", "badges"], "badg"),
        (["dependency", "dependencies"], "depend"),
        (["cache", "caching", "cached"], "cach"),
    ],
)
def test_forms_of_a_word_are_one_term(words: list[str], stem: str) -> None:
    assert [ANALYZER.document_terms(w) for w in words] == [[stem]] * len(words)
    assert [ANALYZER.query_terms(w.upper()) for w in words] == [[stem]] * len(words)


def test_identifiers_are_kept_whole_and_never_stemmed() -> None:
    assert ANALYZER.document_terms("--dry-run installs store_true ERR_42 v2.3 python3") == [
        "--dry-run",
        "dri",
        "run",
        "instal",
        "store_true",
        "store",
        "true",
        "err_42",
        "err",
        "42",
        "v2.3",
        "v2",
        "v",
        "2",
        "3",
        "python3",
        "python",
        "3",
    ]


def test_words_of_other_scripts_are_not_stemmed() -> None:
    assert ANALYZER.document_terms("Müller cafés 東京") == ["müller", "cafés", "東", "東京", "京"]


def test_stop_words_leave_queries_but_stay_in_documents() -> None:
    text = "How do I stop pip from caching the wheels?"
    assert ANALYZER.query_terms(text) == ["stop", "pip", "cach", "wheel"]
    assert ANALYZER.document_terms(text) == [
        "how", "do", "i", "stop", "pip", "from", "cach", "the", "wheel",
    ]  # fmt: skip
    assert Analyzer(stop_documents=True).document_terms(text) == ANALYZER.query_terms(text)
    # An identifier's parts are words: a stop word among them goes, the identifier stays.
    assert ANALYZER.query_terms("the --no-deps flag") == ["--no-deps", "dep", "flag"]


def test_the_tokeniser_alone_is_the_plain_analysis() -> None:
    text = "How do I stop pip from caching the wheels? store_true"
    assert PLAIN.query_terms(text) == PLAIN.document_terms(text) == tokenize(text)


def test_the_header_line_counts_as_often_as_its_weight() -> None:
    text = "Guide > Badges\nReception replaces them."
    assert Analyzer(header_weight=3).document_terms(text).count("badg") == 3
    assert ANALYZER.document_terms(text).count("badg") == 1


def test_each_analysis_has_its_own_signature() -> None:
    signatures = {
        a.signature
        for a in (ANALYZER, PLAIN, Analyzer(stop_documents=True), Analyzer(header_weight=2))
    }
    assert len(signatures) == 4
    assert str(TOKENIZER_VERSION) in ANALYZER.signature


@pytest.mark.parametrize("module", [tokens, languages])
def test_the_documented_examples_hold(module: ModuleType) -> None:
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
