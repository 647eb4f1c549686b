"""One vLLM engine run for the end-to-end tests, in a process of its own: generates 8
tokens greedily for one prompt of token ids and prints the result as one JSON line.

usage: engine_run.py MODEL_DIR URL|embedded:DIR|none PROMPT_TOKENS DTYPE [READY_FILE GO_FILE]

`embedded:DIR`: the connector over a kvtier engine in vLLM's process, its SSD tier in DIR
(stores acknowledged once written, so what the run stored survives its process).

With READY_FILE and GO_FILE, the engine writes READY_FILE once it is up and waits for
GO_FILE before generating (so a test can change the world in between). The environment
variable KVTIER_TEST_CACHE_SALT gives the prompt a cache salt; KVTIER_TEST_WEIGHTS_DIGEST
sets the connector's weights_digest; KVTIER_TEST_TIMEOUTS=connect,request,transfer its client's
deadlines (seconds); KVTIER_TEST_CHUNK=N prefills in chunks of N tokens; KVTIER_TEST_RECURRENT=1 runs
a model with recurrent layers (prefix caching on, see below); KVTIER_TEST_PATCH breaks the
connector's recurrent path on purpose, or makes one of its worker hooks fail inside
(`patch`), for the tests' controls. KVTIER_TEST_SEQUENCE=S,S,... generates for several
prompts one after another in this one engine (prompt seeds; 0 is the default prompt),
printing a RESULT line each and then the connector's plan counters (PLANS, in-process
engines only); KVTIER_TEST_REMOTE=ENDPOINT,BUCKET gives an embedded engine an S3 tier
(and no SSD tier).
"""

from __future__ import annotations

import json
import os
import sys
import time


def patch(kind: str) -> None:
    """Breaks the connector's recurrent path on purpose, for the tests' controls (in this
    process: the engine then runs with the uni executor)."""
    from kvtier._vllm_recurrent import RecurrentModel

    if kind.startswith("fail-"):
        # One of the connector's worker hooks fails inside (kvtier.torch raising where it
        # is called): the connector must recompute or skip the store, never raise.
        import kvtier.torch as kt

        def broken(*args, **kwargs):  # type: ignore[no-untyped-def]
            raise RuntimeError(f"test: {kind}")

        if kind == "fail-load":
            kt.load_to = broken  # type: ignore[assignment]
        elif kind == "fail-layer":
            kt.Loading.wait_layer = broken  # type: ignore[method-assign]
        elif kind == "fail-save":
            kt.save_from = broken  # type: ignore[assignment]
        else:
            raise SystemExit(f"unknown patch {kind}")
        return
    if kind == "zero-state":
        # A restored boundary gets the KV but the state of an empty prompt: what a cache
        # that restores KV without the recurrent state does.
        scatter = RecurrentModel.scatter_state

        def zeroed(self, caches, blocks, state):  # type: ignore[no-untyped-def]
            scatter(self, caches, blocks, state)
            for g in self.recurrent:
                for view in self._state_tensors(caches, g, blocks[g.index]):
                    view.zero_()

        RecurrentModel.scatter_state = zeroed  # type: ignore[method-assign]
    elif kind == "no-state":
        # Stores keep their KV blocks, but every state fails to be gathered.
        def fail(self, caches, blocks):  # type: ignore[no-untyped-def]
            raise RuntimeError("test: no state")

        RecurrentModel.gather_state = fail  # type: ignore[method-assign]
    else:
        raise SystemExit(f"unknown patch {kind}")


