"""Where the patterns can match, found in C (kvdiag/postmortem/perfbytes.c), against the patterns'
own search (the reference, and the path without a compiler): the same matches and anchor offsets
on random and hostile bytes and any window of them, the same runs on logs of every shape and
prefix, nothing read past a buffer's end, and the Python path where the helper is not built."""

from __future__ import annotations

import random
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from server_logs import ServerLog, Turn, adapt_line, partition_line
from test_perf_log2023 import BOOT as BOOT_2023
from test_perf_log2023 import HTTP, block, load, processing, released
from test_perf_log2024 import request, server_log
from test_perf_pairs import logs
from test_perf_pairs import read as read_pairs
from test_perf_release_first import late_2024_log

from kvdiag import compiled
from kvdiag.model.perf import PerfRun
from kvdiag.postmortem import perfbytes
from kvdiag.postmortem.perfscan import Orphan
from kvdiag.postmortem.timinglines import RARE_ANCHORS, SLOT_LINES

C = perfbytes.module()
needs_c = pytest.mark.skipif(C is None, reason="no C compiler here: " + str(compiled.status()))

# pieces of the lines the pattern and the anchors look for, cut anywhere, and noise around them
PIECES = (b"id", b"id ", b"id  0 | task 7 | ", b"id 12 | task -1 | ", b" | task ", b"id_slot",
          b"id_slot\":3", b"slot_id=4 ", b"slot_id\":", b"new prompt, n_ctx_slot = 8192, n_keep"
          b" = 0, task.n_tokens = 300", b"n_tokens = 5, memory_seq_rm [5, end)",
          b"cached n_tokens = 9, memory_seq_rm [9,", b"c_past = 1, memory_seq_rm [1,",
          b"kv cache rm [12, end)", b"prompt eval time =   1.5 ms /   3 tokens (  0.5 ms per "
          b"token, 2000.0 tokens per second)", b"       eval time = 99.0 ms / 9 runs   ( 11.0 ms "
          b"per token, 90.9 tokens per second)", b"      total time = 100.5 ms / 12 tokens",
          b"graphs reused = 17", b"stop processing: n_tokens = 300, truncated = 1",
          b"stop processing: n_past = 12", b"print_timing: ", b"| ", b"|", b"\n", b"\r\n", b"\r",
          b" ", b"  ", b"-", b"0", b"99999999999999999999999999", b"-nan", b"inf", b"\x00",
          b"\xff", b"\xffid", *RARE_ANCHORS, b"llama", b"trea", b"fit", b"listening", b"model ",
          b"lla", b"ma_", b"x" * 40, b"TREA", b"REAM", b"KV_STREAM", b"KV-STREAM FALLBACK",
          b"Stream", b"TREAMTREAM", b"treaTREAM")


@st.composite
def hostile(draw: st.DrawFn) -> bytes:
    parts = draw(st.lists(st.sampled_from(PIECES) | st.binary(max_size=6), max_size=60))
    return b"".join(parts)


def reference(buf: bytes, start: int, end: int) -> tuple[list[tuple[int, int]], list[int]]:
    """The spans of the pattern's own matches, and the anchors as the Python path finds them."""
    spans = [m.span() for m in SLOT_LINES.finditer(buf, start, end)]
    rare = sorted({m.start() for a in RARE_ANCHORS
                   for m in re.compile(re.escape(a)).finditer(buf, start, end)})
    return spans, rare


def compiled_scan(buf: bytes, start: int, end: int) -> tuple[list[tuple[int, int]], list[int]]:
    starts, rare = perfbytes.scan(C, buf, start, end)
    assert list(starts) == sorted(starts)
    # the 16-byte steps alone (where the processor has no AVX2) find the same
    assert (memoryview(C.scan(buf, start, end, RARE_ANCHORS, False)[0]).cast("q").tolist(),
            C.scan(buf, start, end, RARE_ANCHORS, False)[1]) == (starts.tolist(), rare)
    return [m.span() for m in perfbytes.matches(buf, starts, end)], rare


@needs_c
@settings(max_examples=400, deadline=None)
@given(buf=hostile(), data=st.data())
def test_the_compiled_pass_finds_what_the_patterns_find(buf: bytes, data: st.DataObject) -> None:
    """In any window (a block that ends mid-line, mid-anchor, mid-number)."""
    start = data.draw(st.integers(0, len(buf)))
    end = data.draw(st.integers(start, len(buf)))
    assert compiled_scan(buf, start, end) == reference(buf, start, end)
    assert compiled_scan(buf, 0, len(buf)) == reference(buf, 0, len(buf))


