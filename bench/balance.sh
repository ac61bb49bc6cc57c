#!/usr/bin/env bash
# The README's load-balancing table: the main job's earlier settings (bench/rows32.toml: width
# 64 on 8 devices, 64 rows of 32 tokens) trained with GShard's auxiliary loss and
# with DeepSeek-V3's auxiliary-loss-free bias balancing (model.balance = "bias",
# bias_rate = 0.001), STEPS steps each on the same corpus and seed
# (crates/train/examples/balance.rs, trainer::run as `gshard train` calls it), then the
# table from their metrics (bench/balance_table.py). Knobs: STEPS (300), DATA (data, the
# default corpus: `gshard data` builds it), OUT (runs/balance).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-300}
DATA=${DATA:-data}
OUT=${OUT:-runs/balance}
cargo run --release -p train --example balance -- "$DATA" "$STEPS" "$OUT"
python3 bench/balance_table.py "$OUT/aux_loss" "$OUT/bias"
