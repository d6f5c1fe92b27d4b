"""The bot's own words in the asker's language: complete catalogs, Slack's limits, the choice."""

from __future__ import annotations

import inspect
import json
import re
import string
from pathlib import Path
from typing import Any

import pytest
from babel import Locale
from babel.messages.extract import extract_from_file
from babel.numbers import format_decimal, format_percent

from bot.settings import Settings
from bot.slack.blocks import render_answer, render_hand_off, render_upload_status, upload_modal
from bot.slack.blocks.elements import button, context, header, section
from bot.slack.blocks.hand_off import HandOff
from bot.slack.words import (
    SOURCE_LANGUAGE,
    Words,
    available_languages,
    choose_language,
    language_of_locale,
    words_for,
)
from bot.slack.words.catalogs import catalog, translations
from core.answer import Answer, Outcome, SourceRef

pytest.register_assert_rewrite("tests.conftest_bot", "tests.home_tab")

from tests.conftest_bot import IN_DOMAIN, Bot, BotFactory  # noqa: E402
from tests.home_tab import open_home  # noqa: E402
from tests.servers import USER_ID, app_mention_event  # noqa: E402

LANGUAGES = ("cs", "da", "en", "fr", "ro")
OTHER_ID = "U0OTHER001"
SENTENCES = Path(__file__).resolve().parents[1] / "bot" / "slack" / "words" / "sentences.py"

# Slack's documented limits (Block Kit reference: button element, header block, section
# block, modal view, confirmation dialog object, option object).
BUTTON_TEXT = 75
HEADER_TEXT = 150
SECTION_TEXT = 3000
MODAL_TITLE = 24
CONFIRM_TITLE = 100
CONFIRM_TEXT = 300
CONFIRM_BUTTON = 30
OPTION_TEXT = 75
INPUT_LABEL = 2000

# Which fixed sentences Slack shows as what (the rest are mrkdwn in sections or context).
BUTTONS = (
    "FEEDBACK_POSITIVE",
    "FEEDBACK_NEGATIVE",
    "ASK_A_PERSON",
    "UPLOAD_RETRY",
    "APPROVE",
    "REJECT",
    "HOME_REFRESH",
    "HOME_PREVIOUS",
    "HOME_NEXT",
    "HOME_RETRY",
    "HOME_REINDEX",
)
HEADERS = (
    "HOME_TITLE",
    "HOME_UPLOADS_HEADER",
    "HOME_ADMIN_HEADER",
    "HOME_FAILED_HEADER",
    "HOME_STALE_HEADER",
    "HOME_GAPS_HEADER",
    "HOME_DISLIKED_HEADER",
    "HOME_CALIBRATION_HEADER",
)
MODAL_BUTTONS = ("UPLOAD_MODAL_TITLE", "UPLOAD_MODAL_SUBMIT", "UPLOAD_MODAL_CLOSE")
CONFIRM_BUTTONS = ("REJECT_CONFIRM_YES", "REJECT_CONFIRM_NO")


def _fields(text: str) -> set[tuple[str, str]]:
    """The ``{name:spec}`` fields of a ``str.format`` template."""
    return {(f, spec or "") for _, f, spec, _ in string.Formatter().parse(text) if f is not None}


def _ids(entry: Any) -> tuple[str, ...]:
    return entry.id if isinstance(entry.id, tuple) else (entry.id,)


# ---------------------------------------------------------------- the catalogs


def test_every_language_of_the_people_served_has_a_catalog() -> None:
    assert available_languages() == frozenset(LANGUAGES)


def test_the_english_catalog_holds_exactly_the_sentences_of_the_code() -> None:
    keywords = {"N_": None, "_": None, "ngettext": (1, 2)}
    found = extract_from_file("python", str(SENTENCES), keywords=keywords)
    in_code = {m if isinstance(m, tuple) else (m,) for _, m, _, _ in found}
    in_catalog = {_ids(m) for m in catalog(SOURCE_LANGUAGE) if m.id}
    assert in_catalog == in_code, "regenerate bot/locale/en (see docs/operating.md, Languages)"


