"""kvtier as SGLang's HiCache storage backend (SGLang 0.5.23, the ``dynamic`` backend).

Select it with::

    --enable-hierarchical-cache --hicache-storage-backend dynamic
    --hicache-storage-backend-extra-config '{"backend_name": "kvtier",
        "module_path": "kvtier.sglang_hicache", "class_name": "KvtierHiCacheStorage",
        "interface_v1": 1, "url": "http://127.0.0.1:7700", "tenant": "team-a"}'

The cache is a ``kvtier serve`` (``url``, and ``token`` when it needs one: every SGLang
process and replica shares it) or an engine embedded in the scheduler process
(``engine``: ``kvtier serve``'s settings as a dict, or the path of its settings file).

SGLang names each page of a host pool by a 64-hex digest chained over the prefix (one key
stands for every token before it, and the request's cache salt). kvtier files a page as a
one-block prompt whose eight tokens are the key's 32 bytes, under a layout of its own per
pool. The layout names what makes pages incompatible: the model, the pool (``kv``,
``mamba``), its memory layout, dtype, page size and per-page geometry, the access path (v1
zero-copy pages and generic flat pages order bytes differently), the tensor-parallel rank
(not for rank-replicated MLA pools) and size, the pipeline stage, and the ``tenant`` from
the extra config. So a page is only ever served to the same deployment and tenant, and a
key that is not 64 hex digits is a miss, never a lookup.

- KV pages are kvtier blocks. SGLang's calls take a batch of pages, and so does kvtier:
  ``batch_exists`` is one lookup of every key (one request to a server, memory only), a
  get one lookup and one load of the pages found (each block copied straight into the
  page's regions of the pool), a set one lookup and one store of the pages kvtier lacks
  (a page that is one piece of the pool's memory is sent from where it lies; a page in
  pieces, layer by layer, is gathered into one buffer first).
- Mamba states (the v2 calls, ``PoolName.MAMBA``, one state per key) are kvtier
  checkpoints of a recurrent-only layout: their own budget, the SSD tier, S3.
- ``batch_exists`` answers the leading run of pages held; ``batch_exists_v2`` the longest
  prefix every pool can restore (trailing pages for Mamba), as SGLang's file backend
  does. Per-page results stop at the first failure: SGLang counts only leading pages.

docs/sglang.md.
"""

from __future__ import annotations

import ctypes
import logging
import re
import struct
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

import kvtier
from kvtier._open import cold_codec_of, timeouts_of

try:
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore[import-not-found, unused-ignore]
        HiCacheStorage,
        PoolHitPolicy,
        PoolName,
        PoolTransferResult,
    )
except ImportError as e:  # pragma: no cover - only without SGLang
    raise ImportError(
        "kvtier.sglang_hicache needs SGLang 0.5.23 (scripts/setup.sh installs it for the tests)"
    ) from e

logger = logging.getLogger(__name__)

_KEY = re.compile(r"[0-9a-f]{64}")
#: kvtier tokens per page: the key's 32 bytes as eight u32 words.
_WORDS = 8
_DTYPES = {
    "torch.float32": "f32",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.float8_e4m3fn": "fp8_e4m3",
    "torch.float8_e5m2": "fp8_e5m2",
    "torch.int8": "i8",
    "torch.uint8": "i8",
}


def _words(key: str) -> list[int] | None:
    """The eight tokens a page key is filed under; None for a key that is not 64 hex."""
    if not isinstance(key, str) or not _KEY.fullmatch(key):
        return None
    return list(struct.unpack("<8I", bytes.fromhex(key)))


def _name(pool_name: Any) -> str:
    return str(getattr(pool_name, "value", pool_name))


@dataclass
class _Pool:
    """One registered host pool and how its pages are filed in kvtier."""

    name: str
    host: Any
    layout: kvtier.Layout
    page_size: int
    page_bytes: int
    #: Recurrent state (checkpoints) rather than KV pages (blocks).
    state: bool


