"""Open one screen of the dashboard under AppTest, through app.py's router, for the benchmarks.

The screens are `render(rt)` functions that app.py registers with `st.navigation`; AppTest can
only switch to file-based pages, so the router is asked to show the named screen first (as
tests/test_pages.py's `open_app` does).
"""

from __future__ import annotations

import sys
from pathlib import Path

from streamlit.testing.v1 import AppTest

ROOT = Path(__file__).resolve().parent.parent
SCREENS = ["overview", "lengths", "gpus", "samples", "nodes"]  # pages/<name>.py


def _script(start: str) -> None:
    import app

    app.main(start)


def open_page(name: str, timeout: float = 120) -> AppTest:
    """An AppTest of the app showing screen `name` (one of SCREENS); not yet run."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))  # `import app` from AppTest's temporary script
    return AppTest.from_function(_script, args=(name,), default_timeout=timeout)
