"""The one escaping core: what a model, a document or a person wrote, made safe to show in Slack.

Everything such a source wrote goes through :func:`escape` before the server
adds its own ``<url|label>`` links, so no text can ping ``<!channel>``, mention
``<@U123>`` or forge a link; link-like tokens Slack would make clickable by
itself are set in code (:func:`inert_links`). The server's links are made from
URLs it built itself (:func:`safe_url`). Texts are cut to Slack's limits here
(:func:`fit`, :func:`shorten`, :func:`split_mrkdwn`), never inside a link or an
entity, so that nothing is discovered too long at run time.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Protocol

from bot.slack.words import Words
from core.citations import citation_spans
from index.models import EVERYONE
from index.names import display_name

# Slack's 3000 characters of a section's text; the fallback ``text`` of a message
# is kept as short, so a notification never carries more than a section would.
SECTION_LIMIT = 3000
FALLBACK_LIMIT = 3000
# Slack's limits on plain-text labels: a button's text, a header's, a modal's title and buttons.
BUTTON_LIMIT = 75
HEADER_LIMIT = 150
MODAL_TITLE_LIMIT = 24

_ESCAPES = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        # Bidi embeddings, overrides and isolates make Slack show text other than what it
        # is ("pay \u202eexe.pdf" reads "pay fdp.exe"); the marks a language needs stay.
        **dict.fromkeys(map(chr, [*range(0x202A, 0x202F), *range(0x2066, 0x206A)])),
    }
)
_BOLD_RE = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*")
_HEADING_RE = re.compile(r"^#{1,6}[ \t]+(.+?)[ \t]*#*[ \t]*$", re.MULTILINE)
_SPACES_RE = re.compile(r"\s+")
# What Slack turns into a link by itself: URLs with a scheme, www. hosts,
# e-mail addresses and bare domain names.
_LINKABLE_RE = re.compile(
    r"\b(?:[a-z][a-z0-9+.-]*://|www\.|mailto:)[^\s<>`|]+"
    r"|\b[\w.+-]+@[\w-]+(?:\.[\w-]+)+"
    r"|\b(?:[a-z0-9-]+\.)+[a-z]{2,}\b(?:/[^\s<>`|]*)?",
    re.IGNORECASE,
)
_TRAILING_PUNCTUATION = ".,;:!?)]}'\"*_~"
# Streamed Markdown: a "]" right before "(", "[" or ":" would make a link; "@here" and
# the like notify; a backtick could close a code span around an inert link.
_LINK_BRACKET_RE = re.compile(r"\](?=[(\[:])")
_BROADCAST_RE = re.compile(r"@(?=(?:channel|here|everyone)\b)", re.IGNORECASE)
_WORD_JOINER = "\u2060"
_BACKTICK_LOOKALIKE = "\u02cb"
# Code as Slack pairs its backticks: a block between triple backticks, else a span on one line.
_CODE_RE = re.compile(r"```.+?```|`[^`\n]+`", re.DOTALL)
_USER_ID_RE = re.compile(r"[UW][A-Z0-9]{2,}")
_CHANNEL_ID_RE = re.compile(r"[CG][A-Z0-9]{2,}")


# ---------------------------------------------------------------- escaping


def escape(text: str) -> str:
    """Escape ``&``, ``<`` and ``>`` (and drop bidi overrides) so Slack shows ``text`` literally.

    After this no mention (``<@U1>``, ``<!channel>``), link or date token can
    be formed from ``text``.
    """
    return text.translate(_ESCAPES)


def safe_url(url: str) -> str:
    """A URL the server built, as the target of a ``<url|label>`` link: one token whatever it holds."""
    # Our URLs never contain these, but a link must stay one token whatever happens.
    return escape(url).replace("|", "%7C")


def linked(url: str, text: str) -> str:
    """``<url|text>``, or ``text`` alone when there is no URL (a link that could not be signed)."""
    return f"<{safe_url(url)}|{text}>" if url else text


def inert_links(text: str, verbatim: str = "") -> str:
    """``text`` with every link-like token Slack would make clickable set in code, so it is not.

    An answer's only links are the server's citation links; a URL the model
    wrote (from a poisoned document, a prompt injection or a guess) is shown
    as text. A token that occurs verbatim in ``verbatim`` (the cited passages)
    is left as it is: the passage itself vouches for it.
    """

    def inert(m: re.Match[str]) -> str:
        token = m.group(0).rstrip(_TRAILING_PUNCTUATION)
        rest = m.group(0)[len(token) :]
        if not token or token in verbatim:
            return m.group(0)
        return "`" + token.replace("`", "'") + "`" + rest

    # Code the text already holds stays as it is (nothing in it links). Outside it, a
    # backtick left unpaired would pair with the code a link is set in, leaving the
    # link outside: it becomes a look-alike.
    out, pos = [], 0
    for code in _CODE_RE.finditer(text):
        plain = text[pos : code.start()].replace("`", _BACKTICK_LOOKALIKE)
        out += [_LINKABLE_RE.sub(inert, plain), code.group(0)]
        pos = code.end()
    out.append(_LINKABLE_RE.sub(inert, text[pos:].replace("`", _BACKTICK_LOOKALIKE)))
    return "".join(out)


def from_markdown(text: str) -> str:
    """Turn the Markdown models write into Slack mrkdwn (bold and headings)."""
    text = _HEADING_RE.sub(r"*\1*", text)
    return _BOLD_RE.sub(r"*\1*", text)


def stream_markdown(text: str) -> str:
    """The answer so far as the standard Markdown ``chat.startStream`` / ``appendStream`` take.

    Streamed text is Markdown, not mrkdwn, and has no ``verbatim``: Slack would
    turn ``[text](url)``, bare URLs and mentions in it into links and pings. So
    ``&``, ``<`` and ``>`` are escaped (no ``<!channel>``, ``<@U1>``,
    ``<url|text>``, autolink or HTML), a ``]`` never opens a Markdown link
    (``[text](url)``, ``[text][ref]``, ``[ref]: url``), ``@here``-style words get
    an invisible word joiner, and every link-like token is set in code
    (:func:`inert_links`), after the model's own backticks became a look-alike so
    that no code span it opened can leave such a token outside code. Citation
    numbers stay a plain ``[n]``: they become links in the final answer only.

    Each token is rewritten on its own: the Markdown of a text cut before a
    word begins the Markdown of any longer text, so what was streamed never
    has to be taken back.
    """
    text = inert_links(text.replace("`", _BACKTICK_LOOKALIKE))
    text = _LINK_BRACKET_RE.sub("]" + _WORD_JOINER, text)
    return escape(_BROADCAST_RE.sub("@" + _WORD_JOINER, text))


def label(text: str) -> str:
    """A document's name, title or section as shown: one line, escaped, no link of its own."""
    return escape(inert_links(display_name(text)))


