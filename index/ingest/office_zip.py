"""Office files as untrusted ZIP packages: which format, within what limits.

Word, PowerPoint and Excel files (Office Open XML) are ZIP archives of XML
parts. The readers (python-docx, python-pptx, openpyxl) inflate whatever the
archive holds, so a few kilobytes can ask for gigabytes (a zip bomb). Before any
reader sees a package it is checked here:

* the central directory: at most ``MAX_MEMBERS`` parts, at most
  ``max_unzipped`` bytes declared in all, no part inflating more than
  ``MAX_RATIO`` times its compressed size (once it is over ``RATIO_FLOOR``);
* the actual reads: every part is inflated with a cap of its declared size
  (``zipfile`` stops there and checks the CRC, so a part that lies about its
  size fails) and copied, uncompressed, into the package the reader gets.

A sheet or slide part listed twice is refused by its reader (``aliased_part``).

Macro-enabled and template variants (``.docm``, ``.xlsm``, ``.pptm``, ``.dotx``
...) are read as their plain counterparts: their VBA project is dropped unread
and the main part's content type renamed, so nothing in them can run.

An OLE compound file (the legacy binary formats) is either an encrypted modern
file (Office wraps a password-protected package in one, as an
``EncryptedPackage`` stream) or a ``.doc``/``.xls``/``.ppt``; neither is read.
"""

from __future__ import annotations

import io
import re
import zipfile
from dataclasses import dataclass

from index.errors import CorruptDocument, UnsupportedType

ZIP_MAGIC = b"PK\x03\x04"
OLE_MAGIC = b"\xd0\xcf\x11\xe0\xa1\xb1\x1a\xe1"

# A 20 MB upload of real Office XML inflates to a few hundred MB at most in
# theory, but real documents under the upload limit stay well below 100 MB.
DEFAULT_MAX_UNZIPPED_BYTES = 100 * 1024 * 1024
MAX_MEMBERS = 10_000
# Repetitive spreadsheet XML compresses about 30:1; 200:1 is a bomb, not a sheet.
MAX_RATIO = 200
RATIO_FLOOR = 1024 * 1024
_READ_BLOCK = 1024 * 1024

# The part that says which format a package is.
_MAIN_PARTS = {
    "word/document.xml": "docx",
    "ppt/presentation.xml": "pptx",
    "xl/workbook.xml": "xlsx",
}
# Content types of the main part the readers refuse, mapped to the ones they read.
_CONTENT_TYPE_RENAMES = (
    # .docm's main part is document.macroEnabled, .dotm's template.macroEnabledTemplate.
    (rb"application/vnd\.ms-word\.(?:document|template)\.macroEnabled(?:Template)?\.main\+xml",
     b"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"),
    (rb"application/vnd\.openxmlformats-officedocument\.wordprocessingml\.template\.main\+xml",
     b"application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"),
    (rb"application/vnd\.ms-powerpoint\.(?:template|slideshow)\.macroEnabled\.main\+xml",
     b"application/vnd.ms-powerpoint.presentation.macroEnabled.main+xml"),
    (rb"application/vnd\.openxmlformats-officedocument\.presentationml\.(?:template|slideshow)\.main\+xml",
     b"application/vnd.openxmlformats-officedocument.presentationml.presentation.main+xml"),
    (rb"application/vnd\.ms-excel\.(?:sheet|template)\.macroEnabled\.main\+xml",
     b"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"),
    (rb"application/vnd\.openxmlformats-officedocument\.spreadsheetml\.template\.main\+xml",
     b"application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"),
)  # fmt: skip
_FORMAT_NAMES = {"docx": "Word", "pptx": "PowerPoint", "xlsx": "Excel"}
_LEGACY = {".doc": ".docx", ".dot": ".docx", ".xls": ".xlsx", ".xlt": ".xlsx",
           ".ppt": ".pptx", ".pps": ".pptx", ".pot": ".pptx"}  # fmt: skip
