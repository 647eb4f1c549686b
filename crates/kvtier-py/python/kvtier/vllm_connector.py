"""kvtier as a vLLM KV connector (vLLM 0.32, ``KVConnectorBase_V1``).

Select it with::

    --kv-transfer-config '{"kv_connector": "KvtierConnector",
                           "kv_connector_module_path": "kvtier.vllm_connector",
                           "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                           "kv_connector_extra_config": {"url": "http://127.0.0.1:7700"}}'

vLLM runs a connector's scheduler side in its engine-core process and its worker side in
a worker process, so both talk to one ``kvtier serve`` (``url``) through
``kvtier.Client``. kvtier keys every block by its own verified token chain under a layout
built from vLLM's model config (model, revision, dtype, block size, layers, KV heads,
head size, tensor-parallel rank and size), so a block is only ever served to the same
model, dtype and geometry, after exactly the same tokens.

- Scheduler side: how many leading whole blocks of a prompt kvtier holds (a lookup, which
  the server answers from memory), leaving at least one prompt token to compute.
- Worker side: a load fills the request's blocks in vLLM's paged cache, every layer;
  a load that comes back short (the server gone, a block evicted or failing its
  checksum since the lookup) reports those blocks through vLLM's load-error path and vLLM
  recomputes them. A save gathers every layer of the prompt's whole blocks computed in
  this step and stores them once the forward pass is done.
- Requests kvtier cannot key exactly are never served and never stored: a LoRA adapter, a
  cache salt, multimodal inputs (when in doubt, miss).

Each block's payload is layer-major: for each layer, vLLM's cache slice of that block
(``[kv_heads, block_size, 2 * head_size]`` on the CPU backend: keys and values side by
side).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)
from vllm.forward_context import get_forward_context

import kvtier

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}


@dataclasses.dataclass
class _Job:
    """One request's transfer in one step."""

    req_id: str
    #: The tokens of the whole blocks concerned, from the prompt's start.
    tokens: list[int]
    #: vLLM's block ids for those blocks, in order.
    block_ids: list[int]
    #: Blocks at the start already in vLLM's cache (not written again by a load).
    skip: int
    load: bool


@dataclasses.dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """What the worker side does in this step."""

    jobs: list[_Job] = dataclasses.field(default_factory=list)


