"""Each screen's `render(rt)` on its own, with a runtime built over a store fixture.

The pages are modules with a function that takes its runtime explicitly, so a test can hand a
page any runtime it likes (here: the collector off, or a recording collector at the network
boundary) and look at what that one page draws, without app.py's router or sidebar around it.
tests/test_pages.py covers the same screens through the router, as a visitor sees them.
"""

from __future__ import annotations

import ast
import threading
import time
from pathlib import Path

import pytest
import store_fixtures
from streamlit.testing.v1 import AppTest
from test_pages import PAGES, ROOT, TIMEOUT_S, RecordingCollector, _clear_streamlit_caches, assert_clean, texts  # noqa: F401 (autouse fixture)

from components import loaders
from runhealth.analysis import stats

GATE = threading.Event()  # holds GatedCollector.sample_now until the test opens it


class GatedCollector(RecordingCollector):
    """A recording collector whose sampling fan-out takes as long as the test wants."""

    def sample_now(self, n, finish_reason=None, full_text=False):
        GATE.wait(timeout=20)
        return super().sample_now(n, finish_reason, full_text)


def _render_script(page: str, config: str, recording: bool) -> None:
    import importlib

    import streamlit as st
    from test_page_render import GatedCollector

    from components import context

    # One runtime per test (st.cache_resource): a rerun after a click sees the same collector.
    @st.cache_resource
    def runtime(path: str, recording: bool) -> context.Runtime:
        from pathlib import Path

        rt = context.build_runtime_for(Path(path))
        if recording:
            rt.collector = GatedCollector(rt.store)
        return rt

    importlib.import_module(f"pages.{page}").render(runtime(config, recording))


def render_page(page: str, config: Path, monkeypatch, recording: bool = False) -> AppTest:
    """`pages/<page>.py`'s render(rt) alone, over the store `config` names (collector off)."""
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = AppTest.from_function(_render_script, args=(page, str(config), recording), default_timeout=TIMEOUT_S)
    return at.run()


@pytest.fixture(scope="module")
def ceiling_18(tmp_path_factory) -> Path:
    store, config = store_fixtures.make_store(tmp_path_factory.mktemp("ceiling_18"), "ceiling_18")
    store.close()
    return config


@pytest.mark.parametrize("page", PAGES)
def test_each_page_renders_alone_from_the_runtime_it_is_given(page, ceiling_18, monkeypatch):
    at = render_page(page, ceiling_18, monkeypatch)
    assert_clean(at)
    shown = texts(at)
    assert "Numbers as of" in shown, page
    # No router, no shared frame: the sidebar holds only what this page puts there (downloads).
    assert store_fixtures.RUN_NAME not in " ".join(m.value for m in at.sidebar.markdown), page


def test_lengths_page_alone_shows_the_ceiling_and_the_whatif(ceiling_18, monkeypatch):
    at = render_page("lengths", ceiling_18, monkeypatch)
    assert_clean(at)
    shown = texts(at)
    assert "18.0%" in shown and "4,096" in shown and "extrapolation" in shown.lower()


def test_continuation_sampling_runs_as_a_background_job_with_progress(ceiling_18, monkeypatch):
    """The blocking fan-out (collector.sample_now) never runs inside a render: a click starts a
    job (components/jobs.py), the page says it is running, the result arrives on a later run."""
    GATE.clear()
    at = render_page("lengths", ceiling_18, monkeypatch, recording=True)
    assert_clean(at)
    try:
        at.button(key="lengths_continuation_button").click().run()  # returns while the fan-out still runs
        assert_clean(at)
        assert any(
            "Sampling 300 truncated completions" in i.value and "the page stays usable" in i.value for i in at.info
        ), [i.value for i in at.info]
        at.run()  # the next run (the fragment's 1 s tick, or any click) disables the button: one job at a time
        assert at.button(key="lengths_continuation_button").disabled
        assert any("Sampling 300 truncated completions" in i.value for i in at.info)
    finally:
        GATE.set()
    job = at.session_state["lengths_continuation_job"]
    for _ in range(200):
        if job["future"].done():
            break
        time.sleep(0.05)
    at.run()
    assert_clean(at)
    assert job["future"].result()["n"] == 1
    assert any("continuation requests" in b.label for b in at.get("download_button"))


