"""kvtier's blocks to and from an engine's paged KV caches held in torch tensors, on a GPU
or on the CPU (docs/python.md, "kvtier.torch"). The only module of the package that
imports torch.

- ``PagedCache``: an engine's paged cache as kvtier sees it — for each layer, the tensors
  a page lives in, each indexed by page (block) id in its first dimension. A kvtier block
  of such a cache is, layer after layer, each tensor's page of that block in logical
  order, back to back (the same bytes whatever the tensor's physical layout).
  ``PagedCache.vllm`` and ``PagedCache.sglang`` build one from those engines' caches.
- ``register(cache)``: registers the memory kvtier's blocks lie in (``cache.arena``) with
  CUDA once, so that copies from it are DMA at the PCIe limit (through torch's own
  cudart; nothing is built against CUDA).
- ``load_to(cache, hit, paged, block_ids)``: copies a hit's blocks into the engine's
  pages — straight from where kvtier holds them (an engine's arena, a server's shared
  arena), or fetched chunk by chunk from a server over HTTP — and says when each layer is
  written, so that a forward pass waits for layer ``i`` only, and gives up past a
  deadline without writing anything later.
- ``save_from(cache, layout, tokens, paged, block_ids)``: gathers pages on the device,
  copies them into room kvtier reserved (or pinned memory for a server over HTTP) on a
  side stream and commits once the copy has finished, off the caller's path.

The copies go by layer chunks: one copy per block per chunk of layers between host memory
and a staging tensor on the device (a few large transfers, not one per page), then one
gather or scatter per layer and tensor on the device.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kvtier._kvtier import Cache, Hit, Layout
from kvtier.errors import InvalidError

#: Bytes a host↔device copy should move at least (whole blocks are cut into chunks of
#: layers no smaller than this): smaller copies run far below the PCIe limit.
CHUNK_BYTES = 512 << 10

#: Bytes a fetch from a server over HTTP should move at least (all its blocks' chunk of
#: layers together): a request costs a round trip, so a short prompt's layers go in one
#: or a few requests and a long prompt's layer by layer, travelling while earlier layers
#: compute.
FETCH_BYTES = 1 << 20

# torch.cuda's stream, event and cudart constructors are untyped: called through this.
_cuda: Any = torch.cuda

# cudaHostRegister flags (cuda_runtime_api.h).
_REGISTER_PORTABLE = 0x01
_REGISTER_READ_ONLY = 0x08


@dataclass(frozen=True)
class PagedCache:
    """For each layer, the tensors a page lives in, each ``[num_pages, ...]`` (dim 0 the
    page id), all on one device; a kvtier block is every layer's pages back to back.

    A page's bytes are its elements in the tensor's logical (row-major) order, whatever
    the tensor's strides: an engine whose physical layout permutes a page (vLLM's
    ``LBNHC`` against its CPU backend's ``LBHNC``) stores and loads the same bytes for the
    same KV, so engines on different devices or attention backends share blocks, and the
    copies (``index_select``, ``index_copy_``) follow the strides on the device."""

    layers: tuple[tuple[torch.Tensor, ...], ...]

    def __post_init__(self) -> None:
        parts = [t for layer in self.layers for t in layer]
        if not parts:
            raise InvalidError("a paged cache needs at least one layer with one tensor")
        device, pages = parts[0].device, parts[0].shape[0]
        for t in parts:
            if t.device != device or t.shape[0] != pages:
                raise InvalidError(
                    "every tensor of a paged cache must be on one device with the same number of pages"
                )

    @classmethod
    def vllm(cls, kv_caches: Sequence[torch.Tensor]) -> PagedCache:
        """vLLM's caches, one per attention layer in forward order, each indexed by block
        id first (as the connector sees them)."""
        return cls(tuple((t,) for t in kv_caches))

    @classmethod
    def sglang(
        cls, k_buffers: Sequence[torch.Tensor], v_buffers: Sequence[torch.Tensor], page_size: int
    ) -> PagedCache:
        """SGLang's token pools, ``[tokens, heads, dim]`` per layer for K and for V; page
        ``p`` holds tokens ``p * page_size`` up to the next page."""
        if len(k_buffers) != len(v_buffers):
            raise InvalidError("as many V buffers as K buffers are needed")

        def paged(t: torch.Tensor) -> torch.Tensor:
            if t.shape[0] % page_size:
                raise InvalidError(f"{t.shape[0]} token slots are not whole pages of {page_size}")
            return t.view(t.shape[0] // page_size, page_size, *t.shape[1:])

        return cls(tuple((paged(k), paged(v)) for k, v in zip(k_buffers, v_buffers)))

    @property
    def device(self) -> torch.device:
        return self.layers[0][0].device

    @property
    def num_pages(self) -> int:
        return int(self.layers[0][0].shape[0])

    def page_bytes(self, layer: int) -> int:
        """Bytes of one page of ``layer`` (all its tensors)."""
        return sum(t[0].numel() * t.element_size() for t in self.layers[layer])

    @property
    def block_bytes(self) -> int:
        return sum(self.page_bytes(i) for i in range(len(self.layers)))

    def chunks(self, min_bytes: int = CHUNK_BYTES) -> list[tuple[int, int, int]]:
        """``(first layer, end layer, byte offset in a block)`` of each chunk of layers a
        copy moves at once: at least ``min_bytes`` of a block (the last one what is left)."""
        out, start, offset, size = [], 0, 0, 0
        for i in range(len(self.layers)):
            size += self.page_bytes(i)
            if size >= min_bytes or i == len(self.layers) - 1:
                out.append((start, i + 1, offset))
                start, offset, size = i + 1, offset + size, 0
        return out


def _host(address: int, nbytes: int) -> torch.Tensor:
    """A uint8 tensor over ``nbytes`` of host memory at ``address`` (kvtier's block memory;
    no copy). Read-only memory must only be read through it."""
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(address), dtype=torch.uint8)


_REGISTERED: set[tuple[int, int]] = set()
_REGISTERED_LOCK = threading.Lock()


def register(cache: Cache) -> bool:
    """Registers the memory kvtier's blocks lie in (``cache.arena``, and a client's staging
    memory) with CUDA, once per process and region, so that copies from and to it are DMA
    (a server's shared arena, mapped read-only here, with the read-only flag). Whether
    anything is registered: nothing without CUDA or without such memory (a client over
    HTTP only). Registering costs about 50 ms per GiB, once."""
    if not torch.cuda.is_available():
        return False
    regions = [(cache.arena, _REGISTER_PORTABLE | (0 if cache.embedded else _REGISTER_READ_ONLY))]
    if cache.staging is not None:
        regions.append((cache.staging, _REGISTER_PORTABLE))
    cudart = _cuda.cudart()
    done = False
    for region, flags in regions:
        if region is None:
            continue
        with _REGISTERED_LOCK:
            if region in _REGISTERED:
                done = True
                continue
            status = cudart.cudaHostRegister(region[0], region[1], flags)
            if int(status) != 0:
                raise InvalidError(f"cudaHostRegister of {region[1]} bytes failed: {status}")
            _REGISTERED.add(region)
            done = True
    return done


class Loading:
    """A load under way (see ``load_to``). ``wait_layer(i, timeout)`` returns once layer
    ``i``'s pages are written (on a GPU: the current stream waits for them) — ``False`` if
    they did not arrive in time, after which nothing more is written into the engine's
    pages; ``blocks`` is how many blocks every layer written so far holds (final once
    ``synchronize()`` returned); ``seconds`` how long kvtier took to deliver them."""

    def __init__(self, layers: int, first: int) -> None:
        self.first = first
        self.blocks = first
        #: Seconds from ``load_to`` until every layer was written (queued, on a GPU):
        #: kvtier's delivery time, which the load-or-recompute plans measure tiers by
        #: (``kvtier.rates``); ``None`` until then, and for a load that failed.
        self.seconds: float | None = None
        self._started = time.perf_counter()
        #: Per layer: the CUDA event after its pages' copies (None on the CPU or not yet).
        self._events: list[Any] = [None] * layers
        #: Per layer: set once it is settled — written, or never to be.
        self._ready = [threading.Event() for _ in range(layers)]
        #: Per layer: written (or nothing of it to write) before any cancellation.
        self._done = [False] * layers
        #: Guards ``_cancelled`` against a fetch that is about to write.
        self._lock = threading.Lock()
        self._cancelled = False
        self._lease: Any = None
        self._stream: Any = None
        self._thread: threading.Thread | None = None

    def wait_layer(self, layer: int, timeout: float | None = None) -> bool:
        self._ready[layer].wait(timeout)
        with self._lock:
            if not self._done[layer]:
                # Too late or failed: whatever arrives now is dropped, never written.
                self._cancelled = True
                return False
        event = self._events[layer]
        if event is not None:
            torch.cuda.current_stream().wait_event(event)
        return True

    def _settle(self, start: int, end: int, done: bool) -> None:
        """Layers ``start..end`` are settled (called with ``_lock`` held or before anyone
        waits)."""
        for i in range(start, end):
            self._done[i] = done
            self._ready[i].set()
        if self.seconds is None and all(self._done):
            self.seconds = time.perf_counter() - self._started

    @property
    def complete(self) -> bool:
        """Whether every layer is written (on a GPU: its copies queued; ``wait_layer``
        orders a stream after them) — without waiting for anything."""
        with self._lock:
            return all(self._done)

    def cancel(self) -> None:
        """Writes nothing more into the engine's pages (what was written stays)."""
        with self._lock:
            self._cancelled = True

    @property
    def cancelled(self) -> bool:
        return self._cancelled

    def try_release(self) -> bool:
        """Ends the lease if every copy from kvtier's memory is done, without waiting for
        anything; whether it ended (call again later if not)."""
        if self._thread is not None and self._thread.is_alive():
            return False
        if self._stream is not None and not self._stream.query():
            return False
        self.synchronize()  # nothing left to wait for
        return True

    def synchronize(self, timeout: float | None = None) -> None:
        """Waits for the copies (and a fetch's thread, up to ``timeout``; past it the load
        is cancelled), then ends the lease on kvtier's memory."""
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                self.cancel()
        if self._stream is not None:
            self._stream.synchronize()
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def __del__(self) -> None:
        # Never let kvtier reuse memory a copy may still be reading.
        try:
            if self._stream is not None:
                self._stream.synchronize()
            if self._lease is not None:
                self._lease.release()
        except Exception:  # noqa: BLE001 - at interpreter exit torch may be gone already
            pass


def load_to(
    cache: Cache,
    hit: Hit,
    paged: PagedCache,
    block_ids: Sequence[int],
    *,
    first: int = 0,
    stream: Any | None = None,
) -> Loading:
    """Copies blocks ``first`` … of ``hit`` into ``paged``'s pages ``block_ids[first:]``
    (block ``j`` of the hit into page ``block_ids[j]``; the first ``first`` pages hold
    those blocks already), recording when each layer is written, so that a forward pass
    waits for layer ``i`` only (``Loading.wait_layer``).

    From memory kvtier holds in this process (an engine's arena, a server's shared arena)
    the copies are queued at once, on ``stream`` (default: a new side stream) on a GPU.
    From a server over HTTP, a thread fetches one chunk of layers at a time into host
    memory (pinned on a GPU) and writes each into the pages as it arrives, so later
    layers travel while earlier ones compute. Fewer blocks than asked are written when
    kvtier lost some since the lookup (``Loading.blocks``)."""
    want = min(hit.blocks, len(block_ids))
    if want and hit.nbytes // max(hit.blocks, 1) != paged.block_bytes:
        raise InvalidError(
            f"kvtier's blocks are {hit.nbytes // max(hit.blocks, 1)} bytes, not {paged.block_bytes}, this cache's block"
        )
    loading = Loading(len(paged.layers), min(first, want))
    device = paged.device
    cuda = device.type == "cuda"
    side = (stream or _cuda.Stream(device=device)) if cuda else None
    if side is not None:
        # The pages are written only after whatever the caller queued before (a page's
        # previous user may still be reading it).
        side.wait_stream(torch.cuda.current_stream(device))
    loading._stream = side
    if want <= loading.first:
        loading._settle(0, len(paged.layers), True)
        return loading
    if cache.arena is not None:
        _load_in_place(cache, hit, paged, block_ids[:want], loading, side)
    else:
        loading._thread = threading.Thread(
            target=_fetch_chunks,
            args=(cache, hit, paged, list(block_ids[:want]), loading, side),
            name="kvtier-fetch",
            daemon=True,
        )
        loading._thread.start()
    return loading


def _write_chunk(
    paged: PagedCache,
    chunk: tuple[int, int, int],
    stage: torch.Tensor,
    ids: torch.Tensor,
    loading: Loading,
    side: Any,
) -> None:
    """Writes one chunk of layers of ``stage`` (``[blocks, chunk bytes]`` on the device)
    into pages ``ids``, and marks its layers written."""
    start, end, _ = chunk
    n, at = stage.shape[0], 0
    for i in range(start, end):
        for t in paged.layers[i]:
            page = t[0].numel() * t.element_size()
            pages = stage[:, at : at + page].view(t.dtype).view(n, *t.shape[1:])
            t.index_copy_(0, ids, pages)
            at += page
    if side is not None:
        event = _cuda.Event()
        event.record(side)
        for i in range(start, end):
            loading._events[i] = event


def _load_in_place(
    cache: Cache, hit: Hit, paged: PagedCache, block_ids: Sequence[int], loading: Loading, side: Any
) -> None:
    """Blocks kvtier holds in this process's memory: leased, and every chunk's copies
    queued now (on a GPU, DMA from the registered arena)."""
    lease = cache.lease(hit)
    places = lease.places
    n = min(len(places), len(block_ids))
    if any(nbytes != paged.block_bytes for _, nbytes in places[:n]):
        lease.release()
        raise InvalidError(f"kvtier's blocks are not {paged.block_bytes} bytes, this cache's block")
    first = loading.first
    if n <= first:
        lease.release()
        loading._settle(0, len(paged.layers), True)
        return
    device, cuda = paged.device, side is not None
    sources = [_host(address, nbytes) for address, nbytes in places[first:n]]
    with torch.cuda.stream(side) if cuda else _nothing():
        ids = torch.tensor(list(block_ids[first:n]), dtype=torch.long, device=device)
        for start, end, offset in paged.chunks():
            size = sum(paged.page_bytes(i) for i in range(start, end))
            stage = torch.empty((n - first, size), dtype=torch.uint8, device=device)
            for j, src in enumerate(sources):
                stage[j].copy_(src[offset : offset + size], non_blocking=cuda)
            _write_chunk(paged, (start, end, offset), stage, ids, loading, side)
    loading.blocks = n
    loading._settle(0, len(paged.layers), True)
    if cuda:
        loading._lease = lease  # held until the copies from it are done
    else:
        lease.release()


def _fetch_chunks(
    cache: Cache, hit: Hit, paged: PagedCache, block_ids: list[int], loading: Loading, side: Any
) -> None:
    """On a thread: each chunk of layers from a server (``load_into`` of that layer range),
    written into the pages unless the load was cancelled meanwhile. A chunk short of
    blocks lowers ``loading.blocks``; a failed one ends the load (its layers and the later
    ones are marked, with nothing written)."""
    device, cuda = paged.device, side is not None
    first, have = loading.first, len(block_ids)
    try:
        for start, end, offset in paged.chunks(-(-FETCH_BYTES // max(hit.blocks, 1))):
            size = sum(paged.page_bytes(i) for i in range(start, end))
            buf = torch.empty(hit.blocks * size, dtype=torch.uint8, pin_memory=cuda)
            got = min(cache.load_into(hit, buf.numpy(), layers=(start, end)), have)
            have = got
            with loading._lock:
                if loading._cancelled:
                    return
                if got > first:
                    with torch.cuda.stream(side) if cuda else _nothing():
                        ids = torch.tensor(block_ids[first:got], dtype=torch.long, device=device)
                        stage = buf.view(hit.blocks, size)[first:got].to(device, non_blocking=cuda)
                        _write_chunk(paged, (start, end, offset), stage, ids, loading, side)
                loading.blocks = got
                loading._settle(start, end, True)
    except Exception:  # noqa: BLE001 - a failed fetch is blocks not delivered
        pass
    finally:
        with loading._lock:
            unsettled = [i for i, r in enumerate(loading._ready) if not r.is_set()]
            if unsettled:
                loading.blocks = first
                loading._settle(unsettled[0], len(loading._ready), False)


class Saving:
    """A store under way (see ``save_from``): ``result()`` waits for the copy and the commit
    and returns the store's answer (or raises its error)."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._answer: dict[str, Any] | None = None
        self._error: BaseException | None = None

    def _finish(self, answer: dict[str, Any] | None, error: BaseException | None) -> None:
        self._answer, self._error = answer, error
        self._done.set()

    def done(self) -> bool:
        return self._done.is_set()

    def result(self, timeout: float | None = None) -> dict[str, Any]:
        if not self._done.wait(timeout):
            raise TimeoutError("the store did not finish in time")
        if self._error is not None:
            raise self._error
        assert self._answer is not None
        return self._answer


def save_from(
    cache: Cache,
    layout: Layout,
    tokens: Sequence[int],
    paged: PagedCache,
    block_ids: Sequence[int],
    *,
    first_block: int = 0,
    durability: Literal["queued", "written", "synced"] | None = None,
    stream: Any | None = None,
) -> Saving:
    """Stores pages ``block_ids`` of ``paged`` as blocks ``first_block``, ``first_block + 1``,
    … of ``tokens``, off the caller's path: ``Saving.result()`` is the store's answer.

    The pages are gathered on the device on the caller's current stream (ordered before
    anything the caller queues next, so the engine may reuse the pages at once; a device
    copy, at memory speed), then copied to host memory on ``stream`` (default: a new side
    stream) — into room kvtier reserved (arena slots, or a shared arena's staging memory)
    or, for a server over HTTP, into pinned memory — and committed or sent on a thread of
    its own once that copy has finished. (A server over HTTP takes stores from the
    prompt's first block: ``first_block`` must be 0 there.) The gathered pages use device
    memory until their copy is done: the blocks' size."""
    if layout.block_bytes != paged.block_bytes:
        raise InvalidError(f"layout blocks of {layout.block_bytes} bytes; this cache's are {paged.block_bytes}")
    n = len(block_ids)
    direct = cache.arena is not None
    if not direct and first_block:
        raise InvalidError("a store through a server over HTTP starts at the prompt's first block")
    device = paged.device
    cuda = device.type == "cuda"
    # Gathered now, on the caller's stream: [n, chunk bytes] per chunk of layers.
    ids = torch.tensor(list(block_ids), dtype=torch.long, device=device)
    stages = []
    for start, end, _ in paged.chunks():
        parts = [
            t.index_select(0, ids).reshape(n, -1).view(torch.uint8)
            for i in range(start, end)
            for t in paged.layers[i]
        ]
        stages.append(torch.cat(parts, dim=1) if len(parts) > 1 else parts[0])
    reservation = cache.reserve(layout, list(tokens), n, first_block) if direct else None
    pinned = None
    if reservation is not None:
        targets = [_host(address, nbytes) for address, nbytes in reservation.places]
    else:
        pinned = torch.empty((n, paged.block_bytes), dtype=torch.uint8, pin_memory=cuda)
        targets = list(pinned)
    saving = Saving()
    side = (stream or _cuda.Stream(device=device)) if cuda else None
    try:
        if side is not None:
            side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side) if cuda else _nothing():
            for (_, _, offset), stage in zip(paged.chunks(), stages):
                for j, dst in enumerate(targets):
                    dst[offset : offset + stage.shape[1]].copy_(stage[j], non_blocking=cuda)
            event = None
            if side is not None:
                event = _cuda.Event()
                event.record(side)
    except BaseException:
        if reservation is not None:
            reservation.cancel()
        raise

    def commit() -> None:
        try:
            if event is not None:
                event.synchronize()
            if reservation is not None:
                answer = reservation.commit(durability)
            else:
                assert pinned is not None
                answer = cache.store(layout, list(tokens), pinned.view(-1).numpy())
            saving._finish(answer, None)
        except BaseException as e:  # noqa: BLE001 - handed to the caller by result()
            saving._finish(None, e)
        finally:
            stages.clear()  # the device copies may go now

    threading.Thread(target=commit, name="kvtier-save", daemon=True).start()
    return saving


class _nothing:
    """A context manager that does nothing (the CPU's stand-in for a stream context)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
