"""kvtier's errors: one class per kind, the kinds the HTTP server answers with."""

from __future__ import annotations


class KvtierError(Exception):
    """Any kvtier error. ``kind`` says what to do about it (the server's error kind)."""

    kind: str = "internal"
    #: The server's error code (``unknown_layout``, ``bad_json``, …), for errors a
    #: server answered; ``None`` otherwise.
    code: str | None = None

    def __init__(self, message: str, kind: str | None = None, code: str | None = None) -> None:
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        self.code = code


class InvalidError(KvtierError, ValueError):
    """The request itself is wrong (sizes, dtype, unknown layout, too many tokens)."""

    kind = "invalid"


class NoSpaceError(KvtierError):
    """The store cannot hold the data; nothing was stored."""

    kind = "no_space"


class CorruptError(KvtierError):
    """Stored bytes failed verification; they are never returned."""

    kind = "corrupt"


class UnavailableError(KvtierError, ConnectionError):
    """A device or service is unavailable; retrying later may succeed."""

    kind = "unavailable"


class ClosedError(KvtierError):
    """The engine has been closed."""

    kind = "closed"


class InternalError(KvtierError):
    """A bug: an invariant inside kvtier did not hold."""

    kind = "internal"


_BY_KIND: dict[str, type[KvtierError]] = {
    c.kind: c
    for c in (
        InvalidError,
        NoSpaceError,
        CorruptError,
        UnavailableError,
        ClosedError,
        InternalError,
    )
}


def error_for(kind: str, message: str, code: str | None = None) -> KvtierError:
    """The exception for an error of ``kind`` (called by the extension module)."""
    return _BY_KIND.get(kind, KvtierError)(message, kind, code)
