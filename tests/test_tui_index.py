"""The viewer's non-UI layer: trace index, row filters, text search, log index (no textual)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kvdiag.analysis.linesource import LineSource
from kvdiag.analysis.log_index import LOG_KINDS, build_log_index, line_offsets
from kvdiag.analysis.rowfilter import FilterError, RowFilter, apply_filter, parse_filter
from kvdiag.analysis.textsearch import find_row
from kvdiag.analysis.trace_index import (
    F_FITS_FALSE,
    F_RING,
    KINDS,
    ROUTES,
    IndexBuilder,
    TraceIndex,
    decode_event,
    header_end,
)
from kvdiag.files.logs import open_log
from kvdiag.model import events as ev
from kvdiag.postmortem.parse import LogParser
from kvdiag.trace.reader import TraceReader
from tests.tui_samples import write_abort, write_aliasing

LOGS = Path(__file__).parent / "fixtures" / "logs"


def index_of(path: Path, chunk: int = 1 << 20) -> tuple[TraceIndex, LineSource]:
    source = LineSource.open(path)
    builder = IndexBuilder(source, header_end(source))
    for _ in builder.run(chunk):
        pass
    return builder.snapshot(), source


@pytest.fixture(scope="module")
def aliasing(tmp_path_factory: pytest.TempPathFactory) -> Path:
    mp = pytest.MonkeyPatch()
    try:
        return write_aliasing(tmp_path_factory.mktemp("idx") / "aliasing.kvtrace", mp)
    finally:
        mp.undo()


@pytest.mark.parametrize("chunk", [97, 4096, 1 << 20])
def test_index_columns_match_the_reader(aliasing: Path, chunk: int) -> None:
    """GIVEN a trace WHEN indexed in chunks of any size THEN each row holds its event's fields."""
    index, source = index_of(aliasing, chunk)
    events = list(TraceReader.open(aliasing))
    assert index.complete and index.n == len(events) == 60
    c = index.columns
    for row, e in enumerate(events):
        assert int(c["seq"][row]) == e.seq and int(c["step"][row]) == e.step
        assert KINDS[int(c["kind"][row])] == type(e).__name__.lower()
        assert decode_event(source.line(int(c["offset"][row]))) == e
        if isinstance(e, ev.Upload):
            assert (int(c["a"][row]), int(c["b"][row]), int(c["slot"][row])) == (
                e.pages[0], e.pages[1], e.slot)
            assert int(c["key"][row]) == -1 and not int(c["flags"][row]) & F_RING
        elif isinstance(e, ev.Write):
            assert (int(c["a"][row]), int(c["b"][row]), int(c["stream"][row])) == (
                e.cells[0], e.cells[1], e.stream)
        elif isinstance(e, ev.Evict):
            assert (int(c["slot"][row]), int(c["a"][row])) == (e.slot, e.page)
        elif isinstance(e, ev.Fits):
            assert ROUTES[int(c["a"][row])] == e.route
    assert index.kind_counts() == {"step": 5, "learn": 6, "fits": 10, "write": 10, "upload": 4,
                                   "evict": 4, "read": 10, "output": 5, "telemetry": 5,
                                   "end": 1}
    assert index.last_step == 4
    lo, hi = index.step_rows(2)
    assert {int(s) for s in c["step"][lo:hi]} == {2} and index.cutoff(1) == lo
    assert index.row_of_seq(int(c["seq"][7])) == 7 and index.row_of_seq(10_000) is None


