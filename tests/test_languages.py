"""Telling languages apart, and BM25 reading each one: real detector, real stemmers, real index."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from index.config import IndexConfig
from index.embed import Embedder
from index.errors import IndexOutOfSync
from index.knowledge_base import KnowledgeBase
from index.languages import (
    MIN_LETTERS,
    detect,
    detect_language,
    fold_diacritics,
    fold_letters,
    language_shares,
    passage_languages,
)
from index.search.bm25 import BM25Index
from index.search.contract import Mode
from index.search.fusion import FUSION, Fusion, by_language, fuse
from index.search.tokens import ANALYZER, TOKENIZER_VERSION, query_languages, question_language

CORPUS = ("en", "cs", "da", "fr", "ro")

# Real sentences of the kind the knowledge base holds, one per language.
SENTENCES = {
    "cs": "Příkaz chmod mění přístupová práva souborů a adresářů podle zadaného režimu.",
    "da": "Kommandoen sletter brugeren fra systemet og fjerner hjemmemappen, hvis den er tom.",
    "fr": "La commande supprime le fichier indiqué et affiche un message si elle échoue.",
    "ro": "Comanda șterge fișierele indicate și afișează un mesaj dacă operația eșuează.",
    "en": "The command removes the given files and prints a message when it fails.",
}


@pytest.mark.parametrize("code", sorted(SENTENCES))
def test_a_sentence_is_told_in_its_language(code: str) -> None:
    assert detect_language(SENTENCES[code]) == code
    assert detect_language(SENTENCES[code], among=CORPUS) == code


@pytest.mark.parametrize(
    ("question", "code"),
    [
        ("jak nastavim prava souboru", "cs"),  # Czech typed without háčky and čárky
        ("cum sterg un fisier", "ro"),  # Romanian typed without virgule
        ("hvordan sletter jeg en bruger", "da"),
        ("comment supprimer un fichier", "fr"),
        ("how do I delete a file", "en"),
    ],
)
def test_a_short_question_is_told_among_the_knowledge_bases_languages(
    question: str, code: str
) -> None:
    found = detect(question, among=CORPUS)
    assert found is not None and found.code == code


def test_text_too_short_or_without_words_is_not_told() -> None:
    assert len("ssh -X") < MIN_LETTERS
    assert detect("ssh -X") is None
    assert detect("1234 5678 90 == 42 ;; {}") is None
    assert detect("") is None


def test_another_script_is_not_forced_into_a_european_language() -> None:
    # Chinese among European languages: none of them is in the running.
    assert detect("如何删除文件并清空回收站", among=CORPUS) is None
    # Arabic the detector is sure of is Arabic, though the knowledge base has none.
    found = detect("كيف أحذف ملفا من الخادم", among=CORPUS)
    assert found is not None and found.code == "ar"


def test_diacritics_fold_to_the_letters_people_type() -> None:
    assert fold_diacritics("příkaz") == "prikaz"
    # Romanian's comma-below and the older cedilla spellings are one letter.
    assert fold_diacritics("fișier") == fold_diacritics("fişier") == "fisier"
    assert fold_diacritics("ţară") == fold_diacritics("țară") == "tara"
    # Letters that are not a base letter with a mark are spelled as they are typed without it.
    assert fold_diacritics("søg æble") == "sog aeble"
    assert fold_diacritics("cœur") == "coeur" and fold_diacritics("łódź") == "lodz"


# Danish words, as written and as typed without æ, ø and å: plain letters, two-letter forms.
TYPED_DANISH = [
    ("børn", "born", "boern"),
    ("løn", "lon", "loen"),
    ("hvornår", "hvornar", "hvornaar"),
    ("får", "far", "faar"),
    ("værktøjet", "varktojet", "vaerktoejet"),
    ("første", "forste", "foerste"),
    ("ændringerne", "andringerne", "aendringerne"),
]


@pytest.mark.parametrize("language", ["da", "no"])
@pytest.mark.parametrize(("written", "plain", "two_letter"), TYPED_DANISH)
def test_danish_words_typed_without_their_letters_fold_to_one_word(
    language: str, written: str, plain: str, two_letter: str
) -> None:
    assert fold_letters(written, language) == fold_letters(plain, language)
    assert fold_letters(written, language) == fold_letters(two_letter, language)
    # The stemmer sees the folded letters, so every inflected form agrees too.
    terms = {w: ANALYZER.query_terms(w, [language]) for w in (written, plain, two_letter)}
    assert terms[written] == terms[plain] == terms[two_letter]


def test_two_letter_forms_are_folded_only_where_they_stand_for_a_letter() -> None:
    # Czech, French, Romanian and English words keep their "ae", "oe" and "aa".
    for word, language in [("poezie", "cs"), ("coefficient", "fr"), ("aerian", "ro")]:
        assert fold_letters(word, language) == word
    assert ANALYZER.query_terms("Israel maestro", [None]) == ["israel", "maestro"]
    # Identifiers only lose their marks: a name is matched as written.
    assert "maxage_oe" in ANALYZER.document_terms("Sæt maxage_oe.", "da")


def test_a_danish_question_typed_without_its_letters_gets_the_written_terms() -> None:
    written = ANALYZER.document_terms("Hvornår får jeg løn? Ferieregler for børn.", "da")
    for typed in (
        "hvornar far jeg lon ferieregler for born",
        "hvornaar faar jeg loen ferieregler for boern",
    ):
        assert ANALYZER.query_terms(typed, ["da"]) == written
        # Read as Norwegian (the detector's guess for some such questions), it still
        # carries the Danish terms: a clear language the knowledge base lacks adds its own.
        languages = query_languages(typed, CORPUS)
        assert "da" in languages
        assert set(written) <= set(ANALYZER.query_terms(typed, languages))


def test_a_document_has_the_language_of_most_of_its_passages() -> None:
    french = SENTENCES["fr"] * 4
    code = 'for f in *.txt; do\n  rm -f -- "$f"\ndone\n'
    english_section = SENTENCES["en"] * 4
    languages, document = passage_languages([french, code, french, english_section])
    assert document == "fr"
    # The code block reads as the manual's French; a whole English section is English.
    assert languages == ["fr", "fr", "fr", "en"]


def test_a_document_nobody_can_read_has_no_language() -> None:
    languages, document = passage_languages(["1 2 3 4", "--- +++ @@"])
    assert document is None and languages == [None, None]


def test_shares_are_of_the_weight_in_told_languages() -> None:
    assert language_shares(["cs", "en", None, "cs"], [1, 2, 5, 1]) == {"cs": 0.5, "en": 0.5}


# ---------------------------------------------------------------- analysis


def test_a_question_without_diacritics_gets_the_terms_of_the_written_words() -> None:
    written = ANALYZER.document_terms("Příkaz chmod mění přístupová práva souborů.", "cs")
    typed = ANALYZER.query_terms("prikaz chmod meni pristupova prava souboru", ["cs"])
    assert set(typed) <= set(written)
    ro_comma = ANALYZER.document_terms("Fișierele se șterg cu rm.", "ro")
    ro_cedilla = ANALYZER.document_terms("Fişierele se şterg cu rm.", "ro")
    assert ro_comma == ro_cedilla == ANALYZER.query_terms("fisierele se sterg cu rm", ["ro"])


def test_each_language_is_stemmed_with_its_own_stemmer() -> None:
    assert ANALYZER.query_terms("fișierele", ["ro"]) == ANALYZER.query_terms("fișier", ["ro"])
    assert ANALYZER.query_terms("brugerne", ["da"]) == ANALYZER.query_terms("bruger", ["da"])
    assert ANALYZER.query_terms("répertoires", ["fr"]) == ANALYZER.query_terms("repertoire", ["fr"])
    # Identifiers are kept whole in every language.
    assert "--recursive" in ANALYZER.document_terms("Použijte --recursive.", "cs")


def test_english_and_unknown_passages_are_analysed_as_before() -> None:
    text = "How do I stop pip from caching wheels?"
    assert ANALYZER.document_terms(text) == ANALYZER.document_terms(text, "en")
    assert ANALYZER.query_terms(text) == ["stop", "pip", "cach", "wheel"]
    assert ANALYZER.query_terms(text, [None]) == ANALYZER.query_terms(text)


def test_an_unclear_question_is_analysed_in_each_language_each_term_once() -> None:
    terms = ANALYZER.query_terms("soubory", [None, "cs"])
    # Each rule set's own term: Porter2's "soubori", the Czech stemmer's "soubor".
    assert terms == ANALYZER.query_terms("soubory", [None]) + ANALYZER.query_terms(
        "soubory", ["cs"]
    )
    assert terms[0] != terms[1]
    assert len(set(terms)) == len(terms)


def test_the_questions_languages_come_from_the_knowledge_base() -> None:
    assert query_languages("cum sterg fisierele vechi de pe server", {"ro", "cs", "en"}) == ["ro"]
    # A question nobody can tell is read in every language of the knowledge base.
    assert query_languages("ssh -X", {"ro", "cs"}) == [None, "cs", "ro"]
    # An English-only knowledge base reads every question as it always did.
    assert query_languages("jak nastavim prava souboru", {"en"}) == [None]
    assert question_language("jak nastavim prava souboru", {"en"}) is None
    assert question_language("jak nastavim prava souboru", {"cs", "en"}) == "cs"
    # A clear language the knowledge base lacks is read in it and in each of the
    # knowledge base's: this Danish question, typed without "ø" and "å", reads as Norwegian.
    typed = "rapporten er kapitel 2 i en storre samling og skal starte pa side 12."
    assert query_languages(typed, CORPUS) == ["no", None, "cs", "da", "fr", "ro"]


# ---------------------------------------------------------------- BM25 across languages


def _mixed_index() -> BM25Index:
    texts = [
        "Oprávnění\nPříkaz chmod mění přístupová práva souborů.",
        "Tilladelser\nKommandoen chmod ændrer filernes adgangsrettigheder.",
        "Drepturi\nComanda chmod schimbă drepturile de acces ale fișierelor.",
        "Permissions\nThe chmod command changes the access rights of files.",
    ]
    return BM25Index([1, 2, 3, 4], texts, languages=["cs", "da", "ro", "en"])


def test_a_czech_question_typed_without_diacritics_finds_the_czech_passage() -> None:
    index = _mixed_index()
    question = "jak zmenim prava souboru"
    hits = index.search(question, 4, languages=query_languages(question, {"cs", "da", "ro", "en"}))
    assert hits[0][0] == 1


def test_a_romanian_question_without_virgule_finds_the_romanian_passage() -> None:
    index = _mixed_index()
    question = "cum schimb drepturile fisierelor"
    hits = index.search(question, 4, languages=query_languages(question, {"cs", "da", "ro", "en"}))
    assert hits[0][0] == 3


def test_bm25_hits_in_another_language_are_a_list_of_their_own() -> None:
    index = _mixed_index()
    question = "comment changer les droits avec chmod"
    hits = index.search(question, 4, languages=["fr"])
    # Every passage shares "chmod" with the French question...
    assert {cid for cid, _ in hits} == {1, 2, 3, 4}
    languages = {1: "cs", 2: "da", 3: "ro", 4: "en"}
    own, other = by_language(hits, "fr", lambda ids: {i: languages[i] for i in ids})
    # ...none is French: they stay BM25's hits, apart from the question's language's.
    assert own == []
    assert other == hits
    # An unclear question, or passages of unknown language, keep one list.
    assert by_language(hits, None, lambda ids: {i: languages[i] for i in ids}) == (hits, [])
    assert by_language(hits, "fr", lambda ids: {}) == (hits, [])
    mixed = by_language(hits, "cs", lambda ids: {i: languages[i] for i in ids})
    assert mixed == ([h for h in hits if h[0] == 1], [h for h in hits if h[0] != 1])


def test_a_passage_another_language_matches_cannot_crowd_out_the_questions_own() -> None:
    # BM25 scores a Danish passage matched by a shared command far above the
    # French ones matched by the question's words; dense has 10 a little before 11.
    dense = [(10, 0.20), (11, 0.22), (20, 0.40)]
    french = [(11, 3.0), (10, 2.0)]
    danish = [(20, 9.0), (21, 1.0)]
    in_one_list = sorted(french + danish, key=lambda hit: -hit[1])
    # In one list the Danish score squashes the French ones: BM25's choice of 11 is lost.
    assert [cid for cid, _ in fuse(dense, in_one_list, FUSION)] == [10, 11, 20, 21]
    # Apart, the French words decide between the French passages, and the Danish
    # passage still counts, after them.
    assert [cid for cid, _ in fuse(dense, french, FUSION, danish)] == [11, 10, 20, 21]
    # Rank fusion takes the other languages' list as one more list.
    assert [cid for cid, _ in fuse([], french, Fusion(), danish)] == [11, 20, 10, 21]


def test_a_saved_index_built_in_several_languages_loads_with_its_terms(tmp_path) -> None:  # type: ignore[no-untyped-def]
    index = _mixed_index()
    path = tmp_path / "bm25.npz"
    index.save(path, generation=3)
    loaded, generation = BM25Index.load(path)
    assert generation == 3
    question = "jak zmenim prava souboru"
    assert loaded.search(question, 4, languages=["cs"]) == index.search(
        question, 4, languages=["cs"]
    )


def test_updating_an_index_analyses_the_new_passages_in_their_language() -> None:
    index = _mixed_index()
    updated = index.updated(
        [4], [5], ["Droits\nLa commande chmod modifie les droits des fichiers."], ["fr"]
    )
    fresh = BM25Index(
        [1, 2, 3, 5],
        [
            "Oprávnění\nPříkaz chmod mění přístupová práva souborů.",
            "Tilladelser\nKommandoen chmod ændrer filernes adgangsrettigheder.",
            "Drepturi\nComanda chmod schimbă drepturile de acces ale fișierelor.",
            "Droits\nLa commande chmod modifie les droits des fichiers.",
        ],
        languages=["cs", "da", "ro", "fr"],
    )
    question = "modifier les droits du fichier"
    assert updated.search(question, 4, languages=["fr"]) == fresh.search(
        question, 4, languages=["fr"]
    )
    assert updated.search(question, 4, languages=["fr"])[0][0] == 5


def test_languages_must_match_the_texts() -> None:
    with pytest.raises(ValueError, match="languages"):
        BM25Index([1, 2], ["a b", "c d"], languages=["cs"])


# ---------------------------------------------------------------- a knowledge base, end to end

# One policy page per language; only the Danish one says when pay comes and what holidays
# children have, in words with æ, ø and å.
POLICY_PAGES = {
    "ferie.md": "# Løn og ferie\n\nLønnen udbetales den sidste hverdag i måneden. Børn af "
    "medarbejdere følger skolens ferieregler, og ferien skal være aftalt med nærmeste leder, "
    "før den begynder. Søg om fri i personalesystemet senest to uger før.",
    "dovolena.md": "# Dovolená\n\nŽádost o dovolenou podáte v personálním systému nejpozději "
    "dva týdny předem. Dovolenou schvaluje přímý nadřízený a zbylé dny se převádějí do dalšího "
    "roku jen výjimečně.",
    "conges.md": "# Congés\n\nLa demande de congés se fait dans le système du personnel au "
    "moins deux semaines avant. Le responsable direct approuve les congés, et les jours restants "
    "ne sont reportés qu'exceptionnellement.",
    "concediu.md": "# Concediu\n\nCererea de concediu se face în sistemul de personal cu cel "
    "puțin două săptămâni înainte. Șeful direct aprobă concediul, iar zilele rămase se reportă "
    "doar în mod excepțional.",
    "leave.md": "# Leave\n\nRequest leave in the staff system at least two weeks ahead. Your "
    "direct manager approves it, and remaining days carry over only in exceptional cases.",
}


def test_a_knowledge_base_finds_the_danish_passage_however_its_letters_were_typed(
    tmp_path: Path, embedder: Embedder
) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in POLICY_PAGES.items():
        (docs / name).write_text(text, encoding="utf-8")
    config = IndexConfig(data_dir=tmp_path / "kb")
    kb = KnowledgeBase(config, embedder=embedder)
    kb.ingest_paths([docs])
    danish = next(d for d in kb.documents() if d.language == "da")

    def bm25(question: str, base: KnowledgeBase) -> list[tuple[int, float]]:
        """The knowledge base's BM25 hits, raw scores, as its search reads the question."""
        vector = embedder.encode_query(question)
        first = base.search_index.search(vector, question, None, 4, Mode.BM25)[0].chunk_id
        assert base.store.chunks_by_id([first])[first].document_id == danish.id, question
        snap = base.indexes.snapshot
        languages = query_languages(question, snap.corpus_languages)
        return snap.bm25.search(question, 4, None, languages)

    written = bm25("hvornår får jeg løn, og hvilke ferieregler har børn?", kb)
    for typed in (
        "hvornar far jeg lon, og hvilke ferieregler har born?",
        "hvornaar faar jeg loen, og hvilke ferieregler har boern?",
    ):
        assert bm25(typed, kb) == written, typed

    # An index saved by the previous analysis is rebuilt when the knowledge base opens.
    path = kb.indexes.bm25_path
    with np.load(path) as data:
        arrays = dict(data)
    meta = json.loads(arrays["meta"].tobytes().decode())
    before = f"{TOKENIZER_VERSION - 1}:"
    old = {**meta, "tokenizer": ANALYZER.signature.replace(f"{TOKENIZER_VERSION}:", before, 1)}
    arrays["meta"] = np.frombuffer(json.dumps(old).encode(), dtype=np.uint8)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    with pytest.raises(IndexOutOfSync, match="another version"):
        BM25Index.load(path)
    reopened = KnowledgeBase(config, embedder=embedder)
    assert bm25("hvornar far jeg lon, og hvilke ferieregler har born?", reopened) == written
    assert BM25Index.load(path)[0].analyzer.signature == ANALYZER.signature
