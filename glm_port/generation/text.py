"""Text that came in as bytes (arguments, stdin, files) checked for UTF-8 before a tokenizer sees it.

Python hands undecodable bytes over as lone surrogates (``surrogateescape``: arguments always, stdin under
the C / C.UTF-8 locales) or raises ``UnicodeDecodeError`` (stdin under other UTF-8 locales). The commands
make stdin ``surrogateescape`` too (``tolerant_stdin``) and then name the first bad byte in one line
(``bad_utf8``) instead of letting the tokenizer fail with a TypeError.
"""

from __future__ import annotations

import io
import sys


def bad_utf8(text: str) -> str | None:
    """None when ``text`` decoded from valid UTF-8; else where it did not (``"byte 0xff at character 3"``)."""
    for position, char in enumerate(text, 1):
        if "\udc80" <= char <= "\udcff":  # surrogateescape's stand-in for one undecodable byte
            return f"byte 0x{ord(char) - 0xdc00:02x} at character {position}"
        if "\ud800" <= char <= "\udfff":
            return f"a lone surrogate (U+{ord(char):04X}) at character {position}"
    return None


def tolerant_stdin(stream=None):
    """``stream`` (default ``sys.stdin``) reading undecodable bytes as surrogates (checked with ``bad_utf8``)
    rather than raising mid-read; a stream that cannot be reconfigured is returned as it is."""
    stream = sys.stdin if stream is None else stream
    if isinstance(stream, io.TextIOWrapper) and stream.errors != "surrogateescape":
        try:
            stream.reconfigure(errors="surrogateescape")
        except (ValueError, io.UnsupportedOperation):  # already read from with a pending decoder: keep it
            pass
    return stream
