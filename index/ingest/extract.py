"""Bytes -> one canonical text per document (plus a page map for PDFs).

The canonical text is what every chunk offset and every ``#char=a,b`` link
refers to, so it is produced once, here, with newlines normalised to ``\\n``.
The type is detected from the content; the file name only separates Markdown
from plain text and explains what a mislabelled file claims to be.

HTML becomes Markdown-like text: headings as ATX lines (``## Heading``), one
blank line between blocks, ``- `` before list items and ``<pre>`` kept verbatim
inside a code fence, so the chunker finds sections and paragraphs in it.

Word, PowerPoint and Excel files are ZIP packages, checked against zip bombs
before they are read (``index.ingest.office_zip``), then written the same way
(``index.ingest.office``, ``index.ingest.sheets``); CSV files are decoded as text, then read
as one sheet. Legacy and password-protected Office files are refused.

Every document's text is held to ``max_text_chars`` (``KB_MAX_TEXT_CHARS``):
counted while it is read for Office files, CSV and PDF pages, where a small
file can expand many times (``index.ingest.office.TextBudget``), and checked
on the finished text for every type.
"""

from __future__ import annotations

import io
import logging
import math
import re
from collections.abc import Callable
from pathlib import PurePosixPath, PureWindowsPath

from bs4 import BeautifulSoup
from bs4.element import PageElement, PreformattedString, Tag
from pypdf import PdfReader, apply_configuration
from pypdf.errors import LimitReachedError

from index.config import (
    DEFAULT_MAX_PAGES,
    DEFAULT_MAX_TEXT_CHARS,
    DEFAULT_MAX_UPLOAD_BYTES,
    OcrConfig,
)
from index.errors import CorruptDocument, EmptyDocument, OverLimit, TooLarge, UnsupportedType
from index.ingest.chunk import markdown_structure
from index.ingest.formats import (
    EXTRACTOR_VERSION,
    FOLDER_SUFFIXES,
    SUPPORTED_SUFFIXES,
    SUPPORTED_TYPES,
)
from index.ingest.ocr import OcrPages, needs_ocr, ocr_marker, read_pages, unread_marker
from index.ingest.office import TextBudget, docx_document, pptx_document
from index.ingest.office_zip import (
    OFFICE_SUFFIXES,
    OLE_MAGIC,
    ZIP_MAGIC,
    open_package,
    reject_ole,
)
from index.ingest.sheets import csv_document, xlsx_document
from index.models import Extracted

log = logging.getLogger(__name__)

MAX_TITLE_CHARS = 200
_MB = 1024 * 1024
_MARKDOWN_SUFFIXES = frozenset({".md", ".markdown"})
_HTML_SUFFIXES = frozenset({".html", ".htm", ".xhtml"})
_CSV_SUFFIXES = frozenset({".csv", ".tsv"})
_TEXT_SUFFIXES = frozenset({".txt", ".text"}) | _MARKDOWN_SUFFIXES | _HTML_SUFFIXES | _CSV_SUFFIXES
_OFFICE_SUFFIXES = frozenset(OFFICE_SUFFIXES)

# Known binary formats, so the reason can say what the file is.
_MAGIC: tuple[tuple[bytes, str], ...] = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"GIF87a", "a GIF image"),
    (b"GIF89a", "a GIF image"),
    (b"II*\x00", "a TIFF image"),
    (b"MM\x00*", "a TIFF image"),
    (b"\x1f\x8b", "a gzip archive"),
    (b"7z\xbc\xaf\x27\x1c", "a 7-Zip archive"),
    (b"Rar!\x1a\x07", "a RAR archive"),
    (b"\x7fELF", "a program"),
    (b"{\\rtf", "an RTF document"),
)
# What a saved web page starts with, after an optional XML prologue and comments.
_HTML_START = re.compile(
    r"\A\s*(?:<\?xml[^>]*>\s*)?(?:<!--.*?-->\s*)*<(?:!doctype\s+html|html|head|body)[\s>/]",
    re.IGNORECASE | re.DOTALL,
)
_UTF8_MULTIBYTE = re.compile(
    rb"[\xc2-\xdf][\x80-\xbf]|[\xe0-\xef][\x80-\xbf]{2}|[\xf0-\xf4][\x80-\xbf]{3}"
)
_CONTROL_CHARS = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")
# Share of non-ASCII characters above which cp1252 output is mojibake, not prose.
_MAX_NON_ASCII_SHARE = 0.3
# PDF readers accept %%EOF anywhere near the end; further back it was cut off.
_PDF_EOF_WINDOW = 4096


