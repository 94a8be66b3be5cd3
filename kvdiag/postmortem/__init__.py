"""Post-mortem analysis of llama-server style logs.

``parse`` streams logs into records (``kvdiag.model.logrecords``) using ``lines``, ``grammar``,
``backtrace`` and ``crashblock``; ``resymbolize`` re-symbolizes backtraces with the user's
binaries through ``symbolizer`` (``elfindex``, ``dwarfindex``, ``lineprog``, ``cache``).
"""
