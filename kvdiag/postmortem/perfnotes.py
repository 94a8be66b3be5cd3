"""The lines ``kvdiag perf`` reads besides the slot lines: boot configuration, ``kv_stream_adapt``
partition and trace lines, fallback warnings, ``fits=false`` (found by the rare anchors,
:data:`~kvdiag.postmortem.timinglines.RARE_ANCHORS`), cleaned and parsed with the post-mortem
grammar; what they make of a run: its boots, the partition's pages by depth, and the notes that
belong to the requests in flight when they are logged (:mod:`kvdiag.postmortem.perfscan`, whose
scanner these methods are part of)."""

from __future__ import annotations

from kvdiag.model.logrecords import ConfigItem, FitsLine, LogLine, Problem, StreamEvent
from kvdiag.model.perf import AdaptPages, NoteKind, StreamNote
from kvdiag.postmortem import grammar
from kvdiag.postmortem.bootfold import RESTART_KEYS, BootAccumulator
from kvdiag.postmortem.lines import clean
from kvdiag.postmortem.perfpending import Pending

MAX_NOTES = 100_000
"""Discrete kv-stream lines kept; more are counted (``notes_dropped``), not kept."""
MAX_PROBLEMS = 100
_NOTE_OF_STREAM: dict[str, NoteKind] = {
    "feedback_error": "feedback", "layout_error": "layout", "warning": "warning",
    "alloc_failure": "warning",
}


class OtherLines:
    """The scanner's reading of the other lines (mixed into
    :class:`~kvdiag.postmortem.perfscan.PerfScanner`, which sets these attributes)."""

    source: str
    continuation: bool
    carried_config: list[ConfigItem]
    boot_notes: int | None
    first_active_line: int | None
    notes: list[StreamNote]
    notes_dropped: int
    adapt: AdaptPages
    boot: BootAccumulator
    problems: list[Problem]
    _pending: dict[int, Pending]
    _boot_index: int
    _served: bool
    _last_active: int | None

    def _end_boot(self, ended: str = "boot") -> None:
        raise NotImplementedError  # the scanner's: it closes the requests in flight

    def _rare(self, raw: bytes, line: int) -> None:
        text, _level = clean(raw)
        where = LogLine(self.source, line, text)
        for rec in grammar.classify(where, text):
            if isinstance(rec, ConfigItem):
                self._config(rec)
            elif isinstance(rec, StreamEvent):
                self._stream(rec)
            elif isinstance(rec, FitsLine):
                self._note(StreamNote(self.source, line, self._boot_index, "fits-false",
                                      message=text[:200], depth=self._last_active))
        if grammar.is_fallback_warning(text) and "fits=false" not in text:
            self._note(StreamNote(self.source, line, self._boot_index, "fallback",
                                  message=text[:200], depth=self._last_active,
                                  layer=grammar.layer_of(text)))

    def _config(self, item: ConfigItem) -> None:
        if self.continuation and not self.boot.boots:
            # the boot before this part of the log goes on, unless a new one starts here: a
            # new context is constructed (the other restart keys start a boot only after a
            # ready boot, which the part before knows; it is handed these lines)
            if item.key != "construct":
                self.carried_config.append(item)
                return
            self.boot_notes = len(self.notes)
            self.boot.add(item)
            self._end_boot()
            self._boot_index += 1
            self._served = False
            self._last_active = None
            return
        if item.key in RESTART_KEYS and self._served and self.boot.boots:
            # requests were served, so that boot was ready (its ready line may not be one
            # this reader looks for: 2023's "llama server listening at"): a new context now
            # is a new server start
            self.boot.add(ConfigItem(where=item.where, key="ready", value=True))
        if self.boot.add(item):
            if self.boot.boots and len(self.boot.boots) > 1:
                self._end_boot()
                self._boot_index += 1
            self._served = False
            self._last_active = None

    def _stream(self, rec: StreamEvent) -> None:
        v = rec.values
        line = rec.where.line
        if rec.kind == "trace" and {"active", "resident", "ring"} <= v.keys():
            active = int(v["active"])
            if self.continuation and self.first_active_line is None and not self.boot.boots:
                self.first_active_line = line
            self._last_active = active
            self.adapt.add(self._boot_index, line, active, int(v["resident"]), int(v["ring"]),
                           _int(v.get("samples")), _int(v.get("misses")), v.get("copy_busy"),
                           _int(v.get("peak")), _int(v.get("layout")))
        elif rec.kind == "repartition":
            self._note(StreamNote(
                self.source, line, self._boot_index, "repartition", message=rec.message[:200],
                depth=self._last_active,
                resident=(int(v["resident_from"]), int(v["resident_to"])),
                ring=(int(v["ring_from"]), int(v["ring_to"])), miss_pct=v.get("miss_pct"),
                busy_pct=v.get("copy_busy_pct")))
        elif rec.kind == "trace" and "resident_pages/layer" in v and "ring_slots" in v:
            now = (int(v["resident_pages/layer"]), int(v["ring_slots"]))
            self._note(StreamNote(self.source, line, self._boot_index, "repartition",
                                  message=rec.message[:200], depth=self._last_active,
                                  resident=(now[0], now[0]), ring=(now[1], now[1])))
        elif rec.kind in _NOTE_OF_STREAM:
            self._note(StreamNote(self.source, line, self._boot_index,
                                  _NOTE_OF_STREAM[rec.kind], message=rec.where.text[:200],
                                  depth=self._last_active))

    def _note(self, note: StreamNote) -> None:
        if len(self.notes) >= MAX_NOTES:
            self.notes_dropped += 1
            return
        index = len(self.notes)
        self.notes.append(note)
        for p in self._pending.values():
            if p.stopped is None:
                p.notes.append(index)

    def _problem(self, message: str, line: int | None) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(Problem(source=self.source, message=message, line=line))


def _int(value: float | None) -> int | None:
    return None if value is None else int(value)
