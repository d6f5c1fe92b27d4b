"""Text of scanned PDF pages, read by Tesseract OCR.

A page is scanned when its text layer holds less than ``MIN_TEXT_LAYER_CHARS``
visible characters and it carries an image: a scanner writes one image per
page, so the page's embedded images are read instead of rendering the page
(no renderer is needed). The OCR'd text of a page starts with a marker line,
``[page N: text read by OCR]`` (``ocr_marker``), so the canonical text itself
says which pages were read by OCR: the viewer shows it, citations quote it,
and no column is needed to remember it.

Each distinct image is read once per document: an image is known by its PDF
object (an inline image by its pixels), so one image listed under many names on
a page is read once there, and one image shown on many pages is read once and
its text given to each of them. Tesseract's time is counted: a page's images
share ``OcrConfig.page_timeout``, and inside a reader process
(``index.ingest.isolated``) every run also ends by the document's own deadline
(``reading_until``), so OCR is paid from the one budget the document has. A page is read from at most
``MAX_IMAGES_PER_PAGE`` distinct images and a document from at most
``IMAGES_PER_OCR_PAGE`` times ``OcrConfig.max_pages`` (a scanner writes one a
page); a page past either bound is left unread, saying which.

A scanned page OCR could not read (Tesseract or the language missing, more
scanned pages than ``OcrConfig.max_pages``, a page over ``OcrConfig.page_timeout``,
the document's reading time spent, more images than the bounds above)
stays a page of its document, holding the line
``[page N: image only, not read: <why>]`` (``unread_marker``): the document's
other pages are indexed with their page numbers, and the gap is visible
wherever its text is. Only a document of which no page has text fails
(``OcrPages.failure``).

Errors (each a document's ``failed`` reason, never a crash):
    UnsupportedType: Tesseract or the configured language is not installed.
    OverLimit: more pages need OCR than ``OcrConfig.max_pages`` (kind ``ocr_pages``),
        one page took longer than ``OcrConfig.page_timeout`` (``ocr_time``), or the
        document's reading time was spent (``time``).
    CorruptDocument: an image that cannot be decoded, or Tesseract failing on it.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from index.config import OcrConfig
from index.errors import CorruptDocument, ExtractionError, OverLimit, UnsupportedType

if TYPE_CHECKING:
    # Tesseract's wrapper and Pillow load with the first scan read (in a reader's own
    # process), not with every process that imports the ingestion package.
    from PIL import Image
    from pypdf import PageObject
    from pypdf._page import VirtualListImages

__all__ = [
    "IMAGES_PER_OCR_PAGE",
    "MAX_IMAGES_PER_PAGE",
    "MIN_TEXT_LAYER_CHARS",
    "OCR_MARKER",
    "OCR_NOT_AVAILABLE",
    "UNREAD_MARKER",
    "OcrPages",
    "needs_ocr",
    "ocr_marker",
    "ocr_pages",
    "read_pages",
    "reading_until",
    "unread_marker",
]

# A page number or a stray header is not a text layer; a real page has far more.
MIN_TEXT_LAYER_CHARS = 20
# Images smaller than this (icons, logos, rules) are not a scanned page.
_MIN_IMAGE_SIDE = 64
# A scanner writes one image a page (some a few strips); each distinct image is a
# Tesseract run of its own, so a page of more is left unread rather than read for minutes.
MAX_IMAGES_PER_PAGE = 16
# Distinct images read per document, per page KB_OCR_MAX_PAGES allows.
IMAGES_PER_OCR_PAGE = 2
OCR_MARKER = re.compile(r"^\[page (\d+): text read by OCR\]$", re.MULTILINE)
UNREAD_MARKER = re.compile(r"^\[page (\d+): image only, not read: ([^\]\n]+)\]$", re.MULTILINE)
OCR_NOT_AVAILABLE = "OCR not available"
_INSTALL_HINT = (
    "install tesseract-ocr (Debian/Ubuntu: apt-get install tesseract-ocr) or set "
    "KB_OCR_TESSERACT_CMD to its path"
)


def ocr_marker(page_number: int) -> str:
    """The line that opens the OCR'd text of 1-based page ``page_number``."""
    return f"[page {page_number}: text read by OCR]"


