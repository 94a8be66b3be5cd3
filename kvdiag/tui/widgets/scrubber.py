"""A one-line bar over the steps of a trace: marks where reads went wrong, and a cursor."""

from __future__ import annotations

from typing import ClassVar

import numpy as np
from rich.style import Style
from rich.text import Text
from textual import events
from textual.widget import Widget

from kvdiag.tui.messages import SeekStep

MARK_ORDER: tuple[str, ...] = ("abort", "mismatch", "foreign", "stale", "diverged", "fallback")
"""Marks by precedence (the judgement's: kvdiag.tui.digest.MARKS, and abort events)."""


class Scrubber(Widget):
    """Each column is a run of steps; its colour is the worst mark among them."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "scrubber--bar", "scrubber--cursor", *(f"scrubber--{m}" for m in MARK_ORDER),
    }

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.steps = 0
        self.step = 0
        self.marks: dict[str, np.ndarray] = {}

    def show(self, steps: int, step: int, marks: dict[str, np.ndarray]) -> None:
        # A column is a run of steps: scrubbing within it draws the same bar again, so the
        # bar is repainted only when the cursor's column, the steps or the marks change.
        width = max(1, self.size.width)
        same = steps == self.steps and marks is self.marks and \
            self._column(step, min(width, steps)) == self._column(self.step, min(width, steps))
        self.steps, self.step, self.marks = steps, step, marks
        if not same:
            self.refresh()

    def _column(self, step: int, width: int) -> int:
        return min(width - 1, step * width // max(self.steps, 1))

    def render(self) -> Text:
        width = max(1, self.size.width)
        text = Text(no_wrap=True)
        if self.steps <= 0:
            return text
        cols = min(width, self.steps)
        worst: list[str | None] = [None] * cols
        for name in reversed(MARK_ORDER):  # the first in MARK_ORDER wins
            steps = self.marks.get(name)
            if steps is not None and steps.size:
                for c in np.unique(np.minimum(cols - 1, steps * cols // self.steps)).tolist():
                    worst[int(c)] = name
        cursor = self._column(self.step, cols)
        bar = self.get_component_rich_style("scrubber--bar", default=Style())
        for c in range(cols):
            style = bar
            mark = worst[c]
            if mark is not None:
                style = style + self.get_component_rich_style(f"scrubber--{mark}",
                                                              default=Style())
            if c == cursor:
                style = style + self.get_component_rich_style("scrubber--cursor",
                                                              default=Style())
            text.append("▮" if c == cursor else ("▪" if mark else "─"), style=style)
        return text

    def on_click(self, event: events.Click) -> None:
        if self.steps > 0:
            cols = min(max(1, self.size.width), self.steps)
            x = max(0, min(event.x, cols - 1))
            self.post_message(SeekStep(min(self.steps - 1, x * self.steps // cols)))
