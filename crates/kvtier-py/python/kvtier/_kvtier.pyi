"""Type stubs of the extension module (see the Rust sources in crates/kvtier-py/src)."""

from collections.abc import Mapping, Sequence
from os import PathLike
from types import TracebackType
from typing import Any, Literal, Self, TypeAlias, final

from typing_extensions import Buffer

#: Any object with the buffer protocol (bytes, bytearray, memoryview, numpy arrays):
#: checked when called. Not `Buffer` alone: numpy's arrays meet that protocol in type
#: checkers only from Python 3.12.
_BufferLike: TypeAlias = Buffer | Any

__version__: str
#: The core's names of its error kinds (``kvtier.errors`` has one class for each).
ERROR_KINDS: list[str]

def stream_copy(dst: _BufferLike, src: _BufferLike) -> int:
    """Copies ``src`` into ``dst`` (same length) with kvtier's streaming stores; the
    number of bytes. For benchmarks: the best copy into memory out of the CPU cache."""

@final
class Layout:
    """A layout registered with an engine: what every block under it is computed for."""

    @property
    def digest(self) -> str: ...
    @property
    def block_bytes(self) -> int: ...
    @property
    def tokens_per_block(self) -> int: ...
    @property
    def num_layers(self) -> int: ...
    @property
    def dtype(self) -> str: ...
    @property
    def state_bytes(self) -> int: ...
    @property
    def checkpoint_every(self) -> int | None: ...

@final
class Hit:
    """How much of a prompt is cached: the leading whole blocks found, and where."""

    @property
    def matched_tokens(self) -> int: ...
    @property
    def blocks(self) -> int: ...
    @property
    def nbytes(self) -> int: ...
    @property
    def tiers(self) -> list[str]: ...
    @property
    def state_tier(self) -> str | None: ...
    def prefix(self, blocks: int) -> Hit:
        """The first ``blocks`` matched blocks only (a load of part of the hit)."""
    @staticmethod
    def join(hits: Sequence[Hit]) -> Hit:
        """The blocks of ``hits`` (one layout, one cache, no recurrent state) as one hit,
        in order: one load of many short prompts' blocks."""
    def __bool__(self) -> bool: ...

@final
class Block(Buffer):
    """A loaded block: a read-only buffer over kvtier's own bytes (no copy)."""

    @property
    def address(self) -> int: ...
    def tobytes(self) -> bytes: ...
    def __len__(self) -> int: ...

@final
class Restored:
    """Every group's part of one token boundary (KV blocks and recurrent state), or nothing."""

    @property
    def tokens(self) -> int: ...
    @property
    def blocks(self) -> list[Block]: ...
    @property
    def state(self) -> Block | None: ...
    def __bool__(self) -> bool: ...

@final
class Lease:
    """The blocks of a hit held in place: ``places`` is ``(address, nbytes)`` of each
    (read-only memory), valid until ``release()`` or the end of a ``with`` block."""

    @property
    def places(self) -> list[tuple[int, int]]: ...
    def __len__(self) -> int: ...
    def release(self) -> None: ...
    def __enter__(self) -> Self: ...
    def __exit__(self, *exc: object) -> None: ...

@final
class Reservation:
    """Room for the blocks of a store: write each block whole at its ``places`` entry,
    then ``commit()`` (the same answer as ``store``); ``cancel()`` gives it back."""

    @property
    def places(self) -> list[tuple[int, int]]: ...
    def __len__(self) -> int: ...
    def commit(
        self, durability: Literal["queued", "written", "synced"] | None = None
    ) -> dict[str, Any]: ...
    def cancel(self) -> None: ...

#: One group of recurrent layers: (kind, num_layers, state_bytes).
_StateGroup: TypeAlias = tuple[str, int, int]

