"""`streamlit run` for app.py with pages/ auto-discovery off from the very first session.

app.py routes with `st.navigation`, and once it has run, Streamlit ignores the pages/ folder.
But Streamlit decides "a pages/ folder exists, so classic multipage" when the server starts,
before app.py has run once: the first browser session after a start then resolves its URL
against the folder's file names, and a deep link such as /Output_lengths flashes "Page not
found" before the router shows the right page. `runhealth dashboard` starts Streamlit through
this file, which settles that decision first (the flag Streamlit's own `st.navigation` sets).
"""

from __future__ import annotations

from streamlit.runtime.pages_manager import PagesManager
from streamlit.web import cli


def main() -> None:
    """Streamlit's command line (`run app.py ...` in sys.argv), pages/ auto-discovery off."""
    PagesManager.uses_pages_directory = False
    cli.main(prog_name="streamlit")


if __name__ == "__main__":
    main()
