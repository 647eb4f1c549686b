"""The wheel as users install it: built by scripts/build-wheel.sh (a debug build here, the
same recipe), installed with pip into a fresh virtual environment, and then `kvtier
serve` — the binary the wheel carries — run from that environment alone, with no Rust
toolchain on its PATH, answering `/health` and the package's own client. A build of the
package without the binary says so instead of failing obscurely."""

from __future__ import annotations

import os
import subprocess
import sys
import urllib.request
import zipfile

from serve import ROOT, Server


def test_a_fresh_environment_gets_kvtier_serve_from_the_wheel(tmp_path):
    out = tmp_path / "wheels"
    subprocess.run(
        [str(ROOT / "scripts" / "build-wheel.sh"), "--debug"],
        env={**os.environ, "KVTIER_WHEEL_OUT": str(out)},
        check=True,
        timeout=1800,
        cwd=ROOT,
    )
    (wheel,) = out.glob("kvtier-*.whl")
    entries = {i.filename: i.external_attr >> 16 for i in zipfile.ZipFile(wheel).infolist()}
    assert entries.get("kvtier/_bin/kvtier", 0) & 0o111, "the wheel carries no executable kvtier binary"
    assert not (ROOT / "crates" / "kvtier-py" / "python" / "kvtier" / "_bin").exists(), "the build left its copy"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    bin_dir = venv / "bin"
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", "--no-index", "--no-deps", str(wheel)],
        check=True,
        timeout=600,
    )
    # Only the environment and the system's directories: no cargo, no target/.
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "HOME": str(tmp_path)}
    # `kvtier` as the environment's PATH finds it: the wheel's command.
    server = Server(tmp_path / "data", binary="kvtier", env=env)
    try:
        url = server.url
        with urllib.request.urlopen(f"{url}/health", timeout=10) as answer:
            assert answer.status == 200
        # The installed package talks to the installed server.
        check = (
            "import kvtier, sys\n"
            "kv = kvtier.open(url=sys.argv[1])\n"
            "layout = kv.register_layout('wheel', 'f16', 16, 2, 2, 64)\n"
            "tokens = list(range(32))\n"
            "kv.store(layout, tokens, bytes(range(256)) * (2 * layout.block_bytes // 256))\n"
            "assert kv.lookup(layout, tokens).blocks == 2\n"
            "print(kvtier.__file__)\n"
        )
        ran = subprocess.run(
            [str(bin_dir / "python"), "-c", check, url], env=env, capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout.strip().startswith(str(venv)), ran.stdout
    finally:
        server.stop()
    # The binary gone (a source build has none): the command says what to do.
    (venv_package,) = (venv / "lib").glob("python3*/site-packages/kvtier/_bin/kvtier")
    venv_package.unlink()
    missing = subprocess.run(["kvtier", "serve"], env=env, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 2 and "carries no kvtier binary" in missing.stderr, missing.stderr
