"""The imported trace's header: backend ``import``, scenario from the log, plan from its boot.

Boot facts come from the post-mortem scanner (:class:`kvdiag.model.logrecords.BootConfig`:
the ``CUDA_KV_Stream_Host KV buffer size`` line, the size line with cells, layers, seqs and
types, the ``n_seq_max``/``kv_unified`` lines, the streaming pool line; domain brief §5.1,
§7.2). The model loader's ``print_info:`` lines (head dims, head counts) and the CUDA device
line are not part of that grammar; :class:`BootSniffer` picks them out while the scanner reads
the same bytes. Page bytes are computed (§1.3, :mod:`kvdiag.kvstream.pages`) only when both
types, both head dims and the KV head count are known; every computed key is listed in
``extra.import.derived`` so that nobody mistakes it for a logged number.
"""

from __future__ import annotations

import os
import re
from typing import Any

from kvdiag.kvstream.pages import MIB, PageGeometry
from kvdiag.logimport.convert import beyond_64_bits
from kvdiag.model.events import Device, Header
from kvdiag.model.logrecords import BootConfig
from kvdiag.model.pages import PAGE_TOKENS
from kvdiag.postmortem.lines import clean
from kvdiag.trace.writer import make_header

KV_STREAM_BUFFER = "CUDA_KV_Stream_Host"

# llama_model_loader's print_info (llama-model.cpp): "print_info: n_head_kv        = 4";
# models whose value differs per layer print a list, which is not a single geometry: skipped.
_PRINT_INFO = re.compile(r"print_info: +(n_embd_head_k|n_embd_head_v|n_head|n_head_kv) += +(\d+)\s*$")
# ggml-cuda's device list: "  Device 0: NVIDIA H200, compute capability 9.0, VMM: yes"
_DEVICE = re.compile(r"Device (\d+): (.+?), compute capability (\d+\.\d+)")
_NEEDLES = (b"print_info:", b"compute capability")
_TAIL = 4096


class BootSniffer:
    """Fed every block the scanner reads; keeps the first value of each boot-time fact."""

    def __init__(self) -> None:
        self.info: dict[str, int] = {}
        self.device: tuple[str, str] | None = None
        self._tail = b""

    def feed(self, data: bytes) -> None:
        if self.device is not None and len(self.info) == 4:
            return
        buf = self._tail + data
        for needle in _NEEDLES:
            pos = buf.find(needle)
            while pos >= 0:
                start = buf.rfind(b"\n", 0, pos) + 1
                end = buf.find(b"\n", pos)
                if end < 0:
                    break  # the rest of the line comes with the next block (kept in the tail)
                if end >= len(self._tail):  # lines that ended inside the tail were read
                    self._line(buf[start:end])
                pos = buf.find(needle, end)
        self._tail = buf[-_TAIL:]

    def _line(self, raw: bytes) -> None:
        text, _level = clean(raw)
        m = _PRINT_INFO.search(text)
        if m is not None:
            self.info.setdefault(m.group(1), int(m.group(2)))
            return
        d = _DEVICE.search(text)
        if d is not None and self.device is None:
            self.device = (d.group(2).strip(), d.group(3))


def chosen_boot(boots: tuple[BootConfig, ...]) -> BootConfig | None:
    """The boot the plan describes: the first that streams KV, else the first."""
    for boot in boots:
        if boot.kv_stream:
            return boot
    return boots[0] if boots else None