def ocr_pages(text: str, page_starts: Sequence[int]) -> list[int]:
    """The 1-based pages of a PDF's canonical text that OCR read.

    A page counts only when its own range holds the marker of its own number,
    so a marker line that a document's text merely contains (a page quoting
    one, another type of document) names nothing.
    """
    ends = [*page_starts[1:], len(text)]
    return [
        number
        for number, (start, end) in enumerate(zip(page_starts, ends, strict=True), start=1)
        if any(int(m.group(1)) == number for m in OCR_MARKER.finditer(text, start, end))
    ]


def unread_marker(page_number: int, why: str) -> str:
    """The line that stands for 1-based page ``page_number``, a scan OCR could not read."""
    return f"[page {page_number}: image only, not read: {why}]"


@dataclass(frozen=True)
class OcrPages:
    """What OCR made of a document's scanned pages (0-based page indexes).

    Attributes:
        texts: each page read, its text without the marker ("" when OCR found none).
        unread: each scanned page not read, why (the end of its ``unread_marker``).
        failure: the reason the document fails with when no page of it has text.
    """

    texts: dict[int, str] = field(default_factory=dict)
    unread: dict[int, str] = field(default_factory=dict)
    failure: ExtractionError | None = None


def needs_ocr(page_text: str) -> bool:
    """Whether a page's text layer is too thin to be its text."""
    return sum(1 for ch in page_text if not ch.isspace()) < MIN_TEXT_LAYER_CHARS


def read_pages(
    pages: Sequence[tuple[int, PageObject]],
    config: OcrConfig,
    name: str,
    filename: str,
    *,
    has_text: bool = False,
) -> OcrPages:
    """OCR the images of the given pages, as far as Tesseract and the limits allow.

    Args:
        pages: ``(0-based page index, page)`` of each page without a text layer.
        config: language, timeout, page limit and Tesseract's path.
        name, filename: for the failure reasons.
        has_text: other pages of the document have a text layer, so it is
            indexed whatever OCR does; without one, a document OCR cannot
            read at all (Tesseract missing, over the page limit) fails before
            any page is read.

    Returns:
        The pages read (pages without any image are left out) and those that
        could not be, with why.

    Raises:
        UnsupportedType: Tesseract or the language is missing, and not ``has_text``.
        OverLimit: more scanned pages than the limit, and not ``has_text``.
        CorruptDocument: an image cannot be decoded, or Tesseract fails on it.
    """
    images = _PdfImages(name, filename)
    scanned = [(i, found) for i, page in pages if (found := images.of_page(page))]
    if not scanned:
        return OcrPages()
    unread: dict[int, str] = {}
    failure: ExtractionError | None = None
    if len(scanned) > config.max_pages:
        failure = OverLimit(
            f"{name} has {len(scanned):,} scanned pages, over the limit of {config.max_pages:,} "
            "pages read by OCR per document. Split it, or ask an admin to raise KB_OCR_MAX_PAGES.",
            filename=filename,
            kind="ocr_pages",
            limit=config.max_pages,
        )
        if not has_text:
            raise failure
        why = f"more scanned pages than KB_OCR_MAX_PAGES ({config.max_pages:,})"
        unread = {i: why for i, _ in scanned[config.max_pages :]}
        scanned = scanned[: config.max_pages]
    try:
        _check_tesseract(config, name, filename)
    except UnsupportedType as exc:
        if not has_text:
            raise
        every = {i: OCR_NOT_AVAILABLE for i, _ in scanned} | unread
        return OcrPages(unread=dict(sorted(every.items())), failure=exc)
    texts: dict[int, str] = {}
    read: dict[Hashable, str] = {}  # each distinct image's text, read once per document
    most = IMAGES_PER_OCR_PAGE * config.max_pages
    for i, found in scanned:
        new = [image for image in found if image.key not in read]
        if len(found) > MAX_IMAGES_PER_PAGE or len(read) + len(new) > most:
            unread[i] = _too_many_images(len(found), most)
            failure = failure or OverLimit(
                f"Page {i + 1} of {name} is not read by OCR: {unread[i]}.", filename=filename
            )
            continue
        if _document_spent():
            # The document's time is spent: no page after this one is read either.
            unread |= {j: _SPENT for j, _ in scanned if j >= i and j not in unread}
            failure = failure or _time_spent(name, filename)
            break
        page_deadline = time.monotonic() + config.page_timeout
        try:
            for image in new:
                read[image.key] = _read_image(i, image, config, page_deadline, name, filename)
        except OverLimit as exc:  # this page took too long; the next ones may not
            unread[i] = (
                _SPENT
                if exc.kind == "time"
                else f"OCR took longer than {config.page_timeout:g} s (KB_OCR_TIMEOUT)"
            )
            failure = failure or exc
            continue
        texts[i] = "\n\n".join(t for t in (read[image.key] for image in found) if t)
    return OcrPages(texts=texts, unread=dict(sorted(unread.items())), failure=failure)


