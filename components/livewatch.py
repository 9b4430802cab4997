"""A page left open shows a new publication within a fraction of a second (#42 item 2).

Each page's live part (components/page.py `live`) is a fragment with a fixed tick of its own
(every collection interval, the browser's timer): alone, it shows new numbers half a tick late on
average. Here ONE watcher thread per dashboard process looks at the stores that open pages show,
every WATCH_S: first the store file's and its WAL's size and mtime (a stat, no SQL), and only when
they moved the stamps of the publications pages follow (one indexed row each:
runhealth/payloads/pagedata `computed_at`). When a stamp changed, it asks each session whose live
part drew an older one to rerun that fragment, as the browser's own timer would. A tab left open
therefore costs nothing between publications beyond its interval tick, and one rerun of its live
part per publication it reads, however many tabs are open and however fast the watcher looks (at
most one every MIN_GAP_S a session).

A tab is pushed only once its browser has itself asked for a rerun of one of its fragments on
the page and query it shows (the sidebar's "Last collection" line ticks every FRESHNESS_TICK_S, the
live part every interval; or a widget inside one): the proof that the browser holds the page and
runs its fragments. A push that reached a tab whose browser had not yet drawn its first run left
that tab blank for good (seven kiosk tabs opening at once on two cores; bench/README.md, #42 item
2). Until then, and again after every full run of another page or query (a page switch, the
kiosk's rotation and its parts), the tab has its fragments' own ticks alone, as before.

The stamps known to the watcher are also the cached reads' key (`store_key`): a read after a
publication computes afresh, so a rerun for it never shows a copy cached just before it.

Streamlit (1.67) has no public call that reruns a session's fragment from outside its script:
`_request` hands `AppSession.request_rerun` the run's own query and page with the fragment's id,
on the session's event loop, exactly the request the browser's timer sends. `supported()` checks
those internals are there; where they are not (an older or newer Streamlit, AppTest without a
server), or a request fails, pages keep their interval tick alone and nothing else changes.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import threading
import time
from typing import Any

from runhealth.payloads import pagedata
from runhealth.screens import published
from runhealth.store import Store

log = logging.getLogger(__name__)

WATCH_S = 0.1  # the watcher's look: a publication is asked for 0.05 s after it on average
MIN_GAP_S = 0.5  # a session's live part is pushed at most this often (a publication storm)
# A live part not redrawn for this long is forgotten: its tab is closed (an open one redraws at
# least every interval, at most 1 h). A tab closed before it was ever pushed is never asked, so
# never found gone by `_request`; without this its entry would stay for the process's life.
FORGET_AFTER_S = 2 * 3600.0
# Which publications a page's live part follows: the Overview (published after each round of
# polls: the Overview and Nodes), the other page payloads (computed after polls at most once an
# interval, all in one write that always holds run_lengths: Output lengths, GPUs), or both.
Follows = tuple[str, ...]
# A session's fragments the watcher redraws: its page's live part, and the sidebar's "Last
# collection" line (its own fragment, ticking every FRESHNESS_TICK_S: without a push it named the
# poll before the one the page showed, for up to that long).
LIVE, SIDEBAR = "live", "sidebar"
# Compare's live part shows two runs: the second live run's store is watched under this role.
SECOND = "live-second"
# A session's fragments, asked in this order: the sidebar's line first (a read of one stamp,
# ~0.05 s), then the live part. Asked after it, the line waited for the live part's whole run
# (1.5-2.8 s behind the page's numbers at load 9).
_ROLE_ORDER = {SIDEBAR: 0, LIVE: 1, SECOND: 2}
OVERVIEW: Follows = (published.NAME,)
PAYLOADS: Follows = ("run_lengths",)
ANY: Follows = OVERVIEW + PAYLOADS
Stamps = tuple[float | None, ...]


@dataclasses.dataclass(frozen=True)
class Here:
    """The fragment running now: its session and id, and the run's URL query, page and browser
    context (what the browser's timer would send back; a session's stored client state is empty
    until its first run ends, and a tab is asked to redraw during that run too)."""

    session_id: str
    fragment_id: str
    query_string: str
    page_script_hash: str
    context_info: Any = None
    fragment_run: bool = False  # a rerun of this fragment alone (the browser's timer, a widget, a push)

    def view(self) -> tuple[str, str, str]:
        """What the tab shows: a fragment's id is its function and place, the same on every page
        (the Overview's, GPUs' and Nodes' live parts share one), so the page and its query say which."""
        return self.fragment_id, self.page_script_hash, self.query_string


@dataclasses.dataclass
class Viewer:
    """A session's live part: where it runs, the store and publications it follows, the stamps
    it last drew, whether its browser has asked for a rerun of it itself (`ready`: then, and only
    then, it is pushed), and when the watcher last asked it to redraw (monotonic; 0: never)."""

    here: Here
    store: Store
    follows: Follows
    drawn: Stamps
    drawn_at: float  # monotonic
    ready: bool = False
    asked: Stamps | None = None
    asked_at: float = 0.0

    def due(self, current: Stamps, now: float, ready: bool | None = None) -> bool:
        """Whether to ask for a redraw now: its browser runs its fragments (`ready`, default its
        own `ready`: Watcher.pushable), and a publication it has neither drawn nor been asked for
        is there; never twice within MIN_GAP_S."""
        if not (self.ready if ready is None else ready) or now - self.asked_at < MIN_GAP_S:
            return False
        return current != self.drawn and current != self.asked


@dataclasses.dataclass
class _Seen:
    signature: tuple[int, ...]  # the store file's and its WAL's (size, mtime_ns)
    stamps: dict[str, float | None]


class Watcher:
    """The process's one watcher: `register` from a live part's run, `tick` from its thread."""

    def __init__(self, request: Any = None, watch_s: float = WATCH_S) -> None:
        self.watch_s = watch_s
        self.requests = 0  # reruns asked for (tests, the bench's log line)
        self._request = request if request is not None else _request
        self._lock = threading.Lock()
        self._viewers: dict[tuple[str, str], Viewer] = {}  # (session id, role) -> that fragment
        # session id -> the (page, query) whose fragments its browser has rerun alone since the
        # session's last full run of another page or query: its fragments there are pushed
        self._ready_views: dict[str, tuple[str, str]] = {}
        self._seen: dict[str, _Seen] = {}  # store path -> what the watcher last read
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="runhealth-livewatch", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def register(self, here: Here, store: Store, follows: Follows, role: str = LIVE) -> None:
        """A session's fragment in `role` (`here`: its live part, or the sidebar's "Last collection"
        line) is drawing now: note the stamps it draws (read before its reads, so a publication
        during them redraws again). Its session's fragments on this page and query are pushed from
        the first rerun of one of them alone there (drawn there before: before any push, one its
        browser asked for) until a full run of another page or query. A full run forgets what the
        session drew on another page or query (a role this page may not draw: Compare's second run)."""
        drawn = self.stamps(store, follows)
        key, sid, page_view = (here.session_id, role), here.session_id, (here.page_script_hash, here.query_string)
        with self._lock:
            before = self._viewers.get(key)
            same = before is not None and before.here.view() == here.view()
            if here.fragment_run and same:
                self._ready_views[sid] = page_view
            elif not here.fragment_run and self._ready_views.get(sid) != page_view:
                self._ready_views.pop(sid, None)  # a full run of another page or query: wait for a tick there
            if not here.fragment_run:  # what the page before drew, this one may not (Compare's second run)
                for other in [k for k, v in self._viewers.items() if k[0] == sid and v.here.view()[1:] != page_view]:
                    del self._viewers[other]
            ready = same and before is not None and (before.ready or here.fragment_run)
            asked_at = before.asked_at if before is not None else 0.0  # MIN_GAP_S holds across redraws
            self._viewers[key] = Viewer(here, store, follows, drawn, time.monotonic(), ready=ready, asked_at=asked_at)

    def forget(self, session_id: str, role: str) -> None:
        """The session's fragment in `role` no longer draws what it was registered for (Compare's
        second run once the pair shown has one live run): no push for it."""
        with self._lock:
            if self._viewers.pop((session_id, role), None) is not None:
                self._forget_view_if_unseen(session_id)

    def pushable(self, viewer: Viewer) -> bool:
        """Whether `viewer`'s tab has rerun this fragment, or another of its fragments on the same
        page and query, alone since it showed them (see `register`)."""
        with self._lock:
            view = self._ready_views.get(viewer.here.session_id)
        return viewer.ready or view == (viewer.here.page_script_hash, viewer.here.query_string)

    def stamps(self, store: Store, follows: Follows = ANY) -> Stamps:
        """The stamps of `follows` as the watcher knows them (read now for a store it never read)."""
        with self._lock:
            seen = self._seen.get(str(store.path))
        if seen is None:
            seen = self._look(store, None)
        return tuple(seen.stamps.get(name) for name in follows)

    def known(self, path: str, follows: Follows = ANY) -> Stamps | None:
        """The stamps of `follows` last read for the store at `path` (None: not watched), without a read."""
        with self._lock:
            seen = self._seen.get(path)
        return None if seen is None else tuple(seen.stamps.get(name) for name in follows)

    def tick(self, now: float | None = None) -> None:
        """One look at every watched store; a rerun asked of each live part behind its store."""
        now = time.monotonic() if now is None else now
        with self._lock:
            for key in [k for k, v in self._viewers.items() if now - v.drawn_at > FORGET_AFTER_S]:
                del self._viewers[key]
                self._forget_view_if_unseen(key[0])
            viewers = dict(self._viewers)
        for viewer in viewers.values():  # asks their loop dropped (busy by then): due again
            if (viewer.here.session_id, viewer.here.fragment_id) in _skipped:
                _skipped.discard((viewer.here.session_id, viewer.here.fragment_id))
                viewer.asked = None
        stores = {str(v.store.path): v.store for v in viewers.values()}
        for path, store in stores.items():
            with self._lock:
                seen = self._seen.get(path)
            self._look(store, seen)
        # A session's due fragments are asked together (_ROLE_ORDER): one request queues them back
        # to back in the session's one run (its sidebar line no longer waits for a later look once
        # the live part's run is over: 3.5 s behind the publication in a loaded CI run).
        due: dict[str, list[tuple[tuple[str, str], Viewer, Stamps]]] = {}
        for key, viewer in sorted(viewers.items(), key=lambda kv: _ROLE_ORDER.get(kv[0][1], len(_ROLE_ORDER))):
            current = self.stamps(viewer.store, viewer.follows)
            if viewer.due(current, now, self.pushable(viewer)):
                due.setdefault(key[0], []).append((key, viewer, current))
        for session_id, asks in due.items():
            if _broken:
                self.stop()
                return
            heres: dict[str, Here] = {}  # by fragment: Compare's two runs are one live part
            for _key, viewer, _current in asks:
                heres.setdefault(viewer.here.fragment_id, viewer.here)
            try:
                alive = self._request(tuple(heres.values()))
            except Exception as exc:  # Streamlit's internals changed: pages keep their interval tick
                _broken.append(f"{type(exc).__name__}: {exc}")
                log.warning("live redraw on publication unavailable (%s): pages redraw every interval", _broken[-1])
                self.stop()
                return
            if alive is None:  # a run in progress (a page loading): asked at a later look
                continue
            for _key, viewer, current in asks:
                viewer.asked, viewer.asked_at = current, now
            self.requests += len(heres)
            if not alive:  # the session is gone
                with self._lock:
                    for key, viewer, _current in asks:
                        if self._viewers.get(key) is viewer:
                            del self._viewers[key]
                    self._forget_view_if_unseen(session_id)

    def _forget_view_if_unseen(self, session_id: str) -> None:
        """Drop a session's ready page once none of its fragments is watched (hold the lock)."""
        if not any(sid == session_id for sid, _role in self._viewers):
            self._ready_views.pop(session_id, None)

    def _look(self, store: Store, seen: _Seen | None) -> _Seen:
        """The store's stamps: read again only when its file or WAL moved since `seen`."""
        signature = _signature(str(store.path))
        if seen is not None and seen.signature == signature:
            return seen
        stamps: dict[str, float | None] = {}
        for name in ANY:
            try:  # computed_at reads None for a store it cannot read: page.store_failure says so
                stamps[name] = pagedata.computed_at(store, name)
            except Exception:  # never the watcher's end: the old stamp stands
                stamps[name] = seen.stamps.get(name) if seen is not None else None
        fresh = _Seen(signature, stamps)
        with self._lock:
            self._seen[str(store.path)] = fresh
        return fresh

    def _loop(self) -> None:
        while not self._stop.wait(self.watch_s):
            try:
                self.tick()
            except Exception:  # a tick that failed is the next tick's to redo
                log.exception("live watcher tick failed")


def _signature(path: str) -> tuple[int, ...]:
    out: list[int] = []
    for name in (path, path + "-wal"):
        try:
            st = os.stat(name)
            out += [st.st_size, st.st_mtime_ns]
        except OSError:
            out += [-1, -1]
    return tuple(out)


_broken: list[str] = []  # why a rerun request failed in this process (then: the interval tick)
_skipped: set[tuple[str, str]] = set()  # (session, fragment) reruns their loop dropped (busy by then): ask again
_watcher: Watcher | None = None
_watcher_lock = threading.Lock()


def watcher() -> Watcher | None:
    """The process's watcher, started on first use (None: not supported here). A module global,
    not st.cache_resource: "Clear cache" must not leave a second thread behind."""
    global _watcher
    if not supported():
        return None
    with _watcher_lock:
        if _watcher is None:
            _watcher = Watcher()
            _watcher.start()
        return _watcher


def store_key(store: Store, follows: Follows = ANY) -> tuple[str, Stamps | None]:
    """A cached read's key for `store`: its path and the stamps of the publications `follows`
    the watcher last saw there (no read here; None where no watcher runs, as in AppTest: then the
    ttl alone, as before)."""
    w = _watcher
    return str(store.path), (None if w is None else w.known(str(store.path), follows))


def keyed_on(follows: Follows) -> Any:
    """st.cache_data's hash function for a Store argument: keyed on `follows`' stamps, so a read
    after one of those publications computes afresh (a live part pushed for it shows it), and
    on the ttl alone between them."""
    return lambda store: store_key(store, follows)


def supported() -> bool:
    """Whether this process serves pages through a Streamlit whose internals `_request` uses."""
    if _broken:
        return False
    try:
        from streamlit.proto.ClientState_pb2 import ClientState
        from streamlit.runtime import Runtime
        from streamlit.runtime.app_session import AppSession
        from streamlit.runtime.scriptrunner_utils.script_run_context import ThreadState  # noqa: F401
    except ImportError:
        return False
    fields = set(ClientState.DESCRIPTOR.fields_by_name)
    return (
        Runtime.exists()
        and type(Runtime.instance()) is Runtime  # AppTest's is a stand-in (a mock): no sessions to rerun
        and hasattr(Runtime, "get_app_session")
        and hasattr(AppSession, "request_rerun")
        and {"fragment_id", "is_auto_rerun"} <= fields
    )


def drawing(store: Store, follows: Follows, role: str = LIVE) -> None:
    """A fragment of `role` is drawing `store`'s `follows` now (call first in its body): noted with
    the process's watcher, so that it is pushed on the next publication. Nothing where no watcher
    runs, or outside a fragment."""
    w = watcher()
    here = running() if w is not None else None
    if w is not None and here is not None:
        w.register(here, store, follows, role)


def not_drawing(role: str) -> None:
    """The fragment running now no longer draws what it registered as `role`: forgotten."""
    w = watcher()
    here = running() if w is not None else None
    if w is not None and here is not None:
        w.forget(here.session_id, role)


def running() -> Here | None:
    """The fragment running in this thread (None: not in one)."""
    from streamlit.runtime.scriptrunner_utils.script_run_context import ThreadState, get_script_run_ctx

    ctx = get_script_run_ctx()
    try:
        fragment_id = ThreadState.get().fragment_id
    except RuntimeError:
        return None
    if ctx is None or not fragment_id:
        return None
    alone = bool(getattr(ctx, "fragment_ids_this_run", None))
    return Here(ctx.session_id, fragment_id, ctx.query_string, ctx.page_script_hash, ctx.context_info, alone)


def _idle(session: Any) -> bool:
    """Whether `session` has no run in progress or asked for: no script runner (a session's runner
    ends after each run, and is made again for the next request), not running, and every message
    of its last run handed to its browser. A fragment run that starts while the last run's
    messages still wait in the session's queue takes that fragment's deltas out of the queue and
    rewrites the run's end message (streamlit/runtime/forward_msg_queue.py `clear`); a trace of
    loaded -n 3 runs saw sessions idle with their whole first run (30 messages) queued for 2 s.
    Not enough on its own: a tab pushed 0.1 s after its first run was handed over still went blank,
    hence `Viewer.ready` (pushed only after its browser asked for a rerun of the fragment itself)."""
    state = getattr(session, "_state", None)
    return (
        session._scriptrunner is None  # noqa: SLF001
        and (state is None or state.name == "APP_NOT_RUNNING")
        and len(session._browser_queue) == 0  # noqa: SLF001
    )


def _request(heres: tuple[Here, ...]) -> bool | None:
    """Queue reruns of one session's fragments `heres`, in order, as their run_every timers in
    the browser would: the first starts a run, the others queue behind it in that run (Streamlit
    runs a fragment asked for during a fragment's run after it, without stopping it). False: the
    session is gone or shows another page; None: not now, a run of the session is in progress
    (a tab still drawing its page is never handed a rerun: with seven kiosk tabs loading at once,
    a rerun queued behind a first run left a tab without its heading in some runs)."""
    from streamlit.proto.ClientState_pb2 import ClientState
    from streamlit.runtime import Runtime

    session = Runtime.instance().get_app_session(heres[0].session_id)
    if session is None or not all(session.has_fragment(h.fragment_id) for h in heres):  # gone, or a page left
        return False
    if not _idle(session):
        return None
    loop = session._event_loop  # noqa: SLF001 - AppSession is not thread-safe: its own loop runs this
    if not hasattr(loop, "call_soon_threadsafe"):
        raise RuntimeError("AppSession has no event loop")

    def ask() -> None:
        try:
            # Checked again on the session's loop, where its runs start: between the watcher's look
            # and now, the browser may have asked for a run (a first run, a page or a query
            # changed). A fragment rerun asked then would be folded into that run, and a full run
            # takes the page and query of the request that came last: ours, the page drawn before.
            if not _idle(session) or not all(session.has_fragment(h.fragment_id) for h in heres):
                _skipped.update((h.session_id, h.fragment_id) for h in heres)  # asked again at a later look
                return
            for here in heres:
                # No widget states: the session keeps the values it holds (the browser's timer
                # sends the same ones); a fragment gone by then (page left) is skipped without a
                # warning. The first starts the session's run; the next ones are queued in it.
                cs = ClientState(
                    query_string=here.query_string,
                    page_script_hash=here.page_script_hash,
                    fragment_id=here.fragment_id,
                    is_auto_rerun=True,
                )
                if here.context_info is not None:
                    cs.context_info.CopyFrom(here.context_info)
                session.request_rerun(cs)
        except Exception as exc:  # the interval tick from now on
            _broken.append(f"{type(exc).__name__}: {exc}")
            log.warning("live redraw on publication unavailable (%s): pages redraw every interval", _broken[-1])

    loop.call_soon_threadsafe(ask)
    return True
