"""The type stubs say what the extension module really has, and the package type-checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import kvtier


def run(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # In a temporary folder: mypy's cache lands there, not in the checkout.
    return subprocess.run(
        [sys.executable, "-m", *args], capture_output=True, text=True, timeout=300, cwd=cwd
    )


def test_the_stubs_match_the_extension_module(tmp_path: Path) -> None:
    done = run(tmp_path, "mypy.stubtest", "kvtier._kvtier", "kvtier.errors")
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_package_type_checks_strictly(tmp_path: Path) -> None:
    package = Path(kvtier.__file__).parent.resolve()
    done = run(tmp_path, "mypy", "--strict", "--no-incremental", str(package))
    assert done.returncode == 0, done.stdout + done.stderr
