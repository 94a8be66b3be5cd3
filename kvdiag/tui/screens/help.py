"""``?``: the keys of the screen it was opened from, and the ones that work everywhere."""

from __future__ import annotations

from typing import ClassVar

from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Markdown

GLOBAL = """\
| key | everywhere |
|---|---|
| `1`…`8` | Overview, Timeline, Fits, Pages, Backtrace, Telemetry, Findings, Perf |
| `o` / `O` | next / previous file given on the command line |
| `backspace` | back to where the last jump came from |
| `ctrl+p` | command palette (screens, files, back, help) |
| `s` | with `--follow`: pause / resume the live screens (the marker says `● LIVE`, `⏸ PAUSED` or `■ ENDED`) |
| `?` | this help · `q` quit |
"""

SCREEN_KEYS = {
    "overview": "The capture's configuration (or the log's boot configuration), findings by "
                "severity, events by kind and the verdict line.",
    "timeline": """\
| key | Timeline |
|---|---|
| `f` | filter: `kind:read,upload layer:0-3 stream:1 slot:10 step:5-9` (a bare kind name works too; `slot` is the pool slot of uploads/evictions, or the server slot in a log) |
| `/` | incremental search in the raw lines; `n` / `N` next / previous match |
| `c` | clear filter and search |
| `enter` | open the event in its screen (fits → Fits, read/write/upload/mark → Pages, abort → Backtrace) |
| `↑↓ pgup pgdn home end`, mouse | move |
""",
    "fits": """\
| key | Fits |
|---|---|
| `↑↓`, mouse | choose a fits() decision; the pane below explains every failed condition |
| `t` | show the decision in the Timeline |
""",
    "pages": """\
| key | Pages |
|---|---|
| `←` `→` | previous / next step · `shift+←/→` ten steps |
| `space` | play / pause · `home` / `end` first / last step (`--follow`: `end` follows the newest step again; scrubbing away stops following) |
| `n` / `N` | next / previous step with a stale or foreign read |
| `↑` `↓` | cell cursor: layer up / down (or click a cell) |
| `[` `]` | cell cursor: page left / right |
| `tab` / `shift+tab` | cell cursor: next / previous stream panel |
| `c` | compare: this trace's selected stream next to the same stream of the other open trace (same schedule, steps aligned by number; `tab` picks the stream, `c` again ends it) |

Cells: `P` pool, `R` ring, `H` host, `·` not read yet; then the holder of the pool slot as
`stream:page v version`; `*` the key was marked dirty this step. The classes are the
judgement's (what each slot held, as `kvdiag check` judges it): `!` (red): foreign read
(another stream's, layer's or page's bytes); `~` (yellow): stale read (an older version); `?`:
not judged (the trace does not record what it takes; the cell says what); `^` (underlined): a
`mark` at this step put the page's rows outside every resident window, so its resident copy is
never refreshed; bold: read at this step. A layer the plan does not stream is labelled so.
""",
    "backtrace": """\
| key | Backtrace |
|---|---|
| `↑↓`, mouse | frames; the source around the selected frame shows when the file exists here |
| `c` / `C` | next / previous crash group (crashes with one fingerprint are grouped) |
| `t` | next thread (occurrence) of the group |
""",
    "telemetry": """\
| key | Telemetry |
|---|---|
| `←` `→` | move the step cursor (shared with Pages) · `home` / `end` |
""",
    "perf": """\
| key | Perf |
|---|---|
| `←` `→` | the request cursor: previous / next request of this file · `home` / `end` |
| `b` | the baseline: the next other open file with request timings |
| `p` | the model beside the measurement: `kvdiag perf --predict` for this file against the baseline (`kvdiag tui --profile` names the GPU) |

Decode tok/s against context depth for this file and the baseline (dots: requests, lines:
depth bins), then on the same depth axis the partition kv_stream_adapt recorded (resident
pages/layer, ring slots) against the requests' active pages, with repartitions and fallbacks
marked, and the deadline miss %. Below: the request under the cursor, its bin against the
baseline, the partition recorded there and the causes its evidence names (or "not explained
by what the log records"), as `kvdiag perf` reports them. With `p`, the runtime model's decode
tok/s for the same requests is drawn beside them, and below are listed the GPU profile, the
calibration on the baseline and every request the model disagrees with by more than 15 % with
what would have to change.
""",
    "findings": """\
| key | Findings |
|---|---|
| `↑↓`, mouse | choose a finding, then its evidence below |
| `enter` | jump to the evidence (Timeline / Fits / Pages / Backtrace); `backspace` returns |
| `tab` | move between the findings and the evidence list |
""",
}


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,question_mark,q", "close", "Close"),
    ]

    def __init__(self, mode: str) -> None:
        super().__init__()
        self.mode = mode

    def compose(self) -> ComposeResult:
        with VerticalScroll(id="help"):
            yield Markdown(f"# kvdiag viewer — help\n\n{SCREEN_KEYS.get(self.mode, '')}\n\n"
                           f"{GLOBAL}")

    def action_close(self) -> None:
        self.dismiss(None)
