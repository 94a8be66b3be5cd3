"""The NumPy executor's speed machinery changes no bit: kept views (and the rows a view
refreshes), the scratch view past the memory limit, patched pool pages, threads, and the
compiled decode kernels."""

from __future__ import annotations

import numpy as np
import pytest

from kvdiag.executors import cpu_kernels
from kvdiag.executors.kv_views import HISTORY, View, ViewCache
from kvdiag.executors.numpy_exec import NumpyExecutor
from kvdiag.kvstream.backend import HOST, StoreGeometry
from kvdiag.kvstream.pages import PageGeometry


def geometry(layers: int = 2, type_k: str = "q8_0", type_v: str = "q5_1") -> StoreGeometry:
    pg = PageGeometry(type_k, type_v, 64, 64, 2)
    return StoreGeometry(n_layers=layers, n_stream=2, kv_size=1024, head_dim=64, n_head=6,
                         n_head_kv=2, type_k=type_k, type_v=type_v, page_tokens=256,
                         page_bytes=pg.page_bytes, v_offset=pg.v_offset, pool_pages=16)


def rows(rng: np.random.Generator, n: int) -> np.ndarray:
    return rng.standard_normal((n, 128), dtype=np.float32)


def test_a_view_refreshes_written_rows_to_the_bits_of_a_whole_dequantization() -> None:
    """GIVEN a view of a page WHEN single rows are written (decode), one or several at a time
    and more often than the page remembers THEN the refreshed view equals a view dequantized
    from nothing."""
    rng = np.random.default_rng(1)
    ex = NumpyExecutor(threads=1)
    g = geometry()
    ex.setup(g)
    ex.write_rows(0, 0, np.arange(300), rows(rng, 300), rows(rng, 300))
    kept = View(g)
    for burst in (1, 1, 3, HISTORY + 2, 2):
        for _ in range(burst):
            cell = np.array([int(rng.integers(0, 512))])
            ex.write_rows(0, 0, cell, rows(rng, 1), rows(rng, 1))
        pages = [ex._host_page(0, 0, p) for p in range(2)]
        k, v = kept.fill(pages)
        fresh_k, fresh_v = View(g).fill(pages)
        assert np.array_equal(k, fresh_k) and np.array_equal(v, fresh_v)
    assert pages[0].version > HISTORY


def test_views_past_the_limit_read_through_the_scratch_view_with_the_same_results() -> None:
    """GIVEN one executor that keeps every view and one that keeps none WHEN both attend over
    two layers and two streams in turn, across writes THEN every output is bit-identical, and
    only the first holds views."""
    rng = np.random.default_rng(2)
    keep, none = NumpyExecutor(threads=1), NumpyExecutor(threads=1, keep_views=False)
    for ex in (keep, none):
        ex.setup(geometry())
    for step in range(3):
        cells = np.arange(100) + 100 * step
        for layer in range(2):
            for stream in range(2):
                k, v = rows(rng, 100), rows(rng, 100)
                for ex in (keep, none):
                    ex.write_rows(layer, stream, cells, k, v)
        q = rng.standard_normal((1, 1, 6, 64), dtype=np.float32)
        pos = np.array([[int(cells[-1])]])
        for layer in range(2):
            for stream in range(2):
                a = keep.attend(layer, (stream,), q, pos, 512, np.full((1, 2), HOST))
                b = none.attend(layer, (stream,), q, pos, 512, np.full((1, 2), HOST))
                assert np.array_equal(a, b)
    assert len(keep._cache().kept) == 4 and not none._cache().kept


def test_the_cache_drops_the_newest_views_first_when_the_limit_shrinks() -> None:
    g = geometry()
    cache = ViewCache(g, limit_bytes=3 * View.bytes_for(g, 1))
    for key in ((0, 0), (0, 1), (1, 0)):
        assert cache.view(*key, pages=1) is cache.kept[key]
    assert cache.view(1, 1, pages=1) is cache.scratch  # a fourth page would pass the limit
    cache.shrink_to(View.bytes_for(g, 1))
    assert list(cache.kept) == [(0, 0)] and cache.dropped == {(0, 1), (1, 0), (1, 1)}
    assert cache.view(0, 1, pages=1) is cache.scratch


