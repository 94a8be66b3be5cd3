"""Recognisers for single non-backtrace log lines (already cleaned by ``lines.clean``).

Each recogniser is a compiled regex plus a small function that builds one record; ``classify``
tries them in order of how cheap and how specific they are. Shapes and their sources:
boot and kv-stream lines (domain brief §5.1–§5.4, §7.2), slot lines (§7.3), the instrumented
``fits=false`` line (§4.5); the lines that say how a process died (aborts, GPU errors,
signals) are :mod:`crashlines`'.
"""

from __future__ import annotations

import re

from kvdiag.model.logrecords import (
    Abort,
    ConfigItem,
    FitsLine,
    GpuError,
    LogLine,
    SignalLine,
    SlotEvent,
    SlotEventKind,
    StreamEvent,
)
from kvdiag.postmortem import serverlog
from kvdiag.postmortem.crashlines import parse_abort, parse_gpu_error, parse_signal

Record = ConfigItem | SlotEvent | StreamEvent | FitsLine | Abort | GpuError | SignalLine

_SLOT = re.compile(r"^slot +([^:]{0,24}): +id +(\d+) \| task +(-?\d+) \| ?(.*)$")
# 2023 (server.cpp's LOG_TEE, before the SLT_* lines; the form kvdiag perf reads too:
# postmortem/timinglines.py): "slot 0 is processing [task id: 5]", "slot 0 released (412
# tokens in cache)"
_SLOT_2023 = re.compile(r"^slot (\d+) (?:is processing \[task id: (\d+)\]|released \((\d+) tokens)")
_SRV = re.compile(r"^srv +([^:]{0,24}): +(.*)$")

_CONFIG_EQ = re.compile(
    r"^(?:llama_context|llama_new_context_with_model|llama_init_from_model): +"
    r"(n_seq_max|n_ctx|n_ctx_seq|n_ctx_per_seq|n_batch|n_ubatch|flash_attn|kv_unified|"
    r"causal_attn) *= *(\S+)"
)
_KV_BUFFER = re.compile(r"^llama_kv_cache\w*: +(\S+) KV buffer size = +(\d+(?:\.\d+)?) MiB")
_KV_SIZE = re.compile(
    r"^llama_kv_cache\w*: +size = +(\d+(?:\.\d+)?) MiB \( *(\d+) cells, +(\d+) layers, +"
    r"(\d+)/(\d+) seqs\)(?:, K \((\w+)\)[^,]*, V \((\w+)\))?"
)
_KV_OLD = re.compile(
    r"^llama_kv_cache\w*: kv_size = (\d+), type_k = '(\w+)', type_v = '(\w+)', n_layer = (\d+)"
)
_STREAM_POOL = re.compile(r"KV streaming enabled, (pool|arena) = (\d+(?:\.\d+)?) MiB")
_STREAM_VALIDATED = re.compile(r"KV streaming config validated, pool = (\d+(?:\.\d+)?) MiB")
_STREAM_POOL_CREATED = re.compile(r"pool created: (\d+(?:\.\d+)?) MiB, (\d+) layer")
_STREAM_G2 = re.compile(r"KV stream bootstrap pool (\d+(?:\.\d+)?) MiB")
_STREAM_FILTER = re.compile(r"KV streaming device filter = (\S+) \((\d+) layers?\)")
_STREAM_ARENA_SKIP = re.compile(r"skipping device-memory auto-fit because a shared KV")
_MULTISEQ = re.compile(r"LLAMA_KV_STREAM_ALLOW_MULTISEQ")
_N_PARALLEL = re.compile(r"using n_parallel = (\d+) and kv_unified = (true|false)")
_MODEL_LOAD = re.compile(r"loading model '([^']+)'")
_MODEL_META = re.compile(r"^llama_model_loader: loaded meta data with .* from (.+?) \(version")
_CONSTRUCT = re.compile(r"^llama_context: constructing llama_context")
_LISTENING = re.compile(r"server is listening on|all slots are idle|model loaded")
# 2023's LOG_TEE "\nllama server listening at http://%s:%d\n\n", printed in main after the model
# loaded (examples/server/server.cpp in SJTU-IPADS/PowerInfer's December 2023 copy)
_READY_2023 = "llama server listening at "