@needs_c
def test_the_compiled_pass_on_real_lines_and_their_cuts() -> None:
    """Every prefix and window of a log holding every shape: each cut point, both ends."""
    text = b"".join(shape_logs().values())
    rng = random.Random(17)
    want_all = reference(text, 0, len(text))
    assert len(want_all[0]) > 100 and len(want_all[1]) > 20
    assert compiled_scan(text, 0, len(text)) == want_all
    for _ in range(300):
        a = rng.randrange(len(text))
        b = min(len(text), a + rng.randrange(1, 3000))
        assert compiled_scan(text, a, b) == reference(text, a, b), (a, b)


@needs_c
def test_offsets_are_clipped_as_the_patterns_clip_them() -> None:
    buf = b"slot x: id 1 | task 2 | stop processing: n_tokens = 3\nllama_x\n"
    assert compiled_scan(buf, -5, 10**9) == reference(buf, 0, len(buf)) == ([(8, 53)], [54])
    assert list(perfbytes.scan(C, buf, 40, 3)[0]) == []
    with pytest.raises(TypeError):
        C.scan(buf, 0, 5, (b"",))
    with pytest.raises(ValueError):
        C.scan(buf, 0, 5, (b"a",) * 17)


@needs_c
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mprotect through libc")
def test_nothing_is_read_past_the_buffer() -> None:
    """The buffer ends where a page the process may not read begins (a read past it is a
    crash): its last bytes cut a slot prefix, an anchor, a message the pattern reads."""
    script = textwrap.dedent("""
        import ctypes, mmap, sys
        from kvdiag import compiled
        from kvdiag.postmortem import perfbytes, perfpairs
        from kvdiag.postmortem.timinglines import RARE_ANCHORS
        c = perfbytes.module()
        pairs = compiled.load(perfpairs._SOURCE, perfpairs._MODULE)
        page = mmap.PAGESIZE
        tails = [b"i", b"id", b"id ", b"id  1", b"id 1 | task", b"id 1 | task 5 |",
                 b"id 1 | task 5 | ", b"id 1 | task 5 | new prompt, n_ctx", b"id 1 | task 5 | n",
                 b"id 1 | task 5 |\\r", b"id 1 | task 5 | graphs reused =", b"id_", b"id\\"",
                 b"llama", b"llama_", b"trea", b"tream", b"fit", b"listening a", b"model loade",
                 b"x" * 40 + b"id 1 | task 5 | stop processing: n_"]
        mm = mmap.mmap(-1, 2 * page)
        base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
        assert libc.mprotect(base + page, page, 0) == 0  # PROT_NONE
        view = memoryview(mm)[:page]
        n = 0
        for tail in tails:
            mm[:page] = b"y" * (page - len(tail)) + tail
            # every alignment of the 16-byte steps against the end
            for start in (*range(32), *range(page - 80, page + 1)):
                for wide in (True, False):
                    c.scan(view, start, page, RARE_ANCHORS, wide)
                    c.scan(view, start, page + 50, RARE_ANCHORS, wide)  # clipped to it
                n += 1
        # the usual pair cut at each byte of its last 200, read by pairs() where scan() says
        pair = (b"slot update_slots: id  0 | task 5 | new prompt, n_ctx_slot = 8192, n_keep = 0,"
                b" task.n_tokens = 300\\n0.01 I slot update_slots: id  0 | task 5 | kv cache rm"
                b" [12, end)\\nslot print_timing: id  0 | task 5 | \\nprompt eval time =  1.5 ms /"
                b"  3 tokens ( 0.5 ms per token, 2000.0 tokens per second)\\n       eval time = 9"
                b"9.0 ms / 9 tokens ( 11.0 ms per token, 90.9 tokens per second)\\n      total ti"
                b"me = 100.5 ms / 12 tokens\\nslot      release: id  0 | task 5 | stop processing"
                b": n_tokens = 309, truncated = 1")
        newer = (b"slot update_slots: id  0 | task 5 | new prompt, n_ctx_slot = 8192, n_keep = 0,"
                 b" task.n_tokens = 300\\nslot update_slots: id  0 | task 5 | n_tokens = 12, "
                 b"memory_seq_rm [12, end)\\nslot print_timing: id  0 | task 5 | prompt eval tim"
                 b"e =  1.5 ms /  3 tokens ( 0.5 ms per token, 2000.0 tokens per second)\\nslot "
                 b"print_timing: id  0 | task 5 |        eval time = 99.0 ms / 9 tokens ( 11.0 ms "
                 b"per token, 90.9 tokens per second)\\nslot print_timing: id  0 | task 5 |     "
                 b"  total time = 100.5 ms / 12 tokens\\nslot print_timing: id  0 | task 5 |    "
                 b"graphs reused = 7\\nslot      release: id  0 | task 5 | stop processing: n_to"
                 b"kens = 309, truncated = 1")
        read = 0
        for cut in range(len(newer) - 250, len(newer) + 1):
            mm[:page] = b"y\\n" * ((page - cut) // 2) + b"\\n" * ((page - cut) % 2) + newer[:cut]
            offsets, _ = c.scan(view, 0, page, RARE_ANCHORS)
            read += len(pairs.pairs(view, offsets, page, 0))
        for cut in range(len(pair) - 200, len(pair) + 1):
            mm[:page] = b"y\\n" * ((page - cut) // 2) + b"\\n" * ((page - cut) % 2) + pair[:cut]
            offsets, _ = c.scan(view, 0, page, RARE_ANCHORS)
            read += len(pairs.pairs(view, offsets, page, 0))
        print("scanned", n, "pairs", read)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["scanned", str(21 * (32 + 81)), "pairs", "2"]


def read(data: bytes, size: int, c: bool, continuation: bool = False
         ) -> tuple[PerfRun, list[Orphan]]:
    """In blocks of ``size``, the compiled way (``c``) or the patterns' alone."""
    return read_pairs(data, size, True, continuation, c)


#: a kv-stream fallback warning that spells kv-stream only in capitals (no "tream")
UPPER_FALLBACK = "ggml_cuda_compute_forward: KV-STREAM FALLBACK on layer 7 (ne[3] = 2)"


def shape_logs() -> dict[str, bytes]:
    """A log of each shape the reader knows (tests/server_logs.py and the 2023/2024 tests')."""
    out: dict[str, bytes] = {}
    for shape in ("older", "newer"):
        for outer in ("none", "router", "journald", "compose"):
            log = ServerLog(shape=shape, outer=outer)  # type: ignore[arg-type]
            log.boot(np=2)
            for k in range(6):
                log.requests(Turn(k % 2, 2 * k, 900 + k, 10 * k, 30 + k, 40.0, graphs=k or None,
                                  during=(adapt_line(5, 64, 8),) if k == 3 else ()),
                             Turn((k + 1) % 2, 2 * k + 1, 300, 0, 9, 20.0, truncated=k == 2))
                if k == 4:
                    log.line(partition_line(40, 32, 8, 16, 2.5, 80.0), "W")
                if k == 5:
                    log.line(UPPER_FALLBACK, "W")
            out[f"{shape}-{outer}"] = log.text().encode()
            out[f"{shape}-{outer}-crlf"] = log.text().replace("\n", "\r\n").encode()
    out["release-first"] = late_2024_log()
    for form in ("text", "json"):
        for keys in (("id_slot", "id_task"), ("slot_id", "task_id")):
            lines = [server_log(form, "main", "model loaded", {})]  # type: ignore[arg-type]
            for k in range(4):
                lines += request(form, keys, k % 2, k, cached=k, prompt=(10.0 + k, 20 + k),  # type: ignore[arg-type]
                                 decode=(30.0, 5 + k), n_past=100 + k, truncated=k == 1)
            out[f"2024-{form}-{keys[0]}"] = ("\n".join(lines) + "\n").encode()
    lines = [*BOOT_2023]
    for k in range(4):
        lines += [processing(0, k), *load(0, 10 * k, 50), *block((5.0 + k, 50), (40.0, 9)), HTTP,
                  released(0, 10 * k + 59)]
    out["late-2023"] = ("\n".join(lines) + "\n").encode()
    out["upgrade"] = out["late-2023"] + out["older-none"]
    return out


SHAPES = shape_logs()


@needs_c
@pytest.mark.parametrize("name", sorted(SHAPES))
@pytest.mark.parametrize("size", [53, 1000, 1 << 20])
def test_every_shape_gives_the_same_run_both_ways(name: str, size: int) -> None:
    data = SHAPES[name]
    fast, fast_orphans = read(data, size, True)
    slow, slow_orphans = read(data, size, False)
    assert fast == slow and fast_orphans == slow_orphans
    assert len(fast.requests) >= 4 and not fast.problems
    if name.startswith(("older", "newer")):
        # the capitals-only fallback line is read both ways (the "TREAM" anchor)
        assert [(n.kind, n.layer) for n in fast.notes if n.kind == "fallback"] == [("fallback", 7)]


@needs_c
@settings(max_examples=120, deadline=None)
@given(data=logs(), size=st.sampled_from([97, 1000, 1 << 20]), continuation=st.booleans())
def test_mixed_logs_give_the_same_run_both_ways(data: bytes, size: int,
                                                 continuation: bool) -> None:
    """test_perf_pairs' generated logs: every shape, interleaved slots, notes, boots."""
    assert read(data, size, True, continuation) == read(data, size, False, continuation)


@needs_c
@settings(max_examples=200, deadline=None)
@given(garbage=st.lists(hostile(), min_size=1, max_size=4), size=st.sampled_from([7, 64, 4096]),
       continuation=st.booleans())
def test_hostile_bytes_between_requests_give_the_same_run_both_ways(
        garbage: list[bytes], size: int, continuation: bool) -> None:
    log = ServerLog(shape="older")
    log.boot(np=2)
    body = log.text().encode()
    for k, junk in enumerate(garbage):
        log.lines = []
        log.requests(Turn(k % 2, k, 500 + k, k, 9, 30.0))
        body += junk + log.text().encode()
    fast, slow = read(body, size, True, continuation), read(body, size, False, continuation)
    assert fast == slow
    assert len(fast[0].requests) >= 1


@needs_c
def test_bench_logscans_log_gives_the_same_run_both_ways() -> None:
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parents[1] / "benchmarks"))
    try:
        import bench_logscan
    finally:
        sys.path.pop(0)
    data = bench_logscan.BOOT.encode() + bench_logscan.request_block(0, 600, 10**8)[0] \
        + bench_logscan.CRASH.encode()
    fast, slow = read(data, 1 << 16, True)[0], read(data, 1 << 16, False)[0]
    assert fast == slow
    assert len(fast.requests) == 600 and len(fast.notes) == 3
    assert fast.requests[599].depth_start == 200 + (599 * 37) % 3000


