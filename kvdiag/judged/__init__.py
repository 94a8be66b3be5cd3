"""Inputs read and judged, for every surface: a trace file into its one judgement
(:mod:`.trace`, what ``check``, ``import`` and ``sql`` render) and logs or traces into perf runs
beside the model's prediction (:mod:`.perf`). Reading is ``trace``/``postmortem``/``logimport``,
judging ``analysis``; this layer only joins them, so no surface reads and judges on its own."""
