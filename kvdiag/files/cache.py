"""The user's cache folder: ``$KVDIAG_CACHE_DIR``, else the platform's (platformdirs).

One root for what kvdiag keeps between runs: the symbolizer's DWARF tables
(:mod:`kvdiag.postmortem.cache`), the TUI's judgements (:mod:`kvdiag.tui.judgecache`) and the
compiled helpers (:mod:`kvdiag.compiled`), each in a folder of its own below it.
"""

from __future__ import annotations

import os


def cache_root() -> str:
    env = os.environ.get("KVDIAG_CACHE_DIR")
    if env:
        return env
    import platformdirs

    return platformdirs.user_cache_dir("kvdiag", appauthor=False)
