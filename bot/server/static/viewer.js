/*
 * Document viewer: highlight the passage named by the URL fragment and scroll to it.
 *
 * Fragments follow RFC 5147 (text/plain fragment identifiers):
 *   #char=a,b   the text between positions a and b, i.e. text[a:b]
 *   #char=a     the position a (before the a-th character)
 *   #char=,b    from the start to b;  #char=a,  from a to the end
 * optionally followed by integrity checks (";length=...", ";md5=..."), accepted
 * and ignored. Positions count Unicode code points, like Python's str, NOT the
 * UTF-16 units JavaScript strings use: an emoji before the range is one position.
 *
 * The server writes the document (bot/server/render.py) as elements whose text
 * is in <span data-start="s" data-end="e"> pieces, each holding exactly
 * text[s:e] of the canonical text, in document order; the characters no span
 * holds are syntax (a heading's "## ", list bullets, table pipes) and are not
 * shown. #doc's data-length is the text's length in code points. A range is
 * highlighted as the shown text it covers: each piece of a span inside it is
 * wrapped in <mark class="hl"> (the first one id="hl"); a position, or a range
 * that covers syntax only, is an empty <mark class="point"> where it falls.
 *
 * Fragments never reach the server, which is why this runs in the browser.
 * Results are exposed on <body> for tests and tooling:
 *   data-ready="true"       the script ran
 *   data-highlight          "a,b", "a" (a position) or "none"
 *   data-scrolled           window.scrollY right after scrolling to the passage
 */