def extract(
    data: bytes,
    filename: str,
    *,
    max_bytes: int = DEFAULT_MAX_UPLOAD_BYTES,
    max_pages: int = DEFAULT_MAX_PAGES,
    ocr: OcrConfig | None = None,
    max_text_chars: int = DEFAULT_MAX_TEXT_CHARS,
) -> Extracted:
    """Turn a document's bytes into its canonical text.

    Args:
        data: the file's bytes.
        filename: the name it was uploaded under (used for messages, the
            Markdown/text distinction and the fallback title).
        max_bytes: the upload limit.
        max_pages: most pages a PDF may have; counted before any text is extracted.
        ocr: how PDF pages without a text layer are read (``index.ingest.ocr``).
        max_text_chars: most characters of text the document may yield, counted
            while it is read (Office, CSV, PDF pages) and checked when done.

    Returns:
        The canonical text, title, detected kind and, for PDFs, the page map.

    Raises:
        TooLarge: ``data`` is over ``max_bytes`` (checked first).
        OverLimit: a PDF of more than ``max_pages`` pages, or more than
            ``max_text_chars`` characters of text.
        EmptyDocument: no bytes, only whitespace, or no text layer.
        UnsupportedType: an image, archive or other binary file.
        CorruptDocument: damaged, truncated, password-protected or mislabelled.
    """
    name = _display_name(filename)
    budget = TextBudget(max_text_chars, name, filename)
    extracted = _extract(data, name, filename, max_bytes, max_pages, ocr, budget)
    budget.check(extracted.text)
    return extracted


def _extract(
    data: bytes,
    name: str,
    filename: str,
    max_bytes: int,
    max_pages: int,
    ocr: OcrConfig | None,
    budget: TextBudget,
) -> Extracted:
    if len(data) > max_bytes:
        raise TooLarge(
            f"{name} is {_megabytes(len(data), math.ceil)} MB, over the "
            f"{_megabytes(max_bytes, math.floor)} MB upload limit. Split it into smaller "
            "files, or ask an admin to raise KB_MAX_UPLOAD_BYTES.",
            filename=filename,
            limit=max_bytes,
        )
    if not data:
        raise EmptyDocument(
            f"{name} is empty (0 bytes). Upload it again; the transfer may have failed.",
            filename=filename,
        )
    suffix = _suffix(name)
    if _is_pdf(data):
        return _pdf(data, name, filename, max_pages, ocr or OcrConfig(), budget)
    if data.startswith(ZIP_MAGIC):
        return _office(data, name, filename, max_pages, budget.limit)
    if data.startswith(OLE_MAGIC):
        raise reject_ole(data, name, filename, suffix)
    _reject_known_binary(data, name, filename)
    if suffix == ".pdf":
        raise _not_a_pdf(data, name, filename)
    if suffix in _OFFICE_SUFFIXES:
        raise _not_office(data, name, filename)
    if b"\x00" in data and not data.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise _binary(name, filename, suffix, "it contains NUL bytes")
    text = _normalise_newlines(_decode(data, name, filename, suffix))
    if suffix in _CSV_SUFFIXES and not _HTML_START.match(text[:4096]):
        return csv_document(text, name, filename, suffix, _stem(name), budget.limit)
    if _HTML_START.match(text[:4096]) or suffix in _HTML_SUFFIXES:
        return _html(text, name, filename)
    if not text.strip():
        raise EmptyDocument(f"{name} contains no text, only whitespace.", filename=filename)
    if suffix in _MARKDOWN_SUFFIXES:
        return Extracted(text=text, title=_markdown_title(text) or _stem(name), kind="md")
    return Extracted(text=text, title=_stem(name), kind="txt")


