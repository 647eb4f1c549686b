"""Hybrid and recurrent layouts through Python: checkpoints, and restores that return
every group's part of one boundary or nothing — in the embedded engine, after a restart
from the SSD, and through a real `kvtier serve` (docs/hybrid.md)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import kvtier
from serve import Server

TPB = 16  # tokens per block
EVERY = 2 * TPB  # tokens between checkpoints
STATE = 4096  # bytes of recurrent state per boundary
GROUPS = [("py-test/mamba/f32", 3, STATE)]


def tokens(seed, blocks):
    return [(seed * 1_000_003 + t) % (1 << 31) for t in range(blocks * TPB)]


def kv_of(layout, seed, blocks):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, blocks * layout.block_bytes, dtype=np.uint8)


def state_of(seed, boundary):
    return np.random.default_rng([seed, boundary]).integers(0, 256, STATE, dtype=np.uint8)


def engine_at(path, ssd=False):
    settings = {"ram": "256MiB", "data_dir": str(path), "ssd": {"enabled": ssd}}
    return kvtier.Engine(settings)


def hybrid(kv):
    # 2 attention layers x 2 heads x 64 dims x K,V x f16 x 16 tokens = 16 KiB a block,
    # plus one group of 3 recurrent layers.
    return kv.register_layout(
        "py-hybrid", "f16", TPB, 2, 2, 64, state_groups=GROUPS, checkpoint_every=EVERY
    )


@pytest.fixture
def kv(tmp_path):
    with engine_at(tmp_path) as engine:
        yield engine


def test_a_hybrid_layout_names_its_state_and_checkpoints(kv):
    layout = hybrid(kv)
    assert layout.state_bytes == STATE
    assert layout.checkpoint_every == EVERY
    plain = kv.register_layout("py-hybrid", "f16", TPB, 2, 2, 64)
    assert plain.state_bytes == 0 and plain.checkpoint_every is None
    assert plain.digest != layout.digest
    other = kv.register_layout(
        "py-hybrid", "f16", TPB, 2, 2, 64, state_groups=[("py-test/mamba/f32", 3, STATE * 2)]
    )
    assert other.digest != layout.digest  # a group's size is part of the key
    with pytest.raises(kvtier.InvalidError, match="state groups"):
        kv.register_layout("py-hybrid", "f16", TPB, 2, 2, 64, checkpoint_every=EVERY)


def test_kv_alone_and_state_alone_are_misses(kv):
    layout = hybrid(kv)
    kv.store(layout, tokens(1, 4), kv_of(layout, 1, 4))
    hit = kv.lookup(layout, tokens(1, 4))
    assert not hit and hit.matched_tokens == 0 and hit.state_tier is None
    assert not kv.restore(layout, tokens(1, 4))

    # A state whose KV is not stored: no hit either.
    assert kv.checkpoint_put(layout, tokens(2, 4), 2, state_of(2, 2)) == "stored"
    assert not kv.lookup(layout, tokens(2, 4))
    got = kv.restore(layout, tokens(2, 4))
    assert got.tokens == 0 and got.blocks == [] and got.state is None


def test_a_restore_returns_the_deepest_boundary_with_every_part(kv):
    layout = hybrid(kv)
    prompt = tokens(3, 5)
    kv.store(layout, prompt, kv_of(layout, 3, 5))
    assert kv.checkpoint_put(layout, prompt, 2, state_of(3, 2)) == "stored"
    assert kv.checkpoint_put(layout, prompt, 4, state_of(3, 4)) == "stored"

    hit = kv.lookup(layout, prompt)
    assert hit.matched_tokens == 4 * TPB and hit.blocks == 4 and hit.state_tier == "ram"
    got = kv.restore(layout, prompt)
    assert got.tokens == 4 * TPB
    kv_bytes = b"".join(b.tobytes() for b in got.blocks)
    assert kv_bytes == kv_of(layout, 3, 5)[: 4 * layout.block_bytes].tobytes()
    assert got.state.tobytes() == state_of(3, 4).tobytes()

    # A prompt that diverges inside block 3 restores the checkpoint after block 2.
    diverged = prompt[: 3 * TPB + 5] + [7] * (2 * TPB - 5)
    got = kv.restore(layout, diverged)
    assert got.tokens == 2 * TPB and len(got.blocks) == 2
    assert got.state.tobytes() == state_of(3, 2).tobytes()


def test_bad_checkpoints_are_refused_and_change_nothing(kv):
    layout = hybrid(kv)
    prompt = tokens(4, 4)
    kv.store(layout, prompt, kv_of(layout, 4, 4))
    with pytest.raises(kvtier.InvalidError, match="every 2 blocks"):
        kv.checkpoint_put(layout, prompt, 3, state_of(4, 3))  # not a boundary
    with pytest.raises(kvtier.InvalidError):
        kv.checkpoint_put(layout, prompt, 6, state_of(4, 6))  # past the prompt
    with pytest.raises(kvtier.InvalidError, match="bytes of state"):
        kv.checkpoint_put(layout, prompt, 2, b"short")
    plain = kv.register_layout("py-plain", "f16", TPB, 2, 2, 64)
    with pytest.raises(kvtier.InvalidError, match="no state groups"):
        kv.checkpoint_put(plain, prompt, 2, state_of(4, 2))
    assert not kv.restore(layout, prompt)


def test_a_recurrent_only_layout_restores_state_without_blocks(kv):
    layout = kv.register_layout(
        "py-mamba", "f32", TPB, 0, 1, 1, state_groups=GROUPS, checkpoint_every=EVERY
    )
    prompt = tokens(5, 3)
    assert kv.checkpoint_put(layout, prompt, 2, state_of(5, 2)) == "stored"
    hit = kv.lookup(layout, prompt)
    assert hit and hit.blocks == 0 and hit.matched_tokens == EVERY
    got = kv.restore(layout, prompt)
    assert got.tokens == EVERY and got.blocks == []
    assert got.state.tobytes() == state_of(5, 2).tobytes()


def test_random_stores_are_served_only_where_every_part_is_present(kv):
    layout = hybrid(kv)
    rng = random.Random(16)
    for seed in range(40):
        n = rng.randint(1, 8)
        prompt = tokens(100 + seed, n)
        kv_blocks = rng.randint(0, n)
        if kv_blocks:
            kv.store(layout, prompt[: kv_blocks * TPB], kv_of(layout, seed, kv_blocks))
        boundaries = [b for b in range(2, n + 1, 2) if rng.random() < 0.5]
        for b in boundaries:
            kv.checkpoint_put(layout, prompt, b, state_of(seed, b))
        served = max((b for b in boundaries if b <= kv_blocks), default=0)
        got = kv.restore(layout, prompt)
        assert got.tokens == served * TPB, (seed, n, kv_blocks, boundaries)
        assert len(got.blocks) == served
        if served:
            assert got.state.tobytes() == state_of(seed, served).tobytes()
            assert b"".join(b.tobytes() for b in got.blocks) == (
                kv_of(layout, seed, kv_blocks)[: served * layout.block_bytes].tobytes()
            )


def test_checkpoints_come_back_from_the_ssd_after_a_restart(tmp_path):
    with engine_at(tmp_path, ssd=True) as kv:
        layout = hybrid(kv)
        prompt = tokens(6, 4)
        kv.store(layout, prompt, kv_of(layout, 6, 4))
        kv.checkpoint_put(layout, prompt, 4, state_of(6, 4))
        assert kv.flush()
    with engine_at(tmp_path, ssd=True) as kv:
        layout = hybrid(kv)
        hit = kv.lookup(layout, prompt)
        assert hit.matched_tokens == 4 * TPB and hit.state_tier == "ssd"
        got = kv.restore(layout, prompt)
        assert got.tokens == 4 * TPB
        assert got.state.tobytes() == state_of(6, 4).tobytes()
        assert b"".join(b.tobytes() for b in got.blocks) == kv_of(layout, 6, 4).tobytes()


def test_checkpoints_and_restores_through_the_server(tmp_path):
    s = Server(tmp_path / "data", "--set", "ssd.enabled=false")
    try:
        c = kvtier.Client(s.url)
        layout = hybrid(c)
        assert layout.state_bytes == STATE and layout.checkpoint_every == EVERY
        prompt = tokens(7, 5)
        c.store(layout, prompt, kv_of(layout, 7, 5))
        assert not c.lookup(layout, prompt)  # KV alone
        assert not c.restore(layout, prompt)
        assert c.checkpoint_put(layout, prompt, 4, state_of(7, 4)) == "stored"
        hit = c.lookup(layout, prompt)
        assert hit.matched_tokens == 4 * TPB and hit.state_tier == "ram"
        got = c.restore(layout, prompt)
        assert got.tokens == 4 * TPB and len(got.blocks) == 4
        assert got.state.tobytes() == state_of(7, 4).tobytes()
        assert b"".join(b.tobytes() for b in got.blocks) == (
            kv_of(layout, 7, 5)[: 4 * layout.block_bytes].tobytes()
        )
        # Checked before anything is sent, and by the server.
        with pytest.raises(kvtier.InvalidError, match="bytes of state"):
            c.checkpoint_put(layout, prompt, 2, b"short")
        with pytest.raises(kvtier.InvalidError) as refused:
            c.checkpoint_put(layout, prompt, 3, state_of(7, 3))
        assert refused.value.code is not None
    finally:
        s.stop()
