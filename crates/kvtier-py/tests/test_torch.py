"""kvtier.torch with CPU tensors: blocks saved from and loaded into paged caches shaped as
vLLM's and SGLang's, byte-exact, in the block format the connectors use, through an
engine and through a server's shared arena."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kvtier  # noqa: E402
import kvtier.torch as kt  # noqa: E402
from serve import Server  # noqa: E402

BS, HEADS, DIM, LAYERS = 16, 2, 64, 4


def tokens(seed, blocks):
    return [(seed * 1_000_003 + t) % (1 << 31) for t in range(blocks * BS)]


def vllm_caches(pages, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(pages, 2, BS, HEADS, DIM, generator=g).to(torch.bfloat16) for _ in range(LAYERS)]


def block_bytes_of(paged, page):
    """A block as the connectors store it: every layer's page, layer after layer."""
    return b"".join(t[page].contiguous().view(torch.uint8).numpy().tobytes() for layer in paged.layers for t in layer)


@pytest.fixture(params=["engine", "shared-arena"])
def cache(request, tmp_path):
    if request.param == "engine":
        c = kvtier.Engine({"ram": "64MiB", "ssd": {"enabled": False}})
        yield c
        c.close()
    else:
        s = Server(tmp_path / "data", "--set", "ssd.enabled=false", "--set", "shm.enabled=true")
        c = kvtier.Client(s.url, shm=tmp_path / "data" / "kvtier.sock")
        yield c
        c.close()
        s.stop()


def test_vllm_shaped_pages_round_trip_byte_exact(cache):
    layout = cache.register_layout("kt-vllm", "bf16", BS, LAYERS, HEADS, DIM)
    source = kt.PagedCache.vllm(vllm_caches(8, 1))
    assert source.block_bytes == layout.block_bytes
    toks = tokens(1, 3)
    saving = kt.save_from(cache, layout, toks, source, [5, 2, 7])
    assert saving.result(timeout=30)["stored"] == 3
    # The blocks are in the connectors' format: layer after layer, each layer's page.
    hit = cache.lookup(layout, toks)
    assert hit.blocks == 3
    assert [b.tobytes() for b in cache.load(hit)] == [block_bytes_of(source, p) for p in (5, 2, 7)]

    target = kt.PagedCache.vllm([torch.zeros_like(t) for (t,) in source.layers])
    loading = kt.load_to(cache, hit, target, [0, 3, 1])
    assert loading.blocks == 3
    for i in range(LAYERS):
        loading.wait_layer(i)
    loading.synchronize()
    for dst, src in ((0, 5), (3, 2), (1, 7)):
        for (t,), (s,) in zip(target.layers, source.layers):
            assert torch.equal(t[dst], s[src])
    untouched = [p for p in range(8) if p not in (0, 3, 1)]
    assert all(torch.count_nonzero(t[untouched]) == 0 for (t,) in target.layers)


def test_sglang_shaped_pages_round_trip_byte_exact(cache):
    layout = cache.register_layout("kt-sglang", "f16", BS, LAYERS, HEADS, DIM)
    g = torch.Generator().manual_seed(2)
    k = [torch.randn(6 * BS, HEADS, DIM, generator=g).half() for _ in range(LAYERS)]
    v = [torch.randn(6 * BS, HEADS, DIM, generator=g).half() for _ in range(LAYERS)]
    source = kt.PagedCache.sglang(k, v, BS)
    assert source.block_bytes == layout.block_bytes
    toks = tokens(2, 2)
    assert kt.save_from(cache, layout, toks, source, [4, 1]).result(timeout=30)["stored"] == 2
    k2 = [torch.zeros_like(t) for t in k]
    v2 = [torch.zeros_like(t) for t in v]
    target = kt.PagedCache.sglang(k2, v2, BS)
    hit = cache.lookup(layout, toks)
    kt.load_to(cache, hit, target, [2, 5]).synchronize()
    for layer in range(LAYERS):
        assert torch.equal(k2[layer][2 * BS : 3 * BS], k[layer][4 * BS : 5 * BS])
        assert torch.equal(v2[layer][5 * BS : 6 * BS], v[layer][1 * BS : 2 * BS])


def test_a_save_takes_the_pages_as_they_were_and_parts_of_a_prompt_follow_on(cache):
    layout = cache.register_layout("kt-order", "bf16", BS, LAYERS, HEADS, DIM)
    caches = vllm_caches(4, 3)
    paged = kt.PagedCache.vllm(caches)
    before = [block_bytes_of(paged, p) for p in (0, 1)]
    toks = tokens(3, 3)
    saving = kt.save_from(cache, layout, toks, paged, [0, 1])
    for t in caches:
        t.zero_()  # the engine reuses its pages right after
    assert saving.result(timeout=30)["stored"] == 2
    hit = cache.lookup(layout, toks)
    assert [b.tobytes() for b in cache.load(hit)] == before
    # The third block, saved later, from its own page.
    caches[0][3].fill_(1.0)
    third = kt.save_from(cache, layout, toks, paged, [3], first_block=2).result(timeout=30)
    assert third["stored"] == 1
    assert cache.lookup(layout, toks).blocks == 3


def test_lost_blocks_and_wrong_shapes(cache):
    layout = cache.register_layout("kt-bad", "bf16", BS, LAYERS, HEADS, DIM)
    paged = kt.PagedCache.vllm(vllm_caches(4, 4))
    wrong = kt.PagedCache.vllm(vllm_caches(4, 4)[:2])
    with pytest.raises(kvtier.InvalidError, match="bytes"):
        kt.save_from(cache, layout, tokens(4, 1), wrong, [0])
    assert kt.save_from(cache, layout, tokens(4, 2), paged, [0, 1]).result(timeout=30)["stored"] == 2
    hit = cache.lookup(layout, tokens(4, 2))
    with pytest.raises(kvtier.InvalidError, match="bytes"):
        kt.load_to(cache, hit, wrong, [0, 1])
    # Fewer pages than blocks: only those are filled.
    assert kt.load_to(cache, hit, paged, [3]).blocks == 1
    with pytest.raises(kvtier.InvalidError):
        kt.PagedCache(())
    assert kt.register(cache) is False or torch.cuda.is_available()


def test_the_gpu_check_runs_on_cpu_tensors_and_checks_its_bytes(tmp_path):
    """scripts/gpu-check.sh's measurement code, on CPU tensors at a small size: it must run
    end to end (engine and a served shared arena) and find every byte it moved intact."""
    import os
    import subprocess
    import sys

    from serve import ROOT, kvtier_binary

    env = dict(os.environ, KVTIER_BIN=kvtier_binary(), PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gpu_check.py"), "--cpu", "--json", str(tmp_path / "rows.json")],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every byte checked" in done.stdout
    import json

    names = {r["name"] for r in json.loads((tmp_path / "rows.json").read_text())}
    assert names == {"limit.h2d", "limit.d2h", "load.embedded", "load.served", "save.embedded", "hidden.share", "store.py"}
