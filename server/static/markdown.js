// A small Markdown renderer for model output that never inserts text as HTML.
//
// Model text is untrusted: everything here builds DOM nodes and sets their textContent, so a
// "<script>" in an answer stays the characters "<script>". Links are made only for http(s) URLs
// (set with setAttribute, never through markup), so "javascript:" links cannot exist.
// It covers what chat answers use: fenced code blocks (an unclosed fence, common mid-stream, runs
// to the end), headings, bullet and numbered lists, block quotes, paragraphs with their line
// breaks, and inline code, bold, italic and links.
"use strict";

(function () {
  // Inline spans, earliest match first: `code`, **bold**, *italic* or _italic_, [text](http...).
  const INLINE = /(`+)([^`]+?)\1|\*\*(.+?)\*\*|(?<![\w*])\*(?!\s)(.+?)\*(?!\w)|(?<!\w)_(?!\s)(.+?)_(?!\w)|\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g;

  function el(tag, className) {
    const node = document.createElement(tag);
    if (className) node.className = className;
    return node;
  }

  // Append `text` to `parent` with its inline markup as elements (recursively for bold/italic).
  function inline(parent, text) {
    let last = 0;
    for (const m of text.matchAll(INLINE)) {
      if (m.index > last) parent.appendChild(document.createTextNode(text.slice(last, m.index)));
      if (m[2] !== undefined) {
        const code = el("code");
        code.textContent = m[2];
        parent.appendChild(code);
      } else if (m[3] !== undefined) {
        inline(parent.appendChild(el("strong")), m[3]);
      } else if (m[4] !== undefined || m[5] !== undefined) {
        inline(parent.appendChild(el("em")), m[4] !== undefined ? m[4] : m[5]);
      } else {
        const a = el("a");
        a.setAttribute("href", m[7]);
        a.setAttribute("rel", "noopener noreferrer");
        a.setAttribute("target", "_blank");
        a.textContent = m[6];
        parent.appendChild(a);
      }
      last = m.index + m[0].length;
    }
    if (last < text.length) parent.appendChild(document.createTextNode(text.slice(last)));
  }

  // Lines joined with <br>, as chat models mean single newlines.
  function lines(parent, rows) {
    rows.forEach((row, i) => {
      if (i) parent.appendChild(el("br"));
      inline(parent, row);
    });
    return parent;
  }

  const FENCE = /^\s*(```|~~~)\s*([\w+#.-]*)/;
  const HEADING = /^(#{1,6})\s+(.*)$/;
  const BULLET = /^\s*[-*+]\s+(.*)$/;
  const NUMBERED = /^\s*\d+[.)]\s+(.*)$/;
  const QUOTE = /^\s*>\s?(.*)$/;

  // Render `text` as a DocumentFragment of block elements.
  function render(text) {
    const out = document.createDocumentFragment();
    const rows = text.split("\n");
    let i = 0;
    while (i < rows.length) {
      const row = rows[i];
      const fence = row.match(FENCE);
      if (fence) {
        const body = [];
        i += 1;
        while (i < rows.length && !rows[i].trim().startsWith(fence[1])) body.push(rows[i++]);
        i += 1; // the closing fence (or past the end while it is still streaming)
        const pre = el("pre", "code-block");
        const code = pre.appendChild(el("code"));
        if (fence[2]) pre.dataset.lang = fence[2];
        code.textContent = body.join("\n");
        out.appendChild(pre);
        continue;
      }
      const heading = row.match(HEADING);
      if (heading) {
        inline(out.appendChild(el("h" + Math.min(heading[1].length + 2, 6))), heading[2]);
        i += 1;
        continue;
      }
      const list = BULLET.test(row) ? [BULLET, "ul"] : NUMBERED.test(row) ? [NUMBERED, "ol"] : null;
      if (list) {
        const node = out.appendChild(el(list[1]));
        while (i < rows.length && list[0].test(rows[i])) inline(node.appendChild(el("li")), rows[i++].match(list[0])[1]);
        continue;
      }
      if (QUOTE.test(row)) {
        const quoted = [];
        while (i < rows.length && QUOTE.test(rows[i])) quoted.push(rows[i++].match(QUOTE)[1]);
        out.appendChild(lines(el("blockquote"), quoted));
        continue;
      }
      if (!row.trim()) {
        i += 1;
        continue;
      }
      const para = [];
      while (i < rows.length && rows[i].trim() && !FENCE.test(rows[i]) && !HEADING.test(rows[i]) &&
             !BULLET.test(rows[i]) && !NUMBERED.test(rows[i]) && !QUOTE.test(rows[i])) para.push(rows[i++]);
      out.appendChild(lines(el("p"), para));
    }
    return out;
  }

  window.DsparkMarkdown = { render };
})();
