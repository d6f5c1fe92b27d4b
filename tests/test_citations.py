"""Citation resolution: which brackets are citations, renumbering, and what stays literal."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.citations import Resolved, citation_spans, resolve_citations


def _resolve(answer: str, n: int = 3) -> Resolved:
    return resolve_citations(answer, n)


# --- ordinary citations


def test_valid_citations_renumber_in_order_of_first_appearance() -> None:
    r = _resolve("Rotate keys yearly [3]. Use a vault [1]. Keys are 4096 bits [3].")
    assert r.text == "Rotate keys yearly [1]. Use a vault [2]. Keys are 4096 bits [1]."
    assert r.cited == [3, 1]
    assert r.invalid == []
    assert not r.unsupported


def test_numbers_already_in_order_are_unchanged() -> None:
    r = _resolve("A [1]. B [2].")
    assert (r.text, r.cited) == ("A [1]. B [2].", [1, 2])


@pytest.mark.parametrize(
    ("answer", "text"),
    [
        ("Both [1, 3].", "Both [1, 2]."),
        ("Both [1,3].", "Both [1, 2]."),
        ("Both [ 1 , 3 ].", "Both [1, 2]."),
        ("Both [1][3].", "Both [1][2]."),
        ("Both [1] [3].", "Both [1] [2]."),
    ],
)
def test_group_shapes(answer: str, text: str) -> None:
    r = _resolve(answer)
    assert r.text == text
    assert r.cited == [1, 3]


def test_numbers_inside_a_group_are_sorted_after_renumbering() -> None:
    r = _resolve("First [2]. Then [3, 2].")
    assert r.text == "First [1]. Then [1, 2]."
    assert r.cited == [2, 3]


def test_repeated_citations_keep_one_number() -> None:
    r = _resolve("X [2]. Y [2, 2]. Z [2][2] and [2] [2].")
    assert r.text == "X [1]. Y [1]. Z [1] and [1]."
    assert r.cited == [2]


def test_citation_at_start_of_text_and_line() -> None:
    r = _resolve("[2] says so.\n[1][2] agree.")
    assert r.text == "[1] says so.\n[2][1] agree."
    assert r.cited == [2, 1]


def test_citation_after_punctuation() -> None:
    r = _resolve("Done.[1] (see [2]) and “quoted”[3]")
    assert r.text == "Done.[1] (see [2]) and “quoted”[3]"
    assert r.cited == [1, 2, 3]


# --- out of range


def test_out_of_range_alone_stays_literal_and_is_recorded() -> None:
    r = _resolve("Claim [7]. Other [1].")
    assert r.text == "Claim [7]. Other [1]."
    assert r.cited == [1]
    assert r.invalid == ["[7]"]


def test_mixed_group_keeps_valid_numbers_and_drops_invalid_ones() -> None:
    r = _resolve("Claim [2, 7].")
    assert r.text == "Claim [1]."
    assert r.cited == [2]
    assert r.invalid == ["[2, 7]"]


def test_mixed_run_drops_the_invalid_group_and_its_separator() -> None:
    r = _resolve("Claim [7] [2][9] end.")
    assert r.text == "Claim [1] end."
    assert r.cited == [2]
    assert r.invalid == ["[7]", "[9]"]


def test_zero_is_never_a_citation() -> None:
    r = _resolve("Claim [0]. Other [0, 1].")
    assert r.text == "Claim [0]. Other [1]."
    assert r.cited == [1]
    assert r.invalid == ["[0]", "[0, 1]"]


def test_negative_is_never_a_citation() -> None:
    r = _resolve("Claim [-1].")
    assert r.text == "Claim [-1]."
    assert r.invalid == ["[-1]"]
    assert r.unsupported


def test_year_stays_literal() -> None:
    r = _resolve("Founded in [2020], see [1].")
    assert r.text == "Founded in [2020], see [1]."
    assert r.cited == [1]
    assert r.invalid == ["[2020]"]


def test_no_sources_means_nothing_is_a_citation() -> None:
    r = resolve_citations("Claim [1].", 0)
    assert r.text == "Claim [1]."
    assert r.unsupported
    assert r.invalid == ["[1]"]


def test_very_long_number_is_not_a_citation_shape() -> None:
    r = _resolve("Claim [" + "9" * 5000 + "].")
    assert r.unsupported
    assert r.invalid == []


# --- ranges


@pytest.mark.parametrize("answer", ["All [1-3].", "All [1–3].", "All [1 - 3]."])
def test_valid_range_expands(answer: str) -> None:
    r = resolve_citations(answer, 4)
    assert r.text == "All [1, 2, 3]."
    assert r.cited == [1, 2, 3]


def test_range_is_renumbered_as_a_list() -> None:
    r = resolve_citations("A [4]. B [2-4].", 4)
    assert r.text == "A [1]. B [1, 2, 3]."
    assert r.cited == [4, 2, 3]


@pytest.mark.parametrize("answer", ["See [1-9].", "See [3-1].", "See [0-2]."])
def test_range_with_a_bad_end_is_invalid_as_a_whole(answer: str) -> None:
    r = resolve_citations(answer, 4)
    assert r.text == answer
    assert r.unsupported
    assert len(r.invalid) == 1


def test_year_range_stays_literal() -> None:
    r = _resolve("From [2019-2020] on [1].")
    assert r.text == "From [2019-2020] on [1]."
    assert r.invalid == ["[2019-2020]"]


# --- code


def test_inline_code_is_not_cited() -> None:
    r = _resolve("Use `items[1]` or `` [2] `` here [3].")
    assert r.text == "Use `items[1]` or `` [2] `` here [1]."
    assert r.cited == [3]
    assert r.invalid == []


def test_fenced_block_is_not_cited() -> None:
    answer = "Run:\n```python\nx = [1]\nprint(x[0], [2])\n```\nDone [2].\n~~~\n[3]\n~~~\n"
    r = _resolve(answer)
    assert r.text == answer.replace("Done [2]", "Done [1]")
    assert r.cited == [2]


def test_unclosed_fence_runs_to_the_end() -> None:
    r = _resolve("Before [1].\n```\n[2] inside\n")
    assert r.cited == [1]
    assert r.text == "Before [1].\n```\n[2] inside\n"


def test_unmatched_backtick_is_literal() -> None:
    r = _resolve("A lone ` backtick [2].")
    assert r.cited == [2]


def test_code_span_does_not_cross_a_blank_line() -> None:
    r = _resolve("A ` here [1].\n\nAnd ` there [2].")
    assert r.cited == [1, 2]


def test_fence_closed_by_a_longer_fence_of_the_same_char() -> None:
    r = _resolve("````\n[1]\n```\n[2]\n`````\nout [3]")
    assert r.cited == [3]


# --- links, footnotes, escapes


def test_markdown_links_are_not_citations() -> None:
    r = _resolve("See [the guide](http://x) and [1](http://y) [2].")
    assert r.text == "See [the guide](http://x) and [1](http://y) [1]."
    assert r.cited == [2]


def test_reference_link_is_not_a_citation() -> None:
    r = _resolve("See [docs][1] here.")
    assert r.unsupported
    assert r.invalid == []


def test_footnotes_and_escapes_are_not_citations() -> None:
    r = _resolve("Footnote[^1] and [^2] and \\[3].")
    assert r.text == "Footnote[^1] and [^2] and \\[3]."
    assert r.unsupported


# --- indexing versus a citation glued to a word


@pytest.mark.parametrize(
    "answer",
    [
        "Read a[1] first.",
        "Then x[0][1] is it.",
        "x[1][2]",
        "Use arr_2[1] now.",
        "Use my_list[1] now.",
        "Use obj.items[1] now.",
        "Use arr[1].name now.",
        "Set arr[2] = 5.",
        "Set arr[2]=5.",
        "Call f(x)[1] now.",
        "Use v2[1] now.",
    ],
)
def test_indexing_is_not_a_citation(answer: str) -> None:
    r = _resolve(answer)
    assert r.text == answer
    assert r.unsupported
    assert r.invalid == []


@pytest.mark.parametrize(
    ("answer", "text"),
    [
        ("Restart the service[2].", "Restart the service[1]."),
        ("Restart the service[2]", "Restart the service[1]"),
        ("Restart the service[2], then wait.", "Restart the service[1], then wait."),
        ("(as documented[2]).", "(as documented[1])."),
        ("Per _the runbook_[2] do it.", "Per _the runbook_[1] do it."),
        ("Since 2023[2] it is so.", "Since 2023[1] it is so."),
        ("Both sources[2][3].", "Both sources[1][2]."),
    ],
)
def test_citation_glued_to_a_prose_word(answer: str, text: str) -> None:
    r = _resolve(answer)
    assert r.text == text
    assert not r.unsupported


def test_glued_run_with_an_invalid_number_stays_literal() -> None:
    r = _resolve("Read arr[0][1] first.")
    assert r.text == "Read arr[0][1] first."
    assert r.unsupported
    assert r.invalid == ["[0]"]


def test_bare_prose_indexing_is_read_as_a_citation() -> None:
    # Documented ambiguity: without backticks "arr[2]" looks like "service[2]".
    r = _resolve("Read arr[2] first.")
    assert r.cited == [2]


# --- unicode and edge cases


def test_unicode_text_around_citations() -> None:
    r = _resolve("Die Überweisung dauert 3 Tage[2]. 文書によると[3]です。Café [2] ✓")
    assert r.text == "Die Überweisung dauert 3 Tage[1]. 文書によると[2]です。Café [1] ✓"
    assert r.cited == [2, 3]


def test_non_ascii_digits_are_not_citations() -> None:
    r = _resolve("Claim [١] and [１].")
    assert r.unsupported
    assert r.invalid == []


def test_empty_answer() -> None:
    assert resolve_citations("", 3) == Resolved(text="", cited=[], invalid=[], unsupported=True)


def test_answer_without_citations_is_unsupported() -> None:
    r = _resolve("The sky is blue.")
    assert r.unsupported
    assert r.text == "The sky is blue."


# --- spans on the rewritten text


def test_spans_cover_each_citation_group() -> None:
    r = _resolve("A [3]. B [1, 3] and [2020] and `[1]`. C [2][3].")
    assert r.text == "A [1]. B [1, 2] and [2020] and `[1]`. C [3][1]."
    spans = citation_spans(r.text, len(r.cited))
    assert [(r.text[a:b], nums) for a, b, nums in spans] == [
        ("[1]", [1]),
        ("[1, 2]", [1, 2]),
        ("[3]", [3]),
        ("[1]", [1]),
    ]
    assert r.spans == spans


def test_spans_skip_literal_brackets() -> None:
    r = _resolve("Year [2020], index a[1], none.")
    assert citation_spans(r.text, len(r.cited)) == []


# --- properties

_ANSWER_CHARS = st.sampled_from(list("[]()`~^\\0123456789,-– \n_ab.=éあ"))
_answers = st.one_of(st.text(_ANSWER_CHARS, max_size=60), st.text(max_size=60))


@settings(max_examples=300, deadline=None)
@given(answer=_answers, n_sources=st.integers(min_value=0, max_value=12))
def test_resolution_never_raises_and_cites_only_real_sources(answer: str, n_sources: int) -> None:
    r = resolve_citations(answer, n_sources)
    assert all(1 <= n <= n_sources for n in r.cited)
    assert len(set(r.cited)) == len(r.cited)
    assert r.unsupported == (not r.cited)
    spans = citation_spans(r.text, len(r.cited))
    seen = list(dict.fromkeys(n for _, _, nums in spans for n in nums))
    assert seen == list(range(1, len(r.cited) + 1))


@settings(max_examples=300, deadline=None)
@given(answer=_answers, n_sources=st.integers(min_value=0, max_value=12))
def test_resolving_a_resolved_text_changes_nothing(answer: str, n_sources: int) -> None:
    r = resolve_citations(answer, n_sources)
    again = resolve_citations(r.text, len(r.cited))
    assert again.text == r.text
    assert again.cited == list(range(1, len(r.cited) + 1))
