"""One ``fits`` decision judged: its outcome and each condition of the predicate.

**Outcome** — the one place that says which decisions are bad:

- ``mismatch``: fits() was false and the dispatcher still sent the node to the streamed kernel
  (route ``streamed``, or ``abort`` when the kernel's ``GGML_ASSERT(fits)`` fired): the
  upstream dispatcher routes on buffer membership (kv-stream-domain.md §2.3);
- ``fallback``: the node went to ordinary flash attention over the host-mapped buffer;
- ``ordinary``: the node is not in a kv-stream buffer;
- ``streamed``: fits() held and the streamed kernel ran;
- ``other``: an ``abort`` although fits() held, or a route outside :data:`ROUTES` (an event
  made through the Python API: a trace line with one is corrupt to the reader), counted under
  its own name (:func:`route_name`).

**Conditions** are evaluated by kvdiag from the logged geometry with the predicate the runtime
model routes on (:func:`kvdiag.model.fits.conditions`): held, failed with the values tested,
or unknown with the field that is not recorded. Which names count as failed: the writer's
``failed`` when it evaluated them (``evaluated: true``, the model); else kvdiag's — ``by`` says
which (``writer`` / ``kvdiag`` / ``not recorded`` when no condition could be evaluated). Where
kvdiag evaluated them and the writer's bool disagrees, ``note`` says so. A trace does not
record attention sinks, so ``sinks==NULL`` is always unknown here.
"""

from __future__ import annotations

import functools
from typing import Any, Literal

import msgspec
import numpy as np

from kvdiag.model import events as ev
from kvdiag.model.fits import Condition, conditions
from kvdiag.model.geometry import Tensor

Outcome = Literal["mismatch", "fallback", "ordinary", "streamed", "other"]
By = Literal["writer", "kvdiag", "not recorded"]


def outcome(e: ev.Fits) -> Outcome:
    """What the dispatcher did with this decision (module docstring)."""
    return OUTCOMES[int(outcome_codes([e.route], [e.result])[0])]


BAD: frozenset[str] = frozenset({"mismatch", "fallback"})
"""Outcomes that make findings (``fits-dispatch-mismatch``, ``fallback``)."""

OUTCOMES: tuple[Outcome, ...] = ("streamed", "mismatch", "fallback", "ordinary", "other")
OUTCOME_CODE: dict[str, int] = {o: i for i, o in enumerate(OUTCOMES)}


ROUTES: tuple[str, ...] = ("streamed", "fallback", "abort", "ordinary")


class _Routes(dict[str, int]):
    def __missing__(self, key: str) -> int:
        return len(ROUTES)


ROUTE_CODE = _Routes({r: i for i, r in enumerate(ROUTES)})
"""Codes of a route (:data:`ROUTES`; 4: another): columns.c codes them alike."""

UNKNOWN_ROUTE = "unknown route"
"""What a route that is not a string (null, a number: an event made in Python, where the
schema's Literal is not checked) is counted under."""


def route_name(route: object) -> str:
    """The name a route is counted under: its own where it is a string — one the judgement
    does not know too (said, never dropped: outcome ``other``) — else :data:`UNKNOWN_ROUTE`."""
    return route if isinstance(route, str) else UNKNOWN_ROUTE


OTHER_ROUTE = len(ROUTES)
"""The code of every route but :data:`ROUTES`' (:data:`ROUTE_CODE`)."""


def route_code(route: object) -> int:
    """:data:`ROUTE_CODE` of any route, one that is not a string too (:data:`OTHER_ROUTE`)."""
    return ROUTE_CODE[route] if isinstance(route, str) else OTHER_ROUTE


def route_codes(routes: list[Any]) -> np.ndarray:
    """:func:`route_code` of many routes, as an int64 array (columns.c codes them alike)."""
    try:
        return np.fromiter(map(ROUTE_CODE.__getitem__, routes), np.int64, len(routes))
    except TypeError:  # an unhashable route (an event made in Python): another route
        return np.fromiter(map(route_code, routes), np.int64, len(routes))


