"""kvtier as a vLLM KV connector (vLLM 0.32, ``KVConnectorBase_V1``).

Select it with::

    --kv-transfer-config '{"kv_connector": "KvtierConnector",
                           "kv_connector_module_path": "kvtier.vllm_connector",
                           "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                           "kv_connector_extra_config": {"url": "http://127.0.0.1:7700"}}'

The cache is either a ``kvtier serve`` (``url``, through ``kvtier.Client``: any number of
vLLM processes and replicas share it) or an engine embedded in vLLM's engine-core process
(``engine``: ``kvtier serve``'s settings as a dict, or the path of its settings file),
shared by the connector's scheduler and worker sides — which needs both in that one
process (a single worker: vLLM's ``uni`` executor). kvtier keys every block by its own verified token chain under a layout
built from vLLM's model config (model, the weights' identity — ``_weights.py`` — dtype,
block size, layers, KV heads, head size, tensor-parallel rank and size), so a block is
only ever served to the same weights, dtype and geometry, after exactly the same tokens.

- Scheduler side: how many leading whole blocks of a prompt kvtier holds (a lookup, which
  the server answers from memory), leaving at least one prompt token to compute.
- Worker side: loads go through ``kvtier.torch`` (CPU or CUDA caches, any physical
  layout): from kvtier's memory in this process (an embedded engine's arena, a server's
  shared arena) or fetched over HTTP in chunks of layers, each layer written into vLLM's
  paged cache with its own readiness, so ``wait_for_layer_load`` waits for that layer only
  and later layers travel while earlier ones compute. A load that comes back short (the
  server gone or stalled, a block evicted or failing its checksum since the lookup, a
  deadline passed) is cancelled — nothing more is written — and those blocks are reported
  through vLLM's load-error path; vLLM recomputes them. A save gathers the step's whole
  blocks on the device and sends them on a side stream and a thread, off the forward
  pass. No exception leaves a worker hook: a failure is a recompute or a skipped store.
- Hybrid models (vLLM's hybrid allocator, ``SupportsHMA``): each KV cache group
  (full attention, sliding window) is keyed under a layout of its own; a hit is served
  only where every group holds the prefix; such models load each request whole on a
  thread while it waits (vLLM takes their load failures per request only), writing only
  the sliding-window pages vLLM keeps; a store takes the pages a window dropped from
  kvtier.
- Models with recurrent groups (Mamba, gated delta nets; vLLM's ``align`` cache mode,
  which prefix caching turns on): one layout for the whole model, its attention layers as
  KV blocks and its recurrent layers as a state group, so kvtier's composition rule
  serves a hit only at a boundary where the KV blocks and the state after exactly those
  blocks are both held. Stored at the boundaries vLLM hands over with their states;
  restored whole (``restore``: both parts or nothing). Groups of other kinds are never
  served. docs/vllm.md.
- A request's cache salt is part of its key (the layout's tenant salt): a salted prefix
  is only ever served to requests with the same salt. Requests kvtier cannot key exactly
  are never served and never stored: a LoRA adapter, multimodal inputs (when in doubt,
  miss).

Each block's payload is layer-major: for each layer, vLLM's cache slice of that block
(``[kv_heads, block_size, 2 * head_size]`` on the CPU backend: keys and values side by
side).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, Callable

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.forward_context import get_forward_context
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

import kvtier
import kvtier.torch as kt
from kvtier._open import cold_codec_of, timeouts_of
from kvtier._weights import weights_identity
from kvtier._vllm_rates import Measured, StepClock
from kvtier._vllm_recurrent import RecurrentGroup, RecurrentModel
from kvtier.rates import Rates

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import KVConnectorOutput
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

_DTYPES = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32"}

#: The longest a forward pass waits for one step's loads, in seconds (default); past it,
#: the blocks not arrived are recomputed. ``kv_connector_extra_config.load_deadline``.
LOAD_DEADLINE = 30.0


@dataclasses.dataclass
class _Job:
    """One request's transfer in one step."""

    req_id: str
    #: The tokens of the whole blocks concerned, from the prompt's start.
    tokens: list[int]
    #: vLLM's block ids for those blocks, in order: one list per KV cache group (the
    #: null block, id 0, where a sliding-window group holds nothing).
    block_ids: list[list[int]]
    #: Blocks at the start already in vLLM's cache (not written again by a load).
    skip: int
    load: bool
    #: The request's cache salt (part of its layout's key), if it has one.
    salt: str | None = None

    @property
    def ids(self) -> list[int]:
        """The block ids of a single-group model."""
        return self.block_ids[0]


#: vLLM's null block: a place holder in a sliding-window group's block table.
_NULL_BLOCK = 0


def _leading_nulls(ids: list[int]) -> int | None:
    """How many null blocks start `ids` — None if a null block follows a real one."""
    lead = next((i for i, b in enumerate(ids) if b != _NULL_BLOCK), len(ids))
    return None if _NULL_BLOCK in ids[lead:] else lead


@dataclasses.dataclass(frozen=True)
class _Group:
    """One of vLLM's KV cache groups (layers sharing a block table)."""

    index: int
    #: "full", "window", "recurrent", or the name of a kind kvtier does not serve.
    kind: str
    layers: tuple[str, ...]
    #: A sliding-window group's window, in tokens.
    window: int | None = None
    #: Whether vLLM transfers this group at all (its other groups are rebuilt from it).
    transfer: bool = True
    #: Tokens per block of this group's table.
    block_size: int = 0
    #: A recurrent group's description of its state.
    recurrent: RecurrentGroup | None = None

    @classmethod
    def of(cls, index: int, spec: Any) -> _Group:
        kv = spec.kv_cache_spec
        layers = tuple(spec.layer_names)
        recurrent = None
        if type(kv) is FullAttentionSpec:
            kind, window = "full", None
        elif type(kv) is SlidingWindowSpec:
            kind, window = "window", int(kv.sliding_window)
        elif isinstance(kv, MambaSpec) and kv.mamba_cache_mode == "align" and not kv.num_speculative_blocks:
            # Only vLLM's "align" mode keeps the state at block boundaries (prefix caching
            # on); in any other mode a group's state is at no boundary kvtier can key.
            kind, window = "recurrent", None
            mamba_type = getattr(kv.mamba_type, "value", kv.mamba_type)
            recurrent = RecurrentGroup(index, layers, str(mamba_type), tuple(map(tuple, kv.shapes)), tuple(kv.dtypes))
        else:
            kind, window = type(kv).__name__, None
            if isinstance(kv, MambaSpec) and kv.num_speculative_blocks:
                kind = "MambaSpec with speculative decoding"
            elif isinstance(kv, MambaSpec):
                kind = f"MambaSpec in mamba_cache_mode {kv.mamba_cache_mode!r} (turn prefix caching on)"
        transfer = bool(getattr(spec, "enable_kv_transfer", True))
        return cls(index, kind, layers, window, transfer, int(kv.block_size), recurrent)