# --- names and messages


def _display_name(filename: str) -> str:
    """The file's own name, without any folders a client sent along."""
    return PureWindowsPath(PurePosixPath(filename).name).name or "The file"


def _suffix(name: str) -> str:
    return PurePosixPath(name).suffix.lower()


def _stem(name: str) -> str:
    return _clean_title(PurePosixPath(name).stem) or name


def _megabytes(n: int, rounding: Callable[[float], int]) -> str:
    """``n`` bytes in MB with one decimal, rounded so that the comparison reads right."""
    tenths = rounding(n * 10 / _MB)
    return f"{tenths // 10}" if tenths % 10 == 0 else f"{tenths / 10:.1f}"


def _clean_title(raw: str) -> str:
    title = " ".join(raw.split())
    if len(title) > MAX_TITLE_CHARS:
        title = title[: MAX_TITLE_CHARS - 1].rstrip() + "…"
    return title


# --- type detection and decoding


def _is_pdf(data: bytes) -> bool:
    """Whether ``data`` is a PDF (complete or not) by its header."""
    if data.lstrip()[:5] == b"%PDF-":
        return True
    # Readers also accept a header after some junk within the first KB; only a
    # complete file is taken for a PDF then, so a text that merely mentions
    # "%PDF-" near its start stays text.
    return b"%PDF-" in data[:1024] and b"%%EOF" in data[-_PDF_EOF_WINDOW:]


def _reject_known_binary(data: bytes, name: str, filename: str) -> None:
    """Raise for images, archives and other recognised binary formats."""
    for magic, what in _MAGIC:
        if data.startswith(magic):
            raise UnsupportedType(
                f"{name} is {what}, which the knowledge base cannot read. "
                f"Supported: {SUPPORTED_TYPES}.",
                filename=filename,
            )


def _binary(name: str, filename: str, suffix: str, why: str) -> UnsupportedType | CorruptDocument:
    """The error for an unrecognised binary file: corrupt if its name claims text."""
    if suffix in _TEXT_SUFFIXES:
        return CorruptDocument(
            f"{name} looks like a binary file, not text ({why}). It may be damaged or "
            "renamed; upload the original document.",
            filename=filename,
        )
    return UnsupportedType(
        f"{name} looks like a binary file ({why}), which the knowledge base cannot read. "
        f"Supported: {SUPPORTED_TYPES}.",
        filename=filename,
    )


def _decode(data: bytes, name: str, filename: str, suffix: str) -> str:
    """Decode text: UTF-8 (BOM optional), UTF-16/32 with a BOM, else Windows-1252.

    Windows-1252 is accepted only when the bytes hold no valid UTF-8 sequences
    to speak of (a mostly-UTF-8 file with a few bad bytes would turn into
    mojibake) and decode to plausible text; anything else fails clearly.
    """
    for bom, codec in (
        (b"\xff\xfe\x00\x00", "utf-32"),
        (b"\x00\x00\xfe\xff", "utf-32"),
        (b"\xff\xfe", "utf-16"),
        (b"\xfe\xff", "utf-16"),
    ):
        if data.startswith(bom):
            try:
                text = data.decode(codec)
            except UnicodeDecodeError as exc:
                raise CorruptDocument(
                    f"{name} starts with a {codec.upper()} byte-order mark but is not valid "
                    f"{codec.upper()} ({exc.reason} at byte {exc.start}). Save it as UTF-8 "
                    "and upload it again.",
                    filename=filename,
                ) from exc
            if "\x00" in text:
                raise _binary(name, filename, suffix, "it contains NUL characters")
            return text
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        fallback = _cp1252(data)
        if fallback is not None:
            return fallback
        raise CorruptDocument(
            f"{name} is not valid UTF-8 text (undecodable byte 0x{data[exc.start]:02x} at "
            f"position {exc.start}) and does not look like Windows-1252 text either. "
            "Save it as UTF-8 and upload it again.",
            filename=filename,
        ) from exc