def outcome_codes(routes: list[Any], results: list[bool]) -> np.ndarray:
    """:func:`outcome` of many decisions at once, as :data:`OUTCOME_CODE` codes (the same
    rule, for the chunked judgement)."""
    return outcome_of(route_codes(routes), np.fromiter(results, bool, len(results)))


def outcome_of(route: np.ndarray, result: np.ndarray) -> np.ndarray:
    """:func:`outcome_codes` of route codes (:data:`ROUTE_CODE`) and results (bools)."""
    result = result.astype(bool)
    out = np.full(route.size, OUTCOME_CODE["other"], np.int8)
    out[route == 0] = OUTCOME_CODE["streamed"]
    out[route == 3] = OUTCOME_CODE["ordinary"]
    out[~result & ((route == 0) | (route == 2))] = OUTCOME_CODE["mismatch"]
    out[route == 1] = OUTCOME_CODE["fallback"]
    return out


class FitsVerdict(msgspec.Struct, frozen=True):
    outcome: Outcome
    failed: tuple[str, ...]
    """The failed condition names (the writer's or kvdiag's: ``by``)."""
    by: By
    conditions: tuple[Condition, ...]
    """kvdiag's evaluation of every condition."""
    note: str = ""

    @property
    def unknown(self) -> tuple[Condition, ...]:
        return tuple(c for c in self.conditions if c.state == "unknown")

    def shown(self) -> str:
        """The failed conditions with the logged values they tested."""
        by_name = {c.name: c for c in self.conditions}
        return ", ".join(by_name[n].text() if n in by_name else n for n in self.failed)


@functools.lru_cache(maxsize=4096)
def _evaluate(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dst: Tensor,
              stage_bytes: int, native_quants: bool, mask_known: bool) -> tuple[Condition, ...]:
    # cached: a decode graph repeats the same operands every step (hashing four frozen
    # tensors costs far less than evaluating 26 conditions)
    return conditions(q, k, v, mask, stage_bytes, native_quants, None, dst=dst,
                      mask_known=mask_known)


class FitsJudge:
    """Judges fits events with what the header says about the run (``native_quants`` from the
    model's config, the runtime's default build otherwise; whether the writer recorded the
    mask at all: an imported log lists ``fits.mask`` among its unknown fields)."""

    def __init__(self, header: ev.Header | None = None) -> None:
        cfg: Any = header.scenario.get("config") if header is not None else None
        native = cfg.get("native_quants", True) if isinstance(cfg, dict) else True
        self.native_quants = bool(native) if native is not None else True
        unknown: Any = None
        if header is not None and isinstance(header.extra.get("import"), dict):
            unknown = header.extra["import"].get("unknown")
        self.mask_known = not (isinstance(unknown, list) and any(
            isinstance(u, str) and u.startswith("fits.mask") for u in unknown))

    def conditions(self, e: ev.Fits) -> tuple[Condition, ...]:
        try:
            return _evaluate(e.q, e.k, e.v, e.mask, e.dst, e.stage_bytes, self.native_quants,
                             self.mask_known)
        except TypeError:  # an unhashable field from a damaged file: evaluate uncached
            return conditions(e.q, e.k, e.v, e.mask, e.stage_bytes, self.native_quants, None,
                              dst=e.dst, mask_known=self.mask_known)

    def verdict(self, e: ev.Fits) -> FitsVerdict:
        conds = self.conditions(e)
        failed = tuple(c.name for c in conds if c.state == "failed")
        unknown = [c for c in conds if c.state == "unknown"]
        by: By
        note = ""
        if e.evaluated:
            by, names = "writer", e.failed
        elif len(unknown) == len(conds):
            by, names = "not recorded", ()
        else:
            by, names = "kvdiag", failed
            # conclusive only one way round: a failed condition refutes "true"; "false" is
            # refuted only when every condition could be evaluated
            if (failed and e.result) or (not failed and not unknown and not e.result):
                note = (f"the writer's predicate returned {str(e.result).lower()}, the "
                        f"model's {str(not failed).lower()}")
        return FitsVerdict(outcome(e), tuple(names), by, conds, note)
