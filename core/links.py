"""Signed, expiring, unguessable links into the exact passage of a document.

A link carries a token that the server signed over ``(document id, scope)``
together with the time it was issued; only the server's secret can produce
one, so nobody can enumerate documents by changing the id in a URL. The scope
is an opaque string chosen by the caller (for example the Slack channel the
link was posted to) and is handed back on verification. Tokens are signed,
not encrypted: the document id and scope can be read from them, so the scope
must not be a secret.

Fragments follow published conventions so that any viewer can honour them:
RFC 5147 ``#char=a,b`` for text (zero-based positions between code points,
selecting ``canonical[a:b]``) and the PDF Open Parameters ``#page=n`` (1-based)
for the original PDF.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from itsdangerous import (
    BadData,
    BadSignature,
    SignatureExpired,
    Signer,
    TimestampSigner,
    URLSafeTimedSerializer,
)
from itsdangerous.encoding import base64_decode, base64_encode

from core.errors import BadLinkToken, LinkSecretUnavailable

__all__ = [
    "SECRET_FILENAME",
    "LinkSigner",
    "load_or_create_secret",
    "parse_char_fragment",
    "passage_url",
]

SECRET_FILENAME = "link-secret"
_SALT = "kb-doc-link"
# RFC 5147 char-scheme: a position "a", a range "a,b" or ",b", then optional
# integrity checks (";length=..." / ";md5=...") that we accept and ignore.
_CHAR_FRAGMENT_RE = re.compile(r"char=([0-9]*)(,([0-9]*))?((;[A-Za-z0-9=,.-]*)*)", re.IGNORECASE)


class _ClockSigner(TimestampSigner):
    """A timestamp signer that reads an injectable clock (tests move time forward)."""

    def __init__(self, *args: Any, clock: Callable[[], float] = time.time, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._clock = clock

    def get_timestamp(self) -> int:
        """Current time in whole seconds, from the injected clock."""
        return int(self._clock())


class LinkSigner:
    """Issues and checks the access tokens of passage links.

    Args:
        secret: the signing secret (see :func:`load_or_create_secret`).
        ttl_seconds: how long a token stays valid after it is issued.
        clock: source of the current time in seconds; ``time.time`` by default.

    Raises:
        ValueError: the secret is empty or the lifetime is not positive.
    """

    def __init__(
        self, secret: str, *, ttl_seconds: int, clock: Callable[[], float] = time.time
    ) -> None:
        if not secret:
            raise ValueError("LinkSigner needs a non-empty secret")
        if ttl_seconds <= 0:
            raise ValueError(f"ttl_seconds must be positive, got {ttl_seconds}")
        self._ttl = ttl_seconds
        self._secret = secret
        self._load: Callable[[], str] | None = None
        self._clock = clock
        self._serializer = self.derived(_SALT)

    @classmethod
    def kept(
        cls,
        data_dir: Path,
        configured: str,
        *,
        ttl_seconds: int,
        clock: Callable[[], float] = time.time,
    ) -> LinkSigner:
        """A signer whose secret is configured or kept in ``data_dir`` (see :func:`load_or_create_secret`).

        A secret that cannot be read or created yet (a full disk at the first
        start) does not stop the signer: :meth:`token` and :meth:`verify` raise
        ``LinkSecretUnavailable`` until a later use manages to create it, and
        :meth:`unavailable` says why.
        """
        signer = cls("pending", ttl_seconds=ttl_seconds, clock=clock)
        signer._secret = ""
        signer._load = lambda: load_or_create_secret(data_dir, configured)
        with contextlib.suppress(LinkSecretUnavailable):
            signer._current_secret()
        return signer

    def _current_secret(self) -> str:
        """The secret, read (or created) now if it could not be before.

        Raises:
            LinkSecretUnavailable: it still cannot be read or created.
        """
        if not self._secret and self._load is not None:
            self._secret = self._load()
        return self._secret

    def unavailable(self) -> str | None:
        """Why links cannot be signed now (after one more try), or ``None`` when they can."""
        try:
            self._current_secret()
        except LinkSecretUnavailable as exc:
            return str(exc)
        return None

    def derived(self, purpose: str) -> URLSafeTimedSerializer:
        """A timed serializer for other short signed values (a browser session, a sign-in).

        Its key is derived from the link secret and ``purpose`` (the salt), so a
        value signed for one purpose never verifies as another, nor as a link.
        Check its age with ``loads(..., max_age=...)``.
        """
        # SHA-256 rather than itsdangerous' SHA-1 default: nothing to keep compatible with.
        return _SecretSerializer(
            self._current_secret,
            salt=purpose,
            signer=_ClockSigner,
            signer_kwargs={"digest_method": hashlib.sha256, "clock": self._clock},
        )

    def token(self, document_id: int, scope: str) -> str:
        """Sign a token that opens ``document_id`` for ``scope`` until it expires.

        Args:
            document_id: the document the link opens.
            scope: opaque context handed back by :meth:`verify` (e.g. a channel id).

        Returns:
            A URL-safe token.
        """
        return self._serializer.dumps([document_id, scope])

    def verify(self, token: str, document_id: int) -> str:
        """Check a token for ``document_id`` and return the scope it was issued for.

        Args:
            token: the token from the link's query string.
            document_id: the document id from the link's path.

        Returns:
            The scope passed to :meth:`token`.

        Raises:
            BadLinkToken: the token is expired, tampered with or malformed, or was
                issued for another document. The message says which, for the
                log; the page shown to the person stays a generic 403.
        """
        try:
            payload = self._serializer.loads(token, max_age=self._ttl)
        except LinkSecretUnavailable as exc:
            # No secret, no link was ever signed with it: nothing can be valid.
            raise BadLinkToken(f"Link for document {document_id} cannot be checked: {exc}") from exc
        except SignatureExpired as exc:
            raise BadLinkToken(f"Link token for document {document_id} has expired.") from exc
        except BadData as exc:
            raise BadLinkToken(
                f"Link token for document {document_id} is tampered or malformed."
            ) from exc
        signed_id, scope = _unpack(payload)
        if signed_id != document_id:
            raise BadLinkToken(
                f"Link token was issued for document {signed_id}, not document {document_id}."
            )
        return scope


class _SecretSerializer(URLSafeTimedSerializer):
    """A timed serializer that takes its key from its signer at each use (it may come later)."""

    def __init__(self, key: Callable[[], str], **kwargs: Any) -> None:
        super().__init__("key read at use", **kwargs)
        self._key = key
        self._keyed = False

    def _rekey(self) -> None:
        if not self._keyed:
            self.secret_keys = [self._key().encode("utf-8")]
            self._keyed = True

    def make_signer(self, salt: str | bytes | None = None) -> Signer:
        """The signer, keyed with the secret (``LinkSecretUnavailable`` while there is none)."""
        self._rekey()
        return super().make_signer(salt)

    def iter_unsigners(self, salt: str | bytes | None = None) -> Iterator[TimestampSigner]:
        """The unsigners, keyed with the secret (``LinkSecretUnavailable`` while there is none)."""
        self._rekey()
        return super().iter_unsigners(salt)

    def loads(self, s: str | bytes, *args: Any, **kwargs: Any) -> Any:
        """Like the base class, refusing any spelling but the one :meth:`dumps` writes.

        Raises:
            BadSignature: a part is not in canonical URL-safe base64.
        """
        self._rekey()  # no secret yet: that is said first, whatever the token
        _require_canonical(s if isinstance(s, str) else s.decode("utf-8", "replace"))
        return super().loads(s, *args, **kwargs)


def _require_canonical(token: str) -> None:
    """Refuse a token whose parts decode to the right bytes from another spelling.

    The last character of unpadded base64 carries unused bits: without this
    check a token and up to 15 variants of it (the last letter changed) all
    verify, so "the same link" would have several spellings and a changed
    token could pass as untouched.
    """
    for part in token.split("."):
        if not part:
            continue  # a compressed payload starts with "."
        try:
            canonical = base64_encode(base64_decode(part)).decode("ascii")
        except BadData as exc:
            raise BadSignature("a part is not URL-safe base64") from exc
        if canonical != part:
            raise BadSignature("a part is not in canonical base64")


def _unpack(payload: object) -> tuple[int, str]:
    """Validate the shape of a correctly signed payload (defends against secret reuse)."""
    if (
        isinstance(payload, list)
        and len(payload) == 2
        and type(payload[0]) is int
        and isinstance(payload[1], str)
    ):
        return payload[0], payload[1]
    raise BadLinkToken("Link token has an unexpected payload.")


def passage_url(
    base_url: str,
    document_id: int,
    token: str,
    *,
    start: int,
    end: int,
    page: int | None,
    is_pdf: bool,
) -> str:
    """Build the link that opens one passage of a document.

    Args:
        base_url: public base URL of the server, with or without a trailing slash.
        document_id: the document to open.
        token: an access token from :meth:`LinkSigner.token`.
        start: zero-based code-point offset where the passage starts.
        end: offset just past the passage (``canonical[start:end]``).
        page: 1-based page of the passage in a PDF, or ``None`` if unknown.
        is_pdf: link to the original PDF at ``page`` instead of the text viewer.

    Returns:
        ``{base}/d/{id}?t={token}#char={start},{end}`` for text, or
        ``{base}/d/{id}/file?t={token}#page={page}`` for a PDF (no fragment
        when the page is unknown).

    Raises:
        ValueError: the offsets are not ``0 <= start <= end`` or the page is below 1.
    """
    base = base_url.rstrip("/")
    query = urlencode({"t": token})
    if is_pdf:
        if page is not None and page < 1:
            raise ValueError(f"PDF pages are 1-based, got {page}")
        fragment = f"#page={page}" if page is not None else ""
        return f"{base}/d/{document_id}/file?{query}{fragment}"
    if not 0 <= start <= end:
        raise ValueError(f"need 0 <= start <= end, got start={start}, end={end}")
    return f"{base}/d/{document_id}?{query}#char={start},{end}"


def parse_char_fragment(fragment: str) -> tuple[int, int] | None:
    """Parse an RFC 5147 character fragment.

    ``char=a,b`` selects ``text[a:b]``; ``char=a`` is the position before
    character ``a`` and gives ``(a, a)``; ``char=,b`` gives ``(0, b)``. Integrity
    checks after ``;`` are ignored. A leading ``#`` is allowed.

    Args:
        fragment: the fragment, e.g. ``"#char=10,42"``.

    Returns:
        ``(start, end)``, or ``None`` for anything else, including ``char=a,``
        (its end depends on the text's length), ``char=`` and ranges whose end
        is before their start.
    """
    m = _CHAR_FRAGMENT_RE.fullmatch(fragment.removeprefix("#"))
    if m is None:
        return None
    first, comma, second = m.group(1), m.group(2), m.group(3)
    if comma is None:
        return (int(first), int(first)) if first else None
    if not second:
        return None
    start = int(first) if first else 0
    end = int(second)
    return (start, end) if start <= end else None


def load_or_create_secret(data_dir: Path, configured: str) -> str:
    """Return the link-signing secret, creating and persisting one if none is configured.

    The generated secret is written once to ``data_dir/link-secret`` with mode
    0600 and reused on every start, so links survive restarts. Creation is
    atomic and race-free: when two processes start together, both end up with
    the secret that reached the disk first.

    Args:
        data_dir: the data directory (created if missing).
        configured: the configured secret; used as is when not blank.

    Returns:
        The secret.

    Raises:
        LinkSecretUnavailable: the secret file cannot be read or written, or is empty.
    """
    if configured.strip():
        return configured
    path = data_dir / SECRET_FILENAME
    try:
        if not path.exists():
            _create_secret_file(path)
        secret = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise LinkSecretUnavailable(
            f"Cannot read or create the link secret {path}: {exc.strerror or exc}. "
            "Fix the data directory's permissions or set KB_LINK_SECRET."
        ) from exc
    if not secret:
        raise LinkSecretUnavailable(
            f"The link secret file {path} is empty. Delete it to have a new one "
            "created (existing links stop working) or set KB_LINK_SECRET."
        )
    return secret


def _create_secret_file(path: Path) -> None:
    """Write a fresh secret beside ``path`` and link it into place unless one already exists."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.fchmod(fd, 0o600)  # the umask must not widen or narrow it
        os.write(fd, (secrets.token_urlsafe(48) + "\n").encode("ascii"))
        os.fsync(fd)
    except OSError:
        tmp.unlink(missing_ok=True)  # a full disk leaves no half-written secret behind
        raise
    finally:
        os.close(fd)
    try:
        # link() never overwrites: if another process won the race, keep its secret.
        os.link(tmp, path)
    except FileExistsError:
        pass
    finally:
        tmp.unlink(missing_ok=True)
