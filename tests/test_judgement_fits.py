"""Fits decisions judged condition by condition: held, failed with the logged value, or not
evaluable and why — one predicate (kvdiag.model.fits) for the runtime model, check and the TUI.
"""

from __future__ import annotations

from kvdiag.analysis.judgement import Judge, outcome
from kvdiag.kvstream.fits import fits_tensors
from kvdiag.model import events as ev
from kvdiag.model.conditions import EXPLAIN
from kvdiag.model.fits import conditions
from kvdiag.model.geometry import Tensor
from tests.judged_captures import capture

UNKNOWN = (0, 0, 0, 0)


def imported_fits(seq: int, dst_ne: tuple[int, int, int, int]) -> ev.Fits:
    """A fits event as ``kvdiag import`` writes a log's ``fits=false`` line: dst's shape and
    the K/V runtimes and types, nothing else (docs/log-import.md)."""
    blank = Tensor("", "", UNKNOWN, UNKNOWN)
    return ev.Fits(seq, 0, 0, node="", layer=-1, q=blank,
                   k=Tensor("", "q8_0", UNKNOWN, UNKNOWN, data=0x10, buffer="CUDA_KV_Stream_Host",
                            runtime=0x55),
                   v=Tensor("", "q5_1", UNKNOWN, UNKNOWN, buffer="CUDA_KV_Stream_Host",
                            runtime=0x55),
                   dst=Tensor("", "f32", dst_ne, UNKNOWN, data=0x20), stage_bytes=475136,
                   result=False, route="fallback", evaluated=False, membership=True)


IMPORT_HEADER = ev.Header(format="kvtrace", version="1.1", kvdiag_version="0", created="",
                          backend="import", device=ev.Device("unknown"),
                          extra={"import": {"unknown": ["fits.q", "fits.mask"]}})


def test_an_imported_line_evaluates_what_its_geometry_gives() -> None:
    """dst.ne = {V.ne[0], Q.ne[2], Q.ne[1], Q.ne[3]} (ggml_flash_attn_ext): a dst ne[3] of 2
    fails Q.ne[3]==1, evaluated from the log; K's strides are not in it."""
    j = Judge(IMPORT_HEADER)
    v = j.fits_verdict(imported_fits(1, (256, 24, 1, 2)))
    state = {c.name: c for c in v.conditions}
    assert state["Q.ne[3]==1"].state == "failed"
    assert state["Q.ne[3]==1"].values == "Q.ne[3]=2 from dst.ne[3]"
    assert state["Q.ne[0]==256"].why == "Q.ne[0] not recorded"
    assert state["V.ne[0]==256"].state == "held"
    assert state["K.runtime!=NULL"].state == "held"
    assert state["K.nb[0]==type_size"].state == "unknown"
    assert state["K.nb[0]==type_size"].why == "K.nb not recorded"
    assert state["mask.type==f16"].why == "mask not recorded"
    assert v.by == "kvdiag" and v.failed == ("Q.ne[3]==1",)
    assert v.outcome == "fallback"


def test_the_finding_of_imported_lines_names_the_condition_and_the_layer_as_unknown() -> None:
    j = Judge(IMPORT_HEADER)
    j.feed_all([imported_fits(1, (256, 24, 1, 2)), imported_fits(2, (256, 24, 1, 2))])
    (f,) = [f for f in j.snapshot().findings if f.rule == "fallback"]
    assert "failed: Q.ne[3]==1 (Q.ne[3]=2 from dst.ne[3])" in f.title
    assert "evaluated by kvdiag from the logged geometry" in f.title
    assert "not evaluable" in f.title
    assert f.evidence[0].layer is None  # never "layer -1"
    assert "K.nb not recorded" in (f.evidence[0].text or "")
    assert f.details["conditions_from"] == "kvdiag" and f.details["count"] == 2


def test_a_line_with_nothing_to_evaluate_says_not_recorded() -> None:
    blank = Tensor("", "", UNKNOWN, UNKNOWN)
    e = ev.Fits(1, 0, 0, node="", layer=-1, q=blank, k=blank, v=blank, dst=blank,
                stage_bytes=0, result=False, route="fallback", evaluated=False)
    j = Judge(IMPORT_HEADER)
    v = j.fits_verdict(e)
    # only the runtime checks read what is always known (null or not)
    assert {c.name for c in v.conditions if c.state != "unknown"} == {
        "K.runtime!=NULL", "V.runtime!=NULL"}
    assert next(c for c in v.conditions if c.name == "sinks==NULL").why == "sinks not recorded"
    assert v.failed == ("K.runtime!=NULL", "V.runtime!=NULL") and v.by == "kvdiag"


def test_the_model_and_the_judgement_use_one_predicate_with_known_names() -> None:
    events = capture("two-slot-concurrent", "shared", "membership", False)
    fits = [e for e in events if isinstance(e, ev.Fits)]
    j = Judge()
    for e in fits:
        conds = conditions(e.q, e.k, e.v, e.mask, e.stage_bytes, True, False, dst=e.dst)
        assert {c.name for c in conds} <= set(EXPLAIN)
        assert tuple(c.name for c in conds if c.state == "failed") == e.failed
        assert fits_tensors(e.q, e.k, e.v, e.mask, e.stage_bytes).failed == e.failed
        assert j.fits_verdict(e).failed == e.failed
    assert [outcome(e) for e in fits] == ["mismatch"]


def test_a_bool_only_writer_is_evaluated_and_a_disagreeing_bool_noted() -> None:
    events = capture("two-slot-concurrent", "shared", "membership", False)
    e = next(x for x in events if isinstance(x, ev.Fits))
    import msgspec

    liar = msgspec.structs.replace(e, failed=(), evaluated=False, result=True,
                                   route="fallback")
    v = Judge().fits_verdict(liar)
    assert v.by == "kvdiag" and v.failed == e.failed
    assert v.note == "the writer's predicate returned true, the model's false"
