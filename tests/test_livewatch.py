"""The process's live watcher (components/livewatch.py, #42 item 2), driven tick by tick.

A real store with real publications (runhealth/screens/published.py's row, a payload row);
the rerun request, Streamlit's internals, is the one stand-in: a list of what was asked. The
browser side (a page left open redraws within a second, idle tabs cost nothing) is
tests/test_browser_live.py's."""

from __future__ import annotations

import time

import pytest
import store_fixtures
import streamlit as st

from components import livewatch
from runhealth.payloads import pagedata
from runhealth.screens import published


@pytest.fixture
def store(tmp_path):
    store, _ = store_fixtures.make_store(tmp_path, "empty")
    yield store
    store.close()


class Asked(list):
    """The rerun requests made: (session, fragment), one per fragment, in the order asked, and
    `batches`, each request's (one session's fragments, asked together); `gone` sessions answer
    that they are gone."""

    def __init__(self) -> None:
        super().__init__()
        self.gone: set[str] = set()
        self.batches: list[list[tuple[str, str]]] = []

    def __call__(self, heres: tuple[livewatch.Here, ...]) -> bool:
        batch = [(at.session_id, at.fragment_id) for at in heres]
        assert len({sid for sid, _ in batch}) == 1, batch  # one session's
        self.batches.append(batch)
        self.extend(batch)
        return heres[0].session_id not in self.gone


def here(
    session_id: str, fragment_id: str, alone: bool = False, page: str = "abc123", query: str = "kiosk=1"
) -> livewatch.Here:
    return livewatch.Here(session_id, fragment_id, query, page, fragment_run=alone)


def opened(w: livewatch.Watcher, store, session_id: str, fragment_id: str, follows: livewatch.Follows) -> None:
    """A tab's page run, then its browser's first timer tick (a rerun of the live part alone):
    from then on the watcher pushes it."""
    w.register(here(session_id, fragment_id), store, follows)
    redrawn(w, store, session_id, fragment_id, follows)


def redrawn(w: livewatch.Watcher, store, session_id: str, fragment_id: str, follows: livewatch.Follows) -> None:
    """The live part ran again alone (a push, or the browser's tick) and drew the stamps of now."""
    w.register(here(session_id, fragment_id, alone=True), store, follows)


def publish(store, name: str, ts: float) -> None:
    pagedata.put(store, {name: {"x": ts}}, ts)


def test_a_publication_asks_each_live_part_behind_it_once_and_nothing_else_does(store):
    asked = Asked()
    w = livewatch.Watcher(request=asked)
    opened(w, store, "s1", "f1", livewatch.OVERVIEW)
    opened(w, store, "s2", "f2", livewatch.OVERVIEW)
    for _ in range(5):  # nothing published: nothing asked, however often it looks
        w.tick()
    assert asked == []
    publish(store, published.NAME, 100.0)
    w.tick()
    assert sorted(asked) == [("s1", "f1"), ("s2", "f2")]
    w.tick(time.monotonic() + 10)  # asked, not yet redrawn: not asked again for the same publication
    assert len(asked) == 2
    opened(w, store, "s1", "f1", livewatch.OVERVIEW)  # s1 redraws and has drawn it
    publish(store, published.NAME, 101.0)
    w.tick(time.monotonic() + 20)
    assert sorted(asked[2:]) == [("s1", "f1"), ("s2", "f2")]


def test_a_page_is_not_redrawn_for_a_publication_it_does_not_read(store):
    asked = Asked()
    w = livewatch.Watcher(request=asked)
    opened(w, store, "overview", "f1", livewatch.OVERVIEW)
    opened(w, store, "lengths", "f2", livewatch.PAYLOADS)
    publish(store, "run_lengths", 100.0)
    w.tick()
    assert asked == [("lengths", "f2")]
    publish(store, published.NAME, 101.0)
    w.tick(time.monotonic() + 10)
    assert asked[1:] == [("overview", "f1")]


