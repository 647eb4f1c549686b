"""kvtier.hf with a tiny seeded Llama on the CPU: a restored prefix gives logits bit for bit
equal to a prefill split at the same boundary and the same greedy tokens as a cold
prompt; another layout, checkpoint or tenant misses; through an engine, a server's shared
arena and a server over HTTP, and across an engine's restart (the SSD tier)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import kvtier  # noqa: E402
import kvtier.hf  # noqa: E402
from serve import cache_of  # noqa: E402
from tiny_llama import BT, load_model, prompt, save_model, split_reference, tiny_llama_config, wait_for_blocks  # noqa: E402


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return save_model(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="module")
def model(model_dir):
    return load_model(model_dir)


@pytest.fixture(params=["engine", "shared-arena", "http"])
def kv(request, tmp_path):
    with cache_of(request.param, tmp_path / "data") as c:
        yield c


def test_a_restored_prefix_gives_the_split_prefills_logits_bit_for_bit(kv, model):
    reuse = kvtier.hf.PrefixCache(kv, model, tokens_per_block=BT)
    first = prompt(1, 70)
    cold = reuse.prefill(first)
    assert cold.restored_tokens == 0
    # Another prompt sharing the first 64 tokens (4 blocks) and going on differently.
    second = torch.cat([first[:, :64], prompt(2, 11)], dim=1)
    wait_for_blocks(kv, reuse.layout, second[0, :64].tolist(), 4)
    warm = reuse.prefill(second)
    assert warm.restored_tokens == 64
    assert torch.equal(warm.outputs.logits, split_reference(model, second, 64))
    # Not vacuous: the same split over another prefix gives other logits.
    assert not torch.equal(warm.outputs.logits, split_reference(model, torch.cat([prompt(3, 64), second[:, 64:]], 1), 64))
    assert reuse.stats["restored_tokens"] == 64 and reuse.stats["tokens_loaded"] == 64


def test_generate_after_a_restore_gives_the_cold_greedy_tokens(kv, model):
    reuse = kvtier.hf.PrefixCache(kv, model, tokens_per_block=BT)
    ids = prompt(4, 50)
    with torch.no_grad():
        cold = model.generate(ids, max_new_tokens=12, do_sample=False)
    first = reuse.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(first, cold)
    # The prompt and what was generated are stored: (50 + 11) // 16 = 3 blocks.
    wait_for_blocks(kv, reuse.layout, first[0, :61].tolist(), 3)
    again = reuse.generate(ids, max_new_tokens=12, do_sample=False)
    assert torch.equal(again, cold)
    assert reuse.stats["restored_tokens"] == 48


def test_another_layout_checkpoint_or_tenant_misses(tmp_path, model, model_dir):
    kv = kvtier.Engine({"ram": "64MiB", "ssd": {"enabled": False}})
    ids = prompt(5, 40)
    stored = kvtier.hf.PrefixCache(kv, model, tokens_per_block=BT)
    stored.prefill(ids)
    wait_for_blocks(kv, stored.layout, ids[0].tolist(), 2)
    assert stored.restore(ids)[1] == 32  # the control: the same everything hits
    # Other weights of the same shapes, from another directory.
    other = load_model(save_model(tmp_path / "other", seed=1))
    misses = [
        kvtier.hf.PrefixCache(kv, model, tokens_per_block=8),
        kvtier.hf.PrefixCache(kv, model, tokens_per_block=BT, tenant="someone else"),
        kvtier.hf.PrefixCache(kv, model, tokens_per_block=BT, weights_digest="another checkpoint"),
        kvtier.hf.PrefixCache(kv, other, tokens_per_block=BT),
    ]
    for i, reuse in enumerate(misses):
        cache, restored = reuse.restore(ids)
        assert (restored, cache.get_seq_length()) == (0, 0), i
    # The model directory rewritten with new weights: a new digest, a miss.
    torch.manual_seed(7)
    transformers.LlamaForCausalLM(tiny_llama_config()).save_pretrained(model_dir)
    assert kvtier.hf.PrefixCache(kv, load_model(model_dir), tokens_per_block=BT).restore(ids)[1] == 0
    save_model(model_dir, seed=0)  # as the module's other tests expect it
    assert kvtier.hf.PrefixCache(kv, load_model(model_dir), tokens_per_block=BT).restore(ids)[1] == 32
    kv.close()


def test_a_prefix_outlives_the_engine_on_its_ssd(tmp_path, model):
    settings = {"ram": "64MiB", "ssd": {"enabled": True, "dir": str(tmp_path / "ssd"), "capacity": "256MiB"}}
    ids = prompt(6, 90)
    kv = kvtier.Engine(settings)
    stored = kvtier.hf.PrefixCache(kv, model, tokens_per_block=BT)
    stored.prefill(ids)
    wait_for_blocks(kv, stored.layout, ids[0].tolist(), 5)
    kv.close()
    kv = kvtier.Engine(settings)
    reuse = kvtier.hf.PrefixCache(kv, model, tokens_per_block=BT)
    assert kv.lookup(reuse.layout, ids[0, :80].tolist()).tiers == ["ssd"] * 5
    warm = reuse.prefill(ids)
    assert warm.restored_tokens == 80
    assert torch.equal(warm.outputs.logits, split_reference(model, ids, 80))
    kv.close()


def test_what_is_refused_and_what_caches_nothing(model):
    kv = kvtier.Engine({"ram": "64MiB", "ssd": {"enabled": False}})
    sliding = transformers.MistralForCausalLM(
        transformers.MistralConfig(
            vocab_size=256,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            sliding_window=32,
        )
    )
    with pytest.raises(kvtier.InvalidError, match="full-attention"):
        kvtier.hf.PrefixCache(kv, sliding, weights_digest="x")
    reuse = kvtier.hf.PrefixCache(kv, model)
    with pytest.raises(kvtier.InvalidError, match="batch 1"):
        reuse.restore(torch.zeros((2, 40), dtype=torch.long))
    # Random weights loaded from nowhere have no identity: nothing is cached.
    torch.manual_seed(0)
    anonymous = kvtier.hf.PrefixCache(kv, transformers.LlamaForCausalLM(tiny_llama_config()).eval())
    assert anonymous.layout is None
    ids = prompt(8, 40)
    out = anonymous.prefill(ids)
    assert out.restored_tokens == 0 and anonymous.store(ids, out.outputs.past_key_values) is None
    assert anonymous.prefill(ids).restored_tokens == 0
    kv.close()