class KvtierConnector(KVConnectorBase_V1):
    """See the module docs."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        url = extra.get("url")
        if not url:
            raise ValueError("KvtierConnector needs kv_connector_extra_config.url (kvtier serve)")
        self._client = kvtier.Client(url, extra.get("token"))
        if getattr(self._kv_transfer_config, "kv_load_failure_policy", "fail") != "recompute":
            logger.warning(
                "kv_load_failure_policy is not 'recompute': a block kvtier cannot deliver "
                "(server gone, evicted, failing its checksum) fails the request instead of "
                "being recomputed"
            )
        self._block_size = vllm_config.cache_config.block_size
        model = vllm_config.model_config
        parallel = vllm_config.parallel_config
        dtype = _DTYPES.get(model.dtype) if isinstance(model.dtype, torch.dtype) else None
        if dtype is None or vllm_config.cache_config.cache_dtype not in ("auto", None):
            raise ValueError(f"KvtierConnector: KV cache dtype {model.dtype} / {vllm_config.cache_config.cache_dtype} is not supported")
        self._layers = model.get_num_layers(parallel)
        self._kv_heads = model.get_num_kv_heads(parallel)
        self._head_size = model.get_head_size()
        self._layout = self._client.register_layout(
            model.model,
            dtype,
            self._block_size,
            self._layers,
            self._kv_heads,
            self._head_size,
            tp_rank=parallel.rank % max(parallel.tensor_parallel_size, 1),
            tp_size=parallel.tensor_parallel_size,
            weights_digest=str(model.revision or ""),
            tokenizer_digest=str(model.tokenizer_revision or ""),
        )
        # Scheduler side: matched tokens by request, and requests to load this step.
        self._matched: dict[str, int] = {}
        self._to_load: dict[str, tuple[Request, int]] = {}
        # Worker side: layer order, gathered saves, failed loads.
        self._layer_names: list[str] | None = None
        self._saving: dict[str, list[torch.Tensor | None]] = {}
        self._load_errors: set[int] = set()
        # Requests whose load came back short in this step: their blocks in vLLM's cache
        # are not what kvtier's keys name until vLLM recomputes them, so nothing of them
        # is stored in this step.
        self._short: set[str] = set()

    # ---- scheduler side ----

    @staticmethod
    def _keyable(request: Any) -> bool:
        """Whether kvtier can key the request exactly (a scheduler `Request` or a newly
        scheduled request's data: both carry these fields)."""
        return not (
            getattr(request, "lora_request", None)
            or getattr(request, "cache_salt", None)
            or getattr(request, "mm_features", None)
        )

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        tokens = list(request.prompt_token_ids or [])
        usable = (len(tokens) - 1) // self._block_size * self._block_size
        if not self._keyable(request) or usable <= num_computed_tokens:
            return 0, False
        try:
            hit = self._client.lookup(self._layout, tokens[:usable])
        except kvtier.KvtierError as e:
            logger.warning("kvtier lookup failed, computing instead: %s", e)
            return 0, False
        if hit.matched_tokens <= num_computed_tokens:
            return 0, False
        self._matched[request.request_id] = hit.matched_tokens
        return hit.matched_tokens - num_computed_tokens, False

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        if num_external_tokens > 0:
            matched = self._matched.get(request.request_id, 0)
            self._to_load[request.request_id] = (request, matched - num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = KvtierConnectorMetadata()
        bs = self._block_size
        for new in scheduler_output.scheduled_new_reqs:
            tokens = list(new.prompt_token_ids or [])
            if not new.block_ids:
                continue
            block_ids = list(new.block_ids[0])
            loading = self._to_load.pop(new.req_id, None)
            matched = self._matched.pop(new.req_id, 0) if loading else 0
            if loading is not None:
                _, local = loading
                meta.jobs.append(
                    _Job(new.req_id, tokens[:matched], block_ids[: matched // bs], local // bs, True)
                )
            # Store the prompt's whole blocks computed by the end of this step, unless
            # kvtier holds them all already (a request it cannot key is never stored).
            done = new.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            whole = min(done, len(tokens)) // bs
            if whole * bs > matched and self._keyable(new):
                meta.jobs.append(_Job(new.req_id, tokens[: whole * bs], block_ids[:whole], 0, False))
        # A request resumed after preemption loads into its new blocks.
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            loading = self._to_load.pop(req_id, None)
            new_ids = cached.new_block_ids[i]
            if loading is None or new_ids is None:
                continue
            request, local = loading
            matched = self._matched.pop(req_id, 0)
            tokens = list(request.all_token_ids[:matched])
            block_ids = list(new_ids[0])[: matched // bs]
            meta.jobs.append(_Job(req_id, tokens, block_ids, local // bs, True))
        self._to_load.clear()
        return meta

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._matched.pop(request.request_id, None)
        self._to_load.pop(request.request_id, None)
        return False, None

    # ---- worker side ----

    def _layers_in_order(self, context: ForwardContext) -> list[str]:
        if self._layer_names is None:
            self._layer_names = [
                name
                for name, layer in context.no_compile_layers.items()
                if getattr(layer, "kv_cache", None) is not None
            ]
            if len(self._layer_names) != self._layers:
                raise RuntimeError(
                    f"KvtierConnector: {len(self._layer_names)} attention layers, the layout says {self._layers}"
                )
        return self._layer_names

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        self._short = set()
        jobs = [j for j in meta.jobs if j.load]
        if not jobs:
            return
        names = self._layers_in_order(forward_context)
        for job in jobs:
            n = len(job.block_ids)
            loaded = 0
            try:
                hit = self._client.lookup(self._layout, job.tokens)
                if hit.blocks >= n:
                    buf = torch.empty(hit.nbytes, dtype=torch.uint8)
                    loaded = min(self._client.load_into(hit, buf.numpy()), n)
            except kvtier.KvtierError as e:
                logger.warning("kvtier load failed; vLLM recomputes: %s", e)
            if loaded > job.skip:
                for li, name in enumerate(names):
                    cache = forward_context.no_compile_layers[name].kv_cache
                    per_block = buf.view(hit.blocks, self._layers, -1)[job.skip : loaded, li]
                    dst = torch.tensor(job.block_ids[job.skip : loaded], dtype=torch.long)
                    cache[dst] = per_block.view(cache.dtype).view(loaded - job.skip, *cache.shape[1:])
            # Whatever did not arrive is recomputed by vLLM.
            if loaded < n:
                self._short.add(job.req_id)
                self._load_errors.update(job.block_ids[max(loaded, job.skip) :])

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Loads complete in start_load_kv (before the first layer runs).
        return

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        jobs = [j for j in meta.jobs if not j.load and j.req_id not in self._short]
        if not jobs:
            return
        names = self._layers_in_order(get_forward_context())
        li = names.index(layer_name)
        for job in jobs:
            parts = self._saving.setdefault(job.req_id, [None] * self._layers)
            ids = torch.tensor(job.block_ids, dtype=torch.long)
            parts[li] = kv_layer[ids].clone()

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        short, self._short = self._short, set()
        for job in (j for j in meta.jobs if not j.load):
            parts = self._saving.pop(job.req_id, None)
            if job.req_id in short:
                continue
            if parts is None or any(p is None for p in parts):
                continue
            # [blocks, layers, ...]: each block's payload layer-major, contiguous.
            blocks = torch.stack([p for p in parts if p is not None], dim=1).contiguous()
            raw = blocks.view(torch.uint8).reshape(-1).numpy()
            try:
                self._client.store(self._layout, job.tokens, raw)
            except kvtier.KvtierError as e:
                logger.warning("kvtier store failed (the KV stays computed, not cached): %s", e)

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._load_errors = self._load_errors, set()
        return failed
