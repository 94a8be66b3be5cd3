"""A file followed as it grows and judged as it arrives (``kvdiag check --follow``): the
tailer (rotation, truncation), a growing trace or server log fed to the one judgement."""
