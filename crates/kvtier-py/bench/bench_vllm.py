"""The vLLM rows: time to first token of a 2,048-token prompt on a real vLLM engine (CPU
backend) with kvtier as its KV connector, cold and when the prefix comes from kvtier.

A seeded random Llama-shaped model sized so that a cold prefill of 2,048 tokens takes
more than a second here (8 layers, hidden 1,024, 4 KV heads of 64) is written to a
temporary folder; `kvtier serve` (release build) runs beside it. One engine process
answers pairs of requests: a new prompt cold (nothing in kvtier; vLLM's own prefix cache
is off, so a repeat can only come from kvtier), then a second prompt that shares its
first 2,048 tokens (the prefix from kvtier, a few new tokens computed). Each time is one
`generate` of one token. Medians over the pairs.

- engine.vllm.ttft.cold.ms: the cold request (the baseline).
- engine.vllm.ttft.hit.ms: the request whose prefix comes from kvtier. Target: at least
  5x faster than cold.
- engine.vllm.ttft.chunked.hit.ms: the same pairs on an engine that prefills in chunks of
  512 tokens (the cold prompt is computed, and stored, in four chunks); baseline its cold
  request.
- engine.vllm.throughput.nohit: tokens per second of batches of 16 distinct prompts of
  1,024 tokens (8 generated each), every one a miss and stored, against the same engine
  with a connector that does nothing (noop_connector.py: vLLM runs an engine with a
  connector differently from one without; that figure is printed too), each in a
  process of its own. Target: at least 0.97x.

Run with scripts/bench-vllm.sh [--json FILE] [--pairs N] [--batches N].
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from served import kvtier_serve

PREFIX = 2048
BLOCK = 32
# The no-hit batches: prompts a batch, tokens a prompt, tokens generated each.
BATCH, BATCHED, GENERATED = 16, 1024, 8


def make_model(path: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=4096,
        hidden_size=1024,
        intermediate_size=2816,
        num_hidden_layers=8,
        num_attention_heads=16,
        num_key_value_heads=4,
        max_position_embeddings=4096,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path, safe_serialization=True)


def engine_main(model: str, url: str, mode: str, n: int) -> None:
    """In a process of its own: ``pairs`` (cold then hit, ``n`` pairs), ``chunked`` (the
    same, prefilled in chunks of 512 tokens) or ``batches`` (``n`` batches of distinct
    prompts; ``url`` ``none``: no connector)."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    connector = None
    if url == "noop":
        # The baseline of the no-hit row: the same engine with a connector that does
        # nothing (noop_connector.py says why not one without a connector).
        connector = {
            "kv_connector": "NoopConnector",
            "kv_connector_module_path": "noop_connector",
            "kv_role": "kv_both",
        }
    elif url != "none":
        connector = {
            "kv_connector": "KvtierConnector",
            "kv_connector_module_path": "kvtier.vllm_connector",
            "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"url": url},
        }
    batch = mode == "batches"
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype="bfloat16",
        block_size=BLOCK,
        max_model_len=4096,
        max_num_batched_tokens=512 if mode == "chunked" else 4096,
        enable_chunked_prefill=mode == "chunked" or None,
        enforce_eager=True,
        max_num_seqs=BATCH if batch else 2,
        # A fixed KV cache (2 sequences of 4,096 tokens need 64 MiB): a share of host
        # memory (gpu_memory_utilization) depends on the machine and, on CPU, has vLLM's
        # own process memory taken out of it.
        kv_cache_memory_bytes=512 << 20,
        enable_prefix_caching=False,
        kv_transfer_config=connector,
    )
    if batch:
        params = SamplingParams(max_tokens=GENERATED, temperature=0, detokenize=False, ignore_eos=True)
        # One warm-up batch, then n measured; every prompt new (a miss, stored).
        for b in range(n + 1):
            prompts = [
                TokensPrompt(prompt_token_ids=[((1000 + b * BATCH + j) * 104_729 + i * 7_919) % 4000 + 5 for i in range(BATCHED)])
                for j in range(BATCH)
            ]
            t = time.perf_counter()
            outs = llm.generate(prompts, params, use_tqdm=False)
            secs = time.perf_counter() - t
            tokens = sum(BATCHED + len(o.outputs[0].token_ids) for o in outs)
            if b > 0:
                cached = sum(o.num_cached_tokens or 0 for o in outs)
                print("BATCH " + json.dumps({"tokens_per_s": tokens / secs, "cached": cached}), flush=True)
        return
    params = SamplingParams(max_tokens=1, temperature=0, detokenize=False)

    def ttft(tokens: list[int]) -> tuple[float, int]:
        t = time.perf_counter()
        out = llm.generate([TokensPrompt(prompt_token_ids=tokens)], params, use_tqdm=False)[0]
        return (time.perf_counter() - t) * 1e3, out.num_cached_tokens

    # One warm-up pair (first calls compile and allocate). Each mode's prompts are its
    # own: the modes share one kvtier serve.
    first = 0 if mode == "pairs" else 100
    for p in range(first, first + n + 1):
        base = [(p * 104_729 + i * 7_919) % 4000 + 5 for i in range(PREFIX)]
        cold, c0 = ttft(base + [11, 12, 13])
        # The connector stores off the forward path (a side stream and a thread): the next
        # turn of a conversation comes later than the store takes (here 16 MiB, about
        # 20 ms); the bench leaves it that long.
        time.sleep(0.2)
        hit, c1 = ttft(base + [21, 22, 23])
        if p > first:
            print("PAIR " + json.dumps({"cold": cold, "hit": hit, "cold_cached": c0, "hit_cached": c1}), flush=True)


