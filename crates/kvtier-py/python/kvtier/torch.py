"""kvtier's blocks to and from an engine's paged KV caches held in torch tensors, on a GPU
or on the CPU (docs/python.md, "kvtier.torch"). The only module of the package that
imports torch.

- ``PagedCache``: an engine's paged cache as kvtier sees it — for each layer, the tensors
  a page lives in, each indexed by page (block) id in its first dimension. A kvtier block
  of such a cache is, layer after layer, each tensor's page of that block, back to back.
  ``PagedCache.vllm`` and ``PagedCache.sglang`` build one from those engines' caches.
- ``register(cache)``: registers the memory kvtier's blocks lie in (``cache.arena``) with
  CUDA once, so that copies from it are DMA at the PCIe limit (through torch's own
  cudart; nothing is built against CUDA).
- ``load_to(cache, hit, paged, block_ids)``: copies a hit's blocks from where kvtier holds
  them (an engine's arena, a server's shared arena) straight into the engine's pages,
  recording one event per layer so that a forward pass waits for layer ``i`` only.
- ``save_from(cache, layout, tokens, paged, block_ids)``: gathers pages into room kvtier
  reserved (arena slots, or a server's staging memory) on a side stream and commits once
  the copy has finished, off the caller's path.

The copies go by layer chunks: one copy per block per chunk of layers between host memory
and a staging tensor on the device (a few large transfers, not one per page), then one
gather or scatter per layer and tensor on the device.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from kvtier._kvtier import Cache, Hit, Layout
from kvtier.errors import InvalidError

#: Bytes a host↔device copy should move at least (whole blocks are cut into chunks of
#: layers no smaller than this): smaller copies run far below the PCIe limit.
CHUNK_BYTES = 512 << 10

# torch.cuda's stream, event and cudart constructors are untyped: called through this.
_cuda: Any = torch.cuda

# cudaHostRegister flags (cuda_runtime_api.h).
_REGISTER_PORTABLE = 0x01
_REGISTER_READ_ONLY = 0x08


@dataclass(frozen=True)
class PagedCache:
    """For each layer, the tensors a page lives in, each ``[num_pages, ...]`` (dim 0 the
    page id), all on one device; a kvtier block is every layer's pages back to back."""

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
            if not t[0].is_contiguous():
                raise InvalidError("a page must be contiguous in its tensor")

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

    def chunks(self) -> list[tuple[int, int, int]]:
        """``(first layer, end layer, byte offset in a block)`` of each chunk of layers a
        copy moves at once: at least ``CHUNK_BYTES`` (the last one what is left)."""
        out, start, offset, size = [], 0, 0, 0
        for i in range(len(self.layers)):
            size += self.page_bytes(i)
            if size >= CHUNK_BYTES or i == len(self.layers) - 1:
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
    """A load under way (see ``load_to``): ``blocks`` pages are being filled; ``wait_layer(i)``
    makes the current stream wait for layer ``i``'s pages, ``synchronize()`` for all of them
    (and ends the lease on kvtier's memory)."""

    def __init__(self, blocks: int, events: list[Any], lease: Any, stream: Any) -> None:
        self.blocks = blocks
        self._events = events
        self._lease = lease
        self._stream = stream

    def wait_layer(self, layer: int) -> None:
        event = self._events[layer] if self._events else None
        if event is not None:
            torch.cuda.current_stream().wait_event(event)

    def synchronize(self) -> None:
        if self._stream is not None:
            self._stream.synchronize()
        if self._lease is not None:
            self._lease.release()
            self._lease = None

    def __del__(self) -> None:
        # Never let kvtier reuse memory a copy may still be reading.
        try:
            self.synchronize()
        except Exception:  # noqa: BLE001 - at interpreter exit torch may be gone already
            pass


