"""A tiny seeded Llama for the tests of kvtier.hf (a few KiB of weights, CPU), and what
those tests share."""

from __future__ import annotations

import time

import torch
import transformers

BT = 16


def tiny_llama_config(**extra):
    return transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        **extra,
    )


def save_model(path, seed):
    torch.manual_seed(seed)
    transformers.LlamaForCausalLM(tiny_llama_config()).save_pretrained(path)
    return path


def load_model(path):
    return transformers.LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


def prompt(seed, n):
    """``n`` token ids, ``[1, n]``, the same for the same seed."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (1, n), generator=g)


def wait_for_blocks(kv, layout, tokens, blocks):
    """Stores land off the caller's path: waits (boundedly) until kvtier holds them."""
    for _ in range(200):
        if kv.lookup(layout, tokens).blocks >= blocks:
            return
        time.sleep(0.02)
    raise AssertionError(f"kvtier never held {blocks} blocks")


@torch.no_grad()
def split_reference(model, ids, at):
    """Logits of ``ids[at:]`` after a prefill of ``ids[:at]``: the same split, computed."""
    first = model(input_ids=ids[:, :at], use_cache=True)
    return model(input_ids=ids[:, at:], past_key_values=first.past_key_values).logits