def test_an_unchanged_store_file_costs_a_stat_not_a_read(store, monkeypatch):
    w = livewatch.Watcher(request=Asked())
    opened(w, store, "s1", "f1", livewatch.ANY)
    reads = []
    real = pagedata.computed_at
    monkeypatch.setattr(pagedata, "computed_at", lambda s, n: reads.append(n) or real(s, n))
    for _ in range(20):
        w.tick()
    assert reads == []
    publish(store, published.NAME, 100.0)
    w.tick()
    assert sorted(reads) == sorted(livewatch.ANY)  # one indexed row per publication followed


def test_a_session_pushed_again_waits_min_gap(store):
    asked = Asked()
    w = livewatch.Watcher(request=asked)
    opened(w, store, "s1", "f1", livewatch.OVERVIEW)
    t0 = time.monotonic()
    publish(store, published.NAME, 100.0)
    w.tick(t0)
    opened(w, store, "s1", "f1", livewatch.OVERVIEW)  # redrawn at once
    publish(store, published.NAME, 101.0)
    w.tick(t0 + livewatch.MIN_GAP_S / 2)  # a storm of publications: one redraw a gap
    assert len(asked) == 1
    w.tick(t0 + livewatch.MIN_GAP_S)
    assert len(asked) == 2


def test_a_closed_session_is_forgotten(store):
    asked = Asked()
    asked.gone.add("s1")
    w = livewatch.Watcher(request=asked)
    opened(w, store, "s1", "f1", livewatch.OVERVIEW)
    publish(store, published.NAME, 100.0)
    w.tick()
    publish(store, published.NAME, 101.0)
    w.tick(time.monotonic() + 10)
    assert asked == [("s1", "f1")]


def test_the_sidebars_last_collection_is_pushed_with_the_live_part(store):
    """One session, two fragments: its page's live part and the sidebar's "Last collection" line
    (it named the poll before the one the page showed for up to its 5 s tick). Each is pushed once
    per publication, in one request, the sidebar's first (a read of one stamp: queued behind the
    live part it waited for that part's whole run, 1.5-2.8 s at load 9; asked at a later look,
    once the live part's run was over, it came 3.5 s after the publication in a loaded CI run)."""
    asked = Asked()
    w = livewatch.Watcher(request=asked)
    w.register(here("s1", "live-f"), store, livewatch.OVERVIEW)  # the page's first run draws both
    w.register(here("s1", "side-f"), store, livewatch.ANY, livewatch.SIDEBAR)
    redrawn(w, store, "s1", "live-f", livewatch.OVERVIEW)  # the live part's tick
    t0 = time.monotonic()
    publish(store, published.NAME, 100.0)
    w.tick(t0)
    assert asked == [("s1", "side-f"), ("s1", "live-f")]
    redrawn(w, store, "s1", "live-f", livewatch.OVERVIEW)
    w.register(here("s1", "side-f", alone=True), store, livewatch.ANY, livewatch.SIDEBAR)
    publish(store, published.NAME, 101.0)
    w.tick(t0 + 1)
    assert asked[2:] == [("s1", "side-f"), ("s1", "live-f")]
    w.tick(t0 + 2)
    assert len(asked) == 4
    assert asked.batches == [[("s1", "side-f"), ("s1", "live-f")]] * 2


