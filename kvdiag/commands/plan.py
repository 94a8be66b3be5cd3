"""Print the boot-time sizing the runtime would compute: host KV buffer, pages, pool, ring."""

from __future__ import annotations

import argparse

from kvdiag.commands._shape import add_shape_args


def configure(parser: argparse.ArgumentParser) -> None:
    add_shape_args(parser)
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--allow-multiseq", action="store_true",
                        help="LLAMA_KV_STREAM_ALLOW_MULTISEQ=1 (the arm117 port's opt-in)")


def run(args: argparse.Namespace) -> int:
    import json

    from rich.console import Console
    from rich.table import Table

    from kvdiag.commands._shape import build_config
    from kvdiag.kvstream.pages import MIB
    from kvdiag.kvstream.plan import make_plan

    cfg = build_config(args)
    plan = make_plan(cfg, allow_multiseq=args.allow_multiseq)
    if args.json:
        print(json.dumps({"config": cfg.as_dict(), **plan.as_json()}, indent=2))
        return 0
    console = Console()
    from kvdiag.trace.export_log import boot_lines

    for line in boot_lines(cfg.as_dict(), plan.as_json())[3:-2]:
        console.print(line[2:], style="dim", highlight=False)
    t = Table(title="kv-stream plan", show_header=False)
    t.add_column("", style="bold")
    t.add_column("")
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
        rows += [
            ("pool", f"{cfg.stage_mib} MiB → {pool.pool_pages} pages"
                     + (f" (+{plan.conversion_bytes} B F16 conversion)" if plan.conversion_bytes else "")),
            ("resident", f"{pool.resident_pages_per_layer} pages/layer "
                         f"({pool.resident_tokens_per_layer} tokens)"),
            ("ring", f"{pool.ring_slots} slots (minimum {pool.min_ring_slots})"),
        ]
    else:
        rows.append(("pool", f"[red]refused: {plan.pool_error}[/]"))
    rows.append(("fits()", f"{plan.fits_outlook}" + "".join(f"\n• {n}" for n in plan.fits_notes)))
    for gate in plan.gates:
        rows.append(("validator", f"[yellow]would refuse: {gate}[/]"))
    for k, v in rows:
        t.add_row(k, v)
    console.print(t)
    return 0
