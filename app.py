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
import sqlite3
from types import ModuleType

import streamlit as st

from components import context, page
from components.format import md_escape
from pages import compare, gpus, lengths, nodes, overview, samples

# In sidebar order; url paths are those the auto-discovered pages had (bookmarks keep working).
SCREENS = (overview, lengths, gpus, samples, nodes, compare)


def main(start: str = overview.PREFIX) -> None:
    """Register every screen, draw the shared frame and run the one in the URL.

    `start` is the screen shown at the root URL (the Overview; a test opens another screen
    through the same router by naming it).
    """
    # The favicon first: with none set yet, st.navigation makes the page's Material icon the
    # favicon, which the browser fetches from fonts.gstatic.com (a public host: no internet on
    # many clusters). setup() sets the page's title later; the icon stays this emoji (a data URL).
    st.set_page_config(page_icon=page.FAVICON, layout="wide")
    rt = context.get_runtime()
    shown: dict[str, context.Runtime] = {"rt": rt}  # the picked run's view, set by setup() below
    pages = {
        mod.PREFIX: st.Page(
            functools.partial(_show, mod, shown),
            title=mod.TITLE,
            icon=mod.ICON,
            url_path=mod.URL_PATH,
            default=mod.PREFIX == start,
        )
        for mod in SCREENS
    }
    current = st.navigation(list(pages.values()))
    screen = next(mod for mod in SCREENS if pages[mod.PREFIX].url_path == current.url_path)
    try:
        # Stops here on a config or access error; returns the run this session picked in the sidebar.
        shown["rt"] = page.setup(
            rt,
            current.title,
            screen.PREFIX,
            pages,
            one_run=getattr(screen, "ONE_RUN", True),
            title_is_run=getattr(screen, "TITLE_IS_RUN", False),
        )
        current.run()
    except sqlite3.Error as exc:  # the store damaged (or its disk failing) since it was opened
        st.error(md_escape(page.store_failure(exc) or str(exc)))


def _show(screen: ModuleType, shown: dict[str, context.Runtime]) -> None:
    screen.render(context.ready(shown["rt"]))  # setup() has stopped the run when the config did not load


if __name__ == "__main__":  # `streamlit run app.py` runs this file as __main__
    main()