def test_a_tab_is_pushed_once_any_of_its_fragments_ticked_on_the_page_it_shows(store):
    """The sidebar's "Last collection" line ticks every 5 s, the live part every interval (20 s
    here, 10 s by default): the sidebar's first tick is the browser's own request as much as the
    live part's, so from it the tab's live part is pushed too. A full run of another page or
    query (the kiosk's rotation) waits for a tick there again; so does coming back."""
    asked = Asked()
    w = livewatch.Watcher(request=asked)
    t0 = time.monotonic()

    def full_run(page: str) -> None:
        w.register(here("s1", "live-f", page=page), store, livewatch.OVERVIEW)
        w.register(here("s1", "side-f", page=page), store, livewatch.ANY, livewatch.SIDEBAR)

    def sidebar_tick(page: str) -> None:
        w.register(here("s1", "side-f", alone=True, page=page), store, livewatch.ANY, livewatch.SIDEBAR)

    full_run("overview")
    publish(store, published.NAME, 100.0)
    w.tick(t0)
    assert asked == []  # nothing before the browser's first tick
    sidebar_tick("overview")
    publish(store, published.NAME, 101.0)
    w.tick(t0 + 1)
    assert asked == [("s1", "side-f"), ("s1", "live-f")]
    full_run("gpus")  # another page: its fragments have the same ids (their function and place)
    publish(store, published.NAME, 102.0)
    w.tick(t0 + 2)
    assert len(asked) == 2
    w.register(here("s1", "side-f", alone=True, page="overview"), store, livewatch.ANY, livewatch.SIDEBAR)
    w.tick(t0 + 3)  # a stale tick of the page left readies nothing (the fragment was not drawn there last)
    assert len(asked) == 2
    full_run("overview")  # back: the page it was ready on before waits for a tick again
    publish(store, published.NAME, 103.0)
    w.tick(t0 + 4)
    assert len(asked) == 2
    sidebar_tick("overview")  # it drew the publication itself: only the live part is behind
    w.tick(t0 + 5)
    assert asked[2:] == [("s1", "live-f")]
    asked.gone.add("s1")  # the tab closed: its fragments and its ready page are forgotten
    publish(store, published.NAME, 104.0)
    w.tick(t0 + 6)
    assert not w._viewers and not w._ready_views


def test_a_tab_closed_before_its_first_push_is_forgotten(store):
    """Never pushed, never found gone by a request: forgotten once it has not redrawn for
    FORGET_AFTER_S (an open tab redraws at least every interval, at most an hour)."""
    asked = Asked()
    w = livewatch.Watcher(request=asked)
    w.register(here("closed", "f1"), store, livewatch.OVERVIEW)  # its first run, then the tab closed
    opened(w, store, "open", "f1", livewatch.OVERVIEW)
    t0 = time.monotonic()
    w.tick(t0 + livewatch.FORGET_AFTER_S - 1)
    assert {sid for sid, _ in w._viewers} == {"closed", "open"}
    redrawn(w, store, "open", "f1", livewatch.OVERVIEW)  # the open one ticks on
    w._viewers[("open", livewatch.LIVE)].drawn_at = (
        t0 + livewatch.FORGET_AFTER_S
    )  # ... as late as the watcher's clock here
    w.tick(t0 + livewatch.FORGET_AFTER_S + 1)
    assert {sid for sid, _ in w._viewers} == {"open"} and asked == []


def test_a_damaged_store_never_ends_the_watcher(store):
    """The page says what is wrong (page.store_failure, tests/test_pages.py); the watcher only
    goes on looking, and asks again once the store reads."""
    asked = Asked()
    w = livewatch.Watcher(request=asked)
    opened(w, store, "s1", "f1", livewatch.OVERVIEW)
    store.cursor("DROP TABLE page_data")
    w.tick()
    path = store.path
    store.close()
    raw = bytearray(path.read_bytes())
    for page_start in range(4096, len(raw), 4096):
        raw[page_start : page_start + 400] = b"\xff" * 400
    path.write_bytes(bytes(raw))
    w.tick(time.monotonic() + 10)
    assert asked == []


def test_internals_that_fail_leave_pages_on_their_interval_tick(store, monkeypatch):
    monkeypatch.setattr(livewatch, "_broken", [])

    def refused(heres: tuple[livewatch.Here, ...]) -> bool:
        raise AttributeError("AppSession has no attribute _client_state")

    w = livewatch.Watcher(request=refused)
    opened(w, store, "s1", "f1", livewatch.OVERVIEW)
    publish(store, published.NAME, 100.0)
    w.tick()
    assert livewatch._broken and not livewatch.supported() and livewatch.watcher() is None
    assert w._stop.is_set()


