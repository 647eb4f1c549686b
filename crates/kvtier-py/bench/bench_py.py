"""The Python bench rows: loads and stores of 2 MiB (8 blocks of 256 KiB) through the
embedded engine from Python, each beside a numpy copy of the same bytes measured in the
same run (the best a Python caller does for those bytes: one memcpy between buffers it
already holds).

- py.load.2MiB.GBps: ``load_into`` a caller's buffer; baseline ``np.copyto`` of 2 MiB
  between two warm arrays.
- py.store.2MiB.GBps: ``store`` of 2 MiB from a caller's array, a new prompt each time
  (a repeated one is a duplicate and copies nothing), into an engine whose RAM is full (a
  cache's steady state: every store evicts). Baseline: the faster of ``np.copyto`` and
  a streaming (non-temporal) copy (``kvtier._kvtier.stream_copy``) of the same 2 MiB into
  a ring of arrays as large as the RAM budget — memory not in the CPU cache, where a
  store's bytes land: the best the machine does for those bytes. The warm-array copy of
  the load row is printed beside it.
- py.load.2MiB.GBps.t2: two Python threads loading at once, total; baseline one thread
  loading the same way in the same run. Target: 1.6x or more (the GIL is released
  during the copy).

Run with scripts/bench-py.sh [--json FILE] [--quick].
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import threading
import time

import numpy as np

import kvtier
from kvtier._kvtier import stream_copy

MIB = 1 << 20
BLOCKS = 8
TPB = 16


def per_call(fn, calls: int, rounds: int) -> list[float]:
    """Seconds per call of ``fn``, one figure per round of ``calls`` calls."""
    out = []
    for _ in range(rounds):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        out.append((time.perf_counter() - t) / calls)
    return out


def row(name: str, value: float, baseline: float, unit: str, what: str) -> dict:
    ratio = value / baseline if baseline else 0.0
    print(f"{name:<28} {value:10.3f} {unit}   baseline {baseline:10.3f} {unit}   ratio {ratio:6.3f}  ({what})")
    return {"name": name, "value": value, "baseline": baseline, "ratio": ratio, "unit": unit, "baseline_what": what}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    rounds, calls = (5, 20) if args.quick else (15, 100)
    rows = []
    ram = 256 * MIB
    with tempfile.TemporaryDirectory() as data_dir, kvtier.Engine(
        {"ram": "256MiB", "data_dir": data_dir, "ssd": {"enabled": False}}
    ) as kv:
        layout = kv.register_layout("py-bench", "f16", TPB, 8, 8, 64)  # 256 KiB blocks
        nbytes = BLOCKS * layout.block_bytes
        assert nbytes == 2 * MIB
        rng = np.random.default_rng(7)
        src = rng.integers(0, 256, nbytes, dtype=np.uint8)
        tokens = list(range(BLOCKS * TPB))
        kv.store(layout, tokens, src)
        hit = kv.lookup(layout, tokens)
        assert hit.blocks == BLOCKS
        out = np.ones(nbytes, dtype=np.uint8)
        dst = np.ones(nbytes, dtype=np.uint8)
        assert kv.load_into(hit, out) == BLOCKS and np.array_equal(out, src)

        def numpy_copy():
            np.copyto(dst, src)

        gbps = lambda secs: nbytes / secs / 1e9  # noqa: E731
        # Interleaved rounds: kvtier, numpy, kvtier, ... so drift hits both alike.
        load_s, copy_s = [], []
        for _ in range(rounds):
            load_s += per_call(lambda: kv.load_into(hit, out), calls, 1)
            copy_s += per_call(numpy_copy, calls, 1)
        load_gbps = gbps(statistics.median(load_s))
        copy_gbps = gbps(statistics.median(copy_s))
        rows.append(row("py.load.2MiB.GBps", load_gbps, copy_gbps, "GB/s", "np.copyto of the same 2 MiB between warm arrays"))

        # Two threads loading at once, each into its own buffer, for the same time.
        def loads_per_second(threads: int, seconds: float) -> float:
            counts = [0] * threads
            stop = threading.Event()

            def run(k):
                buf = np.ones(nbytes, dtype=np.uint8)
                while not stop.is_set():
                    if kv.load_into(hit, buf) != BLOCKS:
                        raise RuntimeError("a load came back short: the hit was evicted")
                    counts[k] += 1

            ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
            t0 = time.perf_counter()
            for t in ts:
                t.start()
            time.sleep(seconds)
            stop.set()
            for t in ts:
                t.join()
            return sum(counts) / (time.perf_counter() - t0)

        span = 0.5 if args.quick else 1.0
        one, two = [], []
        for _ in range(3 if args.quick else 7):
            one.append(loads_per_second(1, span) * nbytes / 1e9)
            two.append(loads_per_second(2, span) * nbytes / 1e9)
        rows.append(row("py.load.2MiB.GBps.t2", statistics.median(two), statistics.median(one), "GB/s", "the same loads from one thread, same run"))
        # Stores into a full RAM tier: first fill it (untimed).
        seed = 1_000

        def prompts(n: int) -> list[list[int]]:
            nonlocal seed
            out = [[(seed + i) * 100_003 + t for t in range(BLOCKS * TPB)] for i in range(n)]
            seed += n
            return out

        for p in prompts(ram // nbytes + 16):
            kv.store(layout, p, src)
        ring = [np.ones(nbytes, dtype=np.uint8) for _ in range(ram // nbytes)]
        at = 0

        def cold_copy():
            nonlocal at
            np.copyto(ring[at], src)
            at = (at + 1) % len(ring)

        def cold_stream_copy():
            nonlocal at
            stream_copy(ring[at], src)
            at = (at + 1) % len(ring)

        store_s, cold_s, stream_s = [], [], []
        for _ in range(rounds):
            batch = prompts(calls)
            t = time.perf_counter()
            for p in batch:
                kv.store(layout, p, src)
            store_s.append((time.perf_counter() - t) / calls)
            cold_s += per_call(cold_copy, calls, 1)
            stream_s += per_call(cold_stream_copy, calls, 1)
        best_s = min(statistics.median(cold_s), statistics.median(stream_s))
        assert kv.stats()["ram_evictions_budget"] > 0, "the stores never evicted: RAM was not full"
        rows.append(row("py.store.2MiB.GBps", gbps(statistics.median(store_s)), gbps(best_s), "GB/s", f"the faster of np.copyto ({gbps(statistics.median(cold_s)):.1f} GB/s) and a streaming copy ({gbps(statistics.median(stream_s)):.1f} GB/s) of the same 2 MiB into a ring of {ram // MIB} MiB of arrays (memory out of the CPU cache); into a warm array: {copy_gbps:.1f} GB/s"))

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