def _cp1252(data: bytes) -> str | None:
    """The Windows-1252 reading of ``data`` if it plausibly is such a file, else None."""
    # Deleting the ASCII range runs in C, unlike a loop over the bytes.
    non_ascii = len(data.translate(None, bytes(range(0x80))))
    utf8_bytes = sum(len(m) for m in _UTF8_MULTIBYTE.findall(data))
    if utf8_bytes * 2 >= non_ascii:
        return None  # mostly UTF-8 with some bad bytes: cp1252 would garble it
    try:
        text = data.decode("cp1252")
    except UnicodeDecodeError:
        return None
    if _CONTROL_CHARS.search(text) or non_ascii > _MAX_NON_ASCII_SHARE * len(data):
        return None
    return text


def _normalise_newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _not_a_pdf(data: bytes, name: str, filename: str) -> CorruptDocument:
    why = f"{name} is not a PDF: it does not start with the %PDF- header."
    return _mislabelled(data, name, filename, ("a PDF", "the PDF itself"), why)


def _mislabelled(
    data: bytes, name: str, filename: str, claimed: tuple[str, str], why: str
) -> CorruptDocument:
    """The error for a file that is not what its name says: ``claimed`` is (what, the original)."""
    head = data[:4096].decode("utf-8", errors="replace").removeprefix("\ufeff")
    if _HTML_START.match(head):
        return CorruptDocument(
            f"{name} is an HTML page, not {claimed[0]} (a login page saved instead of the "
            f"file?). Download {claimed[1]} and upload it again.",
            filename=filename,
        )
    return CorruptDocument(
        f"{why} It may be damaged or renamed; upload the original file.", filename=filename
    )


# --- Office and spreadsheets


def _office(
    data: bytes, name: str, filename: str, max_pages: int, max_text_chars: int
) -> Extracted:
    """A Word, PowerPoint or Excel file, checked as an untrusted ZIP package first."""
    package = open_package(data, name, filename)
    if package.kind == "docx":
        return docx_document(package, name, filename, _stem(name), max_text_chars)
    if package.kind == "pptx":
        return pptx_document(package, name, filename, _stem(name), max_pages, max_text_chars)
    return xlsx_document(package, name, filename, _stem(name), max_text_chars)


def _not_office(data: bytes, name: str, filename: str) -> CorruptDocument:
    why = f"{name} is not a Word, Excel or PowerPoint file: it is not a ZIP package as those are."
    return _mislabelled(data, name, filename, ("an Office file", "the document itself"), why)


# --- Markdown


def _markdown_title(text: str) -> str:
    """The first level-1 heading outside code fences, or ""."""
    headings, _ = markdown_structure(text)
    return next((h.title for h in headings if h.level == 1 and h.title), "")


# --- HTML

# Never visible as page text.
_DROPPED_TAGS = frozenset(
    {"script", "style", "noscript", "template", "head", "title", "svg", "iframe", "object", "embed"}
)
_BLOCK_TAGS = frozenset(
    {
        "address", "article", "aside", "blockquote", "body", "caption", "center", "dd",
        "details", "dialog", "dir", "div", "dl", "dt", "fieldset", "figcaption", "figure",
        "footer", "form", "header", "hgroup", "hr", "html", "legend", "li", "main", "menu",
        "nav", "ol", "p", "section", "summary", "table", "tbody", "tfoot", "thead", "tr", "ul",
    }
)  # fmt: skip
_HEADING_TAGS = {f"h{i}": i for i in range(1, 7)}
_LIST_TAGS = frozenset({"ul", "ol", "menu", "dir"})
_CELL_TAGS = frozenset({"td", "th"})
# A paragraph line that the chunker would take for a heading or a code fence.
_MARKDOWN_LOOKALIKE = re.compile(r"#{1,6}[ \t]|`{3}|~{3}")


