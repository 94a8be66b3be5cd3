"""One resident and one host-store decode attention launch at CTX cells (default 128K) for
q8_0/q5_1 and f16, for Nsight Compute to profile (benchmarks/run_gpu_suite.sh with NCU=1):

    ncu --clock-control none --kernel-name regex:kv_fattn_partial \
        python3 benchmarks/profile_attention.py [CTX] [NAME=INT,...]

The optional second argument adds kernel macros (as probe_timeline.py --defines).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import bench_kernels as bk

from kvdiag.executors.cupy_exec import CupyExecutor, load_cupy
from kvdiag.kvstream.backend import HOST


def main() -> int:
    cp = load_cupy()
    ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 131072
    defines = bk.parse_defines(sys.argv[2] if len(sys.argv) > 2 else "")
    pages = ctx // bk.PAGE
    q = np.random.default_rng(1).standard_normal((1, 1, bk.N_HEAD, bk.HEAD_DIM), np.float32)
    for tk, tv in bk.PAIRS:
        geom = bk.geometry(tk, tv, ctx, 1)
        ex = CupyExecutor(instrument=False, defines=defines)
        try:
            ex.setup(geom)
            bk.fill(cp, ex, geom, seed=7)
            for table in (np.arange(pages, dtype=np.int64)[None, :],
                          np.full((1, pages), HOST, np.int64)):
                ex.attend(0, (0,), q, np.array([[ctx - 1]]), ctx, table)
        finally:
            ex.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
