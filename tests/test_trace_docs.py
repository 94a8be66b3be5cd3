"""docs/trace-format.md matches the schema in kvdiag/model/events.py, and its example reads."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from kvdiag.model import events
from kvdiag.model.events import KNOWN_KINDS, Read, Step, Warn, Write
from kvdiag.model.geometry import Tensor
from kvdiag.trace import TraceReader

DOC = Path(__file__).resolve().parent.parent / "docs" / "trace-format.md"


def sections() -> dict[str, str]:
    text = DOC.read_text(encoding="utf-8")
    parts = re.split(r"^### `([a-z-]+)`.*$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_kind_has_a_section_and_nothing_else_does() -> None:
    assert sorted(sections()) == sorted(KNOWN_KINDS)


@pytest.mark.parametrize("kind", KNOWN_KINDS)
def test_every_field_of_every_kind_is_documented(kind: str) -> None:
    cls = next(
        c
        for c in vars(events).values()
        if isinstance(c, type)
        and getattr(getattr(c, "__struct_config__", None), "tag", None) == kind
    )
    body = sections()[kind]
    missing = [
        f
        for f in cls.__struct_fields__
        if f not in ("seq", "t_ns", "step") and f"`{f}`" not in body
    ]
    assert missing == []


def test_header_tensor_and_range_fields_are_documented() -> None:
    text = DOC.read_text(encoding="utf-8")
    for cls in (events.Header, events.Device, Tensor):
        for f in cls.__struct_fields__:
            assert f"`{f}`" in text, (cls.__name__, f)
    assert "[begin, end, source, holder, cls, version_lag]" in text
    assert list(events.ReadRange.__struct_fields__) == [
        "begin",
        "end",
        "source",
        "holder",
        "cls",
        "version_lag",
    ]


def test_the_example_is_a_valid_trace() -> None:
    text = DOC.read_text(encoding="utf-8")
    example = text.split("## Example", 1)[1].split("```", 2)[1]
    reader = TraceReader(io.BytesIO(example.lstrip("\n").encode()), "example")
    got = list(reader)
    assert reader.problems == []
    assert [type(e) for e in got[:4]] == [Step, Write, Read, Warn]
    assert isinstance(got[2], Read) and got[2].ranges[0].cls == "foreign"
