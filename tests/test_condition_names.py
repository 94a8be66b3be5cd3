"""Canonical fits condition names (kvdiag/model/conditions.py) and a fork's own spellings of
them: whatever a writer puts in ``failed`` (``Q->ne[3] == 1``), every reader sees the name
kvdiag's predicate uses (``Q.ne[3]==1``), so explanations, logged values and comparisons with
the evaluated conditions work on native traces (issue 15, §6)."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest
from trace_samples import end_line, event_line, header_line

from kvdiag import cli
from kvdiag.kvstream.fits import fits_tensors
from kvdiag.model import events as ev
from kvdiag.model.conditions import CANONICAL, EXPLAIN, canonical
from kvdiag.model.geometry import Tensor
from kvdiag.trace import TraceReader

SPELLINGS = [
    # what a G1 source line reads (brief §2.2), as a fork would copy it
    ("Q->ne[3] == 1", "Q.ne[3]==1"),
    ("q->ne[3]==1", "Q.ne[3]==1"),
    ("  v -> ne [ 3 ]  ==  1 ", "V.ne[3]==1"),
    ("dst->src[1]->ne[3] == 1", "K.ne[3]==1"),
    ("src[2]->ne[0] == KV_STREAM_HEAD_DIM", "V.ne[0]==256"),
    ("Q->type == GGML_TYPE_F32", "Q.type==f32"),
    ("mask->type == GGML_TYPE_F16", "mask.type==f16"),
    ("ggml_is_contiguous(mask)", "mask.contiguous"),
    ("runtime_from_tensor(K) != nullptr", "K.runtime!=NULL"),
    ("ggml_cuda_kv_stream_runtime_from_tensor(dst->src[2]) != NULL", "V.runtime!=NULL"),
    ("runtime_from_tensor(K) == runtime_from_tensor(V)", "K.runtime==V.runtime"),
    ("K->ne[1] % FATTN_KQ_STRIDE == 0", "K.ne[1]%256==0"),
    ("K->nb[0] == ggml_type_size(K->type)", "K.nb[0]==type_size"),
    ("V->nb[1] >= ggml_row_size(V->type, V->ne[0])", "V.nb[1]>=row_size"),
    ("K->nb[1] == ggml_row_size(K->type, K->ne[0]) * K->ne[2]", "K.nb[1]==row_size*K.ne[2]"),
    ("kv_stream_block_tokens(dst, stage_bytes) > 0", "block_tokens(stage_bytes)>0"),
    ("kv_stream_attention_mode(K->type, V->type) != KV_STREAM_MODE_UNSUPPORTED",
     "mode(K,V)!=UNSUPPORTED"),
    ("sinks == nullptr", "sinks==NULL"),
    ("!sinks", "sinks==NULL"),
    ("dst->src[4] == NULL", "sinks==NULL"),
    ("1 == Q->ne[3]", "Q.ne[3]==1"),
    ("Q->ne[1] > 0", "Q.ne[1]>=1"),
    ("V->ne[2] == K->ne[2]", "K.ne[2]==V.ne[2]"),
]


@pytest.mark.parametrize(("spelled", "name"), SPELLINGS)
def test_a_forks_spelling_becomes_the_canonical_name(spelled: str, name: str) -> None:
    assert name in CANONICAL
    assert canonical(spelled) == name


def test_canonical_names_stay_and_unknown_names_keep_their_words() -> None:
    for name in EXPLAIN:
        assert canonical(name) == name
    # not one of kvdiag's conditions: blanks and arrows go, the words stay
    assert canonical("my_runtime_ok(dst) && Q->ne[2] <= 64") == "my_runtime_ok(dst)&&Q.ne[2]<=64"
    assert canonical("next_layer < layer_count") == "next_layer<layer_count"


def _t(type_: str, ne: tuple[int, int, int, int], nb: tuple[int, int, int, int],
       runtime: int | None = None, contiguous: bool = True) -> Tensor:
    return Tensor("t", type_, ne, nb, runtime=runtime, contiguous=contiguous)


def test_the_canonical_names_are_the_predicates_names() -> None:
    """Every name kvdiag's predicate (kvdiag/kvstream/fits.py) can report is in EXPLAIN, and
    every EXPLAIN entry is one the predicate reports: geometry that breaks every condition,
    twice (runtime identity is tested only when both runtimes are set)."""
    q = _t("f16", (128, 0, 8, 2), (1, 1, 1, 1))
    k = _t("f16", (128, 300, 2, 2), (3, 5, 7, 9))
    v = _t("q4_0", (64, 200, 3, 2), (3, 5, 7, 9))
    mask = _t("f32", (1, 1, 1, 2), (1, 1, 1, 1), contiguous=False)
    first = fits_tensors(q, k, v, mask, stage_bytes=0, native_quants=False, sinks=True)
    second = fits_tensors(q, _t("f16", k.ne, k.nb, runtime=1), _t("f16", v.ne, v.nb, runtime=2),
                          mask, stage_bytes=0, sinks=True)
    # mode(K,V)!=UNSUPPORTED fails only for a type the model does not know, and for such a
    # type the layout conditions cannot be computed (check says "not evaluated")
    assert set(first.failed) | set(second.failed) == set(EXPLAIN) - {"mode(K,V)!=UNSUPPORTED"}


FITS_TENSOR = msgspec.to_builtins(Tensor("k", "q8_0", (256, 512, 4, 2), (34, 1088, 272, 557056),
                                         runtime=7))


def _trace(path: Path, failed: list[str]) -> Path:
    path.write_bytes(
        header_line("1.2")
        + event_line("step", 1, 0, phase="decode", streams=[0, 1], tokens=1, n_kv=512)
        + event_line("fits", 2, 0, node="__fattn__-0", layer=0, q=FITS_TENSOR, k=FITS_TENSOR,
                     v=FITS_TENSOR, dst=FITS_TENSOR, stage_bytes=1 << 22, result=False,
                     route="fallback", membership=True, failed=failed)
        + end_line(3, 2))
    return path


def test_the_reader_hands_out_canonical_names(tmp_path: Path) -> None:
    path = _trace(tmp_path / "t.kvtrace", ["Q->ne[3] == 1", "k->ne[3]==1", "my_check(K)"])
    with TraceReader.open(path) as reader:
        fits = next(e for e in reader if isinstance(e, ev.Fits))
    assert fits.failed == ("Q.ne[3]==1", "K.ne[3]==1", "my_check(K)")


def test_check_explains_a_forks_spelling_with_the_logged_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _trace(tmp_path / "t.kvtrace", ["K -> ne[3] == 1", "v->ne[3]==1"])
    assert cli.main(["check", "--json", str(path)]) == 0
    [finding] = [f for f in json.loads(capsys.readouterr().out)["findings"]
                 if f["rule"] == "fallback"]
    assert finding["evidence"][0]["text"] == (
        "__fattn__-0: failed: K.ne[3]==1 (K.ne[3]=2), V.ne[3]==1 (V.ne[3]=2)")
