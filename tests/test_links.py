"""Passage links: signed tokens, URL shapes, RFC 5147 fragments, the persisted secret."""

from __future__ import annotations

import stat
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import pytest
from hypothesis import given
from hypothesis import strategies as st

from core.errors import BadLinkToken
from core.links import (
    SECRET_FILENAME,
    LinkSigner,
    load_or_create_secret,
    parse_char_fragment,
    passage_url,
)
from index.errors import KBError

SECRET = "s3cret-for-tests-only-0123456789abcdef"


class _Clock:
    """A clock tests move by hand."""

    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


@pytest.fixture
def signer(clock: _Clock) -> LinkSigner:
    return LinkSigner(SECRET, ttl_seconds=3600, clock=clock)


# --- tokens


def test_token_round_trip_returns_the_scope(signer: LinkSigner) -> None:
    token = signer.token(42, "C0123ABC")
    assert signer.verify(token, 42) == "C0123ABC"


def test_token_is_url_safe_and_differs_per_document(signer: LinkSigner) -> None:
    a, b = signer.token(1, "C1"), signer.token(2, "C1")
    assert a != b
    allowed = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.")
    assert set(a) <= allowed


def test_token_for_another_document_is_refused(signer: LinkSigner) -> None:
    token = signer.token(1, "C1")
    with pytest.raises(BadLinkToken, match="issued for document 1, not document 2"):
        signer.verify(token, 2)


def test_tampered_token_is_refused(signer: LinkSigner) -> None:
    token = signer.token(1, "C1")
    last = "A" if token[-1] != "A" else "B"
    with pytest.raises(BadLinkToken, match="tampered"):
        signer.verify(token[:-1] + last, 1)


def test_a_token_has_one_spelling(signer: LinkSigner) -> None:
    # Unpadded base64 leaves unused bits in the last letter: the other letters that
    # decode to the same signature must not verify either.
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for document_id in range(1, 21):
        token = signer.token(document_id, "C1")
        assert signer.verify(token, document_id) == "C1"
        accepted = []
        for letter in alphabet.replace(token[-1], ""):
            try:
                signer.verify(token[:-1] + letter, document_id)
            except BadLinkToken:
                continue
            accepted.append(letter)
        assert accepted == [], token
        with pytest.raises(BadLinkToken, match="tampered"):
            signer.verify(token.replace(".", ".=", 1), document_id)


def test_forged_payload_is_refused(signer: LinkSigner) -> None:
    # Swap in the payload of a token for another document, keeping the signature.
    payload_2 = signer.token(2, "C1").split(".", 1)[0]
    _, rest = signer.token(1, "C1").split(".", 1)
    with pytest.raises(BadLinkToken, match="tampered"):
        signer.verify(f"{payload_2}.{rest}", 2)


@pytest.mark.parametrize("token", ["", "garbage", "a.b.c", "...."])
def test_malformed_token_is_refused(signer: LinkSigner, token: str) -> None:
    with pytest.raises(BadLinkToken):
        signer.verify(token, 1)


def test_token_from_another_secret_is_refused(signer: LinkSigner, clock: _Clock) -> None:
    other = LinkSigner("another-secret", ttl_seconds=3600, clock=clock)
    with pytest.raises(BadLinkToken, match="tampered"):
        signer.verify(other.token(1, "C1"), 1)


def test_token_expires_after_its_lifetime(signer: LinkSigner, clock: _Clock) -> None:
    token = signer.token(1, "C1")
    clock.now += 3600
    assert signer.verify(token, 1) == "C1"
    clock.now += 1
    with pytest.raises(BadLinkToken, match="expired"):
        signer.verify(token, 1)


def test_token_from_the_future_is_refused(signer: LinkSigner, clock: _Clock) -> None:
    clock.now += 1000
    token = signer.token(1, "C1")
    clock.now -= 1000
    with pytest.raises(BadLinkToken):
        signer.verify(token, 1)


def test_bad_link_token_is_a_403() -> None:
    assert BadLinkToken.status == 403
    assert issubclass(BadLinkToken, KBError)


@pytest.mark.parametrize(("secret", "ttl"), [("", 60), (SECRET, 0), (SECRET, -1)])
def test_signer_refuses_bad_configuration(secret: str, ttl: int) -> None:
    with pytest.raises(ValueError):
        LinkSigner(secret, ttl_seconds=ttl)


def test_signer_uses_the_real_clock_by_default() -> None:
    signer = LinkSigner(SECRET, ttl_seconds=60)
    assert signer.verify(signer.token(7, ""), 7) == ""


# --- URLs


def test_text_url_shape(signer: LinkSigner) -> None:
    token = signer.token(5, "C1")
    url = passage_url("https://kb.example.com", 5, token, start=10, end=42, page=None, is_pdf=False)
    assert url == f"https://kb.example.com/d/5?t={token}#char=10,42"


def test_pdf_url_shape(signer: LinkSigner) -> None:
    token = signer.token(5, "C1")
    url = passage_url("https://kb.example.com", 5, token, start=10, end=42, page=3, is_pdf=True)
    assert url == f"https://kb.example.com/d/5/file?t={token}#page=3"


def test_pdf_url_without_a_page_has_no_fragment() -> None:
    url = passage_url("http://h", 5, "tok", start=0, end=1, page=None, is_pdf=True)
    assert url == "http://h/d/5/file?t=tok"


@pytest.mark.parametrize("base", ["http://h:3000/kb", "http://h:3000/kb/", "http://h:3000/kb//"])
def test_base_url_trailing_slashes_are_not_duplicated(base: str) -> None:
    url = passage_url(base, 1, "tok", start=0, end=1, page=None, is_pdf=False)
    assert url == "http://h:3000/kb/d/1?t=tok#char=0,1"


