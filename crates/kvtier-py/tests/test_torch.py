"""kvtier.torch with CPU tensors: blocks saved from and loaded into paged caches shaped as
vLLM's and SGLang's, byte-exact, in the block format the connectors use, through an
engine, through a server's shared arena and through a server over HTTP."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import kvtier  # noqa: E402
import kvtier.torch as kt  # noqa: E402
from serve import Server, cache_of  # noqa: E402

BS, HEADS, DIM, LAYERS = 16, 2, 64, 4


def tokens(seed, blocks):
    return [(seed * 1_000_003 + t) % (1 << 31) for t in range(blocks * BS)]


def vllm_caches(pages, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(pages, 2, BS, HEADS, DIM, generator=g).to(torch.bfloat16) for _ in range(LAYERS)]


def block_bytes_of(paged, page):
    """A block as the connectors store it: every layer's page, layer after layer."""
    return b"".join(t[page].contiguous().view(torch.uint8).numpy().tobytes() for layer in paged.layers for t in layer)


@pytest.fixture(params=["engine", "shared-arena", "http"])
def cache(request, tmp_path):
    with cache_of(request.param, tmp_path / "data") as c:
        yield c


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
    assert all(loading.wait_layer(i, timeout=30) for i in range(LAYERS))
    loading.synchronize()
    assert loading.blocks == 3
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
    # The third block, saved later, from its own page (over HTTP a store starts at the
    # prompt's first block).
    caches[0][3].fill_(1.0)
    if cache.arena is None:
        with pytest.raises(kvtier.InvalidError, match="first block"):
            kt.save_from(cache, layout, toks, paged, [3], first_block=2)
        third = kt.save_from(cache, layout, toks, paged, [0, 1, 3]).result(timeout=30)
        assert third["stored"] == 1 and third["duplicates"] == 2
    else:
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
    short = kt.load_to(cache, hit, paged, [3])
    short.synchronize()
    assert short.blocks == 1
    with pytest.raises(kvtier.InvalidError):
        kt.PagedCache(())
    assert kt.register(cache) is False or torch.cuda.is_available()


def test_pages_are_kept_in_logical_order_whatever_the_physical_layout(cache):
    """vLLM 0.32 hands a connector each layer as a logical [blocks, heads, tokens, 2·dim]
    view whose strides follow the backend's physical layout (LBHNC on CPU, LBNHC for
    FlashAttention). The same KV stores the same bytes from either, and loads back into
    either: engines on different backends share blocks, never misread them."""
    layout = cache.register_layout("kt-layouts", "bf16", BS, LAYERS, HEADS, DIM)
    g = torch.Generator().manual_seed(9)
    logical = [torch.randn(6, HEADS, BS, 2 * DIM, generator=g).to(torch.bfloat16) for _ in range(LAYERS)]
    # LBNHC: stored [blocks, tokens, heads, content], seen as [blocks, heads, tokens, content].
    permuted = [t.permute(0, 2, 1, 3).contiguous().permute(0, 2, 1, 3) for t in logical]
    assert not permuted[0][0].is_contiguous() and all(torch.equal(a, b) for a, b in zip(permuted, logical))
    toks = tokens(9, 2)
    assert kt.save_from(cache, layout, toks, kt.PagedCache.vllm(permuted), [4, 1]).result(timeout=30)["stored"] == 2
    hit = cache.lookup(layout, toks)
    assert [b.tobytes() for b in cache.load(hit)] == [
        b"".join(t[p].contiguous().view(torch.uint8).numpy().tobytes() for t in logical) for p in (4, 1)
    ]
    for make in (lambda t: torch.zeros_like(t), lambda t: torch.zeros_like(t.permute(0, 2, 1, 3)).permute(0, 2, 1, 3)):
        target = [make(t) for t in logical]
        loading = kt.load_to(cache, hit, kt.PagedCache.vllm(target), [0, 5])
        assert all(loading.wait_layer(i, timeout=30) for i in range(LAYERS))
        loading.synchronize()
        for t, src in zip(target, logical):
            assert torch.equal(t[0], src[4]) and torch.equal(t[5], src[1])
            assert torch.count_nonzero(t[1:5]) == 0


def test_a_load_skips_the_pages_the_engine_holds(cache):
    layout = cache.register_layout("kt-skip", "bf16", BS, LAYERS, HEADS, DIM)
    source = vllm_caches(4, 11)
    toks = tokens(11, 3)
    assert kt.save_from(cache, layout, toks, kt.PagedCache.vllm(source), [0, 1, 2]).result(timeout=30)["stored"] == 3
    target = [torch.zeros_like(t) for t in source]
    loading = kt.load_to(cache, cache.lookup(layout, toks), kt.PagedCache.vllm(target), [3, 2, 1], first=1)
    assert all(loading.wait_layer(i, timeout=30) for i in range(LAYERS))
    loading.synchronize()
    assert loading.blocks == 3
    for t, s in zip(target, source):
        assert torch.count_nonzero(t[3]) == 0, "a page the engine holds was written"
        assert torch.equal(t[2], s[1]) and torch.equal(t[1], s[2])


def test_a_load_from_a_stalled_server_gives_up_and_writes_nothing(tmp_path):
    """Over HTTP, a server that stops answering: ``wait_layer`` returns False at its
    timeout, and nothing is written into the pages afterwards, even once the server
    answers again."""
    import time

    s = Server(tmp_path / "data", "--set", "ssd.enabled=false")
    try:
        c = kvtier.Client(s.url, request_timeout=1.0, transfer_timeout=2.0)
        layout = c.register_layout("kt-stall", "bf16", BS, LAYERS, HEADS, DIM)
        toks = tokens(12, 2)
        assert kt.save_from(c, layout, toks, kt.PagedCache.vllm(vllm_caches(2, 12)), [0, 1]).result(timeout=30)["stored"] == 2
        hit = c.lookup(layout, toks)
        target = [torch.zeros_like(t) for t in vllm_caches(2, 0)]
        s.pause()
        try:
            loading = kt.load_to(c, hit, kt.PagedCache.vllm(target), [0, 1])
            t = time.monotonic()
            assert loading.wait_layer(0, timeout=0.3) is False
            assert time.monotonic() - t < 2.0
            assert loading.cancelled
        finally:
            s.resume()
        loading.synchronize(timeout=10)
        assert loading.blocks == 0
        assert all(torch.count_nonzero(t) == 0 for t in target), "a cancelled load wrote pages"
    finally:
        s.stop()


def test_the_gpu_check_runs_on_cpu_tensors_and_checks_its_bytes(tmp_path):
    """scripts/gpu-check.sh's measurement code, on CPU tensors at a small size: it must run
    end to end (engine and a served shared arena) and find every byte it moved intact, and
    its transformers rows the same-split logits after every restore."""
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
    assert names == {"limit.h2d", "limit.d2h", "load.embedded", "load.served", "save.embedded", "hidden.share", "store.py"} | {
        f"e2e.hf.{p}.{kind}.ms" for p in (64, 256) for kind in ("cold", "hit", "hit.served")
    }