(function () {
  "use strict";

  var FRAGMENT = /^char=(\d*)(?:,(\d*))?((?:;[A-Za-z0-9=,.\-]*)*)$/i;

  var doc = document.getElementById("doc");
  if (!doc) {
    return;
  }
  // Every highlight starts again from the document as the server wrote it.
  var pristine = doc.cloneNode(true);
  var length = Number(doc.getAttribute("data-length")) || 0;
  var notice = document.getElementById("notice");
  var jump = document.getElementById("jump");
  var marks = [];

  function isHighSurrogate(unit) {
    return unit >= 0xd800 && unit <= 0xdbff;
  }

  function isLowSurrogate(unit) {
    return unit >= 0xdc00 && unit <= 0xdfff;
  }

  /* UTF-16 offset in `s` of the code point position `cp` (the end of `s` past it). */
  function unitOf(s, cp) {
    var unit = 0;
    for (var n = 0; n < cp && unit < s.length; n++) {
      unit += isHighSurrogate(s.charCodeAt(unit)) && unit + 1 < s.length &&
        isLowSurrogate(s.charCodeAt(unit + 1)) ? 2 : 1;
    }
    return unit;
  }

  /* The code point range named by the fragment, or null when there is none or it is invalid. */
  function parseFragment(hash) {
    var raw = hash.charAt(0) === "#" ? hash.slice(1) : hash;
    try {
      raw = decodeURIComponent(raw);
    } catch (e) {
      return null;
    }
    var m = FRAGMENT.exec(raw);
    if (!m) {
      return null;
    }
    var hasComma = m[2] !== undefined;
    var a = m[1];
    var b = hasComma ? m[2] : undefined;
    if (!hasComma && a === "") {
      return null;  // "char=" names nothing
    }
    if (hasComma && a === "" && b === "") {
      return null;  // "char=," names nothing either
    }
    var start = a === "" ? 0 : Number(a);
    var end = !hasComma ? start : (b === "" ? length : Number(b));
    if (!isFinite(start) || !isFinite(end) || start > end || end > length) {
      return null;
    }
    return { start: start, end: end, point: !hasComma };
  }

  function showNotice(message) {
    if (!notice) {
      return;
    }
    notice.textContent = message;
    notice.hidden = !message;
  }

  function reset() {
    doc.replaceChildren.apply(doc, Array.prototype.slice.call(pristine.cloneNode(true).childNodes));
    marks = [];
  }

  function bounds(span) {
    return [Number(span.getAttribute("data-start")), Number(span.getAttribute("data-end"))];
  }

  /* Index of the first span ending after position `at` (spans are in document order). */
  function firstEndingAfter(spans, at) {
    var lo = 0;
    var hi = spans.length;
    while (lo < hi) {
      var mid = (lo + hi) >> 1;
      if (bounds(spans[mid])[1] > at) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  }

  /* Wrap code points [from, to) of a span's text in a new mark (the first: id "hl"); return it. */
  function wrap(span, from, to, className, first) {
    var node = span.firstChild;
    var text = node ? node.data : "";
    var a = unitOf(text, from);
    var b = unitOf(text, to);
    var mark = document.createElement("mark");
    if (first) {
      mark.id = "hl";
      mark.tabIndex = -1;
    }
    mark.className = className;
    mark.textContent = text.slice(a, b);
    if (!node) {
      span.appendChild(mark);
      return mark;
    }
    var rest = node.splitText(a);
    rest.data = text.slice(b);
    span.insertBefore(mark, rest);
    return mark;
  }

  /* Marks over the shown text of [start, end); an empty point mark when none is shown. */
  function highlight(start, end, point) {
    var spans = doc.querySelectorAll("span[data-start]");
    var i = firstEndingAfter(spans, start);
    var found = [];
    for (var k = i; !point && k < spans.length; k++) {
      var se = bounds(spans[k]);
      if (se[0] >= end) {
        break;
      }
      found.push(wrap(spans[k], Math.max(start, se[0]) - se[0], Math.min(end, se[1]) - se[0], "hl",
        !found.length));
    }
    if (!found.length && spans.length) {
      // Where the position falls, or the first shown character after the syntax it names.
      var span = spans[Math.min(i, spans.length - 1)];
      var se2 = bounds(span);
      var at = i < spans.length ? Math.max(0, start - se2[0]) : se2[1] - se2[0];
      var mark = wrap(span, at, at, "hl point", true);
      mark.setAttribute("aria-label", "cited position");
      found.push(mark);
    }
    return found;
  }

  function scrollToMarks() {
    if (!marks.length) {
      return;
    }
    // Sideways first, for a passage in a wide table; then its middle to the window's.
    marks[0].scrollIntoView({ block: "nearest", inline: "nearest", behavior: "instant" });
    var top = Infinity;
    var bottom = -Infinity;
    marks.forEach(function (mark) {
      var r = mark.getBoundingClientRect();
      top = Math.min(top, r.top);
      bottom = Math.max(bottom, r.bottom);
    });
    var h = window.innerHeight;
    // A passage taller than the window starts near its top, so its first line is read first.
    var offset = bottom - top <= h ? (top + bottom) / 2 - h / 2 : top - h / 10;
    // "instant" rather than smooth: the passage is where the reader wants to
    // be, and the recorded position is then final when it is written down.
    window.scrollTo({ top: Math.max(0, window.scrollY + offset), left: window.scrollX, behavior: "instant" });
    document.body.dataset.scrolled = String(Math.round(window.scrollY));
  }

  function apply() {
    var hash = window.location.hash;
    var range = parseFragment(hash);
    reset();
    delete document.body.dataset.scrolled;
    if (jump) {
      jump.hidden = true;
    }
    if (!range) {
      document.body.dataset.highlight = "none";
      if (hash && /^#?char=/i.test(hash)) {
        showNotice("The cited passage is not in this version of the document; showing the whole text.");
        // Bring the notice into view: the reader may be far down from a previous passage.
        window.scrollTo(0, 0);
      } else {
        showNotice("");
      }
      document.body.dataset.ready = "true";
      return;
    }
    marks = highlight(range.start, range.end, range.point || range.start === range.end);
    if (!marks.length) {
      document.body.dataset.highlight = "none";
      document.body.dataset.ready = "true";
      return;
    }
    showNotice("");
    document.body.dataset.highlight = range.point ? String(range.start) : range.start + "," + range.end;
    scrollToMarks();
    // Move keyboard and screen-reader focus to the passage without another scroll.
    marks[0].focus({ preventScroll: true });
    if (jump) {
      jump.hidden = false;
    }
    document.body.dataset.ready = "true";
  }

  /* Say which pages were read by OCR: their text may hold recognition errors. */
  function noteOcrPages() {
    // The server names them (a marker line in the text alone could be forged).
    var note = document.getElementById("ocr");
    var named = note ? note.getAttribute("data-pages") || "" : "";
    var pages = named ? named.split(",") : [];
    document.body.dataset.ocrPages = pages.join(",");
    if (note && pages.length) {
      note.textContent = (pages.length === 1 ? "Page " : "Pages ") + pages.join(", ") +
        ": text read by OCR from a scan; it may contain recognition errors.";
      note.hidden = false;
    }
  }

  if (jump) {
    jump.addEventListener("click", scrollToMarks);
  }
  window.addEventListener("hashchange", apply);
  noteOcrPages();
  apply();
})();