def test_cached_reads_are_keyed_on_the_publications_the_watcher_saw(store, monkeypatch):
    """A read after a publication computes afresh (components/loaders.py, precomputed.py): the
    key moves with the watcher's stamps; without a watcher (AppTest) it is the path alone."""
    monkeypatch.setattr(livewatch, "_watcher", None)
    assert livewatch.store_key(store) == (str(store.path), None)
    w = livewatch.Watcher(request=Asked())
    monkeypatch.setattr(livewatch, "_watcher", w)
    opened(w, store, "s1", "f1", livewatch.OVERVIEW)
    before = livewatch.store_key(store)
    publish(store, published.NAME, 100.0)
    assert livewatch.store_key(store) == before  # no read in a key: the watcher's next look moves it
    w.tick()
    assert livewatch.store_key(store) == (str(store.path), (100.0, None))


def test_apptest_runs_pages_without_the_watcher():
    """AppTest's runtime is a stand-in with no sessions to rerun: the watcher is not started there,
    so the pages' read-budget tests count only the page's own reads."""
    from streamlit.testing.v1 import AppTest

    def app() -> None:
        import streamlit as st

        from components import livewatch

        st.write(f"supported={livewatch.supported()}")

    at = AppTest.from_function(app).run()
    assert [m.value for m in at.markdown] == ["supported=False"]


def test_the_request_is_the_browser_timers_for_the_run_that_registered(monkeypatch):
    """The rerun asked carries the URL query and page of the run that drew the live part, not the
    session's stored client state: that one is empty until the session's first run ends, and a tab
    whose first (slow) run saw a publication was rerun on the app's first page with no query (seven
    kiosk tabs opened at once: one never showed its heading). No widget states: the session keeps
    its own values."""
    from streamlit.runtime import Runtime

    asked, loop = [], []

    class Session:
        _scriptrunner = None  # a session's runner ends after each run
        _browser_queue: list = []  # the messages not yet handed to its browser

        class _state:  # noqa: N801 - AppSessionState's member
            name = "APP_NOT_RUNNING"

        def has_fragment(self, fragment_id):
            return fragment_id in ("f1", "f2")

        class _event_loop:  # noqa: N801 - stands in for the session's asyncio loop: run by the test
            @staticmethod
            def call_soon_threadsafe(fn):
                loop.append(fn)

        def request_rerun(self, cs):
            asked.append(cs)

    class Stand:
        def get_app_session(self, session_id):
            return Session() if session_id == "s1" else None

    def run_loop():
        while loop:
            loop.pop(0)()

    monkeypatch.setattr(Runtime, "instance", classmethod(lambda cls: Stand()))
    monkeypatch.setattr(livewatch, "_skipped", set())
    assert livewatch._request((here("s1", "f1"),)) is True
    run_loop()
    assert livewatch._request((here("gone", "f1"),)) is False
    assert livewatch._request((here("s1", "f-of-a-page-left"),)) is False
    Session._state.name = "APP_IS_RUNNING"  # a tab still drawing its page: not now
    assert livewatch._request((here("s1", "f1"),)) is None
    Session._state.name = "APP_NOT_RUNNING"
    Session._scriptrunner = object()  # a run asked by the browser (a first run, a page left), not yet started
    assert livewatch._request((here("s1", "f1"),)) is None
    Session._scriptrunner = None
    Session._browser_queue = ["the last run's end"]  # its run over, not yet handed to the browser
    assert livewatch._request((here("s1", "f1"),)) is None
    Session._browser_queue = []
    # Idle at the watcher's look, but the browser asks for a run before the session's loop gets
    # to the rerun: it is dropped there (not folded into that run, on the page drawn before), and
    # the watcher asks again at a later look.
    Session._scriptrunner = None
    assert livewatch._request((here("s1", "f1"),)) is True
    Session._scriptrunner = object()
    run_loop()
    assert livewatch._skipped == {("s1", "f1")}
    (cs,) = asked
    assert (cs.query_string, cs.page_script_hash, cs.fragment_id, cs.is_auto_rerun) == ("kiosk=1", "abc123", "f1", True)
    assert not cs.HasField("widget_states") and not cs.HasField("context_info")
    # A session's fragments asked together: in one go on its loop, in order (the first starts the
    # run, Streamlit queues the next in it); one of them gone (a page left): none is asked.
    Session._scriptrunner = None
    assert livewatch._request((here("s1", "f1"), here("s1", "f2"))) is True
    run_loop()
    assert [cs.fragment_id for cs in asked[1:]] == ["f1", "f2"]
    assert livewatch._request((here("s1", "f1"), here("s1", "f-of-a-page-left"))) is False


