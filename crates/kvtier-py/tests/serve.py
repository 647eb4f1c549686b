"""`kvtier serve` as a child process for the Python tests: an ephemeral loopback port,
stopped (SIGTERM, then SIGKILL) by the test that started it."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]


def kvtier_binary() -> str:
    path = os.environ.get("KVTIER_BIN") or str(ROOT / "target" / "debug" / "kvtier")
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"no kvtier binary at {path}: build it (cargo build -p kvtier) or set KVTIER_BIN")
    return path


class Server:
    """`kvtier serve` on an ephemeral loopback port."""

    def __init__(
        self, data_dir: Path, *extra: str, binary: str | None = None, env: dict[str, str] | None = None
    ) -> None:
        """``binary``: the program to run (default: this checkout's build); ``env``: its
        whole environment (default: the tests', without ``KVTIER_CONFIG``)."""
        self.process = subprocess.Popen(
            [binary or kvtier_binary(), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir),
             "--ram", "256MiB", "--set", "ssd.min_free=0", *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env if env is not None else {k: v for k, v in os.environ.items() if k != "KVTIER_CONFIG"},
        )
        self.url: str | None = None
        # With kv_events.endpoint set: where events are published (ports filled in).
        self.kv_events: str | None = None
        self.kv_replay: str | None = None
        assert self.process.stdout is not None
        for line in self.process.stdout:
            events = re.search(r"KV events on (\S+)(?: \(replay on (\S+)\))?", line)
            if events:
                self.kv_events, self.kv_replay = events.group(1), events.group(2)
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                self.url = found.group(1)
                break
        if self.url is None:
            self.process.kill()
            raise RuntimeError(f"kvtier serve did not start: {self.process.stderr.read() if self.process.stderr else ''}")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                return self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def kill9(self) -> None:
        self.process.kill()
        self.process.wait()

    def pause(self, within: float = 5.0) -> None:
        """SIGSTOP the server (a stalled host) and wait until every one of its threads is
        stopped: the stop is asynchronous, and a thread still running when the signal is
        sent could answer the next request."""
        os.kill(self.process.pid, signal.SIGSTOP)
        tasks = Path(f"/proc/{self.process.pid}/task")
        deadline = time.monotonic() + within
        while True:
            states = []
            for tid in tasks.iterdir():
                try:
                    states.append((tid / "stat").read_text().rsplit(")", 1)[1].split()[0])
                except FileNotFoundError:
                    pass  # a thread that ended meanwhile
            if states and all(st == "T" for st in states):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"kvtier serve's threads did not all stop: {states}")
            time.sleep(0.005)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`."""
        os.kill(self.process.pid, signal.SIGCONT)


@contextlib.contextmanager
def env_dir(variable: str, prefix: str) -> Iterator[str]:
    """A temporary directory named by ``variable`` in this process's environment (and so
    in every process a test starts) while the block runs; the variable's old value is put
    back and the directory removed after."""
    path = tempfile.mkdtemp(prefix=prefix)
    before = os.environ.get(variable)
    os.environ[variable] = path
    try:
        yield path
    finally:
        if before is None:
            os.environ.pop(variable, None)
        else:
            os.environ[variable] = before
        shutil.rmtree(path, ignore_errors=True)


@contextlib.contextmanager
def cache_of(kind: str, data_dir: Path) -> Iterator[Any]:
    """A ``kvtier.Cache`` of each kind a caller reaches: ``engine`` (in this process, RAM
    only), ``shared-arena`` (a ``kvtier serve`` on ``data_dir`` through its shared arena),
    ``http`` (the same server over HTTP only); closed, and the server stopped, after."""
    import kvtier

    if kind == "engine":
        engine = kvtier.Engine({"ram": "64MiB", "ssd": {"enabled": False}})
        try:
            yield engine
        finally:
            engine.close()
        return
    server = Server(data_dir, "--set", "ssd.enabled=false", "--set", "shm.enabled=true")
    try:
        client = kvtier.Client(server.url, shm=data_dir / "kvtier.sock" if kind == "shared-arena" else None)
        try:
            yield client
        finally:
            client.close()
    finally:
        server.stop()
