"""The type stubs say what the extension module really has, and the package type-checks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import kvtier


def run(*args: str) -> subprocess.CompletedProcess[str]:
    # No cache: nothing written into the checkout.
    env = {**os.environ, "MYPY_CACHE_DIR": os.devnull}
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, env=env
    )


def test_the_stubs_match_the_extension_module() -> None:
    done = run("mypy.stubtest", "kvtier._kvtier", "kvtier.errors")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_package_type_checks_strictly() -> None:
    package = Path(kvtier.__file__).parent
    done = run("mypy", "--strict", "--no-incremental", str(package))
    assert done.returncode == 0, done.stdout + done.stderr
