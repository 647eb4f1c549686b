"""The GPU check's end-to-end rows (issue 38): a Llama-3.2-3B-shaped transformers model with
random weights (28 layers, 8 KV heads, head dim 128, bf16), a cached prefix plus 256 new
tokens, time to first token through kvtier.hf against a cold prefill of the whole prompt,
beside the hit's floor measured in the same run: the larger of (a) the suffix's prefill
with the prefix KV already on the device and (b) the prefix KV's bytes at the pinned
host -> device rate. The logits after the restore must equal the same-split reference bit
for bit. `--cpu`: a tiny model and short prompts (a smoke test; figures mean nothing).

Rows (milliseconds; ratio = value / baseline):
  e2e.hf.P.cold.ms          cold prefill of P + 256 tokens (baseline: the hit's floor)
  e2e.hf.P.hit.ms           restore + suffix prefill, an engine in this process (target ratio <= 1.25)
  e2e.hf.P.hit.served.ms    the same through a local `kvtier serve`'s shared arena
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Callable

import torch
import transformers

import kvtier
import kvtier.hf
import kvtier.torch as kt

SUFFIX = 256


def model_of(device: torch.device, cpu: bool) -> Any:
    if cpu:
        config = transformers.LlamaConfig(
            vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=4096,
        )
        dtype = torch.float32
    else:
        config = transformers.LlamaConfig(
            vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
            num_attention_heads=24, num_key_value_heads=8, head_dim=128, max_position_embeddings=65536,
            rope_theta=500000.0, tie_word_embeddings=True,
        )
        dtype = torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config).to(dtype)
    return model.eval()


def hf_rows(
    device: torch.device,
    cpu: bool,
    repeats: int,
    h2d_gbps: float,
    timed: Callable[[Callable[[], object]], float],
    median_of: Callable[[int, Callable[[], float]], float],
    row: Callable[..., dict[str, Any]],
    start_server: Callable[[Path, str], Any],
    rows: list[dict[str, Any]],
    failures: list[str],
) -> None:
    model = model_of(device, cpu)
    prefixes = [64, 256] if cpu else [8192, 32768]
    suffix = 16 if cpu else SUFFIX
    cfg = model.config
    kv_bytes_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * cfg.head_dim * model.dtype.itemsize
    ram = f"{max(3 * max(prefixes) * kv_bytes_per_token, 256 << 20) >> 20}MiB"
    vocab = cfg.vocab_size
    g = torch.Generator().manual_seed(1)
    prompts = {p: torch.randint(0, vocab, (1, p + suffix), generator=g).to(device) for p in prefixes}

    @torch.no_grad()
    def measure(kv: kvtier.Cache, where: str) -> None:
        kt.register(kv)
        reuse = kvtier.hf.PrefixCache(kv, model, weights_digest="gpu-check random weights")
        for p in prefixes:
            ids = prompts[p]
            # Only the last position's logits: a first token needs no more (all of them
            # would be gigabytes at 32K tokens of a 128K vocabulary).
            prefix_cache = model(input_ids=ids[:, :p], use_cache=True, logits_to_keep=1).past_key_values
            saving = reuse.store(ids[:, :p], prefix_cache)
            answer = saving.result(timeout=600) if saving is not None else {"stored": 0, "duplicates": 0}
            if answer["stored"] + answer["duplicates"] != p // reuse.block_tokens:
                failures.append(f"e2e.hf.{p}{where}: the prefix was not stored ({answer})")
                continue
            layers = [(layer.keys, layer.values) for layer in prefix_cache.layers]

            def on_device() -> transformers.DynamicCache:
                cache = transformers.DynamicCache()
                for keys, values in layers:
                    cache.update(keys.clone(), values.clone(), len(cache.layers))
                return cache

            reference = model(input_ids=ids[:, p:], past_key_values=on_device(), logits_to_keep=1).logits
            if where == "":
                cold = median_of(repeats, lambda: timed(lambda: model(input_ids=ids, logits_to_keep=1)))

                def suffix_only() -> float:
                    cache = on_device()
                    return timed(lambda: model(input_ids=ids[:, p:], past_key_values=cache, logits_to_keep=1))

                floor = max(median_of(repeats, suffix_only), p * kv_bytes_per_token / (h2d_gbps * 1e9))
                measure.floor[p] = floor  # type: ignore[attr-defined]
                rows.append(row(f"e2e.hf.{p}.cold.ms", cold * 1e3, floor * 1e3, unit="ms", what="cold prefill of the whole prompt vs the hit's floor"))
            floor = measure.floor[p]  # type: ignore[attr-defined]
            logits: list[torch.Tensor] = []

            def hit() -> None:
                cache, restored = reuse.restore(ids)
                if restored != p:
                    failures.append(f"e2e.hf.{p}{where}: {restored} of {p} tokens restored")
                logits.append(model(input_ids=ids[:, restored:], past_key_values=cache, logits_to_keep=1).logits)

            secs = median_of(repeats, lambda: timed(hit))
            if not all(torch.equal(x, reference) for x in logits):
                failures.append(f"e2e.hf.{p}{where}: the logits after a restore differ from the same-split reference")
            rows.append(row(f"e2e.hf.{p}.hit{where}.ms", secs * 1e3, floor * 1e3, unit="ms", what="restore + suffix prefill vs its floor (target <= 1.25)"))

    measure.floor = {}  # type: ignore[attr-defined]
    engine = kvtier.Engine({"ram": ram, "ram_prefault": True, "ssd": {"enabled": False}})
    try:
        measure(engine, "")
    finally:
        engine.close()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url, socket = start_server(Path(tmp) / "data", ram)
        try:
            client = kvtier.Client(url, shm=socket)
            measure(client, ".served")
            client.close()
        finally:
            proc.terminate()
            proc.wait(timeout=60)
