"""Questions searched in their normal form; documents' own text left as it was read.

A question typed in full-width letters, in mathematical bold or with
zero-width characters between its letters is answered like its plain form,
from the same passages, instead of refused (``index.normal_form.plain``, the
first step of ``core.selection``). What a person sees is unchanged: the query
log keeps the question as typed, and a passage's stored text and offsets stay
the document's own (a citation opens ``canonical[start:end]``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from bot.mcp import Person
from bot.mcp.tools import BadToolCall, Tools
from core.answer import Engine, Outcome
from index.knowledge_base import KnowledgeBase
from index.normal_form import plain, same_text, unshouted, well_formed
from tests.servers import OpenAICompatServer

QUESTION = "How long do I have to submit an expense claim?"
FULL_WIDTH = "Ｈｏｗ\u3000ｌｏｎｇ\u3000ｄｏ\u3000Ｉ\u3000ｈａｖｅ\u3000ｔｏ\u3000ｓｕｂｍｉｔ\u3000ａｎ\u3000ｅｘｐｅｎｓｅ\u3000ｃｌａｉｍ？"
BOLD = "𝐇𝐨𝐰 𝐥𝐨𝐧𝐠 𝐝𝐨 𝐈 𝐡𝐚𝐯𝐞 𝐭𝐨 𝐬𝐮𝐛𝐦𝐢𝐭 𝐚𝐧 𝐞𝐱𝐩𝐞𝐧𝐬𝐞 𝐜𝐥𝐚𝐢𝐦?"
ZERO_WIDTH = "How lo\u200bng do I ha\u2060ve to sub\u200dmit an ex\ufeffpense cl\u200caim?"


@pytest.fixture
def kb(sample_kb: KnowledgeBase) -> KnowledgeBase:
    return sample_kb


def test_full_width_bold_ligatures_and_invisibles_fold_to_the_plain_form() -> None:
    assert plain(FULL_WIDTH) == QUESTION
    assert plain(BOLD) == QUESTION
    assert plain(ZERO_WIDTH) == QUESTION
    assert plain("ﬁle\u00adname\x00here") == "filename here"


def test_copies_of_a_text_compare_equal_and_other_words_do_not() -> None:
    """A re-export's line breaks, no-break spaces, soft hyphens and ligatures are the same
    words; letters in another case are not (``-l`` and ``-L``)."""
    docx = "Submit the claim in Expensify within 30 days; finance returns it unpaid."
    pdf = (
        "  Submit the claim in Expensify\r\nwithin 30\u00a0days; ﬁ\u00adnance returns it\nunpaid.\n"
    )
    assert same_text(pdf) == same_text(docx) == docx
    assert same_text("ls -l lists in long format") != same_text("ls -L lists in long format")
    assert same_text("Výplata je v pátek.") != same_text("Výplata je v patek.")
    # The form questions are searched in, its white space folded.
    for text in (FULL_WIDTH, BOLD, ZERO_WIDTH, "ﬁle\u00adname\x00here\U000e0041", "ok \ud83d"):
        assert same_text(text) == " ".join(plain(text).split())


def test_half_of_a_surrogate_pair_becomes_the_replacement_character() -> None:
    # What a client that cut a message in the middle of 🙂 (U+1F642) leaves.
    assert well_formed("ok \ud83d") == "ok \ufffd" == plain("ok \ud83d")
    assert well_formed("\ude42 then 🙂") == "\ufffd then 🙂"
    assert plain("ok \ud83d").encode("utf-8")  # what the tokenizer and SQLite need
    assert well_formed("Příliš žluťoučký kůň") == "Příliš žluťoučký kůň"


def test_a_question_in_capitals_is_put_in_sentence_case_and_nothing_else_is() -> None:
    assert unshouted("KOLIK DNÍ DOVOLENÉ MÁM?") == "Kolik dní dovolené mám?"
    assert unshouted("CÂTE ZILE DE CONCEDIU AM? ȘI CÂND?") == "Câte zile de concediu am? Și când?"
    # One lower-case letter, or fewer than three words: as typed (acronyms, identifiers).
    for kept in ("How do I reset the VPN?", "VPN DNS?", "ERR_TIMEOUT ON DEPLOY", "1234 5678"):
        assert unshouted(kept) == kept


def test_joiners_that_spell_a_word_stay() -> None:
    persian = "می\u200cخواهم"  # the non-joiner is part of the word's spelling
    family = "👩\u200d👩\u200d👧"  # one emoji, joined
    assert plain(persian) == persian and plain(family) == family
    assert plain("pa\u200dss ｗ\u200cｏｒｄ") == "pass word"


@pytest.mark.parametrize("spelling", [FULL_WIDTH, BOLD, ZERO_WIDTH])
async def test_an_odd_spelling_is_answered_from_the_passages_of_its_plain_form(
    engine_for: Callable[..., Engine], openai_server: OpenAICompatServer, spelling: str
) -> None:
    engine = engine_for(threshold=0.6)
    plain_answer = await engine.ask(QUESTION)
    odd = await engine.ask(spelling)
    assert plain_answer.outcome != Outcome.REFUSED
    assert odd.outcome == plain_answer.outcome
    assert [s.chunk_id for s in odd.kept] == [s.chunk_id for s in plain_answer.kept]
    # The model is asked the plain question; the log keeps it as typed.
    assert openai_server.requests[-1]["messages"][-1]["content"].endswith(f"Question: {QUESTION}")
    assert engine.kb.store.queries.get(odd.query_id or 0).question == spelling


async def test_a_passage_keeps_its_own_characters_and_offsets(
    kb: KnowledgeBase, engine_for: Callable[..., Engine]
) -> None:
    text = "# Ｗｉｄｅ\n\nThe ｆｕｌｌ\u200bwidth badge is issued at reception on day one.\n"
    document = kb.ingest_bytes(text.encode(), "badges.md", uploader="U0X").document
    answer = await engine_for(threshold=0.6).ask("Where is the full width badge issued?")
    [kept] = [s for s in answer.kept if s.document_id == document.id]
    assert "ｆｕｌｌ\u200bwidth" in kept.quote
    assert kb.store.canonical_text(document.id)[kept.start : kept.end] == kept.quote


async def test_a_query_of_invisible_characters_alone_is_empty(
    kb: KnowledgeBase, engine_for: Callable[..., Engine]
) -> None:
    tools = Tools(engine_for(), None)
    with pytest.raises(BadToolCall, match="The query is empty"):
        await tools.search(Person("U0ALICE001", None, "plain", None), "\u200b\u2060\ufeff", 5)