@pytest.mark.parametrize("lang", [c for c in LANGUAGES if c != SOURCE_LANGUAGE])
def test_every_sentence_is_translated_with_the_same_placeholders(lang: str) -> None:
    translated = {_ids(m): m for m in catalog(lang) if m.id}
    for entry in catalog(SOURCE_LANGUAGE):
        if not entry.id:
            continue
        ids = _ids(entry)
        assert ids in translated, f"{lang}: no translation of {ids[0]!r}"
        found = translated[ids]
        assert not found.fuzzy, f"{lang}: fuzzy translation of {ids[0]!r}"
        forms = found.string if isinstance(found.string, tuple) else (found.string,)
        assert all(forms), f"{lang}: empty translation of {ids[0]!r}"
        wanted = set().union(*(_fields(i) for i in ids))
        shown = set().union(*(_fields(f) for f in forms))
        assert shown == wanted, f"{lang}: {ids[0]!r} has {shown}, not {wanted}"
        for form in forms:
            assert _fields(form) <= wanted, f"{lang}: {form!r}"
            # Slack mrkdwn survives translation: commands, settings, emoji, bold marks, and
            # the characters Slack reads as markup (a stray "<" or "&" breaks a link).
            for pattern in (r"`[^`]+`", r"\bKB_[A-Z_]+", r":[a-z_]+:"):
                wanted_tokens = sorted(re.findall(pattern, ids[0]))
                assert sorted(re.findall(pattern, form)) == wanted_tokens, f"{lang}: {form!r}"
            for mark in ("*", "_", "~", "<", ">", "&", "|"):
                counts = {i.count(mark) for i in ids}
                assert form.count(mark) in counts, f"{lang}: {mark!r} marks of {form!r}"


@pytest.mark.parametrize("lang", [c for c in LANGUAGES if c != SOURCE_LANGUAGE])
def test_translations_are_not_english(lang: str) -> None:
    english, words = words_for(SOURCE_LANGUAGE), words_for(lang)
    for name in (*BUTTONS, "PLACEHOLDER", "REFUSAL", "EVIDENCE_HEADER", "RELATED_HEADER"):
        assert getattr(words, name) != getattr(english, name), f"{lang}: {name}"
    # Plural forms follow the language: Czech and Romanian have three.
    assert len({words.upload_indexed("x", n).replace(str(n), "N") for n in (1, 3, 25)}) == (
        3 if lang in ("cs", "ro") else 2
    )


# Each language speaks to a person one way throughout: Czech and French the polite plural
# (vy, vous), Romanian the familiar singular (tu) most of its sentences use. These are forms
# of the other way. (Danish "du" is the only everyday form; its "De", "Deres" read "they".)
OTHER_ADDRESS = {
    "cs": r"\b(tvůj|tvoje|tvé|tvá|tvých|tebe|tobě|máš|můžeš|zkus|přidej|zeptej)\b",
    "fr": r"\b(tu|ton|ta|tes|toi|te)\b",
    "ro": r"\b(dumneavoastră|voastră|vostru|puteți|vedeți|rulați|păstrați|întrebați|adăugați"
    r"|încercați|verificați|Corectați|Puneți)\b",
}


@pytest.mark.parametrize("lang", sorted(OTHER_ADDRESS))
def test_a_person_is_addressed_one_way_throughout(lang: str) -> None:
    for entry in catalog(lang):
        forms = entry.string if isinstance(entry.string, tuple) else (entry.string,)
        for form in forms if entry.id else ():
            found = re.findall(OTHER_ADDRESS[lang], form)
            assert not found, f"{lang}: {found} in {form!r}"


