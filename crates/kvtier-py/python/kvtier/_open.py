"""How Python opens kvtier: ``Engine`` (in this process), ``Client`` (of a ``kvtier
serve``), both the extension's one ``Cache`` class with the same calls, and ``open``, which
the connectors use, sharing one engine per process and settings."""

from __future__ import annotations

import atexit
import json
import threading
from collections.abc import Mapping
from os import PathLike, fspath
from typing import Any

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
    blocks are loaded in place and stores go, never over TCP."""

    def __new__(
        cls, url: str, token: str | None = None, *, shm: str | PathLike[str] | None = None
    ) -> Client:
        return super().__new__(cls, url=url, token=token, shm=shm)


_SHARED: dict[str, Engine] = {}
_SHARED_LOCK = threading.Lock()


def open(  # noqa: A001 - the package's verb, as in `kvtier.open(...)`
    url: str | None = None,
    settings: Mapping[str, Any] | None = None,
    *,
    config_file: str | PathLike[str] | None = None,
    token: str | None = None,
    shm: str | PathLike[str] | None = None,
) -> Cache:
    """kvtier for a connector: the ``kvtier serve`` at ``url`` (a ``Client``; ``shm``: its
    shared-arena socket), or this process's engine for ``settings`` or ``config_file``
    (an ``Engine``).

    Every caller in a process that asks for the same settings gets the same engine (the
    scheduler and the workers of one vLLM process, several SGLang backends): two engines
    on one SSD directory would refuse each other's lock. Shared engines are closed
    (flushed) when the process exits; closing one early makes the next ``open`` start a
    new one.
    """
    if url is not None:
        if settings is not None or config_file is not None:
            raise InvalidError("kvtier.open: give a server's url or an engine's settings, not both")
        return Client(url, token, shm=shm)
    if token is not None:
        raise InvalidError("kvtier.open: a token is for a server's url")
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
