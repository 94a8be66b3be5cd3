"""Executors: the data plane of ``kvdiag.kvstream.backend`` (store rows, copy pages, attend).

``numpy`` is the reference executor and always available; ``cupy`` runs RawKernels from
``kernels/`` on a GPU. Both store K/V rows in ggml's block formats; ``quant`` holds the
bit-exact ggml conversions they share.
"""