def run_engine(model: Path, url: str, mode: str, n: int) -> str:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1"}
    # noop_connector.py, for every process of the engine.
    here = str(Path(__file__).resolve().parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, __file__, "--engine", str(model), url, mode, str(n)],
        capture_output=True, text=True, env=env, timeout=3600,
    )
    if done.returncode != 0:
        raise SystemExit(done.stderr[-4000:])
    return done.stdout


def batches_of(out: str) -> list[dict]:
    return [json.loads(l[6:]) for l in out.splitlines() if l.startswith("BATCH ")]


def pairs_of(out: str) -> list[dict]:
    pairs = [json.loads(l[5:]) for l in out.splitlines() if l.startswith("PAIR ")]
    assert pairs and all(p["cold_cached"] == 0 and p["hit_cached"] == PREFIX for p in pairs), pairs
    return pairs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--pairs", type=int, default=5)
    ap.add_argument("--batches", type=int, default=3)
    ap.add_argument("--engine", nargs=4, metavar=("MODEL", "URL", "MODE", "N"))
    args = ap.parse_args()
    if args.engine:
        engine_main(args.engine[0], args.engine[1], args.engine[2], int(args.engine[3]))
        return
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "model"
        make_model(model)
        with kvtier_serve(Path(tmp) / "kv", "2GiB") as url:
            plain = pairs_of(run_engine(model, url, "pairs", args.pairs))
            chunked = pairs_of(run_engine(model, url, "chunked", args.pairs))
            batches = batches_of(run_engine(model, url, "batches", args.batches))
            noop = batches_of(run_engine(model, "noop", "batches", args.batches))
            without = batches_of(run_engine(model, "none", "batches", args.batches))
    assert all(b["cached"] == 0 for b in batches + noop + without), (batches, noop, without)
    cold = statistics.median(p["cold"] for p in plain)
    hit = statistics.median(p["hit"] for p in plain)
    chunked_cold = statistics.median(p["cold"] for p in chunked)
    chunked_hit = statistics.median(p["hit"] for p in chunked)
    with_tps = statistics.median(b["tokens_per_s"] for b in batches)
    noop_tps = statistics.median(b["tokens_per_s"] for b in noop)
    without_tps = statistics.median(b["tokens_per_s"] for b in without)
    rows = [
        {"name": "engine.vllm.ttft.cold.ms", "value": cold, "baseline": cold, "ratio": 1.0, "unit": "ms",
         "baseline_what": "itself: the cold request is the baseline"},
        {"name": "engine.vllm.ttft.hit.ms", "value": hit, "baseline": cold, "ratio": hit / cold, "unit": "ms",
         "baseline_what": f"the cold request of the same pair (speed-up {cold / hit:.1f}x)"},
        {"name": "engine.vllm.ttft.chunked.hit.ms", "value": chunked_hit, "baseline": chunked_cold,
         "ratio": chunked_hit / chunked_cold, "unit": "ms",
         "baseline_what": f"the cold request of the same pair, prefilled in 4 chunks of 512 (speed-up {chunked_cold / chunked_hit:.1f}x)"},
        {"name": "engine.vllm.throughput.nohit", "value": with_tps, "baseline": noop_tps,
         "ratio": with_tps / noop_tps, "unit": "tok/s",
         "baseline_what": f"the same engine with a connector that does nothing ({BATCH} distinct prompts of {BATCHED} tokens a batch, all misses, stored); with no connector at all: {without_tps:.0f} tok/s"},
    ]
    for r in rows:
        print(f"{r['name']:<32} {r['value']:10.1f} {r['unit']:<5} baseline {r['baseline']:10.1f} {r['unit']:<5} ratio {r['ratio']:6.3f}  ({r['baseline_what']})")
    print("pairs (cold ms, hit ms): " + ", ".join(f"{p['cold']:.0f}/{p['hit']:.0f}" for p in plain))
    print("chunked pairs (cold ms, hit ms): " + ", ".join(f"{p['cold']:.0f}/{p['hit']:.0f}" for p in chunked))
    print("batches (tok/s kvtier, no-op connector, none): " + ", ".join(
        f"{a['tokens_per_s']:.0f}/{b['tokens_per_s']:.0f}/{c['tokens_per_s']:.0f}" for a, b, c in zip(batches, noop, without)
    ))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": rows, "pairs": plain, "chunked": chunked, "batches": batches, "noop": noop, "without": without}, f, indent=1)


if __name__ == "__main__":
    main()