class _AsyncLoad:
    """One request's whole load (every group, every layer) on a thread of its own, for
    models of several KV cache groups. The request waits for it before vLLM schedules it,
    so the thread may write into its blocks directly; a short or failed load is reported
    for the whole request (vLLM then computes it from the start)."""

    def __init__(self, work: Callable[[], bool]) -> None:
        self.failed = False
        self.reported = False
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(work,), name="kvtier-load-async", daemon=True)
        self._thread.start()

    def _run(self, work: Callable[[], bool]) -> None:
        try:
            self.failed = not work()
        except Exception:  # noqa: BLE001 - whatever it was, the request is recomputed
            logger.exception("kvtier asynchronous load failed; vLLM recomputes the request")
            self.failed = True
        finally:
            self.done.set()


@dataclasses.dataclass
class _Tracked:
    """A request the scheduler side stores as its prompt's blocks complete."""

    #: The prompt's tokens.
    tokens: list[int]
    #: vLLM's block ids, one list per KV cache group, as they grow.
    block_ids: list[list[int]]
    #: Leading whole blocks kvtier holds or has been asked to store.
    stored: int
    salt: str | None


@dataclasses.dataclass
class _Load:
    """One request's load in this step: blocks ``job.skip`` … come through ``loading``
    (kvtier.torch), which writes vLLM's pages layer by layer; ``ok`` stays true while every
    layer vLLM waited for arrived in time."""

    job: _Job
    loading: kt.Loading
    #: The tiers the loaded blocks came from (the worker's lookup), for the measurement.
    tiers: list[str] = dataclasses.field(default_factory=list)
    ok: bool = True


#: Saves on their way to kvtier at most (each holds its gathered pages, in device or
#: pinned memory, until sent); past it a step's stores are skipped, not queued.
MAX_PENDING_SAVES = 16


@dataclasses.dataclass
class KvtierConnectorMetadata(KVConnectorMetadata):
    """What the worker side does in this step."""

    jobs: list[_Job] = dataclasses.field(default_factory=list)
    #: Tokens this step computes (vLLM's scheduled tokens), for the prefill rate.
    step_tokens: int = 0


