"""The CuPy executor's parts that need no GPU: loading and its errors, launch planning, the
parameter blocks and the reduction of device records to ``kernel`` events."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest

from kvdiag.cli import main
from kvdiag.errors import EXIT_USAGE, DeviceUnavailable, UsageError
from kvdiag.executors import cuda_kernels as ck
from kvdiag.executors.cupy_exec import load_cupy
from kvdiag.executors.device_records import DeviceRecords, kernel_events
from kvdiag.model import events as ev


def test_without_cupy_the_executor_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` raise ImportError
    with pytest.raises(DeviceUnavailable, match=r"needs CuPy, which is not installed") as ei:
        load_cupy()
    assert "\n" not in str(ei.value) and ei.value.exit_code == EXIT_USAGE


def _fake_cupy(count: int | Exception) -> types.ModuleType:
    cupy = types.ModuleType("cupy")

    def get_count() -> int:
        if isinstance(count, Exception):
            raise count
        return count

    runtime = types.SimpleNamespace(getDeviceCount=get_count)
    cupy.cuda = types.SimpleNamespace(runtime=runtime)  # type: ignore[attr-defined]
    return cupy


def test_no_device_or_no_driver_is_unavailable_with_cudas_text(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(0))
    with pytest.raises(DeviceUnavailable, match=r"^no CUDA device found$"):
        load_cupy()
    err = RuntimeError("cudaErrorNoDevice: no CUDA-capable device is detected")
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(err))
    with pytest.raises(DeviceUnavailable) as ei:
        load_cupy()
    assert str(ei.value) == "no usable CUDA device: cudaErrorNoDevice: no CUDA-capable device " \
                            "is detected"


def test_capture_with_the_cupy_executor_and_no_gpu_is_one_line_exit_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: object
) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    out = f"{tmp_path}/t.kvtrace"
    assert main(["capture", "--executor", "cupy", "-o", out, "-q"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("kvdiag: error: ") and "CuPy" in err[0]


def test_geometry_limits_are_usage_errors() -> None:
    with pytest.raises(UsageError, match="multiple of 32"):
        ck.check_attention_geometry("f16", "f16", 80, 8, 2, 256)
    with pytest.raises(UsageError, match="iq4_nl"):
        ck.check_attention_geometry("iq4_nl", "f16", 128, 8, 2, 256)
    with pytest.raises(UsageError, match="not a multiple of n_head_kv"):
        ck.check_attention_geometry("f16", "f16", 128, 6, 4, 256)
    ck.check_attention_geometry("q8_0", "q5_1", 256, 24, 4, 256)


def test_layout_strides_and_copy_unit() -> None:
    lay = ck.fattn_layout("q8_0", "q5_1", 256, 4, page_bytes=475_136, v_offset=278_528)
    assert (lay.head_k, lay.head_v) == (272, 192)
    # q8_0 K rows at 16 mod 128 bytes: the word-wise K reads are bank-conflict free
    assert (lay.stride_k % 128, lay.stride_v % 128) == (16, 16)
    assert ck.fattn_layout("f16", "f16", 256, 4).stride_k % 128 == 64
    assert lay.vec == 16 and lay.warp_bytes == 2 * 16 * (lay.stride_k + lay.stride_v)
    assert lay.warp_bytes_for(False) == 16 * (lay.stride_k + lay.stride_v)  # one stage
    # 102-byte q8_0 heads (head dim 96) only allow 2-byte copies
    assert ck.fattn_layout("q8_0", "q8_0", 96, 1).vec == 2
    assert ck.fattn_layout("q8_0", "q8_0", 128, 2).vec == 8
    assert lay.partial_name(True) == "kv_fattn_partial<2, 6, 256, 16>"
    assert lay.partial_name(False) == "kv_fattn_rows<2, 6, 256, 16>"


def test_launch_plan_fills_one_wave_of_blocks() -> None:
    lay = ck.fattn_layout("q8_0", "q5_1", 256, 4)
    warps, blocks = ck.warps_per_block(lay, ck.DeviceLimits(), regs_per_thread=168)
    # one block an SM: registers allow 12 warps of 168 registers; smem 12 x 17 KB
    assert (warps, blocks) == (12, 1)
    assert ck.warps_per_block(lay, ck.DeviceLimits(), 168, max_warps=8) == (8, 1)
    f16 = ck.fattn_layout("f16", "f16", 256, 4)
    assert ck.warps_per_block(f16, ck.DeviceLimits(), 168) == (6, 1)  # shared memory bound
    assert f16.block_smem(6) == 6 * f16.warp_bytes + 16  # the tiles and the shared tile counter
    # the merge area ([warp][row][m, l] + [warp][row][D]) fits in the tile buffers it reuses
    assert lay.block_smem(12) == 12 * lay.warp_bytes + 16 > 12 * (96 + 8 * 256 * 4)
    # the ordinary (host-only) kernel: one warp per KV head of the block's group, one tile
    # buffer each and no merge buffer
    assert ck.warps_per_block(f16, ck.DeviceLimits(), 168, paged=False) == (4, 3)
    assert ck.warps_per_block(ck.fattn_layout("f16", "f16", 128, 6), ck.DeviceLimits(), 96,
                              paged=False)[0] == 3
    assert f16.block_smem(4, paged=False) == 4 * f16.stage_bytes
    # decode at 64K cells, 4 KV heads, 24 query heads: one row tile of 6 rows per KV head
    plan = ck.split_plan(1, 4, 6, 65536, 132 * blocks)
    assert plan.n_rowtiles == 1
    assert plan.n_splits * plan.tiles_per_block >= 65536 // 16
    assert 4 * plan.n_splits <= 132 * blocks  # one wave
    assert 4 * plan.n_splits > 132 * blocks * 0.9
    tiny = ck.split_plan(2, 2, 3, 100, 396)
    assert (tiny.n_rowtiles, tiny.tiles_per_block, tiny.n_splits) == (1, 1, 7)


def test_launch_geometry_of_both_kernels() -> None:
    lay = ck.fattn_layout("q8_0", "q5_1", 256, 4)
    # streamed, decode at 64K: splits x 1 row tile x 4 heads, merged per (row, head, 32 dims)
    geo = ck.launch_geometry(lay, (12, 1), 132, True, 1, 6, 65536)
    assert geo.grid == (33, 1, 4) and geo.block == 384
    assert geo.plan.tiles_per_block == 125  # 33 x 125 >= 4096 tiles
    assert geo.combine_grid == (6, 4, 8)
    assert geo.items == 4 * 33
    assert ck.launch_geometry(lay, (12, 1), 132, True, 1, 6, 65536, grid_order=1).grid == \
        (4, 1, 33)
    # ordinary: the block's 4 warps are the 4 KV heads, so blocks cover (split, row tile,
    # stream x head group)
    rows = ck.launch_geometry(lay, (4, 3), 132, False, 2, 6, 65536)
    assert rows.grid == (rows.plan.n_splits, 1, 2) and rows.block == 128
    assert rows.plan.n_splits == 196 and rows.plan.tiles_per_block == 21  # 2 x 196 <= 396
    assert rows.items == 2 * 4 * 196
    assert rows.smem == 4 * lay.stage_bytes


def test_pack_keeps_field_order_and_float_bits() -> None:
    fields = dict.fromkeys(ck.FATTN_FIELDS, 0)
    fields.update(magic=ck.FATTN_MAGIC, n_kv=65536, scale_log2=0.125, pool=2**63 + 5)
    packed = ck.pack(ck.FATTN_FIELDS, fields, ck.FATTN_FLOAT_FIELDS)
    assert packed[0] == ck.FATTN_MAGIC
    assert packed[ck.FATTN_FIELDS.index("n_kv")] == 65536
    assert packed[-1:].view(np.float64)[0] == 0.125
    assert packed[ck.FATTN_FIELDS.index("pool")].view(np.uint64) == 2**63 + 5
    with pytest.raises(ValueError, match="missing"):
        ck.pack(ck.FATTN_FIELDS, {"magic": 1})


def _rec(kernel: int, layer: int, stream: int, page: int, src: int, slot: int,
         block: int = 0) -> list[int]:
    return [kernel, block, layer, stream, page, src, slot, 0]


def test_device_records_collapse_into_kernel_events() -> None:
    rows = [
        # two blocks (KV heads) read each page: duplicates collapse
        *(_rec(1, 3, 0, p, 0, 10 + p, b) for p in range(4) for b in range(2)),
        _rec(1, 3, 0, 4, 1, 0),  # ring slot 0
        _rec(1, 3, 0, 5, 2, -1), _rec(1, 3, 0, 6, 2, -1),  # host
        _rec(1, 3, 0, 7, 0, 20),  # a slot that does not follow 13
        _rec(2, 3, 1, 0, 2, -1), _rec(2, 3, 1, 1, 2, -1),
        _rec(3, 0, 1, 4, 2, -1),
    ]
    events = kernel_events(DeviceRecords(np.array(rows, np.int32), dropped=2))
    assert [(e["name"], e["layer"], e["stream"]) for e in events] == [
        ("set_rows_k", 0, 1), ("fattn_streamed", 3, 0), ("fattn_ordinary", 3, 1)]
    streamed = events[1]
    assert streamed["ranges"] == ((0, 4, "pool", 10), (4, 5, "ring", 0), (5, 7, "host", -1),
                                  (7, 8, "pool", 20))
    assert streamed["records"] == 12 and streamed["dropped"] == 2
    assert events[2]["ranges"] == ((0, 2, "host", -1),)
    # the fields make a valid trace event
    e = ev.Kernel(seq=1, t_ns=0, step=0, **streamed)
    assert e.ranges[0] == (0, 4, "pool", 10)
    assert kernel_events(DeviceRecords()) == []


def test_kq_mask_packs_cells_into_little_endian_words() -> None:
    mask = np.zeros((2, 3, 70), bool)
    mask[0, 0, [0, 31, 32, 69]] = True
    mask[1, 2, 5] = True
    words = ck.mask_words(mask)
    assert words.dtype == np.uint32 and words.shape == (2, 3, 3)
    assert list(words[0, 0]) == [1 | 1 << 31, 1, 1 << 5]
    assert list(words[1, 2]) == [1 << 5, 0, 0]
    assert int(words.sum()) == int(words[0, 0].sum()) + (1 << 5)

