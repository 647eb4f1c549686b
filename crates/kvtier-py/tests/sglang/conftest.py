"""SGLang for the HiCache backend's tests: the pinned wheel scripts/setup.sh installs beside
the project's .venv (`.venv/sglang-overlay`, without its GPU dependencies), and a stand-in
for IPython. Missing, the tests fail and say how to install it: they never skip."""

from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
OVERLAY = Path(os.environ.get("KVTIER_SGLANG_OVERLAY", ROOT / ".venv" / "sglang-overlay"))
SHIMS = Path(__file__).resolve().parent / "shims"

if not (OVERLAY / "sglang").is_dir():
    raise RuntimeError(
        f"SGLang is not installed at {OVERLAY}: run scripts/setup.sh "
        "(it installs crates/kvtier-py/requirements-sglang.txt there)"
    )
# After the venv's own packages: SGLang's pins (torch and the rest) are not installed;
# the venv's torch and friends are used.
for path in (OVERLAY, SHIMS):
    if str(path) not in sys.path:
        sys.path.append(str(path))