def load_to(
    cache: Cache,
    hit: Hit,
    paged: PagedCache,
    block_ids: Sequence[int],
    *,
    stream: Any | None = None,
) -> Loading:
    """Copies the leading blocks of ``hit`` into ``paged``'s pages ``block_ids`` (block ``j``
    of the hit into page ``block_ids[j]``), from where kvtier holds them. On a GPU the copies
    run on ``stream`` (default: a new side stream) with one event per layer; call
    ``wait_layer(i)`` before layer ``i`` runs and ``synchronize()`` when done. Fewer blocks
    than asked are filled when kvtier lost some since the lookup (``Loading.blocks``)."""
    lease = cache.lease(hit)
    places = lease.places
    n = min(len(places), len(block_ids))
    if any(nbytes != paged.block_bytes for _, nbytes in places[:n]):
        lease.release()
        raise InvalidError(f"kvtier's blocks are not {paged.block_bytes} bytes, this cache's block")
    if n == 0:
        lease.release()
        return Loading(0, [], None, None)
    device = paged.device
    cuda = device.type == "cuda"
    side = (stream or _cuda.Stream(device=device)) if cuda else None
    if side is not None:
        # The pages are written only after whatever the caller queued before (a page's
        # previous user may still be reading it).
        side.wait_stream(torch.cuda.current_stream(device))
    sources = [_host(address, nbytes) for address, nbytes in places[:n]]
    events: list[Any] = [None] * len(paged.layers)
    with torch.cuda.stream(side) if cuda else _nothing():
        ids = torch.tensor(list(block_ids[:n]), dtype=torch.long, device=device)
        for start, end, offset in paged.chunks():
            size = sum(paged.page_bytes(i) for i in range(start, end))
            stage = torch.empty((n, size), dtype=torch.uint8, device=device)
            for j, src in enumerate(sources):
                stage[j].copy_(src[offset : offset + size], non_blocking=cuda)
            at = 0
            for i in range(start, end):
                for t in paged.layers[i]:
                    page = t[0].numel() * t.element_size()
                    pages = stage[:, at : at + page].view(t.dtype).view(n, *t.shape[1:])
                    t.index_copy_(0, ids, pages)
                    at += page
            if cuda:
                event = _cuda.Event()
                event.record(side)
                for i in range(start, end):
                    events[i] = event
    if not cuda:
        lease.release()
        return Loading(n, [], None, None)
    # The lease holds kvtier's memory until the copies from it are done.
    return Loading(n, events, lease, side)


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
    … of ``tokens``: gathered into room kvtier reserved, on ``stream`` (default: a new side
    stream) for a GPU, and committed on a thread of its own once the copy has finished, so
    the caller goes on at once. ``Saving.result()`` is the store's answer."""
    if layout.block_bytes != paged.block_bytes:
        raise InvalidError(f"layout blocks of {layout.block_bytes} bytes; this cache's are {paged.block_bytes}")
    n = len(block_ids)
    reservation = cache.reserve(layout, list(tokens), n, first_block)
    saving = Saving()
    device = paged.device
    cuda = device.type == "cuda"
    side = (stream or _cuda.Stream(device=device)) if cuda else None
    try:
        targets = [_host(address, nbytes) for address, nbytes in reservation.places]
        if side is not None:
            # The pages as they are now: the side stream starts after the caller's work.
            side.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(side) if cuda else _nothing():
            ids = torch.tensor(list(block_ids), dtype=torch.long, device=device)
            for start, end, offset in paged.chunks():
                parts = [
                    t.index_select(0, ids).view(n, -1).view(torch.uint8)
                    for i in range(start, end)
                    for t in paged.layers[i]
                ]
                stage = torch.cat(parts, dim=1) if len(parts) > 1 else parts[0]
                for j, dst in enumerate(targets):
                    dst[offset : offset + stage.shape[1]].copy_(stage[j], non_blocking=cuda)
            event = None
            if cuda:
                event = _cuda.Event()
                event.record(side)
    except BaseException:
        reservation.cancel()
        raise

    def commit() -> None:
        try:
            if event is not None:
                event.synchronize()
            saving._finish(reservation.commit(durability), None)
        except BaseException as e:  # noqa: BLE001 - handed to the caller by result()
            saving._finish(None, e)

    threading.Thread(target=commit, name="kvtier-save", daemon=True).start()
    return saving


class _nothing:
    """A context manager that does nothing (the CPU's stand-in for a stream context)."""

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
