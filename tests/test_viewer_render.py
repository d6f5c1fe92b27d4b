"""The viewer shows documents formatted while every ``#char`` range keeps its exact place.

``bot.server.render`` writes headings, lists, code and tables of Markdown, HTML
and Office documents as such; the text it shows is spans of the canonical text
at their offsets. Checked here on the rendered HTML (structure, no raw marks,
escaping, the span contract for random documents), on the real server (the
canonical text download) and in headless Chromium: the highlight of random
ranges is exactly the shown part of ``canonical[a:b]``, centred, and drawn where
its rectangle says (pixels of a screenshot).
"""

from __future__ import annotations

import asyncio
import functools
import html
import json
import logging
import random
import re
import threading
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from PIL import Image

# As tests/adversarial/test_viewer_access.py does: whichever module imports it first.
pytest.register_assert_rewrite("tests.conftest_bot", "tests.signin")

from bot.server.render import (  # noqa: E402
    MAX_FORMATTED_CHARS,
    MAX_FORMATTING_WORK,
    Formatter,
    formatting_work,
    render_document,
)
from bot.server.routes import FORMATTER, fill_viewer  # noqa: E402
from bot.slack.people.signin import LOGIN_PATH  # noqa: E402
from index.ingest.extract import extract  # noqa: E402
from tests.browser import Browser, requires_chromium  # noqa: E402
from tests.conftest_bot import PUBLIC_URL, Bot, BotFactory  # noqa: E402
from tests.servers import CHANNEL_ID, USER_ID  # noqa: E402
from tests.signin import SIGN_IN, link, sign_in  # noqa: E402
from tests.steps import assert_linear, steps  # noqa: E402
from tests.test_office import onboarding_pptx, policy_docx, rota_xlsx  # noqa: E402

HOSTILE_HEADING = "Tricks <img src=x onerror=\"document.body.dataset.pwned='img'\">"
HOSTILE_LINE = "Never run: <script>document.body.dataset.pwned = 'script'</script> & stay text."
PASSAGE = "Parental leave is 20 weeks \U0001f389 at full pay for every parent."
FILLER = "\n\n".join(
    f"## Chapter {i}\n\nPolicies that nobody cites, written at length so the page is long. "
    f"Paragraph {i} goes on and on about the rules of chapter {i}."
    for i in range(40)
)
HANDBOOK = f"""# Employee handbook

Welcome. This is **the** handbook.

{FILLER}

## Parental leave

{PASSAGE}
Ask HR three months ahead.

- Full pay for the first 20 weeks
- Half pay after that
  - nested detail

1. Tell your manager
2. Fill in the form

| Country | Weeks |
|---|---:|
| Norway | 49 |
| Denmark | 52 |

```python
# a comment in code, not a heading
leave = {{"weeks": 20}}
```

> A quote from the HR lead.

## {HOSTILE_HEADING}

{HOSTILE_LINE}

[handbook]: https://example.invalid/handbook
"""
PAGE_HTML = (
    "<html><head><title>Travel</title><script>alert(1)</script></head><body>"
    "<h1>Travel guide</h1><p>Book early.<br>Pay by card.</p>"
    "<h2>Checklist</h2><ul><li>Passport</li><li>Tickets<ul><li>Return leg</li></ul></li></ul>"
    "<ol><li>Pack</li><li>Go</li></ol>"
    "<pre>fare = base + tax\n\n# not a heading</pre>"
    "<table><tr><th>City</th><th>Allowance</th></tr><tr><td>Oslo</td><td>95 EUR</td></tr></table>"
    "<p>&lt;script&gt;alert('inert')&lt;/script&gt; stays text.</p>"
    "<p>## not a heading either</p>"
    "</body></html>"
)
# Characters the renderer may leave unshown: block syntax and the whitespace between blocks.
SYNTAX = set("#-*+>|`~=_.):\\0123456789 \t\n\r")


