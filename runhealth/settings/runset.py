"""The runs of a config file: load and validate, diff against the previous set, reload.

One `RunSet` per process follows one config file (or holds the built-in demo's runs). Both the
collector (`runhealth collect`, runhealth/collect/service.py) and the dashboard viewer
(components/context.py) read their runs through it, so a bad edit means the same thing
everywhere: the last good set stays in use and `error` holds the latest failed edit's message
(naming the file), until an edit loads again. `reload(apply)` lets the caller veto a set that
loads but cannot be used (a store that cannot be opened): `apply` raising keeps the previous set
too. Store paths are compared after `Path.resolve()`, so `sub/../a.sqlite3` is `a.sqlite3`.
A new version of the file whose runs are the ones in use (a `touch`, config management writing
the same content, a comment) is accepted without calling `apply`: nothing restarts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from runhealth.errors import ConfigError, RunhealthError
from runhealth.settings import runs
from runhealth.settings.config import RunConfig, RunContext

Signature = tuple[int, int] | None


def file_signature(path: Path | None) -> Signature:
    """(mtime_ns, size) of the file, None when it cannot be read (or there is no file: the demo)."""
    if path is None:
        return None
    try:
        info = path.stat()
    except OSError:
        return None
    return (info.st_mtime_ns, info.st_size)


def store_key(config: RunConfig) -> Path:
    """A run's store file, resolved: two spellings of one file are one store."""
    return config.resolved_store_path().expanduser().resolve()


@dataclasses.dataclass(frozen=True)
class RunSetChange:
    """What an accepted reload changed, by run name."""

    added: list[str]
    removed: list[str]
    changed: list[str]

    @property
    def empty(self) -> bool:
        return not (self.added or self.removed or self.changed)


def diff(old: list[runs.RunEntry], new: list[runs.RunEntry]) -> RunSetChange:
    """Runs added, removed and changed (settings, nodes or finished) between two sets."""
    before = {e.config.name: e for e in old}
    after = {e.config.name: e for e in new}
    return RunSetChange(
        added=[n for n in after if n not in before],
        removed=[n for n in before if n not in after],
        changed=[n for n in after if n in before and after[n] != before[n]],
    )


class RunSet:
    """The runs of `path` (None: fixed runs given by `loader`, e.g. the demo's).

    `entries` is the last set that loaded (empty before the first), `error` the latest failed
    edit's message (None once the file loads again).
    """

    def __init__(
        self,
        path: Path | None,
        loader: Callable[[], list[runs.RunEntry]] | None = None,
        context: RunContext | None = None,
    ):
        self.path = path.expanduser().absolute() if path is not None else None
        self._loader = loader or self._load_file
        self.context = context or (RunContext.for_file(self.path) if self.path else RunContext())
        self.entries: list[runs.RunEntry] = []
        self.error: str | None = None
        self.signature: Signature = None
        self._tried = False

    def _load_file(self) -> list[runs.RunEntry]:
        assert self.path is not None
        return runs.load_runs(self.path)

    @property
    def loaded(self) -> bool:
        return bool(self.entries)

    @property
    def live(self) -> list[RunConfig]:
        """The runs that are polled (`finished = true` ones are not)."""
        return [e.config for e in self.entries if not e.finished]

    def changed_on_disk(self) -> bool:
        """True when the file differs from the version last tried (cheap: one stat)."""
        return not self._tried or file_signature(self.path) != self.signature

    def reload(
        self, apply: Callable[[list[runs.RunEntry]], None] | None = None, force: bool = False
    ) -> RunSetChange | None:
        """Load the file again if it changed since the last try (`force`: even if it did not).

        Returns None when it did not change, else what changed (possibly nothing, e.g. a touch).
        `apply(entries)` is called before a set that differs from `entries` is accepted (not for
        the same runs again); if it raises, the set is refused like a bad edit.

        Raises:
            ConfigError: the file (or `apply`) refused the edit; `entries` stay the last good
                set, and `error` is the message. Raised once per version of the file.
        """
        if not force and not self.changed_on_disk():
            return None
        self._tried, self.signature = True, file_signature(self.path)
        try:
            entries = self._loader()
            change = diff(self.entries, entries)
            if apply is not None and (entries != self.entries or not entries):
                apply(entries)
        except RunhealthError as exc:
            text = str(exc)
            if self.path is not None and str(self.path) not in text:
                text = f"{self.path}: {text}"
            self.error = text
            raise ConfigError(text) from exc
        self.entries, self.error = entries, None
        return change