def _html(text: str, name: str, filename: str) -> Extracted:
    try:
        soup = BeautifulSoup(text, "html.parser")
        title = _html_title(soup)
        body = _HtmlWriter().write(soup)
    except RecursionError as exc:
        raise CorruptDocument(
            f"{name} is HTML nested too deeply to read. Save it as PDF or plain text and "
            "upload that.",
            filename=filename,
        ) from exc
    except Exception as exc:  # bs4 / html.parser raise assorted errors on broken markup
        raise CorruptDocument(
            f"{name} is HTML that could not be parsed ({type(exc).__name__}: {exc}). "
            "Save it as PDF or plain text and upload that.",
            filename=filename,
        ) from exc
    if not body.strip():
        raise EmptyDocument(f"{name} is an HTML page with no visible text.", filename=filename)
    return Extracted(text=body, title=title or _stem(name), kind="html")


def _html_title(soup: BeautifulSoup) -> str:
    for tag_name in ("title", "h1"):
        tag = soup.find(tag_name)
        if isinstance(tag, Tag):
            title = _clean_title(tag.get_text(" "))
            if title:
                return title
    return ""


class _HtmlWriter:
    """Walks a parsed page without recursion and writes Markdown-like blocks.

    Inline text is buffered line by line (``<br>`` starts a line) and written
    out as one block when a block element opens or closes.
    """

    def __init__(self) -> None:
        self._blocks: list[str] = []
        self._lines: list[list[str]] = [[]]
        self._has_text = False
        self._line_has_text = False
        self._heading = 0  # level of the heading collecting text, 0 when none
        self._list_depth = 0
        self._item_prefix = ""

    def write(self, soup: BeautifulSoup) -> str:
        """Return the text of the page, blocks separated by blank lines."""
        # An explicit stack instead of recursion: 50,000 nested tags are fine.
        stack: list[tuple[PageElement, bool]] = [(soup, False)]
        while stack:
            node, closing = stack.pop()
            if closing:
                self._close(node)  # type: ignore[arg-type]
            elif isinstance(node, Tag):
                if self._open(node):
                    stack.append((node, True))
                    stack.extend((child, False) for child in reversed(node.contents))
            elif not isinstance(node, PreformattedString):  # comments, doctype, CDATA
                self._add_text(str(node))
        self._boundary()
        # A nested list item can be the page's first block; its indent means nothing there.
        return "\n\n".join(self._blocks).lstrip()

    def _open(self, tag: Tag) -> bool:
        """Handle an opening tag; return whether to walk into its children."""
        name = tag.name.lower()
        if name in _DROPPED_TAGS:
            return False
        if name == "pre":
            self._boundary()
            self._verbatim(tag.get_text())
            return False
        if name == "br":
            self._lines.append([])
            self._line_has_text = False
        elif name in _CELL_TAGS and self._line_has_text:
            self._add_text(" | ")
        elif name in _HEADING_TAGS:
            self._boundary()
            self._heading = _HEADING_TAGS[name]
        elif name in _BLOCK_TAGS:
            self._boundary()
            if name in _LIST_TAGS:
                self._list_depth += 1
            elif name == "li":
                self._item_prefix = "  " * max(0, self._list_depth - 1) + "- "
        return True

    def _close(self, tag: Tag) -> None:
        name = tag.name.lower()
        if name in _HEADING_TAGS and self._heading:
            self._write_heading()
        elif name in _HEADING_TAGS or name in _BLOCK_TAGS:
            self._boundary()
            if name in _LIST_TAGS:
                self._list_depth -= 1
            elif name == "li":
                self._item_prefix = ""  # an empty item must not mark the next block

    def _add_text(self, s: str) -> None:
        self._lines[-1].append(s)
        if not s.isspace():
            self._has_text = self._line_has_text = True

    def _boundary(self) -> None:
        """End the current block, if any.

        Inside a heading, blocks (``<h2><div>Title</div></h2>``) are part of
        it until it has text; a block after that ends a heading that broken
        markup left open, so the rest of the page does not become its title.
        """
        if not self._heading:
            self._write_paragraph()
        elif self._has_text:
            self._write_heading()

    def _take_lines(self) -> list[str]:
        lines = [" ".join("".join(parts).split()) for parts in self._lines]
        self._lines = [[]]
        self._has_text = self._line_has_text = False
        return lines

    def _write_heading(self) -> None:
        title = " ".join(line for line in self._take_lines() if line)
        if title:
            self._blocks.append("#" * self._heading + " " + title)
        self._heading = 0

    def _write_paragraph(self) -> None:
        body = _join_lines(self._take_lines())
        if body:
            self._blocks.append(self._item_prefix + body)
            self._item_prefix = ""

    def _verbatim(self, text: str) -> None:
        # HTML ignores one newline right after <pre>; trailing blank lines carry nothing.
        text = text.removeprefix("\n").rstrip()
        if not text.strip():
            return
        # A fence keeps "# comment" lines of code from being read as headings.
        longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
        fence = "`" * max(3, longest + 1)
        self._blocks.append(f"{fence}\n{text}\n{fence}")


