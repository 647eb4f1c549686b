"""The SGLang bench row: ``py.sglang.batch_exists.ms`` — the HiCache backend's
``batch_exists`` of 1,024 pages (64 tokens each) held by a local ``kvtier serve``, against
one lookup of the same prompt (65,536 tokens, 1,024 blocks of 64 tokens) through the same
client in the same run: the least a "how much of this prompt is cached" question costs
over loopback. The per-page path it replaced (one lookup request per page) is printed
beside them.

Run with scripts/bench-sglang.sh [--json FILE]: an optimised build of the module and of
`kvtier serve`, and SGLang's host pools from scripts/setup.sh's overlay.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path.append(str(ROOT / ".venv" / "sglang-overlay"))
sys.path.append(str(ROOT / "crates" / "kvtier-py" / "tests" / "sglang" / "shims"))

import torch  # noqa: E402
from sglang.srt.mem_cache.device_pool_info import KVBufferLayout, KVBuffers, MHABufferInfo  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig, PoolName  # noqa: E402
from sglang.srt.mem_cache.pool_host import base  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402

import kvtier  # noqa: E402
from kvtier.sglang_hicache import KvtierHiCacheStorage, _words  # noqa: E402
from served import kvtier_serve  # noqa: E402

PAGES, PAGE, LAYERS, HEADS, DIM = 1024, 64, 2, 2, 8


def keys_of(tokens: list[int]) -> list[str]:
    keys, prev = [], b""
    for i in range(0, len(tokens), PAGE):
        h = hashlib.sha256(prev + struct.pack(f"<{PAGE}I", *tokens[i : i + PAGE]))
        prev = h.digest()
        keys.append(h.hexdigest())
    return keys


def pool() -> MHATokenToKVPoolHost:
    capacity = PAGES * PAGE
    k = tuple(torch.zeros(capacity, HEADS, DIM, dtype=torch.bfloat16) for _ in range(LAYERS))
    v = tuple(torch.zeros(capacity, HEADS, DIM, dtype=torch.bfloat16) for _ in range(LAYERS))

    def ptrs(ts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
        page_size=PAGE, head_num=HEADS, head_dim=DIM, v_head_dim=DIM,
        dtype=torch.bfloat16, device=torch.device("cpu"),
    )
    with base.host_memory_budget_scope(1 << 40):
        return MHATokenToKVPoolHost(
            info, 1.0, 0, PAGE, "page_first", pin_memory=False, device="cpu",
            device_capacity_tokens=capacity, start_layer=0, end_layer=LAYERS - 1,
        )


def median_ms(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def row(name: str, value: float, baseline: float, what: str) -> dict:
    ratio = value / baseline if baseline else 0.0
    print(f"{name:<28} {value:10.3f} ms   baseline {baseline:10.3f} ms   ratio {ratio:6.2f}  ({what})")
    return {"name": name, "value": value, "baseline": baseline, "ratio": ratio, "unit": "ms", "baseline_what": what}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--rounds", type=int, default=21)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, kvtier_serve(Path(tmp), "1GiB") as url:
        tokens = list(range(PAGES * PAGE))
        keys = keys_of(tokens)
        host = pool()
        idx = host.alloc(PAGES * PAGE)
        cfg = HiCacheStorageConfig(
            tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
            is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
            model_name="bench/model", extra_config={"interface_v1": 1, "url": url},
        )
        backend = KvtierHiCacheStorage(cfg)
        backend.register_mem_pool_host(host)
        assert backend.batch_set_v1(keys, idx) == [True] * PAGES
        assert backend.batch_exists(keys) == PAGES
        batch = median_ms(lambda: backend.batch_exists(keys), args.rounds)

        # The same prompt as one lookup: 1,024 blocks of 64 tokens, one request.
        kv = kvtier.Client(url)
        layout = kv.register_layout("bench/prompt", "bf16", PAGE, LAYERS, HEADS, DIM)
        payload = bytes(layout.block_bytes * PAGES)
        kv.store(layout, tokens, payload)
        assert kv.lookup(layout, tokens).blocks == PAGES
        one = median_ms(lambda: kv.lookup(layout, tokens), args.rounds)

        # What a lookup per page (the backend before batching) costs.
        pool_layout = backend._pool(PoolName.KV).layout
        words = [_words(k) for k in keys]
        per_page = median_ms(lambda: [kv.lookup(pool_layout, w) for w in words], max(3, args.rounds // 5))
        rows = [
            row("py.sglang.batch_exists.ms", batch, one,
                f"one lookup of the same prompt ({PAGES} blocks of {PAGE} tokens); a lookup per page took {per_page:.1f} ms"),
        ]
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
