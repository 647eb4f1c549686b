"""A real vLLM engine (V1, CPU backend) with kvtier as its KV connector, end to end.

Each engine run is a process of its own (`engine_run.py`) on a seeded random Llama-shaped
checkpoint the test writes (no model hub), talking to a real `kvtier serve`. A fresh
engine must get exactly the block-aligned prefix from kvtier and produce the same tokens
with bit-identical logprobs as a cold run; whatever goes wrong with kvtier, the engine
must still answer exactly as cold. A negative control (wrong KV stored under the
prompt's keys) proves the comparison can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import kvtier
from serve import Server

HERE = Path(__file__).resolve().parent
PROMPT = 200  # tokens; 6 whole blocks of 32 can come from kvtier (one token is left to compute)
BLOCK = 32
EXPECTED = (PROMPT - 1) // BLOCK * BLOCK


def make_model(path: Path, seed: int, window: int | None = None) -> None:
    """A small Llama-shaped checkpoint with seeded random weights (bf16). With `window`,
    its first layer attends over a sliding window of that many tokens (vLLM's hybrid
    allocator then keeps two KV cache groups: sliding-window and full attention)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    hybrid = {"layer_types": ["sliding_attention", "full_attention"], "sliding_window": window} if window else {}
    config = LlamaConfig(
        **hybrid,
        vocab_size=2048,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        torch_dtype="bfloat16",
    )
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(path, safe_serialization=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    root = tmp_path_factory.mktemp("models")
    a, b = root / "seeded-a", root / "seeded-b"
    make_model(a, 0)
    make_model(b, 1)
    return a, b


def engine(model: Path, url: str | None, **run: Any) -> dict:
    """One engine run (``run_engine``'s arguments); its result."""
    out = run_engine(model, url, **run)
    line = next(l for l in out.splitlines() if l.startswith("RESULT "))
    return json.loads(line[len("RESULT ") :])


def engine_sequence(model: Path, url: str, seeds: list[int], env: dict[str, str]) -> tuple[list[dict], dict]:
    """One engine generating for the prompts of ``seeds`` one after another: each prompt's
    result, and the connector's plan counters after the last."""
    out = run_engine(model, url, env={**env, "KVTIER_TEST_SEQUENCE": ",".join(map(str, seeds))})
    results = [json.loads(l[len("RESULT ") :]) for l in out.splitlines() if l.startswith("RESULT ")]
    plans = next(json.loads(l[len("PLANS ") :]) for l in out.splitlines() if l.startswith("PLANS "))
    return results, plans


def run_engine(
    model: Path,
    url: str | None,
    dtype: str = "bfloat16",
    between=None,
    salt: str | None = None,
    prompt: int = PROMPT,
    env: dict[str, str] | None = None,
) -> str:
    """Runs engine_run.py; its standard output. ``between`` runs once the engine is up,
    before it generates; ``salt`` is the prompt's cache salt; ``env``, engine_run.py's
    switches."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", **(env or {})}
    env.pop("KVTIER_TEST_CACHE_SALT", None)
    if salt is not None:
        env["KVTIER_TEST_CACHE_SALT"] = salt
    args = [sys.executable, str(HERE / "engine_run.py"), str(model), url or "none", str(prompt), dtype]
    if between is not None:
        ready, go = model.parent / f"ready-{time.time_ns()}", model.parent / f"go-{time.time_ns()}"
        args += [str(ready), str(go)]
    child = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        if between is not None:
            deadline = time.time() + 300
            while not ready.exists():
                assert child.poll() is None, child.communicate()[1][-4000:]
                assert time.time() < deadline, "the engine did not start"
                time.sleep(0.1)
            between()
            go.touch()
        out, err = child.communicate(timeout=600)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == 0, err[-4000:]
    return out


def load_requests(server: Server) -> int:
    """`POST /v1/load` requests the server has answered (its request histogram)."""
    import re
    import urllib.request

    text = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
    return sum(
        int(float(m.group(1)))
        for m in re.finditer(r'kvtier_request_duration_seconds_count\{[^}]*endpoint="/v1/load"[^}]*\} (\S+)', text)
    )


def same(a: dict, b: dict) -> bool:
    return a["tokens"] == b["tokens"] and a["logprobs"] == b["logprobs"]


@pytest.fixture(scope="module")
def cold(models, tmp_path_factory):
    """A cold run — the engine with the connector, against a kvtier that holds nothing —
    is what every run must answer. (vLLM computes a run with a KV connector configured
    very slightly differently from one without: one logprob differed by 5e-6 here; the
    reference is therefore the same configuration, as in production.)"""
    server = Server(tmp_path_factory.mktemp("cold"), "--set", "ssd.enabled=false")
    try:
        result = engine(models[0], server.url)
    finally:
        server.stop()
    assert result["cached"] == 0
    assert len(set(result["tokens"])) > 1, "degenerate output: the comparison would prove nothing"
    return result


def test_a_fresh_engine_gets_the_prefix_from_kvtier_bit_identically(models, cold, tmp_path):
    server = Server(tmp_path / "data")
    try:
        first = engine(models[0], server.url)
        assert first["cached"] == 0 and same(first, cold)
        before = load_requests(server)
        second = engine(models[0], server.url)
        assert second["cached"] == EXPECTED
        assert same(second, cold), (second, cold)
        # Fetched in chunks of layers of at least kvtier.torch.FETCH_BYTES (1 MiB) per
        # request: this model's two layers of 6 blocks are 192 KiB, so one request.
        assert load_requests(server) - before == 1
        # The same after kvtier serve restarts between two engines (blocks from the SSD).
        assert server.stop() == 0
        server = Server(tmp_path / "data")
        third = engine(models[0], server.url)
        assert third["cached"] == EXPECTED
        assert same(third, cold)
        # Another model or another dtype gets nothing of it.
        assert engine(models[1], server.url)["cached"] == 0
        assert engine(models[0], server.url, dtype="float16")["cached"] == 0
    finally:
        server.stop()


def test_a_cache_salt_is_part_of_the_key(models, cold, tmp_path):
    server = Server(tmp_path / "data", "--set", "ssd.enabled=false")
    try:
        a = engine(models[0], server.url, salt="tenant-a")
        assert a["cached"] == 0 and same(a, cold)
        # Neither an unsalted request nor another salt sees tenant a's prefix (the
        # unsalted run stores its own blocks, which tenant b does not see either).
        assert engine(models[0], server.url)["cached"] == 0
        assert engine(models[0], server.url, salt="tenant-b")["cached"] == 0
        again = engine(models[0], server.url, salt="tenant-a")
        assert again["cached"] == EXPECTED and same(again, cold), (again, cold)
    finally:
        server.stop()


def test_a_deployment_allowing_fp8_in_the_cold_tiers_is_another_layout(models, cold, tmp_path):
    """``cold_codec`` in the extra config registers the connector's layouts as allowing
    fp8 pages in kvtier's cold tiers (ADR 0021): another layout, so neither deployment is
    served the other's blocks."""
    fp8 = {"KVTIER_TEST_COLD_CODEC": "fp8_e4m3"}
    server = Server(tmp_path / "data", "--set", "ssd.enabled=false")
    try:
        a = engine(models[0], server.url, env=fp8)
        assert a["cached"] == 0 and same(a, cold)
        assert engine(models[0], server.url)["cached"] == 0
        # (from RAM, which holds pages raw: exactly the stored bytes)
        again = engine(models[0], server.url, env=fp8)
        assert again["cached"] == EXPECTED and same(again, cold), (again, cold)
    finally:
        server.stop()


def test_new_weights_in_the_same_directory_or_another_weights_digest_are_a_miss(models, cold, tmp_path):
    """The weights, not the model's path, are keyed: a directory redeployed with other
    weights misses what the old ones stored, and so does an operator's other
    weights_digest."""
    import shutil

    deployed = tmp_path / "deployed"
    shutil.copytree(models[0], deployed)
    server = Server(tmp_path / "kv", "--set", "ssd.enabled=false")
    try:
        first = engine(deployed, server.url)
        assert first["cached"] == 0 and same(first, cold)
        # The same directory and files under an operator's digest: not the same key.
        other = engine(deployed, server.url, env={"KVTIER_TEST_WEIGHTS_DIGEST": "release-2"})
        assert other["cached"] == 0 and same(other, cold)
        # The directory redeployed with other weights (same file names and sizes).
        for f in models[1].iterdir():
            if f.is_file():
                shutil.copy(f, deployed / f.name)
        redeployed = engine(deployed, server.url)
        assert redeployed["cached"] == 0, "KV of the old weights served for the new ones"
        assert not same(redeployed, cold)
    finally:
        server.stop()


def test_over_an_embedded_engine_a_fresh_process_gets_the_prefix_from_its_ssd(models, cold, tmp_path):
    where = f"embedded:{tmp_path / 'kv'}"
    first = engine(models[0], where)
    assert first["cached"] == 0 and same(first, cold)
    second = engine(models[0], where)
    assert second["cached"] == EXPECTED
    assert same(second, cold), (second, cold)


def test_the_engine_recomputes_when_kvtier_serve_dies_mid_run(models, cold, tmp_path):
    server = Server(tmp_path / "data")
    try:
        assert same(engine(models[0], server.url), cold)
        result = engine(models[0], server.url, between=server.kill9)
    finally:
        server.stop()
    assert result["cached"] == 0
    assert same(result, cold)


def test_a_failure_inside_a_hook_is_a_recompute_or_a_skipped_store(models, cold, tmp_path):
    """Each worker hook's data movement failing inside (kvtier.torch raising): the engine
    answers exactly as cold, a failed save stores nothing, and a failed load is
    recomputed."""
    server = Server(tmp_path / "kv", "--set", "ssd.enabled=false")
    try:
        failed_save = engine(models[0], server.url, env={"KVTIER_TEST_PATCH": "fail-save"})
        assert same(failed_save, cold)
        stored = engine(models[0], server.url)
        assert stored["cached"] == 0, "a failed save stored blocks"
        assert same(stored, cold)
        for hook in ("fail-load", "fail-layer"):
            result = engine(models[0], server.url, env={"KVTIER_TEST_PATCH": hook})
            assert same(result, cold), hook
    finally:
        server.stop()


def test_a_stopped_server_costs_a_deadline_not_a_hang_and_hits_come_back(models, cold, tmp_path):
    """kvtier serve SIGSTOPped while the engine runs: the engine finishes within its
    client's deadlines with the cold answer; after SIGCONT a run gets the prefix again."""
    server = Server(tmp_path / "kv", "--set", "ssd.enabled=false")
    try:
        assert same(engine(models[0], server.url), cold)  # stores the prefix
        t = time.monotonic()
        try:
            stalled = engine(models[0], server.url, between=server.pause, env={"KVTIER_TEST_TIMEOUTS": "1,1,2"})
        finally:
            server.resume()
        assert same(stalled, cold) and stalled["cached"] == 0
        assert time.monotonic() - t < 300
        again = engine(models[0], server.url)
        assert again["cached"] == EXPECTED and same(again, cold)
    finally:
        server.stop()


def test_a_prompt_prefilled_in_chunks_is_stored_whole_and_hit_whole(models, cold, tmp_path):
    """Prefilled in chunks of 64 tokens (four steps for 200), every chunk's whole blocks
    are stored as they complete: a fresh engine then gets the whole block-aligned prefix,
    not just the first chunk's."""
    server = Server(tmp_path / "kv", "--set", "ssd.enabled=false")
    try:
        chunked = engine(models[0], server.url, env={"KVTIER_TEST_CHUNK": "64"})
        assert chunked["cached"] == 0
        assert chunked["tokens"] == cold["tokens"]
        whole = engine(models[0], server.url)
        assert whole["cached"] == EXPECTED, "only part of the chunked prompt was stored"
        assert whole["tokens"] == cold["tokens"]
        # Hit whole by a chunked engine too (its load covers several of its chunks).
        again = engine(models[0], server.url, env={"KVTIER_TEST_CHUNK": "64"})
        assert again["cached"] == EXPECTED and again["tokens"] == cold["tokens"]
    finally:
        server.stop()


def test_a_slow_tier_is_recomputed_then_promoted_and_loaded(models, cold, tmp_path):
    """Load or recompute, measured inside vLLM: one engine stores two prompts in S3; a
    second reaches the same bucket through a link that holds each answer back 1 s. Its
    first prompt (cold) measures the model; the first hit is loaded from S3 (the tier was
    never measured) and measures it; the next hit from S3 is recomputed instead, stored into
    RAM, and the same prompt again is then loaded — and every answer is the cold one."""
    from slow_link import Moto, SlowLink

    s3 = Moto()
    link = SlowLink(s3.url, delay=1.0)
    try:
        writer, _ = engine_sequence(
            models[0], f"embedded:{tmp_path / 'writer'}", [1, 2], {"KVTIER_TEST_REMOTE": f"{s3.url},{s3.bucket}"}
        )
        assert [r["cached"] for r in writer] == [0, 0]
        results, plans = engine_sequence(
            models[0], f"embedded:{tmp_path / 'reader'}", [0, 1, 2, 2], {"KVTIER_TEST_REMOTE": f"{link.url},{s3.bucket}"}
        )
    finally:
        link.close()
        s3.stop()
    assert [r["cached"] for r in results] == [0, EXPECTED, 0, EXPECTED], (results, plans)
    assert same(results[0], cold)
    assert results[1]["tokens"] == writer[0]["tokens"] and results[1]["logprobs"] == writer[0]["logprobs"]
    assert results[2]["tokens"] == writer[1]["tokens"] and results[2]["logprobs"] == writer[1]["logprobs"]
    assert results[3]["tokens"] == writer[1]["tokens"] and results[3]["logprobs"] == writer[1]["logprobs"]
    assert plans["tokens_loaded"] == 2 * EXPECTED and plans["tokens_recomputed"] == EXPECTED, plans
    assert plans["tier_rates"]["remote"] is not None and plans["prefill_rate"] is not None


def test_a_flipped_byte_on_disk_is_a_miss(models, cold, tmp_path):
    data = tmp_path / "data"
    server = Server(data)
    try:
        assert same(engine(models[0], server.url), cold)
        # The first block's bytes, as kvtier holds them.
        c = kvtier.Client(server.url)
        stats_before = c.stats()
        assert stats_before["ram_resident_blocks"] >= EXPECTED // BLOCK
    finally:
        assert server.stop() == 0
    flipped = flip_one_payload_byte(data)
    assert flipped, "found no block payload on disk to damage"
    server = Server(data)
    try:
        result = engine(models[0], server.url)
        assert same(result, cold), (result, cold)
        assert kvtier.Client(server.url).stats()["ssd_evictions_corrupt"] >= 1
    finally:
        server.stop()


def flip_one_payload_byte(data: Path) -> bool:
    """Flips one byte in the middle of the largest segment file (block payloads are most
    of its bytes): what a bad sector does."""
    segments = sorted((p for p in data.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    if not segments:
        return False
    target = segments[-1]
    size = target.stat().st_size
    with open(target, "r+b") as f:
        f.seek(size // 2)
        byte = f.read(1)
        f.seek(size // 2)
        f.write(bytes([byte[0] ^ 0x5A]))
    return True


def test_a_sliding_window_model_keeps_the_hybrid_allocator_and_is_served_per_group(tmp_path):
    # Layer 0 attends over 64 tokens, layer 1 over all: two KV cache groups. kvtier keys
    # each group under a layout of its own, serves a hit only where both hold the prefix,
    # writes only the sliding-window blocks vLLM keeps, and loads asynchronously (vLLM
    # takes a failed load per request only then).
    model = tmp_path / "hybrid"
    make_model(model, 2, window=64)
    data = tmp_path / "data"
    server = Server(data)
    try:
        cold = engine(model, server.url)
        assert cold["hma"] is True, "vLLM turned its hybrid allocator off"
        assert cold["cached"] == 0 and len(set(cold["tokens"])) > 1
        # Both groups stored the prompt's whole blocks, each under its own layout.
        assert kvtier.Client(server.url).stats()["ram_resident_blocks"] == 2 * (EXPECTED // BLOCK)
        hit = engine(model, server.url)
        assert hit["cached"] == EXPECTED
        assert same(hit, cold), (hit, cold)
    finally:
        assert server.stop() == 0
    # A load that fails (a flipped byte on disk, found only when read) makes vLLM
    # compute the request from the start: the answer stays the cold one.
    assert flip_one_payload_byte(data)
    server = Server(data)
    try:
        result = engine(model, server.url)
        assert same(result, cold), (result, cold)
        assert kvtier.Client(server.url).stats()["ssd_evictions_corrupt"] >= 1
        # The recomputed blocks were stored again: the next engine gets the prefix.
        again = engine(model, server.url)
        assert again["cached"] == EXPECTED and same(again, cold), (again, cold)
    finally:
        server.stop()


def test_a_perturbed_store_changes_the_answer(models, cold, tmp_path):
    # The negative control: wrong bytes stored under exactly the prompt's keys (the
    # connector's own layout) make the engine answer differently — so a comparison of
    # logprobs can fail, and the equalities above mean something.
    server = Server(tmp_path / "data", "--set", "ssd.enabled=false")
    try:
        from kvtier._weights import weights_identity

        c = kvtier.Client(server.url)
        # The connector's layout: the model's path and its files' digest.
        digest = weights_identity(str(models[0]), None)
        layout = c.register_layout(str(models[0]), "bf16", BLOCK, 2, 2, 64, weights_digest=digest)
        tokens = [(i * 7919) % 2000 + 5 for i in range(PROMPT)][:EXPECTED]
        import torch

        torch.manual_seed(3)
        noise = torch.randn(EXPECTED // BLOCK * layout.block_bytes // 2, dtype=torch.bfloat16)
        c.store(layout, tokens, noise.view(torch.uint8).numpy())
        result = engine(models[0], server.url)
    finally:
        server.stop()
    assert result["cached"] == EXPECTED
    assert not same(result, cold)