LEGACY_SUFFIXES: tuple[str, ...] = tuple(_LEGACY)
# The Office Open XML names, each with the plain format to save a legacy file as.
_MODERN = {".docx": ".docx", ".docm": ".docx", ".dotx": ".docx", ".dotm": ".docx",
           ".xlsx": ".xlsx", ".xlsm": ".xlsx", ".xltx": ".xlsx", ".xltm": ".xlsx",
           ".pptx": ".pptx", ".pptm": ".pptx", ".potx": ".pptx", ".potm": ".pptx",
           ".ppsx": ".pptx", ".ppsm": ".pptx"}  # fmt: skip
# Every Office Open XML name the knowledge base reads (macro-enabled and templates included).
OFFICE_SUFFIXES: tuple[str, ...] = tuple(_MODERN)
# The stream that holds a legacy file's main content: (name, what it is, its suffix, save as).
_LEGACY_STREAMS = (
    ("WordDocument", "Word 97-2003 document", ".doc", ".docx"),
    ("PowerPoint Document", "PowerPoint 97-2003 presentation", ".ppt", ".pptx"),
    ("Workbook", "Excel 97-2003 workbook", ".xls", ".xlsx"),
    ("Book", "Excel 5.0/95 workbook", ".xls", ".xlsx"),
)
# Office stores a password-protected file as an OLE directory entry of this name.
_ENCRYPTED_PACKAGE = "EncryptedPackage".encode("utf-16-le") + b"\x00\x00"


@dataclass(frozen=True)
class Package:
    """A checked Office package: its format and a copy safe to hand to its reader.

    Attributes:
        kind: ``docx``, ``pptx`` or ``xlsx``.
        data: the package re-written uncompressed, every part within its limits.
        macros_dropped: the original held a VBA project (never read, not copied).
    """

    kind: str
    data: bytes
    macros_dropped: bool = False


def format_name(kind: str) -> str:
    """The product name of a package kind ("Word" for ``docx``)."""
    return _FORMAT_NAMES[kind]


def open_package(
    data: bytes, name: str, filename: str, *, max_unzipped: int = DEFAULT_MAX_UNZIPPED_BYTES
) -> Package:
    """Check an Office package and return a copy its reader may open.

    Raises:
        CorruptDocument: a damaged archive, or one over a limit (zip bomb).
        UnsupportedType: a ZIP archive that is no Word, PowerPoint or Excel file.
    """
    try:
        archive = zipfile.ZipFile(io.BytesIO(data))
        members = archive.infolist()
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError) as exc:
        raise CorruptDocument(
            f"{name} is a damaged ZIP archive ({exc}); Word, Excel and PowerPoint files are "
            "ZIP archives, and this one is truncated or corrupt. Save or download it again "
            "and upload the new copy.",
            filename=filename,
        ) from exc
    kind = _kind(archive, name, filename)
    _check_directory(members, name, filename, max_unzipped)
    out = io.BytesIO()
    macros = False
    with archive, zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as copy:
        for info in members:
            if info.is_dir():
                continue
            if info.filename.lower().endswith("vbaproject.bin"):
                macros = True
                continue
            body = _read_capped(archive, info, name, filename)
            if info.filename == "[Content_Types].xml":
                body = _plain_content_types(body)
            copy.writestr(info.filename, body)
    return Package(kind=kind, data=out.getvalue(), macros_dropped=macros)


def reject_ole(
    data: bytes, name: str, filename: str, suffix: str
) -> UnsupportedType | CorruptDocument:
    """The error for an OLE compound file: password-protected, or a legacy format.

    A legacy file under a modern name (``.doc`` renamed ``.docx``) is named as
    what it is: renaming never converts it.
    """
    head = data[: 64 * 1024 * 1024]
    if _ENCRYPTED_PACKAGE in head:
        return CorruptDocument(
            f"{name} is password-protected (encrypted by Office), so its text cannot be read. "
            "Remove the password (File > Info > Protect > Encrypt with Password, clear it) "
            "and upload it again.",
            filename=filename,
        )
    if suffix in _LEGACY:
        return UnsupportedType(
            f"{name} is a legacy Microsoft Office file ({suffix} format), which the "
            f"knowledge base cannot read. Open it in Office and save it as {_LEGACY[suffix]}, "
            "then upload that.",
            filename=filename,
        )
    found = next(
        (s for s in _LEGACY_STREAMS if s[0].encode("utf-16-le") + b"\x00\x00" in head), None
    )
    what = f"a legacy {found[1]} ({found[2]})" if found else "a legacy Microsoft Office file"
    save_as = found[3] if found else _MODERN.get(suffix, ".docx, .xlsx or .pptx")
    renamed = f" renamed to {suffix} (renaming does not convert it)" if suffix in _MODERN else ""
    return UnsupportedType(
        f"{name} is {what}{renamed}, a format the knowledge base cannot read. Open it in "
        f"Office and save it as {save_as}, then upload that.",
        filename=filename,
    )


