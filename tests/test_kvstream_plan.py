"""Boot-time sizing against the figures in the domain brief (§1.3, §1.4) and the PR."""

from __future__ import annotations

import json

import pytest

from kvdiag.cli import main
from kvdiag.kvstream.ggml_types import AttentionMode, attention_mode
from kvdiag.kvstream.pages import PageGeometry
from kvdiag.kvstream.pool import PoolError, plan_pool


def plan_json(capsys: pytest.CaptureFixture[str], *args: str, code: int = 0) -> dict[str, object]:
    assert main(["plan", "--json", *args]) == code
    doc: dict[str, object] = json.loads(capsys.readouterr().out)
    return doc


ARM = ["--layers", "16", "--streamed-layers", "9", "--ctx", "65536", "--np", "1",
       "--type-k", "q8_0", "--type-v", "q5_1", "--head-dim", "256", "--n-head", "24",
       "--n-head-kv", "4"]


def test_host_buffer_of_the_arm117_boot_line(capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(capsys, *ARM, "--stage-mib", "2048")
    assert doc["host_kv_buffer_mib"] == 1044.00
    assert doc["host_kv_bytes"] == 65536 * 9 * (1088 + 768)


def test_2048_mib_stage_gives_501_resident_pages_and_10_ring_slots(
    capsys: pytest.CaptureFixture[str],
) -> None:
    doc = plan_json(capsys, *ARM, "--stage-mib", "2048")
    assert doc["page_bytes"] == 475136
    assert doc["pool_pages"] == 4519
    assert doc["resident_pages_per_layer"] == 501
    assert doc["ring_slots"] == 10
    assert doc["attention_mode"] == "DIRECT"
    assert doc["fits_outlook"] == "always"


def test_preset_matches_explicit_flags(capsys: pytest.CaptureFixture[str]) -> None:
    explicit = plan_json(capsys, *ARM, "--stage-mib", "2048")
    preset = plan_json(capsys, "--preset", "arm117")
    assert preset["resident_pages_per_layer"] == explicit["resident_pages_per_layer"]
    assert preset["host_kv_buffer_mib"] == explicit["host_kv_buffer_mib"]


@pytest.mark.parametrize(
    ("tk", "tv", "page_bytes"),
    [("q8_0", "q8_0", 557056), ("q8_0", "q4_0", 425984), ("q8_0", "q5_1", 475136),
     ("q8_0", "q4_1", 442368), ("q8_0", "q5_0", 458752), ("f16", "f16", 1048576)],
)
def test_page_bytes_for_the_production_head_geometry(tk: str, tv: str, page_bytes: int) -> None:
    assert PageGeometry(tk, tv, 256, 256, 4).page_bytes == page_bytes


@pytest.mark.parametrize("tk", ["f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1"])
@pytest.mark.parametrize("head_dim", [32, 64, 96, 128, 256])
def test_v_plane_offset_is_128_aligned(tk: str, head_dim: int) -> None:
    g = PageGeometry(tk, "q4_0", head_dim, head_dim, 3)
    assert g.v_offset % 128 == 0 and g.v_offset >= g.k_bytes
    # 256 tokens per page make every K plane a multiple of 256 bytes, so the pad never adds
    # bytes: page_bytes is simply K plane + V plane.
    assert g.v_offset == g.k_bytes
    assert g.page_bytes == g.k_bytes + 18 * (head_dim // 32) * 3 * 256


def test_minimum_stage_is_page_bytes_without_the_pad() -> None:
    g = PageGeometry("q8_0", "q8_0", 256, 256, 4)
    assert g.minimum_stage_bytes == 557056  # 0.53 MiB, the logged minimum_stage_bytes


def test_pool_rules() -> None:
    p = plan_pool(12 << 20, 475136, 4)
    assert (p.pool_pages, p.min_ring_slots, p.resident_pages_per_layer, p.ring_slots) == (
        26, 8, 4, 10)
    small = plan_pool(7 * 475136, 475136, 4)
    assert small.min_ring_slots == 3 and small.resident_pages_per_layer == 1
    fixed = plan_pool(12 << 20, 475136, 4, fixed_ring_slots=2)
    assert fixed.resident_pages_per_layer == 6 and fixed.ring_slots == 2
    with pytest.raises(PoolError, match="one page per layer"):
        plan_pool(4 * 475136, 475136, 4)
    with pytest.raises(PoolError, match="FIXED_RING_SLOTS"):
        plan_pool(12 << 20, 475136, 4, fixed_ring_slots=26)


def test_attention_modes() -> None:
    assert attention_mode("q8_0", "q5_1") == AttentionMode.DIRECT
    assert attention_mode("q8_0", "q5_1", native_quants=False) == AttentionMode.F16
    assert attention_mode("f32", "f16") == AttentionMode.F16
    assert attention_mode("q4_K", "q8_0") == AttentionMode.UNSUPPORTED


def test_f16_mode_reserves_a_conversion_workspace(capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(capsys, *ARM, "--stage-mib", "2048", "--no-native-quants")
    assert doc["attention_mode"] == "F16"
    assert doc["conversion_bytes"] == 1048576
    assert doc["pool_pages"] == (2048 * 2**20 - 1048576) // 475136


def test_multi_stream_outlook_and_validator_gate(capsys: pytest.CaptureFixture[str]) -> None:
    doc = plan_json(capsys, *ARM, "--stage-mib", "2048", "--np", "2", code=1)
    assert doc["n_stream"] == 2 and doc["kv_size"] == 32768
    assert doc["fits_outlook"] == "single-stream ubatches only"
    assert "block KV streaming requires exactly one sequence (-np 1)" in doc["gates"]
    unified = plan_json(capsys, *ARM, "--stage-mib", "2048", "--np", "2", "--kv-unified")
    assert unified["n_stream"] == 1 and unified["fits_outlook"] == "always"
    assert unified["gates"] == []
    # same cells in total: the host buffer does not change
    assert unified["host_kv_bytes"] == doc["host_kv_bytes"]


def test_plan_text_prints_the_boot_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["plan", *ARM, "--stage-mib", "2048"]) == 0
    out = capsys.readouterr().out
    assert "CUDA_KV_Stream_Host KV buffer size =  1044.00 MiB" in out
    assert "501 pages/layer" in out