def test_french_punctuation_never_starts_a_line() -> None:
    # French sets a space before ":" (no-break), before ";", "?" and "!" (narrow no-break)
    # and inside « »; a plain one lets Slack wrap the mark alone onto the next line.
    loose = re.compile(r" (?::(?![a-z_]+:)|[;?!»])|« ")
    for entry in catalog("fr"):
        forms = entry.string if isinstance(entry.string, tuple) else (entry.string,)
        for form in forms if entry.id else ():
            assert not loose.search(form), f"fr: {form!r}"


# ---------------------------------------------------------------- Slack's limits


def _every_text(words: Words) -> list[str]:
    """Every fixed sentence, and every method's with sample fields, in ``words``."""
    texts: list[str] = []
    for name, _ in inspect.getmembers(Words):
        if name.startswith("_"):
            continue
        got = getattr(words, name)
        if isinstance(got, str):
            texts.append(got)
        elif isinstance(got, dict):
            texts += list(got.values())
        elif callable(got) and name not in ("ngettext",):
            texts += _called(got)
    return texts


def _called(method: Any) -> list[str]:
    """``method`` called with long sample values, with counts 1, 3 and 25."""
    out = []
    for n in (1, 3, 25):
        args: dict[str, Any] = {}
        for p in inspect.signature(method).parameters.values():
            annotation = str(p.annotation)
            if "int" in annotation:
                args[p.name] = n
            elif "float" in annotation:
                args[p.name] = 0.675
            elif "bool" in annotation:
                args[p.name] = n == 1
            elif "list" in annotation:
                args[p.name] = ["*A document name*", "*Another one*"]
            else:
                args[p.name] = "x" * 40
        out.append(method(**args))
    return out


def _walk(obj: Any) -> list[dict[str, Any]]:
    """Every dict inside a Block Kit payload."""
    if isinstance(obj, dict):
        return [obj, *[d for v in obj.values() for d in _walk(v)]]
    if isinstance(obj, list):
        return [d for v in obj for d in _walk(v)]
    return []


def _check_limits(payload: Any) -> None:
    for d in _walk(payload):
        if d.get("type") == "button":
            assert len(d["text"]["text"]) <= BUTTON_TEXT, d
        if d.get("type") == "header":
            assert len(d["text"]["text"]) <= HEADER_TEXT, d
        if d.get("type") == "section" and "text" in d:
            assert len(d["text"]["text"]) <= SECTION_TEXT, d
        if d.get("type") == "modal":
            for key in ("title", "submit", "close"):
                assert len(d[key]["text"]) <= MODAL_TITLE, d[key]
        if "confirm" in d and "deny" in d:
            assert len(d["title"]["text"]) <= CONFIRM_TITLE
            assert len(d["text"]["text"]) <= CONFIRM_TEXT
            assert len(d["confirm"]["text"]) <= CONFIRM_BUTTON
            assert len(d["deny"]["text"]) <= CONFIRM_BUTTON
        if d.get("type") == "input":
            assert len(d["label"]["text"]) <= INPUT_LABEL


def _source(n: int) -> SourceRef:
    return SourceRef(
        n=n,
        chunk_id=n,
        document_id=n,
        document="Handbook",
        section="Expenses",
        page=2,
        start=0,
        end=10,
        url=f"https://kb.example/d/{n}",
        quote="Submit claims within 30 days.",
        distance=0.2,
    )


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_sentence_in_every_language_fits_slacks_limits(lang: str) -> None:
    words = words_for(lang)
    for text in _every_text(words):
        _check_limits(section(text).to_dict())
        _check_limits(context(text).to_dict())
        _check_limits(render_upload_status(text, words=words, retry_document_id=1).blocks)
    for name in BUTTONS:
        shown = button("a", getattr(words, name), "v").to_dict()
        _check_limits(shown)
        assert shown["text"]["text"] == getattr(words, name), f"{lang}: {name} was shortened"
    for name in HEADERS:
        shown = header(getattr(words, name)).to_dict()
        assert shown["text"]["text"] == getattr(words, name), f"{lang}: {name} was shortened"
    for name in (*MODAL_BUTTONS, *CONFIRM_BUTTONS):
        assert len(getattr(words, name)) <= min(MODAL_TITLE, CONFIRM_BUTTON), f"{lang}: {name}"
    _check_limits(upload_modal("{}", channel_scope_allowed=True, words=words))
    for outcome in Outcome:
        answer = Answer(
            question="q",
            outcome=outcome,
            answer="Claims are due in 30 days [1].",
            grounded=outcome == Outcome.ANSWERED,
            model_called=outcome != Outcome.REFUSED,
            sources=[_source(1), _source(2)],
            kept=[_source(1), _source(2)],
            query_id=42,
        )
        _check_limits(render_answer(answer, words=words, ask_a_person=True).blocks)
    hand_off = HandOff("U0ASKER001", "U0OTHER001", "C0CHANNEL1", "q", "answered", "a", None)
    _check_limits(render_hand_off(hand_off, words=words).blocks)


