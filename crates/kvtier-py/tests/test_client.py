"""The client of `kvtier serve` through Python, against a real server process."""

from __future__ import annotations

import numpy as np
import pytest

import kvtier
from serve import Server

TPB = 16


@pytest.fixture
def server(tmp_path):
    s = Server(tmp_path / "data", "--set", "ssd.enabled=false")
    yield s
    s.stop()


def tokens(seed, blocks):
    return [(seed * 1_000_003 + t) % (1 << 31) for t in range(blocks * TPB)]


def payload(layout, seed, blocks):
    return np.random.default_rng(seed).integers(0, 256, blocks * layout.block_bytes, dtype=np.uint8)


def test_store_lookup_load_through_the_server(server):
    c = kvtier.Client(server.url)
    assert c.arena is None, "a server's arena is not mapped in its client"
    layout = c.register_layout("py-client", "f16", TPB, 2, 2, 64)
    assert layout.block_bytes == 16 << 10
    data = payload(layout, 1, 4)
    report = c.store(layout, tokens(1, 4), data)
    assert report["stored"] == 4 and report["stopped"] is None
    hit = c.lookup(layout, tokens(1, 4) + [5] * TPB)
    assert hit.matched_tokens == 4 * TPB and hit.tiers == ["ram"] * 4
    blocks = c.load(hit)
    assert b"".join(b.tobytes() for b in blocks) == data.tobytes()
    out = np.zeros(hit.nbytes, dtype=np.uint8)
    assert c.load_into(hit, out) == 4
    assert np.array_equal(out, data)
    assert c.stats()["ram_resident_blocks"] == 4
    # A list of one-block buffers works the same.
    parts = [bytes(data[i * layout.block_bytes : (i + 1) * layout.block_bytes]) for i in range(2)]
    assert c.store(layout, tokens(2, 2), parts)["stored"] == 2


def test_the_engine_and_the_client_agree_on_layouts_and_keys(server, tmp_path):
    # The same layout and tokens give the same digest and the same blocks in both.
    c = kvtier.Client(server.url)
    remote = c.register_layout("py-client", "f16", TPB, 2, 2, 64)
    with kvtier.Engine({"ram": "64MiB", "data_dir": str(tmp_path / "e"), "ssd": {"enabled": False}}) as kv:
        local = kv.register_layout("py-client", "f16", TPB, 2, 2, 64)
        assert local.digest == remote.digest
        with pytest.raises(kvtier.InvalidError, match="Client"):
            kv.lookup(remote, tokens(3, 1))
        kv.store(local, tokens(3, 1), payload(local, 3, 1))
        with pytest.raises(kvtier.InvalidError, match="Engine"):
            c.load(kv.lookup(local, tokens(3, 1)))


def test_snapshots_through_the_server(server):
    c = kvtier.Client(server.url)
    layout = c.register_layout("py-client", "f16", TPB, 2, 2, 64)
    state = np.arange(500, dtype=np.float32)
    c.snapshot_put(layout, tokens(4, 1), state)
    got = c.snapshot_get(layout, tokens(4, 1))
    assert np.array_equal(np.frombuffer(got, dtype=np.float32), state)
    assert c.snapshot_get(layout, tokens(4, 1), session=b"s") is None


def test_server_errors_keep_their_kind_and_code(server):
    c = kvtier.Client(server.url)
    layout = c.register_layout("py-client", "f16", TPB, 2, 2, 64)
    with pytest.raises(kvtier.InvalidError) as bad:
        c.register_layout("m", "f17", TPB, 2, 2, 64)
    assert bad.value.kind == "invalid" and bad.value.code
    with pytest.raises(kvtier.InvalidError, match="has 10 bytes"):
        c.store(layout, tokens(5, 1), [b"x" * 10])
    ghost = c.register_layout("py-client", "f16", TPB, 2, 2, 64)
    server.kill9()
    with pytest.raises(kvtier.UnavailableError) as gone:
        c.lookup(ghost, tokens(5, 1))
    assert isinstance(gone.value, ConnectionError) and gone.value.kind == "unavailable"


def test_a_restarted_server_serves_what_it_acknowledged_durably(tmp_path):
    data_dir = tmp_path / "data"
    s = Server(data_dir)
    c = kvtier.Client(s.url)
    layout = c.register_layout("py-client", "f16", TPB, 2, 2, 64)
    data = payload(layout, 6, 3)
    c.store(layout, tokens(6, 3), data)
    assert s.stop() == 0
    s = Server(data_dir)
    try:
        c = kvtier.Client(s.url)
        layout = c.register_layout("py-client", "f16", TPB, 2, 2, 64)
        hit = c.lookup(layout, tokens(6, 3))
        assert hit.matched_tokens == 3 * TPB and hit.tiers == ["ssd"] * 3
        out = np.zeros(hit.nbytes, dtype=np.uint8)
        assert c.load_into(hit, out) == 3
        assert np.array_equal(out, data)
    finally:
        s.stop()


