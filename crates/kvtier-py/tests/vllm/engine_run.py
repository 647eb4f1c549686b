"""One vLLM engine run for the end-to-end tests, in a process of its own: generates 8
tokens greedily for one prompt of token ids and prints the result as one JSON line.

usage: engine_run.py MODEL_DIR URL|embedded:DIR|none PROMPT_TOKENS DTYPE [READY_FILE GO_FILE]

`embedded:DIR`: the connector over a kvtier engine in vLLM's process, its SSD tier in DIR
(stores acknowledged once written, so what the run stored survives its process).

With READY_FILE and GO_FILE, the engine writes READY_FILE once it is up and waits for
GO_FILE before generating (so a test can change the world in between). The environment
variable KVTIER_TEST_CACHE_SALT gives the prompt a cache salt.
"""

from __future__ import annotations

import json
import os
import sys
import time


def main() -> None:
    if sys.argv[2].startswith("embedded:"):
        # vLLM's CPU platform runs the uni executor only without the engine-core process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    model, url, n_prompt, dtype = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    embedded = url.startswith("embedded:")
    kv = None
    if url != "none":
        kv = {
            "kv_connector": "KvtierConnector",
            "kv_connector_module_path": "kvtier.vllm_connector",
            "kv_role": "kv_both",
            # A block that does not arrive is recomputed (vLLM's default fails the request).
            "kv_load_failure_policy": "recompute",
            "kv_connector_extra_config": {"url": url},
        }
        if embedded:
            kv["kv_connector_extra_config"] = {
                "engine": {
                    "ram": "256MiB",
                    "data_dir": url[len("embedded:") :],
                    "ssd": {"min_free": "0", "durability": "written"},
                }
            }
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype=dtype,
        block_size=32,
        max_model_len=1024,
        enforce_eager=True,
        max_num_seqs=4,
        # On CPU this is the share of host memory vLLM reserves for its KV cache.
        gpu_memory_utilization=0.05,
        # Only kvtier may supply a prefix: vLLM's own cache would hide a miss.
        enable_prefix_caching=False,
        kv_transfer_config=kv,
        # An embedded kvtier engine needs the connector's scheduler and worker sides in one
        # process (vLLM's CPU platform otherwise runs the worker in a process of its own).
        **({"distributed_executor_backend": "uni"} if embedded else {}),
    )
    if len(sys.argv) > 6:
        ready, go = sys.argv[5], sys.argv[6]
        open(ready, "w").close()
        deadline = time.time() + 300
        while not os.path.exists(go):
            if time.time() > deadline:
                raise SystemExit("no go")
            time.sleep(0.05)
    prompt = TokensPrompt(prompt_token_ids=[(i * 7919) % 2000 + 5 for i in range(n_prompt)])
    if salt := os.environ.get("KVTIER_TEST_CACHE_SALT"):
        prompt["cache_salt"] = salt
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=1, detokenize=False)
    out = llm.generate([prompt], params)[0]
    o = out.outputs[0]
    result = {
        "tokens": list(o.token_ids),
        "logprobs": [next(iter(lp.values())).logprob for lp in o.logprobs],
        "cached": out.num_cached_tokens,
        # Whether vLLM kept its hybrid KV cache manager (it turns it off for a connector
        # that does not implement the hybrid-allocator interface).
        "hma": not llm.llm_engine.vllm_config.scheduler_config.disable_hybrid_kv_cache_manager,
    }
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