# ---------------------------------------------------------------- which language


def test_a_locale_names_its_language_when_a_catalog_has_it() -> None:
    available = available_languages()
    assert language_of_locale("fr-FR", available) == "fr"
    assert language_of_locale("cs_CZ", available) == "cs"
    assert language_of_locale("da", available) == "da"
    assert language_of_locale("ja-JP", available) is None
    assert language_of_locale(None, available) is None


CZECH = "Kolik dní mám na podání žádosti o proplacení cestovních výdajů?"


def test_locale_then_question_then_default() -> None:
    available = available_languages()
    choose = choose_language
    assert choose(locale="fr-FR", text=CZECH, default="en", available=available) == "fr"
    assert choose(locale="ja-JP", text=CZECH, default="en", available=available) == "cs"
    assert choose(locale=None, text=CZECH, default="da", available=available) == "cs"
    assert choose(locale="ja-JP", text="ok?", default="da", available=available) == "da"
    assert choose(locale=None, text="", default="ro", available=available) == "ro"


DANISH_WITH_ENGLISH = "Hvordan får jeg adgang til VPN og SSO i onboarding portal?"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        # Czech typed without diacritics is still Czech.
        ("Kolik dni mam na podani zadosti o proplaceni cestovnich vydaju?", "cs"),
        ("Jak si nastavim VPN na notebooku?", "cs"),
        # Too short to tell: the default.
        ("VPN?", "ro"),
        # Danish holding English terms (the detector's first reading: Norwegian).
        (DANISH_WITH_ENGLISH, "da"),
        ("Hvordan resetter jeg mit password til VPN?", "da"),
        ("Skal jeg bruge MFA til remote desktop?", "da"),
        # Romanian with the cedilla letters old keyboards type, and with the comma ones.
        ("Câte zile am la dispoziţie pentru decontul cheltuielilor de deplasare?", "ro"),
        ("Cum îmi setez VPN-ul pe laptop şi cum ţin parola?", "ro"),
        ("Câte zile am la dispoziție pentru decontul cheltuielilor de deplasare?", "ro"),
        # Languages no catalog has, not close to one: the default.
        ("Ile dni mam na złożenie wniosku o zwrot kosztów podróży?", "ro"),
        ("Wie viele Tage habe ich für die Reisekostenabrechnung?", "ro"),
        ("Hur ansöker jag om semester i HR-systemet?", "ro"),
        # Norwegian: its reader reads Danish, which a catalog has.
        ("Hvor mange feriedager har jeg igjen i år?", "da"),
        ("Combien de jours ai-je pour soumettre une note de frais ?", "fr"),
    ],
)
def test_the_question_tells_the_language_when_the_locale_does_not(text: str, expected: str) -> None:
    available = available_languages()
    assert choose_language(locale=None, text=text, default="ro", available=available) == expected
    assert choose_language(locale="ja-JP", text=text, default="ro", available=available) == expected
    # The locale, when a catalog has it, decides whatever the question.
    assert choose_language(locale="fr-FR", text=text, default="ro", available=available) == "fr"