def plan_of(boot: BootConfig | None, info: dict[str, int]) -> tuple[dict[str, Any], list[str]]:
    """Plan keys (names of the model's plan, ``Plan.as_json``) the log gives, and the keys that
    were computed rather than read."""
    plan: dict[str, Any] = {}
    derived: list[str] = []
    if boot is not None:
        for key, value in (("kv_size", boot.kv_cells), ("n_stream", boot.n_stream),
                           ("layers", boot.n_layer), ("streamed_layers", boot.kv_stream_layers),
                           ("type_k", boot.type_k), ("type_v", boot.type_v),
                           ("n_ctx", boot.n_ctx)):
            if value is not None:
                plan[key] = value
        host = boot.kv_buffers.get(KV_STREAM_BUFFER)
        if host is not None:
            plan["host_kv_buffer_mib"] = host
        pool = boot.kv_stream_pool_mib or boot.kv_stream_arena_mib
        if pool is not None:
            plan["pool_bytes"] = int(pool * MIB)
        if boot.kv_cells is not None:
            plan["pages_per_stream"] = -(-boot.kv_cells // PAGE_TOKENS)
            derived.append("pages_per_stream")
    hk, hv, n_kv = info.get("n_embd_head_k"), info.get("n_embd_head_v"), info.get("n_head_kv")
    if hk is not None and hk == hv:
        plan["head_dim"] = hk
    elif hk is not None:
        plan["head_dim_k"] = hk
        if hv is not None:
            plan["head_dim_v"] = hv
    for key in ("n_head", "n_head_kv"):
        if key in info:
            plan[key] = info[key]
    tk, tv = plan.get("type_k"), plan.get("type_v")
    if tk and tv and hk and hv and n_kv:
        try:
            geom = PageGeometry(tk, tv, hk, hv, n_kv)
        except (ValueError, KeyError):
            geom = None
        if geom is not None:
            # G1: the ring stages one page per slot, stage_bytes = page_bytes (brief §1.4)
            plan.update(page_bytes=geom.page_bytes, v_offset=geom.v_offset,
                        stage_bytes=geom.page_bytes)
            derived += ["page_bytes", "v_offset", "stage_bytes"]
    return plan, derived


def boot_json(boot: BootConfig) -> dict[str, Any]:
    """The boot facts as the scanner read them (without its evidence lines)."""
    out: dict[str, Any] = {}
    for key in BootConfig.__struct_fields__:
        if key in ("evidence", "source"):
            continue
        value = getattr(boot, key)
        if value is not None and value != {} and value is not False:
            out[key] = value
    return out


def runtime_config(boot: BootConfig | None, plan: dict[str, Any]) -> dict[str, Any]:
    """The model's ``RuntimeConfig`` keys (kvdiag/kvstream/config.py) the log gives, from the
    boot and the plan keys of :func:`plan_of`; layout and dispatch are what the fork did, which
    a log does not say (empty)."""
    config: dict[str, Any] = {"layout": "", "dispatch": ""}
    if boot is not None:
        pool = boot.kv_stream_pool_mib or boot.kv_stream_arena_mib
        for key, value in (("np", boot.n_seq_max or boot.n_parallel),
                           ("kv_unified", boot.kv_unified), ("ctx", boot.n_ctx),
                           ("layers", boot.n_layer), ("streamed_layers", boot.kv_stream_layers),
                           ("type_k", boot.type_k), ("type_v", boot.type_v),
                           ("n_ubatch", boot.n_ubatch),
                           ("stage_mib", None if pool is None else round(pool, 2))):
            if value is not None:
                config[key] = value
    for key in ("head_dim", "n_head", "n_head_kv"):
        if key in plan:
            config[key] = plan[key]
    return config


def build_header(display: str, boots: tuple[BootConfig, ...], sniffer: BootSniffer,
                 lines: int, unknown: list[str]) -> Header:
    boot = chosen_boot(boots)
    plan, derived = plan_of(boot, sniffer.info)
    config = runtime_config(boot, plan)
    scenario: dict[str, Any] = {"name": os.path.basename(display), "source": "log",
                                "description": f"imported from {display}",
                                "log": display, "config": config}
    if boot is not None:
        scenario["boot"] = boot_json(boot)
    device = Device(name="unknown")
    if sniffer.device is not None:
        device = Device(name=sniffer.device[0], compute_capability=sniffer.device[1])
    extra: dict[str, Any] = {"import": {"lines": lines, "boots": len(boots),
                                        "derived": derived, "unknown": unknown}}
    wide = _drop_wide(scenario, "scenario") + _drop_wide(plan, "plan")
    if wide:
        extra["import"]["wider_than_64_bits"] = wide
    return make_header("import", device, scenario=scenario, plan=plan, extra=extra)


def _drop_wide(values: dict[str, Any], path: str) -> list[str]:
    """Remove the numbers a trace cannot hold (wider than 64 bits: a damaged boot line's) from
    ``values``, nested dicts included; return where they were. Written, the header would be
    refused by every reader."""
    dropped: list[str] = []
    for key in list(values):
        value = values[key]
        if isinstance(value, dict):
            dropped += _drop_wide(value, f"{path}.{key}")
        elif beyond_64_bits(value):
            del values[key]
            dropped.append(f"{path}.{key}")
    return dropped