def _join_lines(lines: list[str]) -> str:
    """Join ``<br>``-separated lines; two breaks in a row make a paragraph break."""
    out: list[str] = []
    for line in lines:
        if line:
            out.append("\\" + line if _MARKDOWN_LOOKALIKE.match(line) else line)
        elif out and out[-1]:
            out.append("")
    while out and not out[-1]:
        out.pop()
    return "\n".join(out)


# --- PDF


def _pdf(
    data: bytes, name: str, filename: str, max_pages: int, ocr: OcrConfig, budget: TextBudget
) -> Extracted:
    if data.rfind(b"%%EOF", max(0, len(data) - _PDF_EOF_WINDOW)) < 0:
        raise CorruptDocument(
            f"{name} is truncated (its end-of-file marker is missing); the download or "
            "upload was probably cut short. Upload the complete file again.",
            filename=filename,
        )
    pages, title = _pdf_pages(data, name, filename, max_pages, ocr, budget)
    starts: list[int] = []
    offset = 0
    for page in pages:
        starts.append(offset)
        offset += len(page) + 2  # the "\n\n" that joins pages
    text = "\n\n".join(pages)
    if not text.strip():
        raise EmptyDocument(
            f"{name} has no text layer, and OCR found no text in its page images (a blank "
            "scan, or text drawn as shapes). Upload a PDF with selectable text, or the "
            "original document.",
            filename=filename,
        )
    title = title or _clean_title(next(line for line in text.split("\n", 50) if line.strip()))
    return Extracted(text=text, title=title or _stem(name), kind="pdf", page_starts=tuple(starts))


def _pdf_pages(
    data: bytes, name: str, filename: str, max_pages: int, ocr: OcrConfig, budget: TextBudget
) -> tuple[list[str], str]:
    """Return each page's normalised text and the metadata title (or "").

    A page without a text layer is read by OCR from its images; its text then
    starts with the OCR marker line (``index.ingest.ocr``). A scanned page OCR could
    not read keeps its place as the line saying why; only a PDF none of whose
    pages has text fails for it.
    """
    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            _decrypt(reader, name, filename)
        _check_page_count(reader, name, filename, max_pages)
        pages = [_spent(_pdf_page_text(page.extract_text()), budget) for page in reader.pages]
        title = _pdf_metadata_title(reader)
        thin = [(i, reader.pages[i]) for i, text in enumerate(pages) if needs_ocr(text)]
        has_text = len(thin) < len(pages)
        read = read_pages(thin, ocr, name, filename, has_text=has_text) if thin else OcrPages()
    except (CorruptDocument, OverLimit, UnsupportedType):
        raise
    except Exception as exc:  # pypdf raises many types (PdfReadError, ValueError, KeyError...)
        raise CorruptDocument(
            f"{name} is a damaged PDF that could not be read ({type(exc).__name__}: "
            f"{str(exc)[:200]}). Export or download it again and upload the new copy.",
            filename=filename,
        ) from exc
    if read.failure is not None and not has_text and not any(read.texts.values()):
        raise read.failure  # no page of it has text: what kept OCR from reading it
    for i, text in read.texts.items():
        if text:
            # A thin text layer (a page number, a caption) is kept before what OCR read.
            pages[i] = f"{_typed(pages[i])}{ocr_marker(i + 1)}\n\n{text}"
    for i, why in read.unread.items():
        pages[i] = f"{_typed(pages[i])}{unread_marker(i + 1, why)}"
    if read.unread:
        # Indexed all the same: the log is where an operator learns that some
        # pages wait for OCR (and kb reindex reads them once it can).
        log.warning(
            "%s: %d scanned page(s) not read by OCR (%s); indexed without them",
            name,
            len(read.unread),
            next(iter(read.unread.values())),
        )
    return pages, title


