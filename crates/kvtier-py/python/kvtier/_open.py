"""How Python opens kvtier: ``Engine`` (in this process), ``Client`` (of a ``kvtier
serve``), both the extension's one ``Cache`` class with the same calls, and ``open``, which
the connectors use, sharing one engine per process and settings."""

from __future__ import annotations

import atexit
import json
import threading
from collections.abc import Mapping
from os import PathLike, fspath
from typing import Any, Literal, TypedDict

from kvtier._kvtier import Cache
from kvtier.errors import InvalidError


class Engine(Cache):
    """An engine in this process, with the settings (and defaults) of ``kvtier serve``:
    ``settings``, a dict in the settings file's shape (``{"ram": "2GiB", "ssd":
    {"enabled": False}}``), or ``config_file``, a settings file (TOML)."""

    def __new__(
        cls,
        settings: Mapping[str, Any] | None = None,
        *,
        config_file: str | PathLike[str] | None = None,
    ) -> Engine:
        return super().__new__(cls, settings=settings, config_file=config_file)


class Client(Cache):
    """A client of the ``kvtier serve`` at ``url`` (``http://HOST:PORT``), with the
    engine's calls; ``token``: the data token, when the server requires one; ``shm``: the
    server's shared-arena socket (``shm.socket``, on the same host), through which whole
    blocks are loaded in place and stores go, never over TCP.

    Every call has a deadline (seconds): ``connect_timeout`` to open a connection (default
    2), ``request_timeout`` for a lookup or another small call (5), ``transfer_timeout``
    for a load, store or restore (60). Past it the call raises ``UnavailableError``, which
    a connector takes as a miss: a stalled server is never waited on longer."""

    def __new__(
        cls,
        url: str,
        token: str | None = None,
        *,
        shm: str | PathLike[str] | None = None,
        connect_timeout: float | None = None,
        request_timeout: float | None = None,
        transfer_timeout: float | None = None,
    ) -> Client:
        return super().__new__(
            cls,
            url=url,
            token=token,
            shm=shm,
            connect_timeout=connect_timeout,
            request_timeout=request_timeout,
            transfer_timeout=transfer_timeout,
        )


class Timeouts(TypedDict, total=False):
    """A client's deadlines in seconds (``Client``'s keyword arguments)."""

    connect_timeout: float
    request_timeout: float
    transfer_timeout: float


def timeouts_of(config: Mapping[str, Any]) -> Timeouts:
    """The client deadlines a connector's extra config sets (``connect_timeout``,
    ``request_timeout``, ``transfer_timeout``, in seconds), as ``open``'s keyword
    arguments; the ones not set keep the client's defaults."""
    out = Timeouts()
    for name in ("connect_timeout", "request_timeout", "transfer_timeout"):
        if config.get(name) is not None:
            try:
                out[name] = float(config[name])  # type: ignore[literal-required]
            except (TypeError, ValueError):
                raise InvalidError(f"{name} must be a number of seconds, not {config[name]!r}") from None
    return out


def cold_codec_of(config: Mapping[str, Any]) -> Literal["fp8_e4m3"] | None:
    """The cold codec a connector's extra config asks its layouts to allow
    (``cold_codec``: ``"fp8_e4m3"``, or absent for none), as ``register_layout``'s
    keyword argument. A layout that allows fp8 is another layout (ADR 0021): its pages
    are never served to a deployment that did not ask for it, nor the other way."""
    codec = config.get("cold_codec")
    if codec is None:
        return None
    if codec != "fp8_e4m3":
        raise InvalidError(f"cold_codec must be \"fp8_e4m3\" or absent, not {codec!r}")
    return "fp8_e4m3"


_SHARED: dict[str, Engine] = {}
_SHARED_LOCK = threading.Lock()


def open(  # noqa: A001 - the package's verb, as in `kvtier.open(...)`
    url: str | None = None,
    settings: Mapping[str, Any] | None = None,
    *,
    config_file: str | PathLike[str] | None = None,
    token: str | None = None,
    shm: str | PathLike[str] | None = None,
    connect_timeout: float | None = None,
    request_timeout: float | None = None,
    transfer_timeout: float | None = None,
) -> Cache:
    """kvtier for a connector: the ``kvtier serve`` at ``url`` (a ``Client``; ``shm``: its
    shared-arena socket; the three timeouts: its calls' deadlines, see ``Client``), or
    this process's engine for ``settings`` or ``config_file`` (an ``Engine``).

    Every caller in a process that asks for the same settings gets the same engine (the
    scheduler and the workers of one vLLM process, several SGLang backends): two engines
    on one SSD directory would refuse each other's lock. Shared engines are closed
    (flushed) when the process exits; closing one early makes the next ``open`` start a
    new one.
    """
    if url is not None:
        if settings is not None or config_file is not None:
            raise InvalidError("kvtier.open: give a server's url or an engine's settings, not both")
        return Client(
            url,
            token,
            shm=shm,
            connect_timeout=connect_timeout,
            request_timeout=request_timeout,
            transfer_timeout=transfer_timeout,
        )
    if token is not None:
        raise InvalidError("kvtier.open: a token is for a server's url")
    if (connect_timeout, request_timeout, transfer_timeout) != (None, None, None):
        raise InvalidError("kvtier.open: timeouts are for a server's url")
    if shm is not None:
        raise InvalidError("kvtier.open: a shared arena's socket is for a server's url")
    if settings is not None and config_file is not None:
        raise InvalidError("kvtier.open: give settings or a config file, not both")
    key = json.dumps(
        {"file": fspath(config_file)} if config_file is not None else {"settings": settings or {}},
        sort_keys=True,
    )
    with _SHARED_LOCK:
        engine = _SHARED.get(key)
        if engine is None or engine.closed:
            engine = Engine(settings, config_file=config_file)
            _SHARED[key] = engine
            atexit.register(engine.close)
        return engine
