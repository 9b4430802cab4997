"""The what-if's words on the Output lengths page (components/whatif_view.py)."""

import dataclasses

from whatif_family import case

from components import whatif_view
from runhealth.analysis import loops
from runhealth.analysis.whatif import MIN_LOOP_SAMPLES, what_if


def _result(**kw):
    c = case("bimodal", 0.15, n=3000, seed=2)
    return what_if(c["hist"], c["ceiling"], c["limit"], bootstrap=0, **kw)


def test_loop_sample_counts_only_truncated_samples():
    batch = {
        "samples": [
            {"finish_reason": "length", "is_loop": True},
            {"finish_reason": "length", "is_loop": False},
            {"finish_reason": "stop", "is_loop": True},
        ]
    }
    assert loops.loop_sample(batch) == (1, 2)
    assert loops.loop_sample(None) == (0, 0)


def test_lines_name_the_check_the_model_and_the_loop_n():
    r = _result(loop_sample=(2, 2))
    line = whatif_view.backtest_line(r)
    check = next(c for c in r.backtest["checks"] if c["predicted"] is not None)
    assert line.startswith(
        f"Checked on this run: cut at {check['cut']:,}, this method would have said "
        f"{check['predicted']:.1%} above {check['limit']:,}; the truth is {check['truth']:.1%}"
    )
    assert whatif_view.model_line(r).startswith(f"Headline: {r.model}, smallest back-test error")
    loops = whatif_view.loops_line(r)
    assert "2 of 2 sampled" in loops and f"sample {MIN_LOOP_SAMPLES - 2} more" in loops and "assume no loops" in loops
    assert whatif_view.interval_note(r) == " assuming no loops"
    assert "no truncated completion sampled yet" in whatif_view.loops_line(_result(loop_sample=(0, 0)))
    enough = _result(loop_sample=(5, 40))
    used = whatif_view.loops_line(enough)
    assert "5 of 40 sampled" in used and "95%" in used and whatif_view.interval_note(enough) == ""


def test_without_a_backtest_the_line_says_so():
    r = dataclasses.replace(_result(), backtest=None)
    assert whatif_view.backtest_line(r).startswith("Not checked on this run")


def test_the_tile_says_when_the_method_failed_its_own_back_test():
    """Issue 32: "53% off" on the back-test stood in the fine print only; the tile's words say it."""
    import math

    r = _result()
    assert r.backtest and r.model in r.backtest["errors"]
    missed = dataclasses.replace(r, backtest={**r.backtest, "errors": {r.model: math.log1p(0.53)}})
    assert whatif_view.failed_backtest(missed) == "failed its own back-test (53% off on this run): a rough guess"
    close = dataclasses.replace(r, backtest={**r.backtest, "errors": {r.model: math.log1p(0.10)}})
    assert whatif_view.failed_backtest(close) == ""
    assert whatif_view.failed_backtest(dataclasses.replace(r, backtest=None)) == ""  # unchecked: the fine print says