@pytest.mark.parametrize(
    ("locale", "text", "expected"),
    [
        # English is Slack's default locale, and what a Czech, Danish or Romanian
        # reader is left with: their question's language decides.
        ("en-US", CZECH, "cs"),
        ("en-GB", DANISH_WITH_ENGLISH, "da"),
        ("en-US", "Câte zile am la dispoziţie pentru decontul cheltuielilor de deplasare?", "ro"),
        ("en-US", "How many days do I have to file a travel expense claim?", "en"),
        ("en-US", "VPN?", "en"),
        ("en-US", "Ile dni mam na złożenie wniosku o zwrot kosztów podróży?", "en"),
        ("en-US", "", "en"),
        # Any other catalog's locale was chosen: it decides.
        ("fr-FR", CZECH, "fr"),
        ("fr-FR", "How many days do I have to file a travel expense claim?", "fr"),
    ],
)
def test_an_english_locale_lets_the_question_tell_the_language(
    locale: str, text: str, expected: str
) -> None:
    available = available_languages()
    assert choose_language(locale=locale, text=text, default="ro", available=available) == expected


def test_the_default_language_must_have_a_catalog() -> None:
    assert Settings(_env_file=None, KB_DEFAULT_LANGUAGE="FR").default_language == "fr"
    with pytest.raises(ValueError, match="KB_DEFAULT_LANGUAGE"):
        Settings(_env_file=None, KB_DEFAULT_LANGUAGE="ja")


# ---------------------------------------------------------------- end to end


def _shown(message: dict[str, Any]) -> str:
    return json.dumps(message.get("blocks") or [], ensure_ascii=False) + str(message.get("text"))


def _feedback_labels(message: dict[str, Any]) -> tuple[str, str]:
    (buttons,) = [
        e
        for d in _walk(message.get("blocks"))
        for e in d.get("elements") or []
        if isinstance(e, dict) and e.get("type") == "feedback_buttons"
    ]
    return buttons["positive_button"]["text"]["text"], buttons["negative_button"]["text"]["text"]


async def test_a_french_locale_gets_french_words_around_the_answer(bot: Bot) -> None:
    bot.slack.set_user(USER_ID, locale="fr-FR")
    await bot.event(app_mention_event(IN_DOMAIN))
    answer = await bot.answer()
    french = words_for("fr")
    assert _feedback_labels(answer) == (french.FEEDBACK_POSITIVE, french.FEEDBACK_NEGATIVE)
    assert french.SOURCES_HEADER in _shown(answer)
    (status,) = bot.slack.calls("assistant.threads.setStatus")
    assert status["status"] == french.STATUS_SEARCHING
    (asked,) = {str(c.get("include_locale")) for c in bot.slack.calls("users.info")}
    assert asked.lower() in ("1", "true")


async def test_no_locale_and_a_czech_question_gets_czech_words(bot: Bot) -> None:
    bot.slack.set_user(USER_ID, locale=None)
    await bot.event(app_mention_event(CZECH))
    answer = await bot.answer()
    czech = words_for("cs")
    assert _feedback_labels(answer) == (czech.FEEDBACK_POSITIVE, czech.FEEDBACK_NEGATIVE)
    assert "Helpful" not in _shown(answer)


