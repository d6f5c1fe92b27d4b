"""Block Kit rendering: escaping, citation links, limits, every outcome."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from slack_sdk.models.blocks import Block
from slack_sdk.models.views import View

from bot.slack import messages
from bot.slack.blocks import (
    Rendered,
    escape,
    parse_feedback_value,
    render_answer,
    render_notice,
    render_partial,
    render_upload_status,
    upload_modal,
)
from bot.slack.blocks.mrkdwn import link_citations, split_mrkdwn
from bot.slack.words import words_for
from core.answer import Answer, Outcome, SourceRef
from core.gate import MAX_RELATED

URL = "https://kb.example/d/{n}?t=tok.en-{n}#char=0,10"
HOSTILE = "<!channel> <!here> <@U123> <https://evil.example|click> & <#C1>"
FORBIDDEN = ("<!channel>", "<!here>", "<@U123>", "<https://evil.example", "<#C1>")


def _source(
    n: int, quote: str = "Submit claims within 30 days.", document: str = "Handbook"
) -> SourceRef:
    return SourceRef(
        n=n,
        chunk_id=10 + n,
        document_id=n,
        document=document,
        section="Expenses",
        page=None,
        start=0,
        end=len(quote),
        url=URL.format(n=n),
        quote=quote,
        distance=0.2,
    )


def _answer(
    text: str,
    sources: list[SourceRef],
    outcome: Outcome = Outcome.ANSWERED,
    kept: list[SourceRef] | None = None,
) -> Answer:
    return Answer(
        question="q",
        outcome=outcome,
        answer=text,
        grounded=outcome == Outcome.ANSWERED,
        model_called=outcome != Outcome.REFUSED,
        sources=sources,
        kept=kept if kept is not None else sources,
        query_id=42,
    )


def _all_text(r: Rendered) -> str:
    return json.dumps(r.blocks, ensure_ascii=False) + r.text


def _section_texts(r: Rendered) -> list[str]:
    return [b["text"]["text"] for b in r.blocks if b["type"] == "section"]


def _check_limits(r: Rendered) -> None:
    # slack_sdk checks each block whole as it builds it from the JSON: a section's
    # 3000 characters, a context's 10 elements, a button's 75 characters...
    for block in r.blocks:
        model = Block.parse(block)
        assert model is not None, block
        model.to_dict()
    # What it does not check, as Slack documents it: "up to 50 blocks in each message"
    # (https://docs.slack.dev/reference/block-kit/blocks), a section's text of at least
    # 1 character (https://docs.slack.dev/reference/block-kit/blocks/section-block).
    assert len(r.blocks) <= 50
    assert 0 < len(r.text) <= 3000  # the fallback text is kept as short as a section
    for text in _section_texts(r):
        assert len(text) > 0
        # Every link is whole (each "<" closed before the next) and no "&" is cut from its entity.
        assert not re.search(r"<[^>]*(<|$)", text)
        assert not re.search(r"&(?!amp;|lt;|gt;)", text)


def test_escape() -> None:
    assert escape("a & b < c > d") == "a &amp; b &lt; c &gt; d"
    assert escape("&amp;") == "&amp;amp;"


def test_citations_become_links_only_for_cited_sources() -> None:
    text = "Claims take 30 days [1]. Receipts too [1, 2]. The year [2020] stays. Not [3]."
    out = link_citations(text, [_source(1), _source(2)])
    assert out.count(f"<{URL.format(n=1)}|[1]>") == 2
    assert f"<{URL.format(n=2)}|[2]>" in out
    assert "[2020]" in out and "[3]" in out and "|[3]>" not in out


def test_answer_lists_only_cited_sources_with_short_quotes() -> None:
    long_quote = "word " * 200
    cited = _source(1, quote=long_quote)
    uncited = _source(2, quote="Never shown.", document="Other doc")
    r = render_answer(_answer("Yes [1].", [cited], kept=[cited, uncited]), words=words_for("en"))
    sources = [t for t in _section_texts(r) if t.startswith(messages.SOURCES_HEADER)]
    assert len(sources) == 1
    assert "Handbook" in sources[0] and "Other doc" not in _all_text(r)
    quote_line = next(line for line in sources[0].splitlines() if line.startswith("> "))
    assert len(quote_line) <= 2 + 200 and quote_line.endswith("…")
    _check_limits(r)


def test_everything_from_model_and_documents_is_escaped() -> None:
    source = _source(1, quote=f"Quote {HOSTILE}", document=f"Doc {HOSTILE}")
    for answer in (
        _answer(f"Model says {HOSTILE} [1].", [source]),
        _answer(f"Model says {HOSTILE}.", [], Outcome.UNSUPPORTED, kept=[source]),
        _answer(messages.EVIDENCE_FALLBACK, [source], Outcome.MODEL_UNAVAILABLE),
    ):
        r = render_answer(answer, words=words_for("en"))
        everything = _all_text(r)
        for forbidden in FORBIDDEN:
            assert forbidden not in everything, (answer.outcome, forbidden)
        assert "&lt;!channel&gt;" in everything
        _check_limits(r)


def test_long_answer_is_split_within_block_kit_limits() -> None:
    sources = [_source(i) for i in range(1, 5)]
    paragraph = " ".join(f"Sentence {i} about claims & receipts [{i % 4 + 1}]." for i in range(40))
    text = "\n\n".join([paragraph] * 12)
    r = render_answer(_answer(text, sources), words=words_for("en"))
    _check_limits(r)
    sections = _section_texts(r)
    assert len([s for s in sections if not s.startswith(messages.SOURCES_HEADER)]) > 3
    answer_text = "".join(s for s in sections if not s.startswith(messages.SOURCES_HEADER))
    assert answer_text.count("|[1]>") == text.count("[1]"), "no citation lost at a split"


def test_huge_answer_is_truncated_to_fifty_blocks() -> None:
    text = ("A very long line without paragraph breaks & more " * 4000) + " [1]"
    r = render_answer(_answer(text, [_source(1)]), words=words_for("en"))
    _check_limits(r)
    assert len(r.blocks) == 50  # Slack's limit of a message, filled
    assert messages.TRUNCATED in _all_text(r)
    assert r.blocks[-1]["type"] == "context_actions"


def test_split_never_cuts_links_or_entities() -> None:
    link = "<https://kb.example/d/1?t=abc#char=0,5|[1]>"
    text = ("x" * 2990) + link + ("&amp;" * 5) + ("y" * 50)
    pieces = split_mrkdwn(text, 3000)
    assert all(len(p) <= 3000 for p in pieces)
    assert "".join(pieces) == text
    assert any(p.startswith(link) for p in pieces)
    tight = "&lt;" * 1000
    assert all(not p.endswith("&") for p in split_mrkdwn(tight, 3001 - 2))


def test_unsupported_answer_is_flagged() -> None:
    r = render_answer(
        _answer("I think so.", [], Outcome.UNSUPPORTED, kept=[]), words=words_for("en")
    )
    assert r.blocks[0]["type"] == "context"
    assert messages.UNSUPPORTED_WARNING in _all_text(r)
    assert messages.UNSUPPORTED_WARNING in r.text
    assert messages.UNCITED_HEADER not in _all_text(r)


def test_uncited_answer_shows_the_passages_it_was_given_as_not_cited() -> None:
    kept = [_source(n, quote=f"Passage number {n}.") for n in range(1, 6)]
    text = "The knowledge base does not say how long data is kept."
    r = render_answer(_answer(text, [], Outcome.UNSUPPORTED, kept=kept), words=words_for("en"))
    _check_limits(r)
    sections = _section_texts(r)
    assert sections[0] == text
    header = sections.index(messages.UNCITED_HEADER)
    listed = "\n".join(sections[header + 1 :])
    # A pointer, not a reading list: the first MAX_RELATED (4), each with its link.
    assert MAX_RELATED == 4
    for n in (1, 2, 3, 4):
        assert f"Passage number {n}." in listed and URL.format(n=n) in listed
    assert "Passage number 5." not in _all_text(r)
    assert messages.SOURCES_HEADER not in _all_text(r)
    assert messages.UNCITED_REASON in _all_text(r)
    assert r.text.startswith(messages.UNSUPPORTED_WARNING)
    assert messages.UNCITED_FALLBACK in r.text and "Passage number 3." in r.text
    assert r.blocks[-1]["type"] == "context_actions"  # feedback stays last


def test_refusal_explains_how_to_add_documents() -> None:
    r = render_answer(_answer("", [], Outcome.REFUSED), words=words_for("en"))
    assert "/kb-upload" in r.text and "nothing on this" in r.text
    assert "|[" not in _all_text(r)


def test_evidence_is_marked_as_no_answer_with_links() -> None:
    kept = [_source(1), _source(2, quote="VPN DNS is 10.20.0.53.")]
    r = render_answer(
        _answer(messages.EVIDENCE_FALLBACK, kept, Outcome.MODEL_UNAVAILABLE), words=words_for("en")
    )
    assert "No answer generated" in r.blocks[0]["text"]["text"]
    assert r.text.startswith("No answer generated")
    assert f"<{URL.format(n=2)}|[2]>" in _all_text(r) and "10.20.0.53" in _all_text(r)
    _check_limits(r)


def test_markdown_bold_and_headings_become_mrkdwn() -> None:
    r = render_answer(
        _answer("## Steps\n**Submit** the claim [1].", [_source(1)]), words=words_for("en")
    )
    assert _section_texts(r)[0].startswith("*Steps*\n*Submit* the claim")


def test_feedback_buttons_carry_the_query_id() -> None:
    r = render_answer(_answer("Yes [1].", [_source(1)]), words=words_for("en"))
    (block,) = [b for b in r.blocks if b["type"] == "context_actions"]
    element = block["elements"][0]
    assert element["type"] == "feedback_buttons"
    assert parse_feedback_value(element["positive_button"]["value"]) == (42, 1)
    assert parse_feedback_value(element["negative_button"]["value"]) == (42, -1)
    assert parse_feedback_value("positive:abc") is None and parse_feedback_value("meh:1") is None


@pytest.mark.parametrize("text", ["", "Partial <!here> answer [1", "x" * 5000])
def test_partial_answer_is_escaped_and_bounded(text: str) -> None:
    r = render_partial(text, words=words_for("en"))
    _check_limits(r)
    assert "<!here>" not in _all_text(r)


def test_upload_status_and_modal() -> None:
    r = render_upload_status("failed", retry_document_id=7, words=words_for("en"))
    assert r.blocks[1]["elements"][0]["value"] == "7"
    modal = upload_modal('{"channel": "C1"}', channel_scope_allowed=True, words=words_for("en"))
    # slack_sdk's View checks the modal (a title within 24 characters...) and each block in it.
    View(**modal).to_dict()
    assert modal["private_metadata"] == '{"channel": "C1"}'


def test_a_notice_or_status_longer_than_a_section_is_split_never_refused() -> None:
    # A failure reason can quote a long name or a document's words: the status still renders,
    # in sections within Slack's 3000 characters of a text object, and says all of it.
    reason = "Sheet *Budget* could not be read: " + "cell A1 is a formula; " * 400
    for r in (
        render_notice(reason),
        render_upload_status(reason, retry_document_id=3, words=words_for("en")),
    ):
        _check_limits(r)
        sections = [b["text"]["text"] for b in r.blocks if b["type"] == "section"]
        assert len(sections) == 3
        assert all(len(t) <= 3000 for t in sections)
        assert " ".join(sections).split() == reason.split()


def _links(rendered: Rendered) -> list[str]:
    """Every ``<...>`` token Slack would turn into a link or mention, in blocks and fallback."""
    return re.findall(r"<([^<>]+)>", json.dumps([rendered.text, rendered.blocks]))


def _bare_urls_outside_code(text: str) -> list[str]:
    # Code spans are inert; <...> tokens are the server's links, checked separately.
    without_code = re.sub(r"`[^`]*`|<[^<>]*>", "", text)
    return re.findall(r"https?://\S+|www\.\S+|\b[\w.+-]+@[\w-]+\.\w+", without_code)


@pytest.mark.parametrize(
    "answer_text",
    [
        "Reset it at https://evil.example/reset [1].",
        "Reset it [here](http://phish.example/login) [1].",
        "Mail it to payroll@evil.example or see www.evil.example [1].",
    ],
)
def test_urls_the_model_wrote_are_inert_text(answer_text: str) -> None:
    rendered = render_answer(_answer(answer_text, [_source(1)]), words=words_for("en"))
    # The only links are the server's citation links.
    assert all(link.startswith("https://kb.example/d/") for link in _links(rendered))
    for block_text in [rendered.text, *(json.dumps(b) for b in rendered.blocks)]:
        assert _bare_urls_outside_code(block_text) == []


def test_a_url_quoted_verbatim_from_a_cited_passage_stays_as_written() -> None:
    passage = "The VPN portal is https://vpn.corp.example/start for everyone."
    rendered = render_answer(
        _answer("Use https://vpn.corp.example/start [1].", [_source(1, quote=passage)]),
        words=words_for("en"),
    )
    section = rendered.blocks[0]["text"]["text"]
    assert "Use https://vpn.corp.example/start" in section
    assert "`https://vpn.corp.example/start`" not in section


def test_streamed_partial_answers_make_urls_inert_too() -> None:
    rendered = render_partial("Go to https://evil.example now", words=words_for("en"))
    assert _bare_urls_outside_code(rendered.blocks[0]["text"]["text"]) == []
    assert _bare_urls_outside_code(rendered.text) == []


def _texts(rendered: Rendered) -> list[dict[str, Any]]:
    objects = []
    for block in rendered.blocks:
        if "text" in block:
            objects.append(block["text"])
        objects += [e for e in block.get("elements", []) if e.get("type") == "mrkdwn"]
    return objects


def test_a_title_or_section_carrying_a_url_is_no_link() -> None:
    hostile = "IT notice: reset SSO at https://sso-reset.evil.example/login"
    source = _source(1, document=hostile)
    rendered = render_answer(
        _answer("Reset it as the notice says [1].", [source]), words=words_for("en")
    )
    assert all(link.startswith("https://kb.example/d/") for link in _links(rendered))
    for block_text in (json.dumps(b) for b in rendered.blocks):
        assert _bare_urls_outside_code(block_text) == []
    # And Slack is told not to turn anything into a link or a mention by itself.
    assert _texts(rendered) and all(t.get("verbatim") is True for t in _texts(rendered))


@pytest.mark.parametrize("outcome", [Outcome.MODEL_UNAVAILABLE, Outcome.ANSWERED])
def test_a_passage_of_characters_that_escape_long_still_fits_slack(outcome: Outcome) -> None:
    # "&" is "&amp;" once escaped: a 600-character quote would become 3,000.
    sources = [_source(n, quote="&" * 700) for n in (1, 2, 3, 4)]
    rendered = render_answer(
        _answer("Yes [1][2][3][4].", sources, outcome=outcome, kept=sources), words=words_for("en")
    )
    # A text object holds at most 3000 characters
    # (https://docs.slack.dev/reference/block-kit/composition-objects/text-object).
    assert all(len(t["text"]) <= 3000 for t in _texts(rendered))
    assert len(rendered.text) <= 3000
