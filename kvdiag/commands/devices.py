"""List the NVIDIA GPUs NVML reports: name, memory, driver, PCIe link, compute capability.

Exit status: 0 when at least one GPU is listed; 1 when there is none (no driver, no NVML, or
no device), after a one-line message saying why, so ``kvdiag devices && ...`` guards GPU work.

``--profile`` measures the GPU's HBM read, zero-copy read and pinned host→device bandwidths
and its kernel launch latency with kvdiag's own kernels (needs CuPy), prints them and saves
the profile where ``capture --profile NAME`` finds it (or to ``--save PATH``).
"""

from __future__ import annotations

import argparse

EXIT_NO_GPU = 1


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.add_argument("--profile", action="store_true",
                        help="measure a device profile of GPU --device and save it")
    parser.add_argument("--device", type=int, default=0, help="GPU index for --profile")
    parser.add_argument("--save", metavar="PATH", help="where --profile writes the profile "
                        "('-': standard output)")
    parser.add_argument("--force", action="store_true", help="replace --save PATH if it exists")


def _profile(args: argparse.Namespace) -> int:
    import sys

    import msgspec

    from kvdiag.errors import DeviceUnavailable, UsageError
    from kvdiag.files.outputs import plan_output
    from kvdiag.kvstream.profiles import save_profile

    if args.device < 0:
        raise UsageError(f"--device {args.device}: GPU indices start at 0")
    # checked before the GPU is touched: measuring takes a while
    out = plan_output(args.save, force=args.force, flag="--save") if args.save else None
    from kvdiag.executors.cupy_exec import load_cupy
    from kvdiag.executors.cupy_profile import measure_profile

    try:
        cp = load_cupy()
        count = int(cp.cuda.runtime.getDeviceCount())
        if args.device >= count:
            raise UsageError(f"--device {args.device}: this machine has {count} GPU(s), "
                             f"numbered from 0")
        cp.cuda.Device(args.device).use()
        name = cp.cuda.runtime.getDeviceProperties(args.device)["name"].decode()
    except DeviceUnavailable as exc:
        print(f"kvdiag devices --profile: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    profile = measure_profile(cp, name)
    path = save_profile(profile, out)
    # with --save - standard output carries the profile itself
    report = sys.stderr if out is not None and out.to_stdout else sys.stdout
    if args.json:
        print(msgspec.json.format(msgspec.json.encode(profile)).decode(), file=report)
    else:
        print(f"{profile.name}: HBM read {profile.hbm_read_gbps:g} GB/s, zero-copy read "
              f"{profile.zero_copy_read_gbps:g} GB/s, pinned H2D {profile.h2d_gbps:g} GB/s, "
              f"launch {profile.launch_us:g} us", file=report)
        print(f"saved to {path}", file=report)
    return 0


def run(args: argparse.Namespace) -> int:
    if args.profile:
        return _profile(args)
    import json
    import sys
    from dataclasses import asdict

    from kvdiag.telemetry import Nvml, list_gpus

    nvml = Nvml()
    try:
        gpus = list_gpus(nvml)
        reason = nvml.unavailable_reason or nvml.last_error
    finally:
        nvml.shutdown()
    if args.json:
        print(json.dumps({
            "gpus": [{**asdict(g), "pcie": g.pcie} for g in gpus],
            "reason": None if gpus else (reason or "NVML reports no GPU"),
        }, indent=2))
        return 0 if gpus else EXIT_NO_GPU
    if not gpus:
        why = f" ({reason})" if reason else ""
        print(f"no NVIDIA GPU found{why}", file=sys.stderr)
        return EXIT_NO_GPU

    from rich.table import Table

    table = Table(title="GPUs (NVML)")
    for col in ("#", "name", "memory", "driver", "CUDA", "PCIe link", "cc", "bus"):
        table.add_column(col, justify="right" if col in ("#", "memory") else "left",
                         no_wrap=True)
    for g in gpus:
        mem = f"{g.memory_bytes / 2**30:.1f} GiB" if g.memory_bytes else "n/a"
        table.add_row(str(g.index), g.name, mem, g.driver or "n/a", g.cuda_driver or "n/a",
                      g.pcie or "n/a", g.compute_capability or "n/a", g.bus_id or "n/a")
    from kvdiag.report.console import print_renderables

    print_renderables([table])
    return 0
