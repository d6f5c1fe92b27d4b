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
  // The server puts the whole canonical text into one text node; keep it so
  // that every highlight starts again from the untouched text.
  var text = doc.textContent || "";
  var notice = document.getElementById("notice");
  var jump = document.getElementById("jump");
  var codePointCount = null;

  function isHighSurrogate(unit) {
    return unit >= 0xd800 && unit <= 0xdbff;
  }

  function isLowSurrogate(unit) {
    return unit >= 0xdc00 && unit <= 0xdfff;
  }

  /* Number of code points in the text (a surrogate pair counts once). */
  function countCodePoints() {
    if (codePointCount === null) {
      var n = 0;
      for (var i = 0; i < text.length; i++) {
        if (!(isLowSurrogate(text.charCodeAt(i)) && i > 0 && isHighSurrogate(text.charCodeAt(i - 1)))) {
          n++;
        }
      }
      codePointCount = n;
    }
    return codePointCount;
  }

  /* UTF-16 offsets of two code point positions (start <= end), in one pass. */
  function toUnits(start, end) {
    var unit = 0;
    var cp = 0;
    var startUnit = start === 0 ? 0 : -1;
    while (cp < end) {
      if (unit >= text.length) {
        return null;
      }
      var step = 1;
      if (isHighSurrogate(text.charCodeAt(unit)) && unit + 1 < text.length &&
          isLowSurrogate(text.charCodeAt(unit + 1))) {
        step = 2;
      }
      unit += step;
      cp++;
      if (cp === start) {
        startUnit = unit;
      }
    }
    return [startUnit, unit];
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
    var length = countCodePoints();
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
    doc.replaceChildren(document.createTextNode(text));
  }

  function scrollToMark(mark) {
    // "instant" rather than smooth: the passage is where the reader wants to
    // be, and the recorded position is then final when it is written down.
    mark.scrollIntoView({ block: "center", inline: "nearest", behavior: "instant" });
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
    var units = toUnits(range.start, range.end);
    if (!units) {
      document.body.dataset.highlight = "none";
      document.body.dataset.ready = "true";
      return;
    }
    var mark = document.createElement("mark");
    mark.id = "hl";
    mark.tabIndex = -1;
    mark.textContent = text.slice(units[0], units[1]);
    if (range.point || units[0] === units[1]) {
      mark.className = "point";
      mark.setAttribute("aria-label", "cited position");
    }
    doc.replaceChildren(
      document.createTextNode(text.slice(0, units[0])),
      mark,
      document.createTextNode(text.slice(units[1]))
    );
    showNotice("");
    document.body.dataset.highlight = range.point ? String(range.start) : range.start + "," + range.end;
    scrollToMark(mark);
    // Move keyboard and screen-reader focus to the passage without another scroll.
    mark.focus({ preventScroll: true });
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
    jump.addEventListener("click", function () {
      var mark = document.getElementById("hl");
      if (mark) {
        scrollToMark(mark);
      }
    });
  }
  window.addEventListener("hashchange", apply);
  noteOcrPages();
  apply();
})();