@contextmanager
def no_compiler(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(compiled, "_loaded", {})
    monkeypatch.setenv("KVDIAG_COMPILED", "0")
    yield


def test_without_the_helper_the_patterns_search_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """KVDIAG_COMPILED=0 (or no compiler): the module is None and the scanner reads the same."""
    data = SHAPES["older-router"]
    with no_compiler(monkeypatch):
        assert perfbytes.module() is None
        assert compiled.status()[perfbytes._MODULE].startswith("KVDIAG_COMPILED=0")
        run = read(data, 1000, True)[0]
    assert len(run.requests) == 12 and run.unfinished == 0
    assert sorted(r.task for r in run.requests) == list(range(12))


# what may be done to a line of the usual request (older shape): each is a shape the compiled
# reading of pairs must leave to the pattern, or read as the pattern reads it
EDITS = (
    (rb"task\.n_tokens", b"n_prompt_tokens"), (rb", truncated = \d", b""), (rb"^", b"[ 8080] "),
    (rb"\d+\.\d+", b"1.2.3"), (rb"\d+\.\d+", b"007"), (rb"\d+\.\d+", b"-5"),
    (rb" \d+ tokens", b" 99999999999999999999999 tokens"), (rb"= \d+", b"= 007"),
    (rb"(id +\d+ \| task \d+ \| n_tokens = )\d+(, memory_seq_rm \[)\d+(, end\))",
     rb"\g<0> \1 9\2 9\3"), (rb"(id +\d+ \| task \d+ \| kv cache rm \[)\d+(, end\))", rb"\g<0> \1 9\2"),
    (rb"(id +\d+ \| task \d+ \| stop processing: n_tokens = )\d+", rb"\g<0>, truncated = 1 \1 77"),
    (rb"(id +\d+ \| task \d+ \| kv cache rm \[)\d+(, end\))", rb"id  5 | task 5 | \g<0>"), (rb"id  (\d)", rb"id 0\1"), (rb"$", b"\r"),
    (rb"^", b"0.01.002.003 I llama_context: n_ctx = 5\n"), (rb"^.*$", b""), (rb"tokens", b"runs"),
    (rb"\| task", b"|  task"), (rb"\| $", b"|    "), (rb"\d", b"\x00"), (rb"\d", b"\xff"),
    (rb"n_tokens = (\d+), memory_seq_rm", rb"cached n_tokens = \1, memory_seq_rm"),
    (rb"n_tokens = \d+, memory_seq_rm", b"kv cache rm"), (rb"n_tokens = ", b"n_past = "),
    (rb"task (\d+)", rb"task -\1"), (rb"(.{5})", rb"\1\n"), (rb"id ", b"id\t"),
    (rb"\| new", b"|    new"), (rb"eval time", b"eval  time"), (rb"^ +", b""),
    (rb"graphs reused = +\d+", b"graphs reused = 007"), (rb"(graphs reused = +)\d+", rb"\g<1>x"),
    (rb"total time", b"total  time"), (rb"\| +eval time", b"| prompt eval time"),
    (rb"prompt eval", b"eval"), (rb"(\| +)(eval time)", rb"\1graphs reused = 3\n\2"),
    (rb"(id +\d+ \| task \d+ \| )(prompt eval)", rb"\1stop processing: n_tokens = 5\n\g<0>"),
    (rb"^(.*(id +\d+ \| task \d+ \| )prompt eval.*)$", rb"\1\n\2graphs reused = 3"),
    (rb"^(.*(id +\d+ \| task \d+ \| )prompt eval.*)$", rb"\1\n\2   total time = 5 ms"),
    (rb"^(.*(id +\d+ \| task \d+ \| )prompt eval.*)$",
     rb"\1\n\2stop processing: n_tokens = 5, truncated = 1"),
)


@needs_c
@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32), edits=st.integers(0, 8), size=st.sampled_from([61, 999, 1 << 20]),
       continuation=st.booleans(), shape=st.sampled_from(["older", "newer"]))