def test_index_marks_fits_false_and_keeps_damage(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN an aborting trace with a corrupt line, an unknown kind and a cut last line
    THEN the index keeps a row for each, marked corrupt or unknown, and the fits row is false."""
    path = write_abort(tmp_path / "abort.kvtrace", monkeypatch)
    lines = path.read_bytes().split(b"\n")
    damaged = [*lines[:3], b"{not json", b'{"kind":"gpu_clock","seq":90,"t_ns":1,"step":0,"mhz":7}',
               *lines[3:-2], lines[-2][:20]]
    path.write_bytes(b"\n".join(damaged))
    index, source = index_of(path)
    kinds = [KINDS[k] for k in index.columns["kind"]]
    assert kinds == ["step", "write", "corrupt", "unknown", "write", "fits", "abort", "corrupt"]
    fits_row = kinds.index("fits")
    assert int(index.columns["flags"][fits_row]) & F_FITS_FALSE
    assert ROUTES[int(index.columns["a"][fits_row])] == "abort"
    unknown = decode_event(source.line(int(index.columns["offset"][3])))
    assert isinstance(unknown, ev.Unknown) and unknown.fields == {"mhz": 7}
    assert not index.seq_sorted  # seq 90 then 3


def test_filters_parse_and_select(aliasing: Path) -> None:
    index, _ = index_of(aliasing)
    c = index.columns
    flt = parse_filter("read layer:1 stream:1 step:3-4", KINDS)
    assert flt == RowFilter(kinds=frozenset({"read"}), layer=((1, 1),), stream=((1, 1),),
                            step=((3, 4),))
    rows = apply_filter(flt, c, KINDS)
    assert rows is not None and [int(c["step"][r]) for r in rows] == [3, 4]
    # slot 3 is the second slot of layer 0's page run [2, 4): uploads cover it, evictions hit it
    rows = apply_filter(parse_filter("slot:3", KINDS), c, KINDS, index.slot_span)
    assert rows is not None
    assert [KINDS[int(c["kind"][r])] for r in rows] == ["upload", "evict", "upload"]
    assert apply_filter(parse_filter("", KINDS), c, KINDS) is None
    assert parse_filter("k:read,write l:0,1 t:2..3", KINDS).describe() == (
        "kind:read,write layer:0,1 step:2-3")
    for bad, why in (("layer:x", "not a number"), ("kind:reed", "unknown kind"),
                     ("colour:red", "unknown key"), ("step:5-2", "backwards"),
                     ("hello", "not a kind")):
        with pytest.raises(FilterError, match=why):
            parse_filter(bad, KINDS)


def test_filters_evaluated_in_slices_select_what_whole_columns_do(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN columns of 3.5 slices of rows (random kinds, layers, streams, steps, slots and
    upload page runs that cross slice ends) WHEN each filter is applied a slice at a time THEN
    the rows equal a whole-column evaluation of the same terms, ascending, as int32."""
    from kvdiag.analysis import rowfilter

    monkeypatch.setattr(rowfilter, "CHUNK_ROWS", 1000)
    rng = np.random.default_rng(7)
    n = 3500
    kind = rng.integers(0, len(KINDS), n).astype(np.int8)
    c = {"kind": kind, "layer": rng.integers(-1, 8, n).astype(np.int16),
         "stream": rng.integers(-1, 3, n).astype(np.int16),
         "step": np.sort(rng.integers(0, 400, n)).astype(np.int32),
         "slot": rng.integers(-1, 60, n).astype(np.int32)}
    upload = kind == KINDS.index("upload")
    span = np.where(upload, rng.integers(1, 9, n), 1).astype(np.int32)

    def whole(kinds: set[str], layer: tuple[int, int] | None, slot: tuple[int, int] | None,
              step: tuple[int, int] | None) -> list[int]:
        m = np.isin(kind, [KINDS.index(k) for k in kinds]) if kinds else np.ones(n, bool)
        if layer:
            m &= (c["layer"] >= layer[0]) & (c["layer"] <= layer[1])
        if step:
            m &= (c["step"] >= step[0]) & (c["step"] <= step[1])
        if slot:
            first = c["slot"].astype(np.int64)
            m &= (first >= 0) & (first <= slot[1]) & (first + span - 1 >= slot[0])
        return np.flatnonzero(m).tolist()

    cases = [("kind:read", {"read"}, None, None, None),
             ("kind:read,upload layer:2-5", {"read", "upload"}, (2, 5), None, None),
             ("slot:40", set(), None, (40, 40), None),
             ("kind:upload slot:10-12 step:100-300", {"upload"}, None, (10, 12), (100, 300)),
             ("step:399", set(), None, None, (399, 399)),
             ("kind:telemetry layer:7", {"telemetry"}, (7, 7), None, None)]
    for text, kinds, layer, slot, step in cases:
        got = apply_filter(parse_filter(text, KINDS), c, KINDS, lambda lo, hi: span[lo:hi])
        assert got is not None and got.dtype == np.int32, text
        want = whole(kinds, layer, slot, step)
        assert got.tolist() == want and want, text
        if "slot" in text:  # the span as an array gives the same rows
            again = apply_filter(parse_filter(text, KINDS), c, KINDS, span)
            assert again is not None and again.tolist() == want
    # a key the columns lack matches nothing
    assert apply_filter(parse_filter("slot:3", KINDS), {"kind": kind}, KINDS).tolist() == []  # type: ignore[union-attr]


def test_text_search_wraps_and_respects_the_selection(aliasing: Path) -> None:
    index, source = index_of(aliasing)
    offsets = index.columns["offset"]
    foreign = [r for r in range(index.n) if b"foreign" in source.line(int(offsets[r]))]
    assert len(foreign) == 6
    assert find_row(source, offsets, b"foreign", 0) == foreign[0]
    assert find_row(source, offsets, b"foreign", foreign[0] + 1) == foreign[1]
    assert find_row(source, offsets, b"foreign", foreign[-1] + 1) == foreign[0]  # wrapped
    assert find_row(source, offsets, b"foreign", foreign[1], forward=False) == foreign[0]
    only_layer1 = np.flatnonzero(index.columns["layer"] == 1)
    assert find_row(source, offsets, b"foreign", 0, selection=only_layer1) == foreign[1]
    assert find_row(source, offsets, b"no such text", 0) is None


def test_log_index_marks_records_and_slot_lines() -> None:
    path = LOGS / "kvstream_np2_gdb.log"
    parser = LogParser()
    with open_log(str(path)) as log:
        name = log.name
        parser.feed(name, log.stream)
    scan = parser.result()
    source = LineSource.open(path)
    index = build_log_index(source, scan, name)
    text = path.read_bytes()
    assert index.n == text.count(b"\n") == len(line_offsets(source))
    kinds = [LOG_KINDS[k] for k in index.columns["kind"]]
    crash = scan.crashes[0]
    assert kinds[crash.where.line - 1] == "crash"
    assert kinds[scan.fits[0].where.line - 1] == "fits"
    slot_rows = [i for i, k in enumerate(kinds) if k == "slot"]
    lines = text.split(b"\n")
    assert slot_rows and all(b"id " in lines[i] or b"id_slot=" in lines[i] for i in slot_rows)
    # "slot launch_slot_: id  1 | task 0 | processing task" names server slot 1
    launch = next(i for i, line in enumerate(lines) if b"launch_slot_: id  1" in line)
    assert int(index.columns["slot"][launch]) == 1
    assert index.kind_counts()["boot"] >= 5


def test_gzip_log_is_decompressed_for_random_access(tmp_path: Path) -> None:
    import gzip

    raw = (LOGS / "segfault_lldb.log").read_bytes()
    gz = tmp_path / "x.log.gz"
    gz.write_bytes(gzip.compress(raw))
    source = LineSource.open(gz)
    assert source.compressed and source.data == raw
    offsets = line_offsets(source)
    assert source.line(int(offsets[2])) == raw.split(b"\n")[2].rstrip(b"\r")


def test_non_ui_modules_do_not_import_textual() -> None:
    """The index, replay and report layers run without textual (kvdiag check needs none)."""
    code = ("import sys; import kvdiag.analysis.trace_index, kvdiag.analysis.pages_query, "
            "kvdiag.tui.digest, kvdiag.analysis.log_index, kvdiag.tui.document, "
            "kvdiag.tui.loading, kvdiag.tui.rows, kvdiag.tui.summaries, kvdiag.tui.fitsdetail, "
            "kvdiag.tui.crashes, kvdiag.tui.pagestext, kvdiag.tui.sparkline, "
            "kvdiag.tui.judging, kvdiag.tui.judgeproc, kvdiag.tui.shown; "
            "print('textual' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False"


def test_slot_lines_need_a_word_boundary(tmp_path: Path) -> None:
    log = tmp_path / "s.log"
    log.write_bytes(b"slot launch_slot_: id  2 | task 5 | processing task\n"
                    b"invalid  3 | task 1\n"
                    b"srv  log_server_r: request: id_slot=4 id_task=9\n"
                    b"my_id_slot=7\n")
    index = build_log_index(LineSource.open(log), LogParser().result(), str(log))
    assert index.columns["slot"].tolist() == [2, -1, 4, -1]
    assert [LOG_KINDS[k] for k in index.columns["kind"]] == ["slot", "line", "slot", "line"]


def test_older_slot_lines_are_slot_lines(tmp_path: Path) -> None:
    """Late 2023's LOG_TEE lines and 2024's server_log lines (JSON, and the slot_id key of
    before 2024-03) give the slot too; other lines naming a slot do not."""
    log = tmp_path / "s.log"
    log.write_bytes(
        b"Dec 08 10:11:12 gpu llama-server[42]: slot 1 is processing [task id: 7]\n"
        b"slot 1 : in cache: 0 tokens | to process: 12 tokens\n"
        b"slot 0 released (1201 tokens in cache)\n"
        b'{"function":"update_slots","id_slot":3,"id_task":5,"level":"INFO","line":1,'
        b'"msg":"slot released","n_past":9,"tid":"1","timestamp":1,"truncated":false}\n'
        b'INFO [   launch_slot_with_task] slot is processing task | slot_id=2 task_id=0 '
        b'tid="1" timestamp=1\n'
        b'{"function":"launch_slot_with_task","level":"INFO","line":1,"msg":"slot is '
        b'processing task","slot_id":6,"task_id":1,"tid":"1","timestamp":1}\n'
        b"all slots are idle, slot 4 was the last one\n"
        b"a timeslot 5 released\n")
    index = build_log_index(LineSource.open(log), LogParser().result(), str(log))
    assert index.columns["slot"].tolist() == [1, 1, 0, 3, 2, 6, -1, -1]
    assert [LOG_KINDS[k] for k in index.columns["kind"]] == [
        "slot", "slot", "slot", "slot", "slot", "slot", "line", "line"]
