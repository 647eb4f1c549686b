"""kvtier as SGLang's HiCache storage backend, against SGLang 0.5.23's real host pools on
the CPU: pages an SGLang host pool writes through the backend come back byte-identical
into another pool (zero-copy v1, both memory layouts, through a real `kvtier serve` and an
embedded engine); Mamba states travel through the v2 calls with the KV pages and are
restorable only where both are held; bad keys, short index lists, other deployments,
other tenants and damaged objects are misses. SGLang's own factory loads the backend."""

from __future__ import annotations

import hashlib
import re
import struct
import urllib.request
from pathlib import Path

import pytest
import torch
from sglang.srt.mem_cache.device_pool_info import (
    KVBufferLayout,
    KVBuffers,
    MambaStateBufferInfo,
    MHABufferInfo,
)
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
)
from sglang.srt.mem_cache.pool_host import base
from sglang.srt.mem_cache.pool_host.mamba import MambaPoolHost
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

import kvtier
from kvtier.sglang_hicache import KvtierHiCacheStorage
from serve import Server

LAYERS, HEADS, DIM, PAGE = 2, 2, 8, 4
CAPACITY = 64  # device tokens; host pools hold twice that


def keys_of(tokens: list[int], salt: bytes = b"") -> list[str]:
    """SGLang's page keys: SHA-256 chained over pages of little-endian u32 token ids."""
    keys, prev = [], salt
    for i in range(0, len(tokens) - len(tokens) % PAGE, PAGE):
        h = hashlib.sha256(prev + struct.pack(f"<{PAGE}I", *tokens[i : i + PAGE]))
        prev = h.digest()
        keys.append(h.hexdigest())
    return keys


