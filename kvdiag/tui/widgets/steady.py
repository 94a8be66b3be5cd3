"""Updating a text widget without a layout pass when its height does not change.

Textual's ``Static.update`` asks for a layout pass by default, and a layout pass lays out and
renders the whole screen again. On the Pages screen, two auto-height texts change at every
scrubbed step, and their layout passes were most of a step's cost: the grid alone had to be
drawn again. Each text's height is measured as Textual measures it for ``height: auto``: the
content's visual at the content width. A layout pass is asked for only when that height, or the
width it was measured at, differs from the text it replaces. The widget's own bounds
(``min-height``, ``max-height``) then give the same size as before.
"""

from __future__ import annotations

import weakref
from typing import cast

from textual.css.styles import RulesMap
from textual.visual import visualize
from textual.widgets import Static

_MEASURED: weakref.WeakKeyDictionary[Static, tuple[int, int]] = weakref.WeakKeyDictionary()
"""Per widget: (content width, content height) of the text it shows."""


def update_steady(widget: Static, text: str) -> None:
    """``widget.update(text)``, with a layout pass only when the text's height at the widget's
    content width differs from that of the text it had (or nothing was measured yet)."""
    width = widget.content_region.width
    if width <= 0 or not widget.is_mounted:
        _MEASURED.pop(widget, None)
        widget.update(text)
        return
    height = visualize(widget, text, markup=True).get_height(
        cast(RulesMap, widget.styles), width)
    same = _MEASURED.get(widget) == (width, height)
    _MEASURED[widget] = (width, height)
    widget.update(text, layout=not same)
