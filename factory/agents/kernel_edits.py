"""Edits of a PTX text as a model proposes them, and the paging through which it reads one.

A model that improves a 170,000-character kernel should not retype it: it names the kernel by a
handle, reads it a page at a time (`page`), finds the lines it wants (`search`), and sends
edits (`apply_edits`), each one either

- `{"find": <text>, "replace": <text>}`: `find` must occur exactly once in the kernel (as it
  stands after the earlier edits of the same call); when the exact text is absent, a match that
  differs only in the run lengths of spaces and tabs inside lines is taken if it is the only one
  (the model often writes a tab as spaces), and the result says so; or
- `{"diff": <unified diff hunks>}` (or the hunks as a bare string): each `@@ -a,b +c,d @@` hunk's
  context and `-` lines must match the kernel's lines (whitespace runs compared as above); the
  hunk is placed at its stated line when it matches there, else at its only match elsewhere.

Anything that does not apply raises `EditError` naming the edit or hunk, what was expected and
what the kernel holds near the place, so the model can correct itself.

Sizes, measured 2026-12-07 on the catalogue's 14 operators through the row family (default
schedule at each of the catalogue's 41 shapes): 22,695 to 121,360 characters, median 60,092, 21 of
41 over 60,000 (masked_softmax 121,360; add_rmsnorm 107,524; layernorm 100,406); the offline
agents' 112 generation-0 kernels (8 per operator): median 60,060, largest 172,310 (add_rmsnorm),
57 over 60,000; even at 3.5 characters a token, 96 of the 112 exceed what one 8,192-token answer
holds. The matmul family's default kernels for the examples (factory/examples) run 50,965
(swiglu_up) to 170,656 characters (matmul_bias_gelu). `MAX_KERNEL_CHARS` accepts 1.5x the largest
generation-0 kernel; `PAGE_CHARS` is what one read returns at most (about 13,000 tokens: the
largest kernel in five reads).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

# The largest kernel the factory emitted in a generation 0 of the catalogue was 172,310
# characters: a whole kernel up to 1.5x that is accepted (larger is refused, with its size).
MAX_KERNEL_CHARS = 260_000
# One read_kernel page: at most this many characters (and at most MAX_PAGE_LINES lines); a
# page shortened by the character budget says so and names the next line to read.
PAGE_CHARS = 40_000
MAX_PAGE_LINES = 1_500
DEFAULT_PAGE_LINES = 400
MAX_SEARCH_HITS = 60
MAX_EDITS = 200
# PTX runs about 3 characters per token (short mnemonics, %r123 registers): what an answer of
# max_tokens output tokens can hold, said to the model so it edits rather than retypes.
CHARS_PER_TOKEN = 3

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
_WS = re.compile(r"[ \t]+")


class EditError(ValueError):
    """An edit that does not apply; the message is written for the model."""


@dataclass(frozen=True)
class Applied:
    text: str
    notes: tuple[str, ...]  # one line per edit that needed a whitespace-insensitive match, etc.
    digest: str  # a short digest of the edits as given (the draft's schedule names it)
    summary: str  # the edits as text, shortened for evidence


def _norm(line: str) -> str:
    return _WS.sub(" ", line.strip())


def _show(s: str, n: int = 120) -> str:
    s = s if len(s) <= n else s[: n - 3] + "..."
    return json.dumps(s)


def edit_digest(edits) -> str:
    return hashlib.sha256(json.dumps(edits, sort_keys=True, default=str).encode()).hexdigest()[:10]


def apply_edits(text: str, edits) -> Applied:
    """Apply `edits` (a list of find/replace objects and diffs, or one diff string) to `text`."""
    if isinstance(edits, str | dict):
        edits = [edits]
    if not isinstance(edits, list) or not edits:
        raise EditError("edits must be a non-empty list of {find, replace} or {diff} objects")
    if len(edits) > MAX_EDITS:
        raise EditError(f"{len(edits)} edits; at most {MAX_EDITS} in one call")
    notes: list[str] = []
    for i, e in enumerate(edits, 1):
        if isinstance(e, str):
            e = {"diff": e}
        if not isinstance(e, dict):
            raise EditError(f"edit {i} must be an object, got {type(e).__name__}")
        if "diff" in e:
            if not isinstance(e["diff"], str) or not e["diff"].strip():
                raise EditError(f"edit {i}: diff must be a non-empty string")
            text = _apply_diff(text, e["diff"], i, notes)
        elif "find" in e:
            find, repl = e.get("find"), e.get("replace", "")
            if not isinstance(find, str) or not find:
                raise EditError(f"edit {i}: find must be a non-empty string")
            if not isinstance(repl, str):
                raise EditError(f"edit {i}: replace must be a string")
            text = _apply_find(text, find, repl, i, notes)
        else:
            raise EditError(f"edit {i} has neither find/replace nor diff (keys: {sorted(e)})")
    summary = json.dumps(edits, default=str)
    if len(summary) > 4000:
        summary = summary[:4000] + f"... ({len(summary)} characters)"
    return Applied(text, tuple(notes), edit_digest(edits), summary)


def _apply_find(text: str, find: str, repl: str, i: int, notes: list[str]) -> str:
    n = text.count(find)
    if n == 1:
        return text.replace(find, repl, 1)
    if n > 1:
        lines = _line_numbers(text, find)
        raise EditError(
            f"edit {i}: find {_show(find, 80)} occurs {n} times (lines {lines}); include more "
            "surrounding lines so it occurs once"
        )
    # whitespace-insensitive, line by line
    want = [_norm(x) for x in find.strip("\n").split("\n")]
    lines = text.split("\n")
    hits = _match_lines(lines, want)
    if len(hits) == 1:
        at = hits[0]
        # the matched block is whole lines: it is replaced by the replacement's lines
        new = repl.strip("\n").split("\n") if repl.strip("\n") else []
        out = lines[:at] + new + lines[at + len(want) :]
        notes.append(f"edit {i}: matched line {at + 1} ignoring spaces and tabs")
        return "\n".join(out)
    if len(hits) > 1:
        raise EditError(
            f"edit {i}: find {_show(find, 80)} is absent as written and matches "
            f"{len(hits)} places ignoring whitespace (lines {[h + 1 for h in hits[:10]]}); "
            "include more surrounding lines"
        )
    raise EditError(f"edit {i}: find {_show(find, 80)} does not occur. {_nearest(lines, want)}")


def _line_numbers(text: str, find: str) -> list[int]:
    out, start = [], 0
    while len(out) < 10:
        k = text.find(find, start)
        if k < 0:
            break
        out.append(text.count("\n", 0, k) + 1)
        start = k + 1
    return out


def _match_lines(lines: list[str], want: list[str], near: int | None = None) -> list[int]:
    """Start indices where `want` (normalised lines) matches; at `near` alone if it does there."""
    if not want:
        return []
    n = len(want)
    if near is not None and 0 <= near <= len(lines) - n:
        if all(_norm(lines[near + j]) == want[j] for j in range(n)):
            return [near]
    first = want[0]
    return [
        k
        for k in range(len(lines) - n + 1)
        if _norm(lines[k]) == first and all(_norm(lines[k + j]) == want[j] for j in range(1, n))
    ]


def _nearest(lines: list[str], want: list[str]) -> str:
    """Where the first wanted line (or its longest prefix of words) is, to help the model."""
    if not want or not want[0]:
        return ""
    head = want[0]
    for k, line in enumerate(lines):
        if _norm(line) == head:
            return (
                f"Its first line is at line {k + 1}, but the lines after it differ: the kernel "
                f"has {_show(lines[k + 1] if k + 1 < len(lines) else '')} next."
            )
    return "Read the kernel again (read_kernel or search_kernel) and copy the lines exactly."


def _parse_hunks(diff: str, i: int) -> list[tuple[int, list[str], list[str], str]]:
    """(old start line, old lines, new lines, header) per hunk."""
    hunks = []
    cur = None
    for raw in diff.split("\n"):
        if raw.startswith(("--- ", "+++ ")) and cur is None:
            continue
        m = _HUNK.match(raw)
        if m:
            cur = (int(m.group(1)), [], [], raw.strip())
            hunks.append(cur)
            continue
        if cur is None:
            if raw.strip():
                raise EditError(f"edit {i}: the diff must start with an @@ -a,b +c,d @@ header")
            continue
        if raw.startswith("\\"):  # "\ No newline at end of file"
            continue
        tag, body = (raw[:1], raw[1:]) if raw else (" ", "")
        if tag == " ":
            cur[1].append(body)
            cur[2].append(body)
        elif tag == "-":
            cur[1].append(body)
        elif tag == "+":
            cur[2].append(body)
        else:
            raise EditError(
                f"edit {i}: in hunk {cur[3]}, line {_show(raw, 60)} starts with neither ' ', "
                "'-' nor '+'"
            )
    if not hunks:
        raise EditError(f"edit {i}: no @@ hunk header in the diff")
    for _, old, new, header in hunks:
        # a trailing empty context line is what splitting a diff ending in a newline leaves
        while old and new and old[-1] == "" and new[-1] == "":
            old.pop()
            new.pop()
        if not old:
            raise EditError(f"edit {i}: hunk {header} has no context or '-' lines to place it by")
    return hunks


def _apply_diff(text: str, diff: str, i: int, notes: list[str]) -> str:
    lines = text.split("\n")
    offset = 0  # lines added by earlier hunks of this diff
    for h, (start, old, new, header) in enumerate(_parse_hunks(diff, i), 1):
        want = [_norm(x) for x in old]
        near = start - 1 + offset
        hits = _match_lines(lines, want, near=near)
        if len(hits) != 1:
            got = lines[max(near, 0) : max(near, 0) + min(len(old), 4)]
            where = (
                f"{len(hits)} places (lines {[k + 1 for k in hits[:10]]})" if hits else "nowhere"
            )
            raise EditError(
                f"edit {i}, hunk {h} ({header}) does not apply: its context and '-' lines match "
                f"{where}. It expected at line {start}: {_show(old[0])}; the kernel has there: "
                f"{_show(got[0] if got else '(end of kernel)')}. Read those lines again and "
                "resend the hunk."
            )
        at = hits[0]
        if at != near:
            notes.append(f"edit {i}, hunk {h}: applied at line {at + 1}, not {start}")
        lines = lines[:at] + new + lines[at + len(old) :]
        offset += len(new) - len(old)
    return "\n".join(lines)


def page(text: str, start_line: int = 1, n_lines: int = DEFAULT_PAGE_LINES) -> str:
    """Lines `start_line`.. of `text` (1-based), at most `n_lines` and PAGE_CHARS characters,
    after a header that says which lines these are, of how many, and where the next page starts.
    Never cut silently: a page that the character budget shortened says so."""
    lines = text.split("\n")
    total = len(lines)
    start = max(1, int(start_line))
    n = max(1, min(int(n_lines), MAX_PAGE_LINES))
    if start > total:
        return f"(the kernel has {total} lines; start_line {start} is past its end)"
    out: list[str] = []
    size = 0
    k = start - 1
    while k < total and len(out) < n:
        add = len(lines[k]) + 1
        if out and size + add > PAGE_CHARS:
            break
        out.append(lines[k])
        size += add
        k += 1
    end = start + len(out) - 1
    head = f"[lines {start}-{end} of {total} ({len(text)} characters)"
    if end < total:
        why = (
            f"; shortened from {n} lines to stay under {PAGE_CHARS} characters"
            if len(out) < n
            else ""
        )
        head += f"{why}; next page: start_line={end + 1}]"
    else:
        head += "; end of kernel]"
    return head + "\n" + "\n".join(out)


def search(text: str, needle: str, max_hits: int = MAX_SEARCH_HITS) -> str:
    """Lines holding `needle` (plain text, case-sensitive), as `line: text`, at most `max_hits`
    with a count of the rest."""
    if not needle:
        raise EditError("text to search for must be non-empty")
    lines = text.split("\n")
    hits = [(k + 1, line) for k, line in enumerate(lines) if needle in line]
    cap = max(1, min(int(max_hits), MAX_SEARCH_HITS))
    out = [f"{len(hits)} lines of {len(lines)} hold {_show(needle, 60)}"]
    out += [f"{k}: {line[:300]}" for k, line in hits[:cap]]
    if len(hits) > cap:
        out.append(f"... {len(hits) - cap} more; search a longer text to narrow it")
    return "\n".join(out)


def entry_of(ptx: str) -> str | None:
    m = re.search(r"\.entry\s+([A-Za-z_$][\w$]*)", ptx)
    return m.group(1) if m else None


__all__ = [
    "CHARS_PER_TOKEN",
    "MAX_KERNEL_CHARS",
    "PAGE_CHARS",
    "Applied",
    "EditError",
    "apply_edits",
    "edit_digest",
    "entry_of",
    "page",
    "search",
]
