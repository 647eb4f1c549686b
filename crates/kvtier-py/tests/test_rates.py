"""Load or recompute (kvtier.rates): the plan from measured rates, and kvtier.hf deciding
per tier with a real slow tier — S3 behind a link that holds every answer back."""

from __future__ import annotations

import pytest

from kvtier.rates import Rates

MiB = 1 << 20


def test_nothing_measured_loads_everything_and_a_fast_tier_is_loaded():
    rates = Rates()
    assert rates.plan(["ram", "ssd", "remote"], MiB, 16) == 3  # prefill never measured
    rates.observe_prefill(16_000, 1.0)  # 1 ms a block of 16 tokens
    assert rates.plan(["ram"] * 4, MiB, 16) == 4  # the tier never measured: taken as fast
    rates.observe_load(["ram"] * 4, MiB, 0.0004)  # 10 GB/s: 0.1 ms a block
    assert rates.plan(["ram"] * 4, MiB, 16) == 4
    assert rates.counters == {"planned_hits": 3, "tokens_loaded": 16 * 11, "tokens_recomputed": 0}


def test_a_slow_tier_is_recomputed_and_only_a_prefix_is_ever_loaded():
    rates = Rates(smoothing=1.0)
    rates.observe_prefill(16_000, 1.0)  # 1 ms a block
    rates.observe_load(["ram"] * 10, MiB, 0.001)  # 0.1 ms a block
    rates.observe_load(["ram"] * 2 + ["ssd"] * 2, MiB, 0.0002 + 0.008)  # ssd: 4 ms a block
    assert rates.tier_rate("ssd") == pytest.approx(2 * MiB / 0.008)
    assert rates.plan(["ram", "ram", "ssd", "ssd"], MiB, 16) == 2
    # A slow block first: the RAM blocks after it cannot be loaded without it, and
    # 4 + 0.2 ms of loads cost more than 3 ms of prefill.
    assert rates.plan(["ssd"] + ["ram"] * 2, MiB, 16) == 0
    # ... but enough fast blocks after it make loading it worth it: 4.5 ms against 6.
    assert rates.plan(["ssd"] + ["ram"] * 5, MiB, 16) == 6
    assert rates.counters["tokens_recomputed"] == 16 * (2 + 3)


def test_measurements_are_smoothed_and_bad_ones_ignored():
    rates = Rates(smoothing=0.5)
    rates.observe_load(["ssd"], 1000, 1.0)
    rates.observe_load(["ssd"], 1000, 0.5)
    assert rates.tier_rate("ssd") == pytest.approx(1500.0)
    for bad in ((["ssd"], 1000, 0.0), ([], 1000, 1.0), (["ssd"], 0, 1.0)):
        rates.observe_load(*bad)
    rates.observe_prefill(0, 1.0)
    assert rates.tier_rate("ssd") == pytest.approx(1500.0) and rates.prefill_rate is None
    with pytest.raises(ValueError):
        Rates(smoothing=0.0)


@pytest.fixture
def slow_s3():
    """moto's S3 and a link to it that holds each answer back 0.4 s."""
    from slow_link import Moto, SlowLink

    s3 = Moto()
    link = SlowLink(s3.url, delay=0.4)
    yield s3, link
    link.close()
    s3.stop()


def test_a_slow_tier_is_recomputed_promoted_and_then_loaded(tmp_path, slow_s3):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    import kvtier
    import kvtier.hf
    from tiny_llama import BT, load_model, prompt, save_model, split_reference, wait_for_blocks

    s3, link = slow_s3
    model = load_model(save_model(tmp_path / "model", seed=0))

    def engine(name, endpoint):
        return kvtier.Engine(
            {
                "ram": "64MiB",
                "data_dir": str(tmp_path / name),
                "ssd": {"enabled": False},
                "remote": {
                    "endpoints": [endpoint],
                    "bucket": s3.bucket,
                    "access_key": "kvtier-test",
                    "secret_key": "kvtier-test-secret",
                    "deadline": "20s",
                },
            }
        )

    first, second = prompt(11, 70), prompt(12, 70)
    # One replica computes two prompts; their blocks reach the object store.
    with engine("writer", s3.url) as kv:
        writer = kvtier.hf.PrefixCache(kv, model, tokens_per_block=BT)
        for ids in (first, second):
            writer.prefill(ids)
            wait_for_blocks(kv, writer.layout, ids[0].tolist(), 4)
        assert kv.flush()
    # Another replica reaches that store over the slow link: the blocks are "remote".
    with engine("reader", link.url) as kv:
        reuse = kvtier.hf.PrefixCache(kv, model, tokens_per_block=BT)
        assert kv.lookup(reuse.layout, first[0, :64].tolist()).tiers == ["remote"] * 4
        # A cold prompt measures the model's prefill rate.
        assert reuse.prefill(prompt(13, 70)).restored_tokens == 0
        assert reuse.rates.prefill_rate is not None
        # The remote tier was never measured: the first hit loads it (and measures it).
        assert reuse.prefill(first).restored_tokens == 64
        per_block_load = reuse.block_bytes / reuse.rates.tier_rate("remote")
        per_block_prefill = BT / reuse.rates.prefill_rate
        assert per_block_load > per_block_prefill, (per_block_load, per_block_prefill)
        # Now measured slower than computing: the second prompt's blocks are recomputed,
        # with the same logits as a cold prefill of them...
        warm = reuse.prefill(second)
        assert warm.restored_tokens == 0
        with torch.no_grad():
            assert torch.equal(warm.outputs.logits, model(input_ids=second).logits)
        assert reuse.stats["tokens_recomputed"] == 64 and reuse.stats["tokens_loaded"] == 64
        # ... and stored again, which puts them in RAM: the next hit loads them from there.
        assert warm.saving is not None and warm.saving.result(timeout=30)["stored"] == 4
        assert kv.lookup(reuse.layout, second[0, :64].tolist()).tiers == ["ram"] * 4
        again = reuse.prefill(second)
        assert again.restored_tokens == 64
        assert torch.equal(again.outputs.logits, split_reference(model, second, 64))
        assert reuse.stats["tokens_loaded"] == 128
