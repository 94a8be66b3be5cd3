"""The NumPy reference executor: storage in ggml blocks, page copies, attention maths."""

from __future__ import annotations

import numpy as np
import pytest

from kvdiag.executors.numpy_exec import NumpyExecutor
from kvdiag.executors.quant import dequantize_rows, quantize_rows
from kvdiag.kvstream.backend import HOST, StoreGeometry
from kvdiag.kvstream.pages import PageGeometry


def geometry(type_k: str = "q8_0", type_v: str = "q5_1", head_dim: int = 64,
             f16_mode: bool = False) -> StoreGeometry:
    pg = PageGeometry(type_k, type_v, head_dim, head_dim, 2)
    return StoreGeometry(n_layers=1, n_stream=2, kv_size=1024, head_dim=head_dim, n_head=6,
                         n_head_kv=2, type_k=type_k, type_v=type_v, page_tokens=256,
                         page_bytes=pg.page_bytes, v_offset=pg.v_offset, pool_pages=16,
                         f16_mode=f16_mode)


def naive(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """float64 attention, one head at a time; k/v [n, hkv, d]."""
    tokens, n_head, d = q.shape
    g = n_head // k.shape[1]
    out = np.zeros((tokens, n_head, v.shape[2]))
    for t in range(tokens):
        for h in range(n_head):
            kk = k[: pos[t] + 1, h // g].astype(np.float64)
            s = kk @ q[t, h].astype(np.float64) / np.sqrt(d)
            w = np.exp(s - s.max())
            w /= w.sum()
            out[t, h] = w @ v[: pos[t] + 1, h // g]
    return out


@pytest.fixture
def filled() -> tuple[NumpyExecutor, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    ex = NumpyExecutor()
    ex.setup(geometry())
    k = rng.standard_normal((600, 128), dtype=np.float32)
    v = rng.standard_normal((600, 128), dtype=np.float32)
    ex.write_rows(0, 1, np.arange(600), k, v)
    return ex, k, v


def test_attention_matches_float64_reference_over_dequantized_kv(
    filled: tuple[NumpyExecutor, np.ndarray, np.ndarray],
) -> None:
    ex, k, v = filled
    rng = np.random.default_rng(8)
    q = rng.standard_normal((1, 3, 6, 64), dtype=np.float32)
    pos = np.array([[100, 400, 599]])
    out = ex.attend(0, (1,), q, pos, 768, np.full((1, 3), HOST))
    kd = dequantize_rows("q8_0", quantize_rows("q8_0", k), 128).reshape(600, 2, 64)
    vd = dequantize_rows("q5_1", quantize_rows("q5_1", v), 128).reshape(600, 2, 64)
    ref = naive(q[0], kd, vd, pos[0])
    assert out.shape == (1, 3, 6, 64)
    np.testing.assert_allclose(out[0], ref, rtol=2e-5, atol=2e-6)


def test_pool_copy_is_a_snapshot_of_the_host_page(
    filled: tuple[NumpyExecutor, np.ndarray, np.ndarray],
) -> None:
    ex, _, _ = filled
    ex.upload(0, 1, 2, 1, slot=5)  # page 2 = cells 512..767 into pool slot 5
    q = np.random.default_rng(9).standard_normal((1, 1, 6, 64), dtype=np.float32)
    pos = np.array([[600]])
    table = np.array([[HOST, HOST, 5]])
    same = ex.attend(0, (1,), q, pos, 768, table)
    host = ex.attend(0, (1,), q, pos, 768, np.full((1, 3), HOST))
    assert np.array_equal(same, host) and ex.reads_match_host(0, (1,), table)
    # a new row at cell 600 reaches the host store but not the pool copy: a stale read
    ex.write_rows(0, 1, np.array([600]), np.full((1, 128), 3.0, np.float32),
                  np.full((1, 128), 3.0, np.float32))
    stale = ex.attend(0, (1,), q, pos, 768, table)
    fresh = ex.attend(0, (1,), q, pos, 768, np.full((1, 3), HOST))
    assert not ex.reads_match_host(0, (1,), table)
    assert np.max(np.abs(stale - fresh)) > 1e-2


def test_other_streams_pages_are_separate(
    filled: tuple[NumpyExecutor, np.ndarray, np.ndarray],
) -> None:
    ex, _, _ = filled
    ex.upload(0, 1, 0, 1, slot=3)  # stream 1's page 0
    q = np.random.default_rng(10).standard_normal((1, 1, 6, 64), dtype=np.float32)
    pos = np.array([[200]])
    foreign = ex.attend(0, (0,), q, pos, 256, np.array([[3]]))  # stream 0 reads slot 3
    own = ex.attend(0, (0,), q, pos, 256, np.array([[HOST]]))  # stream 0 never written: zeros
    assert not ex.reads_match_host(0, (0,), np.array([[3]]))
    assert np.max(np.abs(foreign - own)) > 1e-2


def test_f16_mode_rounds_kv_to_half() -> None:
    ex16 = NumpyExecutor()
    ex16.setup(geometry(type_k="f16", type_v="f16", f16_mode=True))
    x = np.float32(1.0) + np.float32(2.0 ** -13)  # not representable in f16
    rows = np.full((1, 128), x, np.float32)
    ex16.write_rows(0, 0, np.array([0]), rows, rows)
    q = np.ones((1, 1, 6, 64), np.float32)
    out = ex16.attend(0, (0,), q, np.array([[0]]), 256, np.array([[HOST]]))
    assert np.all(out == np.float32(np.float16(x)))


def test_masked_attention_separates_sequences_sharing_a_stream() -> None:
    """Two sequences interleaved in one stream's cells (unified cache) see only their own
    cells: the same result as each alone in a stream of its own."""
    rng = np.random.default_rng(11)
    ex = NumpyExecutor()
    ex.setup(geometry())
    k = rng.standard_normal((40, 128), dtype=np.float32)
    v = rng.standard_normal((40, 128), dtype=np.float32)
    owner = np.arange(40) % 2  # cells alternate between sequence 0 and 1
    pos = np.arange(40) // 2
    ex.write_rows(0, 0, np.arange(40), k, v)
    for seq in (0, 1):  # the same rows again, each sequence alone in its own 256-cell range
        ex.write_rows(0, 1, np.arange(20) + 256 * seq, k[owner == seq], v[owner == seq])
    q = rng.standard_normal((1, 2, 6, 64), dtype=np.float32)
    tok_seq, tok_pos = np.array([0, 1]), np.array([19, 12])
    mask = (owner[None, :] == tok_seq[:, None]) & (pos[None, :] <= tok_pos[:, None])
    mask = np.pad(mask, ((0, 0), (0, 256 - 40)))[None]
    shared = ex.attend_masked(0, (0,), q, mask, 256, np.full((1, 1), HOST))
    for t, seq in enumerate(tok_seq):
        alone = np.zeros((1, 1, 512), bool)
        alone[0, 0, 256 * seq : 256 * seq + tok_pos[t] + 1] = True
        ref = ex.attend_masked(0, (1,), q[:, t : t + 1], alone, 512, np.full((1, 2), HOST))
        np.testing.assert_allclose(shared[0, t], ref[0, 0], rtol=1e-5, atol=1e-6)