_ADAPT = re.compile(
    r"adaptive KV partition: resident pages/layer (\d+) -> (\d+), ring slots (\d+) -> (\d+)"
    r"(?:, miss (\d+(?:\.\d+)?)%)?(?:, copy busy (\d+(?:\.\d+)?)%)?"
)
_ADAPT_TRACE = re.compile(r"^kv_stream_adapt: active \d+")
_LAYOUT_REV = re.compile(r"KV layout revision (\d+)")
_FEEDBACK = re.compile(r"ignoring invalid (?:CUDA|partition) feedback: (.*)$")
_PUBLISH = re.compile(r"failed to publish CUDA KV decode layout")
_LATENCY = re.compile(r"transfer_ring_observe_decode_latency: selected (\w+)")
_INIT_FAIL = re.compile(r"failed to initialize the context: (.*)$")
_ALLOC_FAIL = re.compile(
    r"(kv_stream\w*|phase_arena\w*): allocating (\d+(?:\.\d+)?) MiB .*failed: (.*)$"
)
_STREAM_WARN = re.compile(r"phase arena (?:currently supports TG1|decode batch too wide).*")
_NUM_PAIR = re.compile(r"([a-z][a-z /_-]*?) (-?\d+(?:\.\d+)?)%?(?=,|$)")

# A fallback warning of the dispatcher: a line in kv-stream's own words (a generic flash-attention
# fallback at boot is not the dispatcher's) that says it falls back; the port's text is not
# public (brief §3, §9), so the words are matched loosely.
_FALLBACK = re.compile(r"fall(?:ing|s)?[ -]?back", re.IGNORECASE)
_FALLBACK_CONTEXT = re.compile(r"kv.?stream|\bfits\b", re.IGNORECASE)
# in the warning's case: it is read in any case
_LAYER = re.compile(r"\blayer (\d+)\b", re.IGNORECASE)

KV_STREAM_CAPITALS = b"TREAM"
"""kv-stream's name in capitals (``KV_STREAM``, ``KV-STREAM``, ``GGML_CUDA_KV_STREAM_*``,
``LLAMA_KV_STREAM_ALLOW_MULTISEQ``), which holds no ``tream``."""
KV_STREAM_WORDS: tuple[bytes, ...] = (b"tream", KV_STREAM_CAPITALS, b"fits")
"""Substrings one of which every line this grammar reads in kv-stream's own words holds, in
the cases it reads them: ``kv_stream``, ``kv-stream``, ``KV stream``, ``KV Stream`` (``tream``),
the same in capitals, and ``fits`` (the ``fits=false`` line, §4.5; a fallback warning that names
fits()). A fallback warning (``_FALLBACK_CONTEXT``: its text is not public, brief §9, and is
read in any case) holds one of them unless it names only ``FITS`` in capitals. The scanners
that search bytes for these lines (``kvdiag perf``: ``timinglines.RARE_ANCHORS``; ``kvdiag
import``: ``logimport.convert.ANCHORS``) search for these."""

_FITS = re.compile(r"\bfits=false\b:?(.*)$")
_FITS_NE = re.compile(r"\bne=\[([-\d, ]+)\]")
_FITS_KV = re.compile(r"\b(dst|type|k|kbuf|v|kr|vr)=(\"[^\"]*\"|\S+)")


def _slot_kind(msg: str) -> SlotEventKind | None:
    if "processing task" in msg or "is processing" in msg:
        return "launch"
    if msg.startswith("new prompt"):
        return "new_prompt"
    if "stop processing" in msg or "released" in msg:
        return "release"
    if "prompt done" in msg:
        return "prompt_done"
    if "prompt processing" in msg:
        return "progress"
    if msg.startswith("selected slot"):
        return "select"
    if "n_past =" in msg or "memory_seq_rm" in msg or "kv cache rm" in msg:
        return "cache"
    if "time =" in msg or msg.strip() == "":
        return "timing"
    return None


_INT_FIELD = re.compile(r"(?<![\w.])(task\.n_tokens|n_tokens|n_past|n_prompt_tokens) = (\d+)")
_PROGRESS = re.compile(r"progress = (\d+(?:\.\d+)?)")