def _kind(archive: zipfile.ZipFile, name: str, filename: str) -> str:
    names = set(archive.namelist())
    for part, kind in _MAIN_PARTS.items():
        if part in names:
            return kind
    if "mimetype" in names and "content.xml" in names:
        raise UnsupportedType(
            f"{name} is an OpenDocument file (LibreOffice), which the knowledge base cannot "
            "read. Save it as .docx, .xlsx or .pptx and upload that.",
            filename=filename,
        )
    raise UnsupportedType(
        f"{name} is a ZIP archive but not a Word, Excel or PowerPoint file. Upload the "
        "documents inside it one by one.",
        filename=filename,
    )


def _check_directory(
    members: list[zipfile.ZipInfo], name: str, filename: str, max_unzipped: int
) -> None:
    if len(members) > MAX_MEMBERS:
        raise _bomb(name, filename, f"it has {len(members):,} parts")
    total = sum(info.file_size for info in members)
    if total > max_unzipped:
        raise _bomb(name, filename, f"it would expand to {total:,} bytes, over {max_unzipped:,}")
    for info in members:
        if info.file_size > RATIO_FLOOR and info.file_size > MAX_RATIO * max(1, info.compress_size):
            raise _bomb(
                name,
                filename,
                f"its part {info.filename[:100]!r} expands {info.file_size // max(1, info.compress_size):,} "
                "times its compressed size",
            )


def _read_capped(
    archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str, filename: str
) -> bytes:
    """A part's bytes, never more than the directory declared for it."""
    parts: list[bytes] = []
    got = 0
    try:
        with archive.open(info) as stream:
            while block := stream.read(_READ_BLOCK):
                got += len(block)
                if got > info.file_size:
                    raise _bomb(
                        name, filename, f"its part {info.filename[:100]!r} is larger than declared"
                    )
                parts.append(block)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        raise CorruptDocument(
            f"{name} is damaged: its part {info.filename[:100]!r} cannot be read ({exc}). "
            "Save or download it again and upload the new copy.",
            filename=filename,
        ) from exc
    return b"".join(parts)


def _plain_content_types(body: bytes) -> bytes:
    for pattern, plain in _CONTENT_TYPE_RENAMES:
        body = re.sub(pattern, plain, body)
    return body


def aliased_part(
    name: str, filename: str, product: str, what: str, part: str, times: int
) -> CorruptDocument:
    """The error for a package that lists one sheet or slide part ``times`` times.

    Office saves every sheet and slide as a part of its own; a package listing
    one twice was made by hand or damaged, and each listing would be read and
    indexed again (one part listed 300 times is 300 copies of its text).
    """
    return CorruptDocument(
        f"{name} is refused: it lists {_which_part(what, part)} {times:,} times, and "
        f"{product} saves every {what} as a part of its own, so the file was damaged or made "
        f"to repeat one {what}'s text. Open it in {product}, save it again and upload the new copy.",
        filename=filename,
    )


def _which_part(what: str, part: str) -> str:
    return f"its {what} part {part[:100]!r}" if part else f"one {what} part"


def _bomb(name: str, filename: str, why: str) -> CorruptDocument:
    return CorruptDocument(
        f"{name} is refused as a possible zip bomb: {why}. Real documents expand far less; "
        "save it again from Office (or split it) and upload the new copy.",
        filename=filename,
    )


__all__ = [
    "DEFAULT_MAX_UNZIPPED_BYTES",
    "LEGACY_SUFFIXES",
    "OFFICE_SUFFIXES",
    "OLE_MAGIC",
    "ZIP_MAGIC",
    "Package",
    "aliased_part",
    "format_name",
    "open_package",
    "reject_ole",
]
