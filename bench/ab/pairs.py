#!/usr/bin/env python3
"""Paired A/B of whole binaries or settings, for differences smaller than this VM's drift.

`abrun.sh` compares two code paths inside one process. This script compares things that
cannot share a process: two builds, or one build under two environment settings (a tuning
knob read from the environment while it is being measured). It runs one short
`gshard bench moe-layer` per configuration per round, alternating the order each round, so
every round's runs meet the same few seconds of the host's load. The median of the per-round
ratios (each configuration against the first) is the effect; the host's slow spells (minutes
long, 30-60 % on this VM) move both runs of a round together and cancel in the ratio.

Usage:
    bench/ab/pairs.py ROUNDS DEVICES 'LABEL=[VAR=VALUE ...] BINARY' ...

    bench/ab/pairs.py 40 8 'old=/tmp/gshard-old' 'new=target/release/gshard'
    bench/ab/pairs.py 40 8 'a=target/release/gshard' 'b=MY_KNOB=1 target/release/gshard'

Env: SHAPE (the `bench moe-layer` shape flags; default the small layer), STEPS (steps per
run, default 10). An A/A run of 40 rounds at 8 devices (one binary against itself) read a
paired median of 0.998; differences of ~2 % and more stand out at 40 rounds.

An effect can itself depend on the spell, not only scale with it: forbidding the row-sparse
GEMM path read 1.008-1.028 of the step in slow minutes (steps of 36-39 ms) and 1.075 in a
fast one (29 ms). So the paired median is also printed for the faster half of the rounds
and the rest (by the mean of each round's runs), when each has at least three rounds.
"""

import json
import os
import shlex
import statistics
import subprocess
import sys

SMALL = "--groups 32 --group-size 128 --experts 32 --model-dim 128 --hidden-dim 512 --capacity 4"


def parse(config):
    """`LABEL=[VAR=VALUE ...] BINARY` -> (label, env additions, binary)."""
    label, _, rest = config.partition("=")
    words = shlex.split(rest)
    env = {}
    while words and "=" in words[0]:
        key, _, value = words.pop(0).partition("=")
        env[key] = value
    if len(words) != 1 or not label:
        sys.exit(f"bad configuration {config!r}: want 'LABEL=[VAR=VALUE ...] BINARY'")
    return label, env, words[0]


def step_ms(binary, extra_env, devices, shape, steps):
    """Median step time of one `bench moe-layer` run, in ms."""
    cmd = [binary, "bench", "moe-layer", *shape, "--devices", devices, "--steps", steps, "--json"]
    out = subprocess.run(
        cmd, env={**os.environ, **extra_env}, capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout)["step_seconds"] * 1e3


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    rounds, devices = int(sys.argv[1]), sys.argv[2]
    if rounds < 1:
        sys.exit("ROUNDS must be at least 1")
    configs = [parse(c) for c in sys.argv[3:]]
    shape = os.environ.get("SHAPE", SMALL).split()
    steps = os.environ.get("STEPS", "10")
    times = {label: [] for label, _, _ in configs}
    for r in range(rounds):
        for label, env, binary in configs if r % 2 == 0 else configs[::-1]:
            times[label].append(step_ms(binary, env, devices, shape, steps))
    base = times[configs[0][0]]
    # A round's level: the mean of all its runs (not the first's alone, which would put
    # the rounds where the first happened to be slow, and so every ratio low, in one half).
    level = [statistics.mean(ts) for ts in zip(*times.values())]
    mid = statistics.median(level)
    for label, _, _ in configs:
        ratios = [t / b for t, b in zip(times[label], base)]
        fast = [q for q, v in zip(ratios, level) if v < mid]
        slow = [q for q, v in zip(ratios, level) if v >= mid]
        split = (
            f"  (rounds averaging under {mid:.1f} ms: {statistics.median(fast):.3f}, "
            f"the others: {statistics.median(slow):.3f})"
            if len(fast) >= 3 and len(slow) >= 3 and label != configs[0][0]
            else ""
        )
        print(
            f"{label:12s} median {statistics.median(times[label]):7.2f} ms  "
            f"min {min(times[label]):7.2f}  paired ratio to {configs[0][0]}: "
            f"median {statistics.median(ratios):.3f} mean {statistics.mean(ratios):.3f}{split}"
        )


if __name__ == "__main__":
    main()