def kv_pool(layout: str, dim: int = DIM) -> MHATokenToKVPoolHost:
    k = tuple(torch.zeros(CAPACITY, HEADS, dim, dtype=torch.bfloat16) for _ in range(LAYERS))
    v = tuple(torch.zeros(CAPACITY, HEADS, dim, dtype=torch.bfloat16) for _ in range(LAYERS))

    def ptrs(ts: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return torch.tensor([t.data_ptr() for t in ts], dtype=torch.uint64)

    info = MHABufferInfo(
        buffers=KVBuffers(k=k, v=v, k_data_ptrs=ptrs(k), v_data_ptrs=ptrs(v), layout=KVBufferLayout.NHD),
        page_size=PAGE,
        head_num=HEADS,
        head_dim=dim,
        v_head_dim=dim,
        dtype=torch.bfloat16,
        device=torch.device("cpu"),
    )
    with base.host_memory_budget_scope(1 << 40):
        return MHATokenToKVPoolHost(
            info, 2.0, 0, PAGE, layout, pin_memory=False, device="cpu",
            device_capacity_tokens=CAPACITY, start_layer=0, end_layer=LAYERS - 1,
        )


def mamba_pool() -> MambaPoolHost:
    info = MambaStateBufferInfo(temporal=torch.zeros(3, 9, 4, 5), conv=(torch.zeros(3, 9, 6),))
    with base.host_memory_budget_scope(1 << 40):
        return MambaPoolHost(
            info, 2.0, 0, device_capacity=8, pin_memory=False, device="cpu", layout="page_first"
        )


def fill(pool, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    buffers = pool.kv_buffer if isinstance(pool.kv_buffer, list) else [pool.kv_buffer]
    for b in buffers:
        b.copy_(torch.rand(b.shape, generator=g).to(b.dtype))


def pages(pool, indices: torch.Tensor, per_page: int) -> list[bytes]:
    return [bytes(pool.get_data_page(int(indices[i]), flat=True).view(torch.uint8).numpy())
            for i in range(0, len(indices), per_page)]


def config(model: str = "org/model", tp_rank: int = 0, **extra) -> HiCacheStorageConfig:
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=2, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
        is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=True,
        model_name=model, extra_config={"interface_v1": 1, **extra},
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = Server(tmp_path_factory.mktemp("sglang") / "data", "--set", "ssd.enabled=false")
    yield s
    s.stop()


def backend(pool, url: str, **kw) -> KvtierHiCacheStorage:
    b = KvtierHiCacheStorage(config(url=url, **kw))
    b.register_mem_pool_host(pool)
    return b


TOKENS = list(range(1000, 1000 + 6 * PAGE))


@pytest.mark.parametrize("layout", ["page_first", "layer_first"])
def test_pages_come_back_byte_identical_into_another_pool(server, layout):
    keys = keys_of(TOKENS, salt=layout.encode())
    a = kv_pool(layout)
    fill(a, 1)
    a_idx = a.alloc(len(keys) * PAGE)
    writer = backend(a, server.url)
    assert writer.batch_exists(keys) == 0
    assert writer.batch_set_v1(keys, a_idx) == [True] * len(keys)
    assert writer.batch_exists(keys) == len(keys)
    assert writer.batch_set_v1(keys, a_idx) == [True] * len(keys)  # idempotent

    b = kv_pool(layout)
    b.alloc(3 * PAGE)  # other slots than the writer's
    b_idx = b.alloc(len(keys) * PAGE)
    reader = backend(b, server.url)
    assert reader.batch_get_v1(keys, b_idx) == [True] * len(keys)
    assert pages(b, b_idx, PAGE) == pages(a, a_idx, PAGE)
    assert any(any(p) for p in pages(b, b_idx, PAGE))


def requests_by_endpoint(url: str) -> dict[str, int]:
    """The server's answered requests per endpoint, from its /metrics."""
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as r:
        text = r.read().decode()
    out: dict[str, int] = {}
    for m in re.finditer(r'^kvtier_request_duration_seconds_count\{endpoint="([^"]+)",status="[^"]+"\} (\d+)', text, re.M):
        out[m.group(1)] = out.get(m.group(1), 0) + int(m.group(2))
    return out


def test_a_batch_of_pages_is_one_request_per_call(server):
    keys = keys_of(list(range(5000, 5000 + 32 * PAGE)), salt=b"batch")
    a = kv_pool("page_first")
    fill(a, 9)
    idx = a.alloc(len(keys) * PAGE)
    w = backend(a, server.url)
    before = requests_by_endpoint(server.url)
    # Half the pages first, then all: the set stores only those kvtier lacks.
    assert w.batch_set_v1(keys[:16], idx[: 16 * PAGE]) == [True] * 16
    assert w.batch_set_v1(keys, idx) == [True] * len(keys)
    assert w.batch_exists(keys) == len(keys)
    b = kv_pool("page_first")
    b_idx = b.alloc(len(keys) * PAGE)
    assert backend(b, server.url).batch_get_v1(keys, b_idx) == [True] * len(keys)
    assert pages(b, b_idx, PAGE) == pages(a, idx, PAGE)
    after = requests_by_endpoint(server.url)
    made = {
        e: after[e] - before.get(e, 0)
        for e in after
        if after[e] != before.get(e, 0) and e.startswith("/v1/") and e != "/v1/layouts"
    }
    # Two sets (a lookup and a store each), one exists, one get (a lookup and a load):
    # 32 pages each, and never a request per page (the reader's layout registration
    # aside).
    assert made == {"/v1/lookup/batch": 4, "/v1/store/batch": 2, "/v1/load": 1}, made
    # A page missing in the middle: the leading ones only.
    holey = keys[:5] + keys_of(list(range(9000, 9000 + PAGE)), salt=b"none") + keys[6:]
    c = kv_pool("page_first")
    c_idx = c.alloc(len(holey) * PAGE)
    assert w.batch_exists(holey) == 5
    assert backend(c, server.url).batch_get_v1(holey, c_idx) == [True] * 5 + [False] * (len(holey) - 5)


def test_the_generic_flat_page_path_round_trips(server):
    keys = keys_of(TOKENS, salt=b"flat")
    a = kv_pool("page_first")
    fill(a, 2)
    idx = a.alloc(len(keys) * PAGE)
    cfg = config(url=server.url)
    cfg.extra_config.pop("interface_v1")
    b = KvtierHiCacheStorage(cfg)
    b.register_mem_pool_host(a)
    flat = [a.get_data_page(int(idx[i * PAGE]), flat=True) for i in range(len(keys))]
    assert b.batch_set(keys, flat)
    assert b.exists(keys[0]) and b.batch_exists(keys) == len(keys)
    got = b.batch_get(keys, [a.get_dummy_flat_data_page() for _ in keys])
    assert all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) for x, y in zip(got, flat))
    # Flat pages and v1 pages order bytes differently: neither serves the other.
    assert backend(a, server.url).batch_exists(keys) == 0