def test_load_into_one_layer_range_through_the_server(server):
    c = kvtier.Client(server.url)
    layout = c.register_layout("py-client", "f16", TPB, 2, 2, 64)
    data = payload(layout, 41, 3)
    c.store(layout, tokens(41, 3), data)
    hit = c.lookup(layout, tokens(41, 3))
    page = layout.block_bytes // 2
    blocks = data.reshape(3, 2, page)
    for start, end in ((0, 1), (1, 2)):
        out = np.zeros(3 * page, dtype=np.uint8)
        assert c.load_into(hit, out, layers=(start, end)) == 3
        assert np.array_equal(out.reshape(3, 1, page), blocks[:, start:end])
    with pytest.raises(kvtier.InvalidError, match="layers"):
        c.load_into(hit, np.zeros(hit.nbytes, dtype=np.uint8), layers=(0, 3))


def test_a_client_on_the_same_host_goes_through_the_shared_arena(tmp_path):
    s = Server(tmp_path / "data", "--set", "ssd.enabled=false", "--set", "shm.enabled=true")
    try:
        socket = tmp_path / "data" / "kvtier.sock"
        local = kvtier.Client(s.url, shm=socket)
        remote = kvtier.Client(s.url)
        assert remote.arena is None
        address, nbytes = local.arena
        assert address > 0 and nbytes >= 256 << 20
        layout = local.register_layout("py-shm", "f16", TPB, 2, 2, 64)
        data = payload(layout, 51, 4)
        answer = local.store(layout, tokens(51, 4), data)
        assert answer["stored"] == 4
        hit = local.lookup(layout, tokens(51, 4))
        out = np.zeros(hit.nbytes, dtype=np.uint8)
        assert local.load_into(hit, out) == 4
        assert np.array_equal(out, data)
        # The same bytes over HTTP, for a client without the socket.
        over_http = np.zeros(hit.nbytes, dtype=np.uint8)
        assert remote.load_into(remote.lookup(layout, tokens(51, 4)), over_http) == 4
        assert np.array_equal(over_http, data)
        with pytest.raises(kvtier.InvalidError, match="socket"):
            kvtier.Cache(settings={}, shm=socket)
        with pytest.raises(kvtier.UnavailableError):
            kvtier.Client(s.url, shm=tmp_path / "nothing.sock")
    finally:
        s.stop()


def test_leases_and_reservations_give_block_memory_in_place(tmp_path):
    """`lease` and `reserve` (what kvtier.torch copies through) on a server's shared arena
    and on an engine: the addresses hold the blocks, written reservations store them."""
    import ctypes

    def view(address, nbytes):
        return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(address))

    s = Server(tmp_path / "data", "--set", "ssd.enabled=false", "--set", "shm.enabled=true")
    engine = kvtier.Engine({"ram": "64MiB", "ssd": {"enabled": False}})
    try:
        client = kvtier.Client(s.url, shm=tmp_path / "data" / "kvtier.sock")
        for cache in (client, engine):
            layout = cache.register_layout("py-direct", "f16", TPB, 2, 2, 64)
            data = payload(layout, 61, 3).reshape(3, -1)
            r = cache.reserve(layout, tokens(61, 3), 3)
            assert len(r) == 3 and all(n == layout.block_bytes for _, n in r.places)
            for (address, nbytes), block in zip(r.places, data):
                view(address, nbytes)[:] = block
            assert r.commit()["stored"] == 3
            with pytest.raises(kvtier.InvalidError, match="already"):
                r.commit()
            hit = cache.lookup(layout, tokens(61, 3))
            with cache.lease(hit) as lease:
                assert [view(a, n).tobytes() for a, n in lease.places] == [b.tobytes() for b in data]
            # A later part of the prompt, after its first block.
            r = cache.reserve(layout, tokens(62, 2), 1, first_block=1)
            r.cancel()
            assert cache.lookup(layout, tokens(62, 2)).blocks == 0
        http_only = kvtier.Client(s.url)
        hit = http_only.lookup(http_only.register_layout("py-direct", "f16", TPB, 2, 2, 64), tokens(61, 3))
        assert hit.blocks == 3
        with pytest.raises(kvtier.InvalidError, match="shared arena"):
            http_only.lease(hit)
    finally:
        engine.close()
        s.stop()


