"""Exports of a trace: Chrome/Perfetto trace-event JSON (:mod:`.chrome`) and the llama-server
log the modelled run would print (:mod:`.llama_log`).

A surface of the judgement (design.md, "One judgement, every surface"): every label, flow
arrow and count that says what an event means comes from :mod:`kvdiag.analysis.judgement`;
the exporters only select, lay out and format. They import ``analysis`` and ``model`` (never
``trace``: the command hands them the reader's events, header and unknown fields).
"""

from __future__ import annotations
