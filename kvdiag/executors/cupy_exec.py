"""The CuPy executor: the data plane of kvdiag on a real GPU.

Memory is allocated the way the runtime allocates it: the host store (``CUDA_KV_Stream_Host``)
is one pinned, mapped ``cudaHostAlloc`` region that kernels read and write zero-copy, the pool
is one ``cudaMalloc`` of ``pool_pages × page_bytes``. Kernels come from ``kernels/*.cu``
(NVRTC through ``cupy.RawModule``): set_rows quantizes on the GPU straight into the host store,
uploads are ``cudaMemcpy2DAsync`` batches on a copy stream ordered by events, and attention
follows the page table the model hands over. Every kernel appends records to a device ring
that :meth:`CupyExecutor.drain_records` returns. CUDA failures become :class:`CudaFailure`
carrying CUDA's error text.

Numbers: K/V are dequantized in-kernel to f16 and Q is rounded to f16 for the tensor-core
products (fp32 accumulation), as ggml's CUDA flash attention does; against the NumPy executor
the outputs agree within :data:`PARITY_ATOL` for unit-scale inputs (measured on an H200:
benchmarks/results/gpu_tests.txt).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from kvdiag.errors import DeviceFault, DeviceUnavailable, UsageError
from kvdiag.executors import cuda_kernels as ck
from kvdiag.executors.cuda_launch import DriverLauncher, LaunchError
from kvdiag.executors.device_records import DeviceRecords, kernel_events
from kvdiag.kvstream.backend import HOST, F32Array, I64Array, StoreGeometry
from kvdiag.kvstream.views import AddressMap
from kvdiag.model.events import Device

PARITY_ATOL = 6e-3
"""Max |out_cupy − out_numpy| for unit-variance Q, K, V (f16 operands, fp32 accumulation)."""

_HOST_ALLOC_PORTABLE = 1  # cudaHostAllocPortable
_HOST_ALLOC_MAPPED = 2  # cudaHostAllocMapped
_H2D = 1  # cudaMemcpyHostToDevice
_MIN_CC = (8, 0)  # cp.async and mma.m16n8k16 f16 need sm_80; movmatrix sm_75


class CudaFailure(DeviceFault):
    """A CUDA call or kernel failed; ``cuda_error`` is CUDA's (or NVRTC's) own text."""


def load_cupy() -> Any:
    """Import CuPy and check that a usable CUDA device exists, else DeviceUnavailable."""
    try:
        import cupy
    except ImportError:
        raise DeviceUnavailable(
            "the cupy executor needs CuPy, which is not installed "
            "(pip install 'kvdiag[cuda13]' or 'kvdiag[cuda12]')"
        ) from None
    except Exception as exc:  # a broken CUDA library install fails inside cupy's import
        raise DeviceUnavailable(f"CuPy failed to load: {type(exc).__name__}: {exc}") from None
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        raise DeviceUnavailable(f"no usable CUDA device: {_cuda_text(exc)}") from None
    if count == 0:
        raise DeviceUnavailable("no CUDA device found")
    return cupy


def _cuda_text(exc: BaseException) -> str:
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def params_struct(params: npt.NDArray[np.int64]) -> npt.NDArray[np.void]:
    """The packed parameter block as one value of a struct type, which CuPy passes to a kernel
    by value (the kernels take ``const __grid_constant__ FattnParams``)."""
    return params.view(np.dtype([("fields", np.int64, (params.size,))]))


@dataclass
class AttendLaunch:
    """One prepared attention: both kernels, their parameter block (host bytes, passed by
    value) and output buffer. The benchmark replays :meth:`run` between CUDA events, on the
    current CuPy stream; ``attend`` runs it once. With a driver launcher the merge kernel is a
    programmatic dependent launch where the GPU supports it (``programmatic``)."""

    cp: Any
    partial: Any
    combine: Any
    geometry: ck.LaunchGeometry
    params: npt.NDArray[np.int64]
    keep: tuple[Any, ...]
    out: Any
    launcher: DriverLauncher | None = None
    programmatic: bool = False

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.geometry.grid

    def run(self) -> None:
        self.run_partial()
        self.run_combine()

    def run_partial(self, params: npt.NDArray[np.int64] | None = None) -> None:
        """The partial kernel alone (``params`` replaces the prepared block: benchmarks)."""
        geo = self.geometry
        self._launch(self.partial, geo.grid, geo.block, geo.smem,
                     self.params if params is None else params, False)

    def run_combine(self, params: npt.NDArray[np.int64] | None = None) -> None:
        self._launch(self.combine, self.geometry.combine_grid, 256, 0,
                     self.params if params is None else params, self.programmatic)

    def _launch(self, kernel: Any, grid: tuple[int, int, int], block: int, smem: int,
                params: npt.NDArray[np.int64], programmatic: bool) -> None:
        if self.launcher is None:
            kernel(grid, (block,), (params_struct(params),), shared_mem=smem)
        else:
            stream = int(self.cp.cuda.get_current_stream().ptr)
            self.launcher.launch(kernel, grid, block, smem, stream, params, programmatic)


def open_cupy_executor(device: int = 0) -> tuple[CupyExecutor, Device]:
    """The executor on GPU ``device`` and the trace header's description of that GPU (NVML's
    words where NVML answers, CUDA's otherwise)."""
    executor = CupyExecutor(device)
    from kvdiag.telemetry import Nvml, gpu_info

    nvml = Nvml()
    try:
        info = gpu_info(nvml, device)
    finally:
        nvml.shutdown()
    if info is not None:
        return executor, info.as_device()
    return executor, Device(name=executor.device_name, memory_bytes=executor.memory_bytes,
                            compute_capability=executor.compute_capability)


