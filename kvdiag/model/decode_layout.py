"""The decode-layout placement of resident pages per layer ([FA-MID]; brief §1.5).

Pure arithmetic shared by the runtime model (:mod:`kvdiag.kvstream.adapt` chooses and applies
the layout) and the analyses that rebuild the per-layer resident windows from a trace's
``adapt`` events (:mod:`kvdiag.analysis.replay`), which may not import the model.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DecodeLayout:
    """Concentrated decode placement ([FA-MID]; brief §1.5): when the active pages exceed the
    uniform share, every layer keeps all ``active`` pages resident except ``splits`` layers,
    spread evenly over layer order, which stream ``base`` pages each (one more for the first
    ``remainder`` of them). ``splits == 0`` is the uniform layout."""

    mean: int
    active: int
    layers: int
    splits: int = 0
    base: int = 0
    remainder: int = 0

    def capacity(self, layer: int) -> int:
        """Resident pages of ``layer``."""
        if not self.splits:
            return self.mean
        # split k sits at layer floor(k · layers / splits); invert that without a scan
        split = ((layer + 1) * self.splits - 1) // self.layers
        if split * self.layers // self.splits != layer:
            return self.active
        return self.active - self.base - (1 if split < self.remainder else 0)

    def split_layers(self) -> tuple[int, ...]:
        return tuple(k * self.layers // self.splits for k in range(self.splits))


def decode_layout(resident: int, active: int, layers: int, ring: int) -> DecodeLayout:
    """The layout for ``active`` pages per layer with ``resident`` pages per layer on
    average: the deficit ``(active − resident) × layers`` is spread over
    ``max(min(layers, ceil(deficit / ring)), ceil(deficit / active))`` split layers."""
    if active <= resident:
        return DecodeLayout(resident, active, layers)
    deficit = (active - resident) * layers
    splits = max(min(layers, -(-deficit // ring)), -(-deficit // active))
    return DecodeLayout(resident, active, layers, splits, deficit // splits, deficit % splits)
