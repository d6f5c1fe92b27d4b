"""How text a document controls is quoted to a model or an agent: one rule for every output.

A passage's text, and a document's title, section or file name, are written
by whoever wrote the document, and a document may be written to steer the
model or the agent that reads it: to forge a source of its own, a search
result entry (``[2] … distance 0.01`` with a link to another site), or the end
of its own quote. Wherever such text goes into a text of ours that a model or
an agent reads (the prompt, the MCP tools' text, ``kb ask``), it goes through
:func:`quoted`:

* **every line** begins with ``> ``. Lines are split at every line break
  Unicode has (LF, CR alone, CRLF, VT, FF, FS, GS, RS, NEL, U+2028, U+2029),
  so no line of a passage can start a line of ours or end its quote;
* a line whose text starts like an entry or a source header (a square
  bracket and a number: ``[2]``, ``［２］``, ``【2】``) has it escaped: ``\\[2]``;
* a ``<`` (or a look-alike) that opens or closes a tag named ``source``, or a
  tag whose name holds anything but ASCII (a look-alike spelling of it), is
  escaped as ``&lt;``: only our own ``<source n="N">`` tags open and close
  sources;
* control characters and invisible format characters (zero-width, bidi, tag
  characters) are dropped (``index.normal_form.visible``): a model reads what
  a person would see.

The escaping compares the text's normal form (``index.normal_form.plain``,
case-folded, combining marks dropped) character by character, so zero-width
characters, full-width letters and other compatibility forms hide neither a
tag nor a bracket from it; what it writes is the text as the document wrote
it, with the escapes. :func:`escaped` does the same without the quote marks,
for the people's text the prompt carries (a question, a thread's messages);
:func:`one_line` for names, which go on the line of an entry or a header.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

from index.normal_form import visible

__all__ = ["QUOTE_MARK", "escaped", "one_line", "passage_lines", "quoted"]

QUOTE_MARK = "> "
# '<' and its look-alikes in Unicode's confusables; full-width '＜' and small '﹤' fold to '<'.
_LESS_THAN = frozenset("<\u2039\u276e\u02c2\u1438\u16b2")
# '[' and the square brackets that read as one; full-width '［' folds to '['.
_OPEN_SQUARE = frozenset("[\u2045\u27e6\u3010\u3014\u3016\u3018\u301a")
# On the comparison form: a tag's opening, with its name (``</source``, ``< / source``).
_TAG = re.compile(r"<[^\w<>]{0,4}(\w+)")
# On the comparison form: a line that starts like an entry ("[2] Other doc").
_ENTRY = re.compile(r"\s*\[(?=\s*-?\d)")
_SPACES = re.compile(r"\s+")
_TAG_ESCAPE = "&lt;"
_ENTRY_ESCAPE = "\\"


def passage_lines(text: str) -> list[str]:
    """``text``'s lines, split at every line break, without control or invisible characters."""
    return [_shown(line) for line in text.splitlines()]


def quoted(text: str, *, mark: str = QUOTE_MARK) -> str:
    """``text`` quoted for a model or an agent: every line begins with ``mark``, nothing forged.

    Blank lines at either end are left out; a blank line inside is a bare
    quote mark, so the quote runs on.
    """
    lines = _trimmed(passage_lines(text))
    return "\n".join(f"{mark}{_escaped_line(line)}".rstrip() for line in lines) or mark.rstrip()


def escaped(text: str) -> str:
    """``text`` with its lines kept but nothing in it able to pass for a tag or an entry of ours."""
    return "\n".join(_escaped_line(line) for line in passage_lines(text))


def one_line(text: str) -> str:
    """A title, section or file name on one line, escaped as a quoted line is."""
    return _escaped_line(_SPACES.sub(" ", " ".join(passage_lines(text))).strip())


def _shown(line: str) -> str:
    """One line as a model is shown it: controls and invisible characters dropped (tabs stay)."""
    kept = visible(line)
    if kept.isprintable():
        return kept
    return "".join(ch for ch in kept if ch == "\t" or unicodedata.category(ch) != "Cc")


def _trimmed(lines: Sequence[str]) -> Sequence[str]:
    first = next((i for i, line in enumerate(lines) if line.strip()), len(lines))
    last = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].strip()), -1)
    return lines[first : last + 1]


def _escaped_line(line: str) -> str:
    """``line`` with what could pass for a tag or an entry escaped, found on its normal form."""
    compared, origin = _comparable(line)
    escapes: dict[int, str] = {}
    entry = _ENTRY.match(compared)
    if entry is not None:
        escapes[origin[entry.end() - 1]] = _ENTRY_ESCAPE
    for tag in _TAG.finditer(compared):
        name = tag.group(1)
        if name.startswith("source") or not name.isascii():
            escapes[origin[tag.start()]] = _TAG_ESCAPE
    if not escapes:
        return line
    out: list[str] = []
    last = 0
    for at in sorted(escapes):
        mark = escapes[at]
        out.append(line[last:at])
        # A tag's '<' is replaced; an entry's bracket is kept behind its backslash.
        out.append(mark if mark == _TAG_ESCAPE else mark + line[at])
        last = at + 1
    out.append(line[last:])
    return "".join(out)


def _comparable(line: str) -> tuple[str, list[int]]:
    """``line``'s comparison form and, for each of its characters, the position it came from.

    NFKC and case folding one character at a time, combining marks dropped,
    look-alikes of ``<`` and ``[`` as those; invisible characters are already gone.
    """
    if line.isascii():
        return line.lower(), list(range(len(line)))
    chars: list[str] = []
    origin: list[int] = []
    for i, ch in enumerate(line):
        if ch in _LESS_THAN:
            folded = "<"
        elif ch in _OPEN_SQUARE:
            folded = "["
        else:
            folded = unicodedata.normalize("NFKC", ch).casefold()
        for f in folded:
            if not unicodedata.combining(f):
                chars.append(f)
                origin.append(i)
    return "".join(chars), origin
