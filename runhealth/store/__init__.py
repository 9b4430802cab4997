"""The history store: an embedded SQLite database the collector writes and pages read.

Pages never talk to nodes; they read aggregates from here, so any number of viewers costs no
SSH traffic. The database runs in WAL mode and every poll result is applied in one
transaction (shard offsets move together with the counts they produced), so a process killed
mid-write leaves either the old state or the new one: counts are never lost or doubled.
`Store` is composed of its three jobs, one module each:

- lifecycle.py: the file (open, check, migrate, the replaced-file rules with runhealth/store/storefile.py)
  and the raw access (`transaction`, `query`, `cursor`), run metadata and node registrations;
- writes.py: `write_poll` (one `ingest.PollRecord` in one transaction), failures, samples, pruning;
- reads.py: the named reads, typed by runhealth/records.py;
- fieldreads.py: the reads of the per-line fields (prompt IDs, groups, unanswered cuts, #33);
- failedreads.py: the reads of failed requests (by node and reason, retried prompts, #39).

What a poll reply means is runhealth/ingest.py's; the store writes it. The store imports nothing
from runhealth.analysis (tests/test_layers.py holds it).
"""

from __future__ import annotations

from runhealth.store.failedreads import StoreFailedReads
from runhealth.store.fieldreads import StoreFieldReads
from runhealth.store.lifecycle import StoreFile
from runhealth.store.reads import POLL_DELTAS, StoreReads, live_sums
from runhealth.store.writes import StoreWrites, write_error_text

__all__ = ["POLL_DELTAS", "Store", "StoreFile", "live_sums", "write_error_text"]


class Store(StoreWrites, StoreReads, StoreFieldReads, StoreFailedReads):
    """SQLite-backed history: its file (StoreFile), writes (StoreWrites) and reads (StoreReads,
    StoreFieldReads: the per-line fields of #33; StoreFailedReads: failed requests, #39).
    Safe to share between threads (one connection per thread)."""
