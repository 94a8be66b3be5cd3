"""What an undeclared trace does not record, inferred from what it shows (issue 15 §3): a
fallback warning or the streamed kernel's fits assert says a fits decision was made, so a
trace with either and without ``fits`` events says fits are not recorded instead of silently
losing the mismatch or fallback finding."""

from __future__ import annotations

from kvdiag.analysis.judgement import Judge
from kvdiag.model import events as ev
from tests.trace_samples import ALL_KINDS


def missing(*events: ev.AnyEvent) -> tuple[set[str], list[str]]:
    j = Judge().feed_all(events).snapshot()
    return ({k.kind for k in j.completeness.missing},
            [f.details.get("what", "") for f in j.findings if f.rule == "not-recorded"])


ASSERT = ev.Abort(1, 0, 0, message="ggml-cuda.cu:1898: GGML_ASSERT("
                  "ggml_cuda_kv_stream_fattn_fits(dst)) failed", file="ggml-cuda.cu",
                  line=1898, condition="ggml_cuda_kv_stream_fattn_fits(dst)")


def test_the_fits_assert_without_fits_events_says_fits_are_not_recorded() -> None:
    kinds, said = missing(ASSERT)
    assert "fits" in kinds and "fits" in said


def test_a_fallback_warning_without_fits_events_says_fits_are_not_recorded() -> None:
    warn = ev.Warn(1, 0, 0, message="falling back", code="kv-stream-fallback", layer=3)
    kinds, said = missing(warn)
    assert "fits" in kinds and "fits" in said


def test_other_aborts_and_warnings_say_nothing_about_fits() -> None:
    segv = ev.Abort(1, 0, 0, message="Segmentation fault", condition="")
    other = ev.Warn(2, 0, 0, message="kvtrace: a line was cut", code="kvtrace-truncated")
    kinds, _ = missing(segv, other)
    assert "fits" not in kinds


def test_with_its_fits_event_the_assert_is_not_a_missing_kind() -> None:
    fits_fields = dict(next(f for cls, f in ALL_KINDS if cls is ev.Fits))
    fits_fields.update(route="abort")
    kinds, _ = missing(ev.Fits(1, 0, 0, **fits_fields),
                       ev.Abort(2, 0, 0, message=ASSERT.message, condition=ASSERT.condition))
    assert "fits" not in kinds


def test_a_run_killed_before_its_first_event_says_so_in_words() -> None:
    (f,) = [f for f in Judge().snapshot().findings if f.rule == "trace-incomplete"]
    assert f.title == ("the run did not complete (no End event: the capture was killed or is "
                       "still running) before the first step; analysed up to event #0")