def _too_many_images(on_page: int, most: int) -> str:
    if on_page > MAX_IMAGES_PER_PAGE:
        return f"{on_page} images on one page, over the {MAX_IMAGES_PER_PAGE} read per page"
    return (
        f"over the {most:,} images read per document ({IMAGES_PER_OCR_PAGE} per page "
        "KB_OCR_MAX_PAGES allows)"
    )


@dataclass(frozen=True)
class _Image:
    """One distinct image of a page: what it is known by, and how to decode it."""

    key: Hashable
    load: Callable[[], Image.Image]


class _PdfImages:
    """The distinct images of a PDF's pages, known without decoding them.

    pypdf lists an image once per name it has on the page (``/Im1`` and
    ``/Im2`` may be one object) and decodes it each time it is asked; here an
    image is known by its object number and sized by its dictionary, and only
    decoded when Tesseract reads it. An inline image (which pypdf has already
    decoded, and which has no object) is known by its pixels.
    """

    def __init__(self, name: str, filename: str) -> None:
        self.name = name
        self.filename = filename

    def of_page(self, page: PageObject) -> list[_Image]:
        """The page's distinct images large enough to be a scan, in its order."""
        try:
            return self._of_page(page)
        except Exception as exc:  # pypdf and Pillow raise assorted errors on broken streams
            raise CorruptDocument(
                f"{self.name} has a scanned page whose image cannot be decoded "
                f"({type(exc).__name__}). Scan or export it again and upload the new copy.",
                filename=self.filename,
            ) from exc

    def _of_page(self, page: PageObject) -> list[_Image]:
        listed = page.images
        out: list[_Image] = []
        keys: set[Hashable] = set()
        # The ids, not the images: iterating the list itself decodes every image.
        for image_id in listed.keys():  # noqa: SIM118
            key, size = _object(page, image_id)
            if key is None:  # inline: no object to know it by
                decoded = listed[image_id].image
                if decoded is None:
                    continue
                key, size = _pixels_key(decoded), decoded.size
            if key in keys:
                continue
            keys.add(key)
            if size is None:  # no usable /Width and /Height: the image says
                decoded = listed[image_id].image
                size = decoded.size if decoded is not None else (0, 0)
            if min(size) >= _MIN_IMAGE_SIDE:
                out.append(_Image(key, functools.partial(_decoded, listed, image_id)))
        return out


def _decoded(listed: VirtualListImages, image_id: str | list[str]) -> Image.Image:
    image = listed[image_id].image
    if image is None:
        raise ValueError(f"image {image_id} has no picture")
    return image


def _object(
    page: PageObject, image_id: str | list[str]
) -> tuple[Hashable | None, tuple[int, int] | None]:
    """The PDF object an image id names, as ``(number, generation)``, and its stated size.

    ``(None, None)`` for an inline image or one written directly into its
    resources (no object number to know it by).
    """
    path = [image_id] if isinstance(image_id, str) else list(image_id)
    if path[-1].startswith("~"):
        return None, None
    obj: Any = page
    for name in path:
        obj = obj["/Resources"].get_object()["/XObject"].get_object()[name].get_object()
    ref = getattr(obj, "indirect_reference", None)
    if ref is None:
        return None, None
    width, height = obj.get("/Width"), obj.get("/Height")
    stated = isinstance(width, int) and isinstance(height, int)
    return ("object", ref.idnum, ref.generation), (int(width), int(height)) if stated else None


def _pixels_key(image: Image.Image) -> Hashable:
    return ("pixels", image.mode, image.size, hashlib.sha256(image.tobytes()).digest())


