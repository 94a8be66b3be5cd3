"""Turning one raw line of a log into clean text (opening logs: :mod:`kvdiag.files.logs`).

A line as it reaches a user may carry, outside in: a journald (``Jan 10 16:31:55 host
prog[pid]: ``, or the short ``prog[pid]: `` that ``journalctl -o cat``-style copies and
syslog forwarders leave), ISO-timestamp (``docker logs -t``, Kubernetes CRI ``<ts> stderr F``) or
docker-compose (``svc-1  | ``) prefix, llama-server router's ``[port] `` prefix (port right-aligned in 5 columns), ANSI colour codes
(gdb runs with ``set style enabled on``) and llama.cpp's own ``<min>.<ss>.<ms>.<us> <L> `` prefix
(common/log.cpp; domain brief §6.3, §7.1). ``clean`` removes all of them and reports the level
letter when there was one.
"""

from __future__ import annotations

import re

from kvdiag.files.text import decode_line

#: Text kept per line; a longer line keeps its first and last ``MAX_LINE_CHARS // 2``
#: characters, joined by ``CUT``: a death's text may end a line that began long before it
#: (ggml_abort flushes stdout, so its ``<file>:<line>: …`` follows output without a line end,
#: domain brief §6.1). The scanner reports a cut once per source.
MAX_LINE_CHARS = 4096
CUT = " \u2026 "
CUT_LINE_CHARS = MAX_LINE_CHARS + len(CUT)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b[()][0-9A-Za-z]|\x1b[=>]")
_JOURNALD = re.compile(
    r"^(?:[A-Z][a-z]{2}|\d{1,2}月) {1,2}\d{1,2} \d\d:\d\d:\d\d \S+ [^\s:\[]+(?:\[\d+\])?: "
)
# After the timestamp: the CRI stream and tag (Kubernetes), or a syslog host and
# ``prog[pid]:`` (rsyslog's file format). The pid is required: without it "<host> <prog>:" is
# any two words and a colon, which the messages docker -t prefixes start with ("CUDA error: …",
# "slot launch_slot_: id …"), and those would lose their first words.
_ISO = re.compile(
    r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"
    r"(?: (?:stdout|stderr) [FP]| \S+ [^\s:\[]+\[\d+\]:)? "
)
# journald's identifier and pid without date and host (what remains when the date column is cut
# off a copied journal, e.g. "ollama[1297]: "); the name is a program name, never a bracket.
_JOURNALD_SHORT = re.compile(r"^[A-Za-z_][\w.@+-]{0,63}\[\d{1,10}\]: ")
_COMPOSE = re.compile(r"^[A-Za-z0-9][\w.-]*-\d+ +\| ?")
_ROUTER = re.compile(r"^\[ *\d{1,5}\] ")
# common/log.cpp prints the level letter with or without the timestamp (--log-prefix alone)
_LLAMA = re.compile(r"^(?:\d+\.\d\d\.\d\d\d\.\d\d\d )?([IWEDN]) ")


def clean(raw: bytes) -> tuple[str, str | None]:
    """Decode one raw line (NULs dropped, bytes that are not UTF-8 replaced: files.text) and
    strip every prefix; return ``(text, level letter or None)``."""
    text, level, _cut = clean_cut(raw)
    return text, level


def clean_cut(raw: bytes) -> tuple[str, str | None, bool]:
    """:func:`clean`, and whether the line was cut (longer than ``MAX_LINE_CHARS``)."""
    end: str | None = None
    if len(raw) > MAX_LINE_CHARS * 4:
        # decoded apart: the bytes between them are dropped whatever characters they were
        end = _plain(decode_line(raw[-MAX_LINE_CHARS * 2:]).rstrip("\r\n"))
        raw = raw[: MAX_LINE_CHARS * 2]
    text = _plain(decode_line(raw).rstrip("\r\n"))
    for _ in range(3):
        m = (_JOURNALD.match(text) or _ISO.match(text) or _COMPOSE.match(text)
             or _JOURNALD_SHORT.match(text))
        if m is None:
            break
        text = text[m.end():]
    m = _ROUTER.match(text)
    if m is not None:
        text = text[m.end():]
    level: str | None = None
    m = _LLAMA.match(text)
    if m is not None:
        level = m.group(1)
        text = text[m.end():]
    cut = end is not None or len(text) > MAX_LINE_CHARS
    if cut:
        half = MAX_LINE_CHARS // 2
        text = text[:half] + CUT + (text if end is None else end)[-half:]
    return text, level, cut


def _plain(text: str) -> str:
    """Without ANSI colour codes and carriage returns."""
    if "\x1b" in text:
        text = _ANSI.sub("", text)
    return text.replace("\r", "")