def test_a_tab_is_pushed_only_once_its_browser_has_rerun_its_live_part_itself(store):
    """A push that reaches a tab whose browser has not drawn its first run left the tab blank for
    good (seven kiosk tabs loading at once on two cores). A tab's first rerun of the live part
    alone is asked by its browser (nothing is pushed before it): from then on it is pushed; a new
    page or query waits for its own first tick again."""
    asked = Asked()
    w = livewatch.Watcher(request=asked)
    t0 = time.monotonic()
    w.register(here("s1", "f1"), store, livewatch.OVERVIEW)  # the page's first run
    publish(store, published.NAME, 100.0)
    w.tick(t0)
    w.register(here("s1", "f1"), store, livewatch.OVERVIEW)  # a full run again (a widget above it)
    publish(store, published.NAME, 101.0)
    w.tick(t0 + 1)
    assert asked == []
    redrawn(w, store, "s1", "f1", livewatch.OVERVIEW)  # its browser's first tick
    publish(store, published.NAME, 102.0)
    w.tick(t0 + 2)
    assert asked == [("s1", "f1")]
    # Another page (the kiosk's rotation), its live part the same fragment id (a fragment's id is
    # its function and place), then another part of that page (its query): each waits for its tick.
    for k, (page, query) in enumerate((("lengths", "kiosk=1"), ("lengths", "kiosk=1&part=2"))):
        w.register(here("s1", "f1", page=page, query=query), store, livewatch.OVERVIEW)
        publish(store, published.NAME, 103.0 + 2 * k)
        w.tick(t0 + 3 + 2 * k)
        assert len(asked) == 1 + k
        w.register(here("s1", "f1", alone=True, page=page, query=query), store, livewatch.OVERVIEW)
        w.register(here("s1", "f1", page=page, query=query), store, livewatch.OVERVIEW)  # a full run: still ready
        publish(store, published.NAME, 104.0 + 2 * k)
        w.tick(t0 + 4 + 2 * k)
        assert len(asked) == 2 + k


def test_a_tab_is_pushed_once_per_publication_and_never_without_one(store):
    """The rate: over ten intervals with one publication each, a tab is asked ten reruns (its
    browser's timer adds one an interval, as before the watcher); with none, not one, however
    often the watcher looks."""
    asked = Asked()
    w = livewatch.Watcher(request=asked)
    opened(w, store, "s1", "f1", livewatch.OVERVIEW)
    t0 = time.monotonic()
    for i in range(200):  # 20 s of looks, nothing published
        w.tick(t0 + i * livewatch.WATCH_S)
    assert asked == []
    for k in range(10):
        publish(store, published.NAME, 100.0 + k)
        for i in range(50):
            w.tick(t0 + 30 + 5 * k + i * livewatch.WATCH_S)
            if len(asked) > k and i % 7 == 3:  # the pushed rerun draws it a little later
                redrawn(w, store, "s1", "f1", livewatch.OVERVIEW)
    assert len(asked) == 10 and w.requests == 10


