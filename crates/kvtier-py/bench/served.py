"""`kvtier serve` for the Python bench rows: an optimised binary (``KVTIER_BIN``, else this
checkout's target/release/kvtier) on an ephemeral loopback port, RAM only, stopped when
the block ends."""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


@contextlib.contextmanager
def kvtier_serve(data_dir: Path, ram: str) -> Iterator[str]:
    """A running ``kvtier serve`` on ``data_dir`` with ``ram`` of RAM tier; its URL."""
    binary = os.environ.get("KVTIER_BIN") or str(ROOT / "target" / "release" / "kvtier")
    server = subprocess.Popen(
        [binary, "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir), "--ram", ram,
         "--set", "ssd.enabled=false"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        url = None
        assert server.stdout is not None
        for line in server.stdout:
            found = re.search(r"listening on (http://\S+)", line)
            if found:
                url = found.group(1)
                break
        assert url, "kvtier serve did not start"
        yield url
    finally:
        server.terminate()
        server.wait(timeout=60)