def test_bad_keys_short_index_lists_and_other_deployments_are_misses(server):
    keys = keys_of(TOKENS, salt=b"bad")
    a = kv_pool("page_first")
    fill(a, 3)
    idx = a.alloc(len(keys) * PAGE)
    w = backend(a, server.url)
    assert w.batch_set_v1(keys, idx) == [True] * len(keys)

    bad = keys[:2] + ["not-a-key", keys[2].upper()] + keys[3:]
    assert w.batch_exists(bad) == 2
    b = kv_pool("page_first")
    b_idx = b.alloc(len(bad) * PAGE)
    assert w.batch_get_v1(bad, b_idx) == [True, True] + [False] * (len(bad) - 2)
    assert w.batch_set_v1(["zz" * 32], idx[:PAGE]) == [False]

    # Fewer host slots than pages: nothing is read or written.
    c = kv_pool("page_first")
    c_idx = c.alloc(len(keys) * PAGE)
    assert w.batch_get_v1(keys, c_idx[:-1]) == [False] * len(keys)
    assert not any(any(p) for p in pages(c, c_idx, PAGE))

    # Another model, another tensor-parallel rank, another tenant, another head size,
    # another memory layout: other layouts, so misses.
    assert backend(a, server.url, tenant="other").batch_exists(keys) == 0
    # (with a pool registered: a backend without one answers 0 for anything)
    other_model = KvtierHiCacheStorage(config("org/other", url=server.url))
    other_model.register_mem_pool_host(a)
    assert other_model.batch_exists(keys) == 0
    same_model = KvtierHiCacheStorage(config(url=server.url))
    same_model.register_mem_pool_host(a)
    assert same_model.batch_exists(keys) == len(keys), "the control: the writer's model hits"
    other_rank = KvtierHiCacheStorage(config(tp_rank=1, url=server.url))
    other_rank.register_mem_pool_host(a)
    assert other_rank.batch_exists(keys) == 0
    assert backend(kv_pool("page_first", dim=16), server.url).batch_exists(keys) == 0
    assert backend(kv_pool("layer_first"), server.url).batch_exists(keys) == 0
    # Allowing fp8 in the cold tiers is another layout too (ADR 0021), and the deployment
    # that allows it is served its own pages.
    fp8 = backend(a, server.url, cold_codec="fp8_e4m3")
    assert fp8.batch_exists(keys) == 0
    assert fp8.batch_set_v1(keys, idx) == [True] * len(keys)
    assert backend(a, server.url, cold_codec="fp8_e4m3").batch_exists(keys) == len(keys)
    with pytest.raises(kvtier.InvalidError, match="cold_codec"):
        KvtierHiCacheStorage(config(url=server.url, cold_codec="int4"))


