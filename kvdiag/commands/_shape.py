"""Model-shape flags shared by ``plan`` and ``capture``; light to import (argparse only)."""

from __future__ import annotations

import argparse
from typing import Any

PRESET_NAMES = ("arm117", "small")


class _Group:
    """An argument group that leaves out the flags a command defines its own way."""

    def __init__(self, group: argparse._ArgumentGroup, skip: tuple[str, ...]) -> None:
        self.group, self.skip = group, skip

    def add_argument(self, flag: str, **kw: Any) -> None:
        if flag.lstrip("-") not in self.skip:
            self.group.add_argument(flag, **kw)


def add_shape_args(parser: argparse.ArgumentParser, skip: tuple[str, ...] = ()) -> None:
    """The shape flags; ``skip`` names flags (without dashes) the caller defines itself."""
    g = _Group(parser.add_argument_group(
        "model shape and runtime flags (override the preset/scenario)"), skip)
    g.add_argument("--preset", choices=PRESET_NAMES, help="named model shape (default: small)")
    g.add_argument("--layers", type=int, help="attention layers")
    g.add_argument("--streamed-layers", type=int, help="how many layers stream (default: all)")
    g.add_argument("--ctx", type=int,
                   help="context size (-c); a value that is not a multiple of 256 is rounded "
                        "up to one (as llama_context pads n_ctx) and a note says so")
    g.add_argument("--np", type=int, help="server slots / sequences (-np)")
    g.add_argument("--kv-unified", action="store_true", default=None,
                   help="unified KV cache (-kvu): one stream for all slots")
    g.add_argument("--type-k", help="K cache type (f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1)")
    g.add_argument("--type-v", help="V cache type")
    g.add_argument("--head-dim", type=int, help="head dimension of K and V")
    g.add_argument("--n-head", type=int, help="query heads")
    g.add_argument("--n-head-kv", type=int, help="KV heads")
    g.add_argument("--stage-mib", type=int, help="--kv-stream-stage-mib (device pool MiB)")
    g.add_argument("--ubatch", type=int, help="-ub (tokens per ubatch)")
    g.add_argument("--ring-slots", type=int,
                   help="GGML_CUDA_KV_STREAM_FIXED_RING_SLOTS (fixed ring size)")
    g.add_argument("--no-native-quants", action="store_true", default=None,
                   help="built without GGML_CUDA_FA_ALL_QUANTS (quantized pairs use F16 mode)")
    g.add_argument("--adaptive", action="store_true", default=None,
                   help="model the adaptive resident/ring partition and decode layout "
                        "(kv_stream_adapt); without it the boot partition stays fixed")


_FIELDS = {
    "layers": "layers", "streamed_layers": "streamed_layers", "ctx": "ctx", "np": "np",
    "kv_unified": "kv_unified", "type_k": "type_k", "type_v": "type_v",
    "head_dim": "head_dim", "n_head": "n_head", "n_head_kv": "n_head_kv",
    "stage_mib": "stage_mib", "ubatch": "n_ubatch", "ring_slots": "ring_slots",
    "adaptive": "adaptive",
}


def shape_overrides(args: argparse.Namespace) -> dict[str, Any]:
    out = {field: getattr(args, arg) for arg, field in _FIELDS.items()
           if getattr(args, arg, None) is not None}
    if getattr(args, "no_native_quants", None):
        out["native_quants"] = False
    for name in ("type_k", "type_v"):
        if name in out:
            out[name] = str(out[name]).lower()
    return out


def build_config(
    args: argparse.Namespace,
    base: dict[str, Any] | None = None,
    sizing: dict[str, Any] | None = None,
) -> Any:
    """RuntimeConfig from the preset, then ``sizing`` (a scenario's sizing, only when no preset
    was named), then ``base`` (what the scenario needs), then the flags."""
    from kvdiag.errors import UsageError
    from kvdiag.kvstream.config import PRESETS, RuntimeConfig

    values: dict[str, Any] = dict(PRESETS[args.preset or "small"])
    if args.preset is None:
        values.update(sizing or {})
    values.update(base or {})
    values.update(shape_overrides(args))
    for extra in ("layout", "dispatch"):
        if getattr(args, extra, None):
            values[extra] = getattr(args, extra)
    try:
        return RuntimeConfig(**values)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
