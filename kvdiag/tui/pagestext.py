"""Words and labels for the Pages grid (plain text; no textual import)."""

from __future__ import annotations

from kvdiag.analysis.judgement import WHY
from kvdiag.analysis.replay import JUDGING, LastRead, PageCell, PagesSnapshot

SOURCE_LETTER = {"pool": "P", "ring": "R", "host": "H"}
CELL_WIDTH = 9
GLYPH = {"foreign": "!", "stale": "~", "not judged": "?"}
"""The judgement's class of a cell's latest read as a character, in front of its label: colour
alone is lost in a monochrome screenshot and to a colour-blind reader."""
OUTSIDE_GLYPH = "^"
"""A page whose rows a ``mark`` at this step put outside every resident window."""
EDGE_GLYPH = "│"
"""In the glyph column of a layer's first page beyond its resident window: where the window
ends (in an adaptive trace it moves with the step, and differs per layer in a decode layout)."""
LEGEND = ("! foreign read (another stream's, layer's or page's bytes) · ~ stale read (older "
          "version) · ? not judged (the trace lacks a fact) · "
          "^ marked outside the window · P/R/H read from pool/ring/host, '·' not read · "
          "s:pVv the slot holds stream s page p version v · * dirty · bold: read at this step · "
          "│ where the resident window ends")


def cell_glyph(cell: PageCell) -> str:
    """One character: ``!`` foreign, ``~`` stale, ``?`` not judged, else a space (the column
    then separates the cell from its left neighbour)."""
    read = cell.read
    return GLYPH.get(read.cls, " ") if read is not None else " "


def cell_text(cell: PageCell, outside: bool = False, edge: bool = False) -> str:
    """The cell as drawn, ``CELL_WIDTH`` wide: the glyph of its read (or ``│`` on the first
    page beyond the window, ``edge``, when the read has no glyph), the label cut to fit, and
    ``^`` last when a mark at this step put the page outside the window."""
    room = CELL_WIDTH - 1 - (1 if outside else 0)
    label = cell_label(cell)[:room] + (OUTSIDE_GLYPH if outside else "")
    glyph = cell_glyph(cell)
    if edge and glyph == " ":
        glyph = EDGE_GLYPH
    return (glyph + label).ljust(CELL_WIDTH)


def cell_label(cell: PageCell) -> str:
    """``P0:3v2*``: served from the pool, slot holds stream 0 page 3 version 2, dirty.

    ``·`` for a page not read yet; ring and host reads show only their letter, because their
    bytes come straight from the host copy of the right page.
    """
    read = cell.read
    letter = SOURCE_LETTER.get(read.source, "?") if read is not None else "·"
    text = letter
    pooled = read.source == "pool" if read is not None else cell.holder is not None
    if pooled:
        h = cell.holder
        text += f"{h.stream}:{h.page}v{h.version}" if h is not None else " empty"
    if cell.dirty:
        text += "*"
    return text


def cell_mark(cell: PageCell, step: int) -> str:
    """Style name of a cell: the judgement's class of its latest read (``foreign``,
    ``stale``, ``exact``), ``ring``/``host`` for those sources, ``empty`` when never read, not
    judged, or still being judged."""
    read = cell.read
    if read is None or read.cls in ("not judged", JUDGING):
        return "empty"
    if read.cls in ("foreign", "stale"):
        return read.cls
    if read.source in ("ring", "host"):
        return read.source
    return "exact"


def cell_words(snap: PagesSnapshot, stream: int, layer: int, page: int,
               streamed: int | None = None) -> str:
    """What one cell means, in a sentence or three."""
    geo = snap.geometry
    try:
        cell = snap.cell(stream, layer, page)
    except IndexError:
        return ""
    where = f"step {snap.step} · layer {layer} · stream {stream} · page {page}: "
    if streamed is not None and layer >= streamed:
        return where + (f"layer {layer} is not streamed (the plan streams layers 0-"
                        f"{streamed - 1}): its K/V stay in device memory, with no pages, pool "
                        "slots or reads to show.")
    parts: list[str] = []
    if cell.resident:
        key = geo.key(layer, stream, page)
        key_text = f"({key[0]}, {'-' if key[1] is None else key[1]}, {key[2]})"
        slot = f"pool slot {cell.slot}" if cell.slot is not None else "no pool slot yet"
        parts.append(f"in the resident window, bookkeeping key {key_text} → {slot}.")
    else:
        parts.append(f"beyond the resident window ({snap.window(layer)} pages/view): streams "
                     "through the ring.")
    parts.append(f"Host copy at version {cell.version}.")
    if cell.holder is not None:
        h = cell.holder
        parts.append(f"The slot holds layer {h.layer} stream {h.stream} page {h.page} "
                     f"v{h.version}.")
    read = cell.read
    if read is None:
        parts.append("Not read yet.")
    else:
        when = "at this step" if read.step == snap.step else f"last at step {read.step}"
        text = f"Read {when} from {read.source}"
        if read.cls == "foreign":
            text += ": FOREIGN, " + _foreign_words(read, layer, stream, page)
        elif read.cls == "stale":
            text += f": STALE, {read.lag} version(s) behind the host copy"
        elif read.cls == "not judged":
            text += f": not judged ({WHY.get(read.why) or 'the trace lacks a fact it needs'})"
        elif read.cls == JUDGING:
            text += ": judging… (the judgement has not reached this read yet)"
        else:
            text += ": exact (the right stream's current data)"
        parts.append(text + ".")
    if cell.dirty:
        parts.append("Its key was marked dirty by this step's writes.")
    return where + " ".join(parts)


def _foreign_words(read: LastRead, layer: int, stream: int, page: int) -> str:
    """Whose bytes the slot held (the judgement's holder)."""
    if read.holder_layer < 0:
        return "the slot held nothing (never uploaded, or emptied)"
    held = f"layer {read.holder_layer} stream {read.holder} page {read.holder_page}"
    if read.holder_layer != layer:
        return f"the slot held another layer's bytes ({held})"
    if read.holder != stream:
        return f"stream {stream} read stream {read.holder}'s bytes ({held})"
    return f"the slot held another page of this view ({held}, not page {page})"


def window_words(snap: PagesSnapshot) -> str:
    geo = snap.geometry
    keyed = "(layer, page): no stream axis" if geo.layout == "shared" else "(layer, stream, page)"
    if snap.shape is None:
        window = f"{geo.window()} resident page(s) per view of {geo.pages} · ring " \
                 f"{geo.ring_slots} slots"
    else:
        sizes = sorted({snap.window(layer) for layer in range(geo.pool_layers or geo.layers)})
        span = str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}–{sizes[-1]}"
        window = f"{span} resident page(s) per view of {geo.pages} (reshaped, per layer)"
    text = f"layout {geo.layout}: bookkeeping keyed {keyed} · {window}"
    if snap.relearn_step is not None:
        text += f" · layer map relearned at step {snap.relearn_step} ({len(snap.learned)} layers)"
    if snap.window_note():
        text += "\n" + snap.window_note()
    return text