def test_mamba_states_travel_with_the_kv_pages_through_the_v2_calls(server):
    keys = keys_of(TOKENS, salt=b"hybrid")
    kv_a, m_a = kv_pool("page_first"), mamba_pool()
    fill(kv_a, 4)
    fill(m_a, 5)
    kv_idx, m_idx = kv_a.alloc(len(keys) * PAGE), m_a.alloc(1)
    w = KvtierHiCacheStorage(config(url=server.url))
    w.register_mem_pool_host(kv_a)
    w.register_mem_host_pool_v2(kv_a, PoolName.KV)
    w.register_mem_host_pool_v2(m_a, PoolName.MAMBA)
    trailing = [PoolTransfer(name=PoolName.MAMBA, keys=[keys[0]], hit_policy=PoolHitPolicy.TRAILING_PAGES)]

    # KV without the state: nothing is restorable.
    assert w.batch_set_v1(keys, kv_idx) == [True] * len(keys)
    none = w.batch_exists_v2(keys, trailing)
    assert none.kv_hit_pages == 0 and none.restorable_prefix_pages == []

    # The state checkpointed after page 4: a prefix of exactly 4 pages can be restored.
    stored = w.batch_set_v2(
        [PoolTransfer(name=PoolName.MAMBA, host_indices=m_idx, keys=[keys[3]],
                      hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    )
    assert stored == {PoolName.MAMBA: [True]}
    found = w.batch_exists_v2(keys, trailing)
    assert found.kv_hit_pages == 4 and found.restorable_prefix_pages == [4]
    assert found.extra_pool_hit_pages[PoolName.MAMBA] == 4

    # Another process's pools get the same bytes.
    kv_b, m_b = kv_pool("page_first"), mamba_pool()
    m_b.alloc(2)
    m_b_idx = m_b.alloc(1)
    r = KvtierHiCacheStorage(config(url=server.url))
    r.register_mem_pool_host(kv_b)
    r.register_mem_host_pool_v2(m_b, PoolName.MAMBA)
    got = r.batch_get_v2(
        [PoolTransfer(name=PoolName.MAMBA, host_indices=m_b_idx, keys=[keys[3]],
                      hit_policy=PoolHitPolicy.TRAILING_PAGES)]
    )
    assert got == {PoolName.MAMBA: [True]}
    assert pages(m_b, m_b_idx, 1) == pages(m_a, m_idx, 1)
    # A key with no state, and a short index list, are misses.
    assert r.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=m_b_idx, keys=[keys[2]])]) == {
        PoolName.MAMBA: [False]
    }
    assert r.batch_get_v2([PoolTransfer(name=PoolName.MAMBA, host_indices=m_b_idx[:0], keys=[keys[3]])]) == {
        PoolName.MAMBA: [False]
    }


def test_damaged_objects_on_the_ssd_are_misses(tmp_path: Path):
    keys = keys_of(TOKENS, salt=b"ssd")
    settings = {"ram": "64MiB", "data_dir": str(tmp_path), "ssd": {"min_free": "0B"}}
    a = kv_pool("page_first")
    fill(a, 6)
    idx = a.alloc(len(keys) * PAGE)
    w = backend_embedded(a, settings)
    assert w.batch_set_v1(keys, idx) == [True] * len(keys)
    w.close()

    # Intact, a new engine on the same directory serves every page from the SSD.
    b = kv_pool("page_first")
    b_idx = b.alloc(len(keys) * PAGE)
    r = backend_embedded(b, settings)
    assert r.batch_get_v1(keys, b_idx) == [True] * len(keys)
    assert pages(b, b_idx, PAGE) == pages(a, idx, PAGE)
    r.close()

    # Every byte of page data flipped on disk: the pages still look held (memory only),
    # but no damaged byte reaches the pool.
    segments = [p for p in tmp_path.rglob("*") if p.is_file() and p.stat().st_size > 4096]
    assert segments, list(tmp_path.rglob("*"))
    marker = pages(a, idx, PAGE)[0][:64]
    flipped = 0
    for seg in segments:
        data = bytearray(seg.read_bytes())
        at = data.find(marker)
        while at >= 0:
            data[at + 8] ^= 0xFF
            flipped += 1
            at = data.find(marker, at + 1)
        seg.write_bytes(bytes(data))
    assert flipped >= 1
    c = kv_pool("page_first")
    c_idx = c.alloc(len(keys) * PAGE)
    r = backend_embedded(c, settings)
    got = r.batch_get_v1(keys, c_idx)
    assert got[0] is False
    assert not any(pages(c, c_idx, PAGE)[0]), "a damaged page reached the pool"
    r.close()


def backend_embedded(pool, settings) -> KvtierHiCacheStorage:
    b = KvtierHiCacheStorage(config(engine=settings))
    b.register_mem_pool_host(pool)
    return b


def test_sglangs_factory_loads_the_backend_by_module_path(server):
    cfg = config(
        url=server.url,
        backend_name="kvtier",
        module_path="kvtier.sglang_hicache",
        class_name="KvtierHiCacheStorage",
    )
    pool = kv_pool("page_first")
    made = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    inner = getattr(made, "_backend", made)
    assert isinstance(inner, KvtierHiCacheStorage)
    made.register_mem_pool_host(pool)
    assert made.batch_exists(keys_of(TOKENS, salt=b"factory")) == 0
