"""Shared by the Python tests: this folder on sys.path (for `serve`)."""

import pytest

from serve import env_dir


@pytest.fixture(scope="session", autouse=True)
def kvtier_cache_dir():
    """The weights digests the connectors remember (kvtier/_weights.py) go to a directory
    of the session's own, never the user's ~/.cache; engines the tests start inherit it."""
    with env_dir("KVTIER_CACHE_DIR", "kvtier-test-cache-") as path:
        yield path
