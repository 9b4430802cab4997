"""The Overview as the collector publishes it: built once after polls, read by every viewer.

One Overview (runhealth.screens.overview) reads every table the standup screen shows, about 20
statements; each viewer's refresh used to pay that, every poll interval. The collecting process
builds it after polls instead (runhealth.collect.publisher), inside one read snapshot, and writes
it to the page_data row "overview" with the run settings it was built for. The page, the headline
download and `runhealth status` then read that one row (`shown`).

A published Overview is shown only while it says what a fresh build would say, else the reader
builds one itself (as before, one snapshot):
- built for the same run settings (a touched config republishes; until then the reader builds);
- not older than the publisher said it may grow (two poll intervals, or three times its gap when
  builds are dear: a 512-node fleet's), and not stamped in the future (a clock stepped back);
- no state has changed since it was built: the collection is no staler, no node changed between
  up / stale / down, no node started or stopped writing (the stall rule), judged by the same rules
  at both instants. So a dead collector, a node going quiet or a stall show at the next refresh.
Its numbers are those of its instant, and the page says which ("Numbers as of"); the tile that is
an age (Data age) is worded again at the reader's now.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from runhealth import textsafe, typedjson
from runhealth.payloads import pagedata
from runhealth.rules import activity
from runhealth.rules.health import node_status
from runhealth.screens import overview as model
from runhealth.settings.config import RunConfig
from runhealth.settings.runsettings import RunSettings
from runhealth.store import Store

log = textsafe.get_logger(__name__)

NAME = "overview"  # its page_data row
FORMAT = 1  # raised when the payload's shape changes incompatibly (an older row is then rebuilt)


def settings_key(config: RunConfig) -> dict[str, Any]:
    """What an Overview depends on in the config: the run settings (no secrets, no demo flag)."""
    meta = dict(RunSettings.from_config(config).to_meta())
    meta.pop("demo", None)
    return meta


def max_age_s(config: RunConfig) -> float:
    """How old a published Overview may be and still be shown, at least: two poll intervals. A
    publisher whose builds are dear builds less often and says so in the payload (`Published`)."""
    return 2 * max(config.interval_s, 2.0)


@dataclasses.dataclass(frozen=True)
class Published:
    """A published Overview and how old the publisher said it may grow (its next build is due
    well before: collect/publisher.py)."""

    model: model.Overview
    max_age_s: float


def publish(store: Store, config: RunConfig, now: float | None = None, max_age: float | None = None) -> Published:
    """Build the live Overview at `now` (one snapshot) and write it as the page_data row, to be
    shown for up to `max_age` seconds (default and least: max_age_s)."""
    now = time.time() if now is None else now
    built = model.overview(store, config, now)
    age = max(max_age_s(config), max_age or 0.0)
    payload = {"format": FORMAT, "settings": settings_key(config), "max_age_s": age, "model": typedjson.dump(built)}
    pagedata.put(store, {NAME: payload}, now)
    return Published(built, age)


def read(store: Store, config: RunConfig) -> Published | None:
    """The published Overview for `config`'s settings (one statement), or None: none yet, another
    format, other settings, or a row that does not fit the model (logged; the reader builds)."""
    got = pagedata.get(store, NAME)
    if got is None:
        return None
    payload = got[1]
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        return None
    if payload.get("settings") != settings_key(config):
        return None
    try:
        found = typedjson.load(model.Overview, payload.get("model"), "model")
        age = typedjson.load(float, payload.get("max_age_s"), "max_age_s")
    except typedjson.TypedJsonError as exc:
        log.warning("published overview unreadable (%s): building it here", exc)
        return None
    return Published(found, max(age, max_age_s(config)))


def still_true(m: model.Overview, now: float, config: RunConfig, max_age: float | None = None) -> bool:
    """Whether `m` (built at m.now) says at `now` what a fresh build would (module docstring);
    `max_age`: how old it may be (default max_age_s)."""
    if not 0 <= now - m.now <= (max_age_s(config) if max_age is None else max_age):
        return False
    stale, stall = config.stale_after, config.stall_after
    if m.as_of is not None and (m.now - m.as_of > stale) != (now - m.as_of > stale):
        return False
    if any(node_status(n, m.now, stale)[0] != node_status(n, now, stale)[0] for n in m.nodes):
        return False
    if m.per_node is not None:
        then, later = (activity.stall_state(m.per_node, t, stall) for t in (m.now, now))
        if _stall_states(then) != _stall_states(later):
            return False
    return True


def _stall_states(s: activity.Stalls) -> tuple[bool, frozenset[str], frozenset[str], frozenset[str]]:
    """What the stall rule decided: the run stalled or not, and which nodes write, are quiet, wait."""
    return s.run_since_unix is not None, s.writing, frozenset(s.nodes), frozenset(s.waiting)


def aged(m: model.Overview, now: float, config: RunConfig) -> model.Overview:
    """`m` with its ages worded at `now` (the Data age tile); every other number is m's instant."""
    if m.as_of is None:
        return m
    standup = dataclasses.replace(m.standup, data_age_s=now - m.as_of)
    again = dataclasses.replace(m, standup=standup)
    return dataclasses.replace(again, tiles=tuple(model.live_tiles(again, config)))


def shown(store: Store, config: RunConfig, now: float | None = None, finished: bool = False) -> model.Overview:
    """The Overview a page (or `runhealth status`) shows at `now`: the published one while it is
    still true, else one built here. A finished run's is always built (it no longer changes and
    no collector publishes it)."""
    now = time.time() if now is None else now
    if not finished:
        found = read(store, config)
        if found is not None and still_true(found.model, now, config, found.max_age_s):
            return aged(found.model, now, config)
    return model.overview(store, config, now, finished)
