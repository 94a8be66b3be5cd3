"""Export a capture as the llama-server log the modelled run would have printed.

A model of the log, not a recording: the boot lines of llama_context/llama_kv_cache with
streaming on (domain brief §5.1, §7.2), slot activity in the server's ``slot <func>: id | task
|`` shape (§7.3), the arm117 port's instrumented ``fits=false`` line (§4.5) for every fits
decision the judgement finds bad (:func:`kvdiag.analysis.judgement.fits.outcome`: a mismatch
or a fallback — an FA node in a kv-stream buffer that fits() refused), the fallback warning, the
``kv_stream_adapt`` partition and trace lines of an adaptive capture (§5.3), and for a
modelled abort the ``<file>:<line>: GGML_ASSERT(...) failed`` line followed by a gdb-style
stack of the frames the abort event names, and its Python stacks as faulthandler prints them
(format 1.3). ``kvdiag postmortem`` reads it like a real log, so
a capture and its log can be checked against each other. Timestamps come from ``t_ns`` in
llama.cpp's ``<min>.<ss>.<ms>.<us> <L>`` prefix (§7.1).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import msgspec

from kvdiag.analysis.judgement.fits import BAD, outcome
from kvdiag.model import events as ev
from kvdiag.model.frames import PYTHON_MARKS

MIB = 1 << 20
_RUNTIME_PTR = 0x55D1_E7A3_0000
"""Stand-in address of the kv-stream runtime object (``kr``/``vr`` in the fits line)."""
_LIB_BASE = {"libggml-base.so": 0x7F32_09A0_0000, "libggml-cuda.so": 0x7F32_0840_0000,
             "libllama.so": 0x7F32_09C0_0000, "llama-server": 0x55D1_E6E0_0000}


def _stamp(t_ns: int, level: str) -> str:
    us = t_ns // 1000
    minutes, rest = divmod(us, 60_000_000)
    seconds, rest = divmod(rest, 1_000_000)
    ms, us_part = divmod(rest, 1000)
    return f"{minutes}.{seconds:02d}.{ms:03d}.{us_part:03d} {level} "


def _module_of(function: str) -> str:
    if function.startswith(("ggml_print_backtrace", "ggml_abort", "ggml_backend_sched")):
        return "libggml-base.so"
    if function.startswith("ggml_"):
        return "libggml-cuda.so"
    if function.startswith("llama_"):
        return "libllama.so"
    return "llama-server"


#: CPython's faulthandler names of the signals it handles (Modules/faulthandler.c,
#: ``faulthandler_handlers``), what it prints after ``Fatal Python error: ``.
_FAULTHANDLER_NAMES = {"SIGSEGV": "Segmentation fault", "SIGBUS": "Bus error",
                       "SIGILL": "Illegal instruction", "SIGFPE": "Floating point exception"}
_WINDOWS = " (Windows fatal exception: "
_MARK_OF = {note: mark for mark, note in PYTHON_MARKS.items()}


def _signal_only(e: ev.Abort) -> bool:
    """The abort is a death by a signal that faulthandler's line names (``python_dump``)."""
    if e.file or e.condition or e.cuda_error:
        return False
    return e.message in _FAULTHANDLER_NAMES or (
        _WINDOWS in e.message and e.message.endswith(")"))