def test_token_is_query_encoded() -> None:
    url = passage_url("http://h", 1, "a+b&c=d", start=0, end=1, page=None, is_pdf=False)
    assert parse_qs(urlsplit(url).query) == {"t": ["a+b&c=d"]}


@pytest.mark.parametrize(
    ("start", "end", "page", "is_pdf"), [(-1, 3, None, False), (5, 4, None, False), (0, 1, 0, True)]
)
def test_url_refuses_impossible_positions(
    start: int, end: int, page: int | None, is_pdf: bool
) -> None:
    with pytest.raises(ValueError):
        passage_url("http://h", 1, "tok", start=start, end=end, page=page, is_pdf=is_pdf)


def test_url_fragment_selects_the_passage_in_unicode_text(signer: LinkSigner) -> None:
    canonical = "Intro 🙂 über\nNaïve café: 文書の中身。\nEnd."
    passage = "café: 文書の中身"
    start = canonical.index(passage)
    url = passage_url(
        "http://h",
        9,
        signer.token(9, "C1"),
        start=start,
        end=start + len(passage),
        page=None,
        is_pdf=False,
    )
    parsed = parse_char_fragment(urlsplit(url).fragment)
    assert parsed is not None
    a, b = parsed
    assert canonical[a:b] == passage


# --- RFC 5147 fragments


@pytest.mark.parametrize(
    ("fragment", "expected"),
    [
        ("char=10,42", (10, 42)),
        ("#char=10,42", (10, 42)),
        ("char=0,0", (0, 0)),
        ("char=7", (7, 7)),
        ("char=,5", (0, 5)),
        ("CHAR=1,2", (1, 2)),
        ("char=1,2;length=100", (1, 2)),
        ("char=1,2;md5=0123456789abcdef0123456789abcdef", (1, 2)),
    ],
)
def test_parse_char_fragment(fragment: str, expected: tuple[int, int]) -> None:
    assert parse_char_fragment(fragment) == expected


@pytest.mark.parametrize(
    "fragment",
    [
        "",
        "#",
        "char=",
        "char=,",
        "char=5,",
        "char=4,2",
        "char=-1,2",
        "char=a,b",
        "line=1,2",
        "page=3",
        "char=1,2,3",
        "char=1 ,2",
        "xchar=1,2",
        "char=١,٢",
    ],
)
def test_parse_char_fragment_rejects(fragment: str) -> None:
    assert parse_char_fragment(fragment) is None


@given(text=st.text(max_size=40), data=st.data())
def test_any_passage_round_trips_through_a_url(text: str, data: st.DataObject) -> None:
    start = data.draw(st.integers(min_value=0, max_value=len(text)))
    end = data.draw(st.integers(min_value=start, max_value=len(text)))
    url = passage_url("http://h/", 1, "tok", start=start, end=end, page=None, is_pdf=False)
    parsed = parse_char_fragment(urlsplit(url).fragment)
    assert parsed == (start, end)


# --- the persisted secret


def test_configured_secret_wins(tmp_path: Path) -> None:
    assert load_or_create_secret(tmp_path, "configured") == "configured"
    assert not (tmp_path / SECRET_FILENAME).exists()


def test_secret_is_created_once_with_private_permissions(tmp_path: Path) -> None:
    data_dir = tmp_path / "kb-data"
    first = load_or_create_secret(data_dir, "")
    assert len(first) >= 32
    path = data_dir / SECRET_FILENAME
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_or_create_secret(data_dir, "  ") == first
    assert [p.name for p in data_dir.iterdir()] == [SECRET_FILENAME]


def test_secret_differs_between_installations(tmp_path: Path) -> None:
    assert load_or_create_secret(tmp_path / "a", "") != load_or_create_secret(tmp_path / "b", "")


def test_existing_secret_is_never_overwritten(tmp_path: Path) -> None:
    (tmp_path / SECRET_FILENAME).write_text("kept-secret\n")
    assert load_or_create_secret(tmp_path, "") == "kept-secret"


def test_empty_secret_file_is_an_actionable_error(tmp_path: Path) -> None:
    (tmp_path / SECRET_FILENAME).write_text("")
    with pytest.raises(KBError, match="KB_LINK_SECRET"):
        load_or_create_secret(tmp_path, "")


def test_unwritable_data_dir_is_an_actionable_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(KBError, match="KB_LINK_SECRET"):
        load_or_create_secret(blocker / "kb-data", "")


def test_a_kept_secret_that_cannot_be_created_yet_leaves_links_unsigned_until_it_can(
    tmp_path: Path, clock: _Clock
) -> None:
    blocker = tmp_path / "kb"
    blocker.write_text("a file where the data dir should be")
    signer = LinkSigner.kept(blocker, "", ttl_seconds=3600, clock=clock)
    reason = signer.unavailable()
    assert reason is not None and "Cannot read or create the link secret" in reason
    with pytest.raises(KBError, match="Cannot read or create the link secret"):
        signer.token(1, "C1")
    with pytest.raises(BadLinkToken, match="cannot be checked"):
        signer.verify("anything", 1)
    with pytest.raises(BadLinkToken, match="cannot be checked"):
        signer.verify("AB.AB.AB", 1)  # not canonical base64: still, no secret is said first

    blocker.unlink()  # the directory can be made now: the next use creates the secret
    token = signer.token(1, "C1")
    assert signer.unavailable() is None
    assert (blocker / SECRET_FILENAME).exists()
    assert signer.verify(token, 1) == "C1"
    again = LinkSigner.kept(blocker, "", ttl_seconds=3600, clock=clock)
    assert again.verify(token, 1) == "C1"  # the same secret, kept on disk