def parse_slot(where: LogLine, text: str) -> SlotEvent | None:
    """A ``slot <func>: id <n> | task <t> | <msg>`` line, 2023's ``slot <n> is processing``
    form, or 2024's ``server_log`` form (text or JSON: :mod:`kvdiag.postmortem.serverlog`)."""
    task: int | None
    logged: serverlog.ServerLogSlot | None = None
    m = _SLOT.match(text)
    old = None if m is not None else _SLOT_2023.match(text)
    if m is not None:
        slot, task, msg = int(m.group(2)), int(m.group(3)), m.group(4)
    elif old is not None:
        slot, msg = int(old.group(1)), text[old.end(1) + 1:]
        task = int(old.group(2)) if old.group(2) is not None else None
    else:
        logged = serverlog.parse(text)
        if logged is None:
            return None
        slot, task, msg = logged.slot, logged.task, logged.message
    kind = _slot_kind(msg)
    if kind is None:
        return None
    fields = {k: int(v) for k, v in _INT_FIELD.findall(msg)}
    if logged is not None:
        # the 2024 form keeps its figures in keys: "kv cache rm" p0 is what the cache kept,
        # "slot released" n_past the depth reached
        fields.update(logged.ints)
        if "p0" in fields:
            fields.setdefault("n_past", fields["p0"])
    n_tokens = fields.get("task.n_tokens", fields.get("n_prompt_tokens", fields.get("n_tokens")))
    n_past = fields.get("n_past")
    if old is not None and old.group(3) is not None:
        n_past = int(old.group(3))  # the tokens in cache at the release: the depth reached
    if kind == "cache" and n_past is None:
        n_past = fields.get("n_tokens")
    pm = _PROGRESS.search(msg)
    return SlotEvent(
        where=where,
        kind=kind,
        slot=slot,
        task=task if task is None or task >= 0 else None,
        n_tokens=n_tokens,
        n_past=n_past,
        progress=float(pm.group(1)) if pm else None,
        message=msg.strip()[:200],
    )


def _parse_srv(where: LogLine, text: str) -> SlotEvent | None:
    m = _SRV.match(text)
    if m is None:
        return None
    msg = m.group(2)
    if "all slots are idle" in msg:
        return SlotEvent(where=where, kind="idle", message=msg.strip())
    if msg.startswith("done request:") or msg.startswith("request:"):
        return SlotEvent(where=where, kind="request_done", message=msg.strip()[:200])
    return None


def _num(text: str) -> int | float:
    return float(text) if "." in text else int(text)


def _parse_config(where: LogLine, text: str) -> list[ConfigItem]:
    out: list[ConfigItem] = []

    def item(key: str, value: str | int | float | bool) -> None:
        out.append(ConfigItem(where=where, key=key, value=value))

    if text.startswith("llama_"):
        m = _CONFIG_EQ.match(text)
        if m is not None:
            key, raw = m.group(1), m.group(2)
            key = "n_ctx_seq" if key == "n_ctx_per_seq" else key
            if key == "kv_unified":
                item(key, raw == "true" or raw == "1")
            elif key == "flash_attn":
                item(key, {"0": "disabled", "1": "enabled"}.get(raw, raw))
            elif raw.lstrip("-").isdigit():
                item(key, int(raw))
            return out
        if _CONSTRUCT.match(text):
            item("construct", True)
            return out
        m = _KV_BUFFER.match(text)
        if m is not None:
            item(f"kv_buffer:{m.group(1)}", float(m.group(2)))
            if "KV_Stream" in m.group(1):
                item("kv_stream", True)
            return out
        m = _KV_SIZE.match(text)
        if m is not None:
            item("kv_cells", int(m.group(2)))
            item("n_layer", int(m.group(3)))
            item("n_seq_max", int(m.group(4)))
            item("n_stream", int(m.group(5)))
            if m.group(6):
                item("type_k", m.group(6))
                item("type_v", m.group(7))
            return out
        m = _KV_OLD.match(text)
        if m is not None:
            item("kv_cells", int(m.group(1)))
            item("type_k", m.group(2))
            item("type_v", m.group(3))
            item("n_layer", int(m.group(4)))
            return out
        m = _MODEL_META.match(text)
        if m is not None:
            item("model", m.group(1))
    m = _STREAM_POOL.search(text)
    if m is not None:
        item("kv_stream", True)
        item(f"kv_stream_{m.group(1)}_mib", float(m.group(2)))
        return out
    m = _STREAM_VALIDATED.search(text) or _STREAM_G2.search(text)
    if m is not None:
        item("kv_stream", True)
        item("kv_stream_pool_mib", float(m.group(1)))
        return out
    m = _STREAM_POOL_CREATED.search(text)
    if m is not None:
        item("kv_stream", True)
        item("kv_stream_pool_mib", float(m.group(1)))
        item("kv_stream_layers", int(m.group(2)))
        return out
    m = _STREAM_FILTER.search(text)
    if m is not None:
        item("kv_stream_device", m.group(1))
        item("kv_stream_layers", int(m.group(2)))
        return out
    if _STREAM_ARENA_SKIP.search(text):
        item("kv_stream", True)
        return out
    if _MULTISEQ.search(text) and "fail" not in text:
        item("multiseq_optin", True)
        return out
    m = _N_PARALLEL.search(text)
    if m is not None:
        item("n_parallel", int(m.group(1)))
        item("kv_unified", m.group(2) == "true")
        return out
    m = _MODEL_LOAD.search(text)
    if m is not None:
        item("model", m.group(1))
        return out
    if ((_LISTENING.search(text) and text.startswith(("srv", "main:", "llama_server")))
            or text.startswith(_READY_2023) or serverlog.is_ready(text)):
        item("ready", True)
    return out


