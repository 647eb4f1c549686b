"""kvtier: a tiered, persistent, shareable KV-cache store for LLM inference.

>>> import kvtier
>>> kv = kvtier.open(settings={"ram": "256MiB", "ssd": {"enabled": False}})
>>> # or kvtier.open(url="http://127.0.0.1:7070"): a kvtier serve, the same calls
>>> layout = kv.register_layout("my-model", "f16", 16, 2, 2, 64)
>>> kv.store(layout, tokens, payload)       # one buffer of whole blocks, or a list
>>> hit = kv.lookup(layout, tokens)          # memory only
>>> blocks = kv.load(hit)                    # read-only views of kvtier's bytes
"""

from __future__ import annotations

from kvtier._kvtier import Block, Cache, Hit, Layout, Lease, Reservation, Restored, __version__
from kvtier._open import Client, Engine, open
from kvtier.errors import (
    ClosedError,
    CorruptError,
    InternalError,
    InvalidError,
    KvtierError,
    NoSpaceError,
    UnavailableError,
)

__all__ = [
    "Block",
    "Cache",
    "Client",
    "ClosedError",
    "CorruptError",
    "Engine",
    "Hit",
    "InternalError",
    "InvalidError",
    "KvtierError",
    "Layout",
    "Lease",
    "NoSpaceError",
    "Reservation",
    "Restored",
    "UnavailableError",
    "__version__",
    "open",
]
