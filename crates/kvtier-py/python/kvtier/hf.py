"""Prefix reuse for Hugging Face transformers models: a prompt's cached prefix restored
from kvtier into a transformers KV cache, and the KV a prefill computed stored back — so
prefixes are reused across processes, restarts and hosts with torch and transformers
alone (docs/python.md, "kvtier.hf").

>>> import kvtier, kvtier.hf
>>> reuse = kvtier.hf.PrefixCache(kvtier.open(url="http://127.0.0.1:7070"), model)
>>> out = reuse.generate(input_ids, max_new_tokens=64)   # restores, generates, stores

- ``PrefixCache.restore(ids)``: a ``DynamicCache`` holding the longest cached prefix of
  ``ids`` worth loading (whole blocks, one token at least left to compute), and its
  length. From memory kvtier holds in this process (an engine, or a server's shared
  arena) every layer's copies are queued at once and the forward pass that follows waits
  for each layer's KV only when that layer's attention needs it, so the transfer runs
  behind the compute of the layers before. From a server over HTTP the load finishes
  (within its deadline) before ``restore`` returns.
- ``PrefixCache.store(ids, cache)``: the whole blocks the cache holds, gathered on the
  device and committed off the caller's path (``kvtier.torch.save_from``).
- ``PrefixCache.prefill`` and ``PrefixCache.generate``: both around a model call.

Which prefix is worth loading is measured, not configured (``kvtier.rates``): kvtier's
read rate from the tier holding each block against the model's own prefill rate.

The KV of a prefix is the same bytes whether it was computed in one pass or restored, so
the logits after a restore are bit-identical to a prefill split at the same boundary.
Blocks are keyed by the model (its name or path and class), the weights' identity
(``kvtier._weights``: a model directory's digest, a hub commit, or ``weights_digest``;
without one nothing is cached), dtype, block size and the tenant: another checkpoint,
layout or tenant misses. Models whose every layer keeps full-attention KV in a
``DynamicCache`` (Llama, Qwen2, Mistral without a sliding window, ...) on one device,
batch 1; others are refused at construction.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

import kvtier.torch as kt
from kvtier._kvtier import Cache, Hit, Layout
from kvtier._weights import weights_identity
from kvtier.errors import InvalidError, KvtierError
from kvtier.rates import Rates

_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}

# transformers' cache layer is untyped: made through this.
_Layer: Any = DynamicLayer

#: Seconds a load over HTTP may take before the prefix is computed instead.
LOAD_TIMEOUT = 60.0


def _pages(t: torch.Tensor, block_tokens: int) -> torch.Tensor:
    """A ``[1, heads, tokens, dim]`` cache tensor as pages of ``block_tokens`` tokens,
    ``[blocks, heads, block_tokens, dim]`` (a view: writes go to the cache)."""
    heads, tokens, dim = t.shape[1], t.shape[2], t.shape[3]
    return t[0].view(heads, tokens // block_tokens, block_tokens, dim).permute(1, 0, 2, 3)


class RestoredCache(DynamicCache):
    """A ``DynamicCache`` whose first ``restored_tokens`` tokens came from kvtier. Layer
    ``i``'s KV may still be on its way when the forward pass starts: its first
    ``update`` waits for that layer only (on a GPU, the compute stream waits for the
    copy's event; nothing blocks the host)."""

    def __init__(self, loading: kt.Loading, layers: Sequence[tuple[torch.Tensor, torch.Tensor]], tokens: int) -> None:
        super().__init__()
        self.restored_tokens = tokens
        self._loading: kt.Loading | None = loading
        self._waiting = set(range(len(layers)))
        for keys, values in layers:
            layer = _Layer()
            layer.lazy_initialization(keys, values)
            layer.keys, layer.values = keys, values
            self.layers.append(layer)

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if layer_idx in self._waiting:
            self._waiting.discard(layer_idx)
            assert self._loading is not None
            # Every layer was settled before this cache was handed out (copies queued from
            # memory kvtier holds, or a fetch already finished): this only orders the
            # stream after the layer's copy.
            self._loading.wait_layer(layer_idx)
        if not self._waiting and self._loading is not None and self._loading.try_release():
            # Every copy from kvtier's memory is done: its lease ends (checked without
            # waiting, at each update until then — a host wait here would stall the
            # launch of the rest of the forward pass).
            self._loading = None
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


@dataclass(frozen=True)
class Prefill:
    """A prefill through kvtier: the model's ``outputs`` for the tokens it computed (its
    ``past_key_values`` hold the whole prompt), how many leading tokens were restored
    instead of computed, and the store of the blocks it computed, on its way (``None``:
    nothing to store)."""

    outputs: Any
    restored_tokens: int
    saving: kt.Saving | None


class PrefixCache:
    """kvtier prefix reuse for one transformers model (see the module docs).

    ``kv``: kvtier (``kvtier.open(...)``: an engine, or a ``kvtier serve``'s client);
    ``tokens_per_block``: tokens per kvtier block; ``model_id``, ``revision``: the
    checkpoint (default: the path or hub name the model was loaded from) for the weights'
    identity, or ``weights_digest`` to name the weights outright; ``tenant``: requests of
    one tenant are only ever served KV stored by that tenant; ``rates``: the measured
    rates the load-or-recompute plans use (shared between caches of one kvtier if
    given)."""

    def __init__(
        self,
        kv: Cache,
        model: Any,
        *,
        tokens_per_block: int = 16,
        model_id: str | None = None,
        revision: str | None = None,
        weights_digest: str | None = None,
        tenant: str | bytes | None = None,
        rates: Rates | None = None,
        load_timeout: float = LOAD_TIMEOUT,
    ) -> None:
        config = model.config
        if getattr(config, "is_encoder_decoder", False):
            raise InvalidError("kvtier.hf caches decoder-only models; this one is an encoder-decoder")
        text = config.get_text_config(decoder=True)
        kinds = {type(layer).__name__ for layer in DynamicCache(config=config).layers}
        if kinds != {"DynamicLayer"}:
            raise InvalidError(
                f"kvtier.hf caches models whose every layer keeps full-attention KV; this one's cache has {sorted(kinds)}"
            )
        dtype = _DTYPES.get(model.dtype)
        if dtype is None:
            raise InvalidError(f"kvtier.hf caches f16, bf16 or f32 KV, not {model.dtype}")
        if tokens_per_block < 1:
            raise InvalidError("tokens_per_block must be at least 1")
        self.kv, self.model = kv, model
        self.block_tokens = tokens_per_block
        self.num_layers = int(text.num_hidden_layers)
        self.kv_heads = int(getattr(text, "num_key_value_heads", None) or text.num_attention_heads)
        self.head_dim = int(getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads)
        self.dtype: torch.dtype = model.dtype
        self.rates = rates or Rates()
        self.load_timeout = load_timeout
        self._counters = {"lookups": 0, "restored_tokens": 0, "load_errors": 0, "stores": 0, "store_errors": 0}
        name = model_id or str(getattr(model, "name_or_path", "") or "")
        # An empty name is no path (Path("") is the working directory).
        identity = weights_identity(name, revision, weights_digest) if name else weights_digest
        #: The layout blocks are keyed by; ``None`` when the weights have no identity,
        #: and then nothing is cached (when in doubt, miss).
        self.layout: Layout | None = None
        if identity is not None:
            architecture = type(model).__name__
            self.layout = kv.register_layout(
                f"transformers:{architecture}:{name}",
                dtype,
                tokens_per_block,
                self.num_layers,
                self.kv_heads,
                self.head_dim,
                tenant_salt=tenant.encode("utf-8") if isinstance(tenant, str) else tenant,
                weights_digest=identity,
            )

    @property
    def block_bytes(self) -> int:
        return 2 * self.num_layers * self.kv_heads * self.block_tokens * self.head_dim * int(self.dtype.itemsize)

    @property
    def stats(self) -> dict[str, int]:
        """Counters: ``lookups``, ``restored_tokens``, ``load_errors`` (a failed load is a
        miss), ``stores``, ``store_errors``, and the plans' ``planned_hits``,
        ``tokens_loaded``, ``tokens_recomputed`` (``kvtier.rates``)."""
        return {**self._counters, **self.rates.counters}

    # ---- restore ----

    def restore(self, input_ids: Any) -> tuple[DynamicCache, int]:
        """A cache for ``input_ids`` (a sequence of token ids, or a ``[1, n]`` tensor)
        holding its longest cached prefix worth loading, and that prefix's length in
        tokens (0: an empty cache, compute everything). Never raises for kvtier's
        failures: they are misses."""
        tokens = _token_list(input_ids)
        bt = self.block_tokens
        usable = (len(tokens) - 1) // bt * bt
        if self.layout is None or usable <= 0:
            return DynamicCache(), 0
        self._counters["lookups"] += 1
        try:
            hit = self.kv.lookup(self.layout, tokens[:usable])
        except KvtierError:
            self._counters["load_errors"] += 1
            return DynamicCache(), 0
        blocks = self.rates.plan(hit.tiers, self.block_bytes, bt) if hit.blocks else 0
        if blocks == 0:
            return DynamicCache(), 0
        return self._load(hit.prefix(blocks) if blocks < hit.blocks else hit)

    def _load(self, hit: Hit) -> tuple[DynamicCache, int]:
        blocks, bt = hit.blocks, self.block_tokens
        device = self.model.device
        shape = (1, self.kv_heads, blocks * bt, self.head_dim)
        layers = [
            (torch.empty(shape, dtype=self.dtype, device=device), torch.empty(shape, dtype=self.dtype, device=device))
            for _ in range(self.num_layers)
        ]
        paged = kt.PagedCache(tuple((_pages(k, bt), _pages(v, bt)) for k, v in layers))
        try:
            loading = kt.load_to(self.kv, hit, paged, range(blocks))
            if self.kv.arena is None:
                loading.synchronize(self.load_timeout)
            # Every layer written (from memory in this process: queued at once, and the
            # forward pass waits for each layer's copies only when it gets there); one not
            # written in time over HTTP makes the whole load a miss, and nothing more is
            # written.
            complete = loading.complete
            if not complete:
                loading.cancel()
        except KvtierError:
            complete = False
        if not complete or loading.blocks == 0:
            self._counters["load_errors"] += 1
            return DynamicCache(), 0
        got = loading.blocks
        if loading.seconds is not None:
            self.rates.observe_load(hit.tiers[:got], self.block_bytes, loading.seconds)
        if got < blocks:  # kvtier lost some since the lookup: the leading ones are whole
            layers = [(k[:, :, : got * bt], v[:, :, : got * bt]) for k, v in layers]
        self._counters["restored_tokens"] += got * bt
        return RestoredCache(loading, layers, got * bt), got * bt

    # ---- store ----

    def store(
        self,
        input_ids: Any,
        cache: Any,
        *,
        durability: Literal["queued", "written", "synced"] | None = None,
    ) -> kt.Saving | None:
        """Stores the whole blocks ``cache`` (a ``DynamicCache`` of batch 1, after a
        forward pass over ``input_ids``) holds, those a restore did not bring; ``None``
        when there is nothing to store. The pages are gathered on the device now, so the
        caller may go on at once; ``Saving.result()`` is kvtier's answer. A failure is
        counted and returns ``None``; a cache of the wrong shape is refused."""
        if self.layout is None:
            return None
        if not isinstance(cache, DynamicCache):
            raise InvalidError(f"kvtier.hf stores a DynamicCache, not {type(cache).__name__}")
        layers: list[Any] = list(cache.layers)
        if len(layers) != self.num_layers or any(type(layer) is not DynamicLayer for layer in layers):
            raise InvalidError(f"a cache of {self.num_layers} full-attention layers is needed")
        tokens = _token_list(input_ids)
        held = int(cache.get_seq_length())
        want = (1, self.kv_heads, held, self.head_dim)
        for layer in layers:
            for t in (layer.keys, layer.values):
                if tuple(t.shape) != want or t.dtype != self.dtype:
                    raise InvalidError(f"cache tensors {tuple(t.shape)} {t.dtype}; kvtier.hf needs {want} {self.dtype}")
        bt = self.block_tokens
        n = min(held, len(tokens)) // bt
        first = getattr(cache, "restored_tokens", 0) // bt if self.kv.arena is not None else 0
        if n <= first:
            return None
        paged = kt.PagedCache(
            tuple((_pages(layer.keys[:, :, : n * bt], bt), _pages(layer.values[:, :, : n * bt], bt)) for layer in layers)
        )
        try:
            saving = kt.save_from(
                self.kv, self.layout, tokens[: n * bt], paged, range(first, n), first_block=first, durability=durability
            )
        except KvtierError:
            self._counters["store_errors"] += 1
            return None
        self._counters["stores"] += 1
        return saving

    # ---- around a model call ----

    @torch.no_grad()
    def prefill(self, input_ids: Any, **kwargs: Any) -> Prefill:
        """Restores ``input_ids``'s cached prefix, runs the model over the rest (``kwargs``
        go to the model) and stores the blocks it computed."""
        ids = _ids_tensor(input_ids, self.model.device)
        cache, restored = self.restore(ids)
        started = time.perf_counter()
        outputs = self.model(input_ids=ids[:, restored:], past_key_values=cache, use_cache=True, **kwargs)
        if restored == 0:
            self._observe_prefill(ids.shape[1], started)
        return Prefill(outputs, restored, self.store(ids, outputs.past_key_values))

    def generate(self, input_ids: Any, **kwargs: Any) -> Any:
        """``model.generate`` on ``input_ids`` after restoring its cached prefix; the whole
        blocks of the prompt and the generated text are stored after. Returns what
        ``generate`` returns."""
        ids = _ids_tensor(input_ids, self.model.device)
        cache, restored = self.restore(ids)
        timing: dict[str, float] = {}
        hooks = []
        if restored == 0:
            # The first forward is the prompt's prefill: its time measures the model.
            def before(*_: Any) -> None:
                timing.setdefault("start", time.perf_counter())

            def after(*_: Any) -> None:
                if "start" in timing and "seconds" not in timing:
                    if ids.device.type == "cuda":
                        torch.cuda.synchronize(ids.device)
                    timing["seconds"] = time.perf_counter() - timing["start"]

            hooks = [self.model.register_forward_pre_hook(before), self.model.register_forward_hook(after)]
        try:
            out = self.model.generate(ids, past_key_values=cache, **kwargs)
        finally:
            for hook in hooks:
                hook.remove()
        if "seconds" in timing:
            self.rates.observe_prefill(ids.shape[1], timing["seconds"])
        sequences = getattr(out, "sequences", out)
        self.store(sequences[:1], cache)
        return out

    def _observe_prefill(self, tokens: int, started: float) -> None:
        if self.model.device.type == "cuda":
            torch.cuda.synchronize(self.model.device)
        self.rates.observe_prefill(tokens, time.perf_counter() - started)


def _token_list(input_ids: Any) -> list[int]:
    """Token ids as a list: from a sequence, or a ``[1, n]`` or ``[n]`` tensor."""
    if isinstance(input_ids, torch.Tensor):
        if input_ids.dim() == 2:
            if input_ids.shape[0] != 1:
                raise InvalidError("kvtier.hf caches one sequence at a time (batch 1)")
            input_ids = input_ids[0]
        return [int(t) for t in input_ids.tolist()]
    return [int(t) for t in input_ids]


def _ids_tensor(input_ids: Any, device: torch.device) -> torch.Tensor:
    """Token ids as a ``[1, n]`` tensor on ``device``."""
    if isinstance(input_ids, torch.Tensor):
        ids = input_ids if input_ids.dim() == 2 else input_ids.unsqueeze(0)
    else:
        ids = torch.tensor([list(input_ids)], dtype=torch.long)
    if ids.shape[0] != 1:
        raise InvalidError("kvtier.hf caches one sequence at a time (batch 1)")
    return ids.to(device)
