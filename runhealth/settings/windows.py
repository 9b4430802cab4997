"""The time windows every screen, alert and exporter agrees on: stale, stall, the rate windows and
the product's other windows and cadences (the what-if's refit, the alert timeline's day, notices).

A leaf module (standard library only), so `runhealth.settings.config` can resolve its defaults without
importing `runhealth.rules.health` (which imports the store), and `health`, `derived`, the exporter
and the Compare page read one constant each instead of their own.
"""

from __future__ import annotations

WINDOW_POLLS = 3  # the default stale and stall windows span this many poll intervals ...
STALE_MIN_S = 30.0  # ... and the stale window at least this: `stale_after_s`
STALL_MIN_S = 120.0  # ... and the stall window at least this: `stall_after_s`
RATE_WINDOW_S = 60.0  # "Tokens/s · last 1 min": the one live tok/s (tiles, Nodes, /metrics, Compare) ...
AVERAGE_WINDOW_S = 900.0  # the 15-min average: the ETA's rate ...
RATE_MIN_POLLS = 2  # ... each at least this many poll intervals wide (`rate_window_s`, `average_window_s`)
DROP_LOOKBACK_S = 3600.0  # the hour the rate-drop median is taken over (and the screens' rate read) ...
DROP_BUCKET_S = 60.0  # ... as the median of per-minute rates: the buckets `activity.minute_rates` divides by
SERVER_RATE_WINDOW_S = 300.0  # an inference server's token counter is read over this (its own scrape cadence)
HARDWARE_WINDOW_S = 3600.0  # an XID stays an alert, and a GPU that reported counts as expected, for an hour
# The what-if (a model fit, its back-test and bootstrap: too heavy for every poll) is redone at most
# this often: the collector's precomputed copy, the Output lengths page's live fragment and its cache.
WHATIF_REFIT_S = 60.0
ALERT_STRIP_MIN_S = 30 * 60.0  # the alert strip's narrowest window: a run minutes old (#41)
ALERT_TIMELINE_S = 24 * 3600.0  # the alert timeline's day (Overview, Nodes) and the run events its charts mark
NOTICE_S = 24 * 3600.0  # a replaced store file or a replaced shard is named on its page this long
RAW_KEEP_S = 24 * 3600.0  # raw 10 s history is kept this long, then rolled up (config raw_keep_h's default) ...
FINE_KEEP_S = 7 * 24 * 3600.0  # ... and its 1-min rows this long, then 10-min rows (runhealth/store/rollup.py)
FRESHNESS_TICK_S = 5.0  # the sidebar's "Last collection" and a page that cannot start re-read this often


def stale_after_s(interval_s: float, configured: float | None = None) -> float:
    """Seconds without a successful poll before a node (or the whole collection) counts as stale.

    The one rule: the run's configured ``stale_after_s`` when set, else three poll intervals,
    at least 30 s. The dashboard also uses the default as the width of "a few polls" (chart
    buckets, how fresh a server gauge must be).
    """
    return float(configured) if configured else max(WINDOW_POLLS * interval_s, STALE_MIN_S)


def stall_after_s(interval_s: float, configured: float | None = None) -> float:
    """Seconds an up node (or the run) may add no completions before it counts as stalled.

    The one rule: the run's configured ``stall_after_s`` when set, else three poll intervals,
    at least 120 s. `RunConfig.stall_after` reads it (the collector saves that in the run's
    meta), and so do the alerts and the exporter, from the meta.
    """
    return float(configured) if configured else max(WINDOW_POLLS * interval_s, STALL_MIN_S)


def rate_window_s(interval_s: float) -> float:
    """The live tok/s window for a run polled every `interval_s`: a minute (RATE_WINDOW_S), or
    two poll intervals when polls are slower (a window holding under two polls has no rate).
    The one place that decides it: the tiles, the Nodes table, /metrics and the alerts use it."""
    return max(RATE_WINDOW_S, RATE_MIN_POLLS * float(interval_s))


def average_window_s(interval_s: float) -> float:
    """The average the ETA divides by: 15 minutes (AVERAGE_WINDOW_S), or two poll intervals."""
    return max(AVERAGE_WINDOW_S, RATE_MIN_POLLS * float(interval_s))


def rates_lookback_s(interval_s: float, window_s: float) -> float:
    """How far back to read polls for a rate over `window_s`: the window and two intervals more
    (the poll that opens the window's first span)."""
    return window_s + RATE_MIN_POLLS * float(interval_s)