def test_a_stopped_server_is_an_error_within_the_deadlines_not_a_hang(tmp_path):
    """SIGSTOP the server (as a swapping or stalled host would be): every call fails with
    UnavailableError once past its deadline, for a plain client and one on the shared
    arena alike; after SIGCONT the same clients hit again."""
    import time

    s = Server(tmp_path / "data", "--set", "ssd.enabled=false", "--set", "shm.enabled=true")
    try:
        socket = tmp_path / "data" / "kvtier.sock"
        fast = dict(connect_timeout=0.5, request_timeout=0.5, transfer_timeout=1.0)
        plain = kvtier.Client(s.url, **fast)
        local = kvtier.Client(s.url, shm=socket, **fast)
        local_store = kvtier.Client(s.url, shm=socket, **fast)
        layout = plain.register_layout("py-deadline", "f16", TPB, 2, 2, 64)
        data = payload(layout, 61, 4)
        assert plain.store(layout, tokens(61, 4), data)["stored"] == 4
        hit = plain.lookup(layout, tokens(61, 4))
        s.pause()
        try:
            for name, call, limit in [
                ("lookup", lambda: plain.lookup(layout, tokens(61, 4)), 0.5),
                ("load", lambda: plain.load_into(hit, np.zeros(hit.nbytes, dtype=np.uint8)), 1.0),
                ("store", lambda: plain.store(layout, tokens(62, 4), data), 1.0),
                ("shm load", lambda: local.load_into(hit, np.zeros(hit.nbytes, dtype=np.uint8)), 1.0),
                ("shm store", lambda: local_store.store(layout, tokens(63, 4), data), 1.0),
            ]:
                t = time.monotonic()
                with pytest.raises(kvtier.UnavailableError):
                    call()
                took = time.monotonic() - t
                assert limit * 0.9 <= took < limit + 2.0, f"{name} took {took:.2f} s (deadline {limit} s)"
            with pytest.raises(kvtier.InvalidError, match="positive"):
                kvtier.Client(s.url, request_timeout=0)
            with pytest.raises(kvtier.InvalidError, match="server's url"):
                kvtier.open(settings={}, request_timeout=1.0)
        finally:
            s.resume()
        # The server is back: the HTTP client hits again. A shared-arena connection whose
        # call timed out is closed (the late answer would be read as the next call's): it
        # keeps failing, never reads a stale answer, and a new client connects afresh.
        again = plain.lookup(layout, tokens(61, 4))
        with pytest.raises(kvtier.UnavailableError):
            local.load_into(again, np.zeros(again.nbytes, dtype=np.uint8))
        assert again.matched_tokens == 4 * TPB
        out = np.zeros(again.nbytes, dtype=np.uint8)
        assert plain.load_into(again, out) == 4 and np.array_equal(out, data)
        fresh = kvtier.Client(s.url, shm=socket, **fast)
        out = np.zeros(again.nbytes, dtype=np.uint8)
        assert fresh.load_into(fresh.lookup(layout, tokens(61, 4)), out) == 4
        assert np.array_equal(out, data)
    finally:
        s.stop()


def test_a_tenant_token_reaches_only_its_tenants_layouts(tmp_path):
    """Scoped tokens through the Python client (issue 39): a tenant's layouts are its own —
    another tenant's client is refused on them with the server's code, and nothing of
    theirs changes."""
    config = tmp_path / "tenants.toml"
    config.write_text(
        '[auth.tenants.acme]\ntoken = "acme-token-for-python-01"\nsalt = "ac01"\n'
        '[auth.tenants.globex]\ntoken = "globex-token-for-python1"\nsalt = "90b1"\n'
    )
    server = Server(tmp_path / "data", "--set", "ssd.enabled=false", "--config", str(config))
    try:
        acme = kvtier.Client(server.url, token="acme-token-for-python-01")
        globex = kvtier.Client(server.url, token="globex-token-for-python1")
        layout = acme.register_layout("tenants", "f16", TPB, 2, 2, 64)
        data = payload(layout, 9, 2)
        assert acme.store(layout, tokens(9, 2), data)["stored"] == 2
        with pytest.raises(kvtier.KvtierError) as refused:
            globex.lookup(layout, tokens(9, 2))
        assert refused.value.code == "wrong_tenant"
        with pytest.raises(kvtier.KvtierError) as refused:
            globex.store(layout, tokens(10, 2), payload(layout, 10, 2))
        assert refused.value.code == "wrong_tenant"
        hit = acme.lookup(layout, tokens(9, 2))
        assert hit.matched_tokens == 2 * TPB
        assert b"".join(b.tobytes() for b in acme.load(hit)) == data.tobytes()
        # Globex's own registration of the same model is another layout (its salt).
        assert globex.register_layout("tenants", "f16", TPB, 2, 2, 64).digest != layout.digest
    finally:
        server.stop()
