"""The one number format (runhealth.screens.words): each inconsistency issue 32 found, pinned."""

from __future__ import annotations

import math

import pytest

from components import format as component_format
from runhealth.screens import words


def test_a_rate_column_never_mixes_thousands_with_plain_digits():
    # Issue 32: one column read "13.0K" and "9,369"; from 1,000 up every rate is in thousands.
    assert [words.fmt_rate(x) for x in (9_369, 13_012, 26_100)] == ["9.4K", "13.0K", "26.1K"]
    assert words.fmt_rate(950) == "950" and words.fmt_rate(None) == "N/A" and words.fmt_rate(math.nan) == "N/A"


def test_counts_carry_thousands_separators_and_shares_one_decimal():
    assert words.fmt_count(1998) == "1,998" and words.fmt_count(42373) == "42,373"
    # Issue 32: one column mixed "2.6%" and "1.94%"; every share has one decimal.
    assert [words.fmt_share(x) for x in (0.026, 0.0194, 0.18)] == ["2.6%", "1.9%", "18.0%"]
    assert words.fmt_count(None) == "N/A" and words.fmt_share(None) == "N/A"


@pytest.mark.parametrize(
    ("value", "ceiling", "text"), [(4096, 4096, "≥ 4,096"), (3000, 4096, "3,000"), (4096, None, "4,096")]
)
def test_a_length_at_the_ceiling_is_a_bound(value, ceiling, text):
    assert words.fmt_tokens(value, ceiling) == text
    assert component_format.fmt_percentile_tokens(value, ceiling) == text  # the pages' one definition


def test_one_of_a_thing_is_singular():
    assert [words.fmt_plural(n, "run") for n in (1, 2, 1024)] == ["1 run", "2 runs", "1,024 runs"]
