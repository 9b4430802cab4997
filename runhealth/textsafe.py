"""Text from shards and nodes made safe for a terminal or a log file.

Shard data is untrusted: a finish_reason, a file name or an error message can hold terminal
control sequences (ESC ] 0 ; title BEL retitles the operator's terminal, other sequences move
the cursor or rewrite the screen). `escape()` shows every non-printable character as a visible
escape, so the text is kept, not run; `get_logger()` gives a module logger whose records are
escaped the same way, whoever configured the handlers.
"""

from __future__ import annotations

import logging


def escape(text: object) -> str:
    """`text` with every non-printable character written as \\xNN / \\uNNNN (newline included)."""
    s = str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() else (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}") for c in s)


class EscapeFilter(logging.Filter):
    """Formats the record's message once and replaces it by its escaped form."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        safe = escape(message)
        if safe != message or record.args:
            record.msg, record.args = safe, None
        return True


_FILTER = EscapeFilter()


def get_logger(name: str) -> logging.Logger:
    """logging.getLogger(name) with the escaping filter (filters run where a record is made)."""
    logger = logging.getLogger(name)
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    return logger
