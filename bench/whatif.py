"""The what-if on a broad generated family: truth, estimate, interval, covered, width (#19).

    python bench/whatif.py [--n 30000] [--seeds 1] [--ratio 2] [--baseline-ref 71d865d]

Each shape of tests/whatif_family.py is cut at the ceiling where its censoring share is 1%, 5%,
15% and 40%, and the what-if is asked about ``ratio`` x the ceiling, where the truth is exact.
The same cases go through the what-if as it was at ``--baseline-ref`` (loaded from git, measured
in the same run), so every row shows both and the footer the coverage, point accuracy (within
max(1.5 pp, 40% relative)), informative share (width < half the current share) and the time
ratio.  Not a pass/fail test.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from whatif_family import SHAPES, SHARES, case  # noqa: E402

from runhealth.analysis import whatif  # noqa: E402


def load_baseline(ref: str):
    """The what-if module as it was at ``ref`` (None when git cannot show it)."""
    src = None
    for rel in ("runhealth/analysis/whatif.py", "runhealth/whatif.py"):  # moved into analysis/ (#14)
        try:
            src = subprocess.run(
                ["git", "-C", str(ROOT), "show", f"{ref}:{rel}"], check=True, capture_output=True, text=True
            ).stdout
            break
        except (OSError, subprocess.CalledProcessError):
            continue
    if src is None:
        return None
    path = Path(tempfile.mkdtemp()) / "whatif_baseline.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location("whatif_baseline", path)
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError:  # a ref from before the analysis/ package imports modules that moved
        return None
    return module


def run_one(module, c, reps):
    t0 = time.perf_counter()
    r = module.what_if(c["hist"], c["ceiling"], c["limit"], bootstrap=reps)
    elapsed = time.perf_counter() - t0
    r = r if isinstance(r, dict) else r.to_json()  # a baseline from before WhatIf returns the dict itself
    est, (lo, hi) = r["truncated_fraction"], r["interval"]
    return {
        "est": est,
        "lo": lo,
        "hi": hi,
        "covered": est is not None and lo <= c["share"] <= hi,
        "close": est is not None and abs(est - c["share"]) <= max(0.015, 0.4 * c["share"]),
        "narrow": hi - lo < 0.5 * r["current_truncated_fraction"],
        "s": elapsed,
        "model": r["model"],
        "extra": r["extra_tokens_per_completion"],
        "extra_iv": r["extra_tokens_interval"],
        "bt": (r.get("backtest") or {}).get("checks", []),
    }


def row(shape, share, seed, c, new, old) -> str:
    def cell(x):
        if x is None:
            return "—"
        mark = "yes" if x["covered"] else "NO"
        return f"{(x['est'] or 0):6.2%} [{x['lo']:.2%}, {x['hi']:.2%}] {mark:3s} w={(x['hi'] - x['lo']):.2%}"

    bt = next((b for b in new["bt"] if b["predicted"] is not None), None)
    check = (
        f"cut {bt['cut']}: {bt['predicted']:.1%} vs {bt['truth']:.1%}"
        if bt and bt["predicted"] is not None
        else "no back-test"
    )
    e_ok = new["extra_iv"][0] <= c["extra"] <= new["extra_iv"][1]
    return (
        f"| {shape} | {share:.0%} | {seed} | {c['share']:.2%} | {cell(new)} | {new['model']} | "
        f"{c['extra']:,.0f} / {new['extra'] or 0:,.0f} {'yes' if e_ok else 'NO'} | {check} | {cell(old)} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30000)
    ap.add_argument("--seeds", default="1")
    ap.add_argument("--ratio", type=float, default=2.0)
    ap.add_argument("--bootstrap", type=int, default=200)
    ap.add_argument("--baseline-ref", default="71d865d")
    args = ap.parse_args()
    old_mod = load_baseline(args.baseline_ref)
    print(
        f"n = {args.n:,} per case, asked at {args.ratio:g} x the ceiling, {args.bootstrap} bootstrap replicates; "
        f"baseline: what-if at {args.baseline_ref}" + ("" if old_mod else " (not available)")
    )
    print(
        "| shape | cut share | seed | truth | estimate [95% interval] covered width | headline | "
        "extra tokens true / est covered | back-test (headline) | baseline |"
    )
    print("|---|---:|---:|---:|---|---|---|---|---|")
    news, olds, extras = [], [], []
    for shape in SHAPES:
        for share in SHARES:
            for seed in (int(s) for s in args.seeds.split(",")):
                c = case(shape, share, args.n, seed, args.ratio)
                new = run_one(whatif, c, args.bootstrap)
                old = run_one(old_mod, c, args.bootstrap) if old_mod else None
                news.append(new)
                olds.append(old)
                extras.append(new["extra_iv"][0] <= c["extra"] <= new["extra_iv"][1])
                print(row(shape, share, seed, c, new, old), flush=True)
    summary(news, olds, extras)


def summary(news, olds, extras) -> None:
    n = len(news)
    for name, rs in (("this", news), ("baseline", [o for o in olds if o])):
        if not rs:
            continue
        print(
            f"{name:9s}: covered {sum(r['covered'] for r in rs)}/{len(rs)}, point within max(1.5 pp, 40%) "
            f"{sum(r['close'] for r in rs)}/{len(rs)}, width < half the current share "
            f"{sum(r['narrow'] for r in rs)}/{len(rs)}, total {sum(r['s'] for r in rs):.1f} s"
        )
    print(f"extra tokens covered {sum(extras)}/{n}")
    if all(olds):
        ratio = sum(r["s"] for r in news) / sum(o["s"] for o in olds)
        print(f"time ratio this / baseline: {ratio:.2f}x")


if __name__ == "__main__":
    main()
