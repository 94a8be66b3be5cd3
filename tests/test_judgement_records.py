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
