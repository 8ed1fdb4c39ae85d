"""What an upload may be, for the upload form and the API alike: size limits, the kernel file
extensions, and text checks that need no spec (encoding, NUL bytes, control characters). Each
check raises a ValidationError that says what is wrong."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError

MANIFEST_MAX_BYTES = 64 * 1024
BASELINE_MAX_BYTES = 512 * 1024
BASELINE_EXTENSIONS = {".ptx": "ptx", ".cu": "cuda", ".cuh": "cuda"}


def decode_text(data: bytes, *, what: str, max_bytes: int) -> str:
    """Bytes from an upload to text, or a ValidationError that says what is wrong with them."""
    if len(data) > max_bytes:
        raise ValidationError(
            f"The {what} is {len(data):,} bytes; the limit is {max_bytes:,} bytes."
        )
    if not data.strip():
        raise ValidationError(f"The {what} is empty.")
    if b"\x00" in data:
        raise ValidationError(f"The {what} contains NUL bytes: it looks like a binary file.")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValidationError(
            f"The {what} is not UTF-8 text (byte {exc.start} cannot be decoded)."
        ) from None
    return check_text(text, what=what)


_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def check_text(text: str, *, what: str) -> str:
    if "\x00" in text:
        raise ValidationError(f"The {what} contains NUL bytes: it looks like a binary file.")
    match = _CONTROL.search(text)
    if match:
        line = text.count("\n", 0, match.start()) + 1
        raise ValidationError(
            f"The {what} contains a control character (0x{ord(match.group()):02x}) on line "
            f"{line}; upload plain text."
        )
    return text
