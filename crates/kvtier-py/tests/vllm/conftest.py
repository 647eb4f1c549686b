"""Shared by the vLLM tests: the engines' IPC sockets in a directory of the session's own.

vLLM names each ZeroMQ IPC socket after a fresh UUID under ``VLLM_RPC_BASE_PATH``, the
system temp directory by default, and leaves the socket files behind when its process
ends: about 175 per run of these tests. Every engine these tests start inherits this
process's environment, so pointing the variable at a directory removed at the end of the
session leaves nothing behind.
"""

import os
import shutil
import tempfile

import pytest


@pytest.fixture(scope="session", autouse=True)
def engine_ipc_dir():
    path = tempfile.mkdtemp(prefix="kvtier-vllm-ipc-")
    before = os.environ.get("VLLM_RPC_BASE_PATH")
    os.environ["VLLM_RPC_BASE_PATH"] = path
    yield path
    if before is None:
        os.environ.pop("VLLM_RPC_BASE_PATH", None)
    else:
        os.environ["VLLM_RPC_BASE_PATH"] = before
    shutil.rmtree(path, ignore_errors=True)
