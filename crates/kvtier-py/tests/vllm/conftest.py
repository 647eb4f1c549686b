"""Shared by the vLLM tests: the engines' IPC sockets in a directory of the session's own.

vLLM names each ZeroMQ IPC socket after a fresh UUID under ``VLLM_RPC_BASE_PATH``, the
system temp directory by default, and leaves the socket files behind when its process
ends: about 175 per run of these tests. Every engine these tests start inherits this
process's environment, so pointing the variable at a directory removed at the end of the
session leaves nothing behind.
"""

import pytest

from serve import env_dir


@pytest.fixture(scope="session", autouse=True)
def engine_ipc_dir():
    with env_dir("VLLM_RPC_BASE_PATH", "kvtier-vllm-ipc-") as path:
        yield path
