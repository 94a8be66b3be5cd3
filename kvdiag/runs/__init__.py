"""Runs of the runtime model that make raw events: ``capture`` (one scenario on an executor
into a trace, with telemetry) and ``sweep`` (many decision-only points, summarised), with the
limits both check before anything runs. Above the model (kvstream, executors) and the trace
writer; below the command line."""