def test_a_stale_pool_page_is_patched_in_for_the_read_and_the_view_restored() -> None:
    """GIVEN a pool copy of page 1 made before a write WHEN the streamed read goes through it
    THEN it differs from the resident reference, and the reference afterwards equals one
    computed by an executor that never served the stale read."""
    rng = np.random.default_rng(3)
    ex, clean = NumpyExecutor(threads=1), NumpyExecutor(threads=1)
    k, v = rows(rng, 400), rows(rng, 400)
    for e in (ex, clean):
        e.setup(geometry())
        e.write_rows(0, 1, np.arange(400), k, v)
    ex.upload(0, 1, 1, 1, slot=4)
    k2, v2 = rows(rng, 1), rows(rng, 1)
    for e in (ex, clean):
        e.write_rows(0, 1, np.array([300]), k2, v2)
    q = rng.standard_normal((1, 2, 6, 64), dtype=np.float32)
    pos = np.array([[400, 401]])
    host = np.full((1, 2), HOST)
    stale = ex.attend(0, (1,), q, pos, 512, np.array([[HOST, 4]]))
    ref = ex.attend(0, (1,), q, pos, 512, host)
    assert not ex.reads_match_host(0, (1,), np.array([[HOST, 4]]))
    assert np.max(np.abs(stale - ref)) > 1e-3
    assert np.array_equal(ref, clean.attend(0, (1,), q, pos, 512, host))


@pytest.mark.parametrize("tokens", [1, 3, 40])
def test_threads_give_the_bits_of_one_thread(tokens: int) -> None:
    """Decode (einsum or kernel path, heads on threads) and prefill (GEMM, softmax on
    threads) give the same bits with 1 and 4 threads."""
    rng = np.random.default_rng(4)
    one, four = NumpyExecutor(threads=1), NumpyExecutor(threads=4)
    g = geometry()
    k, v = rows(rng, 500), rows(rng, 500)
    for ex in (one, four):
        ex.setup(g)
        ex.write_rows(0, 0, np.arange(500), k, v)
    q = rng.standard_normal((1, tokens, 6, 64), dtype=np.float32)
    pos = np.arange(460, 460 + tokens)[None, :]
    a = one.attend(0, (0,), q, pos, 512, np.full((1, 2), HOST))
    b = four.attend(0, (0,), q, pos, 512, np.full((1, 2), HOST))
    assert four._workers is not None and len(four._parts) == 2
    assert np.array_equal(a, b)


def test_compiled_kernels_round_as_einsum() -> None:
    kernels = cpu_kernels.load()
    if kernels is None:
        pytest.skip(f"compiled kernels unavailable: {cpu_kernels.unavailable_reason}")
    rng = np.random.default_rng(5)
    for heads, nrows, n, d in ((4, 6, 1000, 256), (2, 7, 129, 96), (1, 12, 16, 64)):
        q = rng.standard_normal((heads, nrows, d), dtype=np.float32)
        k = rng.standard_normal((heads, n + 3, d), dtype=np.float32)[:, :n]
        s = kernels.scores(q, k)
        assert np.array_equal(s, np.einsum("hqd,hdk->hqk", q, k.transpose(0, 2, 1)))
        out = np.empty((heads, nrows, d), np.float32)
        kernels.pv(s, k, out)
        assert np.array_equal(out, np.einsum("hqd,hdk->hqk", s, k))
    with pytest.raises(ValueError, match="contiguous rows"):
        kernels.scores(q, k.transpose(0, 2, 1))


def test_the_native_switch_turns_the_kernels_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(cpu_kernels.NATIVE_ENV, "0")
    cpu_kernels.load.cache_clear()
    try:
        assert cpu_kernels.load() is None
        assert cpu_kernels.unavailable_reason == "KVDIAG_NUMPY_NATIVE=0"
    finally:
        cpu_kernels.load.cache_clear()


def test_a_bad_thread_count_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvdiag.errors import UsageError

    monkeypatch.setenv("KVDIAG_NUMPY_THREADS", "two")
    with pytest.raises(UsageError, match="KVDIAG_NUMPY_THREADS must be a positive integer"):
        NumpyExecutor()
