"""The late-2023 form of llama-server's timing lines, paired into requests for ``kvdiag perf``.

Its ``print_timings`` block names no slot: each pass of ``update_slots`` releases (one run of
``slot <s> released`` lines, slot order) the slots whose blocks the pass before printed, so a run
is paired with the blocks printed since the run before, where that is certain. The facts, where
they come from and what is not paired are in :mod:`kvdiag.postmortem.timinglines`; the requests
are made and closed by :class:`~kvdiag.postmortem.perfscan.PerfScanner`.
"""

from __future__ import annotations

import re
from typing import Protocol

from kvdiag.postmortem.perfpending import Pending
from kvdiag.postmortem.timinglines import LATE_LINES, Figures, figure_sets


class PerfScanner(Protocol):
    """What this module uses of :class:`kvdiag.postmortem.perfscan.PerfScanner` (which imports
    this module, so it is named here by its shape)."""

    unfinished: int
    _pending: dict[int, Pending]
    _opened: set[int]

    def _request(self, slot: int, task: int) -> Pending: ...

    def _close(self, slot: int | None, p: Pending, depth_end: int | None,
               truncated: bool | None, ended: str = "end") -> None: ...

_G = LATE_LINES.groupindex
_TIMING, _SLOT, _RELEASED, _PROCESSING, _IN_CACHE, _KV_RM = (
    _G[n] - 1 for n in ("late_timing", "late_slot", "released", "processing", "in_cache",
                        "kv_rm"))

Block = tuple[Figures | None, Figures, int]
"""A printed block: prompt figures (None when its line was not read), decode figures, and the
line of its ``eval time`` figures."""


class LateForm:
    """The blocks and releases of the late-2023 form waiting to be paired, for one scanner
    (passed to each call: no reference back to it, so no cycle)."""

    def __init__(self) -> None:
        self.seen = False
        """A line of the form was read: every later block is searched for it."""
        self.blocks: list[Block] = []
        self.releases: list[tuple[int, int]] = []
        """The current run: (slot, tokens in cache)."""
        self.prompt: tuple[Figures, int] | None = None
        """A ``prompt eval time`` line waiting for its ``eval time`` line."""
        self.shifted: set[int] = set()
        """Slots whose request logged a ``context shift``."""
        self.unpaired = 0
        """Blocks read without their slot (the module's docstring)."""

    def line(self, s: PerfScanner, m: re.Match[bytes], line: int) -> None:
        g = m.groups()
        if g[_RELEASED] is not None:
            self.releases.append((int(g[_SLOT] or 0), int(g[_RELEASED])))
            return
        self.run_end(s)
        if g[_TIMING] is not None:
            figures = figure_sets(g, _TIMING + 1, 1)[0]
            if g[_TIMING] == b"eval":
                prompt = self.prompt
                self.blocks.append((None if prompt is None else prompt[0], figures, line))
                self.prompt = None
            else:
                # one waiting is a block cut after its first line: its request is counted
                # unfinished when released without a block (or when the log ends)
                self.prompt = (figures, line)
            return
        slot = int(g[_SLOT] or 0)
        if g[_PROCESSING] is not None:
            p = s._request(slot, int(g[_PROCESSING]))
            if p.started is None:
                p.started = line
            s._opened.add(slot)
            self.shifted.discard(slot)
            return
        p = s._pending.get(slot) or s._request(slot, -1)
        if g[_IN_CACHE] is not None:
            n_past = int(g[_IN_CACHE])
            p.depth_start = n_past + int(g[_IN_CACHE + 1] or 0)
            if p.cached is None:
                p.cached = n_past
        elif g[_KV_RM] is not None:
            p.cached = int(g[_KV_RM])
        else:
            self.shifted.add(slot)

    def run_end(self, s: PerfScanner) -> None:
        """Pair the run of release lines just read with the blocks printed before it."""
        releases = self.releases
        if not releases:
            return
        self.releases = []
        blocks, self.blocks = self.blocks, []
        if blocks and len(blocks) == len(releases) and (
                len(blocks) == 1 or all(b[1][1] for b in blocks)):
            for (slot, tokens), block in zip(releases, blocks, strict=True):
                self._done(s, slot, tokens, block)
            return
        opened = 0
        for slot, _tokens in releases:
            self.shifted.discard(slot)
            if s._pending.pop(slot, None) is not None:
                opened += 1
        s.unfinished += max(0, opened - len(blocks))
        self._unpaired(s, blocks)

    def flush(self, s: PerfScanner) -> None:
        """A new boot or the log's end: what waits is not paired."""
        self.run_end(s)
        self.prompt = None
        blocks, self.blocks = self.blocks, []
        self._unpaired(s, blocks)
        # the requests those blocks ended are in flight still (their release is not in the
        # log): not counted again as unfinished
        waiting = [slot for slot, p in sorted(s._pending.items()) if p.decode is None]
        for slot in waiting[:len(blocks)]:
            del s._pending[slot]
        self.shifted.clear()

    def _done(self, s: PerfScanner, slot: int, tokens: int, block: Block) -> None:
        found = s._pending.pop(slot, None)
        p = found if found is not None else Pending(None)
        p.prompt, p.decode, p.line = block
        if p.depth_start is None and p.cached is not None and block[0] is not None:
            # the kv cache rm line without an ``in cache`` line: no cache_prompt, so the
            # prompt was processed whole
            p.depth_start = block[0][1]
        truncated = True if slot in self.shifted else None
        self.shifted.discard(slot)
        s._close(slot, p, tokens, truncated, "stop")

    def _unpaired(self, s: PerfScanner, blocks: list[Block]) -> None:
        for prompt, decode, line in blocks:
            p = Pending(None)
            p.prompt, p.decode, p.line = prompt, decode, line
            s._close(None, p, None, None, "stop")
        self.unpaired += len(blocks)
