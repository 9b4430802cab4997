"""runhealth's one entry script: builds the runtime and routes to the page asked for.

Run it with `streamlit run app.py` (no runhealth.toml: the built-in demo). Each screen is a
module in pages/ with a `render(rt)` function that takes the runtime explicitly; this script
registers them with `st.navigation`, whose sidebar names come from the `st.Page` titles, draws
what every screen shares (components.page.setup: config errors, access check, kiosk mode, the
sidebar) and runs the chosen one. Calling `st.navigation` switches Streamlit's pages/
auto-discovery off, so the modules in pages/ are only ever run through this router.
"""

from __future__ import annotations

import functools
from types import ModuleType

import streamlit as st

from components import context, page
from pages import gpus, lengths, nodes, overview, samples

# In sidebar order; url paths are those the auto-discovered pages had (bookmarks keep working).
SCREENS = (overview, lengths, gpus, samples, nodes)


def main(start: str = overview.PREFIX) -> None:
    """Register every screen, draw the shared frame and run the one in the URL.

    `start` is the screen shown at the root URL (the Overview; a test opens another screen
    through the same router by naming it).
    """
    rt = context.get_runtime()
    pages = {mod.PREFIX: st.Page(functools.partial(_show, mod, rt), title=mod.TITLE, icon=mod.ICON,
                                 url_path=mod.URL_PATH, default=mod.PREFIX == start) for mod in SCREENS}
    current = st.navigation(list(pages.values()))
    prefix = next((p for p, pg in pages.items() if pg.url_path == current.url_path), start)
    page.setup(rt, current.title, prefix, pages)  # stops here on a config or access error
    current.run()


def _show(screen: ModuleType, rt: context.Runtime) -> None:
    screen.render(context.ready(rt))  # setup() has stopped the run when the config did not load


if __name__ == "__main__":  # `streamlit run app.py` runs this file as __main__
    main()