def test_pairs_edited_anywhere_give_the_same_run_both_ways(seed: int, edits: int, size: int,
                                                           continuation: bool,
                                                           shape: str) -> None:
    """The usual requests (read by the compiled pass in runs), lines edited at random: what
    the compiled reading declines goes to the pattern, with the same records."""
    rng = random.Random(seed)
    log = ServerLog(shape=shape)  # type: ignore[arg-type]
    log.boot(np=2)
    for k in range(12):
        log.requests(Turn(k % 2, k, 300 + k, 7 * k % 300, 9 + k, 30.0 + k, truncated=k == 3,
                          graphs=k if k % 3 else None))
    lines = log.text().encode().split(b"\n")
    for _ in range(edits):
        pattern, repl = rng.choice(EDITS)
        where = [i for i, x in enumerate(lines[:-1]) if re.search(pattern, x)]
        if where:  # (an edit before may have left no line it applies to)
            i = rng.choice(where)
            lines[i] = re.sub(pattern, repl, lines[i], count=1)
    data = b"\n".join(lines)
    fast = read(data, size, True, continuation)
    assert fast == read(data, size, False, continuation)
    if not edits:
        assert len(fast[0].requests) == 12 or continuation


@needs_c
@pytest.mark.parametrize("shape", ["older", "newer"])
def test_the_usual_requests_are_read_by_the_compiled_pass(monkeypatch: pytest.MonkeyPatch,
                                                          shape: str) -> None:
    """Runs of them go the compiled way, with the records of the pattern's reading; a rare line
    inside one sends its request to the per-match path."""
    from kvdiag.postmortem import perfpairs

    log = ServerLog(shape=shape, outer="none")  # type: ignore[arg-type]
    log.boot(np=2)
    for k in range(40):
        log.requests(Turn(k % 2, k, 300 + k, k, 9 + k, 30.0 + k, graphs=1000 + k,
                          during=(partition_line(40, 32, 8, 16, 2.5, 80.0),) if k == 20
                          else ()))
    data = log.text().encode()
    seen: list[int] = []
    chunk = perfpairs._chunk

    def spy(*args: object, **kw: object) -> object:
        read_ = args[-1] if len(args) == 8 else kw.get("read")
        if read_ is not None:
            seen.append(len(read_[1]) // (2 if shape == "older" else 3))  # type: ignore[index]
        return chunk(*args, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(perfpairs, "_chunk", spy)
    fast = read(data, 1 << 20, True)[0]
    assert seen == [40]
    assert fast == read(data, 1 << 20, False)[0]
    assert [r.task for r in fast.requests] == list(range(40))
    assert fast.requests[20].notes == (0,) and fast.requests[19].notes == ()
    assert fast.requests[39].depth_end == 339 + 48 and fast.requests[39].cached == 39
    assert fast.requests[39].graphs_reused == (1039 if shape == "newer" else None)
