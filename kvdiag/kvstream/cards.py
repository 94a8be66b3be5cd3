"""Built-in device profiles of consumer GPUs, from their public spec sheets (``--profile NAME``).

These are spec-sheet figures, not measurements: memory bandwidth is the card's rated figure
(NVIDIA's product specifications: memory interface width × data rate), and zero-copy and pinned
host→device rates are the PCIe link's per-direction line rate after 128b/130b encoding (PCI-SIG:
16 GT/s per lane for 4.0, 32 GT/s for 5.0, so 31.5 GB/s for 4.0 x16 and 63.0 GB/s for 5.0 x16).
Real transfers reach less: on kvdiag's measured H200 (PCIe 5.0 x16) pinned copies ran at 55.5 of
63.0 GB/s and zero-copy reads at 51.4 (:data:`~kvdiag.kvstream.timing.H200`). No spec sheet
gives a kernel launch latency; these profiles carry the H200's measured 4.29 µs and say so.
``kvdiag devices --profile`` measures the card at hand instead.
"""

from __future__ import annotations

from kvdiag.kvstream.timing import H200, DeviceProfile

PCIE4_X8, PCIE4_X16, PCIE5_X8, PCIE5_X16 = 15.75, 31.5, 31.5, 63.0
"""Per-direction line rate in GB/s after 128b/130b encoding."""


def _card(name: str, memory_gbps: float, link: float, link_name: str) -> DeviceProfile:
    return DeviceProfile(
        name=name, hbm_read_gbps=memory_gbps, zero_copy_read_gbps=link, h2d_gbps=link,
        launch_us=H200.launch_us,
        source=(f"spec sheet, not a measurement: {memory_gbps:g} GB/s rated memory bandwidth, "
                f"{link_name} ({link:g} GB/s per direction, line rate) for zero-copy and pinned "
                f"H2D; launch latency {H200.launch_us} µs is kvdiag's H200 measurement (no spec "
                "sheet gives one)"))


CARDS: dict[str, DeviceProfile] = {
    "rtx-3060-12gb": _card("NVIDIA GeForce RTX 3060 12GB", 360.0, PCIE4_X16, "PCIe 4.0 x16"),
    "rtx-3090": _card("NVIDIA GeForce RTX 3090", 936.0, PCIE4_X16, "PCIe 4.0 x16"),
    "rtx-4060-ti-16gb": _card("NVIDIA GeForce RTX 4060 Ti 16GB", 288.0, PCIE4_X8,
                              "PCIe 4.0 x8"),
    "rtx-4090": _card("NVIDIA GeForce RTX 4090", 1008.0, PCIE4_X16, "PCIe 4.0 x16"),
    "rtx-5060-ti-16gb": _card("NVIDIA GeForce RTX 5060 Ti 16GB", 448.0, PCIE5_X8,
                              "PCIe 5.0 x8"),
    "rtx-5070-ti": _card("NVIDIA GeForce RTX 5070 Ti", 896.0, PCIE5_X16, "PCIe 5.0 x16"),
    "rtx-5080": _card("NVIDIA GeForce RTX 5080", 960.0, PCIE5_X16, "PCIe 5.0 x16"),
    "rtx-5090": _card("NVIDIA GeForce RTX 5090", 1792.0, PCIE5_X16, "PCIe 5.0 x16"),
}


def card_for(device: str) -> str | None:
    """The built-in card a log's device name (``Device 0: NVIDIA GeForce RTX 5080, …``) is,
    if one is: the longest name it contains wins (``RTX 5060 Ti`` before ``RTX 5060``)."""
    text = device.lower().replace("geforce ", "")
    best: tuple[int, str] | None = None
    for key, card in CARDS.items():
        model = card.name.lower().replace("nvidia geforce ", "").removesuffix(" 12gb")
        model = model.removesuffix(" 16gb")
        if model in text and (best is None or len(model) > best[0]):
            best = (len(model), key)
    return best[1] if best else None