def _check_tesseract(config: OcrConfig, name: str, filename: str) -> None:
    """Fail clearly when Tesseract or the language is missing, before reading anything."""
    import pytesseract

    pytesseract.pytesseract.tesseract_cmd = config.tesseract_cmd
    try:
        installed = set(pytesseract.get_languages())
    except (pytesseract.TesseractNotFoundError, OSError) as exc:
        raise UnsupportedType(
            f"OCR not available: {name} is a scanned PDF and Tesseract was not found "
            f"({_INSTALL_HINT}).",
            filename=filename,
        ) from exc
    missing = [lang for lang in config.language.split("+") if lang not in installed]
    if missing:
        raise UnsupportedType(
            f"OCR not available for {name}: the OCR language {'+'.join(missing)} is not "
            f"installed (Debian: apt-get install tesseract-ocr-{missing[0]}), or set "
            "KB_OCR_LANGUAGE to an installed one.",
            filename=filename,
        )


def _read_image(
    index: int, image: _Image, config: OcrConfig, page_deadline: float, name: str, filename: str
) -> str:
    """What Tesseract reads in one image of 0-based page ``index``, by the page's and
    the document's deadlines (whichever comes first ends the run)."""
    document = _document_deadline[0] if _document_deadline else math.inf
    seconds = min(page_deadline, document) - time.monotonic()
    if seconds <= 0:  # pytesseract sets no timeout at all for 0 or less
        if document <= page_deadline:
            raise _time_spent(name, filename)
        raise _page_over(index, config, name, filename)
    import pytesseract

    try:
        raw = pytesseract.image_to_string(image.load(), lang=config.language, timeout=seconds)
    except RuntimeError as exc:  # pytesseract's timeout is a bare RuntimeError
        if "timeout" not in str(exc).lower():
            raise _ocr_failed(name, filename, index, exc) from exc
        if document <= page_deadline:
            raise _time_spent(name, filename) from exc
        raise _page_over(index, config, name, filename) from exc
    except Exception as exc:  # TesseractError, Pillow conversion errors
        raise _ocr_failed(name, filename, index, exc) from exc
    return _tidy(raw)


def _page_over(index: int, config: OcrConfig, name: str, filename: str) -> OverLimit:
    return OverLimit(
        f"Page {index + 1} of {name} took longer than {config.page_timeout:g} s to read "
        "by OCR. Scan it at a lower resolution, or ask an admin to raise KB_OCR_TIMEOUT.",
        filename=filename,
        kind="ocr_time",
        limit=config.page_timeout,
    )


_SPENT = "the document's reading time was spent (KB_EXTRACT_TIMEOUT)"


def _time_spent(name: str, filename: str) -> OverLimit:
    seconds = _document_deadline[1] if _document_deadline else 0.0
    return OverLimit(
        f"{name} took longer than {seconds:g} s to read, OCR included, the limit per "
        "document (KB_EXTRACT_TIMEOUT). Scan it at a lower resolution (or split it) and "
        "upload the new copy, or ask an admin to raise KB_EXTRACT_TIMEOUT.",
        filename=filename,
        kind="time",
        limit=seconds,
    )


# The monotonic time by which the document being read must be read, and the seconds
# it was given: set by the reader process (index.ingest.isolated) around each document.
# None outside a reader: each page still has its own limit.
_document_deadline: tuple[float, float] | None = None


@contextmanager
def reading_until(deadline: float, seconds: float) -> Iterator[None]:
    """Inside, every Tesseract run ends by ``deadline`` (``time.monotonic``), the end of
    the ``seconds`` the document has; scanned pages left then are not read."""
    global _document_deadline
    _document_deadline = (deadline, seconds)
    try:
        yield
    finally:
        _document_deadline = None


def _document_spent() -> bool:
    return _document_deadline is not None and time.monotonic() >= _document_deadline[0]


def _ocr_failed(name: str, filename: str, index: int, exc: Exception) -> CorruptDocument:
    return CorruptDocument(
        f"Page {index + 1} of {name} could not be read by OCR ({type(exc).__name__}: "
        f"{str(exc)[:200]}). Scan it again and upload the new copy.",
        filename=filename,
    )


def _tidy(raw: str) -> str:
    """Tesseract's text with its form feed and trailing blanks dropped, paragraphs kept."""
    lines = [line.rstrip() for line in raw.replace("\f", "\n").replace("\r", "\n").split("\n")]
    text = "\n".join(lines).strip()
    return re.sub(r"\n{3,}", "\n\n", text).replace("\x00", "")
