"""The Fits detail pane: a fits() decision's operands with the failing fields marked, and the
judgement's verdict on it (:class:`~kvdiag.analysis.judgement.FitsVerdict`): each condition
held, failed with the logged values it tested (explained in words,
``kvdiag.model.conditions.EXPLAIN``) or not evaluable and why. Pure rich, no textual: the
screen passes the styles it reads from the stylesheet.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text

from kvdiag.analysis.judgement import FitsVerdict
from kvdiag.model import events as ev
from kvdiag.model.conditions import EXPLAIN
from kvdiag.model.geometry import Tensor
from kvdiag.model.logrecords import FitsLine
from kvdiag.tui.eventtext import ptr

Cell = tuple[str, str, int]
"""(tensor, field, dim): ``("K", "ne", 3)``; dim is -1 for fields without one."""

_UNKNOWN = (0, 0, 0, 0)
_DIM = re.compile(r"\b(Q|K|V|mask)\.(ne|nb)\[(\d)\]")
_FIELD = re.compile(r"\b(Q|K|V|mask)\.(type|runtime|contiguous)\b")


@dataclass(frozen=True)
class FitsStyles:
    failed: Style = field(default_factory=lambda: Style(color="white", bgcolor="red", bold=True))
    ok: Style = field(default_factory=lambda: Style(color="green"))
    dim: Style = field(default_factory=lambda: Style(dim=True))
    heading: Style = field(default_factory=lambda: Style(bold=True))


def condition_cells(condition: str) -> set[Cell]:
    """Operand fields a condition tests: ``K.ne[1]==V.ne[1]`` → K.ne[1] and V.ne[1]."""
    cells: set[Cell] = {(m[1], m[2], int(m[3])) for m in _DIM.finditer(condition)}
    cells |= {(m[1], m[2], -1) for m in _FIELD.finditer(condition)}
    if condition.startswith("mode(K,V)"):
        cells |= {("K", "type", -1), ("V", "type", -1)}
    if "row_size" in condition or "type_size" in condition:
        name = condition[0]
        cells.add((name, "type", -1))
    if condition.startswith("block_tokens"):
        cells.add(("stage", "bytes", -1))
    return cells


def explain(condition: str) -> str:
    return EXPLAIN.get(condition, "no explanation recorded for this condition")


def _operand_rows(event: ev.Fits) -> list[tuple[str, Tensor]]:
    rows = [("Q", event.q), ("K", event.k), ("V", event.v)]
    if event.mask is not None:
        rows.append(("mask", event.mask))
    rows.append(("dst", event.dst))
    return rows


def operands_table(event: ev.Fits, styles: FitsStyles,
                   failed: tuple[str, ...] | None = None) -> Table:
    """One row per operand: its name, type and ``ne``/``nb`` as lists with the elements a
    failed condition tests marked. The lists wrap between elements and the name between
    words when the pane is narrow, so no number is ever cut (a stride is often 8-11 digits).
    ``failed``: the conditions whose fields are marked (default: the event's own)."""
    marked = _marked(event, failed)
    table = Table(expand=False, box=None, pad_edge=False, header_style=styles.heading)
    table.add_column("", no_wrap=True)
    table.add_column("name", overflow="fold", max_width=28)
    table.add_column("type", no_wrap=True)
    table.add_column("ne", overflow="fold")
    table.add_column("nb (bytes)", overflow="fold")
    for op, t in _operand_rows(event):
        # an imported log leaves what it did not print as "" and zeros (docs/log-import.md)
        table.add_row(
            Text(op, style=styles.heading), t.name,
            _cell(marked, styles, op, "type", -1, t.type or "?"),
            _dims(marked, styles, op, "ne", t.ne), _dims(marked, styles, op, "nb", t.nb))
    return table


def placement_table(event: ev.Fits, styles: FitsStyles,
                    failed: tuple[str, ...] | None = None) -> Table:
    """Where each operand lives: data pointer, buffer type, runtime id, contiguity."""
    marked = _marked(event, failed)
    table = Table(expand=False, box=None, pad_edge=False, header_style=styles.heading)
    table.add_column("", no_wrap=True)
    for col in ("data", "buffer", "runtime", "contig"):
        table.add_column(col, overflow="fold")
    for op, t in _operand_rows(event):
        table.add_row(
            Text(op, style=styles.heading), ptr(t.data) if t.data else "-", t.buffer or "-",
            _cell(marked, styles, op, "runtime", -1, "-" if t.runtime is None else (
                str(t.runtime) if t.runtime < 1 << 16 else ptr(t.runtime))),
            _cell(marked, styles, op, "contiguous", -1, "yes" if t.contiguous else "no"))
    return table


def _marked(event: ev.Fits, failed: tuple[str, ...] | None) -> set[Cell]:
    marked: set[Cell] = set()
    for cond in event.failed if failed is None else failed:
        marked |= condition_cells(cond)
    return marked


def _cell(marked: set[Cell], styles: FitsStyles, op: str, name: str, dim: int,
          text: str) -> Text:
    return Text(text, style=styles.failed if (op, name, dim) in marked else "")


def _dims(marked: set[Cell], styles: FitsStyles, op: str, name: str,
          values: tuple[int, ...]) -> Text:
    """``[256, 256, 24, 2]`` with the tested elements marked; ``?`` for what was not logged."""
    shown = ["?"] * 4 if values == _UNKNOWN else [str(v) for v in values]
    text = Text("[")
    for i, v in enumerate(shown):
        if i:
            text.append(", ")
        text.append_text(_cell(marked, styles, op, name, i, v))
    text.append("]")
    return text


BY = {"writer": "as the writer evaluated them",
      "kvdiag": "evaluated by kvdiag from the logged geometry (the writer did not evaluate them)",
      "not recorded": "the trace records too little of the operands to evaluate any"}
"""Where the failed conditions of a verdict come from (:class:`FitsVerdict` ``by``)."""


def stage_text(event: ev.Fits, plan_stage: object = None) -> str:
    """The stage size a fits event tested. 0 or less is "not recorded" (kvdiag.model.fits;
    an import without the boot facts, a fork that did not set ``plan.stage_bytes``), never a
    stage of 0 bytes: then the header's plan figure, marked as the header's, or unknown."""
    if event.stage_bytes > 0:
        return f"stage_bytes {event.stage_bytes}"
    if isinstance(plan_stage, int) and not isinstance(plan_stage, bool) and plan_stage > 0:
        return (f"stage_bytes not recorded in this event; the header's plan says {plan_stage} "
                "(from the header)")
    return "stage_bytes unknown (not recorded)"


def fits_detail(event: ev.Fits, verdict: FitsVerdict,
                styles: FitsStyles | None = None, plan_stage: object = None) -> RenderableType:
    """Header line, operands with the failed conditions' fields marked, and every condition
    of the judgement's verdict: failed (explained), not evaluable (why), held. ``plan_stage``:
    the header plan's ``stage_bytes`` (said where the event does not record its own)."""
    st = styles or FitsStyles()
    head = Text()
    head.append(f"#{event.seq} step {event.step} layer {event.layer} {event.node}: ",
                style=st.heading)
    head.append("fits() = ")
    head.append("true" if event.result else "false", style=st.ok if event.result else st.failed)
    head.append(f", route {event.route}")
    if event.membership:
        head.append(", K/V in a kv-stream buffer (membership)", style=st.dim)
    stage = Text(stage_text(event, plan_stage),
                 style=st.failed if any(c.startswith("block_tokens") for c in verdict.failed)
                 else st.dim)
    parts: list[RenderableType] = [head, stage, operands_table(event, st, verdict.failed),
                                   Text(), placement_table(event, st, verdict.failed)]
    failed, rest = conditions_text(verdict, st)
    parts += failed
    if verdict.outcome in ("mismatch", "fallback") or (
            verdict.failed and event.route in ("streamed", "abort")):
        parts.append(_route_note(event, st))
    return Group(*parts, *rest)


def conditions_text(verdict: FitsVerdict, st: FitsStyles) -> tuple[list[Text], list[Text]]:
    """The verdict's conditions in words: what failed (explained) and where the writer's
    predicate disagrees, then the rest — the conditions not evaluable and why, those that
    held."""
    conds = verdict.conditions
    unknown = [c for c in conds if c.state == "unknown"]
    held = [c for c in conds if c.state == "held"]
    out: list[Text] = []
    if verdict.failed:
        out.append(Text(f"{len(verdict.failed)} failed condition(s), {BY[verdict.by]}:",
                        style=st.heading))
        by_name = {c.name: c for c in conds}
        for name in verdict.failed:
            line = Text("  ✗ ")
            c = by_name.get(name)
            line.append(c.text() if c is not None else name, style=st.failed)
            line.append(f"  {explain(name)}")
            out.append(line)
    elif verdict.by == "not recorded":
        out.append(Text(f"conditions not evaluated: {BY['not recorded']}", style=st.heading))
    elif unknown:
        out.append(Text(f"no condition failed of the {len(held)} kvdiag could evaluate "
                        f"({BY[verdict.by]})", style=st.ok))
    else:
        out.append(Text("every condition holds", style=st.ok))
    if verdict.note:
        out.append(Text(f"note: {verdict.note}", style=st.failed))
    rest: list[Text] = []
    if unknown:
        rest.append(Text(f"{len(unknown)} not evaluable:", style=st.heading))
        for c in unknown:
            rest.append(Text(f"  ? {c.name}: {c.why}", style=st.dim))
    if held:
        # their values are in the operands table above
        rest.append(Text(f"{len(held)} held: " + ", ".join(c.name for c in held),
                         style=st.dim))
    return out, rest


def _route_note(event: ev.Fits, st: FitsStyles) -> Text:
    if event.route in ("streamed", "abort"):
        return Text("the dispatcher still chose the streamed kernel: it routes on buffer "
                    "membership, and the kernel's GGML_ASSERT(fits) aborts", style=st.failed)
    if event.route == "fallback":
        return Text("the dispatcher fell back to ordinary flash attention over the "
                    "host-mapped buffer (zero-copy)", style=st.dim)
    return Text("the node is not in a kv-stream buffer: ordinary flash attention",
                style=st.dim)


def fitsline_detail(rec: FitsLine, styles: FitsStyles | None = None) -> RenderableType:
    """A log's instrumented ``fits=false`` line: what it printed (the log has no conditions)."""
    st = styles or FitsStyles()
    head = Text(f"{rec.where.source}:{rec.where.line}: fits=false", style=st.heading)
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style=st.heading)
    table.add_column()
    shape = "[" + ",".join(map(str, rec.ne)) + "]" if rec.ne else "-"
    multi = len(rec.ne) == 4 and rec.ne[3] > 1
    table.add_row("dst ne", Text(shape, style=st.failed if multi else ""))
    for label, value in (("type", rec.type), ("dst", rec.dst), ("K data", rec.k),
                         ("K buffer", rec.kbuf), ("V buffer", rec.vbuf), ("K runtime", rec.kr),
                         ("V runtime", rec.vr)):
        table.add_row(label, value or "-")
    parts: list[RenderableType] = [head, table]
    if multi:
        parts.append(Text(f"  ✗ dst ne[3] = {rec.ne[3]}: {EXPLAIN['K.ne[3]==1']}",
                          style=st.failed))
    parts.append(Text(rec.where.text, style=st.dim))
    return Group(*parts)