def _parse_stream(where: LogLine, text: str) -> StreamEvent | None:
    if "stream" in text or "KV" in text or "arena" in text:
        m = _ADAPT.search(text)
        if m is not None:
            values: dict[str, float] = {
                "resident_from": float(m.group(1)),
                "resident_to": float(m.group(2)),
                "ring_from": float(m.group(3)),
                "ring_to": float(m.group(4)),
            }
            if m.group(5):
                values["miss_pct"] = float(m.group(5))
            if m.group(6):
                values["copy_busy_pct"] = float(m.group(6))
            return StreamEvent(where=where, kind="repartition", message=text, values=values)
        if _ADAPT_TRACE.match(text) or _LAYOUT_REV.search(text):
            body = text.split(":", 1)[1]
            vals = {k.strip().replace(" ", "_"): float(v) for k, v in _NUM_PAIR.findall(body)}
            return StreamEvent(where=where, kind="trace", message=text, values=vals)
        m = _FEEDBACK.search(text)
        if m is not None:
            return StreamEvent(where=where, kind="feedback_error", message=m.group(1))
        if _PUBLISH.search(text):
            return StreamEvent(where=where, kind="layout_error", message=text)
        m = _LATENCY.search(text)
        if m is not None:
            return StreamEvent(where=where, kind="latency", message=m.group(1))
        m = _ALLOC_FAIL.search(text)
        if m is not None:
            return StreamEvent(
                where=where, kind="alloc_failure", message=text,
                values={"mib": float(m.group(2))},
            )
        m = _STREAM_WARN.search(text)
        if m is not None:
            return StreamEvent(where=where, kind="warning", message=m.group(0))
    m = _INIT_FAIL.search(text)
    if m is not None:
        return StreamEvent(where=where, kind="config_failure", message=m.group(1).strip())
    return None


def is_fallback_warning(text: str) -> bool:
    """A kv-stream line that says the dispatcher falls back (to ordinary flash attention over
    the host buffer, brief §3)."""
    return _FALLBACK.search(text) is not None and _FALLBACK_CONTEXT.search(text) is not None


def layer_of(text: str) -> int | None:
    """The ``layer <n>`` a line names, if any."""
    m = _LAYER.search(text)
    return int(m.group(1)) if m else None


def parse_fits(where: LogLine, text: str) -> FitsLine | None:
    m = _FITS.search(text)
    if m is None:
        return None
    body = m.group(1)
    ne_m = _FITS_NE.search(body)
    ne: tuple[int, ...] = ()
    if ne_m is not None:
        try:
            ne = tuple(int(x) for x in ne_m.group(1).replace(" ", "").split(",") if x)
        except ValueError:
            ne = ()
    kv = {k: v.strip('"') for k, v in _FITS_KV.findall(body)}
    return FitsLine(where=where, ne=ne, type=kv.get("type"), dst=kv.get("dst"), k=kv.get("k"),
                    kbuf=kv.get("kbuf"), vbuf=kv.get("v"), kr=kv.get("kr"), vr=kv.get("vr"))


def classify(where: LogLine, text: str) -> list[Record]:
    """All records one cleaned line yields (usually zero or one)."""
    out: list[Record] = []
    if text.startswith("slot ") or serverlog.mentions(text):
        ev = parse_slot(where, text)
        if ev is not None:
            return [ev]
    if text.startswith("srv "):
        ev = _parse_srv(where, text)
        if ev is not None:
            return [ev]
    if "fits=false" in text:
        fl = parse_fits(where, text)
        if fl is not None:
            return [fl]
    aborts = parse_abort(where, text)
    if aborts:
        out.extend(aborts)
    err = parse_gpu_error(where, text)
    if err is not None:
        out.append(err)
    if out:
        return out
    st = _parse_stream(where, text)
    if st is not None:
        return [st]
    items = _parse_config(where, text)
    if items:
        return list(items)
    sig = parse_signal(where, text)
    if sig is not None:
        return [sig]
    return out