def python_dump(e: ev.Abort) -> list[str]:
    """The abort's Python stacks (format 1.3) as CPython's faulthandler prints them on the
    death (Python/traceback.c ``dump_traceback``): its line for the signal or the Windows
    exception, a blank line, then each thread, the one the signal hit as ``Current thread``."""
    if not e.python_stacks:
        return []
    if _WINDOWS in e.message and e.message.endswith(")"):
        head = "Windows fatal exception: " + e.message.split(_WINDOWS, 1)[1][:-1]
    else:
        head = "Fatal Python error: " + _FAULTHANDLER_NAMES.get(e.message, "Aborted")
    lines = [head, ""]
    for st in e.python_stacks:
        if st.thread is None:
            lines.append("Stack (most recent call first):")
        else:
            name = f" [{st.name}]" if st.name else ""
            lines.append(f"{'Current thread' if st.current else 'Thread'} {st.thread}{name} "
                         "(most recent call first):")
        marks = [_MARK_OF[n] for n in st.notes if n in _MARK_OF]
        # the collector's mark comes first (3.9+), the others where the frames end
        lines += [f"  {m}" for m in marks if m == "Garbage-collecting"]
        for f in st.frames:
            file = "???" if f.file is None else f'"{f.file}"'
            line = "???" if f.line is None else str(f.line)
            lines.append(f"  File {file}, line {line} in {f.function or '???'}")
        lines += [f"  {m}" for m in marks if m != "Garbage-collecting"]
        lines.append("")
    return lines


def _known(*values: object) -> int | None:
    """The first of ``values`` that is a non-negative integer (a header's number), else None."""
    for v in values:
        if isinstance(v, int) and not isinstance(v, bool) and v >= 0:
            return v
    return None


def boot_lines(cfg: dict[str, Any], plan: dict[str, Any], model: str = "model") -> list[str]:
    """The boot lines of a streamed llama-server for a configuration and its sizing plan
    (``RuntimeConfig.as_dict()`` and ``Plan.as_json()``), each starting with its level letter.

    A line whose figures the header does not hold is left out (a native or imported trace may
    not know its context, pool or types): a made-up 0 or ``None`` would be read back by
    ``postmortem`` as what the server printed."""
    np_ = _known(cfg.get("np")) or 1
    unified = bool(cfg.get("kv_unified", False))
    n_stream = _known(plan.get("n_stream")) or (1 if unified else np_)
    n_ctx = _known(plan.get("n_ctx"), cfg.get("ctx"))
    kv_size = _known(plan.get("kv_size"), n_ctx)
    lines = [
        "I main: loading model",
        f"I srv    load_model: loading model '{model}.gguf'",
        "I llama_context: constructing llama_context",
    ]
    for key, value in (("n_seq_max", np_), ("n_ctx", n_ctx), ("n_ctx_seq", kv_size),
                       ("n_batch", 2048), ("n_ubatch", cfg.get("n_ubatch", 512)),
                       ("causal_attn", 1), ("flash_attn", "enabled"),
                       ("kv_unified", "true" if unified else "false")):
        if value is not None:
            lines.append(f"I llama_context: {key:<13} = {value}")
    host = _known(plan.get("host_kv_bytes"))
    k_part = _known(plan.get("host_k_bytes"))
    layers = _known(plan.get("streamed_layers"), cfg.get("layers"))
    stage_mib = cfg.get("stage_mib")
    if not isinstance(stage_mib, int | float) or isinstance(stage_mib, bool):
        stage = _known(plan.get("stage_bytes"))
        stage_mib = None if stage is None else f"{stage / MIB:g}"
    if stage_mib is not None:
        lines.append(f"I llama_context: experimental block KV streaming enabled, pool = "
                     f"{stage_mib} MiB")
    if host is not None:
        lines.append(f"I llama_kv_cache: CUDA_KV_Stream_Host KV buffer size = "
                     f"{host / MIB:8.2f} MiB")
        if kv_size is not None and layers is not None:
            types = cfg.get("type_k"), cfg.get("type_v")
            split = (f", K ({types[0]}): {k_part / MIB:7.2f} MiB, V ({types[1]}): "
                     f"{(host - k_part) / MIB:7.2f} MiB"
                     if k_part is not None and all(isinstance(t, str) and t for t in types)
                     else "")
            lines.append(f"I llama_kv_cache: size = {host / MIB:7.2f} MiB ({kv_size:6d} cells, "
                         f"{layers:3d} layers, {np_}/{n_stream} seqs){split}")
    lines += [
        "I srv  llama_server: model loaded",
        "I srv  update_slots: all slots are idle",
    ]
    return lines


