"""What a trace reader found wrong with a file, line by line.

A problem never stops reading (docs/trace-format.md, "Damage and truncation"): the reader skips
or keeps the line as described for each kind and carries on.
"""

from __future__ import annotations

from typing import Literal

import msgspec

ProblemKind = Literal[
    "truncated",  # the last line has no newline and does not decode: the writer was killed
    "corrupt",  # a complete line that is not JSON or not a valid event: skipped
    "unknown-kind",  # a kind this version does not know in a same-version file: kept as Unknown
    "sequence",  # seq not strictly greater than the previous event's: the event is kept
    "after-end",  # an event after the End event: kept
    "count",  # the End event's event count differs from the event lines present
    "incomplete",  # no End event: the capture did not finish (killed or still running)
    "gap",  # a segment set misses segments (or events) between two it holds
    "segment",  # a file that looks like a segment of the set but is left out (another run)
]


class Problem(msgspec.Struct, frozen=True):
    """One problem at 1-based ``line`` of the file (the header is line 1)."""

    line: int
    kind: ProblemKind
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.kind}: {self.message}"