def main() -> None:
    patched = os.environ.get("KVTIER_TEST_PATCH")
    if sys.argv[2].startswith("embedded:") or patched:
        # vLLM's CPU platform runs the uni executor only without the engine-core process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    if patched:
        patch(patched)
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
        if digest := os.environ.get("KVTIER_TEST_WEIGHTS_DIGEST"):
            kv["kv_connector_extra_config"]["weights_digest"] = digest
        if timeouts := os.environ.get("KVTIER_TEST_TIMEOUTS"):
            connect, request, transfer = (float(t) for t in timeouts.split(","))
            kv["kv_connector_extra_config"].update(
                connect_timeout=connect, request_timeout=request, transfer_timeout=transfer
            )
        if embedded:
            kv["kv_connector_extra_config"] = {
                "engine": {
                    "ram": "256MiB",
                    "data_dir": url[len("embedded:") :],
                    "ssd": {"min_free": "0", "durability": "written"},
                }
            }
            if remote := os.environ.get("KVTIER_TEST_REMOTE"):
                endpoint, bucket = remote.split(",")
                kv["kv_connector_extra_config"]["engine"].update(
                    ssd={"enabled": False},
                    remote={
                        "endpoints": [endpoint],
                        "bucket": bucket,
                        "access_key": "kvtier-test",
                        "secret_key": "kvtier-test-secret",
                        "deadline": "30s",
                    },
                )
        if codec := os.environ.get("KVTIER_TEST_COLD_CODEC"):
            kv["kv_connector_extra_config"]["cold_codec"] = codec
    # A model with recurrent layers: vLLM keeps their states at block boundaries only with
    # prefix caching on (its "align" mode), which each run's fresh process starts empty.
    recurrent = os.environ.get("KVTIER_TEST_RECURRENT") == "1"
    llm = LLM(
        model=model,
        skip_tokenizer_init=True,
        dtype=dtype,
        block_size=32,
        max_model_len=1024,
        enforce_eager=True,
        max_num_seqs=4,
        # The KV cache's size. (Not a share of host memory, gpu_memory_utilization: on CPU
        # vLLM subtracts its own process's memory from that share, which left nothing for
        # the cache on a 16 GB machine.)
        kv_cache_memory_bytes=256 << 20,
        # Only kvtier may supply a prefix: vLLM's own cache would hide a miss (with one
        # prompt per process, it never hits; a recurrent model needs it on, above).
        enable_prefix_caching=recurrent,
        kv_transfer_config=kv,
        # KVTIER_TEST_CHUNK: prefill in chunks of that many tokens (a prompt several
        # chunks long is stored chunk by chunk).
        **(
            {"max_num_batched_tokens": int(os.environ["KVTIER_TEST_CHUNK"]), "enable_chunked_prefill": True}
            if os.environ.get("KVTIER_TEST_CHUNK")
            else {}
        ),
        # An embedded kvtier engine needs the connector's scheduler and worker sides in one
        # process (vLLM's CPU platform otherwise runs the worker in a process of its own).
        **({"distributed_executor_backend": "uni"} if embedded or patched else {}),
    )
    if len(sys.argv) > 6:
        ready, go = sys.argv[5], sys.argv[6]
        open(ready, "w").close()
        deadline = time.time() + 300
        while not os.path.exists(go):
            if time.time() > deadline:
                raise SystemExit("no go")
            time.sleep(0.05)
    params = SamplingParams(max_tokens=8, temperature=0, logprobs=1, detokenize=False)
    seeds = [int(x) for x in os.environ.get("KVTIER_TEST_SEQUENCE", "0").split(",")]
    for seed in seeds:
        ids = [(i * 7919 + seed * 104729) % 2000 + 5 for i in range(n_prompt)]
        prompt = TokensPrompt(prompt_token_ids=ids)
        if salt := os.environ.get("KVTIER_TEST_CACHE_SALT"):
            prompt["cache_salt"] = salt
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
    if len(seeds) > 1 and kv is not None:
        core = getattr(llm.llm_engine.engine_core, "engine_core", None)
        connector = core.scheduler.get_kv_connector() if core is not None else None
        if connector is not None:
            rates = connector.rates
            plans = {**rates.counters, "prefill_rate": rates.prefill_rate,
                     "tier_rates": {t: rates.tier_rate(t) for t in ("ram", "ssd", "remote")}}
            print("PLANS " + json.dumps(plans), flush=True)


if __name__ == "__main__":
    main()