class KvtierHiCacheStorage(HiCacheStorage):  # type: ignore[misc, unused-ignore]
    """SGLang's ``HiCacheStorage`` on kvtier (see the module's documentation)."""

    def __init__(self, storage_config: Any, kwargs: Any = None) -> None:
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self._config = storage_config
        self._v1 = bool(extra.get("interface_v1"))
        self._tenant = str(extra.get("tenant", "")).encode()
        self._weights = str(extra.get("weights_digest", ""))
        # Whether the KV layouts allow fp8 pages in kvtier's cold tiers (ADR 0021).
        self._cold_codec = cold_codec_of(extra)
        self._kv: kvtier.Cache
        if "url" in extra:
            self._kv = kvtier.open(url=str(extra["url"]), token=extra.get("token"), **timeouts_of(extra))
        elif isinstance(extra.get("engine"), dict):
            # One engine per process and settings, shared with every other backend
            # (and connector) of this process that asks for the same settings.
            self._kv = kvtier.open(settings=extra["engine"])
        elif isinstance(extra.get("engine"), str):
            self._kv = kvtier.open(config_file=Path(extra["engine"]))
        else:
            raise ValueError(
                "kvtier's HiCache backend needs `url` (a kvtier serve) or `engine` "
                "(settings or a settings file) in the extra config"
            )
        self._pools: dict[str, _Pool] = {}
        self._lock = threading.Lock()
        self.mem_pool_host: Any = None
        self.registered_pools: dict[Any, Any] = {}

    # -- pools --------------------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host
        self._register(PoolName.KV, mem_pool_host)

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        self.registered_pools[host_pool_name] = host_pool
        self._register(host_pool_name, host_pool)

    def _register(self, pool_name: Any, host: Any) -> None:
        name = _name(pool_name)
        with self._lock:
            if name in self._pools and self._pools[name].host is host:
                return
            try:
                self._pools[name] = self._file(name, host)
            except (ValueError, kvtier.KvtierError) as e:
                # Its pages will be misses and failed backups; SGLang keeps running.
                logger.error("kvtier: pool %s cannot be filed: %s", name, e)
                self._pools.pop(name, None)

    def _file(self, name: str, host: Any) -> _Pool:
        cfg = self._config
        page_size = int(getattr(host, "page_size", 1) or 1)
        state = name == _name(PoolName.MAMBA)
        ptrs, sizes = self._meta(host, torch.arange(page_size, dtype=torch.int64))
        page_bytes = int(sum(sizes))
        dtype = str(getattr(host, "dtype", "torch.uint8"))
        layers = int(getattr(host, "layer_num", 0) or 0)
        mla = bool(getattr(cfg, "is_mla_model", False))
        identity = "/".join(
            [
                "sglang-hicache",
                str(getattr(cfg, "model_name", "") or "unnamed"),
                name,
                str(getattr(host, "layout", "")),
                "v1" if self._v1 else "flat",
                f"{dtype}/P{page_size}/L{layers}/{'x'.join(str(s) for s in sizes)}",
            ]
        )
        common: dict[str, Any] = {
            "tp_rank": 0 if mla else int(getattr(cfg, "tp_rank", 0)),
            "tp_size": int(getattr(cfg, "tp_size", 1)),
            "pp_stage": int(getattr(cfg, "pp_rank", 0)),
            "pp_size": int(getattr(cfg, "pp_size", 1)),
            "tenant_salt": self._tenant,
            "weights_digest": self._weights or None,
        }
        if state:
            layout = self._kv.register_layout(
                identity,
                "f32",
                _WORDS,
                0,
                1,
                1,
                state_groups=[(f"sglang/{name}/{len(ptrs)}-parts", max(layers, 1), page_bytes)],
                checkpoint_every=_WORDS,
                **common,
            )
        else:
            kv_dtype = _DTYPES.get(dtype)
            itemsize = int(getattr(getattr(host, "dtype", None), "itemsize", 0) or 0)
            per = max(layers, 1) * 2 * _WORDS * itemsize
            if kv_dtype is None or itemsize == 0 or page_bytes % per:
                raise ValueError(
                    f"pages of {page_bytes} bytes in {dtype} over {layers} layers do not "
                    "fit a kvtier block"
                )
            layout = self._kv.register_layout(
                identity,
                kv_dtype,
                _WORDS,
                max(layers, 1),
                1,
                page_bytes // per,
                cold_codec=self._cold_codec,
                **common,
            )
        if not state and layout.block_bytes != page_bytes:
            raise ValueError(
                f"kvtier blocks of {layout.block_bytes} bytes for pages of {page_bytes}"
            )
        return _Pool(name, host, layout, page_size, page_bytes, state)

    @staticmethod
    def _meta(host: Any, indices: Any) -> tuple[list[int], list[int]]:
        ptrs, sizes = host.get_page_buffer_meta(indices)
        return [int(p) for p in ptrs], [int(s) for s in sizes]

    # -- pages --------------------------------------------------------------------------

    def _has(self, pool: _Pool, words: list[int]) -> bool:
        return bool(self._kv.lookup(pool.layout, words))

    def _regions(self, pool: _Pool, start: int) -> list[tuple[int, int]]:
        """Where page ``start`` of the host pool lies: ``(address, bytes)`` pieces, adjacent
        ones merged (a page-first pool's page is one piece)."""
        idx = torch.arange(start, start + pool.page_size, dtype=torch.int64)
        ptrs, sizes = self._meta(pool.host, idx)
        merged: list[tuple[int, int]] = []
        for ptr, size in zip(ptrs, sizes):
            if merged and merged[-1][0] + merged[-1][1] == ptr:
                merged[-1] = (merged[-1][0], merged[-1][1] + size)
            else:
                merged.append((ptr, size))
        return merged

    @staticmethod
    def _page_buffer(pool: _Pool, regions: list[tuple[int, int]]) -> Any:
        """A page's bytes as one buffer: the host pool's own memory when the page is one
        piece (stored from where it lies), else gathered into one."""
        if len(regions) == 1:
            ptr, size = regions[0]
            return (ctypes.c_uint8 * size).from_address(ptr)
        page = bytearray(pool.page_bytes)
        base = ctypes.addressof((ctypes.c_char * pool.page_bytes).from_buffer(page))
        at = 0
        for ptr, size in regions:
            ctypes.memmove(base + at, ptr, size)
            at += size
        return page

    def _starts(self, pool: _Pool | None, keys: list[str], host_indices: Any) -> list[int] | None:
        """Each page's first host slot; ``None`` (logged) when the indices do not fit."""
        if pool is None or host_indices is None:
            return None
        if int(host_indices.numel()) != len(keys) * pool.page_size:
            logger.error(
                "kvtier: %d host indices for %d pages of %d slots in pool %s",
                int(host_indices.numel()),
                len(keys),
                pool.page_size,
                pool.name,
            )
            return None
        return [int(i) for i in host_indices[:: pool.page_size].tolist()]

    def _lookup(self, pool: _Pool, keys: list[str]) -> list[Any]:
        """The hits of the leading keys that are 64 hex digits, in one lookup of them all
        (one request to a server); none when the lookup fails (SGLang computes them)."""
        words: list[list[int]] = []
        for key in keys:
            w = _words(key)
            if w is None:
                break
            words.append(w)
        if not words:
            return []
        try:
            return list(self._kv.lookup_many(pool.layout, words))
        except kvtier.KvtierError as e:
            logger.warning("kvtier: lookup of %d pages of pool %s: %s", len(words), pool.name, e)
            return []

    def _held(self, pool: _Pool, keys: list[str]) -> list[bool]:
        """Whether kvtier holds each of the leading keys' pages (see ``_lookup``)."""
        return [bool(hit) for hit in self._lookup(pool, keys)]

    def _get_pages(self, pool: _Pool | None, keys: list[str], host_indices: Any) -> list[bool]:
        """Pages into the host pool until one is missing or fails (SGLang counts only the
        leading pages): KV pages in one lookup and one load of them all; states one by
        one."""
        out = [False] * len(keys)
        starts = self._starts(pool, keys, host_indices)
        if pool is None or starts is None:
            return out
        if pool.state:
            return self._one_by_one(pool, keys, starts, self._get_state)
        hits = self._lookup(pool, keys)
        n = next((i for i, hit in enumerate(hits) if hit.blocks != 1), len(hits))
        if n == 0:
            return out
        try:
            blocks = self._kv.load(kvtier.Hit.join(hits[:n]))
        except kvtier.KvtierError as e:
            logger.warning("kvtier: load of %d pages of pool %s: %s", n, pool.name, e)
            return out
        for i, block in enumerate(blocks[:n]):
            regions = self._regions(pool, starts[i])
            if len(block) != pool.page_bytes or sum(size for _, size in regions) != pool.page_bytes:
                break
            at = block.address
            for ptr, size in regions:
                ctypes.memmove(ptr, at, size)
                at += size
            out[i] = True
        return out

    def _put_pages(self, pool: _Pool | None, keys: list[str], host_indices: Any) -> list[bool]:
        """Pages from the host pool into kvtier until one fails: the KV pages kvtier lacks
        in one store of them all (a page already held is idempotent: the same key is the
        same page); states one by one."""
        out = [False] * len(keys)
        starts = self._starts(pool, keys, host_indices)
        if pool is None or starts is None:
            return out
        if pool.state:
            return self._one_by_one(pool, keys, starts, self._put_state)
        held = self._held(pool, keys)
        ok = list(held)
        todo: list[int] = []
        buffers: list[Any] = []
        for i, have in enumerate(held):
            if have:
                continue
            regions = self._regions(pool, starts[i])
            if sum(size for _, size in regions) != pool.page_bytes:
                ok = ok[:i]
                break
            todo.append(i)
            buffers.append(self._page_buffer(pool, regions))
        if todo:
            words = [_words(keys[i]) or [] for i in todo]
            try:
                answers = self._kv.store_many(pool.layout, words, buffers)
            except kvtier.KvtierError as e:
                logger.warning("kvtier: store of %d pages of pool %s: %s", len(todo), pool.name, e)
                answers = []
            for i, report in zip(todo, answers):
                ok[i] = report.get("stopped") is None and (
                    report["stored"] + report["duplicates"] + report["stored_lower_only"] == 1
                )
        for i, good in enumerate(ok):
            if not good:
                break
            out[i] = True
        return out

    def _put_state(self, pool: _Pool, key: str, start: int) -> bool:
        words = _words(key)
        if words is None:
            return False
        if self._has(pool, words):
            return True  # idempotent: the same key is the same state
        regions = self._regions(pool, start)
        if sum(size for _, size in regions) != pool.page_bytes:
            return False
        return self._kv.checkpoint_put(pool.layout, words, 1, self._page_buffer(pool, regions)) != "rejected"

    def _get_state(self, pool: _Pool, key: str, start: int) -> bool:
        words = _words(key)
        if words is None:
            return False
        got = self._kv.restore(pool.layout, words)
        source = got.state if got else None
        if source is None or len(source) != pool.page_bytes:
            return False
        regions = self._regions(pool, start)
        if sum(size for _, size in regions) != pool.page_bytes:
            return False
        at = source.address
        for ptr, size in regions:
            ctypes.memmove(ptr, at, size)
            at += size
        return True

    def _one_by_one(self, pool: _Pool, keys: list[str], starts: list[int], op: Any) -> list[bool]:
        """``op`` on each page until one fails (SGLang counts only leading pages)."""
        out = [False] * len(keys)
        for i, key in enumerate(keys):
            try:
                ok = op(pool, key, starts[i])
            except kvtier.KvtierError as e:
                logger.warning("kvtier: page %s of pool %s: %s", key, pool.name, e)
                ok = False
            if not ok:
                break
            out[i] = True
        return out

    def _pool(self, pool_name: Any) -> _Pool | None:
        return self._pools.get(_name(pool_name))

    # -- v1: zero-copy pages of the KV pool ----------------------------------------------

    def batch_exists(self, keys: list[str], extra_info: Any = None) -> int:
        """How many leading pages kvtier holds: one lookup of them all."""
        pool = self._pool(PoolName.KV)
        if pool is None:
            return 0
        held = self._held(pool, keys)
        return held.index(False) if False in held else len(held)

    def batch_get_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        return self._get_pages(self._pool(PoolName.KV), keys, host_indices)

    def batch_set_v1(self, keys: list[str], host_indices: Any, extra_info: Any = None) -> list[bool]:
        return self._put_pages(self._pool(PoolName.KV), keys, host_indices)

    # -- v2: every pool of a hybrid model -------------------------------------------------

    def batch_exists_v2(
        self, keys: list[str], pool_transfers: Any = None, extra_info: Any = None
    ) -> Any:
        kv_pages = self.batch_exists(keys, extra_info)
        hits: dict[str, int] = {_name(PoolName.KV): kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for transfer in pool_transfers or []:
            if not restorable:
                break
            name = _name(transfer.name)
            pool = self._pool(transfer.name)

            flags = self._held(pool, keys[:kv_pages]) if pool is not None else []

            def held(i: int, flags: list[bool] = flags) -> bool:
                return i < len(flags) and flags[i]

            if transfer.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                window = max(1, len(transfer.keys or []) or 1)
                can = {
                    n
                    for n in range(1, kv_pages + 1)
                    if all(held(i) for i in range(max(0, n - window), n))
                }
            else:
                boundary = next((i for i in range(kv_pages) if not held(i)), kv_pages)
                can = set(range(1, boundary + 1))
            if can:
                hits[name] = max(can)
            restorable = [n for n in restorable if n in can]
        return PoolTransferResult(restorable[-1] if restorable else 0, hits, restorable)

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> dict[str, list[bool]]:
        return {
            t.name: self._get_pages(self._pool(t.name), list(t.keys or []), t.host_indices)
            for t in transfers
        }

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> dict[str, list[bool]]:
        return {
            t.name: self._put_pages(self._pool(t.name), list(t.keys or []), t.host_indices)
            for t in transfers
        }

    # -- the generic path: flat pages as tensors ------------------------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        pool = self._pool(PoolName.KV)
        words = _words(key)
        if pool is None or words is None or target_location is None:
            return None
        hit = self._kv.lookup(pool.layout, words)
        if not hit:
            return None
        nbytes = target_location.numel() * target_location.element_size()
        if not target_location.is_contiguous() or nbytes != pool.page_bytes:
            return None
        try:
            got = self._kv.load_into(hit, target_location.view(-1).view(torch.uint8).numpy())
        except kvtier.KvtierError:
            return None
        return target_location if got == 1 else None

    def batch_get(self, keys: list[str], target_locations: Any = None, target_sizes: Any = None) -> Any:
        targets = list(target_locations or [None] * len(keys))
        return [self.get(k, t) for k, t in zip(keys, targets)]

    def set(
        self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None
    ) -> bool:
        pool = self._pool(PoolName.KV)
        words = _words(key)
        if pool is None or words is None or value is None:
            return False
        if self._has(pool, words):
            return True
        flat = value.contiguous().view(-1)
        if flat.numel() * flat.element_size() != pool.page_bytes:
            return False
        report = self._kv.store(pool.layout, words, flat.view(dtype=torch.uint8).numpy())
        return report.get("stopped") is None and report["stored"] + report["duplicates"] == 1

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        return all(self.set(k, v) for k, v in zip(keys, list(values or [])))

    def clear(self) -> None:
        """Nothing: kvtier's data outlives one SGLang attachment (it ages out by budget)."""

    def close(self) -> None:
        """Closes (flushes) an embedded engine: the process's engine for these settings,
        so a later backend with them opens it anew (from its SSD)."""
        if self._kv.embedded:
            self._kv.close()
