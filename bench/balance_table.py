#!/usr/bin/env python3
"""The load-balancing table from the metrics.jsonl of runs (bench/balance.sh).

Per run: the coefficient of variation (population std / mean) of the expert load, i.e. each
MoE layer's share of first choices per expert, averaged over the layers and over the logged
steps of the first and of the last third of the run; the share of first and second choices
dropped for capacity over the last third (mean over layers and steps); the final dev loss.
"""
import json
import statistics
import sys
from pathlib import Path


def cv(shares):
    mean = statistics.fmean(shares)
    return statistics.pstdev(shares) / mean if mean > 0 else float("nan")


def summary(run):
    recs = [json.loads(l) for l in (Path(run) / "metrics.jsonl").read_text().splitlines() if l]
    steps = [r for r in recs if "load" in r]
    last = max(r["step"] for r in steps)
    first_third = [r for r in steps if r["step"] <= last / 3]
    last_third = [r for r in steps if r["step"] > 2 * last / 3]

    def mean_cv(rs):
        return statistics.fmean(statistics.fmean(cv(l) for l in r["load"]) for r in rs)

    def mean_dropped(rs, which):
        return statistics.fmean(
            statistics.fmean(d[which] for d in r["dropped_layers"]) for r in rs
        )

    dev = [r["dev_loss"] for r in recs if "dev_loss" in r][-1]
    cfg = (Path(run) / "config.toml").read_text()
    balance = "bias" if 'balance = "bias"' in cfg else "aux_loss"
    return (
        balance,
        mean_cv(first_third),
        mean_cv(last_third),
        mean_dropped(last_third, 0),
        mean_dropped(last_third, 1),
        dev,
        last,
    )


def main():
    rows = [summary(r) for r in sys.argv[1:]]
    last = rows[0][-1]
    print(
        f"| balance | CV of expert load, steps 1-{last // 3} | CV, steps {2 * last // 3 + 1}-{last} "
        f"| first choices dropped, steps {2 * last // 3 + 1}-{last} | second choices dropped "
        "| dev loss |"
    )
    print("|---|---|---|---|---|---|")
    for b, c0, c1, d1, d2, dev, _ in rows:
        print(f"| {b} | {c0:.3f} | {c1:.3f} | {100 * d1:.2f} % | {100 * d2:.2f} % | {dev:.3f} |")


if __name__ == "__main__":
    main()