def test_a_session_busy_running_is_asked_at_a_later_look(store):
    answers = [None, None, True]
    asked = []

    def request(heres: tuple[livewatch.Here, ...]) -> bool | None:
        asked.extend(at.session_id for at in heres)
        return answers[len(asked) - 1]

    w = livewatch.Watcher(request=request)
    opened(w, store, "s1", "f1", livewatch.OVERVIEW)
    publish(store, published.NAME, 100.0)
    t0 = time.monotonic()
    for i in range(5):
        w.tick(t0 + i * 0.1)
    assert asked == ["s1", "s1", "s1"] and w.requests == 1


def test_a_rerun_dropped_by_a_busy_session_is_asked_again(store, monkeypatch):
    """The session's loop dropped the rerun (a run had been asked by then, components/livewatch.py
    `_request`): the same publication is asked again at a later look, MIN_GAP_S on."""
    monkeypatch.setattr(livewatch, "_skipped", set())
    asked = Asked()
    w = livewatch.Watcher(request=asked)
    opened(w, store, "s1", "f1", livewatch.OVERVIEW)
    publish(store, published.NAME, 100.0)
    t0 = time.monotonic()
    w.tick(t0)
    w.tick(t0 + 1)
    assert asked == [("s1", "f1")]  # asked once for it, not yet redrawn: not again
    livewatch._skipped.add(("s1", "f1"))
    w.tick(t0 + 1.1)
    assert asked == [("s1", "f1")] * 2 and livewatch._skipped == set()


def test_each_loader_is_keyed_on_the_publications_it_reads_only(store, monkeypatch):
    """A pushed redraw reads the publication it was pushed for (the "Numbers as of" line: keyed on
    every stamp; the Output lengths and GPU loaders on the page payloads'); a loader that reads
    no publication keeps its copy for its ttl, and an Overview publication leaves the payload
    loaders' copies alone: seven tabs do not all recompute every read on every round of polls."""
    from components import loaders

    w = livewatch.Watcher(request=Asked())
    monkeypatch.setattr(livewatch, "_watcher", w)
    opened(w, store, "s1", "f1", livewatch.ANY)
    loaders.clear_all()
    assert loaders.load_last_collection(store) is None  # nothing polled yet
    nodes = loaders.load_nodes(store)
    payloads = livewatch.keyed_on(livewatch.PAYLOADS)(store)
    now = time.time()
    store_fixtures.write_reply(store, "node-1", store_fixtures.poll_reply(now, [], {}), now, rtt_ms=5.0)
    assert loaders.load_last_collection(store) is None  # within its ttl, no publication seen: cached
    publish(store, published.NAME, now)
    w.tick()
    assert loaders.load_last_collection(store) == pytest.approx(now)  # the publication's poll
    assert loaders.load_nodes(store) == nodes != store.nodes()  # path + ttl: its copy (a read now differs)
    assert livewatch.keyed_on(livewatch.PAYLOADS)(store) == payloads  # the Overview's: not the payloads' key
    publish(store, "run_lengths", now + 1)
    w.tick()
    assert livewatch.keyed_on(livewatch.PAYLOADS)(store) != payloads


def test_compares_second_run_is_pushed_until_forgotten(tmp_path, store):
    """Compare's live part shows two runs: each live one's store under its own role, both pushed
    to the one fragment; a role forgotten (the pair now has one live run) is pushed no more."""
    other, _ = store_fixtures.make_store(tmp_path / "b", "empty")
    try:
        asked = Asked()
        w = livewatch.Watcher(request=asked)
        for alone in (False, True):  # the page's run, then its browser's tick
            w.register(here("s1", "cmp", alone=alone), store, livewatch.OVERVIEW)
            w.register(here("s1", "cmp", alone=alone), other, livewatch.OVERVIEW, livewatch.SECOND)
        publish(other, published.NAME, 100.0)
        w.tick()
        assert asked == [("s1", "cmp")]  # the second run's round
        w.forget("s1", livewatch.SECOND)
        publish(other, published.NAME, 101.0)
        w.tick(time.monotonic() + 10)
        assert asked == [("s1", "cmp")]  # no longer drawn: no push
        publish(store, published.NAME, 102.0)
        w.tick(time.monotonic() + 20)
        assert asked == [("s1", "cmp")] * 2  # the first run's still is
    finally:
        other.close()


