"""Name, version and file extension of the kvdiag trace format, and the compatibility rule.

Versions are ``"MAJOR.MINOR"`` (docs/trace-format.md, "Versioning"): a newer MINOR only adds
event kinds or optional fields, so this reader accepts it and keeps what it does not know; a
different MAJOR may change the meaning of existing fields, so it is refused.
"""

from __future__ import annotations

import re

from kvdiag.errors import InputError

FORMAT_NAME = "kvtrace"
FORMAT_MAJOR = 1
FORMAT_MINOR = 3
FORMAT_VERSION = f"{FORMAT_MAJOR}.{FORMAT_MINOR}"
EXTENSION = ".kvtrace"

_VERSION_RE = re.compile(r"(\d{1,6})\.(\d{1,6})")


def parse_version(text: object) -> tuple[int, int]:
    """``"1.3"`` → ``(1, 3)``; anything else is an :class:`InputError`."""
    match = _VERSION_RE.fullmatch(text) if isinstance(text, str) else None
    if match is None:
        raise InputError(f"trace header has an invalid format version {text!r} (want MAJOR.MINOR)")
    return int(match.group(1)), int(match.group(2))


def check_compatible(version: tuple[int, int]) -> bool:
    """Return True when ``version`` is newer in MINOR than ours (extras must be kept).

    Raises :class:`InputError` when the MAJOR differs: a newer major may have changed what
    existing fields mean, and an older one predates this format.
    """
    major, minor = version
    text = f"{major}.{minor}"
    if major > FORMAT_MAJOR:
        raise InputError(
            f"trace format {text} is newer than this kvdiag understands "
            f"({FORMAT_MAJOR}.x); upgrade kvdiag"
        )
    if major < FORMAT_MAJOR:
        raise InputError(
            f"trace format {text} is older than this kvdiag understands ({FORMAT_MAJOR}.x)"
        )
    return minor > FORMAT_MINOR


def looks_like_trace(head: bytes) -> bool:
    """Do a file's first bytes start a kvtrace header (line 1, a JSON object naming the
    format)? Used to tell a trace from a server log before reading either."""
    head = head.lstrip(b"\xef\xbb\xbf")
    return head.startswith(b'{"format":"kvtrace"') or (
        head.startswith(b"{") and b'"kvtrace"' in head.split(b"\n", 1)[0])
