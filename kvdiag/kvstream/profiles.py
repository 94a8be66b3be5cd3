"""Device profiles on disk: ``kvdiag devices --profile`` saves one, captures load one.

A profile is a small JSON file (the fields of :class:`~kvdiag.kvstream.timing.DeviceProfile`)
in ``<user config dir>/kvdiag/profiles/<slug>.json``. ``h200`` names the built-in default (a
measurement); the consumer cards of :mod:`kvdiag.kvstream.cards` are built in too, as spec-sheet
figures.
"""

from __future__ import annotations

import re
from pathlib import Path

import msgspec
import platformdirs

from kvdiag.errors import InputError
from kvdiag.files.outputs import Output, plan_output, write_output
from kvdiag.kvstream.cards import CARDS
from kvdiag.kvstream.timing import H200, DeviceProfile

BUILTIN = {"h200": H200, **CARDS}


def profile_dir() -> Path:
    return Path(platformdirs.user_config_dir("kvdiag")) / "profiles"


def slug(name: str) -> str:
    """``NVIDIA H200 NVL`` → ``nvidia-h200-nvl``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


def save_profile(profile: DeviceProfile, out: Output | None = None) -> str:
    """Write ``profile`` to ``out`` (checked by the command: ``devices --save``), else to
    the profile folder, kvdiag's own store, where a new measurement of the same GPU replaces
    the last (kvdiag.files.outputs writes both)."""
    if out is None:
        store = profile_dir()
        store.mkdir(parents=True, exist_ok=True)
        out = plan_output(store / f"{slug(profile.name)}.json", force=True)
    write_output(out, msgspec.json.format(msgspec.json.encode(profile)) + b"\n")
    return out.display


def load_profile(spec: str) -> DeviceProfile:
    """A built-in name, a saved profile's slug, or a path to a profile file."""
    if spec.lower() in BUILTIN:
        return BUILTIN[spec.lower()]
    candidates = [Path(spec)] if ("/" in spec or spec.endswith(".json")) else [
        profile_dir() / f"{slug(spec)}.json"]
    for path in candidates:
        if path.is_file():
            try:
                return msgspec.json.decode(path.read_bytes(), type=DeviceProfile)
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                raise InputError(f"{path}: not a device profile ({exc})") from None
    known = ", ".join(sorted({*BUILTIN, *(p.stem for p in profile_dir().glob("*.json"))}))
    raise InputError(f"no device profile {spec!r} (known: {known})")
