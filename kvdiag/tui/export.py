"""``kvdiag tui --export-svg``: draw one screen headlessly once loading finished; save SVG."""

from __future__ import annotations

import asyncio

from kvdiag.errors import InputError
from kvdiag.files.outputs import Output, plan_output, write_output
from kvdiag.tui.app import KvdiagApp
from kvdiag.tui.document import ErrorDoc
from kvdiag.tui.loading import NO_SYMBOLS, Symbols

LOAD_TIMEOUT_S = 600.0


async def wait_loaded(app: KvdiagApp, timeout: float = LOAD_TIMEOUT_S) -> None:
    """Wait until every document reached its last stage (or failed)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while any(d.stage != "ready" for d in app.docs):
        if loop.time() > deadline:
            raise InputError(f"loading did not finish within {timeout:.0f} s")
        await asyncio.sleep(0.05)


def export_svg(paths: list[str], out: str | Output, *, screen: str = "overview",
               size: tuple[int, int] = (160, 48), step: int | None = None,
               symbols: Symbols = NO_SYMBOLS) -> str:
    """Write the SVG of ``screen`` to ``out`` as every output is written
    (kvdiag.files.outputs; a path is replaced if it exists, the command checks ``--force``
    first); returns the SVG text."""
    target = out if isinstance(out, Output) else plan_output(out, force=True)
    app = KvdiagApp(paths, symbols=symbols)

    async def pilot_script(pilot: object) -> None:
        await wait_loaded(app)
        if step is not None:
            app.step = step
        await app.switch_mode(screen)
        await asyncio.sleep(0.1)
        await app.workers.wait_for_complete()
        screen_obj = app.screen
        sync = getattr(screen_obj, "sync", None)
        if sync is not None:
            sync()
        await asyncio.sleep(0.2)
        app.exit(None)

    svg_holder: dict[str, str] = {}

    async def run() -> None:
        async with app.run_test(size=size) as pilot:
            await pilot_script(pilot)
            await pilot.pause()
            svg_holder["svg"] = app.export_screenshot(title=f"kvdiag tui — {screen}")

    asyncio.run(run())
    errors = [d for d in app.docs if isinstance(d, ErrorDoc)]
    svg = svg_holder["svg"]
    write_output(target, svg.encode("utf-8"))
    if errors and len(errors) == len(app.docs):
        raise InputError("; ".join(d.message for d in errors))
    return svg