class KvtierConnector(KVConnectorBase_V1, SupportsHMA):
    """See the module docs."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        role: KVConnectorRole,
        kv_cache_config: KVCacheConfig,
    ) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        url, embedded = extra.get("url"), extra.get("engine")
        if bool(url) == (embedded is not None):
            raise ValueError(
                "KvtierConnector needs kv_connector_extra_config.url (a kvtier serve) or "
                ".engine (kvtier settings for an engine in this process), one of them"
            )
        self._client: kvtier.Cache
        if embedded is not None:
            backend = vllm_config.parallel_config.distributed_executor_backend
            if backend != "uni":
                raise ValueError(
                    f"KvtierConnector: an embedded kvtier engine serves the scheduler and the "
                    f"workers only when they run in one process (executor 'uni', one worker); "
                    f"this engine uses {backend!r}: use kvtier serve (url), or run vLLM with "
                    f"--distributed-executor-backend uni (on CPU also VLLM_ENABLE_V1_MULTIPROCESSING=0)"
                )
            if not isinstance(embedded, (dict, str)):
                raise ValueError("KvtierConnector: engine must be a dict of kvtier settings or a settings file path")
            # One engine per process and settings: the scheduler side and the worker
            # side of this vLLM process share it (closed, flushed, at exit).
            if isinstance(embedded, str):
                self._client = kvtier.open(config_file=embedded)
            else:
                self._client = kvtier.open(settings=embedded)
        else:
            self._client = kvtier.open(url=str(url), token=extra.get("token"), **timeouts_of(extra))
        self._load_deadline = float(extra.get("load_deadline", LOAD_DEADLINE))
        # Whether the layouts allow fp8 pages in kvtier's cold tiers (ADR 0021).
        self._cold_codec = cold_codec_of(extra)
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
        if parallel.pipeline_parallel_size > 1:
            # Each stage holds other layers under the same token keys; the scheduler's
            # lookup would have to ask every stage's layout, and no test covers it yet.
            raise ValueError(
                f"KvtierConnector: pipeline parallelism (pipeline_parallel_size="
                f"{parallel.pipeline_parallel_size}) is not supported yet; use tensor "
                f"parallelism, or run without the connector"
            )
        self._layers = model.get_num_layers(parallel)
        self._kv_heads = model.get_num_kv_heads(parallel)
        self._head_size = model.get_head_size()
        self._model_name, self._dtype = str(model.model), dtype
        self._tp = (parallel.rank % max(parallel.tensor_parallel_size, 1), parallel.tensor_parallel_size)
        # What pins the weights (a local directory's files by digest, a hub name's commit,
        # or the operator's weights_digest); without it nothing is served or stored.
        weights = weights_identity(str(model.model), model.revision, extra.get("weights_digest"))
        self._revisions = (weights or "", str(model.tokenizer_revision or ""))
        # vLLM's KV cache groups: one for a model whose layers are all alike; with the
        # hybrid allocator, one per kind of layer (full attention, sliding window, …).
        groups = [_Group.of(i, g) for i, g in enumerate(kv_cache_config.kv_cache_groups)]
        self._groups = [g for g in groups if g.transfer]
        unserved = sorted({g.kind for g in self._groups if g.kind not in ("full", "window", "recurrent")})
        # A model with recurrent groups is one kvtier layout: its attention layers as KV
        # blocks, its recurrent layers as a state group, so that kvtier's composition rule
        # serves a hit only where both are held at one boundary (_vllm_recurrent).
        self._recurrent: RecurrentModel | None = None
        recurrent = [g for g in self._groups if g.kind == "recurrent"]
        if recurrent:
            attention = [g for g in self._groups if g.kind != "recurrent"]
            if not attention or any(g.kind != "full" for g in attention):
                unserved.append("recurrent beside other than full attention")
            elif len({g.block_size for g in self._groups}) != 1:
                unserved.append("recurrent with a block size of its own")
            else:
                self._recurrent = RecurrentModel(attention, [g.recurrent for g in recurrent if g.recurrent])
                self._block_size = recurrent[0].block_size
        # Whether kvtier serves this model at all: every group must be one it keys
        # exactly (a hit must restore every layer at one token boundary: when in doubt,
        # miss).
        if weights is None:
            logger.warning(
                "KvtierConnector: nothing pins the weights of %s (not a local directory, no "
                "hub commit in the local cache, no weights_digest in kv_connector_extra_config); "
                "its prompts are computed, never loaded or stored",
                model.model,
            )
        self._serves = bool(self._groups) and not unserved and weights is not None
        if unserved:
            logger.warning(
                "KvtierConnector: KV cache groups of kind %s are not served by kvtier yet; "
                "this model's prompts are computed, never loaded or stored",
                ", ".join(unserved),
            )
        # With more than one group vLLM accepts load failures only per request, for
        # asynchronous loads: such models load whole requests on a thread (below).
        # A sliding-window group's table holds null blocks, never to be written: such
        # models load that way too.
        self._async = len(self._groups) > 1 or any(g.kind == "window" for g in self._groups)
        # One layout per group and cache salt (None: unsalted), registered on first use.
        self._layouts: dict[tuple[int, str | None], Any] = {}
        if self._serves:
            for g in self._groups:
                self._layout(g, None)
        # Scheduler side: the cache salt of each request kvtier can key (a request it
        # cannot key has no entry: never loaded, never stored), matched tokens by request,
        # and requests to load this step.
        self._salt: dict[str, str | None] = {}
        self._matched: dict[str, int] = {}
        self._to_load: dict[str, tuple[Request, int]] = {}
        # Asynchronous loads (several groups): allocated this step (request, block ids
        # per group, tokens vLLM had), the tokens loaded per request until it is
        # scheduled, and every request that had one (its blocks are freed only once the
        # worker says its load thread is done: get_transfer_results).
        self._async_to_load: dict[str, tuple[Request, list[list[int]], int]] = {}
        self._loaded: dict[str, int] = {}
        # A model with recurrent groups: its requests (their tokens, for the boundaries
        # vLLM hands over in later steps) and the longest boundary kvtier holds for each.
        self._requests: dict[str, Request] = {}
        self._held: dict[str, int] = {}
        self._had_async: set[str] = set()
        # Requests kvtier stores, followed across steps (chunked prefill, recomputes).
        self._tracked: dict[str, _Tracked] = {}
        # Worker side: layer order, gathered saves (by request and group), failed loads.
        self._layer_names: list[str] | None = None
        self._saving: dict[tuple[str, int], list[torch.Tensor | None]] = {}
        self._slot_of = {name: (g, i) for g in self._groups for i, name in enumerate(g.layers)}
        # Asynchronous loads by request (kept until the request finishes), requests
        # finished while theirs ran, and the KV cache tensors they write into.
        self._async_loads: dict[str, _AsyncLoad] = {}
        self._finishing: set[str] = set()
        self._kv_caches: dict[str, Any] | None = None
        self._load_errors: set[int] = set()
        # This step's loads (job, kvtier.torch load, every layer arrived so far), their
        # deadline, and the layers vLLM waited for.
        self._loads: list[_Load] = []
        self._loads_until = 0.0
        self._written: set[int] = set()
        # vLLM's caches as kvtier.torch sees them (layers in forward order), and saves on
        # their way to kvtier (gathered on the device, committed on threads).
        self._paged_cache: kt.PagedCache | None = None
        self._saves: list[kt.Saving] = []
        # Requests whose load came back short in this step: their blocks in vLLM's cache
        # are not what kvtier's keys name until vLLM recomputes them, so nothing of them
        # is stored in this step.
        self._short: set[str] = set()
        # Load or recompute (kvtier.rates): the scheduler plans from the rates its
        # workers measure (kvtier._vllm_rates); the tokens each request's plan left to
        # vLLM, counted once the request is allocated.
        self.rates = Rates()
        self._recomputed: dict[str, int] = {}
        self._clock = StepClock()
        self._measured = Measured()

    def _layout(self, group: _Group, salt: str | None) -> Any:
        """The layout of `group`'s layers for requests with cache salt `salt`: the model's,
        with the salt as the tenant salt, so a salted prefix is only ever served to
        requests with that salt. A model of one full-attention group keys it as the model
        itself (its layers in forward order); otherwise each group is a model of its own
        layers, named in the key, in the group's order."""
        if self._recurrent is not None:
            return self._recurrent_layout(salt)
        layout = self._layouts.get((group.index, salt))
        if layout is None:
            tenant = None if salt is None else salt.encode("utf-8")
            name, layers = self._model_name, self._layers
            if self._async:
                window = f" window {group.window}" if group.window else ""
                name = f"{name} [kv cache group {group.index}: {group.kind}{window}: {','.join(group.layers)}]"
                layers = len(group.layers)
            layout = self._client.register_layout(
                name,
                self._dtype,
                self._block_size,
                layers,
                self._kv_heads,
                self._head_size,
                tp_rank=self._tp[0],
                tp_size=self._tp[1],
                pp_stage=0,
                pp_size=1,
                tenant_salt=tenant,
                weights_digest=self._revisions[0],
                tokenizer_digest=self._revisions[1],
                cold_codec=self._cold_codec,
            )
            self._layouts[(group.index, salt)] = layout
        return layout

    def _recurrent_layout(self, salt: str | None) -> Any:
        """The one layout of a model with recurrent groups: its attention layers (groups in
        order) as KV blocks and its recurrent layers as a state group, checkpoints at every
        block boundary (where vLLM's align mode keeps states). The model field names the
        group structure by digest (layer names would not fit in a key's field)."""
        model = self._recurrent
        assert model is not None
        layout = self._layouts.get((-1, salt))
        if layout is None:
            structure = json.dumps([[g.index, g.kind, list(g.layers)] for g in self._groups])
            digest = hashlib.sha256(structure.encode()).hexdigest()[:16]
            layout = self._client.register_layout(
                f"{self._model_name} [kv cache groups {digest}: attention and recurrent]",
                self._dtype,
                self._block_size,
                len(model.attention_layers),
                self._kv_heads,
                self._head_size,
                tp_rank=self._tp[0],
                tp_size=self._tp[1],
                tenant_salt=None if salt is None else salt.encode("utf-8"),
                weights_digest=self._revisions[0],
                tokenizer_digest=self._revisions[1],
                state_groups=[(model.kind, model.state_layers, model.state_bytes)],
                checkpoint_every=self._block_size,
                cold_codec=self._cold_codec,
            )
            self._layouts[(-1, salt)] = layout
        return layout

    # ---- scheduler side ----

    @staticmethod
    def _keyable(request: Any) -> bool:
        """Whether kvtier can key the request exactly: not with a LoRA adapter or
        multimodal inputs (a cache salt is keyed: it is part of the layout)."""
        return not (getattr(request, "lora_request", None) or getattr(request, "mm_features", None))

    def get_num_new_matched_tokens(
        self, request: Request, num_computed_tokens: int
    ) -> tuple[int | None, bool]:
        tokens = list(request.prompt_token_ids or [])
        usable = (len(tokens) - 1) // self._block_size * self._block_size
        if not self._serves or not self._keyable(request):
            self._salt.pop(request.request_id, None)
            return 0, False
        # Decided here, from the scheduler's request: what the step's plan sees of a new
        # request does not carry its cache salt.
        salt = request.cache_salt
        self._salt[request.request_id] = salt
        if self._recurrent is not None:
            self._requests[request.request_id] = request
        if usable <= num_computed_tokens:
            return 0, False
        try:
            # A hit restores every group at one token boundary: the shortest group's (for
            # a model with recurrent groups, kvtier's composition rule in one lookup).
            groups = self._groups[:1] if self._recurrent is not None else self._groups
            layouts = [self._layout(g, salt) for g in groups]
            hits = [self._client.lookup(layout, tokens[:usable]) for layout in layouts]
        except kvtier.KvtierError as e:
            logger.warning("kvtier lookup failed, computing instead: %s", e)
            return 0, False
        matched = min(h.matched_tokens for h in hits)
        if self._recurrent is None and matched > num_computed_tokens:
            # Only what loads faster than vLLM computes it (measured rates); the blocks vLLM
            # holds already cost nothing either way. (A recurrent model restores at its
            # checkpoints only: not planned.)
            bs = self._block_size
            first, n = num_computed_tokens // bs, matched // bs
            worth = self.rates.plan(
                hits[0].tiers[first:n], sum(layout.block_bytes for layout in layouts), bs, count=False
            )
            self._recomputed[request.request_id] = (n - first - worth) * bs
            if worth < n - first:
                logger.info(
                    "kvtier: %d of %d cached blocks recomputed (measured: %s tokens/s prefill, tiers %s)",
                    n - first - worth,
                    n - first,
                    self.rates.prefill_rate,
                    {t: self.rates.tier_rate(t) for t in set(hits[0].tiers[first:n])},
                )
            matched = (first + worth) * bs
        if matched <= num_computed_tokens:
            return 0, False
        self._matched[request.request_id] = matched
        return matched - num_computed_tokens, self._async

    def update_state_after_alloc(
        self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int
    ) -> None:
        self.rates.count(num_external_tokens, self._recomputed.pop(request.request_id, 0))
        if num_external_tokens > 0:
            matched = self._matched.get(request.request_id, 0)
            if self._async:
                ids = [list(g) for g in blocks.get_block_ids()]
                self._async_to_load[request.request_id] = (request, ids, matched - num_external_tokens)
            else:
                self._to_load[request.request_id] = (request, matched - num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        meta = KvtierConnectorMetadata(step_tokens=int(scheduler_output.total_num_scheduled_tokens))
        bs = self._block_size
        # Asynchronous loads: the requests wait for them before they are scheduled.
        for req_id, (request, ids, local) in self._async_to_load.items():
            matched = self._matched.pop(req_id, 0)
            self._loaded[req_id] = matched
            self._had_async.add(req_id)
            tokens = list(request.all_token_ids[:matched])
            blocks = [g[: matched // bs] for g in ids]
            meta.jobs.append(_Job(req_id, tokens, blocks, local // bs, True, self._salt.get(req_id)))
        self._async_to_load.clear()
        for new in scheduler_output.scheduled_new_reqs:
            tokens = list(new.prompt_token_ids or [])
            if not new.block_ids:
                continue
            block_ids = [list(g) for g in new.block_ids]
            loading = self._to_load.pop(new.req_id, None)
            matched = self._matched.pop(new.req_id, 0) if loading else self._loaded.pop(new.req_id, 0)
            # Only requests kvtier can key have an entry (get_num_new_matched_tokens).
            keyable = new.req_id in self._salt
            salt = self._salt.get(new.req_id)
            if loading is not None:
                _, local = loading
                blocks = [g[: matched // bs] for g in block_ids]
                meta.jobs.append(_Job(new.req_id, tokens[:matched], blocks, local // bs, True, salt))
            if self._recurrent is not None:
                self._held[new.req_id] = max(self._held.get(new.req_id, 0), matched)
                continue  # stored at the boundaries vLLM hands over (below)
            if not keyable:
                continue  # a request kvtier cannot key is never stored
            # Followed until it finishes: each step stores the prompt's whole blocks
            # computed by its end that kvtier does not hold yet — the first chunk of a
            # chunked prefill here, the later ones below.
            tracked = _Tracked(tokens, block_ids, matched // bs, salt)
            self._tracked[new.req_id] = tracked
            done = new.num_computed_tokens + scheduler_output.num_scheduled_tokens.get(new.req_id, 0)
            self._plan_store(meta, new.req_id, tracked, done)
        cached = scheduler_output.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            new_ids = cached.new_block_ids[i]
            # A request resumed after preemption loads into its new blocks.
            loading = self._to_load.pop(req_id, None)
            if loading is not None and new_ids is not None:
                request, local = loading
                matched = self._matched.pop(req_id, 0)
                tokens = list(request.all_token_ids[:matched])
                blocks = [list(g)[: matched // bs] for g in new_ids]
                meta.jobs.append(_Job(req_id, tokens, blocks, local // bs, True, request.cache_salt))
            followed = self._tracked.get(req_id)
            if followed is None:
                continue
            if new_ids is not None:
                if req_id in cached.resumed_req_ids:
                    followed.block_ids = [list(g) for g in new_ids]
                else:
                    for table, more in zip(followed.block_ids, new_ids):
                        table.extend(more)
            computed = cached.num_computed_tokens[i]
            # vLLM computes again from here (a short load, a preemption): what kvtier holds
            # past it is not known, so those blocks are stored again as they complete.
            followed.stored = min(followed.stored, computed // bs)
            done = computed + scheduler_output.num_scheduled_tokens.get(req_id, 0)
            self._plan_store(meta, req_id, followed, done)
        self._to_load.clear()
        if self._recurrent is not None:
            meta.jobs += self._boundary_stores(scheduler_output)
        return meta

    def _plan_store(self, meta: KvtierConnectorMetadata, req_id: str, tracked: _Tracked, done: int) -> None:
        """Plans the store of the prompt's whole blocks computed by ``done`` tokens, when
        some are not stored yet. The store names the prompt from its first block (kvtier
        keeps the blocks it holds already, as duplicates)."""
        bs = self._block_size
        whole = min(done, len(tracked.tokens)) // bs
        if whole > tracked.stored:
            blocks = [g[:whole] for g in tracked.block_ids]
            meta.jobs.append(_Job(req_id, tracked.tokens[: whole * bs], blocks, 0, False, tracked.salt))
            tracked.stored = whole

    def _boundary_stores(self, scheduler_output: SchedulerOutput) -> list[_Job]:
        """A model with recurrent groups is stored where vLLM's align mode hands over a
        boundary state (``kv_connector_block_state``): the block that holds each recurrent
        group's state after exactly that many tokens, which this step's forward pass
        writes. Each boundary every recurrent group hands over becomes one store: the KV
        blocks up to it and the state at it (a checkpoint), under the tokens before it."""
        model = self._recurrent
        state = getattr(scheduler_output, "kv_connector_block_state", None)
        if model is None or state is None:
            return []
        bs, jobs = self._block_size, []
        wanted = {g.index for g in model.recurrent}
        for req_id, offers in state.boundary_state_offloads.items():
            request = self._requests.get(req_id)
            if request is None or req_id not in self._salt:
                continue  # not a request kvtier can key
            by_boundary: dict[int, dict[int, int]] = {}
            for group_id, block_id, boundary in offers:
                if group_id in wanted:
                    by_boundary.setdefault(boundary, {})[group_id] = block_id
            table = state.get_block_ids(req_id)
            for boundary, blocks in sorted(by_boundary.items()):
                held = self._held.get(req_id, 0)
                if boundary <= held or boundary % bs or blocks.keys() != wanted or table is None:
                    continue
                if boundary > len(request.all_token_ids):
                    continue
                ids = [list(g)[: boundary // bs] for g in table]
                for group_id, block_id in blocks.items():
                    ids[group_id] = [block_id]
                tokens = list(request.all_token_ids[:boundary])
                jobs.append(_Job(req_id, tokens, ids, 0, False, self._salt.get(req_id)))
                self._held[req_id] = boundary
        return jobs

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        # A request whose asynchronous load failed is computed from the start: its blocks
        # are then stored again (the load's length no longer says what kvtier holds).
        for req_id in connector_output.failed_recving or ():
            self._loaded.pop(req_id, None)
        measured = connector_output.kv_connector_worker_meta
        if isinstance(measured, Measured):
            for tiers, block_bytes, seconds in measured.loads:
                self.rates.observe_load(tiers, block_bytes, seconds)
            for tokens, seconds in measured.steps:
                self.rates.observe_prefill(tokens, seconds)

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        return self._finished(request.request_id)

    def request_finished_all_groups(
        self, request: Request, block_ids: tuple[list[int], ...]
    ) -> tuple[bool, dict[str, Any] | None]:
        return self._finished(request.request_id)

    def _finished(self, req_id: str) -> tuple[bool, dict[str, Any] | None]:
        """Forgets a request. One that had an asynchronous load keeps its blocks until the
        worker reports its load thread done (it may still be writing into them)."""
        self._matched.pop(req_id, None)
        self._to_load.pop(req_id, None)
        self._async_to_load.pop(req_id, None)
        self._loaded.pop(req_id, None)
        self._salt.pop(req_id, None)
        self._requests.pop(req_id, None)
        self._held.pop(req_id, None)
        self._tracked.pop(req_id, None)
        delay = req_id in self._had_async
        self._had_async.discard(req_id)
        return delay, None

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

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        caches: dict[str, Any] = dict(kv_caches)
        if self._recurrent is not None:
            # vLLM registers a recurrent layer's raw pages (bytes, padded to an attention
            # page); the layer's own cache is its state tensors, views of those pages.
            layers = self._vllm_config.compilation_config.static_forward_context
            for g in self._recurrent.recurrent:
                for name in g.layers:
                    caches[name] = tuple(layers[name].kv_cache)
        self._kv_caches = caches

    def _slot(self, layer_name: str) -> tuple[_Group, int]:
        """The group of a layer and the layer's place in that group's payload."""
        if not self._async:
            return self._groups[0], self._layers_in_order(get_forward_context()).index(layer_name)
        return self._slot_of[layer_name]

    def _load_whole(self, job: _Job) -> bool:
        """Loads every group of `job` into vLLM's cache (on an asynchronous load's
        thread); whether all of it arrived."""
        caches = self._kv_caches
        if caches is None:
            logger.error("KvtierConnector: vLLM registered no KV caches; recomputing")
            return False
        n = len(job.tokens) // self._block_size
        if self._recurrent is not None:
            return self._restore_recurrent(caches, job, n)
        for g in self._groups:
            ids = job.block_ids[g.index]
            # A full-attention group needs every block; a sliding-window one only those
            # vLLM gave real blocks (the window before the boundary), the rest are null.
            wanted = [i for i in range(job.skip, n) if ids[i] != _NULL_BLOCK]
            if g.kind == "full" and len(wanted) != n - job.skip:
                return False
            if not wanted:
                continue
            per = self._fetch(g, job.salt, job.tokens, n)
            if per is None:
                return False
            src = torch.tensor(wanted, dtype=torch.long)
            device = caches[g.layers[0]].device
            dst = torch.tensor([ids[i] for i in wanted], dtype=torch.long, device=device)
            for li, name in enumerate(g.layers):
                caches[name].index_copy_(0, dst, per[src, li].to(device))
            if device.type == "cuda":
                # This thread's copies are in the cache before the request is scheduled.
                torch.cuda.current_stream(device).synchronize()
        return True

    def _restore_recurrent(self, caches: dict[str, Any], job: _Job, n: int) -> bool:
        """Restores a model with recurrent groups at the boundary after `n` blocks: the KV
        blocks and the state there, read at once (kvtier's restore is all or nothing) —
        the state into the block vLLM gave each recurrent group at that boundary (the
        last of its table, where align mode reads a request's initial state)."""
        model = self._recurrent
        assert model is not None
        restored = self._client.restore(self._recurrent_layout(job.salt), job.tokens)
        if restored.tokens != n * self._block_size or restored.state is None or len(restored.blocks) != n:
            return False
        states = {g.index: job.block_ids[g.index][n - 1] for g in model.recurrent}
        if _NULL_BLOCK in states.values() or any(
            _NULL_BLOCK in job.block_ids[g.index][job.skip : n] for g in model.attention
        ):
            logger.error("KvtierConnector: vLLM gave no block for a restored boundary; recomputing")
            return False
        model.scatter_kv(caches, job.block_ids, restored.blocks, job.skip)
        model.scatter_state(caches, states, restored.state)
        device = caches[model.attention_layers[0]].device
        if device.type == "cuda":
            # This thread's copies are in the cache before the request is scheduled.
            torch.cuda.current_stream(device).synchronize()
        return True

    def _store_recurrent(self, job: _Job) -> None:
        """Stores `job`'s boundary: the KV blocks before it, then the state at it (a
        checkpoint after those blocks); read from vLLM's caches after the forward pass
        that computed them."""
        model, caches = self._recurrent, self._kv_caches
        assert model is not None and caches is not None
        n = len(job.tokens) // self._block_size
        if any(_NULL_BLOCK in job.block_ids[g.index][:n] for g in model.attention) or any(
            job.block_ids[g.index][0] == _NULL_BLOCK for g in model.recurrent
        ):
            logger.warning("KvtierConnector: a boundary without all of its blocks in vLLM's cache; not stored")
            return
        layout = self._recurrent_layout(job.salt)
        kv = model.gather_kv(caches, job.block_ids, n).cpu()
        self._client.store(layout, job.tokens, kv.view(torch.uint8).reshape(-1).numpy())
        # (Should this part fail, kvtier holds KV without the state: never a hit.)
        state = model.gather_state(caches, {g.index: job.block_ids[g.index][0] for g in model.recurrent})
        self._client.checkpoint_put(layout, job.tokens, n, state.cpu().numpy())

    def _fetch(self, group: _Group, salt: str | None, tokens: list[int], n: int) -> torch.Tensor | None:
        """The first `n` blocks kvtier holds for `tokens` in `group`, as
        [blocks, layers, ...] (each block's payload is layer-major) — None unless all
        `n` arrive."""
        assert self._kv_caches is not None
        hit = self._client.lookup(self._layout(group, salt), tokens)
        if hit.blocks < n:
            return None
        like = self._kv_caches[group.layers[0]]
        page = like[0].numel() * like.element_size()
        buf = torch.empty(hit.blocks * len(group.layers) * page, dtype=torch.uint8)
        if self._client.load_into(hit, buf.numpy()) < n:
            return None
        return buf.view(like.dtype).view(hit.blocks, len(group.layers), *like.shape[1:])[:n]

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        out = KVConnectorTransferResults()
        self._finishing |= finished_req_ids & self._async_loads.keys()
        for req_id, load in self._async_loads.items():
            if load.done.is_set() and not load.reported and req_id not in self._finishing:
                load.reported = True
                # A failed load is finished too: vLLM then recomputes the request.
                out.finished_recving.add(req_id)
                if load.failed:
                    out.failed_recving.add(req_id)
        # A finished request that had a load frees its blocks once the thread is done.
        for req_id in list(self._finishing):
            running = self._async_loads.get(req_id)
            if running is None or running.done.is_set():
                out.finished_sending.add(req_id)
                self._finishing.discard(req_id)
                self._async_loads.pop(req_id, None)
        return out

    def _paged(self, context: ForwardContext) -> kt.PagedCache:
        """vLLM's caches of this model's layers, in forward order, as kvtier.torch sees
        them; kvtier's memory is registered with CUDA the first time (a no-op on CPU)."""
        if self._paged_cache is None:
            names = self._layers_in_order(context)
            caches = self._kv_caches or {}
            tensors = [caches[n] if n in caches else context.no_compile_layers[n].kv_cache for n in names]
            self._paged_cache = kt.PagedCache.vllm(tensors)
            try:
                kt.register(self._client)
            except kvtier.KvtierError as e:
                logger.warning("KvtierConnector: kvtier's memory is not registered with CUDA (copies are slower): %s", e)
        return self._paged_cache

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        # Bound before the forward pass (start_load_kv may come after it, when the step
        # loads nothing), and wait_for_save comes after it: a step that loads nothing
        # measures the model's rate between the two (kvtier._vllm_rates).
        try:
            meta = connector_metadata
            if isinstance(meta, KvtierConnectorMetadata):
                caches = self._kv_caches or {}
                device = next((t.device for t in caches.values() if isinstance(t, torch.Tensor)), None)
                self._clock.start(0 if any(j.load for j in meta.jobs) else meta.step_tokens, device)
        except Exception:  # noqa: BLE001 - never out of a hook: a measurement is skipped
            logger.exception("KvtierConnector: timing this step failed")

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        self._short = set()
        self._written = set()
        self._loads = []
        jobs = [j for j in meta.jobs if j.load]
        if self._async:
            for job in jobs:
                self._async_loads[job.req_id] = _AsyncLoad(functools.partial(self._load_whole, job))
            return
        if not jobs:
            return
        self._loads_until = time.monotonic() + self._load_deadline
        try:
            paged = self._paged(forward_context)
        except Exception:  # noqa: BLE001 - never out of a hook: the blocks are recomputed
            logger.exception("KvtierConnector: vLLM's caches cannot be read; recomputing")
            for job in jobs:
                self._fail(job, job.skip)
            return
        # One lookup per load (memory only on the server), then kvtier.torch writes the
        # blocks layer by layer: queued at once from kvtier's memory in this process (an
        # engine's arena, a server's shared arena), fetched chunk by chunk over HTTP.
        for job in jobs:
            try:
                hit = self._client.lookup(self._layout(self._groups[0], job.salt), job.tokens)
                if hit.blocks < len(job.ids):
                    self._fail(job, job.skip)
                    continue
                loading = kt.load_to(self._client, hit, paged, job.ids, first=job.skip)
                self._loads.append(_Load(job, loading, hit.tiers[job.skip : len(job.ids)]))
            except Exception as e:  # noqa: BLE001 - never out of a hook: recomputed
                logger.warning("kvtier load failed to start; vLLM recomputes: %s", e)
                self._fail(job, job.skip)

    def _fail(self, job: _Job, delivered: int) -> None:
        """Blocks `delivered`.. of `job` did not arrive: vLLM recomputes them, and nothing
        of the request is stored in this step."""
        self._short.add(job.req_id)
        self._load_errors.update(job.ids[max(delivered, job.skip) :])

    def wait_for_layer_load(self, layer_name: str) -> None:
        if not self._loads:
            return
        try:
            li = self._layers_in_order(get_forward_context()).index(layer_name)
        except Exception:  # noqa: BLE001 - never out of a hook: every load is recomputed
            logger.exception("KvtierConnector: an unknown layer %s; its loads are recomputed", layer_name)
            for load in self._loads:
                load.ok = False
                load.loading.cancel()
            return
        self._written.add(li)
        for load in self._loads:
            if not load.ok:
                continue
            try:
                # On a GPU the current stream waits for this layer's copies only.
                load.ok = load.loading.wait_layer(li, max(0.0, self._loads_until - time.monotonic()))
            except Exception:  # noqa: BLE001 - never out of a hook: recomputed
                logger.exception("KvtierConnector: a load failed; vLLM recomputes it")
                load.ok = False
            if not load.ok:
                load.loading.cancel()  # nothing more is written into the cache

    def _settle(self) -> None:
        """After the forward pass: waits for each load's copies (up to the deadline) and
        reports every block that did not arrive in every layer — or whose layer vLLM did
        not wait for — as a load error."""
        loads, self._loads = self._loads, []
        if not loads:
            return
        all_written = len(self._written) == self._layers
        if not all_written:
            logger.error("KvtierConnector: vLLM ran layers without waiting for their loads; recomputing them")
        for load in loads:
            job, loading = load.job, load.loading
            try:
                if not all_written:
                    loading.cancel()
                loading.synchronize(max(0.0, self._loads_until - time.monotonic()))
                ok = load.ok and all_written and not loading.cancelled
                delivered = loading.blocks if ok else job.skip
            except Exception:  # noqa: BLE001 - never out of a hook: recomputed
                logger.exception("KvtierConnector: a load failed; vLLM recomputes it")
                delivered = job.skip
            if delivered < len(job.ids):
                self._fail(job, delivered)
            elif loading.seconds is not None and load.tiers:
                self._measured.loads.append((load.tiers, self._paged_bytes(), loading.seconds))

    def save_kv_layer(
        self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any
    ) -> None:
        if not self._async:
            return  # one group: gathered whole in wait_for_save (kvtier.torch)
        try:
            self._save_layer(layer_name, kv_layer)
        except Exception:  # noqa: BLE001 - never out of a hook: the store is skipped
            logger.exception("KvtierConnector: gathering layer %s failed; not stored", layer_name)
            meta = self._get_connector_metadata()
            assert isinstance(meta, KvtierConnectorMetadata)
            self._short.update(j.req_id for j in meta.jobs if not j.load)

    def _save_layer(self, layer_name: str, kv_layer: torch.Tensor) -> None:
        """A model of several groups: this layer's pages of each store, on the device."""
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        jobs = [j for j in meta.jobs if not j.load and j.req_id not in self._short]
        if not jobs or self._recurrent is not None or layer_name not in self._slot_of:
            return  # (a model with recurrent groups is gathered whole in wait_for_save)
        group, li = self._slot(layer_name)
        for job in jobs:
            ids = job.block_ids[group.index]
            lead = _leading_nulls(ids)
            if lead is None:
                continue  # holes after a real block: nothing vLLM 0.32 does; not stored
            # A sliding-window group holds null blocks where pages fell out of its window
            # (or were loaded without them): only the real ones are here to gather; the
            # leading ones come from kvtier at the store, if it holds them. (Advanced
            # indexing copies already: the result is this step's pages, whatever vLLM
            # writes next.)
            parts = self._saving.setdefault((job.req_id, group.index), [None] * len(group.layers))
            index = torch.tensor(ids[lead:], dtype=torch.long, device=kv_layer.device)
            parts[li] = kv_layer.index_select(0, index)

    def _paged_bytes(self) -> int:
        return self._paged_cache.block_bytes if self._paged_cache is not None else 0

    def build_connector_worker_meta(self) -> Measured | None:
        """This step's measurements, for the scheduler's plans (``update_connector_output``)."""
        try:
            self._measured.steps += self._clock.take()
        except Exception:  # noqa: BLE001 - never out of a hook: a measurement is skipped
            logger.exception("KvtierConnector: reading this step's timing failed")
        measured, self._measured = self._measured, Measured()
        return measured if measured else None

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        assert isinstance(meta, KvtierConnectorMetadata)
        try:
            self._clock.stop()
        except Exception:  # noqa: BLE001 - never out of a hook
            logger.exception("KvtierConnector: timing this step failed")
        try:
            self._settle()
        except Exception:  # noqa: BLE001 - never out of a hook
            logger.exception("KvtierConnector: settling this step's loads failed")
        short, self._short = self._short, set()
        stores = [j for j in meta.jobs if not j.load and j.req_id not in short]
        try:
            if self._recurrent is not None:
                for job in stores:
                    try:
                        self._store_recurrent(job)
                    except Exception:  # noqa: BLE001 - a store never fails the step
                        logger.exception("kvtier store failed (the KV stays computed, not cached)")
            elif self._async:
                self._store_groups(stores)
            else:
                self._store_pages(stores)
        except Exception:  # noqa: BLE001 - never out of a hook: the stores are skipped
            logger.exception("KvtierConnector: this step's stores failed (the KV stays computed, not cached)")
        finally:
            self._saving.clear()

    def _store_pages(self, stores: list[_Job]) -> None:
        """A model of one group: each store's pages gathered on the device now (vLLM may
        reuse them next step) and sent to kvtier on a side stream and a thread
        (kvtier.torch), off the forward path."""
        self._reap_saves()
        if not stores:
            return
        paged = self._paged(get_forward_context())
        group = self._groups[0]
        for job in stores:
            if len(self._saves) >= MAX_PENDING_SAVES:
                logger.warning("KvtierConnector: %d saves still on their way; this step's are skipped", len(self._saves))
                return
            try:
                self._saves.append(kt.save_from(self._client, self._layout(group, job.salt), job.tokens, paged, job.ids))
            except Exception as e:  # noqa: BLE001 - a store never fails the step
                logger.warning("kvtier store failed (the KV stays computed, not cached): %s", e)

    def shutdown(self) -> None:
        """vLLM is stopping: the saves still on their way are finished first (each bounded
        by the client's transfer deadline), so what this engine computed is not lost."""
        for saving in self._saves:
            try:
                saving.result(timeout=self._load_deadline)
            except Exception as e:  # noqa: BLE001 - a store never fails the shutdown
                logger.warning("kvtier store failed at shutdown (not cached): %s", e)
        self._saves = []
        # (KVConnectorBase_V1.shutdown does nothing in vLLM 0.32.)

    def _reap_saves(self) -> None:
        """Forgets the saves that finished, saying which failed."""
        pending = []
        for saving in self._saves:
            if not saving.done():
                pending.append(saving)
                continue
            try:
                saving.result(0)
            except Exception as e:  # noqa: BLE001 - a store never fails the step
                logger.warning("kvtier store failed (the KV stays computed, not cached): %s", e)
        self._saves = pending

    def _store_groups(self, stores: list[_Job]) -> None:
        """A model of several groups: each group's gathered pages (``save_kv_layer``), the
        leading ones a sliding window dropped from kvtier, stored under its layout."""
        for job in stores:
            for group in self._groups:
                parts = self._saving.get((job.req_id, group.index))
                if parts is None or any(p is None for p in parts):
                    continue
                # [blocks, layers, ...]: each block's payload layer-major, contiguous, in
                # host memory for the store.
                blocks = torch.stack([p for p in parts if p is not None], dim=1).cpu()
                try:
                    lead = self._leading_blocks(group, job, len(job.tokens) // self._block_size - blocks.shape[0])
                    if lead is None:
                        continue
                    whole = torch.cat([lead, blocks]) if lead.shape[0] else blocks.contiguous()
                    raw = whole.view(torch.uint8).reshape(-1).numpy()
                    self._client.store(self._layout(group, job.salt), job.tokens, raw)
                except kvtier.KvtierError as e:
                    logger.warning("kvtier store failed (the KV stays computed, not cached): %s", e)

    def _leading_blocks(self, group: _Group, job: _Job, n: int) -> torch.Tensor | None:
        """The first `n` blocks of `job`'s group that vLLM no longer holds (a sliding
        window's), from kvtier — [n, layers, ...] — or None when kvtier does not hold them
        all (the chain is then not stored: it is stored from its start)."""
        if n == 0 or self._kv_caches is None:
            return None if n else torch.empty(0)
        return self._fetch(group, job.salt, job.tokens[: n * self._block_size], n)

    def get_block_ids_with_load_errors(self) -> set[int]:
        try:
            self._settle()  # (done already when vLLM called wait_for_save)
        except Exception:  # noqa: BLE001 - never out of a hook
            logger.exception("KvtierConnector: settling this step's loads failed")
        failed, self._load_errors = self._load_errors, set()
        return failed