class Cache:
    """A kvtier cache: an engine in this process (``settings`` or ``config_file``, with
    the settings and defaults of ``kvtier serve``) or a client of the ``kvtier serve`` at
    ``url`` (``token``: its data token, or a tenant's token; ``shm``: its shared-arena
    socket on this host; ``connect_timeout``, ``request_timeout``, ``transfer_timeout``: the
    deadlines of its calls in seconds, default 2, 5 and 60 — past one a call raises
    ``UnavailableError``).
    The package's ``Engine`` and ``Client`` subclass it; ``kvtier.open`` chooses and shares
    one engine per process and settings."""

    def __new__(
        cls,
        url: str | None = None,
        settings: Mapping[str, Any] | None = None,
        *,
        config_file: str | PathLike[str] | None = None,
        token: str | None = None,
        shm: str | PathLike[str] | None = None,
        connect_timeout: float | None = None,
        request_timeout: float | None = None,
        transfer_timeout: float | None = None,
    ) -> Self: ...
    def register_layout(
        self,
        model: str,
        dtype: str,
        tokens_per_block: int,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        *,
        tp_rank: int = 0,
        tp_size: int = 1,
        pp_stage: int = 0,
        pp_size: int = 1,
        lora_id: str | None = None,
        tenant_salt: bytes | None = None,
        weights_digest: str | None = None,
        tokenizer_digest: str | None = None,
        state_groups: Sequence[_StateGroup] | None = None,
        checkpoint_every: int | None = None,
        cold_codec: Literal["fp8_e4m3"] | None = None,
    ) -> Layout: ...
    def lookup(self, layout: Layout, tokens: Sequence[int]) -> Hit: ...
    def lookup_many(self, layout: Layout, prompts: Sequence[Sequence[int]]) -> list[Hit]:
        """``lookup`` of many short prompts, in order (one request to a server)."""
    def store_many(
        self,
        layout: Layout,
        prompts: Sequence[Sequence[int]],
        blocks: Sequence[_BufferLike | Sequence[_BufferLike]],
    ) -> list[dict[str, Any]]:
        """``store`` of many short prompts (``blocks[i]``: prompt ``i``'s), one answer
        each, in order (one request to a server over HTTP)."""
    def store(
        self,
        layout: Layout,
        tokens: Sequence[int],
        blocks: _BufferLike | Sequence[_BufferLike],
    ) -> dict[str, Any]: ...
    def load(self, hit: Hit) -> list[Block]: ...
    def load_into(self, hit: Hit, out: _BufferLike, layers: tuple[int, int] | None = None) -> int: ...
    def snapshot_put(
        self,
        layout: Layout,
        tokens: Sequence[int],
        state: _BufferLike,
        session: bytes | None = None,
    ) -> Literal["stored", "replaced", "rejected"]: ...
    def snapshot_get(
        self, layout: Layout, tokens: Sequence[int], session: bytes | None = None
    ) -> Block | None: ...
    def checkpoint_put(
        self, layout: Layout, tokens: Sequence[int], blocks: int, state: _BufferLike
    ) -> Literal["stored", "replaced", "rejected"]: ...
    def restore(self, layout: Layout, tokens: Sequence[int]) -> Restored: ...
    @property
    def arena(self) -> tuple[int, int] | None:
        """``(address, nbytes)`` of an engine's RAM-tier arena in this process, or of the
        read-only mapping of a server's shared arena (a client opened with ``shm``);
        ``None`` for a server's client over HTTP only."""
    @property
    def staging(self) -> tuple[int, int] | None:
        """``(address, nbytes)`` of a shared-arena client's staging memory; ``None`` for an
        engine and a client over HTTP only."""
    def lease(self, hit: Hit) -> Lease:
        """The matched blocks of ``hit`` held in place, for a caller that copies them
        itself (a GPU); refused for a client over HTTP only."""
    def reserve(
        self, layout: Layout, tokens: Sequence[int], blocks: int, first_block: int = 0
    ) -> Reservation:
        """Room for ``blocks`` blocks of ``tokens`` from ``first_block`` on, written in
        place and then committed; refused for a client over HTTP only."""
    def stats(self) -> dict[str, int]: ...
    def kv_events(self) -> dict[str, Any] | None: ...
    def flush(self, timeout: float = 30.0) -> bool: ...
    def close(self, timeout: float = 30.0) -> None: ...
    @property
    def embedded(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def __enter__(self) -> Self: ...
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool: ...
