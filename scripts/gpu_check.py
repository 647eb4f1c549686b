"""The GPU check (issue 37): kvtier's path between its RAM tier and an engine's paged GPU
cache, each figure beside the machine's own limit measured in the same run, every byte
moved checked. Run by scripts/gpu-check.sh; `--cpu` runs the same code on CPU tensors at
a small size (a smoke test of the check itself, which CI runs; its figures mean nothing).

Rows (GB/s unless named otherwise; medians of the repeats):
  limit.h2d / limit.d2h        pinned host <-> GPU copy of the whole prompt, one region
  load.embedded                arena -> paged GPU cache (kvtier.torch.load_to), an engine here
  load.served                  the same from a local `kvtier serve`'s shared arena
  save.embedded                paged GPU cache -> arena (save_from, until committed)
  hidden.share                 share of the load's time hidden behind per-layer compute
  store.py                     numpy -> warm arena (Cache.store) vs np.copyto of the same bytes
  e2e.hf.*                     a transformers model's time to first token on a hit vs its floor
                               (scripts/gpu_check_hf.py; skipped with --no-e2e or without transformers)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

import kvtier
import kvtier.torch as kt

ROOT = Path(__file__).resolve().parents[1]


def median_of(repeats: int, f: Callable[[], float]) -> float:
    return statistics.median(f() for _ in range(repeats))


def row(name: str, value: float, baseline: float, unit: str = "GB/s", what: str = "") -> dict[str, Any]:
    ratio = value / baseline if baseline else float("nan")
    print(f"{name:<22} {value:10.3f} {unit:<5} baseline {baseline:10.3f} {unit:<5} ratio {ratio:6.3f}  {what}", flush=True)
    return {"name": name, "value": value, "baseline": baseline, "ratio": ratio, "unit": unit}


class Sync:
    """Waits for the device's queued work (no-op on the CPU)."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"

    def __call__(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()


def timed(sync: Sync, f: Callable[[], object]) -> float:
    sync()
    t = time.perf_counter()
    f()
    sync()
    return time.perf_counter() - t


def start_server(data: Path, ram: str) -> tuple[subprocess.Popen[str], str, Path]:
    binary = os.environ.get("KVTIER_BIN") or str(ROOT / "target" / "release" / "kvtier")
    if not os.access(binary, os.X_OK):
        binary = shutil.which("kvtier") or binary
    proc = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data), "--ram", ram,
         "--set", "ssd.enabled=false", "--set", "ram_prefault=true", "--set", "shm.enabled=true",
         "--set", "shm.staging=1GiB", "--set", f"shm.max_leased={ram}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"listening on (http://\S+)", line)
        if found:
            return proc, found.group(1), data / "kvtier.sock"
    proc.kill()
    raise RuntimeError(f"kvtier serve did not start: {proc.stderr.read() if proc.stderr else ''}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu", action="store_true", help="run on CPU tensors at a small size (smoke test)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    parser.add_argument("--no-e2e", action="store_true", help="skip the transformers end-to-end rows")
    args = parser.parse_args()

    if args.cpu:
        device = torch.device("cpu")
        layers, heads, dim, tpb, blocks, repeats = 4, 2, 64, 16, 8, 2
    else:
        if not torch.cuda.is_available():
            print("gpu-check: no CUDA device (torch.cuda.is_available() is false); --cpu runs the smoke test", file=sys.stderr)
            return 2
        device = torch.device("cuda")
        # The prompt: 8,192 tokens of a Llama-3-8B-shaped layout, 2 MiB blocks, 1 GiB.
        layers, heads, dim, tpb, blocks, repeats = 32, 8, 128, 16, 512, args.repeats
        print(f"gpu-check on {torch.cuda.get_device_name()} (torch {torch.__version__})")
    sync = Sync(device)
    page_shape = (2, tpb, heads, dim)
    block_bytes = layers * 2 * tpb * heads * dim * 2
    total = blocks * block_bytes
    ram = f"{max(3 * total, 64 << 20) >> 20}MiB"
    rows: list[dict[str, Any]] = []
    failures: list[str] = []

    # The limits: one pinned region of the prompt's size, to and from the device.
    host = torch.empty(total, dtype=torch.uint8, pin_memory=device.type == "cuda")
    host.copy_(torch.randint(0, 256, (total,), dtype=torch.uint8))
    dev = torch.empty(total, dtype=torch.uint8, device=device)
    h2d = total / median_of(repeats, lambda: timed(sync, lambda: dev.copy_(host, non_blocking=True))) / 1e9
    d2h = total / median_of(repeats, lambda: timed(sync, lambda: host.copy_(dev, non_blocking=True))) / 1e9
    rows.append(row("limit.h2d", h2d, h2d, what="pinned host -> device, one region"))
    rows.append(row("limit.d2h", d2h, d2h, what="device -> pinned host, one region"))
    del dev

    # The engine's pages: a vLLM-shaped cache with room for the prompt twice.
    def paged_cache(seed: int) -> kt.PagedCache:
        g = torch.Generator(device=device).manual_seed(seed)
        return kt.PagedCache.vllm([
            torch.randint(-100, 100, (2 * blocks, *page_shape), generator=g, device=device, dtype=torch.int16).view(torch.bfloat16)
            for _ in range(layers)
        ])

    source = paged_cache(1)
    ids = list(range(blocks))
    targets = list(range(blocks, 2 * blocks))
    tokens = list(range(blocks * tpb))

    def check(target: kt.PagedCache, what: str) -> None:
        for (s,), (t,) in zip(source.layers, target.layers):
            # As integers: random bits include NaN patterns, which never compare equal.
            if not torch.equal(t[blocks:].view(torch.int16), s[:blocks].view(torch.int16)):
                failures.append(f"{what}: the loaded pages differ from the saved ones")
                return

    def through(cache: kvtier.Cache, name: str) -> None:
        kt.register(cache)
        layout = cache.register_layout("gpu-check", "bf16", tpb, layers, heads, dim)
        assert layout.block_bytes == block_bytes
        answer = kt.save_from(cache, layout, tokens, source, ids).result(timeout=600)
        if answer["stored"] + answer["duplicates"] != blocks:
            failures.append(f"{name}: stored {answer}")
        hit = cache.lookup(layout, tokens)
        target = paged_cache(2)

        def load() -> None:
            loading = kt.load_to(cache, hit, target, targets)
            loading.synchronize()
            if loading.blocks != blocks:
                failures.append(f"{name}: {loading.blocks} of {blocks} blocks loaded")

        secs = median_of(repeats, lambda: timed(sync, load))
        check(target, f"load.{name}")
        rows.append(row(f"load.{name}", total / secs / 1e9, h2d, what="arena -> paged device cache vs pinned H2D"))

    with tempfile.TemporaryDirectory() as tmp:
        engine = kvtier.Engine({"ram": ram, "ram_prefault": True, "ssd": {"enabled": False}})
        try:
            through(engine, "embedded")
            layout = engine.register_layout("gpu-check-save", "bf16", tpb, layers, heads, dim)

            def save() -> None:
                # A new prompt each time: every block is stored, none a duplicate.
                save.n = getattr(save, "n", 0) + 1  # type: ignore[attr-defined]
                toks = [t + save.n * 10_000_000 for t in tokens]  # type: ignore[attr-defined]
                answer = kt.save_from(engine, layout, toks, source, ids).result(timeout=600)
                if answer["stored"] != blocks:
                    failures.append(f"save.embedded: stored {answer['stored']} of {blocks}")

            secs = median_of(repeats, lambda: timed(sync, save))
            rows.append(row("save.embedded", total / secs / 1e9, d2h, what="paged device cache -> arena, committed, vs pinned D2H"))

            # Per-layer compute beside a layer-by-layer load: the share of the load hidden.
            hit = engine.lookup(engine.register_layout("gpu-check", "bf16", tpb, layers, heads, dim), tokens)
            target = paged_cache(3)
            load_secs = median_of(repeats, lambda: timed(sync, lambda: kt.load_to(engine, hit, target, targets).synchronize()))
            side = 256 if args.cpu else 4096
            a = torch.randn(side, side, device=device)
            per_layer = load_secs / layers
            one = timed(sync, lambda: a @ a)
            reps = max(1, round(per_layer / max(one, 1e-6)))

            def compute(loading: kt.Loading | None) -> None:
                for i in range(layers):
                    if loading is not None:
                        loading.wait_layer(i)
                    for _ in range(reps):
                        a @ a
                if loading is not None:
                    loading.synchronize()

            compute_secs = median_of(repeats, lambda: timed(sync, lambda: compute(None)))
            both = median_of(repeats, lambda: timed(sync, lambda: compute(kt.load_to(engine, hit, target, targets))))
            check(target, "hidden")
            hidden = max(0.0, min(1.0, (load_secs + compute_secs - both) / load_secs))
            rows.append(row("hidden.share", hidden, 1.0, unit="share", what=f"load {load_secs * 1e3:.1f} ms, compute {compute_secs * 1e3:.1f} ms, both {both * 1e3:.1f} ms"))

            # Stores into a warm arena from Python against a copy of the same bytes.
            data = np.random.default_rng(5).integers(0, 256, total, dtype=np.uint8)
            ring = [np.empty_like(data) for _ in range(2)]
            for r in ring:
                np.copyto(r, data)
            copy = median_of(repeats, lambda: timed(sync, lambda: np.copyto(ring[0], data)))

            def store() -> None:
                store.n = getattr(store, "n", 0) + 1  # type: ignore[attr-defined]
                toks = [t + store.n * 20_000_000 for t in tokens]  # type: ignore[attr-defined]
                engine.store(layout, toks, data)

            store()  # warms the arena's slots
            secs = median_of(repeats, lambda: timed(sync, store))
            rows.append(row("store.py", total / secs / 1e9, total / copy / 1e9, what="numpy -> warm arena vs np.copyto"))
        finally:
            engine.close()

        proc, url, socket = start_server(Path(tmp) / "data", ram)
        try:
            client = kvtier.Client(url, shm=socket)
            through(client, "served")
            client.close()
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()

    if not args.no_e2e:
        try:
            import gpu_check_hf
        except ImportError as e:
            print(f"gpu-check: no end-to-end rows ({e})", file=sys.stderr)
        else:
            gpu_check_hf.hf_rows(
                device, args.cpu, repeats, h2d, lambda f: timed(sync, f), median_of, row, start_server, rows, failures
            )

    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    for f in failures:
        print(f"gpu-check: FAILED: {f}", file=sys.stderr)
    print("gpu-check: every byte checked" if not failures else f"gpu-check: {len(failures)} failures")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