def test_pages_take_their_runtime_explicitly():
    """No page reads a module-global runtime: every page module defines render(rt) and calls no
    Streamlit command at import time (importing it draws nothing)."""
    for page in PAGES:
        tree = ast.parse((ROOT / "pages" / f"{page}.py").read_text(encoding="utf-8"))
        render = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "render"]
        assert render and [a.arg for a in render[0].args.args] == ["rt"], page
        top_level_calls = [n for n in tree.body if isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)]
        assert not top_level_calls, page
        assert not any(
            isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "rt" for t in n.targets) for n in tree.body
        ), page


def test_whatif_cache_is_keyed_by_histogram_content_not_its_total():
    """Two histograms with the same number of completions but different lengths must not share
    a cached what-if answer (the key used to be the store path and `hist.total`)."""
    short = stats.LengthHist.from_rows([(1000, "stop", 0, 700), (4096, "length", 0, 300)])
    longer = stats.LengthHist.from_rows([(3000, "stop", 0, 500), (4096, "length", 0, 500)])
    assert short.total == longer.total
    assert stats.hist_digest(short) != stats.hist_digest(longer)
    assert stats.hist_digest(short) == stats.hist_digest(stats.LengthHist.from_rows(short.rows()))
    a = loaders.load_whatif(short, 4096, 8192, None, bootstrap=20)
    b = loaders.load_whatif(longer, 4096, 8192, None, bootstrap=20)
    assert a.current_truncated_fraction == pytest.approx(0.3)
    assert b.current_truncated_fraction == pytest.approx(0.5)


def test_router_lists_every_page_with_its_title_and_url(ceiling_18, monkeypatch):
    """st.navigation gets one st.Page per module, titled and at the URL the old pages/ had, and
    `streamlit run app.py` (AppTest of the file itself) opens the Overview."""
    import app

    assert [m.PREFIX for m in app.SCREENS] == [*PAGES, "compare"]
    assert [(m.TITLE, m.URL_PATH) for m in app.SCREENS] == [
        ("Overview", "Overview"),
        ("Output lengths", "Output_lengths"),
        ("GPUs", "GPUs"),
        ("Samples", "Samples"),
        ("Nodes", "Nodes"),
        ("Compare runs", "Compare"),
    ]
    monkeypatch.setenv("RUNHEALTH_CONFIG", str(ceiling_18))
    monkeypatch.setenv("RUNHEALTH_COLLECTOR", "off")
    at = AppTest.from_file(str(ROOT / "app.py"), default_timeout=TIMEOUT_S).run()
    assert_clean(at)
    assert "Numbers as of" in texts(at) and store_fixtures.RUN_NAME in texts(at)


def test_the_nodes_csv_has_the_columns_and_rows_of_the_node_table_on_screen(ceiling_18, monkeypatch):
    """The Nodes page's "Download CSV" is the table shown: it dropped "tok/s (1 min)" and "last new"."""
    import io

    import pandas as pd
    from streamlit.runtime.memory_media_file_storage import MemoryMediaFileStorage
    from streamlit.testing.v1 import app_test

    kept: list[MemoryMediaFileStorage] = []

    class KeptStorage(MemoryMediaFileStorage):  # the bytes behind AppTest's download buttons
        def __init__(self, *args) -> None:
            super().__init__(*args)
            kept.append(self)

    monkeypatch.setattr(app_test, "MemoryMediaFileStorage", KeptStorage)
    at = render_page("nodes", ceiling_18, monkeypatch)
    assert_clean(at)
    url = next(b.proto.url for b in at.get("download_button") if b.proto.label == "Download CSV")
    csv = pd.read_csv(io.BytesIO(kept[-1].get_file(url.rsplit("/", 1)[1]).content), dtype=str, keep_default_na=False)
    shown = at.dataframe[0].value
    assert {"tok/s (1 min)", "last new"} <= set(shown.columns)
    assert list(csv.columns) == list(shown.columns)
    steady = ["node", "status", "GPUs", "shards", "disk free", "SSH RTT"]  # ages tick between the two reads
    assert csv[steady].values.tolist() == shown[steady].astype(str).values.tolist()