class _Spans(HTMLParser):
    """The (start, end, text) of every ``<span data-start data-end>`` and the tags around them."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.spans: list[tuple[int, int, str]] = []
        self.tags: list[str] = []
        self._open: list[int] | None = None
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append(tag)
        values = dict(attrs)
        if tag == "span" and "data-start" in values:
            self._open = [int(values["data-start"] or ""), int(values["data-end"] or "")]
            self._text = []

    def handle_endtag(self, tag: str) -> None:
        if tag == "span" and self._open is not None:
            self.spans.append((self._open[0], self._open[1], "".join(self._text)))
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self._text.append(data)
        elif data.strip():
            raise AssertionError(f"document text outside a span: {data!r}")


def parsed(text: str, kind: str) -> _Spans:
    """The rendered HTML of ``text``, parsed."""
    parser = _Spans()
    parser.feed(render_document(text, kind).html)
    parser.close()
    return parser


@functools.lru_cache(maxsize=8)
def _spans(text: str, kind: str) -> tuple[tuple[int, int, str], ...]:
    """``parsed(text, kind).spans``, rendered once for the many ranges a test checks of one
    document (rendering it again for each was most of such a test's time)."""
    return tuple(parsed(text, kind).spans)


def shown(text: str, kind: str, a: int, b: int) -> str:
    """``text[a:b]`` without the characters the viewer does not show (its syntax marks)."""
    return "".join(text[max(a, s) : min(b, e)] for s, e, _ in _spans(text, kind) if s < b and e > a)


def assert_span_contract(text: str, kind: str) -> _Spans:
    """Each span holds exactly its range, in order, and only syntax and whitespace are unshown."""
    result = parsed(text, kind)
    position = 0
    unshown = []
    for start, end, body in result.spans:
        assert position <= start < end <= len(text)
        assert body == text[start:end]
        unshown.append(text[position:start])
        position = end
    unshown.append(text[position:])
    assert set("".join(unshown)) <= SYNTAX, "".join(unshown)
    return result


def visible_lines(result: _Spans) -> list[str]:
    return [line for _, _, body in result.spans for line in body.split("\n")]


# ---------------------------------------------------------------- structure


def test_markdown_headings_lists_code_and_tables_are_elements() -> None:
    result = assert_span_contract(HANDBOOK, "md")
    tags = set(result.tags)
    assert {"h1", "h2", "ul", "ol", "li", "pre", "code", "table", "th", "td", "blockquote"} <= tags
    assert result.tags.count("h2") == 42 and result.tags.count("li") == 5
    bodies = [body for _, _, body in result.spans]
    assert "Employee handbook" in bodies and "Parental leave" in bodies and "Norway" in bodies
    # Marks are not shown: no heading hash, no bullet, no pipe, no fence line; but a
    # "#" line inside a code block is code, and shown as written.
    lines = visible_lines(result)
    assert [line for line in lines if re.match(r"#{1,6} ", line)] == [
        "# a comment in code, not a heading"
    ]
    assert not any(line.startswith(("- ", "|", "```")) for line in lines)
    assert "# a comment in code, not a heading\n" in "".join(bodies)
    # Lines no block claims (a link reference definition) are still shown.
    assert "[handbook]: https://example.invalid/handbook" in bodies


def test_right_aligned_table_column_keeps_its_alignment() -> None:
    page = render_document(HANDBOOK, "md").html
    assert re.search(r'<td class="align-right"><span[^>]*>49</span></td>', page)


def test_html_document_is_formatted_from_its_canonical_text() -> None:
    doc = extract(PAGE_HTML.encode(), "travel.html")
    result = assert_span_contract(doc.text, "html")
    # The extractor writes every HTML list item with "- ": numbered lists too.
    assert {"h1", "h2", "ul", "li", "pre", "code", "table", "td"} <= set(result.tags)
    bodies = [body for _, _, body in result.spans]
    assert "Travel guide" in bodies and "Return leg" in bodies and "95 EUR" in bodies
    assert "fare = base + tax\n\n# not a heading" in bodies
    # The extractor escaped this line with a backslash; the viewer shows the words.
    assert "## not a heading either" in bodies and "\\## not a heading either" in doc.text
    looks = [line for line in visible_lines(result) if re.match(r"#{1,6} ", line)]
    assert looks == ["# not a heading", "## not a heading either"]
    assert "<br>" not in "".join(bodies) and "Book early.\nPay by card." in bodies


@pytest.mark.parametrize(
    ("make", "name", "tags", "words"),
    [
        (policy_docx, "policy.docx", {"h1", "h2", "ul", "ol", "li", "table", "td"}, "Oslo"),
        (onboarding_pptx, "onboarding.pptx", {"h1", "table", "td"}, "IT desk, room 4"),
        (lambda: rota_xlsx(5), "rota.xlsx", {"h1", "table", "td"}, "Engineer 03"),
    ],
)
def test_office_documents_are_formatted(
    make: Callable[[], bytes], name: str, tags: set[str], words: str
) -> None:
    doc = extract(make(), name)
    result = assert_span_contract(doc.text, doc.kind)
    assert tags <= set(result.tags)
    assert words in [body for _, _, body in result.spans]
    # Only a paragraph the extractor escaped because it looks like a heading shows a "#".
    looks = [line for line in visible_lines(result) if re.match(r"#{1,6} ", line)]
    assert looks == (["# this line only looks like a heading"] if name.endswith("docx") else [])


def test_plain_text_and_pdf_are_one_preformatted_span() -> None:
    text = "# not a heading in a .txt\n\n- nor a list\r\n<b>x</b>"
    for kind in ("txt", "pdf"):
        rendered = render_document(text, kind)
        assert not rendered.formatted and rendered.length == len(text)
        assert rendered.html == (
            f'<pre><span data-start="0" data-end="{len(text)}">'
            "# not a heading in a .txt\n\n- nor a list&#13;\n&lt;b&gt;x&lt;/b&gt;</span></pre>"
        )


def test_a_very_long_document_is_shown_plain() -> None:
    text = "## Heading\n\n" + "word " * (MAX_FORMATTED_CHARS // 5)
    assert len(text) > MAX_FORMATTED_CHARS
    assert not render_document(text, "md").formatted
    assert render_document(text[:MAX_FORMATTED_CHARS], "md").formatted


def test_document_markup_is_escaped_never_parsed() -> None:
    for text, kind in (
        (HANDBOOK, "md"),
        (extract(PAGE_HTML.encode(), "travel.html").text, "html"),
        ("<script>alert(1)</script>\n\n<img src=x onerror=alert(2)> | <b>\n\na | b", "docx"),
    ):
        page = render_document(text, kind).html
        assert "<script" not in page and "<img" not in page and "<b>" not in page
        assert set(parsed(text, kind).tags) <= {
            "span", "h1", "h2", "h3", "p", "ul", "ol", "li", "pre", "code", "table", "tr",
            "th", "td", "blockquote", "hr", "em", "strong", "s", "br",
        }  # fmt: skip
    assert "&lt;script&gt;document.body.dataset.pwned" in render_document(HANDBOOK, "md").html


def test_markdown_emphasis_and_code_spans_are_formatted_links_shown_as_written() -> None:
    text = (
        "Read **the rules** and *then* `run --it` \\* twice ~~not~~.\nNext  \nline\n\n"
        "See [x](https://e.invalid) **now**"
    )
    result = assert_span_contract(text, "md")
    page = render_document(text, "md").html
    assert re.search(r"<strong><span[^>]*>the rules</span></strong>", page)
    assert re.search(r"<em><span[^>]*>then</span></em>", page)
    assert re.search(r"<code><span[^>]*>run --it</span></code>", page)
    assert re.search(r"<s><span[^>]*>not</span></s>", page)
    shown_text = "".join(body for _, _, body in result.spans)
    assert shown_text.startswith("Read the rules and then run --it * twice not.\nNext")
    assert "<br>" in page  # two spaces before a newline
    # A block with a link is shown as written: its address is the document's words too.
    assert "See [x](https://e.invalid) **now**" in shown_text


def test_placeholders_in_a_document_are_its_text() -> None:
    for kind in ("md", "html", "txt"):
        page = fill_viewer(
            title="T", meta="", file_url="f", text="# {{title}} {{body}}\n\n{{length}}", kind=kind
        )
        assert "{{title}} {{body}}" in page and "{{length}}</span>" in page


def test_a_range_starting_in_a_mark_covers_the_text_after_it() -> None:
    heading = HANDBOOK.index("## Parental leave")
    assert shown(HANDBOOK, "md", heading, heading + len("## Parental")) == "Parental"
    cell = HANDBOOK.index("| Norway | 49 |")
    assert shown(HANDBOOK, "md", cell, cell + len("| Norway | 49 |")) == "Norway49"
    assert shown(HANDBOOK, "md", heading, heading + 3) == ""  # "## " only: nothing shown


MARKDOWN_LINES = st.sampled_from(
    [
        "", "# Title", "## Sub ##", "Setext", "===", "---", "- item", "  - nested", "* star",
        "1. one", "3) three", "> quote", ">", "```", "```py", "~~~", "    indented code",
        "\tx", "| a | b |", "|---|:-:|", "| c \\| d | e |", "plain words", "<script>x</script>",
        "a & b", "tail  ", "\\# escaped", "[ref]: /x", "emoji \U0001f44d\U0001f3fd", "***",
        "**bold** and *em*", "`co`de` x``", "a \\* b \\", "[l](/u) ![i](/p)", "&amp; &#35;",
        "~~s~~ _u_ __v__", "<http://a.b>", "x\\",
    ]
)  # fmt: skip
BLOCK_LINES = st.sampled_from(
    [
        "", "# Slide 1: Hello", "### Deep", "- item", "  - nested", "1. first", "12. twelfth",
        "a | b | c", "x |  | z", "```", "````", "plain words", "\\# looks like a heading",
        "\\```", "<img src=x onerror=alert(1)>", "Notes: speaker", "  indented line",
    ]
)  # fmt: skip


@settings(max_examples=150, deadline=None)
@given(st.lists(MARKDOWN_LINES, max_size=25), st.booleans())
def test_any_markdown_keeps_the_span_contract(lines: list[str], crlf: bool) -> None:
    text = ("\r\n" if crlf else "\n").join(lines)
    assert_span_contract(text, "md")


@settings(max_examples=150, deadline=None)
@given(st.lists(BLOCK_LINES, max_size=25), st.sampled_from(["html", "docx", "pptx", "xlsx", "csv"]))
def test_any_extracted_text_keeps_the_span_contract(lines: list[str], kind: str) -> None:
    assert_span_contract("\n".join(lines), kind)


# ---------------------------------------------------------------- cost

# Shapes a small hostile document can take, each as ``n`` of its units; at 4n
# every one is still formatted (within MAX_FORMATTING_WORK).
COSTLY_SHAPES: dict[str, tuple[str, Callable[[int], str]]] = {
    "one paragraph of one-letter lines": ("md", lambda n: "w\n" * n),
    "long lines": ("md", lambda n: "\n".join(f"{'policy ' * 300}{i}" for i in range(n // 20))),
    "hard breaks": ("md", lambda n: "a  \n" * n),
    "deeply nested lists": ("md", lambda n: "".join("  " * (i % 30) + "- a\n" for i in range(n))),
    "deeply nested quotes": ("md", lambda n: "".join(">" * (i % 8) + " a\n" for i in range(n))),
    "many stars": ("md", lambda n: "*a" * n),
    "many underscores": ("md", lambda n: "_a " * n),
    "many backticks": ("md", lambda n: "`a" * n),
    "many brackets": ("md", lambda n: "![a" * (n // 2)),
    "table rows": ("md", lambda n: "|a|b|\n|-|-|\n" + "|a|b|\n" * (n // 3)),
    "headings": ("md", lambda n: "# h\n" * n),
    "numbered items": ("md", lambda n: "1. a\n" * n),
    "one-word blocks": ("docx", lambda n: "w\n\n" * (n // 2)),
    "escaped lines": ("html", lambda n: "\\# h\n\n" * (n // 2)),
    "list items": ("pptx", lambda n: "".join("  " * (i % 20) + "- a\n\n" for i in range(n // 2))),
}


@pytest.fixture
def quiet_parser() -> None:
    """markdown-it-py's debug lines off, as the product's logging has them (``bot.logs``):
    the session records every line at DEBUG, which would cost more than the parse."""
    logging.getLogger("markdown_it").setLevel(logging.WARNING)  # undone by record_every_log


@pytest.mark.usefixtures("quiet_parser")
@pytest.mark.parametrize("shape", COSTLY_SHAPES)
def test_formatting_is_linear_in_every_costly_shape(shape: str) -> None:
    kind, build = COSTLY_SHAPES[shape]
    n = 150
    assert render_document(build(4 * n), kind).formatted  # the formatter's work is what is counted
    assert_linear(lambda k: render_document(build(k), kind), n)


@pytest.mark.usefixtures("quiet_parser")
def test_a_text_too_costly_to_format_is_shown_plain_at_once_with_exact_offsets() -> None:
    # The worst Markdown block: one paragraph of one-letter lines (quadratic to format before).
    text = "w\n" * 40_000
    assert len(text) <= MAX_FORMATTED_CHARS and formatting_work(text) > MAX_FORMATTING_WORK
    rendered: list[object] = []
    work = steps(lambda: rendered.append(render_document(text, "md")), limit=10_000)
    page = render_document(text, "md")
    assert not page.formatted and page.length == len(text)
    assert page.html == f'<pre><span data-start="0" data-end="{len(text)}">{text}</span></pre>'
    assert work < 1_000  # counted in C, refused before any parsing
    just_under = "w\n" * (MAX_FORMATTING_WORK // 4)
    assert formatting_work(just_under) <= MAX_FORMATTING_WORK
    assert render_document(just_under, "md").formatted


async def test_one_text_opened_at_once_is_formatted_once_then_cached() -> None:
    formatter = Formatter()
    try:
        first, second = await asyncio.gather(
            formatter.render(HANDBOOK, "md"), formatter.render(HANDBOOK, "md")
        )
        assert first is second and first.formatted  # one formatting for both
        assert await formatter.render(HANDBOOK, "md") is first  # then the cached copy
        assert formatter.pending == 0
        changed = await formatter.render(HANDBOOK + "\nA new line.", "md")
        assert changed is not first and "A new line." in changed.html  # a new version, anew
    finally:
        formatter.close()


async def test_the_cache_is_bounded_in_characters() -> None:
    one = render_document(HANDBOOK, "md")
    formatter = Formatter(cached_chars=one.length + len(one.html) + 10)
    try:
        first = await formatter.render(HANDBOOK, "md")
        assert await formatter.render(HANDBOOK, "md") is first
        await formatter.render(PASSAGE * 3, "md")  # no room for both
        assert await formatter.render(HANDBOOK, "md") is not first
    finally:
        formatter.close()


@pytest.mark.usefixtures("quiet_parser")
async def test_opening_costly_documents_never_delays_health_checks(bot: Bot) -> None:
    """The viewer formats on its own thread: however many pages are being formatted,
    ``/healthz`` and ``/readyz`` (which use the default executor, as searches and
    answers do) answer at once."""
    documents = [
        bot.kb.ingest_bytes((f"# Costly {i}\n\n" + "w\n" * 300).encode(), f"c{i}.md").document
        for i in range(8)  # more than the default executor's threads on a small machine
    ]
    formatter = bot.app[FORMATTER]
    release = threading.Event()
    # The formatter's one thread is busy (as with a long formatting) until the test says.
    busy = asyncio.ensure_future(formatter.run(release.wait, 60))
    opens = [asyncio.ensure_future(bot.http.get(_link(bot, d.id))) for d in documents]
    try:
        async with asyncio.timeout(60):
            while formatter.pending < 1 + len(documents):  # every page waits for formatting
                await asyncio.sleep(0.01)
        for path in ("/healthz", "/readyz"):
            async with asyncio.timeout(10):
                resp = await bot.http.get(path)
            assert resp.status == 200, (path, await resp.text())
        assert not any(o.done() for o in opens)
    finally:
        release.set()
    await busy
    for page in await asyncio.gather(*opens):
        assert page.status == 200
        assert 'class="document formatted markdown"' in await page.text()


# ---------------------------------------------------------------- the server


def _link(bot: Bot, doc_id: int, what: str = "") -> str:
    token = bot.services.engine.signer.token(doc_id, "*")
    return f"/d/{doc_id}{what}?t={token}"


async def test_canonical_text_download_is_exactly_the_stored_text(bot: Bot) -> None:
    doc = bot.kb.ingest_bytes(HANDBOOK.encode(), "handbook.md").document
    stored = bot.kb.canonical_text(doc.id)
    resp = await bot.http.get(_link(bot, doc.id, "/text"))
    assert resp.status == 200
    assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert await resp.read() == stored.encode("utf-8")
    assert "sandbox" in resp.headers["Content-Security-Policy"]
    assert resp.headers["Cache-Control"] == "private, no-store"
    assert resp.headers["Content-Disposition"] == "inline; filename*=UTF-8''handbook.txt"

    # The page's "Text as indexed" link (relative to /d/) is that download, with the page's token.
    page = await (await bot.http.get(_link(bot, doc.id))).text()
    href = re.search(r'id="canonical" href="([^"]+)"', page)
    assert href is not None and href[1].startswith(f"{doc.id}/text?t=")
    resp = await bot.http.get("/d/" + html.unescape(href[1]))
    assert resp.status == 200 and await resp.read() == stored.encode("utf-8")

    tampered = _link(bot, doc.id, "/text").replace("t=", "t=x", 1)
    assert (await bot.http.get(tampered)).status == 403
    link = _link(bot, doc.id, "/text")
    bot.kb.remove(doc.id)
    assert (await bot.http.get(link)).status == 404


async def test_with_sign_in_required_the_text_opens_only_for_readers_of_its_scope(
    make_bot: BotFactory,
) -> None:
    bot = await make_bot(**SIGN_IN)
    bot.slack.set_members(CHANNEL_ID, [USER_ID])
    falcon = bot.kb.store.find_document("falcon.md")
    path = link(bot, falcon).replace("?", "/text?", 1)
    resp = await bot.http.get(path, allow_redirects=False)
    assert resp.status == 302 and resp.headers["Location"].startswith(f"{PUBLIC_URL}{LOGIN_PATH}?")
    await sign_in(bot, "U0ATTACKER")  # in the workspace, not in the channel
    resp = await bot.http.get(path)
    assert resp.status == 403 and "Project Falcon" not in await resp.text()
    await sign_in(bot, USER_ID)
    resp = await bot.http.get(path)
    assert resp.status == 200
    assert await resp.read() == bot.kb.canonical_text(falcon.id).encode("utf-8")


# ---------------------------------------------------------------- in the browser

MEASURE_JS = """(() => {
  const marks = [...document.querySelectorAll('mark.hl')];
  const rects = marks.map(m => m.getBoundingClientRect()).filter(r => r.width > 0);
  const heading = [...document.querySelectorAll('#doc h2')].find(h => h.textContent === 'Parental leave');
  const para = document.querySelector('#doc p');
  const walker = document.createTreeWalker(document.getElementById('doc'), NodeFilter.SHOW_TEXT);
  const marked = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    // Code is shown as written: a "# comment" there is the document's own text.
    if (!n.parentElement.closest('pre') && /^\\s*(#{1,6} |[-*] |\\|)/.test(n.data)) {
      marked.push(n.data.slice(0, 40));
    }
  }
  const hr = heading.getBoundingClientRect();
  return {
    text: marks.map(m => m.textContent).join(''),
    marks: marks.length,
    first: document.getElementById('hl') === marks[0],
    top: Math.min(...rects.map(r => r.top)),
    bottom: Math.max(...rects.map(r => r.bottom)),
    left: Math.min(...rects.map(r => r.left)),
    right: Math.max(...rects.map(r => r.right)),
    heading: [hr.top, hr.bottom, hr.left, hr.right],
    innerHeight: window.innerHeight,
    innerWidth: window.innerWidth,
    scrollY: window.scrollY,
    headingSize: parseFloat(getComputedStyle(heading).fontSize),
    h1Size: parseFloat(getComputedStyle(document.querySelector('#doc h1')).fontSize),
    bodySize: parseFloat(getComputedStyle(para).fontSize),
    marked: marked,
    pwned: document.body.dataset.pwned ?? null,
    scripts: document.scripts.length,
    images: document.images.length,
    hostile: [...document.querySelectorAll('#doc h2')].map(h => h.textContent).pop(),
    highlight: document.body.dataset.highlight,
  };
})()"""

MARKS_JS = "[...document.querySelectorAll('mark.hl')].map(m => m.textContent).join('')"
# The highlight's background, --mark-bg in viewer.css (the light scheme headless Chromium uses).
MARK_RGB = (0xFF, 0xF0, 0xA0)


def _share_of_mark_colour(image: Image.Image, box: tuple[float, float, float, float]) -> float:
    """The share of pixels in ``box`` (left, top, right, bottom) drawn in the highlight's colour."""
    left, top, right, bottom = (round(v) for v in box)
    region = np.asarray(image.convert("RGB").crop((left, top, right, bottom)), dtype=int)
    return float((np.abs(region - np.array(MARK_RGB)) <= 6).all(axis=2).mean())


async def _set_hash(browser: Browser, fragment: str) -> str:
    """Follow a link to another passage of the open page; the text then highlighted."""
    await browser.evaluate(
        "new Promise(resolve => {"
        "  window.addEventListener('hashchange', () => setTimeout(resolve, 0), {once: true});"
        f"  location.hash = {json.dumps(fragment)};"
        "})"
    )
    return str(await browser.evaluate(MARKS_JS))


@pytest.mark.browser
@requires_chromium
async def test_passage_under_a_heading_is_highlighted_centred_and_formatted(
    bot: Bot, tmp_path: Path
) -> None:
    doc = bot.kb.ingest_bytes(HANDBOOK.encode(), "handbook.md").document
    text = bot.kb.canonical_text(doc.id)
    a = text.index(PASSAGE)
    b = a + len(PASSAGE)
    async with Browser(window=(1000, 700)) as browser:
        await browser.goto(f"{bot.http.make_url(_link(bot, doc.id))}#char={a},{b}")
        await browser.wait_for("document.body.dataset.ready === 'true'")
        state = await browser.evaluate(MEASURE_JS)
        shot = await browser.screenshot(tmp_path / "passage.png")

    assert state["text"] == text[a:b] == PASSAGE and state["marks"] == 1 and state["first"]
    assert state["highlight"] == f"{a},{b}" and state["scrollY"] > 0
    # Centred: the passage's middle within 5% of the window's height of the window's middle.
    middle = (state["top"] + state["bottom"]) / 2
    assert abs(middle - state["innerHeight"] / 2) <= 0.05 * state["innerHeight"]
    # Formatted: headings larger than body text, and no mark of syntax in any text node.
    assert state["h1Size"] > state["headingSize"] > state["bodySize"]
    assert state["marked"] == []
    # Hostile text stayed text.
    assert state["pwned"] is None and state["scripts"] == 1 and state["images"] == 0
    assert state["hostile"] == HOSTILE_HEADING

    image = Image.open(shot)
    assert image.size == (1000, 700)
    box = (state["left"], state["top"], state["right"], state["bottom"])
    # Where the highlight's rectangle is, the screenshot is mostly its colour (glyphs are not).
    assert _share_of_mark_colour(image, box) > 0.5
    # The heading above it is on screen and not highlighted.
    top, bottom, left, right = state["heading"]
    assert 0 <= top < bottom < state["top"]
    assert _share_of_mark_colour(image, (left, top, right, bottom)) < 0.01


@pytest.mark.browser
@requires_chromium
async def test_random_ranges_highlight_exactly_their_shown_text(bot: Bot, tmp_path: Path) -> None:
    documents = [
        bot.kb.ingest_bytes(HANDBOOK.encode(), "handbook.md").document,
        bot.kb.ingest_bytes(PAGE_HTML.encode(), "travel.html").document,
        bot.kb.ingest_bytes(policy_docx(), "policy.docx").document,
    ]
    rng = random.Random(5147)
    async with Browser(window=(900, 600)) as browser:
        for doc in documents:
            text = bot.kb.canonical_text(doc.id)
            await browser.goto(str(bot.http.make_url(_link(bot, doc.id))))
            await browser.wait_for("document.body.dataset.ready === 'true'")
            # Ranges that start on a heading's "#", a list's "-" or a table's "|", and random ones.
            marks = [m.start() for m in re.finditer(r"(?m)^(#|- |\d\. |\|)", text)]
            ranges = [(s, min(len(text), s + rng.randint(1, 60))) for s in marks[:10]]
            ranges += [tuple(sorted(rng.sample(range(len(text) + 1), 2))) for _ in range(25)]
            for a, b in ranges:
                got = await _set_hash(browser, f"char={a},{b}")
                assert got == shown(text, doc.kind, a, b), (doc.kind, a, b, text[a:b])
            await browser.screenshot(tmp_path / f"{doc.kind}.png")


@pytest.mark.browser
@requires_chromium
async def test_wide_tables_and_long_code_lines_never_scroll_a_phone_sideways(
    bot: Bot, tmp_path: Path
) -> None:
    columns = [f"column number {i}" for i in range(20)]
    wide = (
        "# Wide\n\n| " + " | ".join(columns) + " |\n|" + "---|" * len(columns) + "\n| "
        + " | ".join(f"value {i}" for i in range(len(columns))) + " |\n\n"
        "```\n" + "long_identifier_" * 40 + "\n```\n\nThe end of the page.\n"
    )  # fmt: skip
    doc = bot.kb.ingest_bytes(wide.encode(), "wide.md").document
    text = bot.kb.canonical_text(doc.id)
    a = text.index("value 19")
    async with Browser(window=(390, 844), mobile=True) as browser:
        await browser.goto(f"{bot.http.make_url(_link(bot, doc.id))}#char={a},{a + 8}")
        await browser.wait_for("document.body.dataset.ready === 'true'")
        state = await browser.evaluate(
            "({page: document.documentElement.scrollWidth, inner: window.innerWidth,"
            " hl: document.getElementById('hl').textContent,"
            " table: document.querySelector('#doc table').scrollWidth,"
            " left: document.getElementById('hl').getBoundingClientRect().left,"
            " right: document.getElementById('hl').getBoundingClientRect().right})"
        )
        await browser.screenshot(tmp_path / "wide.png")
    assert state["page"] <= state["inner"] < state["table"]  # the table scrolls, not the page
    # The cited cell, at the far end of the table, was scrolled into view inside it.
    assert state["hl"] == "value 19" and 0 <= state["left"] < state["right"] <= state["inner"]