async def test_a_locale_without_a_catalog_falls_back_to_the_question_then_the_default(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(default_language="da")
    bot.slack.set_user(USER_ID, locale="ja-JP")
    await bot.event(app_mention_event(CZECH))
    czech = words_for("cs")
    assert _feedback_labels(await bot.answer()) == (
        czech.FEEDBACK_POSITIVE,
        czech.FEEDBACK_NEGATIVE,
    )
    # Someone else, whose locale and question tell nothing (the first asker's "ok?" would
    # follow the Czech they asked in).
    bot.slack.set_user(OTHER_ID, locale="ja-JP")
    await bot.event(app_mention_event("ok?", user=OTHER_ID))
    danish = words_for("da")
    second = await bot.answer(count=2)
    assert _feedback_labels(second) == (danish.FEEDBACK_POSITIVE, danish.FEEDBACK_NEGATIVE)


# ---------------------------------------------------------------- counts and numbers

# Numbers whose plural forms differ in at least one language: French 0 and 1 are
# singular; Czech 2-4 and 22 (22 is "other" in Czech); Romanian 20+ take "de" (21, 25,
# 1000) but 101 and 102 do not.
COUNTS = (0, 1, 2, 5, 21, 22, 25, 101, 102, 1000)
# CLDR's category order; a category a catalog has no form for ("many": Czech decimals,
# French millions) is not one of its gettext forms.
CLDR_ORDER = ("zero", "one", "two", "few", "many", "other")


def _form_index(lang: str, n: int, forms: int) -> int:
    """The gettext form CLDR's plural rule gives ``n`` in ``lang`` (Babel's rule, not ours)."""
    rule = Locale.parse(lang).plural_form
    tags = [t for t in CLDR_ORDER if t in rule.tags or t == "other"]
    if len(tags) > forms:
        tags.remove("many")
    category = rule(n)
    return tags.index(category if category in tags else "other")


@pytest.mark.parametrize("lang", LANGUAGES)
def test_every_plural_sentence_takes_the_form_cldr_gives_each_number(lang: str) -> None:
    compiled = translations(lang)
    entries = [m for m in catalog(lang) if isinstance(m.id, tuple)]
    assert entries
    for entry in entries:
        singular, plural = entry.id
        forms = entry.string if lang != SOURCE_LANGUAGE else (singular, plural)
        for n in COUNTS:
            index = _form_index(lang, n, len(forms))
            got = compiled.ngettext(singular, plural, n)
            assert got == forms[index], f"{lang}, n={n}: {got!r}, not form {index}"


# Numbers in a sentence that name no counted thing: a position, an id, a status, a unit's
# amount, a number after a label ("before 3"), the counts of a rate.
NOT_COUNTS = {
    ("page", "page"),
    ("entity_page", "page"),
    ("home_page", "page"),
    ("home_page", "pages"),
    ("home_page", "total"),
    ("home_channel_document", "doc_id"),
    ("approval_version", "doc_id"),
    ("download_status", "status"),
    ("download_too_large", "limit"),
    ("reindex_progress", "done"),
    ("reindex_done", "stale_before"),
    ("reindex_done", "stale_after"),
    ("home_gap_outcome", "n"),
    ("home_rate", "n"),
    ("home_rate", "of"),
}


class _Counting(Words):
    """Words that remember the number each plural entry was chosen for."""

    def __init__(self, lang: str) -> None:
        super().__init__(lang, translations(lang))
        self.counted: list[int] = []

    def ngettext(self, singular: str, plural: str, n: int, **fields: object) -> str:
        self.counted.append(n)
        return super().ngettext(singular, plural, n, **fields)


def test_every_count_in_a_sentence_chooses_a_plural_form() -> None:
    words = _Counting("ro")
    checked = 0
    for name, method in inspect.getmembers(words, inspect.ismethod):
        if name.startswith("_") or name in ("ngettext", "number", "percent"):
            continue
        params = inspect.signature(method).parameters.values()
        numbers = [p.name for p in params if p.annotation in ("int", int)]
        args: dict[str, Any] = {}
        for i, p in enumerate(params):
            annotation = str(p.annotation)
            if p.name in numbers:
                args[p.name] = 90 - numbers.index(p.name) * 17  # 90, 73, 56: each its own
            elif "float" in annotation:
                args[p.name] = 0.5
            elif "bool" in annotation:
                args[p.name] = False
            elif "list" in annotation:
                args[p.name] = ["a", "b"]
            else:
                args[p.name] = f"x{i}"
        words.counted.clear()
        method(**args)
        for number in numbers:
            if (name, number) in NOT_COUNTS:
                continue
            checked += 1
            assert args[number] in words.counted, f"{name}: {number} is shown uncounted"
    assert checked >= 20


def _plain(text: str) -> str:
    return text.replace("\xa0", " ").replace("\u202f", " ")


@pytest.mark.parametrize(
    ("lang", "shown", "expected"),
    [
        ("en", lambda w: w.reindex_done(1, 1, 1, 0, 0), "1 document, 1 chunk; 1 failed"),
        ("en", lambda w: w.reindex_done(2, 5, 0, 0, 0), "2 documents, 5 chunks; 0 failed"),
        ("da", lambda w: w.reindex_done(1, 1, 0, 0, 0), "1 dokument, 1 del;"),
        ("fr", lambda w: w.reindex_done(1, 2, 0, 0, 0), "1 document, 2 fragments"),
        ("en", lambda w: w.home_counts(2, 1, 0), "*2* searchable documents (1 passage)"),
        ("cs", lambda w: w.home_counts(5, 3, 0), "(3 pasáže)"),
        ("cs", lambda w: w.home_counts(5, 1, 0), "(1 pasáž)"),
        ("ro", lambda w: w.home_counts(5, 20, 0), "(20 de pasaje)"),
        ("ro", lambda w: w.home_counts(5, 102, 0), "(102 pasaje)"),
        ("fr", lambda w: w.home_counts(5, 9, 1), "dont 1 réservé à un seul canal"),
        ("fr", lambda w: w.home_counts(5, 9, 2), "dont 2 réservés à un seul canal"),
        ("ro", lambda w: w.step_found(3, 20), "Am găsit 3 pasaje în 20 de documente"),
        ("ro", lambda w: w.step_found(25, 2), "Am găsit 25 de pasaje în 2 documente"),
        ("cs", lambda w: w.step_found(2, 3), "Nalezeny 2 pasáže ve 3 dokumentech"),
        ("cs", lambda w: w.step_found(1, 1), "Nalezena 1 pasáž v jednom dokumentu"),
        ("ro", lambda w: w.home_gap("q", 20, "o", "w", people=2), "Pusă de 20 de ori de 2 "),
        ("ro", lambda w: w.home_gap("q", 3, "o", "w", people=2), "Pusă de 3 ori de 2 "),
        ("cs", lambda w: w.reindex_more_failures(2), "…a další 2 "),
        ("cs", lambda w: w.reindex_more_failures(5), "…a dalších 5 "),
        ("fr", lambda w: w.reindex_more_skipped(1), "…et 1 autre ignoré "),
        ("fr", lambda w: w.reindex_progress(1, 5), "1 sur 5 documents préparés"),
        ("ro", lambda w: w.too_long(4002, 4000), "are 4.002 caractere;"),
        ("ro", lambda w: w.too_long(4002, 4000), "cel mult 4.000 de caractere."),
        ("en", lambda w: w.too_long(4002, 4000), "is 4,002 characters long"),
    ],
)
def test_a_sentence_with_several_counts_agrees_with_each(
    lang: str, shown: Any, expected: str
) -> None:
    assert expected in _plain(shown(words_for(lang)))


@pytest.mark.parametrize("lang", LANGUAGES)
def test_numbers_are_written_as_the_language_writes_them(lang: str) -> None:
    words = words_for(lang)

    def written(value: float, pattern: str | None = None) -> str:
        return format_decimal(value, format=pattern, locale=lang)

    assert f"*{written(1234)}*" in words.home_counts(1234, 5, 0)
    assert written(12345) in words.reindex_done(12345, 5, 0, 0, 0)
    threshold = words.home_thresholds(0.675, 0.6)
    assert written(0.675, "0.000") in threshold and written(0.6, "0.000") in threshold
    assert written(0.675, "0.000") in words.home_no_rates(0.675)
    assert written(0.25, "0.000") in words.home_gap_closest("x", 0.25)
    assert written(2.5) in words.download_timed_out(2.5)
    assert format_percent(0.05, locale=lang) in words.home_calibrated("w", "s", 0.05, "a", "b")
    # An identifier is never grouped like a number.
    assert "12345" in words.home_channel_document("#c", 12345)
    if lang != SOURCE_LANGUAGE:  # the decimal mark of cs, da, fr and ro is a comma
        assert "0,675" in threshold and "0.675" not in threshold
        assert "2,5 s" in _plain(words.file_info_timed_out(2.5))
        assert "7,5" in words.home_rate(3, 40, 0.01, 0.2)


async def test_a_danish_question_holding_english_terms_gets_danish_words(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(default_language="en")
    bot.slack.set_user(USER_ID, locale=None)
    await bot.event(app_mention_event(DANISH_WITH_ENGLISH))
    danish = words_for("da")
    assert _feedback_labels(await bot.answer()) == (
        danish.FEEDBACK_POSITIVE,
        danish.FEEDBACK_NEGATIVE,
    )


# 2026-12-07 22:40:21 UTC
MOMENT = 1796683221.0


@pytest.mark.parametrize(
    ("lang", "tz", "expected"),
    [
        ("cs", "Europe/Prague", "7. 12. 2026 23:40"),
        ("da", "Europe/Copenhagen", "7. dec. 2026 23.40"),
        ("fr", "Europe/Paris", "7 déc. 2026, 23:40"),
        ("ro", "Europe/Bucharest", "8 dec. 2026, 00:40"),
        ("en", "America/New_York", "Dec 7, 2026, 5:40 PM"),
        ("cs", "Asia/Tokyo", "8. 12. 2026 7:40"),
        # No time zone from Slack, or none known here: UTC, and said.
        ("cs", None, "7. 12. 2026 22:40 UTC"),
        ("fr", "Mars/Olympus_Mons", "7 déc. 2026, 22:40 UTC"),
        ("fr", "../../etc/passwd", "7 déc. 2026, 22:40 UTC"),
    ],
)
def test_a_moment_is_written_day_first_in_the_persons_time_zone(
    lang: str, tz: str | None, expected: str
) -> None:
    assert _plain(words_for(lang, tz).when(MOMENT)) == expected


async def test_a_czech_question_from_an_english_locale_gets_czech_words(bot: Bot) -> None:
    bot.slack.set_user(USER_ID, locale="en-US")
    await bot.event(app_mention_event(CZECH))
    czech = words_for("cs")
    assert _feedback_labels(await bot.answer()) == (
        czech.FEEDBACK_POSITIVE,
        czech.FEEDBACK_NEGATIVE,
    )
    bot.slack.set_user(OTHER_ID, locale="en-US")
    await bot.event(app_mention_event("VPN?", user=OTHER_ID))
    english = words_for("en")
    second = await bot.answer(count=2)
    assert _feedback_labels(second) == (english.FEEDBACK_POSITIVE, english.FEEDBACK_NEGATIVE)


async def test_what_a_person_reads_without_writing_follows_the_language_they_asked_in(
    bot: Bot,
) -> None:
    bot.slack.set_user(USER_ID, locale="en-US")
    bot.slack.set_user(OTHER_ID, locale="en-US")
    await bot.event(app_mention_event(CZECH))
    await bot.answer()
    czech, english = words_for("cs"), words_for("en")
    home = json.dumps((await open_home(bot, USER_ID))["blocks"], ensure_ascii=False)
    assert czech.HOME_TITLE in home and english.HOME_TITLE not in home
    # Too short to tell: the language they asked in before.
    await bot.event(app_mention_event("VPN?"))
    assert _feedback_labels(await bot.answer(count=2)) == (
        czech.FEEDBACK_POSITIVE,
        czech.FEEDBACK_NEGATIVE,
    )
    # Someone who never asked: their locale's English.
    other = json.dumps((await open_home(bot, OTHER_ID))["blocks"], ensure_ascii=False)
    assert english.HOME_TITLE in other
