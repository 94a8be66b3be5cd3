"""A ``records`` event (format 1.2) declares more kinds whether the reader decodes it as the
typed Records struct (this version) or as an unknown kind (a reader without it)."""

from __future__ import annotations

import msgspec

from kvdiag.analysis.judgement import Judge
from kvdiag.model import events as ev

LINE = b'{"kind":"records","seq":1,"t_ns":0,"step":0,"kinds":["write","upload.bytes"]}'


def header(records: tuple[str, ...]) -> ev.Header:
    return ev.Header(format="kvtrace", version="1.2", kvdiag_version="t", created="t",
                     backend="t", device=ev.Device(name="t"), scenario={}, records=records)


def test_a_typed_records_event_adds_to_the_declaration() -> None:
    e = msgspec.json.Decoder(ev.AnyEvent).decode(LINE)
    assert type(e) is ev.Records
    judge = Judge(header(("read",)))
    judge.feed(e)
    assert judge.completeness.declared == ["read", "write", "upload.bytes"]
    kinds = {k.kind: k.recorded for k in judge.snapshot().completeness.kinds}
    assert kinds["write"] and kinds["upload"] and not kinds["output"]


def test_an_unknown_records_event_declares_the_same() -> None:
    raw = msgspec.json.decode(LINE)
    e = ev.Unknown("records", 1, 0, 0, {"kinds": raw["kinds"]})
    judge = Judge(header(("read",)))
    judge.feed(e)
    assert judge.completeness.declared == ["read", "write", "upload.bytes"]


def _slot_read_run(judge: Judge) -> list[str]:
    """A write, its upload into pool slot 3, a read served from that slot: the not-recorded
    findings' kinds."""
    judge.feed_all([
        ev.Step(1, 0, 0, phase="decode", streams=(0,), tokens=1, n_kv=256),
        ev.Write(2, 0, 0, layer=0, stream=0, cells=(0, 1), rows=(0, 1)),
        ev.Upload(3, 0, 0, layer=0, stream=0, pages=(0, 1), slot=3, target="resident",
                  bytes=1, reason="miss"),
        ev.Read(4, 0, 0, layer=0, stream=0, pool=1, ring=0, host=0,
                served=(ev.Served(0, 1, "pool", 3),)),
    ])
    return [str(f.details["what"]) for f in judge.snapshot().findings
            if f.rule == "not-recorded"]


def test_a_declaration_without_invalidate_says_what_a_clear_would_hide() -> None:
    """GIVEN a fork whose header declares what it records WHEN it leaves out invalidate and
    reads pages from slots THEN an info finding says a cleared slot would still look loaded;
    a declaration with invalidate, or a trace that declares nothing (a run may never clear its
    cache), says nothing of it."""
    base = ("step", "fits", "write", "upload", "read", "output")
    without = Judge(header(base))
    assert "invalidate" in _slot_read_run(without)
    (f,) = [f for f in without.snapshot().findings if f.details.get("what") == "invalidate"]
    assert "cleared slot still looks loaded" in f.title and "declared by the writer" in f.title
    assert "invalidate" not in _slot_read_run(Judge(header((*base, "invalidate"))))
    undeclared = ev.Header(format="kvtrace", version="1.1", kvdiag_version="t", created="t",
                           backend="t", device=ev.Device(name="t"), scenario={})
    assert "invalidate" not in _slot_read_run(Judge(undeclared))
