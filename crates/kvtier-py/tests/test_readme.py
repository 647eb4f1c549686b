"""README's Python example, run exactly as README prints it (as the Rust tests run its curl
block): a newcomer who pastes it gets a store, a lookup and a load that round-trip."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

README = pathlib.Path(__file__).resolve().parents[3] / "README.md"


def test_readme_python_example_runs_as_printed(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "README has one Python example"
    example = blocks[0]
    # Run where a user would: a fresh directory (the example keeps its data in ./kvtier-data).
    done = subprocess.run(
        [sys.executable, "-c", example],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "kvtier-data").is_dir()
