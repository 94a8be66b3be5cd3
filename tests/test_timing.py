"""The modelled decode evaluation that stands in for GPU feedback (kvdiag.kvstream.timing)."""

from __future__ import annotations

import pytest

from kvdiag.kvstream.timing import H200, DeviceProfile, evaluation

PAGE = 475_136  # q8_0/q5_1, head dim 256, 4 KV heads
# round numbers: a page takes 1 µs to read from HBM and 10 µs to copy, launches cost 2 µs
TOY = DeviceProfile("toy", hbm_read_gbps=PAGE / 1e3, zero_copy_read_gbps=1.0,
                    h2d_gbps=PAGE / 1e4, launch_us=2.0)


def test_all_resident_reads_at_hbm_speed_and_streams_nothing() -> None:
    e = evaluation(TOY, PAGE, active=8, resident=(8, 8, 8), ring=4)
    assert e.eval_us == pytest.approx(3 * (2.0 + 8 * 1.0))
    assert (e.samples, e.misses, e.peak_slots, e.h2d_bytes, e.copy_busy) == (0, 0, 0, 0, 0.0)


def test_a_copy_bound_evaluation_takes_the_copies_time_and_misses_almost_every_page() -> None:
    # 2 layers x 3 streamed pages; copies (10 µs) are far slower than reads (1 µs)
    e = evaluation(TOY, PAGE, active=5, resident=(2, 2), ring=8)
    assert e.samples == 6 and e.h2d_bytes == 6 * PAGE
    # the copy engine runs back to back from t=0: the last page is ready at 60 µs, read by 61
    assert e.eval_us == pytest.approx(61.0)
    assert e.misses == 6  # the attention is always waiting for the copy stream
    assert e.copy_busy == pytest.approx(60 / 61)
    # nothing queues: when copy k starts, only page k - 1 (still being read) holds a slot
    assert e.peak_slots == 2


def test_a_fast_copy_engine_runs_ahead_until_the_ring_is_full() -> None:
    fast = DeviceProfile("fast-copy", hbm_read_gbps=PAGE / 1e4, zero_copy_read_gbps=1.0,
                         h2d_gbps=PAGE / 1e3, launch_us=0.0)  # copy 1 µs, read 10 µs
    e = evaluation(fast, PAGE, active=6, resident=(0,), ring=3)
    assert e.peak_slots == 3  # the ring fills, then each copy waits for a consumed page
    assert e.misses == 1  # only the first page is waited for
    assert e.eval_us == pytest.approx(1.0 + 6 * 10.0)


def test_pages_that_must_stream_need_a_ring() -> None:
    with pytest.raises(ValueError, match="ring has no slots"):
        evaluation(TOY, PAGE, active=4, resident=(2,), ring=0)


def test_the_h200_profile_makes_streaming_the_cliff() -> None:
    resident = evaluation(H200, PAGE, active=256, resident=(256,) * 9, ring=10)
    streaming = evaluation(H200, PAGE, active=256, resident=(200,) * 9, ring=10)
    # PCIe (54.9 GB/s) against HBM (4547 GB/s): streaming 22% of the pages costs > 10x
    assert streaming.tokens_per_s < resident.tokens_per_s / 10
    assert streaming.copy_busy > 0.95
