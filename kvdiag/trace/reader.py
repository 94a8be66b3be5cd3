"""Streaming reader of ``.kvtrace`` files (format v1, docs/trace-format.md).

Memory stays bounded by the chunk size and the longest line (``max_line``), whatever the file
size. The fast path hands a whole chunk of complete lines to ``msgspec``'s ``decode_lines`` over
the tagged union of event Structs; a chunk that fails to decode, holds a blank line, the End
event or a sequence break is decoded again line by line, which is where problems are found and
given line numbers. Files of a newer minor version always take the line-by-line path, because
each line is also decoded as plain JSON to keep the fields this version does not know.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import msgspec

from kvdiag import compiled
from kvdiag.errors import InputError
from kvdiag.files.inputs import STDIN_NAME, open_input
from kvdiag.model.events import KNOWN_KINDS, AnyEvent, End, Header, Unknown
from kvdiag.trace.extras import extra_fields
from kvdiag.trace.problems import Problem, ProblemKind
from kvdiag.trace.segments import SetInfo, open_trace
from kvdiag.trace.version import FORMAT_NAME, check_compatible, parse_version

TraceItem = AnyEvent | Unknown

# Small chunks measured fastest (benchmarks/bench_trace_io.py): decode_lines builds one list
# per chunk, and a list of thousands of fresh objects costs the cyclic GC far more than a few
# dozen that die young; 32 KiB is about 150 events.
CHUNK_SIZE = 32 << 10
SLICE = CHUNK_SIZE
"""Bytes a caller's block is decoded at a time (:meth:`TraceReader.decode_scanning`): the
decoder makes a list of fresh objects per call, and a list of thousands costs the cyclic GC far
more than a few hundred that die young."""
MAX_LINE = 64 << 20
# What a bad line can make msgspec raise: malformed JSON or wrong types (MsgspecError),
# invalid UTF-8 (UnicodeDecodeError, a ValueError) and absurd nesting (RecursionError).
_DECODE_ERRORS = (msgspec.MsgspecError, ValueError, RecursionError)
_COMMON = ("seq", "t_ns", "step")
_json_decode = msgspec.json.decode
_SEQ = operator.attrgetter("seq")
# Integers are 64-bit on both writers (kvtrace.h writes int64/uint64; pointers are unsigned),
# while msgspec decodes any JSON integer into a Python int of any size; one beyond this range
# later breaks float conversion and encoding (issue 11 #19), so such a line is a problem.
INT_MIN = -(1 << 63)
INT_MAX = (1 << 64) - 1
# Any integer outside the range has at least 19 digits; text without such a digit run (almost
# all) skips the exact check. Mapping every digit to "0" and searching for 19 of them runs at
# C speed (about 1 ms per MB, where a regular expression took 16).
_DIGITS_TO_ZERO = bytes(48 if 48 <= i <= 57 else i for i in range(256))
_NINETEEN_DIGITS = b"0" * 19


def _long_digits(text: bytes) -> bool:
    return text.translate(_DIGITS_TO_ZERO).find(_NINETEEN_DIGITS) >= 0


_BLOCKSCAN = Path(__file__).with_name("blockscan.c")
_I64 = -(1 << 63)


def _lines_and_digits(block: bytes) -> tuple[int, bool | None]:
    """How many lines end in ``block``, and whether it holds 19 digits in a row: in one C pass
    (``blockscan.c``, built by :mod:`kvdiag.compiled`; a third of the reading of a block
    besides decoding it, measured) where a compiler is at hand; else the count, and None for
    the digits (:func:`_long_digits` then, where they matter)."""
    c = compiled.load(_BLOCKSCAN, f"{__package__}._blockscan")
    if c is None:
        return block.count(b"\n"), None
    lines, digits = c.scan(block)
    return lines, digits


Scan = Callable[[bytes, int, int], tuple[int, int, int]]
"""A pass that reads lines' fields itself (the judgement's :meth:`Judge.scan
<kvdiag.analysis.judgement.judge.Judge.scan>`): ``scan(data, start, last_seq)`` takes lines of
``data`` from byte ``start`` whose seqs go on one by one from ``last_seq``, and returns
``(stop, count, resume)``: ``count`` lines taken up to byte ``stop``, where the first line it
declines begins; the lines from there to byte ``resume`` are the reader's to decode."""