def code(text: str) -> str:
    """``text`` as inline code, escaped: shown as written, links and mentions inert."""
    return "`" + escape(text.replace("`", "'")) + "`"


# ---------------------------------------------------------------- fitting


def fit(raw: str, limit: int) -> str:
    """Escape ``raw`` and cut it (with an ellipsis) so the result has at most ``limit`` characters.

    Returns "" when no visible text would remain, so the caller can say something instead.
    """
    out = escape(raw)
    if len(out) <= limit:
        return out
    cut = raw
    while cut and len(escape(cut)) > limit - 1:
        # A character escapes to up to five ("<" is "&lt;"): shrink in proportion, not by
        # the excess, which would cut a text of "<" to nothing.
        cut = cut[: min(len(cut) - 1, len(cut) * (limit - 1) // len(escape(cut)))]
    cut = cut.rstrip()
    return escape(cut) + "…" if cut else ""


def shorten(text: str, limit: int) -> str:
    """Collapse whitespace and cut at a word boundary to at most ``limit`` characters."""
    flat = _SPACES_RE.sub(" ", text).strip()
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    space = cut.rfind(" ")
    if space > limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:.") + "…"


def quote(text: str, limit: int) -> str:
    """``text`` shortened at a word to ``limit``, escaped, and still within ``limit`` once escaped."""
    return fit(shorten(text, limit), limit)


# ---------------------------------------------------------------- splitting


def split_mrkdwn(text: str, limit: int = SECTION_LIMIT) -> list[str]:
    """Split mrkdwn into pieces of at most ``limit`` characters.

    Cuts prefer a paragraph break, then a line break, then a space, and never
    fall inside a ``<...>`` link or an ``&...;`` entity.
    """
    pieces: list[str] = []
    rest = text.strip()
    while len(rest) > limit:
        cut = _cut_point(rest, limit)
        pieces.append(rest[:cut].rstrip())
        rest = rest[cut:].lstrip()
    if rest:
        pieces.append(rest)
    return pieces


def _cut_point(text: str, limit: int) -> int:
    window = text[:limit]
    for sep in ("\n\n", "\n", " "):
        at = window.rfind(sep)
        if at > limit // 4:
            cut = _outside_tokens(text, at + len(sep))
            if cut > 0:
                return cut
    cut = _outside_tokens(text, limit)
    return cut if cut > 0 else limit


def _outside_tokens(text: str, cut: int) -> int:
    """Move ``cut`` back so it is not inside a ``<...>`` link or an ``&...;`` entity."""
    opening = text.rfind("<", 0, cut)
    if opening != -1 and text.rfind(">", opening, cut) == -1:
        cut = opening
    amp = text.rfind("&", max(0, cut - 5), cut)
    if amp != -1 and ";" not in text[amp:cut]:
        cut = amp
    return cut


# ---------------------------------------------------------------- citations


class Cited(Protocol):
    """A source an answer cites: a passage of the knowledge base, or a Slack message found as the asker."""

    @property
    def n(self) -> int:
        """The number the answer cites it by."""
        ...

    @property
    def url(self) -> str:
        """The link a citation of it opens (empty: none)."""
        ...

    @property
    def quote(self) -> str:
        """Its text."""
        ...


def link_citations(text: str, sources: Sequence[Cited]) -> str:
    """Escape an answer and turn each citation group into links to its passages.

    Args:
        text: the resolved answer, citing sources ``1..len(sources)``.
        sources: the cited sources; ``sources[i].n`` is the number the text uses.

    Returns:
        mrkdwn where ``[1, 2]`` became ``<url1|[1]><url2|[2]>``; every other
        character is escaped and other link-like text set in code (see
        :func:`inert_links`), so only the server's links are links.
    """
    by_number = {s.n: s for s in sources}
    cited = cited_text(sources)
    out: list[str] = []
    pos = 0
    for start, end, numbers in citation_spans(text, len(sources)):
        links = [linked(by_number[n].url, f"[{n}]") for n in numbers if n in by_number]
        out.append(escape(inert_links(text[pos:start], cited)))
        out.append("".join(links) if links else escape(text[start:end]))
        pos = end
    out.append(escape(inert_links(text[pos:], cited)))
    return "".join(out)


def cited_text(sources: Sequence[Cited]) -> str:
    """The cited passages' quotes: a link-like token found in them is the passage's, not the model's."""
    return "\n".join(s.quote for s in sources)


# ---------------------------------------------------------------- people and channels


def is_user_id(text: str) -> bool:
    """Whether ``text`` is a Slack user id (not ``cli`` or another operator's name)."""
    return _USER_ID_RE.fullmatch(text) is not None


def mention(user_id: str) -> str:
    """``<@U123>`` for a Slack user id; anything else (``cli``) as inert code."""
    return f"<@{user_id}>" if is_user_id(user_id) else code(user_id)


def scope_label(scope: str, words: Words) -> str:
    """Who may see a document: "everyone" or the channel (a channel link notifies nobody)."""
    if scope == EVERYONE:
        return words.EVERYONE_LABEL
    return f"<#{scope}>" if _CHANNEL_ID_RE.fullmatch(scope) else code(scope)


def unnamed_document(scope: str, doc_id: int, words: Words) -> str:
    """A document named only by its scope and id, for someone the access rule does not let
    read it (its name, too, is the document's)."""
    return words.home_channel_document(scope_label(scope, words), doc_id)