class CupyExecutor:
    """Implements ``kvdiag.kvstream.backend.Executor`` on a CUDA GPU through CuPy."""

    name = "cupy"

    def __init__(self, device: int = 0, instrument: bool = True,
                 ring_capacity: int = 1 << 16, defines: dict[str, int] | None = None) -> None:
        self.cp = load_cupy()
        self.device_id = device
        self.instrument = instrument
        # More -D macros for the kernels (KVDIAG_PDL_TRIGGER, KVDIAG_TIMELINE: benchmarks)
        self.defines = dict(defines or {})
        self.ring_capacity = ring_capacity
        self.geom: StoreGeometry | None = None
        self.ring_slots = 0
        self._host_ptr = 0
        self._host_size = 0
        self._host_dev = 0
        self._host_offsets: list[tuple[int, int]] = []
        self._pool: Any = None
        self._upload_rows: list[list[int]] = []
        self._partial: dict[bool, Any] = {}
        self._masked: tuple[dict[bool, Any], Any] | None = None
        self._set_rows: dict[str, Any] = {}
        self._compare: Any = None
        # Launch layout (fattn_paged.cu): 1 = the KV heads of a split are consecutive blocks;
        # interleave 1 = splits take tiles round-robin instead of one contiguous range each.
        self.grid_order = 0
        self.interleave = 0
        # at most this many warps a streamed block (a benchmark knob; set before attending)
        self.max_streamed_warps = ck.MAX_STREAMED_WARPS
        # (warps a block, blocks an SM) of the streamed (True) and ordinary (False) kernel
        self.launch_shape: dict[bool, tuple[int, int]] = {}
        try:
            self._dev = self.cp.cuda.Device(device)
            with self._dev:
                props = self.cp.cuda.runtime.getDeviceProperties(device)
        except Exception as exc:
            raise DeviceUnavailable(f"CUDA device {device}: {_cuda_text(exc)}") from None
        cc = (int(props["major"]), int(props["minor"]))
        raw_name = props.get("name", b"GPU")
        self.device_name = raw_name.decode() if isinstance(raw_name, bytes) else str(raw_name)
        if cc < _MIN_CC:
            raise DeviceUnavailable(
                f"{self.device_name} is compute capability {cc[0]}.{cc[1]}; the kvdiag kernels "
                f"need {_MIN_CC[0]}.{_MIN_CC[1]} or newer")
        self.memory_bytes = int(props.get("totalGlobalMem", 0)) or None
        self.compute_capability = f"{cc[0]}.{cc[1]}"
        # Attention kernels go through cuLaunchKernelEx (programmatic dependent launch of the
        # merge from compute capability 9.0); CuPy's launch where the driver lacks it.
        self.launcher: DriverLauncher | None = None
        with suppress(LaunchError):
            self.launcher = DriverLauncher()
        self.programmatic = cc >= (9, 0)
        self.limits = ck.DeviceLimits(
            sm_count=int(props["multiProcessorCount"]),
            smem_per_sm=int(props["sharedMemPerMultiprocessor"]),
            smem_per_block=int(props.get("sharedMemPerBlockOptin", props["sharedMemPerBlock"])),
            regs_per_sm=int(props["regsPerMultiprocessor"]),
            max_warps_per_sm=int(props["maxThreadsPerMultiProcessor"]) // 32,
        )

    # -- errors ------------------------------------------------------------------------

    @contextmanager
    def _cuda(self, what: str) -> Iterator[None]:
        cp = self.cp
        errors: tuple[type[BaseException], ...] = (
            cp.cuda.runtime.CUDARuntimeError, cp.cuda.driver.CUDADriverError,
            cp.cuda.compiler.CompileException, LaunchError)
        try:
            with self._dev:
                yield
        except errors as exc:
            text = _cuda_text(exc)
            raise CudaFailure(f"CUDA error during {what}: {text}", text) from None

    # -- setup -------------------------------------------------------------------------

    def setup(self, geom: StoreGeometry) -> None:
        self.close()
        ck.check_attention_geometry(geom.type_k, geom.type_v, geom.head_dim, geom.n_head,
                                    geom.n_head_kv, geom.page_tokens)
        self.geom = geom
        self.ring_slots = int(getattr(geom, "ring_slots", 0) or 0)
        width = geom.head_dim * geom.n_head_kv
        self.row_k = width // 32 * ck.BLOCK32_BYTES[geom.type_k]
        self.row_v = width // 32 * ck.BLOCK32_BYTES[geom.type_v]
        self.layout = ck.fattn_layout(geom.type_k, geom.type_v, geom.head_dim, geom.n_head_kv,
                                      geom.page_bytes, geom.v_offset)
        if geom.v_offset < geom.page_tokens * self.row_k or \
                geom.page_bytes < geom.v_offset + geom.page_tokens * self.row_v:
            raise UsageError(f"page_bytes {geom.page_bytes} / v_offset {geom.v_offset} cannot "
                             f"hold {geom.page_tokens} rows of {self.row_k} + {self.row_v} bytes")
        cp = self.cp
        with self._cuda("setup"):
            # Host store: per layer K [n_stream * kv_size rows] then V, each 256-byte aligned.
            offsets: list[tuple[int, int]] = []
            size = 0
            per_k = geom.n_stream * geom.kv_size * self.row_k
            per_v = geom.n_stream * geom.kv_size * self.row_v
            for _ in range(geom.n_layers):
                k_off = size
                size = -(-(size + per_k) // 256) * 256
                v_off = size
                size = -(-(size + per_v) // 256) * 256
                offsets.append((k_off, v_off))
            self._host_offsets = offsets
            self._host_size = max(size, 256)
            self._host_ptr = int(cp.cuda.runtime.hostAlloc(
                self._host_size, _HOST_ALLOC_MAPPED | _HOST_ALLOC_PORTABLE))
            ctypes.memset(self._host_ptr, 0, self._host_size)
            attrs = cp.cuda.runtime.pointerGetAttributes(self._host_ptr)
            self._host_dev = int(attrs.devicePointer) or self._host_ptr
            # Pool: one cudaMalloc, zeroed so a never-uploaded slot reads as zeros (as the NumPy
            # executor models it).
            self._pool = cp.cuda.Memory(max(geom.pool_pages * geom.page_bytes, 256))
            cp.cuda.runtime.memset(self._pool.ptr, 0, max(geom.pool_pages * geom.page_bytes, 256))
            self._stream = cp.cuda.Stream(non_blocking=True)
            self._copy = cp.cuda.Stream(non_blocking=True)
            self._counter = cp.zeros(1, cp.uint32)
            self._records = cp.zeros((self.ring_capacity, ck.RECORD_INTS), cp.int32)
            # measured feedback (begin_evaluation / end_evaluation): the published upload
            # number, the deadline counters, copy-stream spans of this evaluation
            self._published = cp.zeros(1, cp.uint32)
            self._deadline = cp.zeros(2, cp.uint32)
            self._deadline_seen = (0, 0)
        self._upload_seq = 0
        self._copy_spans: list[tuple[Any, Any]] = []
        self._eval_start: Any = None
        self._deadline_kernels: tuple[Any, Any] | None = None
        self._partial = {}
        self._masked = None
        self._set_rows = {}

    def _compile_attention(self) -> None:
        """NVRTC-compile the attention kernels for this geometry (on first use; CuPy caches
        the binary on disk) and fix the launch shape from their register count."""
        if self._partial:
            return
        self._partial, self._combine, self.launch_shape = self._build_attention(False)

    def _masked_kernels(self) -> tuple[dict[bool, Any], Any]:
        """The build that applies an explicit KQ mask (KVDIAG_KQ_MASK=1; the default build
        leaves the test out of the tile loop), compiled when a unified multi-sequence capture
        first needs it. It must launch in the default build's shape."""
        self._compile_attention()
        if self._masked is None:
            partial, combine, shapes = self._build_attention(True)
            if shapes != self.launch_shape:
                raise DeviceUnavailable(
                    f"the masked attention kernels launch as {shapes}, the others as "
                    f"{self.launch_shape}")
            self._masked = (partial, combine)
        return self._masked

    def _build_attention(self, masked: bool) -> tuple[dict[bool, Any], Any,
                                                      dict[bool, tuple[int, int]]]:
        cp, lay = self.cp, self.layout
        names = [lay.partial_name(True), lay.partial_name(False), lay.combine_name()]
        options = self._options() + (("-DKVDIAG_KQ_MASK=1",) if masked else ())
        with self._cuda("compiling the attention kernels"):
            fattn = cp.RawModule(code=ck.kernel_source("fattn_paged.cu"), options=options,
                                 name_expressions=names)
            partial = {True: fattn.get_function(names[0]), False: fattn.get_function(names[1])}
            shapes: dict[bool, tuple[int, int]] = {}
            for paged, k in partial.items():
                shapes[paged] = ck.warps_per_block(lay, self.limits, int(k.num_regs), paged,
                                                   self.max_streamed_warps)
                k.max_dynamic_shared_size_bytes = lay.block_smem(shapes[paged][0], paged)
            return partial, fattn.get_function(names[2]), shapes

    def _compile_set_rows(self) -> None:
        if self._set_rows:
            return
        assert self.geom is not None
        types = sorted({self.geom.type_k, self.geom.type_v})
        names = [f"kv_set_rows<{ck.TYPE_IDS[t]}>" for t in types]
        with self._cuda("compiling set_rows"):
            rows = self.cp.RawModule(code=ck.kernel_source("set_rows.cu"),
                                     options=self._options(), name_expressions=names)
            self._set_rows = {t: rows.get_function(n) for t, n in zip(types, names, strict=True)}

    def _options(self) -> tuple[str, ...]:
        return ("-std=c++17", f"-DKVDIAG_INSTRUMENT={int(self.instrument)}",
                *(f"-D{k}={int(v)}" for k, v in sorted(self.defines.items())))

    def _g(self) -> StoreGeometry:
        if self.geom is None:
            raise UsageError("the cupy executor was used before setup()")
        return self.geom

    # -- pointers ------------------------------------------------------------------------

    def host_pointer(self, layer: int, stream: int, tensor: str = "k") -> int:
        """Address of the (layer, stream) K (or V) view in the pinned host store; the runtime
        logs this as the view's ``data`` (host and device address are equal under UVA)."""
        g = self._g()
        k_off, v_off = self._host_offsets[layer]
        row = self.row_k if tensor == "k" else self.row_v
        off = k_off if tensor == "k" else v_off
        return self._host_ptr + off + stream * g.kv_size * row

    def pool_pointer(self) -> int:
        """Device address of the pool (one cudaMalloc)."""
        self._g()
        return int(self._pool.ptr)

    def address_map(self, n_streamed: int) -> AddressMap:
        """The real addresses in the model's terms: layer L's K tensor sits at
        ``host + L × per_layer`` in the pinned store. kvdiag keeps the non-streamed layers
        (``layer >= n_streamed``) in the same store, so their "device" base is where layer
        ``n_streamed`` starts (the runtime would have them in a CUDA0 buffer)."""
        g = self._g()
        per_layer = self._host_offsets[1][0] if g.n_layers > 1 else self._host_size
        return AddressMap(host_base=self._host_ptr,
                          device_base=self._host_ptr + n_streamed * per_layer,
                          pool_base=self.pool_pointer(), alignment=256)

    def _host_dev_ptr(self, layer: int, tensor: str) -> int:
        k_off, v_off = self._host_offsets[layer]
        return self._host_dev + (k_off if tensor == "k" else v_off)

    # -- data plane ----------------------------------------------------------------------

    def _ring_fields(self) -> dict[str, int]:
        return {"ring_counter": int(self._counter.data.ptr),
                "ring_records": int(self._records.data.ptr),
                "ring_capacity": self.ring_capacity}

    def write_rows(self, layer: int, stream: int, cells: I64Array, k: F32Array,
                   v: F32Array) -> None:
        g = self._g()
        width = g.head_dim * g.n_head_kv
        cells = np.asarray(cells)
        if k.shape != (len(cells), width) or v.shape != (len(cells), width):
            raise UsageError(f"write_rows wants k and v of shape ({len(cells)}, {width}), "
                             f"got {k.shape} and {v.shape}")
        if len(cells) and (cells.min() < 0 or cells.max() >= g.kv_size):
            raise UsageError(f"write_rows: cells outside 0..{g.kv_size - 1}")
        self._check_layer_stream(layer, stream)
        cp = self.cp
        with self._cuda("set_rows"), self._stream:
            self.write_rows_device(layer, stream, cp.asarray(cells, cp.int32),
                                   cp.asarray(k, cp.float32), cp.asarray(v, cp.float32))

    def write_rows_device(self, layer: int, stream: int, cells: Any, k: Any, v: Any) -> None:
        """write_rows on arrays already on the GPU (cells int32, k/v float32 contiguous)."""
        g = self._g()
        cp = self.cp
        width = g.head_dim * g.n_head_kv
        n = int(cells.shape[0])
        if n == 0:
            return
        self._compile_set_rows()
        with self._cuda("set_rows"), self._stream:
            for tensor, src, type_name, row_bytes, kid in (
                ("k", k, g.type_k, self.row_k, ck.KERNEL_IDS["set_rows_k"]),
                ("v", v, g.type_v, self.row_v, ck.KERNEL_IDS["set_rows_v"]),
            ):
                params = cp.asarray(ck.pack(ck.SET_ROWS_FIELDS, {
                    "magic": ck.SET_ROWS_MAGIC, "src": int(src.data.ptr),
                    "cells": int(cells.data.ptr), "dst": self._host_dev_ptr(layer, tensor),
                    "row_bytes": row_bytes, "kv_size": g.kv_size, "stream": stream, "n": n,
                    "width": width, "page_tokens": g.page_tokens, "layer": layer,
                    "kernel_id": kid, **self._ring_fields(),
                }))
                warps = n * (width // 32)
                grid = max(1, min(-(-warps // 8), 4 * self.limits.sm_count))
                self._set_rows[type_name]((grid,), (256,), (params,), shared_mem=8 * 64)

    def upload(self, layer: int, stream: int, page: int, n_pages: int, slot: int) -> None:
        g = self._g()
        self._check_layer_stream(layer, stream)
        pt, pb = g.page_tokens, g.page_bytes
        host_pages = -(-g.kv_size // pt)
        if n_pages < 1 or page < 0 or page + n_pages > host_pages:
            raise UsageError(f"upload: pages {page}..{page + n_pages - 1} outside the "
                             f"{host_pages} pages of a stream")
        if slot < 0 or slot + n_pages > g.pool_pages:
            raise UsageError(f"upload: slots {slot}..{slot + n_pages - 1} outside the pool of "
                             f"{g.pool_pages}")
        rt = self.cp.cuda.runtime
        publish, sample = self._deadline_pair()
        with self._cuda("page upload"):
            # The copy stream starts after every kernel queued so far (the rows it copies were
            # written by set_rows), and attention waits for the copy: the runtime's ready event.
            self._copy.wait_event(self._stream.record())
            start = self._copy.record()
            full = min(n_pages, (g.kv_size - page * pt) // pt)
            dst = int(self._pool.ptr) + slot * pb
            for tensor, row, dst_off in (("k", self.row_k, 0), ("v", self.row_v, g.v_offset)):
                src = self.host_pointer(layer, stream, tensor) + page * pt * row
                if full:
                    rt.memcpy2DAsync(dst + dst_off, pb, src, pt * row, pt * row, full, _H2D,
                                     self._copy.ptr)
                if full < n_pages:  # a last page shorter than page_tokens (kv_size % pt != 0)
                    rows = g.kv_size - (page + full) * pt
                    rt.memcpyAsync(dst + full * pb + dst_off, src + full * pt * row, rows * row,
                                   _H2D, self._copy.ptr)
            # publish this upload's number behind the copy; the compute stream samples it
            # before it waits: the runtime's deadline check (kernels/deadline.cu)
            self._upload_seq += 1
            seq = np.uint32(self._upload_seq)
            with self._copy:  # RawKernel launches on the current stream
                publish((1,), (1,), (self._published, seq))
            end = self._copy.record()
            self._copy_spans.append((start, end))
            with self._stream:
                sample((1,), (1,), (self._published, seq, self._deadline))
            self._stream.wait_event(end)
        kid = ck.KERNEL_IDS["upload"]
        for j in range(n_pages):
            src_code = 1 if slot + j < self.ring_slots else 0
            self._upload_rows.append([kid, -1, layer, stream, page + j, src_code, slot + j,
                                      n_pages])

    def prepare_attend(self, layer: int, streams: tuple[int, ...], q: Any, positions: Any,
                       n_kv: int, page_table: I64Array,
                       mask_bits: npt.NDArray[np.uint32] | None = None) -> AttendLaunch:
        """Validate, upload the small inputs, pack the parameter block; ``q`` may be a NumPy or
        CuPy array ``[ns, tokens, n_head, head_dim]``; ``mask_bits`` an explicit KQ mask as
        ``cuda_kernels.mask_words`` packs it."""
        g = self._g()
        cp = self.cp
        ns, tokens, n_head, d = (int(x) for x in q.shape)
        table = np.asarray(page_table)
        pos = np.asarray(positions)
        if n_head != g.n_head or d != g.head_dim:
            raise UsageError(f"attend: q has {n_head} heads of {d}; the store has "
                             f"{g.n_head} of {g.head_dim}")
        if len(streams) != ns or pos.shape != (ns, tokens) or table.ndim != 2 or \
                table.shape[0] != ns:
            raise UsageError(f"attend: {len(streams)} streams, positions {pos.shape} and page "
                             f"table {table.shape} do not match q {tuple(q.shape)}")
        if not 0 < n_kv <= g.kv_size:
            raise UsageError(f"attend: n_kv {n_kv} outside 1..{g.kv_size}")
        if table.size and (table.max() >= g.pool_pages or table.min() < HOST):
            raise UsageError(f"attend: page table names a slot outside the pool of {g.pool_pages}")
        for s in streams:
            self._check_layer_stream(layer, s)
        paged = bool((table != HOST).any())
        self._compile_attention()
        partial, combine = (self._partial, self._combine) if mask_bits is None \
            else self._masked_kernels()
        gq = n_head // g.n_head_kv
        rows = tokens * gq
        geo = ck.launch_geometry(self.layout, self.launch_shape[paged], self.limits.sm_count,
                                 paged, ns, rows, n_kv, self.grid_order)
        with self._cuda("attention setup"), self._stream:
            q_dev = cp.ascontiguousarray(cp.asarray(q, cp.float32))
            pos_dev = cp.asarray(pos, cp.int32)
            tab_dev = cp.asarray(table if table.size else np.full((ns, 1), HOST), cp.int32)
            st_dev = cp.asarray(np.asarray(streams, np.int32))
            mask_dev = None if mask_bits is None else cp.asarray(mask_bits)
            part_o = cp.empty(geo.items * ck.ROW_TILE * d, cp.float32)
            part_ml = cp.empty(geo.items * 16, cp.float32)
            out = cp.empty((ns, tokens, n_head, d), cp.float32)
            params = ck.fattn_params(g, self.layout, geo, paged, {
                "q": int(q_dev.data.ptr), "positions": int(pos_dev.data.ptr),
                "page_table": int(tab_dev.data.ptr), "streams": int(st_dev.data.ptr),
                "host_k": self._host_dev_ptr(layer, "k"), "host_v": self._host_dev_ptr(layer, "v"),
                "pool": int(self._pool.ptr), "part_o": int(part_o.data.ptr),
                "part_ml": int(part_ml.data.ptr), "out": int(out.data.ptr),
                "kv_mask": 0 if mask_dev is None else int(mask_dev.data.ptr),
                **self._ring_fields(),
            }, layer=layer, ns=ns, tokens=tokens, n_kv=n_kv, n_pages_tab=int(tab_dev.shape[1]),
                ring_slots=self.ring_slots, grid_order=self.grid_order,
                interleave=self.interleave,
                mask_words=0 if mask_bits is None else int(mask_bits.shape[-1]))
        return AttendLaunch(
            cp=cp, partial=partial[paged], combine=combine, geometry=geo,
            params=params, keep=(q_dev, pos_dev, tab_dev, st_dev, part_o, part_ml, mask_dev),
            out=out, launcher=self.launcher, programmatic=self.programmatic)

    def attend_masked(self, layer: int, streams: tuple[int, ...], q: F32Array,
                      kv_mask: npt.NDArray[np.bool_], n_kv: int,
                      page_table: I64Array) -> F32Array:
        """Attention with an explicit KQ mask ``[ns, tokens, n_kv]`` (True = visible), for a
        unified cache whose stream holds several sequences: the same kernels, which then test
        each cell's bit (kernels/fattn_paged.cu, kv_mask_row) and run every row up to n_kv."""
        mask = np.asarray(kv_mask, bool)
        ns, tokens = int(q.shape[0]), int(q.shape[1])
        if mask.shape != (ns, tokens, n_kv):
            raise UsageError(f"attend: KQ mask {mask.shape} does not match q {tuple(q.shape)} "
                             f"and n_kv {n_kv}")
        positions = np.full((ns, tokens), n_kv - 1, np.int64)
        return self._run_attend(self.prepare_attend(layer, streams, q, positions, n_kv,
                                                    page_table, ck.mask_words(mask)))

    def attend(self, layer: int, streams: tuple[int, ...], q: F32Array, positions: I64Array,
               n_kv: int, page_table: I64Array) -> F32Array:
        return self._run_attend(self.prepare_attend(layer, streams, q, positions, n_kv,
                                                    page_table))

    def _run_attend(self, launch: AttendLaunch) -> F32Array:
        with self._cuda("attention"), self._stream:
            launch.run()
            out: F32Array = self.cp.asnumpy(launch.out, stream=self._stream)
            self._stream.synchronize()
        return out

    def reads_match_host(self, layer: int, streams: tuple[int, ...],
                         page_table: I64Array) -> bool:
        """True when every pool slot in ``page_table`` holds exactly the bytes of the host
        page it stands for (compared on the GPU), so the streamed read equals the resident
        reference; the runner then reuses the output instead of recomputing it."""
        g = self._g()
        table = np.asarray(page_table)
        triples = [(int(slot), s, p) for i, s in enumerate(streams)
                   for p, slot in enumerate(table[i]) if slot != HOST]
        if not triples:
            return True
        cp = self.cp
        with self._cuda("comparing pool slots with the host store"), self._stream:
            if self._compare is None:
                mod = cp.RawModule(code=ck.kernel_source("compare_pages.cu"),
                                   options=("-std=c++17",))
                self._compare = mod.get_function("kv_pages_differ")
            trip = cp.asarray(np.asarray(triples, np.int32))
            differ = cp.zeros(1, cp.uint32)
            self._compare((len(triples),), (256,), (
                np.uint64(self._pool.ptr), np.uint64(self._host_dev_ptr(layer, "k")),
                np.uint64(self._host_dev_ptr(layer, "v")), trip, np.int64(self.row_k),
                np.int64(self.row_v), np.int64(g.kv_size), np.int64(g.page_tokens),
                np.int64(g.page_bytes), np.int64(g.v_offset), differ))
            result = int(cp.asnumpy(differ)[0]) == 0
        return result

    # -- records -------------------------------------------------------------------------

    def drain_records(self) -> DeviceRecords:
        """Records the kernels appended since the last drain, plus the host-side upload
        records, and how many a full ring dropped; empties the ring."""
        self._g()
        cp = self.cp
        with self._cuda("draining the event ring"), self._stream:
            self._stream.synchronize()
            count = int(cp.asnumpy(self._counter)[0])
            kept = min(count, self.ring_capacity)
            dev_rows = cp.asnumpy(self._records[:kept]) if kept else \
                np.zeros((0, ck.RECORD_INTS), np.int32)
            self._counter.fill(0)
            self._stream.synchronize()
        host_rows = np.asarray(self._upload_rows, np.int32).reshape(-1, ck.RECORD_INTS)
        self._upload_rows = []
        rows: npt.NDArray[np.int32] = np.concatenate([dev_rows.astype(np.int32), host_rows])
        return DeviceRecords(rows, count - kept)

    def _deadline_pair(self) -> tuple[Any, Any]:
        if self._deadline_kernels is None:
            with self._cuda("compiling deadline.cu"):
                mod = self.cp.RawModule(code=ck.kernel_source("deadline.cu"),
                                        options=("-std=c++17",))
                self._deadline_kernels = (mod.get_function("kv_publish"),
                                          mod.get_function("kv_deadline_sample"))
        return self._deadline_kernels

    def begin_evaluation(self) -> None:
        """Mark the start of one graph evaluation on the compute stream (measured feedback)."""
        with self._cuda("feedback"):
            self._copy_spans = []
            self._eval_start = self._stream.record()

    def end_evaluation(self) -> dict[str, float | int]:
        """Measured feedback of the evaluation since :meth:`begin_evaluation` (brief §1.6,
        §1.10): deadline samples and misses from the one-thread sampling kernel, copy-stream
        busy time from event pairs around every upload, and the evaluation's wall time on
        the compute stream, in µs."""
        cp = self.cp
        with self._cuda("feedback"):
            end = self._stream.record()
            self._copy.synchronize()
            end.synchronize()
            eval_us = (cp.cuda.get_elapsed_time(self._eval_start, end) * 1000.0
                       if self._eval_start is not None else 0.0)
            busy_us = sum(cp.cuda.get_elapsed_time(a, b) * 1000.0 for a, b in self._copy_spans)
            samples, misses = (int(x) for x in cp.asnumpy(self._deadline))
        s0, m0 = self._deadline_seen
        self._deadline_seen = (samples, misses)
        self._copy_spans = []
        self._eval_start = None
        return {"samples": samples - s0, "misses": misses - m0, "eval_us": eval_us,
                "busy": min(1.0, busy_us / eval_us) if eval_us > 0 else 0.0}

    def drain_kernel_events(self) -> list[dict[str, Any]]:
        """Fields of the ``Kernel`` trace events for what the kernels recorded since the last
        drain (the runner emits them after every step)."""
        return kernel_events(self.drain_records())

    def synchronize(self) -> None:
        with self._cuda("synchronize"):
            self._stream.synchronize()
            self._copy.synchronize()

    def _check_layer_stream(self, layer: int, stream: int) -> None:
        g = self._g()
        if not 0 <= layer < g.n_layers or not 0 <= stream < g.n_stream:
            raise UsageError(f"layer {layer} / stream {stream} outside the store "
                             f"({g.n_layers} layers, {g.n_stream} streams)")

    def close(self) -> None:
        if self._host_ptr:
            try:
                with self._dev:
                    self.cp.cuda.runtime.deviceSynchronize()
                    self.cp.cuda.runtime.freeHost(self._host_ptr)
            except Exception:  # a failed context cannot free; the process exit will
                pass
            self._host_ptr = 0
        self._pool = None
        self.geom = None
