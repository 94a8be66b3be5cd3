"""Device profiles: saved, found by name or path, refused in one line when unusable."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvdiag.cli import main
from kvdiag.errors import InputError
from kvdiag.kvstream import profiles
from kvdiag.kvstream.timing import H200, DeviceProfile


@pytest.fixture
def config_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(profiles, "profile_dir", lambda: tmp_path / "profiles")
    return tmp_path / "profiles"


def test_save_then_load_by_name_and_by_path(config_home: Path) -> None:
    p = DeviceProfile("NVIDIA GeForce RTX 4090", 1008.0, 25.1, 24.6, 2.9, source="test rig")
    path = profiles.save_profile(p)
    assert path == str(config_home / "nvidia-geforce-rtx-4090.json")
    assert profiles.load_profile("NVIDIA GeForce RTX 4090") == p
    assert profiles.load_profile(str(path)) == p
    assert profiles.load_profile("H200") is H200


def test_unknown_and_broken_profiles_are_one_line_errors(config_home: Path) -> None:
    profiles.save_profile(DeviceProfile("A100", 1900.0, 24.0, 25.0, 3.0))
    with pytest.raises(InputError, match=r"no device profile 'b200' \(known: a100, h200, "
                                         r"rtx-3060-12gb, rtx-3090, .*rtx-5090\)"):
        profiles.load_profile("b200")
    bad = config_home / "broken.json"
    bad.write_text('{"name": "x", "hbm_read_gbps": "fast"}')
    with pytest.raises(InputError, match=r"broken\.json: not a device profile"):
        profiles.load_profile(str(bad))


def test_devices_profile_without_a_gpu_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("numpy")
    try:
        import cupy  # noqa: F401
    except Exception:
        pass
    else:
        pytest.skip("CuPy is installed: the GPU test measures a real profile")
    assert main(["devices", "--profile"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("kvdiag devices --profile: the cupy executor needs CuPy")
    assert err.count("\n") == 1


def test_consumer_cards_are_spec_sheet_figures_and_say_so() -> None:
    from kvdiag.kvstream.cards import card_for

    card = profiles.load_profile("rtx-5080")
    assert (card.hbm_read_gbps, card.h2d_gbps, card.zero_copy_read_gbps) == (960.0, 63.0, 63.0)
    assert card.source.startswith("spec sheet, not a measurement")
    assert profiles.load_profile("rtx-4060-ti-16gb").h2d_gbps == 15.75  # PCIe 4.0 x8
    assert card_for("NVIDIA GeForce RTX 5060 Ti, compute capability 12.0") == "rtx-5060-ti-16gb"
    assert card_for("NVIDIA GeForce RTX 3090") == "rtx-3090"
    assert card_for("NVIDIA H100 80GB HBM3") is None
