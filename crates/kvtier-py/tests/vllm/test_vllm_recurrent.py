"""A real vLLM engine (V1, CPU) on a model with recurrent layers, with kvtier as its KV
connector: a seeded Qwen3-Next-shaped checkpoint (a gated-delta-net layer, then a full
attention layer), written by the test.

vLLM keeps the model in two KV cache groups, attention pages and recurrent states; kvtier
keys both under one layout, so a hit restores the KV blocks and the state at the same
token boundary or nothing (docs/vllm.md, "Recurrent groups"). vLLM sizes this model's
attention blocks to 288 tokens (an attention page must hold a state), so a 700-token
prompt can take 576 tokens from kvtier.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import kvtier
from serve import Server
from test_vllm_e2e import engine, flip_one_payload_byte, same

PROMPT = 700
BLOCK = 288  # vLLM's attention block size for this model (checked below)
EXPECTED = (PROMPT - 1) // BLOCK * BLOCK
RECURRENT = {"KVTIER_TEST_RECURRENT": "1"}


def make_recurrent_model(path: Path, seed: int) -> None:
    """A small Qwen3-Next-shaped checkpoint with seeded random weights (bf16): layer 0 a
    gated delta net (linear attention with a recurrent state), layer 1 full attention.
    vLLM's CPU kernel for gated delta nets wants heads of 128; one layer has experts (vLLM's
    Qwen3-Next needs one), the other a dense MLP."""
    import torch
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    torch.manual_seed(seed)
    config = Qwen3NextConfig(
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=1024,
        layer_types=["linear_attention", "full_attention"],
        linear_num_value_heads=2,
        linear_num_key_heads=1,
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        linear_conv_kernel_dim=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=128,
        shared_expert_intermediate_size=128,
        mlp_only_layers=[0],
        torch_dtype="bfloat16",
    )
    Qwen3NextForCausalLM(config).to(torch.bfloat16).save_pretrained(path, safe_serialization=True)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("models") / "seeded-qwen3-next"
    make_recurrent_model(path, 0)
    return path


def run(model: Path, url: str, patch: str | None = None) -> dict:
    env = {**RECURRENT, **({"KVTIER_TEST_PATCH": patch} if patch else {})}
    return engine(model, url, prompt=PROMPT, env=env)


def test_a_hybrid_recurrent_model_is_served_at_one_boundary_for_kv_and_state(model, tmp_path):
    data = tmp_path / "data"
    server = Server(data)
    try:
        cold = run(model, server.url)
        assert cold["hma"] is True, "vLLM turned its hybrid allocator off"
        assert cold["cached"] == 0 and len(set(cold["tokens"])) > 1
        stats = kvtier.Client(server.url).stats()
        # The prompt's boundary before its last token: its two KV blocks and the state.
        assert stats["ram_resident_blocks"] == EXPECTED // BLOCK, stats
        assert stats["checkpoint_resident_entries"] >= 1, stats

        hit = run(model, server.url)
        assert hit["cached"] == EXPECTED
        assert same(hit, cold), (hit, cold)
        assert kvtier.Client(server.url).stats()["state_restores"] >= 1

        # The control: the same KV with the state of an empty prompt (what a cache that
        # restores KV without the recurrent state does) answers differently, so the
        # comparisons here can fail and the state is what makes them hold.
        zeroed = run(model, server.url, patch="zero-state")
        assert zeroed["cached"] == EXPECTED
        assert not same(zeroed, cold)

        # After kvtier serve restarts, from its SSD.
        assert server.stop() == 0
        server = Server(data)
        again = run(model, server.url)
        assert again["cached"] == EXPECTED and same(again, cold), (again, cold)
    finally:
        server.stop()
    # A damaged byte on disk: never served, the answer stays the cold one — and the
    # damage was read and caught (a flip nobody read would prove nothing).
    assert flip_one_payload_byte(data)
    server = Server(data)
    try:
        damaged = run(model, server.url)
        assert same(damaged, cold), (damaged, cold)
        stats = kvtier.Client(server.url).stats()
        assert stats["ssd_evictions_corrupt"] >= 1, stats
    finally:
        server.stop()


def test_kv_without_the_recurrent_state_is_never_a_hit(model, tmp_path):
    server = Server(tmp_path / "data", "--set", "ssd.enabled=false")
    try:
        # This run stores the KV blocks of the prompt but fails to gather every state.
        first = run(model, server.url, patch="no-state")
        assert first["cached"] == 0
        stats = kvtier.Client(server.url).stats()
        assert stats["ram_resident_blocks"] == EXPECTED // BLOCK and stats["checkpoint_resident_entries"] == 0, stats
        # KV without the state of the same boundary: a miss, and the cold answer.
        second = run(model, server.url)
        assert second["cached"] == 0
        assert kvtier.Client(server.url).stats()["state_refused"] >= 1
        # That run stored the state too: now it is a hit, identical to the cold answer.
        third = run(model, server.url)
        assert third["cached"] == EXPECTED and same(third, second), (third, second)
    finally:
        server.stop()
