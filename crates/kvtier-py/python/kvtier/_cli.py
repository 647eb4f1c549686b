"""The ``kvtier`` command of a Python environment the wheel was installed into: the
``kvtier`` binary the wheel carries (``kvtier/_bin/kvtier``), run in this process's place
(``execv``: same process id, signals and exit status as the binary's own), so
``pip install kvtier`` then ``kvtier serve`` works without a Rust toolchain."""

from __future__ import annotations

import os
import sys
from pathlib import Path


def binary() -> Path | None:
    """The binary this installation carries; ``None`` for a build of the package without
    it (a source build: ``scripts/build-wheel.sh`` puts it in the wheel)."""
    path = Path(__file__).resolve().parent / "_bin" / "kvtier"
    return path if os.access(path, os.X_OK) else None


def main() -> None:
    path = binary()
    if path is None:
        sys.stderr.write(
            "kvtier: this installation of the Python package carries no kvtier binary "
            "(it was built from source without it); build it with "
            "`cargo build --release -p kvtier`, or install the wheel scripts/build-wheel.sh makes\n"
        )
        raise SystemExit(2)
    os.execv(path, [str(path), *sys.argv[1:]])
