"""Shared by the Python tests: this folder on sys.path (for `serve`)."""

import os
import shutil
import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def kvtier_cache_dir():
    """The weights digests the connectors remember (kvtier/_weights.py) go to a directory
    of the session's own, never the user's ~/.cache; engines the tests start inherit it."""
    path = tempfile.mkdtemp(prefix="kvtier-test-cache-")
    before = os.environ.get("KVTIER_CACHE_DIR")
    os.environ["KVTIER_CACHE_DIR"] = path
    yield path
    if before is None:
        os.environ.pop("KVTIER_CACHE_DIR", None)
    else:
        os.environ["KVTIER_CACHE_DIR"] = before
    shutil.rmtree(path, ignore_errors=True)
