"""Where input comes from and where output goes: one rule for every command.

- :mod:`kvdiag.files.inputs`: which paths may be read (regular files and standard input,
  never a FIFO, socket or device) and how gzip is recognised;
- :mod:`kvdiag.files.text`: when a file is a text log, and how its stray bytes (NULs, bytes
  that are not UTF-8) are counted and replaced;
- :mod:`kvdiag.files.outputs`: where output may go (a regular file written through a
  temporary file and an atomic rename, standard output, or ``/dev/null``) and when an
  existing file may be replaced.

Like :mod:`kvdiag.errors`, this package is a leaf: it imports nothing else of kvdiag, so every
package may use it (tests/test_architecture.py).
"""