def test_a_full_run_of_another_page_forgets_what_the_page_before_drew(tmp_path, store):
    """A tab leaves Compare (two live runs: its second under SECOND) for a page that draws one run,
    or none: the second run's rounds push it no more. Pushed, they asked the tab's fragment to rerun
    on Compare's page and query while it showed another (fragments share ids across pages)."""
    other, _ = store_fixtures.make_store(tmp_path / "b", "empty")
    try:
        asked = Asked()
        w = livewatch.Watcher(request=asked)
        for alone in (False, True):  # Compare's run, then its browser's tick
            w.register(here("s1", "live-f", alone=alone, page="compare"), store, livewatch.OVERVIEW)
            w.register(here("s1", "live-f", alone=alone, page="compare"), other, livewatch.OVERVIEW, livewatch.SECOND)
        publish(other, published.NAME, 100.0)
        w.tick()
        assert asked == [("s1", "live-f")]
        w.register(here("s1", "side-f", page="samples"), store, livewatch.ANY, livewatch.SIDEBAR)  # Samples' run
        w.register(here("s1", "side-f", alone=True, page="samples"), store, livewatch.ANY, livewatch.SIDEBAR)
        publish(other, published.NAME, 101.0)
        w.tick(time.monotonic() + 10)
        assert asked == [("s1", "live-f")]  # the run Samples does not show: no push
        assert set(w._viewers) == {("s1", livewatch.SIDEBAR)}
    finally:
        other.close()


def test_compares_run_numbers_are_read_again_after_a_round(store, monkeypatch):
    """Compare is pushed after a live run's Overview publication: its run numbers (the raw
    counts, cached 5 s) are keyed on that stamp, so the pushed redraw shows the round."""
    from components import compare_view

    w = livewatch.Watcher(request=Asked())
    monkeypatch.setattr(livewatch, "_watcher", w)
    opened(w, store, "s1", "cmp", livewatch.OVERVIEW)
    st.cache_data.clear()
    assert compare_view.load_run_numbers(store, "t", 4096, None, False).as_of is None  # nothing polled
    now = time.time()
    store_fixtures.write_reply(store, "node-1", store_fixtures.poll_reply(now, [], {}), now, rtt_ms=5.0)
    assert compare_view.load_run_numbers(store, "t", 4096, None, False).as_of is None  # no round published yet
    publish(store, published.NAME, now)
    w.tick()
    assert compare_view.load_run_numbers(store, "t", 4096, None, False).as_of == pytest.approx(now)


def test_compares_two_runs_and_the_sidebar_are_one_request_each_fragment_once(tmp_path, store):
    """Both runs Compare shows published, and the sidebar's line is behind too: one request for the
    session, the sidebar's line first, then its live part once (the two runs are one fragment)."""
    other, _ = store_fixtures.make_store(tmp_path / "b", "empty")
    try:
        asked = Asked()
        w = livewatch.Watcher(request=asked)
        for alone in (False, True):  # Compare's run, then its browser's ticks
            w.register(here("s1", "side-f", alone=alone), store, livewatch.ANY, livewatch.SIDEBAR)
            w.register(here("s1", "live-f", alone=alone), other, livewatch.OVERVIEW, livewatch.SECOND)
            w.register(here("s1", "live-f", alone=alone), store, livewatch.OVERVIEW)
        publish(store, published.NAME, 100.0)
        publish(other, published.NAME, 100.0)
        w.tick()
        assert asked.batches == [[("s1", "side-f"), ("s1", "live-f")]] and w.requests == 2
    finally:
        other.close()
