"""Print the boot-time sizing the runtime would compute: host KV buffer, pages, pool, ring.

Exit status: 0 the runtime would boot with this plan, 1 it would refuse (the pool constructor
or the validator; the last line says why), 2 bad options.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from kvdiag.commands._shape import add_shape_args

if TYPE_CHECKING:
    from rich.console import RenderableType

    from kvdiag.kvstream.config import RuntimeConfig
    from kvdiag.kvstream.plan import Plan


def configure(parser: argparse.ArgumentParser) -> None:
    add_shape_args(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--allow-multiseq", action="store_true",
                        help="LLAMA_KV_STREAM_ALLOW_MULTISEQ=1 (the arm117 port's opt-in)")


def run(args: argparse.Namespace) -> int:
    import json
    import sys

    from rich.table import Table
    from rich.text import Text

    from kvdiag.commands._shape import build_config
    from kvdiag.errors import EXIT_FINDINGS, EXIT_OK
    from kvdiag.kvstream.plan import make_plan, multiseq_warning
    from kvdiag.runs.capture import ctx_rounding_note

    cfg = build_config(args)
    plan = make_plan(cfg, allow_multiseq=args.allow_multiseq)
    code = EXIT_FINDINGS if plan.refusal else EXIT_OK
    warning = multiseq_warning(cfg)
    note = ctx_rounding_note(args.ctx)
    if args.json:
        print(json.dumps({"config": cfg.as_dict(), **plan.as_json(),
                          "ctx_pages_per_layer": plan.ctx_pages_per_layer,
                          "refusal": plan.refusal,
                          "warnings": [w for w in (warning, note) if w]}, indent=2))
        return code
    for line in (note, f"warning: {warning}" if warning else None):
        if line:
            print(line, file=sys.stderr)  # one line each, never wrapped
    from kvdiag.export.llama_log import boot_lines
    from kvdiag.report.console import print_renderables

    parts: list[RenderableType] = [Text(line[2:], style="dim")
                                   for line in boot_lines(cfg.as_dict(), plan.as_json())[3:-2]]
    t = Table(title="kv-stream plan", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
    for k, v in plan_rows(cfg, plan):
        t.add_row(k, v)
    parts.append(t)
    refusal = plan.refusal
    if refusal:
        parts.append(Text(f"REFUSED: {refusal}", style="bold red"))
    else:
        parts.append(Text("OK: the runtime would boot with this plan", style="green"))
    print_renderables(parts)
    return code


def plan_rows(cfg: RuntimeConfig, plan: Plan) -> list[tuple[str, str]]:
    """The table's rows; pool rows say the pool's capacity and what this context uses apart
    (brief §1.4: resident pages per layer follow the pool, not the context)."""
    from kvdiag.kvstream.pages import MIB
    from kvdiag.kvstream.pool import DEFAULT_MIN_RING_SLOTS

    pool = plan.pool
    rows = [
        ("shape", f"{cfg.layers} layers ({plan.streamed_layers} streamed), head dim "
                  f"{cfg.head_dim}, {cfg.n_head} q / {cfg.n_head_kv} kv heads"),
        ("types", f"K {cfg.type_k}, V {cfg.type_v} → attention mode {plan.attention_mode}"),
        ("context", f"n_ctx {plan.n_ctx}, {plan.n_stream} stream(s) × {plan.kv_size} cells "
                    f"({plan.pages_per_stream} pages each)"),
        ("host KV buffer", f"{plan.host_kv_buffer_mib:.2f} MiB (CUDA_KV_Stream_Host)"),
        ("page bytes", f"{plan.page_bytes} (V at +{plan.v_offset}); minimum stage "
                       f"{plan.minimum_stage_bytes / MIB:.2f} MiB"),
    ]
    if pool is not None:
        used = plan.ctx_pages_per_layer
        resident = pool.resident_pages_per_layer
        rows += [
            ("pool", f"{cfg.stage_mib} MiB → {pool.pool_pages} pages"
                     + (f" (+{plan.conversion_bytes} B F16 conversion)"
                        if plan.conversion_bytes else "")),
            ("resident", f"pool capacity {resident} pages/layer ({resident * 256:,} tokens); "
                         f"this ctx uses {used} pages/layer ({used * 256:,} tokens"
                         f"{f' over {plan.n_stream} streams' if plan.n_stream > 1 else ''})"
                         + ("" if used <= resident else
                            f": {used - resident} pages/layer stream through the ring")),
        ]
        if cfg.ring_slots is not None:
            why = (f"GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS={cfg.ring_slots} sets the minimum "
                   f"(default min({DEFAULT_MIN_RING_SLOTS}, pool pages − layers))")
        else:
            why = (f"minimum {pool.min_ring_slots} = min({DEFAULT_MIN_RING_SLOTS}, pool pages "
                   f"− layers)")
        rows.append(("ring", f"{pool.ring_slots} slots: {why}; every page left after "
                             f"{resident} resident × {pool.layer_count} layers "
                             f"({pool.pool_pages} − {resident * pool.layer_count}) is a ring "
                             f"slot"))
    else:
        rows.append(("pool", f"[red]refused: {plan.pool_error}[/]"))
    rows.append(("fits()", f"{plan.fits_outlook}" + "".join(f"\n• {n}" for n in plan.fits_notes)))
    for gate in plan.gates:
        rows.append(("validator", f"[yellow]would refuse: {gate}[/]"))
    return rows
