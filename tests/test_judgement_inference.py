"""What an undeclared trace does not record, inferred from what it shows (issue 15 §3): a
fallback warning or the streamed kernel's fits assert says a fits decision was made, so a
trace with either and without ``fits`` events says fits are not recorded instead of silently
losing the mismatch or fallback finding."""

from __future__ import annotations

from kvdiag.analysis.judgement import Judge
from kvdiag.analysis.judgement.judge import batches as judge_batches
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


def test_a_records_event_declares_kinds_for_what_follows() -> None:
    """Format 1.2: a shared object loaded after the header line declares the kinds its macros
    write (kernels/kvtrace.h); the judgement took that from an unknown ``records`` event only,
    and once the reader knew the kind (``ev.Records``) the declaration was lost: its uploads
    and writes were 'not recorded' and the page read from them not judged."""
    from tests.test_judgement import R, U, W

    header = ev.Header("kvtrace", "1.2", "0", "", "native", ev.Device("cpu"),
                       records=("step", "fits", "read", "output"))
    read = R(5, 0, 0, 0, (0, 1, "pool", 3))
    j = Judge(header)
    batches = list(judge_batches([ev.Records(1, 0, 0, kinds=("write", "upload")),
                                  W(2, 0, 0, 0, 0, 256), U(3, 0, 0, 0, 0, 1, 3),
                                  W(4, 0, 0, 0, 0, 1), read]))
    assert [len(b) for b in batches] == [1, 4]  # the declaration alone
    for b in batches:
        j.feed_all(b)
    v = j.verdict(read)
    assert v is not None and v.counts == (0, 1, 0, 0)  # stale: written after its upload
    snap = j.snapshot()
    # every judged kind is declared; invalidate is not, and pages were read from a slot
    assert {k.kind for k in snap.completeness.missing} == {"invalidate"}
    assert snap.completeness.declared == ("step", "fits", "read", "output", "write", "upload")


def test_batches_keep_every_read_of_a_batch_answerable() -> None:
    """A declaration in the middle of a batch ends it: the Judge answers about the reads of
    the last batch it was fed, so a read before the declaration needs its own batch."""
    from tests.test_judgement import R, U, W

    first, second = R(3, 0, 0, 0, (0, 1, "pool", 0)), R(5, 0, 0, 0, (0, 1, "pool", 0))
    events = [W(1, 0, 0, 0, 0, 1), U(2, 0, 0, 0, 0, 1, 0), first,
              ev.Unknown("records", 4, 0, 0, {"kinds": ["learn"]}), second]
    j = Judge()
    answered = []
    for b in judge_batches(events):
        j.feed_all(b)
        answered += [j.verdict(e) is not None for e in b if isinstance(e, ev.Read)]
    assert answered == [True, True]
