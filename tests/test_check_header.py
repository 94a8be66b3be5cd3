"""The check report's header lines say what the trace's header knows and nothing else: a model
trace's shape comes from its config, a native trace's from its plan, unknowns are left out."""

from __future__ import annotations

import io

from rich.console import Console

from kvdiag.model.events import Device, Header
from kvdiag.report.check import header_table


def render(header: Header) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(header_table("t.kvtrace", header))
    return out.getvalue()


def test_a_native_header_takes_the_shape_from_its_plan() -> None:
    h = Header(format="kvtrace", version="1.1", kvdiag_version="kvtrace.h 1.1",
               created="2026-12-01T00:00:00+00:00", backend="native", device=Device("H200"),
               scenario={"name": "kvdemo", "config": {"np": 2, "kv_unified": False,
                                                      "layout": "shared", "dispatch": "fits"}},
               plan={"layers": 4, "streamed_layers": 2, "type_k": "q8_0", "type_v": "q5_1",
                     "stage_bytes": 12 << 20, "page_bytes": 475136, "pool_pages": 18,
                     "resident_pages_per_layer": 4, "ring_slots": 10})
    text = render(h)
    assert ("runtime   np 2, 4 layers, 2 streamed, K q8_0 / V q5_1, stage 12 MiB, layout shared, "
            "dispatch fits") in text
    lines = [line.rstrip() for line in text.splitlines()]
    assert "pool      18 pages of 475136 B: 4 resident/layer + 10 ring slots" in lines
    assert "None" not in text


def _per_stream(resident: int) -> Header:
    return Header(format="kvtrace", version="1.2", kvdiag_version="kvtrace.h 1.2",
                  created="2026-12-01T00:00:00+00:00", backend="native", device=Device("cpu"),
                  scenario={"name": "kvrt", "config": {"np": 2, "layout": "per-stream"}},
                  plan={"layers": 3, "n_stream": 2, "page_bytes": 2080, "pool_pages": 16,
                        "resident_pages_per_layer": resident, "ring_slots": 4})


def test_per_stream_pool_says_each_streams_window() -> None:
    """3 layers x 4 resident slots + 4 ring = 16: each (layer, stream) view gets 4 / 2 = 2."""
    text = render(_per_stream(4))
    lines = [line.rstrip() for line in text.splitlines()]
    assert "pool      16 pages of 2080 B: 4 resident/layer (2 per stream) + 4 ring slots" in lines


def test_a_pool_that_does_not_add_up_is_said() -> None:
    """The issue's case: a writer gave the per-stream window (2) as resident_pages_per_layer
    for a pool with 12 resident slots; check printed "2 resident/layer + 4 ring slots" as if
    that were the pool. The numbers are shown as given, with why they cannot be the pool."""
    text = render(_per_stream(2)).replace("\n", " ")
    assert "2 resident/layer (1 per stream) + 4 ring slots (does not add up: 3 layers × 2 + 4 = 10" in (
        " ".join(text.split()))
    assert "≠ 16 pool pages; resident_pages_per_layer counts the slots of all streams of a layer)" in (
        " ".join(text.split()))


def test_unknown_parts_are_left_out() -> None:
    h = Header(format="kvtrace", version="1.1", kvdiag_version="kvtrace.h 1.1",
               created="2026-12-01T00:00:00+00:00", backend="native", device=Device("x"),
               scenario={"name": "demo", "config": {"np": 1, "kv_unified": True}},
               plan={"page_bytes": 73728, "stage_bytes": 73728})
    text = render(h)
    assert "runtime   np 1 (kv unified), stage 0.0703 MiB" in text
    assert "pool      page 73728 B" in text and "None" not in text