def slices(block: bytes, size: int = SLICE) -> Iterator[bytes]:
    """``block`` (whole lines) cut after a newline about every ``size`` bytes."""
    start, n = 0, len(block)
    while start < n:
        if n - start <= size:
            yield block[start:]
            return
        cut = block.rfind(b"\n", start, start + size)
        if cut < 0:  # one line longer than the slice
            cut = block.find(b"\n", start + size)
            if cut < 0:
                yield block[start:]
                return
        yield block[start:cut + 1]
        start = cut + 1


def holds(items: Sequence[Any], types: tuple[type, ...]) -> tuple[bool, bool]:
    """Whether a decoded block (:meth:`TraceReader.decode_block`) holds a None (a line that is
    not an event), and whether it holds an event of one of ``types``: in one C pass by pointer
    (``blockscan.c``; ``None in items`` and a set of their types cost a tenth of the TUI's
    judging pass, measured on bench_tui's trace) where a compiler is at hand."""
    c = compiled.load(_BLOCKSCAN, f"{__package__}._blockscan")
    if c is None:
        return None in items, not frozenset(types).isdisjoint(map(type, items))
    none, typed = c.holds(items if isinstance(items, list) else list(items), types)
    return none, typed


class TraceReader:
    """Reads the header on construction; iterating yields events, once, in file order.

    Construction raises :class:`InputError` for anything that is not a readable v1 trace;
    damage after the header never raises, it is recorded in ``problems``.

    A segment set or a compressed file (:mod:`kvdiag.trace.segments`) is read through
    :meth:`open` like one file: ``segments`` describes the set (None otherwise), a problem's
    ``line`` counts the lines of the joined set and its message names the file and line.

    After (and during) iteration: ``problems``, ``truncated``, ``complete``, ``end``,
    ``lines_read`` (lines consumed, header included) and, for a file of a
    newer minor version, ``extras``: ``{seq: {path: value}}`` for fields of known kinds that
    this version does not declare (see :mod:`kvdiag.trace.extras`).
    """

    def __init__(
        self,
        stream: BinaryIO,
        name: str = "<stream>",
        *,
        chunk_size: int = CHUNK_SIZE,
        max_line: int = MAX_LINE,
        close_stream: bool = False,
    ) -> None:
        if not 0 < chunk_size <= max_line:
            raise ValueError("need 0 < chunk_size <= max_line")
        self.name = name
        self._stream = stream
        self._close_stream = close_stream
        self._chunk_size = chunk_size
        self._max_line = max_line
        self.problems: list[Problem] = []
        self.truncated = False
        self.end: End | None = None
        self.lines_read = 0
        self.extras: dict[int, dict[str, Any]] = {}
        self.header_extras: dict[str, Any] = {}
        self._last_seq = 0
        self._decode_lines = msgspec.json.Decoder(AnyEvent).decode_lines
        self._decode = msgspec.json.Decoder(AnyEvent).decode
        self._iterator: Iterator[TraceItem] | None = None
        self._finished = False
        self.segments: SetInfo | None = None
        self.header, self.version, self.newer_minor = self._read_header()
        seg = self.header.extra.get("segment")
        first = seg.get("first_seq") if isinstance(seg, dict) else None
        self._count_base = first - 1 if type(first) is int and first > 0 else 0
        """Events before this file's first (a segment, a flight recorder's window): the End
        event counts every event of the run."""

    @classmethod
    def open(cls, path: str | Path, **options: Any) -> TraceReader:
        """Open ``path`` (``"-"``: standard input); every failure to open or to recognise it
        is an :class:`InputError`.

        The file is closed when iteration reaches its end, or by ``close()`` / ``with``.
        """
        if str(path) == STDIN_NAME:
            # standard input: read, not closed (the process owns it)
            return cls(open_input(STDIN_NAME, stdin=True), "<stdin>", **options)
        opened = open_trace(Path(path))
        try:
            reader = cls(opened.stream, opened.name, close_stream=True, **options)
        except BaseException:
            opened.stream.close()
            raise
        reader.segments = opened.segments
        return reader

    @property
    def skipped_seqs(self) -> int:
        """Seqs lost in a segment set's gaps (0 for one file): what the End count allows for."""
        return int(getattr(self._stream, "skipped_seqs", 0))

    def allow_skipped(self, n: int) -> None:
        """Blocks decoded by :meth:`decode_block` come from a set with ``n`` seqs lost in its
        gaps (read by another reader): the End count allows for them."""
        self._count_base += n

    @property
    def version_text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    @property
    def complete(self) -> bool:
        """An End event was seen."""
        return self.end is not None

    @property
    def finished(self) -> bool:
        """Iteration reached the end of the file."""
        return self._finished

    def __iter__(self) -> Iterator[TraceItem]:
        if self._iterator is None:
            # chain flattens the per-chunk lists in C: no Python frame runs per event.
            self._iterator = itertools.chain.from_iterable(self._chunks())
        return self._iterator

    scans = True
    """:meth:`blocks` takes a ``scan`` (:data:`Scan`)."""

    def blocks(self, scan: Scan | None = None) -> Iterator[Sequence[TraceItem]]:
        """The events as the decoder makes them, a block (a few hundred) at a time: instead
        of iterating the reader, for a consumer that works on many events at once (the
        judgement: :meth:`kvdiag.analysis.judgement.Judge.feed_all`). ``scan``: the lines it
        reads itself are counted and checked here as if decoded, and never become events
        (:meth:`decode_scanning`)."""
        if self._iterator is not None:
            raise RuntimeError("the reader is being iterated already")
        self._iterator = iter(())
        return self._chunks(scan)

    def close(self) -> None:
        if self._close_stream:
            self._stream.close()

    def __enter__(self) -> TraceReader:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- header ---------------------------------------------------------------------------

    def _read_header(self) -> tuple[Header, tuple[int, int], bool]:
        name = self.name
        line = self._read(lambda: self._stream.readline(self._max_line))
        if not line:
            broken = getattr(self._stream, "broken", "")
            raise InputError(f"{name}: {broken}" if broken else
                             f"{name}: empty file, not a kvtrace trace")
        self.lines_read = 1
        if not line.endswith(b"\n") and len(line) >= self._max_line:
            raise InputError(f"{name}: not a kvtrace trace (no header line)")
        try:
            raw = _json_decode(line)
        except _DECODE_ERRORS:
            if not line.endswith(b"\n") and line.startswith(b'{"format":"kvtrace"'):
                raise InputError(f"{name}: truncated header, no events written") from None
            raise InputError(f"{name}: not a kvtrace trace (line 1 is not JSON)") from None
        huge = _huge_integer(line) if _long_digits(line) else None
        if huge is not None:
            raise InputError(f"{name}: invalid trace header: {huge}")
        if not isinstance(raw, dict) or raw.get("format") != FORMAT_NAME:
            raise InputError(f"{name}: not a kvtrace trace (line 1 is not a kvtrace header)")
        try:
            version = parse_version(raw.get("version"))
            newer_minor = check_compatible(version)
        except InputError as exc:
            raise InputError(f"{name}: {exc}") from None
        try:
            header = msgspec.convert(raw, Header)
        except msgspec.ValidationError as exc:
            raise InputError(f"{name}: invalid trace header: {exc}") from None
        if newer_minor:
            self.header_extras = extra_fields(header, raw)
        return header, version, newer_minor

    def _read(self, call: Callable[[], object]) -> bytes:
        try:
            data = call()
        except OSError as exc:
            raise InputError(f"{self.name}: read failed: {exc.strerror or exc}") from None
        if not isinstance(data, bytes | bytearray):
            raise InputError(f"{self.name}: not a binary stream")
        return bytes(data)

    # -- events ---------------------------------------------------------------------------

    def _chunks(self, scan: Scan | None = None) -> Iterator[Sequence[TraceItem]]:
        read = self._stream.read
        size = self._chunk_size
        parts: list[bytes] = []  # pieces of the line not yet ended by a newline
        pending = 0
        skipping = False  # inside a line longer than max_line
        while True:
            chunk = self._read(lambda: read(size))
            if not chunk:
                break
            if skipping:
                cut = chunk.find(b"\n")
                if cut < 0:
                    continue
                skipping = False
                chunk = chunk[cut + 1 :]
            cut = chunk.rfind(b"\n")
            if cut < 0:
                parts.append(chunk)
                pending += len(chunk)
                if pending > self._max_line:
                    self.lines_read += 1
                    self._problem(
                        self.lines_read,
                        "corrupt",
                        f"line longer than {self._max_line} bytes, skipped",
                    )
                    parts.clear()
                    pending = 0
                    skipping = True
                continue
            if parts:
                parts.append(chunk[: cut + 1])
                block = b"".join(parts)
                parts.clear()
            else:
                block = chunk[: cut + 1]
            rest = chunk[cut + 1 :]
            if rest:
                parts.append(rest)
            pending = len(rest)
            if scan is None:
                yield self._block(block)
                continue
            for items in self.decode_scanning(block, scan):
                events = [e for e in items if e is not None]
                if events:
                    yield events
        if skipping:
            self.truncated = True
        elif parts:
            tail = b"".join(parts)
            parts.clear()
            self.lines_read += 1
            event = self._line(tail, self.lines_read, last=True)
            if event is not None:
                yield [event]
        if self.end is None:
            seg = self.header.extra.get("segment")
            index = seg.get("index") if isinstance(seg, dict) else None
            self._problem(
                self.lines_read,
                "incomplete",
                f"no End event: the capture did not finish ({self.lines_read} lines read)"
                + (f"; or segment {index:06d} of a rotated trace, continued in the next one"
                   if type(index) is int and self.segments is None else ""),
            )
        broken = getattr(self._stream, "broken", "")
        if broken:  # a compressed file whose data breaks: read up to there
            self.truncated = True
            self._problem(self.lines_read, "truncated", broken)
        joined = getattr(self._stream, "problems", None)
        if joined:
            self.problems.extend(joined)
            self.problems.sort(key=lambda pr: pr.line)
        self._finished = True
        # A file opened by open() is closed once read to the end, so list(open(p)) leaks nothing.
        self.close()

    def _block(self, block: bytes) -> Sequence[TraceItem]:
        """Decode a run of complete lines (each ending in a newline)."""
        events = self._fast_block(block)
        if events is not None:
            return events
        return [e for e in self._slow_block(block) if e is not None]

    def _fast_block(self, block: bytes) -> Sequence[TraceItem] | None:
        """The whole run in one ``decode_lines`` call, when every line is a well-ordered event
        (None: decode it line by line)."""
        n, digits = _lines_and_digits(block)
        if not self.newer_minor and self.end is None and not (
                _long_digits(block) if digits is None else digits):
            try:
                events: Sequence[TraceItem] = self._decode_lines(block)
            except _DECODE_ERRORS:
                return None
            # decode_lines splits on any whitespace and skips blank lines, so one value per
            # newline is what proves the line numbers right. (Only a crafted file with a
            # blank line and a line of two events together would pass where the line-by-line
            # path reports both; the writer writes neither.)
            if len(events) == n and self._fast_accept(events):
                self.lines_read += n
                return events
        return None

    def _slow_block(self, block: bytes) -> list[TraceItem | None]:
        first = self.lines_read + 1
        lines = block.split(b"\n")
        lines.pop()
        out = [self._line(text, number, last=False) for number, text in enumerate(lines, first)]
        self.lines_read += len(lines)
        return out

    def decode_block(self, block: bytes) -> Sequence[TraceItem | None]:
        """Lines of this trace that the caller read itself (a viewer that indexes the same
        bytes), decoded as iterating the reader decodes them: one entry per line of ``block``,
        the event or None for a line that is not one (its problem recorded, numbered from the
        lines given so far). ``block`` is whole lines in file order, each ending in a newline
        except possibly the file's last line. Call :meth:`finish` after the last block; do not
        also iterate the reader."""
        cut = block.rfind(b"\n") + 1
        body, tail = block[:cut], block[cut:]
        out: Sequence[TraceItem | None] = []
        if body:
            fast = self._fast_block(body)
            out = fast if fast is not None else self._slow_block(body)
        if tail:
            self.lines_read += 1
            out = [*out, self._line(tail, self.lines_read, last=True)]
        return out

    def decode_scanning(self, block: bytes, scan: Scan | None
                        ) -> Iterator[Sequence[TraceItem | None]]:
        """:meth:`decode_block` of ``block`` a slice (:data:`SLICE`) at a time, but that the
        lines ``scan`` reads itself (:data:`Scan`, while :meth:`scan_from` allows) are counted
        here instead (:meth:`scanned`). Each line it declines, and the lines after it up to the
        next it may read, are decoded — at least a slice's worth where it read none, so that a
        trace whose lines it never reads costs it one declined line per slice."""
        n, pos = len(block), 0
        while pos < n:
            last = self.scan_from() if scan is not None else None
            if last is None:
                for piece in slices(block[pos:] if pos else block):
                    yield self.decode_block(piece)
                return
            assert scan is not None
            stop, count, resume = scan(block, pos, last)
            if count:
                self.scanned(count, last + count)
                pos = stop
                if pos >= n:
                    return
                end = resume
            else:
                cut = block.find(b"\n", pos + SLICE)
                end = max(resume, n if cut < 0 else cut + 1)
            for piece in slices(block[pos:end]):
                yield self.decode_block(piece)
            pos = end

    def scan_from(self) -> int | None:
        """The seq of the last event, where a caller may read the next lines' fields itself
        (:meth:`scanned`: the judgement's :mod:`~kvdiag.analysis.judgement.linescan`) on the
        terms of the fast path: no End yet, no fields of a newer minor version to keep, a
        64-bit seq. None: every line is this reader's to decode."""
        if self.newer_minor or self.end is not None or self._finished or not (
                _I64 <= self._last_seq < -_I64):
            return None
        return self._last_seq

    def scanned(self, lines: int, last_seq: int) -> None:
        """``lines`` whole lines, one event each numbered on one by one to ``last_seq``, were
        read by the caller's own pass from :meth:`scan_from`: counted as :meth:`decode_block`
        counts the lines it decodes."""
        self.lines_read += lines
        self._last_seq = last_seq

    def finish(self) -> None:
        """The caller of :meth:`decode_block` reached the end of the file: report a missing
        End event as iteration does."""
        if self.end is None and not self._finished:
            self._problem(
                self.lines_read,
                "incomplete",
                f"no End event: the capture did not finish ({self.lines_read} lines read)",
            )
        self._finished = True

    def _fast_accept(self, events: Sequence[TraceItem]) -> bool:
        """Accept a cleanly decoded chunk: seq strictly rising from the last one, no End (in
        one C pass, ``blockscan.c`` ``rising``, where a compiler is at hand and the seqs are
        64-bit integers; a tenth of decoding a block, measured)."""
        c = compiled.load(_BLOCKSCAN, f"{__package__}._blockscan")
        if c is not None and events and isinstance(events, list) and _I64 <= self._last_seq < -_I64:
            got = c.rising(events, self._last_seq, End)
            if got is not None:
                if got is False:
                    return False
                self._last_seq = got
                return True
        seqs = list(map(_SEQ, events))
        first = seqs[0]
        if first <= self._last_seq:
            return False
        # The writer numbers events consecutively, so comparing with a range (C speed) settles
        # almost every chunk; the pairwise test covers files with gaps in seq.
        if seqs != list(range(first, first + len(seqs))) and not all(
            map(operator.lt, seqs, itertools.islice(seqs, 1, None))
        ):
            return False
        if End in set(map(type, events)):
            return False
        self._last_seq = seqs[-1]
        return True

    def _line(self, text: bytes, number: int, *, last: bool) -> TraceItem | None:
        """Decode one line; record what is wrong with it; None when nothing can be kept."""
        event: TraceItem | None
        if not text.strip():
            self._problem(number, "corrupt", "empty line")
            return None
        if _long_digits(text):
            huge = _huge_integer(text)
            if huge is not None:
                self._problem(number, "corrupt", huge)
                return None
        try:
            event = self._decode(text)
        except _DECODE_ERRORS as exc:
            event = self._fallback(text, number, exc, last=last)
            if event is None:
                return None
        else:
            if self.newer_minor:
                self._keep_extras(event, text, number)
        self._accept(event, number)
        return event

    def _keep_extras(self, event: TraceItem, text: bytes, number: int) -> None:
        """Keep the fields of a newer minor version that ``event`` has no field for. The typed
        decode skips unknown keys without reading them, so a key or value that is not valid
        UTF-8 surfaces only here: the event is kept, the unknown fields are not, and the line
        is reported."""
        try:
            raw = _json_decode(text)
        except _DECODE_ERRORS as exc:
            self._problem(number, "corrupt", f"fields unknown to format {self.version_text} "
                          f"not kept ({exc}); the {_kind(event)} event itself is")
            return
        extras = extra_fields(event, raw)
        if extras:
            self.extras[event.seq] = extras

    def _fallback(
        self, text: bytes, number: int, error: BaseException, *, last: bool
    ) -> Unknown | None:
        """A line the typed decoder refused: an unknown kind, truncation or corruption."""
        try:
            raw = _json_decode(text)
        except _DECODE_ERRORS as exc:
            if last and not text.endswith(b"\n"):
                self.truncated = True
                self._problem(
                    number, "truncated", f"last line is cut short ({len(text)} bytes): {exc}"
                )
            else:
                self._problem(number, "corrupt", f"not JSON: {exc}")
            return None
        if not isinstance(raw, dict):
            self._problem(number, "corrupt", f"not a JSON object ({type(raw).__name__})")
            return None
        kind = raw.get("kind")
        if not isinstance(kind, str):
            self._problem(number, "corrupt", "no string 'kind' field")
            return None
        if kind in KNOWN_KINDS:
            self._problem(number, "corrupt", f"invalid {kind} event: {error}")
            return None
        seq, t_ns, step = (raw.get(key) for key in _COMMON)
        # type() is: JSON true/false decode to bool, which is an int subclass.
        if type(seq) is not int or type(t_ns) is not int or type(step) is not int:
            self._problem(
                number, "corrupt", f"event of unknown kind {kind!r} without integer seq/t_ns/step"
            )
            return None
        if not self.newer_minor:
            self._problem(
                number,
                "unknown-kind",
                f"kind {kind!r} is not part of format {self.version_text}; kept as unknown",
            )
        fields = {k: v for k, v in raw.items() if k != "kind" and k not in _COMMON}
        return Unknown(kind, seq, t_ns, step, fields)

    def _accept(self, event: TraceItem, number: int) -> None:
        """Sequence, End and counting checks for an event decoded on the slow path."""
        if event.seq <= self._last_seq:
            self._problem(
                number, "sequence", f"seq {event.seq} does not follow seq {self._last_seq}"
            )
        self._last_seq = event.seq
        if self.end is not None:
            self._problem(number, "after-end", f"event seq {event.seq} after the End event")
        if isinstance(event, End) and self.end is None:
            self.end = event
            # Lines between the header (line 1) and this End line, damaged ones included;
            # plus the events before a segment's first and in a set's gaps.
            present = number - 2 + self._count_base + getattr(self._stream, "skipped_seqs", 0)
            if event.events != present:
                self._problem(
                    number,
                    "count",
                    f"End reports {event.events} events but {present} event lines precede it",
                )

    def _problem(self, line: int, kind: ProblemKind, message: str) -> None:
        locate = getattr(self._stream, "locate", None)
        where = locate(line) if locate is not None else None
        if where is not None:
            message += f" ({where[0]} line {where[1]})"
        self.problems.append(Problem(line, kind, message))


def _kind(event: TraceItem) -> str:
    if isinstance(event, Unknown):
        return event.kind
    tag = type(event).__struct_config__.tag
    return tag if isinstance(tag, str) else type(event).__name__.lower()


def _huge_integer(text: bytes) -> str | None:
    """The first integer of a JSON line outside the 64-bit range, as a problem message."""
    try:
        raw = _json_decode(text)
    except _DECODE_ERRORS:
        return None  # not JSON: the caller's own decode reports it
    stack: list[tuple[str, object]] = [("", raw)]
    while stack:
        path, value = stack.pop()
        if type(value) is int and not INT_MIN <= value <= INT_MAX:
            # bit_length, not str(): Python refuses to print ints of over 4300 digits
            return (f"field {path or 'value'}: {'negative ' if value < 0 else ''}integer of "
                    f"{value.bit_length()} bits is outside the 64-bit range [-2^63, 2^64-1]")
        if isinstance(value, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v)
                         for k, v in reversed(list(value.items())))
        elif isinstance(value, list):
            stack.extend((f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value))))
    return None
