"""Drive a scenario through the runtime model on an executor and record every decision.

Per ubatch, in the runtime's order: set_input_k_idxs → mark_dirty_rows (global rows); then for
each attention layer SET_ROWS into the host store, the FA node's fits() and dispatch, and — on
the streamed route — resident-page uploads, ring uploads and the read. Outputs of every stream
are compared with a fully resident reference computed by the same executor.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np

from kvdiag.errors import DeviceFault
from kvdiag.kvstream.adaptive import AdaptiveRuntime
from kvdiag.kvstream.backend import HOST, Executor, StoreGeometry
from kvdiag.kvstream.config import RuntimeConfig
from kvdiag.kvstream.dispatch import (
    ABORT_BACKTRACE,
    FITS_ASSERT,
    assert_message,
    fallback_warning,
    route,
)
from kvdiag.kvstream.fits import fits
from kvdiag.kvstream.ggml_types import AttentionMode
from kvdiag.kvstream.pages import view_n_kv
from kvdiag.kvstream.plan import Plan, make_plan
from kvdiag.kvstream.resident import LayerIdentityError, ResidentCache, classify
from kvdiag.kvstream.scenarios import Lane, Scenario, Scheduler, Ubatch
from kvdiag.kvstream.timing import H200, DeviceProfile
from kvdiag.kvstream.views import AddressMap, attention_node
from kvdiag.model import events as ev
from kvdiag.model.pages import PAGE_TOKENS, Holder

COPY_BATCH_PAGES = 32
"""KV_STREAM_COPY_BATCH_PAGES: consecutive pages batched into one upload."""

DEFAULT_TOLERANCE = 1e-3


class EventSink(Protocol):
    """What the runner needs from a trace writer."""

    def emit(self, cls: type[Any], step: int, **fields: Any) -> Any: ...

    def end_step(self) -> None: ...


class _NoSink:
    def emit(self, cls: type[Any], step: int, **fields: Any) -> Any:
        raise RuntimeError("Runner.run() was not given a sink")

    def end_step(self) -> None:
        pass


class ConfigError(ValueError):
    """The scenario cannot run on this configuration (the runtime would refuse to boot)."""


@dataclass(frozen=True)
class RunResult:
    status: Literal["completed", "aborted"]
    steps: int
    abort: ev.Abort | None
    max_abs_delta: float


def store_geometry(cfg: RuntimeConfig, plan: Plan) -> StoreGeometry:
    assert plan.pool is not None
    return StoreGeometry(
        n_layers=cfg.layers,
        n_stream=cfg.n_stream,
        kv_size=cfg.kv_size,
        head_dim=cfg.head_dim,
        n_head=cfg.n_head,
        n_head_kv=cfg.n_head_kv,
        type_k=cfg.type_k,
        type_v=cfg.type_v,
        page_tokens=PAGE_TOKENS,
        page_bytes=plan.page_bytes,
        v_offset=plan.v_offset,
        pool_pages=plan.pool.pool_pages,
        f16_mode=plan.attention_mode == AttentionMode.F16.name,
    )


def _ranges(items: list[tuple[int, tuple[Any, ...]]]) -> list[tuple[int, int, tuple[Any, ...]]]:
    """Collapse (page, attrs) pairs into [begin, end) runs of equal attrs."""
    runs: list[tuple[int, int, tuple[Any, ...]]] = []
    for page, attrs in items:
        if runs and runs[-1][1] == page and runs[-1][2] == attrs:
            runs[-1] = (runs[-1][0], page + 1, attrs)
        else:
            runs.append((page, page + 1, attrs))
    return runs


def _key_order(key: tuple[int, int | None, int]) -> tuple[int, int, int]:
    return key[0], -1 if key[1] is None else key[1], key[2]


def _row_runs(rows: list[int]) -> tuple[tuple[int, int], ...]:
    """Global rows as [r0, r1) runs of consecutive rows, in the order given."""
    runs: list[tuple[int, int]] = []
    for row in rows:
        if runs and runs[-1][1] == row:
            runs[-1] = (runs[-1][0], row + 1)
        else:
            runs.append((row, row + 1))
    return tuple(runs)


def _served(items: list[tuple[int, str, int]]) -> tuple[ev.Served, ...]:
    """(page, source, slot) in page order → runs of consecutive pages of one source in
    consecutive slots (host pages have slot -1 and need only consecutive pages)."""
    runs: list[list[Any]] = []
    for page, source, slot in items:
        if runs:
            b, e, src, s0 = runs[-1]
            if src == source and e == page and (slot == -1 or slot == s0 + (e - b)):
                runs[-1][1] = page + 1
                continue
        runs.append([page, page + 1, source, slot])
    return tuple(ev.Served(b, e, src, s0) for b, e, src, s0 in runs)


def _write_runs(lane: Lane) -> list[tuple[int, np.ndarray]]:
    """(request, cells) for each run of consecutive cells of one request in a lane: one
    SET_ROWS range each."""
    runs: list[tuple[int, list[int]]] = []
    for req, cell in zip(lane.requests, lane.cells, strict=True):
        if runs and runs[-1][0] == req and runs[-1][1][-1] + 1 == cell:
            runs[-1][1].append(cell)
        else:
            runs.append((req, [cell]))
    return [(req, np.asarray(cells, np.int64)) for req, cells in runs]


def _batches(pages: list[tuple[int, int]], limit: int) -> list[tuple[int, int, int]]:
    """Group (page, slot) pairs with consecutive pages and slots: (page, slot, count)."""
    out: list[tuple[int, int, int]] = []
    for page, slot in pages:
        if out:
            p0, s0, n = out[-1]
            if page == p0 + n and slot == s0 + n and n < limit:
                out[-1] = (p0, s0, n + 1)
                continue
        out.append((page, slot, 1))
    return out


class Runner:
    def __init__(
        self,
        cfg: RuntimeConfig,
        scenario: Scenario,
        executor: Executor,
        seed: int = 0,
        addresses: AddressMap | None = None,
        tolerance: float = DEFAULT_TOLERANCE,
        progress: Callable[[int, int], None] | None = None,
        on_step_end: Callable[[int, EventSink], None] | None = None,
        profile: DeviceProfile = H200,
    ) -> None:
        self.cfg = cfg
        self.scenario = scenario
        self.executor = executor
        self.sink: EventSink = _NoSink()
        self.seed = seed
        self.addresses = addresses or AddressMap()
        self._addresses_given = addresses is not None
        self.tolerance = tolerance
        self.progress = progress
        self.on_step_end = on_step_end
        self.plan = make_plan(cfg, allow_multiseq=True)
        if self.plan.pool is None:
            raise ConfigError(f"the runtime would refuse this pool: {self.plan.pool_error}")
        if self.plan.attention_mode == AttentionMode.UNSUPPORTED.name:
            raise ConfigError(f"block KV streaming does not support K {cfg.type_k} and V {cfg.type_v}")
        for r in scenario.requests:
            if r.slot >= cfg.np:
                raise ConfigError(f"scenario {scenario.name} uses slot {r.slot} but -np is {cfg.np}")
        pool = self.plan.pool
        self.cache = ResidentCache(
            cfg.layout, cfg.n_streamed, pool.resident_pages_per_layer, pool.ring_slots,
            cfg.n_stream, cfg.kv_size,
        )
        self.adaptive = (AdaptiveRuntime(self.cache, pool, profile, fixed_ring=cfg.ring_slots is not None)
                         if cfg.adaptive else None)
        self.scheduler = Scheduler(scenario.requests, cfg.n_stream, cfg.n_ubatch, cfg.kv_size)
        self.ring_cursor = 0
        self._n_kv = 0
        # an executor without a data plane (kvdiag sweep's) stores and attends nothing, so
        # no K/V/Q values are made and no outputs are reported
        self.data_plane: bool = getattr(executor, "data_plane", True)
        # an executor that measures its own feedback (the CuPy one) brackets each evaluation
        self._begin_eval = getattr(executor, "begin_evaluation", None)
        self._ring_peak = 0
        self.max_delta = 0.0
        self.req_last_cell: dict[int, int] = {}
        self.cell_req = [np.full(cfg.kv_size, -1, np.int64) for _ in range(cfg.n_stream)]
        self.cell_pos = [np.full(cfg.kv_size, -1, np.int64) for _ in range(cfg.n_stream)]

    # -- data --------------------------------------------------------------------------

    def _rng(self, *key: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, *key])

    def total_steps(self) -> int:
        return sum(1 for _ in Scheduler(self.scenario.requests, self.cfg.n_stream,
                                        self.cfg.n_ubatch, self.cfg.kv_size).ubatches())

    # -- main loop ---------------------------------------------------------------------

    def run(self, sink: EventSink) -> RunResult:
        self.sink = sink
        self.executor.setup(store_geometry(self.cfg, self.plan))
        address_map = getattr(self.executor, "address_map", None)
        if address_map is not None and not self._addresses_given:
            # log the executor's real pinned-store and pool addresses, as the port did
            self.addresses = address_map(self.cfg.n_streamed)
        total = self.total_steps()
        if self.cfg.n_stream > 1:
            # the G1 validator refuses -np > 1 without a unified cache; the arm117 port's
            # opt-in is the only way such a boot runs (brief §8.4)
            self.sink.emit(ev.Warn, 0, code="multiseq-opt-in", message=(
                f"LLAMA_KV_STREAM_ALLOW_MULTISEQ=1: block KV streaming with {self.cfg.n_stream} "
                "KV streams (-np > 1 without --kv-unified) is untested upstream"))
        steps = 0
        abort: ev.Abort | None = None
        for ub in self.scheduler.ubatches():
            try:
                if self.adaptive is not None and self._begin_eval is not None:
                    self._begin_eval()
                self._ring_peak = 0
                abort = self._step(ub)
                self._drain_device_records(ub.index)
                if self.adaptive is not None and abort is None:
                    self._adapt(ub)
            except DeviceFault as exc:
                # a CUDA error ends the run as ggml_cuda_error ends the server
                abort = self.sink.emit(ev.Abort, ub.index, message=str(exc),
                                       condition="CUDA error", cuda_error=exc.cuda_error)
            if self.on_step_end is not None:
                self.on_step_end(ub.index, self.sink)
            self.sink.end_step()
            steps += 1
            if self.progress is not None:
                self.progress(steps, total)
            if abort is not None:
                break
        return RunResult("aborted" if abort else "completed", steps, abort, self.max_delta)

    def _adapt(self, ub: Ubatch) -> None:
        """kv_stream_adapt after the evaluation (brief §1.10): feedback, maybe a new partition
        or decode layout; the cache it reshapes is cleared (an ``invalidate`` event)."""
        assert self.adaptive is not None
        end = getattr(self.executor, "end_evaluation", None)
        measured = end() if end is not None else None
        for cls, fields in self.adaptive.after_evaluation(self._n_kv, ub.tokens, len(ub.streams),
                                                          measured, self._ring_peak):
            self.sink.emit(cls, ub.index, **fields)
            if cls is ev.Invalidate:
                self.ring_cursor = 0  # the ring may have a new size: start it afresh

    def _drain_device_records(self, step: int) -> None:
        """Kernel events from an executor that instruments its kernels (the GPU's event ring)."""
        drain = getattr(self.executor, "drain_kernel_events", None)
        if drain is None:
            return
        for fields in drain():
            self.sink.emit(ev.Kernel, step, **fields)

    def _step(self, ub: Ubatch) -> ev.Abort | None:
        cfg, step = self.cfg, ub.index
        for lane in ub.lanes:
            for req, cell in zip(lane.requests, lane.cells, strict=True):
                self.req_last_cell[req] = max(self.req_last_cell.get(req, -1), cell)
        last_cell = max(self.req_last_cell[r] for r in ub.requests) + 1
        n_kv = view_n_kv(last_cell, cfg.kv_size)
        self._n_kv = n_kv
        self.sink.emit(ev.Step, step, phase=ub.phase, streams=ub.streams, tokens=ub.tokens,
                       n_kv=n_kv, slots=ub.slots)
        # set_input_k_idxs: global rows = stream × kv_size + cell, handed to mark_dirty_rows
        rows = [lane.stream * cfg.kv_size + c for lane in ub.lanes for c in lane.cells]
        dirty = self.cache.mark_dirty_rows(rows)
        self.sink.emit(ev.Mark, step, rows=_row_runs(rows), keys=tuple(sorted(dirty, key=_key_order)),
                       outside=tuple(self.cache.outside(self.cache.row_pages(rows))))
        for lane in ub.lanes:
            for req in set(lane.requests) & self.scheduler.kept_from.keys():
                # a continued conversation: its kept cells are the new request's context now
                old = self.scheduler.kept_from.pop(req)
                owner = self.cell_req[lane.stream]
                owner[owner == old] = req
            idx = np.asarray(lane.cells, np.int64)
            self.cell_req[lane.stream][idx] = lane.requests
            self.cell_pos[lane.stream][idx] = lane.positions
        s0, s1 = min(ub.streams), max(ub.streams)
        view_streams = tuple(range(s0, s1 + 1))
        positions, kv_mask = self._visibility(ub, view_streams, n_kv)
        # running CRC-32 of each stream's outputs (and references) over the layers
        crc: dict[int, int] = dict.fromkeys(ub.streams, 0)
        ref_crc: dict[int, int] = dict.fromkeys(ub.streams, 0)
        deltas: dict[int, list[float]] = {s: [] for s in ub.streams}
        first_streamed_fa = True
        for layer in range(cfg.layers):
            streamed_layer = layer < cfg.n_streamed
            for lane in ub.lanes:
                for req, run in _write_runs(lane):
                    self._write(step, layer, lane.stream, req, run, dirty, streamed_layer)
            node = attention_node(cfg, layer, view_streams, ub.tokens, n_kv, self.addresses)
            result = fits(node, self.plan.page_bytes, cfg.native_quants)
            taken = route(cfg.dispatch, result)
            self.sink.emit(
                ev.Fits, step, node=node.name, layer=layer, q=node.q, k=node.k, v=node.v,
                dst=node.dst, mask=node.mask, stage_bytes=self.plan.page_bytes,
                result=result.ok, route=taken, failed=result.failed,
                membership=result.membership,
            )
            if taken == "abort":
                return self._abort(step, assert_message(cfg.assert_file, cfg.assert_line),
                                   cfg.assert_file, cfg.assert_line, FITS_ASSERT)
            n_pages = n_kv // PAGE_TOKENS
            table = np.full((len(view_streams), n_pages), HOST, np.int64)
            if taken == "streamed":
                try:
                    table[0] = self._streamed_read(step, layer, s0, ub, n_pages, node.k.data,
                                                   first_streamed_fa)
                except LayerIdentityError as exc:
                    return self._abort(step, f"{cfg.assert_file.rsplit('/', 1)[0]}/fattn.cu:0: "
                                       "GGML_ASSERT(cache->next_layer < cache->layer_count) failed",
                                       "fattn.cu", 0, "cache->next_layer < cache->layer_count",
                                       detail=str(exc))
                first_streamed_fa = False
            elif taken == "fallback":
                self.sink.emit(ev.Warn, step, message=fallback_warning(layer, result.failed),
                               code="kv-stream-fallback", layer=layer)
                for s in ub.streams:
                    self.sink.emit(ev.Read, step, layer=layer, stream=s, pool=0, ring=0,
                                   host=n_pages, ranges=(ev.ReadRange(0, n_pages, "host", s, "exact"),),
                                   served=(ev.Served(0, n_pages, "host", -1),))
            if not self.data_plane:
                continue
            q = self._rng(1, layer, step).standard_normal(
                (len(view_streams), ub.tokens, cfg.n_head, cfg.head_dim), dtype=np.float32)
            out = self._attend(layer, view_streams, q, positions, n_kv, table, kv_mask)
            if (table == HOST).all() or self._reads_match_host(layer, view_streams, table):
                # the kernel read byte-for-byte the host's pages: same inputs, same function
                ref = out
            else:
                ref = self._attend(layer, view_streams, q, positions, n_kv,
                                   np.full_like(table, HOST), kv_mask)
            for i, s in enumerate(view_streams):
                if s in crc:
                    crc[s] = zlib.crc32(out[i], crc[s])
                    if ref is out:
                        ref_crc[s] = zlib.crc32(out[i], ref_crc[s])
                        deltas[s].append(0.0)
                    else:
                        ref_crc[s] = zlib.crc32(ref[i], ref_crc[s])
                        deltas[s].append(float(np.max(np.abs(out[i] - ref[i]))))
        for s in ub.streams if self.data_plane else ():
            worst = int(np.argmax(deltas[s]))
            delta = deltas[s][worst]
            self.max_delta = max(self.max_delta, delta)
            self.sink.emit(
                ev.Output, step, stream=s,
                checksum=f"{crc[s]:08x}", ref_checksum=f"{ref_crc[s]:08x}",
                max_abs_delta=delta, tolerance=self.tolerance, worst_layer=worst,
            )
        return None

    def _visibility(
        self, ub: Ubatch, view_streams: tuple[int, ...], n_kv: int
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """Which cells each query token sees. With one sequence per stream whose cells are
        its positions (non-unified), the causal rule ``cell <= position`` is the whole mask;
        otherwise (a unified cache shared by several sequences) the KQ mask is built per cell
        from its owner and position, as llama_kv_cache::set_input_kq_mask does."""
        lanes = {lane.stream: lane for lane in ub.lanes}
        positions = np.zeros((len(view_streams), ub.tokens), np.int64)
        causal = True
        for i, s in enumerate(view_streams):
            lane = lanes.get(s)
            if lane is None:
                continue  # a stream inside s0..s1 without tokens: output ignored
            positions[i] = lane.positions
            if len(set(lane.requests)) > 1 or lane.cells != lane.positions:
                causal = False
        if causal:
            return positions, None
        mask = np.zeros((len(view_streams), ub.tokens, n_kv), bool)
        for i, s in enumerate(view_streams):
            lane = lanes.get(s)
            if lane is None:
                continue
            req = np.asarray(lane.requests)[:, None]
            pos = np.asarray(lane.positions)[:, None]
            mask[i] = (self.cell_req[s][None, :n_kv] == req) & (self.cell_pos[s][None, :n_kv] <= pos)
        return positions, mask

    def _attend(self, layer: int, streams: tuple[int, ...], q: np.ndarray, positions: np.ndarray,
                n_kv: int, table: np.ndarray, kv_mask: np.ndarray | None) -> np.ndarray:
        if kv_mask is None:
            return self.executor.attend(layer, streams, q, positions, n_kv, table)
        attend_masked = getattr(self.executor, "attend_masked", None)
        if attend_masked is None:
            raise ConfigError(f"the {self.executor.name} executor cannot apply a multi-sequence "
                              "KQ mask (unified KV cache with several slots)")
        result: np.ndarray = attend_masked(layer, streams, q, kv_mask, n_kv, table)
        return result

    def _reads_match_host(self, layer: int, streams: tuple[int, ...], table: np.ndarray) -> bool:
        check = getattr(self.executor, "reads_match_host", None)
        return bool(check(layer, streams, table)) if check is not None else False

    def _write(self, step: int, layer: int, stream: int, req: int, cells: np.ndarray,
               dirty: set[tuple[int, int | None, int]], streamed_layer: bool) -> None:
        cfg = self.cfg
        width = cfg.head_dim * cfg.n_head_kv
        if self.data_plane:
            rng = self._rng(2, layer, stream, req, int(cells[0]))
            k = rng.standard_normal((len(cells), width), dtype=np.float32)
            v = rng.standard_normal((len(cells), width), dtype=np.float32)
            self.executor.write_rows(layer, stream, cells, k, v)
        c0, c1 = int(cells[0]), int(cells[-1]) + 1
        base = stream * cfg.kv_size
        keys: tuple[tuple[int, int | None, int], ...] = ()
        versions: list[tuple[int, int]] = []
        if streamed_layer:
            for page in range(c0 // PAGE_TOKENS, (c1 - 1) // PAGE_TOKENS + 1):
                versions.append((page, self.cache.versions.bump(layer, stream, page)))
            # only the keys this write's own rows marked (format 1.1): the ubatch's other
            # streams' marks belong to their own writes
            own = self.cache.row_pages(range(base + c0, base + c1))
            keys = tuple(sorted((k_ for k_ in dirty if k_[0] == layer and (k_[1], k_[2]) in own),
                                key=_key_order))
        self.sink.emit(ev.Write, step, layer=layer, stream=stream, cells=(c0, c1),
                       rows=(base + c0, base + c1), dirty=keys, versions=tuple(versions))

    def _streamed_read(self, step: int, layer: int, stream: int, ub: Ubatch, n_pages: int,
                       k_ptr: int, first_fa: bool) -> np.ndarray:
        cache = self.cache
        if self.cfg.layout == "shared":
            if ub.tokens > 1 and first_fa:
                cache.forget_layers()
                self.sink.emit(ev.Learn, step, layer=-1, k_ptr=0, relearn=True)
            index, new = cache.learn(k_ptr)
            if new:
                self.sink.emit(ev.Learn, step, layer=index, k_ptr=k_ptr)
        else:
            index = layer
        window = cache.window(index)
        row = np.full(n_pages, HOST, np.int64)
        resident_up: list[tuple[int, int]] = []
        reasons: dict[int, str] = {}
        read_items: list[tuple[int, tuple[Any, ...]]] = []
        ring_pages: list[int] = []
        pool_slots: dict[int, int] = {}
        for page in range(n_pages):
            current = cache.versions.get(layer, stream, page)
            if page < window:
                plan = cache.plan_page(index, stream, page, ub.tokens, page == n_pages - 1)
                if plan.upload is not None:
                    resident_up.append((page, plan.slot))
                    reasons[page] = plan.upload
                    previous = cache.uploaded(plan.key, plan.slot,
                                              Holder(layer, stream, page, current))
                    if previous is not None:
                        self.sink.emit(ev.Evict, step, slot=plan.slot, layer=previous.layer,
                                       page=previous.page, stream=previous.stream,
                                       bytes=self.plan.page_bytes, reason="replaced")
                holder = cache.holders.get(plan.slot)
                cls = classify(holder, layer, stream, page, current)
                lag = current - holder.version if holder and cls == "stale" else 0
                read_items.append((page, ("pool", holder.stream if holder else -1, cls, lag)))
                row[page] = plan.slot
                pool_slots[page] = plan.slot
            else:
                ring_pages.append(page)
                read_items.append((page, ("ring", stream, "exact", 0)))
        for page, slot, count in _batches(resident_up, COPY_BATCH_PAGES):
            self.executor.upload(layer, stream, page, count, slot)
            self.sink.emit(ev.Upload, step, layer=layer, stream=stream, pages=(page, page + count),
                           slot=slot, target="resident", bytes=count * self.plan.page_bytes,
                           reason=reasons[page],
                           key_stream=None if self.cfg.layout == "shared" else stream)
        ring_slots = self._ring(step, layer, stream, ring_pages)
        ranges = tuple(ev.ReadRange(b, e, a[0], a[1], a[2], a[3]) for b, e, a in _ranges(read_items))
        served = _served([(page, "pool", pool_slots[page]) if page in pool_slots
                          else (page, "ring", ring_slots[page]) for page, _ in read_items])
        self.sink.emit(ev.Read, step, layer=layer, stream=stream, pool=len(pool_slots),
                       ring=len(ring_pages), host=0, ranges=ranges, served=served)
        return row

    def _ring(self, step: int, layer: int, stream: int, pages: list[int]) -> dict[int, int]:
        """Pages beyond the resident window stream through the ring, ≤ 32 pages a batch.
        Returns the ring slot each page was copied to (what the read's ``served`` names).

        The data plane reads them from the host store: the ring copy is made from the same
        host bytes immediately before the read, so the numbers are identical.
        """
        ring = self.cache.ring_slots  # the adaptive controller may have moved the boundary
        limit = min(COPY_BATCH_PAGES, ring)
        # one attention holds its ring pages until it has read them: the step's peak
        self._ring_peak = max(self._ring_peak, min(len(pages), ring))
        i = 0
        slots: dict[int, int] = {}
        while i < len(pages):
            run = 1
            while (i + run < len(pages) and run < limit and pages[i + run] == pages[i] + run
                   and self.ring_cursor + run < ring):
                run += 1
            self.sink.emit(ev.Upload, step, layer=layer, stream=stream,
                           pages=(pages[i], pages[i] + run), slot=self.ring_cursor,
                           target="ring", bytes=run * self.plan.page_bytes, reason="ring")
            for j in range(run):
                slots[pages[i] + j] = self.ring_cursor + j
            self.ring_cursor = (self.ring_cursor + run) % ring
            i += run
        return slots

    def _abort(self, step: int, message: str, file: str, line: int, condition: str,
               detail: str | None = None) -> ev.Abort:
        backtrace = ABORT_BACKTRACE if condition == FITS_ASSERT else ()
        abort: ev.Abort = self.sink.emit(ev.Abort, step, message=message, file=file, line=line,
                                         condition=condition, backtrace=backtrace)
        if detail:
            self.sink.emit(ev.Warn, step, message=detail, code="layer-identity")
        return abort
