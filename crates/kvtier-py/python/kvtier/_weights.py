"""The identity of a model's weights, for the ``weights_digest`` of its layouts.

KV computed by one set of weights is wrong for any other, so a connector must never key
two checkpoints alike. A model's name or path alone does not pin its weights: a local
directory can be redeployed with new weights, and a hub name without a revision follows
its ``main`` branch. ``weights_identity`` decides, in this order:

1. ``weights_digest`` given by the operator: used as it is (they know best);
2. a local directory: a SHA-256 over its weight and config files' names and contents,
   remembered per file by device, inode, size and change times in a small cache file
   (``$KVTIER_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvtier``, else ``~/.cache/kvtier``), so
   only a start after the files changed reads them again (about 2 GB/s: 8 s for 16 GB);
3. a hub name: the commit the local hub cache resolves the revision (or ``main``) to,
   read offline from the cache;
4. otherwise ``None``: the connector caches nothing for this model (when in doubt, miss).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from pathlib import Path

#: Files whose bytes decide a checkpoint's KV: the weights and the model's configuration.
_WEIGHT_FILES = re.compile(r".*\.(safetensors|bin|pt|pth|gguf|ckpt)$|^config\.json$|^params\.json$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def weights_identity(model: str, revision: str | None, explicit: str | None = None) -> str | None:
    """What identifies ``model``'s weights (see the module docs), or ``None`` when nothing
    does."""
    if explicit:
        return str(explicit)
    path = Path(model)
    if path.is_dir():
        return directory_digest(path)
    if revision and _COMMIT.match(revision):
        return f"hf:{revision}"
    return _hub_commit(model, revision)


def directory_digest(root: Path) -> str | None:
    """A digest of the weight and config files under ``root`` (names relative to it, in
    order, and contents); ``None`` when it holds none."""
    files = sorted(p for p in root.rglob("*") if p.is_file() and _WEIGHT_FILES.match(p.name))
    if not files:
        return None
    remembered = _load_cache()
    changed = False
    whole = hashlib.sha256()
    for f in files:
        stat = f.stat()
        # The change time cannot be set by a user: any write to the file moves it.
        tag = f"{stat.st_dev}:{stat.st_ino}:{stat.st_size}:{stat.st_mtime_ns}:{stat.st_ctime_ns}"
        key = str(f.resolve())
        digest = remembered.get(key, {}).get(tag)
        if digest is None:
            with f.open("rb") as fh:
                digest = hashlib.file_digest(fh, "sha256").hexdigest()
            remembered[key] = {tag: digest}
            changed = True
        name = f.relative_to(root).as_posix()
        whole.update(f"{len(name)}:{name}:{digest}\n".encode())
    if changed:
        _save_cache(remembered)
    return "sha256:" + whole.hexdigest()


def _hub_commit(model: str, revision: str | None) -> str | None:
    """The commit the local hub cache holds for ``model`` at ``revision`` (offline)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return None
    try:
        found = try_to_load_from_cache(model, "config.json", revision=revision or None)
    except Exception:  # noqa: BLE001 - a name the hub cache cannot parse pins nothing
        return None
    if not isinstance(found, str):
        return None
    commit = Path(found).parent.name
    return f"hf:{commit}" if _COMMIT.match(commit) else None


def _cache_file() -> Path:
    base = os.environ.get("KVTIER_CACHE_DIR")
    if base:
        return Path(base) / "weights-digests.json"
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "kvtier" / "weights-digests.json"


def _load_cache() -> dict[str, dict[str, str]]:
    try:
        data = json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _save_cache(data: dict[str, dict[str, str]]) -> None:
    """Writes the cache whole through a rename (processes starting together each write a
    complete file; the last one wins). A cache that cannot be written costs only a reread
    at the next start."""
    target = _cache_file()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=target.parent, delete=False, suffix=".tmp") as tmp:
            json.dump(data, tmp)
        os.replace(tmp.name, target)
    except OSError:
        pass
