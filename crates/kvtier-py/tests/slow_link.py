"""S3 behind a slow link, for tests of what kvtier does with a slow tier: moto's S3 server
as a child process (scripts/setup.sh installs it for the system python3) and a loopback
TCP relay that holds every chunk of the server's answers for a while before passing it
on (a far-away or congested object store)."""

from __future__ import annotations

import re
import socket
import subprocess
import threading
import time
import urllib.request


class Moto:
    """moto's S3 server on an ephemeral loopback port, with ``bucket`` created."""

    def __init__(self, bucket: str = "kvtier") -> None:
        self.process = subprocess.Popen(
            ["python3", "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.url: str | None = None
        assert self.process.stderr is not None
        deadline = time.monotonic() + 60
        while self.url is None and time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line:
                break
            found = re.search(r"Running on (http://127\.0\.0\.1:\d+)", line)
            if found:
                self.url = found.group(1)
        if self.url is None:
            self.stop()
            raise RuntimeError("moto's S3 server did not start (scripts/setup.sh installs moto[server])")
        # moto keeps writing to stderr: drain it so it never blocks on a full pipe.
        threading.Thread(target=self.process.stderr.read, daemon=True).start()
        self.bucket = bucket
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/{bucket}", method="PUT"), timeout=10)

    def stop(self) -> None:
        self.process.kill()
        self.process.wait()


class SlowLink:
    """A relay on an ephemeral loopback port to ``target`` (``http://host:port``) that
    delays each chunk of the answers by ``delay`` seconds (requests pass at once)."""

    def __init__(self, target: str, delay: float) -> None:
        host, port = target.removeprefix("http://").rsplit(":", 1)
        self._target = (host, int(port))
        self._delay = delay
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._listener.getsockname()[1]}"
        self._closed = threading.Event()
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            self._sockets += [client, upstream]
            threading.Thread(target=self._pump, args=(client, upstream, 0.0), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, self._delay), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, delay: float) -> None:
        try:
            while chunk := source.recv(1 << 16):
                if delay:
                    time.sleep(delay)
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._closed.set()
        self._listener.close()
        for s in self._sockets:
            s.close()
