"""A small Markdown renderer for the portal's help pages (our own docs, not customer text):
headings with anchors, paragraphs, fenced code, lists, tables, inline code, bold, italics and
links. Everything is escaped first; only the markup this module writes is HTML."""

from __future__ import annotations

import re
from html import escape

_INLINE_CODE = re.compile(r"`([^`]+)`")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])")
_LIST_ITEM = re.compile(r"^(\s*)([-*]|\d+\.)\s+(.*)$")


def slug(text: str) -> str:
    """GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.strip().replace(" ", "-")


def _inline(text: str, links: dict[str, str]) -> str:
    codes: list[str] = []

    def keep_code(m):
        codes.append(f"<code>{escape(m.group(1))}</code>")
        return f"\x00{len(codes) - 1}\x00"

    text = _INLINE_CODE.sub(keep_code, text)
    text = escape(text, quote=False)

    def link(m):
        label, href = m.group(1), m.group(2)
        href = links.get(href.split("#")[0], href) + (
            "#" + href.split("#", 1)[1] if "#" in href and href.split("#")[0] in links else ""
        )
        if href.startswith("../") or (not href.startswith(("#", "/", "http")) and "/" in href):
            return label  # a path in the repository: no page of ours to link
        return f'<a href="{escape(href)}">{label}</a>'

    text = _LINK.sub(link, text)
    text = _BOLD.sub(r"<strong>\1</strong>", text)
    text = _ITALIC.sub(r"<em>\1</em>", text)
    return re.sub("\x00(\\d+)\x00", lambda m: codes[int(m.group(1))], text)


def render(source: str, *, links: dict[str, str] | None = None) -> str:
    """`source` (Markdown) as HTML. `links` maps a document's relative links (`PYTORCH.md`) to
    the portal's pages that render them."""
    links = links or {}
    out: list[str] = []
    lines = source.splitlines()
    i = 0
    para: list[str] = []

    def flush():
        if para:
            out.append(f"<p>{_inline(' '.join(para), links)}</p>")
            para.clear()

    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            flush()
            lang = line[3:].strip()
            body = []
            i += 1
            while i < len(lines) and not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            cls = f' class="lang-{escape(lang)}"' if lang else ""
            out.append(f"<pre{cls}><code>{escape(chr(10).join(body))}</code></pre>")
            i += 1
            continue
        heading = re.match(r"^(#{1,6})\s+(.*)$", line)
        if heading:
            flush()
            level = len(heading.group(1))
            text = heading.group(2).strip()
            out.append(f'<h{level} id="{slug(text)}">{_inline(text, links)}</h{level}>')
            i += 1
            continue
        table_rule = i + 1 < len(lines) and re.match(r"^\|[\s:|-]+\|$", lines[i + 1])
        if line.startswith("|") and table_rule:
            flush()

            def cells(row):
                return [c.strip() for c in row.strip().strip("|").split("|")]

            head = "".join(f"<th>{_inline(c, links)}</th>" for c in cells(line))
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append("".join(f"<td>{_inline(c, links)}</td>" for c in cells(lines[i])))
                i += 1
            body = "".join(f"<tr>{r}</tr>" for r in rows)
            out.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
            continue
        item = _LIST_ITEM.match(line)
        if item and not para:
            flush()
            ordered = item.group(2)[0].isdigit()
            tag = "ol" if ordered else "ul"
            items: list[str] = []
            while i < len(lines):
                m = _LIST_ITEM.match(lines[i])
                if m:
                    items.append(m.group(3))
                elif lines[i].startswith("  ") and lines[i].strip() and items:
                    items[-1] += " " + lines[i].strip()  # a wrapped item
                else:
                    break
                i += 1
            body = "".join(f"<li>{_inline(t, links)}</li>" for t in items)
            out.append(f"<{tag}>{body}</{tag}>")
            continue
        if not line.strip():
            flush()
        else:
            para.append(line.strip())
        i += 1
    flush()
    return "\n".join(out)