def _num(x: float, width: int) -> str:
    """``%<width>.2f`` as the server prints; a figure with more digits (read from the 2024 form,
    which printed them all, or computed) keeps them, so that it reads back the same."""
    return f"{x:{width}.2f}" if round(x, 2) == x else f"{x!r:>{width}}"


def _figures(ms: float, n: int, ms_per_token: float | None, tps: float | None) -> str:
    """``<ms> ms / <n> tokens (<ms> ms per token, <tps> tokens per second)`` as
    ``print_timing`` prints it; a count of 0 prints ``nan`` as the server does."""
    if not n:
        return f"{_num(ms, 10)} ms / {n:5d} tokens (     nan ms per token,      nan tokens per " \
            "second)"
    per = ms_per_token if ms_per_token is not None else ms / n
    rate = tps if tps is not None else (n * 1000.0 / ms if ms else float("nan"))
    return (f"{_num(ms, 10)} ms / {n:5d} tokens ({_num(per, 8)} ms per token, {_num(rate, 8)} "
            "tokens per second)")


class LogExporter:
    def __init__(self, header: ev.Header,
                 extras: Mapping[int, dict[str, Any]] | None = None) -> None:
        """``extras``: the reader's fields unknown to this version, by seq; they and events
        of unknown kinds are kept as ``D kvtrace:`` debug lines (a debug line of a component
        the post-mortem parser does not know is skipped by it, like any other)."""
        self.header = header
        self.extras = extras if extras is not None else {}
        sc = header.scenario
        self.cfg: dict[str, Any] = sc.get("config", {})
        self.requests: list[dict[str, Any]] = list(sc.get("requests", []))
        self.plan = header.plan
        self.t = 0
        self.next_request = 0
        self.active: dict[int, dict[str, Any]] = {}  # slot -> request state
        self.task = 0
        self.bad_fits = 0
        """fits=false lines written: the decisions the judgement finds bad."""

    def boot(self) -> list[str]:
        return boot_lines(self.cfg, self.plan, f"kvdiag-{self.header.scenario.get('name', 'capture')}")

    def _slot(self, slot: int, func: str, message: str, task: int | None = None) -> str:
        return f"I slot {func[:12]:>12}: id {slot:2d} | task {-1 if task is None else task} | {message}"

    def _start(self, slot: int) -> list[str]:
        index = next((i for i in range(self.next_request, len(self.requests))
                      if self.requests[i]["slot"] == slot), None)
        req = self.requests[index] if index is not None else {"prompt": 0, "decode": 0}
        if index is not None:
            self.next_request = index + 1
        state = {"task": self.task, "prompt": int(req["prompt"]), "decode": int(req["decode"]),
                 "done_prompt": False, "decoded": 0}
        self.task += 1
        self.active[slot] = state
        t = state["task"]
        return [
            self._slot(slot, "get_availabl", "selected slot by LRU, t_last = -1"),
            self._slot(slot, "launch_slot_", "processing task, is_child = 0", t),
            self._slot(slot, "update_slots", f"new prompt, n_ctx_slot = "
                       f"{self.plan.get('kv_size', 0)}, n_keep = 0, task.n_tokens = "
                       f"{state['prompt']}", t),
            self._slot(slot, "update_slots", "n_tokens = 0, memory_seq_rm [0, end)", t),
        ]

    def step(self, e: ev.Step) -> list[str]:
        out: list[str] = []
        for slot in e.slots:
            state = self.active.get(slot)
            if state is None:
                out += self._start(slot)
                state = self.active[slot]
            if e.phase == "decode" and not state["done_prompt"]:
                state["done_prompt"] = True
                out.append(self._slot(slot, "update_slots", f"prompt done, n_tokens = "
                                      f"{state['prompt']}, batch.n_tokens = {e.tokens}",
                                      state["task"]))
            if e.phase == "decode":
                state["decoded"] += 1
        return out

    def after_step(self) -> list[str]:
        out: list[str] = []
        for slot, state in sorted(self.active.items()):
            if state["done_prompt"] and state["decoded"] >= state["decode"]:
                out.append(self._slot(slot, "     release", f"stop processing: n_tokens = "
                                      f"{state['prompt'] + state['decoded']}, truncated = 0",
                                      state["task"]))
                del self.active[slot]
        if out and not self.active:
            out.append("I srv  update_slots: all slots are idle")
        return out

    def fits(self, e: ev.Fits) -> list[str]:
        if outcome(e) not in BAD:
            return []
        self.bad_fits += 1
        kr = f"{_RUNTIME_PTR + e.k.runtime:#x}" if e.k.runtime is not None else "(nil)"
        vr = f"{_RUNTIME_PTR + e.v.runtime:#x}" if e.v.runtime is not None else "(nil)"
        ne = ",".join(map(str, e.dst.ne))
        return [f'E arm117 fits=false: dst={e.dst.data:#x} ne=[{ne}] type={e.dst.type} '
                f'k={e.k.data:#x} kbuf="{e.k.buffer}" | v="{e.v.buffer}" | kr={kr} vr={vr}']

    def adapt(self, e: ev.Adapt) -> list[str]:
        """The ``LLAMA_KV_STREAM_TRACE`` line of one evaluation (brief §5.3), when the event
        holds every field the runtime prints; ``layout`` as the port prints it."""
        if e.samples is None or e.misses is None or e.busy_pct is None or e.peak is None:
            return []
        layout = f", layout {e.layout}" if e.layout is not None else ""
        return [f"W kv_stream_adapt: active {e.active}, resident {e.resident}, ring {e.ring}"
                f"{layout}, samples {e.samples}, misses {e.misses}, copy busy "
                f"{e.busy_pct:.1f}%, peak {e.peak}"]

    def repartition(self, e: ev.Repartition) -> list[str]:
        """The partition change the runtime always prints (brief §5.3)."""
        tail = ""
        if e.miss_pct is not None and e.busy_pct is not None:
            tail = f", miss {e.miss_pct:.1f}%, copy busy {e.busy_pct:.1f}%"
        return [f"W kv_stream_adapt: adaptive KV partition: resident pages/layer "
                f"{e.resident[0]} -> {e.resident[1]}, ring slots {e.ring[0]} -> {e.ring[1]}"
                f"{tail}"]

    def timing(self, e: ev.Timing) -> list[str]:
        """A request's lines as the server prints them, in the newer ``print_timing`` shape that
        ``kvdiag perf`` reads back (:mod:`kvdiag.postmortem.timinglines`): ``new prompt`` (when
        the depth at the start and the slot's size are known), the cache line, the three
        timing lines (``graphs reused`` when recorded) and the release (when the depth at the
        end is known). Written together at the event's time: the ``new prompt`` line is not
        placed at ``started_ns``, since the events before this one are written already, so a
        kv-stream line of the trace logged while the request was in flight comes before its
        lines in the export (the figures, depths and slots read back are the same)."""
        if e.slot is None:
            return [f"D kvtrace: timing seq {e.seq} has no slot; its lines are not printed"]
        task = -1 if e.task is None else e.task
        out = []
        if e.depth_start is not None and e.n_ctx_slot is not None:
            out.append(self._slot(e.slot, "update_slots", f"new prompt, n_ctx_slot = "
                                  f"{e.n_ctx_slot}, n_keep = 0, task.n_tokens = "
                                  f"{e.depth_start}", task))
        if e.cached is not None:
            out.append(self._slot(e.slot, "update_slots", f"n_tokens = {e.cached}, "
                                  f"memory_seq_rm [{e.cached}, end)", task))
        prompt = _figures(e.prompt_ms, e.prompt_tokens, None, e.prompt_tps)
        decode = _figures(e.decode_ms, e.decode_tokens, e.ms_per_token, e.decode_tps)
        out += [
            self._slot(e.slot, "print_timing", f"prompt eval time = {prompt}", task),
            self._slot(e.slot, "print_timing", f"       eval time = {decode}", task),
            self._slot(e.slot, "print_timing", f"      total time = "
                       f"{_num(e.prompt_ms + e.decode_ms, 10)} ms / "
                       f"{e.prompt_tokens + e.decode_tokens:5d} tokens", task),
        ]
        if e.graphs_reused is not None:
            out.append(self._slot(e.slot, "print_timing",
                                  f"   graphs reused = {e.graphs_reused:10d}", task))
        if e.depth_end is not None:
            trunc = "" if e.truncated is None else f", truncated = {int(e.truncated)}"
            out.append(self._slot(e.slot, "     release",
                                  f"stop processing: n_tokens = {e.depth_end}{trunc}", task))
        return out

    def abort(self, e: ev.Abort) -> list[str]:
        python = python_dump(e)
        # a death by a signal alone (an imported segfault) printed no line of its own but
        # faulthandler's, which says the signal: printing the message too would be a second
        # signal line, the first one the reader takes
        lines = [] if python and _signal_only(e) else [e.message]
        frames = [f for f in e.backtrace if not f.endswith("(inlined)")]
        if not frames:
            return lines + python  # no stack recorded: none is made up
        lines.append("[Thread debugging using libthread_db enabled]")
        # gdb attached by ggml_print_backtrace waits in wait4 (an imported stack has it)
        waiting = [] if frames[:1] == ["__GI___wait4"] else ["__GI___wait4"]
        for i, function in enumerate([*waiting, *frames]):
            module = "libc.so.6" if function == "__GI___wait4" else _module_of(function)
            addr = _LIB_BASE.get(module, 0x7F32_0800_0000) + 0x1000 * (i + 1) + 0x2A7
            lines.append(f"#{i}  {addr:#018x} in {function} () from /usr/lib/{module}")
        return lines + python

    def lines(self, events: Iterable[ev.AnyEvent | ev.Unknown]) -> Iterator[str]:
        """Yield log lines; those of the runtime carry the timestamp prefix, the abort text
        and the gdb stack do not (ggml_abort writes them straight to stderr)."""
        for text in self.boot():
            yield _stamp(0, text[0]) + text[2:]
        for e in events:
            self.t = e.t_ns
            match e:
                case ev.Step():
                    batch = self.after_step() + self.step(e)
                case ev.Fits():
                    batch = self.fits(e)
                case ev.Adapt():
                    batch = self.adapt(e)
                case ev.Repartition():
                    batch = self.repartition(e)
                case ev.Warn() if e.code == "import-boot":
                    # the imported log's server started again: so does the export's (the
                    # header's configuration, the only one the trace holds)
                    batch = self.boot()
                case ev.Timing():
                    batch = self.timing(e)
                case ev.Warn():
                    func = "llama_context" if e.code == "multiseq-opt-in" else (
                        "ggml_cuda_kv_stream_fattn")
                    batch = [f"W {func}: {e.message}"]
                case ev.Abort():
                    yield from self.abort(e)
                    return
                case ev.End():
                    batch = self.after_step()
                case ev.Unknown():
                    fields = msgspec.json.encode(e.fields).decode()
                    batch = [f"D kvtrace: event of unknown kind {e.kind!r} seq {e.seq} step "
                             f"{e.step}: {fields}"]
                case _:
                    batch = []
            extra = self.extras.get(e.seq)
            if extra:
                batch.append(f"D kvtrace: seq {e.seq} fields unknown to this version: "
                             f"{msgspec.json.encode(extra).decode()}")
            for text in batch:
                yield _stamp(self.t, text[0]) + text[2:]