def _spent(text: str, budget: TextBudget) -> str:
    """A page's text, counted as it is read (one page can draw the same text many times)."""
    budget.spend(len(text))
    return text


def _typed(page: str) -> str:
    """A scanned page's thin text layer, as the paragraph before its OCR marker ("" if none)."""
    return f"{page.strip()}\n\n" if page.strip() else ""


def _check_page_count(reader: PdfReader, name: str, filename: str, max_pages: int) -> None:
    """Count the pages, walking no more of the page tree than ``max_pages`` needs.

    A few bytes of page tree can list one page thousands of times, each then
    extracted, chunked and embedded again; pypdf's own bound is millions.
    A real tree has fewer inner nodes than pages, hence twice the limit.
    """
    try:
        with apply_configuration(page_tree_maximum_entries=2 * max_pages + 1):
            count = len(reader.pages)
    except LimitReachedError as exc:
        raise _too_many_pages(name, filename, max_pages, None) from exc
    if count > max_pages:
        raise _too_many_pages(name, filename, max_pages, count)
    if not count:
        raise CorruptDocument(f"{name} is a PDF with no pages.", filename=filename)


def _too_many_pages(name: str, filename: str, max_pages: int, count: int | None) -> OverLimit:
    pages = f"{count:,} pages" if count is not None else "more pages than that"
    return OverLimit(
        f"{name} is over the limit of {max_pages:,} pages per document (it has {pages}). "
        "Split it into smaller files, or ask an admin to raise KB_MAX_PAGES.",
        filename=filename,
        kind="pages",
        limit=max_pages,
    )


def _decrypt(reader: PdfReader, name: str, filename: str) -> None:
    """Open an encrypted PDF with the empty password, as viewers do, or fail clearly.

    PDFs that only restrict printing or copying have an owner password but an
    empty user password, so they are readable.
    """
    from pypdf.errors import DependencyError

    try:
        opened = reader.decrypt("")
    except DependencyError as exc:
        raise CorruptDocument(
            f"{name} is encrypted with AES, which this server cannot decrypt (the "
            "'cryptography' package is not installed). Upload an unencrypted copy, or ask "
            "an admin to install 'cryptography'.",
            filename=filename,
        ) from exc
    except Exception as exc:  # unsupported security handlers raise assorted errors
        raise CorruptDocument(
            f"{name} is encrypted in a way this server cannot open ({type(exc).__name__}: "
            f"{str(exc)[:200]}). Upload an unencrypted copy.",
            filename=filename,
        ) from exc
    if not opened:
        raise CorruptDocument(
            f"{name} is password-protected. Remove the password (for example by printing "
            "it to a new PDF) and upload it again.",
            filename=filename,
        )


def _pdf_page_text(raw: str) -> str:
    # Some fonts make pypdf emit NULs; they carry no text and upset viewers.
    return _normalise_newlines(raw).replace("\x00", "")


def _pdf_metadata_title(reader: PdfReader) -> str:
    try:
        raw = reader.metadata.title if reader.metadata else None
    except Exception:  # broken metadata must not sink a readable document
        return ""
    title = _clean_title(str(raw or ""))
    return "" if title.casefold() in {"untitled", "untitled document"} else title


__all__ = [
    "EXTRACTOR_VERSION",
    "FOLDER_SUFFIXES",
    "SUPPORTED_SUFFIXES",
    "SUPPORTED_TYPES",
    "extract",
]
