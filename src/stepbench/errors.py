"""The one exception type that means "the user asked for something we cannot do", and how an
error's text is shortened to one line wherever stepbench shows it.

The CLI turns a UserError into one line on stderr and exit code 2 (or the error's own
`exit_code`), with no traceback; every other exception is a bug and keeps its traceback.
"""

from __future__ import annotations


class UserError(Exception):
    """Bad input. The message names the fix, e.g. "unknown attention 'sdp'; choose one of: ..."."""


def first_line(text: str | None, limit: int = 200, last: bool = False) -> str:
    """The first (or, with `last`, the last) non-empty line of `text`, stripped, cut to `limit`
    characters with "..." at the end; "" when there is none. An exception's first line names
    it; a crash's stderr ends in the line that says why it died."""
    lines = [line.strip() for line in str(text or "").splitlines() if line.strip()]
    if not lines:
        return ""
    line = lines[-1] if last else lines[0]
    if len(line) <= limit:
        return line
    cut = line[:limit - 3]
    space = cut.rfind(" ")
    if space >= limit * 3 // 4:      # a word boundary near the end: cut there, not mid-word
        cut = cut[:space]
    return cut.rstrip(" ,;:(") + "..."
