"""KV events in vLLM's wire format, read as a router reads them: vLLM's own decoder, gaps
filled by replay, a restart seen as a new epoch. Published by the embedded engine and by
`kvtier serve`, from kvtier's residency events (stores, evictions, the SSD tier)."""

from __future__ import annotations

import contextlib
import socket
import time

import msgspec
import numpy as np
import pytest
import zmq
from kv_consumer import IN_EPOCH, Consumer, epoch_of
from serve import Server
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

import kvtier

TPB = 16  # tokens per block; 2 layers x 2 heads x 64 dims x K,V x f16 = 16 KiB a block


def tokens(seed, blocks):
    return [(seed * 1_000_003 + t) % (1 << 31) for t in range(blocks * TPB)]


def payload(layout, seed, blocks):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=blocks * layout.block_bytes, dtype=np.uint8)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine(path, ram="256MiB", ssd=False, endpoint="tcp://127.0.0.1:0", replay="tcp://127.0.0.1:0", **extra):
    settings = {
        "ram": ram,
        "data_dir": str(path),
        "ssd": {"enabled": ssd, "min_free": "0"} if ssd else {"enabled": False},
        "kv_events": {"endpoint": endpoint, "replay_endpoint": replay, **extra},
    }
    return kvtier.Engine(settings)


@pytest.fixture
def kv(tmp_path):
    with engine(tmp_path) as e:
        yield e


@contextlib.contextmanager
def consumer_of(kv):
    """A consumer of `kv`'s events, caught up with what was published so far."""
    where = kv.kv_events()
    c = Consumer(where["endpoint"], where["replay_endpoint"])
    try:
        c.sync()
        yield c
    finally:
        c.close()


@pytest.fixture
def consumer(kv):
    with consumer_of(kv) as c:
        yield c


def layout_of(kv):
    return kv.register_layout("events-test", "f16", TPB, 2, 2, 64)


def test_an_epoch_opens_with_all_blocks_cleared_and_a_listing(kv, consumer):
    info = kv.kv_events()
    assert info["endpoint"].startswith("tcp://127.0.0.1:") and not info["endpoint"].endswith(":0")
    seq, first = consumer.log[0]
    assert epoch_of(seq) == info["epoch"] and seq & IN_EPOCH == 0
    assert isinstance(first, KVEventBatch)
    assert isinstance(first.events[0], AllBlocksCleared)
    assert first.data_parallel_rank == 0
    assert abs(first.ts - time.time()) < 60


def test_a_store_is_one_block_stored_chain_with_its_tokens(kv, consumer):
    layout = layout_of(kv)
    prompt = tokens(1, 4)
    assert kv.store(layout, prompt, payload(layout, 1, 4))["stored"] == 4
    consumer.wait_for(lambda: consumer.count("CPU") == 4)
    stored = [e for _, b in consumer.log for e in b.events if isinstance(e, BlockStored)]
    hashes = [h for e in stored for h in e.block_hashes]
    assert len(hashes) == 4 and len(set(hashes)) == 4
    assert all(isinstance(h, bytes) and len(h) == 16 for h in hashes)
    # The chain: the first block has no parent, every other one names the block before it.
    assert consumer.parents[hashes[0]] is None
    for prev, h in zip(hashes, hashes[1:]):
        assert consumer.parents[h] == prev
    assert [t for e in stored for t in e.token_ids] == prompt
    for e in stored:
        assert e.block_size == TPB
        assert e.medium == "CPU" and e.locality == "LOCAL" and e.ownership == "kvtier"
        assert e.lora_id is None and e.lora_name is None
    # The same prompt stored again: nothing new is held, nothing new is said.
    before = len(consumer.log)
    assert kv.store(layout, prompt, payload(layout, 1, 4))["stored"] == 0
    consumer.pump(0.5)
    assert len(consumer.log) == before
    # A different prompt sharing the first two blocks: only its two new blocks, the first
    # of them naming the shared second block as its parent.
    branch = prompt[: 2 * TPB] + tokens(2, 2)
    assert kv.store(layout, branch, payload(layout, 2, 4))["stored"] == 2
    consumer.wait_for(lambda: consumer.count("CPU") == 6)
    new = [h for _, b in consumer.log[before:] for e in b.events if isinstance(e, BlockStored) for h in e.block_hashes]
    assert len(new) == 2 and not set(new) & set(hashes)
    assert consumer.parents[new[0]] == hashes[1] and consumer.parents[new[1]] == new[0]
    assert [t for h in new for t in consumer.blocks[h].token_ids][-TPB:] == branch[-TPB:]


def test_evictions_are_block_removed_and_the_view_matches_what_ram_holds(tmp_path):
    # 512 KiB of RAM holds 32 blocks of 16 KiB: 64 stored blocks evict about half.
    with engine(tmp_path, ram="512KiB") as kv:
        with consumer_of(kv) as c:
            layout = layout_of(kv)
            for seed in range(8):
                kv.store(layout, tokens(10 + seed, 8), payload(layout, seed, 8))
            resident = kv.stats()["ram_resident_blocks"]
            assert 0 < resident < 64
            c.wait_for(lambda: c.count("CPU") == resident)
            removed = {h for _, b in c.log for e in b.events if isinstance(e, BlockRemoved) for h in e.block_hashes}
            stored = {h for _, b in c.log for e in b.events if isinstance(e, BlockStored) for h in e.block_hashes}
            assert all(e.medium == "CPU" for _, b in c.log for e in b.events if isinstance(e, BlockRemoved))
            # Every one of the 64 blocks was named; the evicted ones were removed last. (A
            # block evicted before its insertion was published is only ever said removed:
            # each message tells the block's state when it is sent.)
            assert len(stored | removed) == 64
            assert len(removed - c.held["CPU"]) == 64 - resident


def test_the_ssd_tier_is_its_own_medium(tmp_path):
    with engine(tmp_path, ssd=True) as kv:
        with consumer_of(kv) as c:
            layout = layout_of(kv)
            kv.store(layout, tokens(3, 3), payload(layout, 3, 3))
            assert kv.flush(30)
            c.wait_for(lambda: c.count("CPU") == 3 and c.count("SSD") == 3)
            assert c.held["CPU"] == c.held["SSD"]
            ssd = [e for _, b in c.log for e in b.events if isinstance(e, BlockStored) and e.medium == "SSD"]
            assert all(e.locality == "LOCAL" for e in ssd)


def test_replay_answers_a_missed_range_in_order_then_the_end_marker(kv, consumer):
    layout = layout_of(kv)
    for seed in range(5):
        kv.store(layout, tokens(20 + seed, 2), payload(layout, seed, 2))
    consumer.wait_for(lambda: consumer.count("CPU") == 10)
    seqs = [s for s, _ in consumer.log]
    middle = seqs[len(seqs) // 2]
    again = consumer.replay(middle)
    assert [s for s, _ in again] == [s for s in seqs if s >= middle]
    for (s, b), (s2, b2) in zip(again, [x for x in consumer.log if x[0] >= middle]):
        assert msgspec.msgpack.encode(b) == msgspec.msgpack.encode(b2)
    # Past the end: only the end marker.
    assert consumer.replay(seqs[-1] + 1) == []

    # A late subscriber misses everything so far and catches up through replay alone.
    where = kv.kv_events()
    late = Consumer(where["endpoint"], where["replay_endpoint"])
    try:
        kv.store(layout, tokens(40, 2), payload(layout, 40, 2))
        consumer.wait_for(lambda: consumer.count("CPU") == 12)
        late.sync()
        late.wait_for(lambda: late.count("CPU") == 12)
        assert late.held == consumer.held
    finally:
        late.close()


def test_malformed_replay_requests_get_no_answer_and_break_nothing(kv, consumer):
    where = kv.kv_events()
    ctx = zmq.Context.instance()
    bad = ctx.socket(zmq.DEALER)
    bad.setsockopt(zmq.LINGER, 0)
    bad.connect(where["replay_endpoint"])
    try:
        for frames in ([b"", b"short"], [b"x", (0).to_bytes(8, "big")], [b"", b"", b""], [b"only"]):
            bad.send_multipart(frames)
        assert not bad.poll(500), "a malformed request was answered"
    finally:
        bad.close(linger=0)
    assert kv.stats()["kv_events_bad_replay_requests"] == 4
    # Still serving well-formed requests.
    assert consumer.replay(0)[0][0] == consumer.log[0][0]


def test_a_restart_is_a_new_epoch_that_relists_what_the_ssd_kept(tmp_path):
    port, replay_port = free_port(), free_port()
    endpoint, replay = f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"
    c = Consumer(endpoint, replay)
    try:
        with engine(tmp_path, ssd=True, endpoint=endpoint, replay=replay) as kv:
            c.sync()
            first_epoch = kv.kv_events()["epoch"]
            layout = layout_of(kv)
            kv.store(layout, tokens(5, 3), payload(layout, 5, 3))
            assert kv.flush(30)
            c.wait_for(lambda: c.count("CPU") == 3 and c.count("SSD") == 3)
            kept = set(c.held["SSD"])
        # The same endpoints, a new engine (a restarted process): RAM is empty, the SSD
        # tier recovered its blocks.
        with engine(tmp_path, ssd=True, endpoint=endpoint, replay=replay) as kv:
            second_epoch = kv.kv_events()["epoch"]
            assert second_epoch > first_epoch
            c.wait_for(lambda: c.epochs_seen[-1] == second_epoch and c.count("SSD") == 3)
            assert c.count("CPU") == 0, "RAM blocks of the old process are still in the view"
            assert c.held["SSD"] == kept
            opening = [b for s, b in c.log if epoch_of(s) == second_epoch][0]
            assert isinstance(opening.events[0], AllBlocksCleared)
            # The listing carries each block's tokens (recovered from the SSD records).
            listed = [t for h in kept for t in c.blocks[h].token_ids]
            assert sorted(listed) == sorted(tokens(5, 3))
    finally:
        c.close()


def test_bad_settings_and_a_taken_port_are_clear_errors(tmp_path):
    with pytest.raises(kvtier.InvalidError, match="replay_endpoint needs"):
        kvtier.Engine({"data_dir": str(tmp_path), "ssd": {"enabled": False}, "kv_events": {"replay_endpoint": "tcp://127.0.0.1:0"}})
    with pytest.raises(kvtier.InvalidError, match="unknown field `nope`"):
        kvtier.Engine({"data_dir": str(tmp_path), "ssd": {"enabled": False}, "kv_events": {"endpoint": "tcp://127.0.0.1:0", "nope": 1}})
    with engine(tmp_path / "a") as kv:
        taken = kv.kv_events()["endpoint"]
        with pytest.raises(kvtier.UnavailableError, match="cannot bind KV events"):
            engine(tmp_path / "b", endpoint=taken, replay=None)
        # An unknown transport is not known to stay on this host: refused as plaintext
        # beyond it would be.
        with pytest.raises(kvtier.InvalidError, match="could be read from another host"):
            engine(tmp_path / "c", endpoint="bogus://x", replay=None)
    with kvtier.Engine({"data_dir": str(tmp_path), "ssd": {"enabled": False}}) as off:
        assert off.kv_events() is None
        assert not any(k.startswith("kv_events_") for k in off.stats())


def test_kvtier_serve_publishes_and_a_restart_after_kill_9_is_a_new_epoch(tmp_path):
    port, replay_port = free_port(), free_port()
    args = ["--set", f"kv_events.endpoint=tcp://127.0.0.1:{port}",
            "--set", f"kv_events.replay_endpoint=tcp://127.0.0.1:{replay_port}",
            "--set", "ssd.durability=written"]
    server = Server(tmp_path, *args)
    c = Consumer(server.kv_events, server.kv_replay)
    try:
        assert server.kv_events == f"tcp://127.0.0.1:{port}"
        c.sync()
        client = kvtier.Client(server.url)
        layout = client.register_layout("events-test", "f16", TPB, 2, 2, 64)
        data = payload(layout, 7, 4)
        assert client.store(layout, tokens(7, 4), data)["stored"] == 4
        c.wait_for(lambda: c.count("CPU") == 4 and c.count("SSD") == 4)
        first_epoch = c.epochs_seen[-1]
        assert client.stats()["kv_events_epoch"] == first_epoch
        import urllib.request
        metrics = urllib.request.urlopen(server.url + "/metrics", timeout=10).read().decode()
        assert f'kvtier_kv_events_epoch{{}} {first_epoch}' in metrics, metrics[-2000:]
        server.kill9()
        server = Server(tmp_path, *args)
        c.wait_for(lambda: c.epochs_seen[-1] > first_epoch and c.count("SSD") == 4)
        assert c.count("CPU") == 0
        client = kvtier.Client(server.url)
        layout = client.register_layout("events-test", "f16", TPB, 2, 2, 64)
        hit = client.lookup(layout, tokens(7, 4))
        assert hit.blocks == 4  # what the events say is held, is
        assert all(e.block_size == TPB for _, b in c.log for e in b.events if isinstance(e, BlockStored))
    finally:
        c.close()
        server.stop()


def test_a_publisher_that_falls_behind_relists_instead_of_leaving_holes(tmp_path):
    # A queue of one event: most residency events are dropped; each drop makes the
    # publisher re-list, so the view still ends up exactly what RAM holds.
    with engine(tmp_path, ram="512KiB", queue_len=1) as kv:
        with consumer_of(kv) as c:
            layout = layout_of(kv)
            for seed in range(8):
                kv.store(layout, tokens(60 + seed, 8), payload(layout, seed, 8))
            resident = kv.stats()["ram_resident_blocks"]
            c.wait_for(lambda: c.count("CPU") == resident)
            c.pump(1.0)  # and it stays so
            assert c.count("CPU") == resident
            after = kv.stats()
            assert after["kv_events_missed"] > 0
            assert after["kv_events_relistings"] > 1
            # The view opened again with each listing: the last listing's AllBlocksCleared
            # came after the first store.
            cleared = [s for s, b in c.log for e in b.events if isinstance(e, AllBlocksCleared)]
            assert len(cleared) == after["kv_events_relistings"]


def test_the_remote_tier_is_its_own_medium_and_remote_locality(tmp_path):
    import re
    import subprocess

    from serve import kvtier_binary

    gateway = subprocess.Popen(
        [kvtier_binary(), "gateway", "--dir", str(tmp_path / "s3"), "--listen", "127.0.0.1:0",
         "--access-key", "kvtier-test", "--secret-key", "kvtier-test-secret", "--create-bucket", "kvcache"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        url = None
        assert gateway.stdout is not None
        for line in gateway.stdout:
            if found := re.search(r"listening on (http://\S+)", line):
                url = found.group(1)
                break
        assert url, "kvtier gateway did not start"
        settings = {
            "ram": "256MiB", "data_dir": str(tmp_path / "kv"), "ssd": {"enabled": False},
            "remote": {"endpoints": [url], "bucket": "kvcache", "access_key": "kvtier-test",
                       "secret_key": "kvtier-test-secret"},
            "kv_events": {"endpoint": "tcp://127.0.0.1:0", "replay_endpoint": "tcp://127.0.0.1:0"},
        }
        with kvtier.Engine(settings) as kv:
            with consumer_of(kv) as c:
                layout = layout_of(kv)
                kv.store(layout, tokens(9, 3), payload(layout, 9, 3))
                assert kv.flush(30)
                c.wait_for(lambda: c.count("REMOTE") == 3 and c.count("CPU") == 3)
                remote = [e for _, b in c.log for e in b.events if isinstance(e, BlockStored) and e.medium == "REMOTE"]
                assert all(e.locality == "REMOTE" for e in remote)
                assert c.held["REMOTE"] == c.held["CPU"]
    finally:
        gateway.terminate()
        gateway.wait(timeout=30)


def test_beyond_this_host_only_curve_and_only_listed_routers_read_the_events(tmp_path):
    """The events carry every tenant's token ids: plaintext on an address another host can
    reach is refused at start; with CURVE, a router whose key is listed reads them and one
    without CURVE, or with another key, receives nothing at all."""
    with pytest.raises(kvtier.KvtierError, match="CURVE"):
        engine(tmp_path / "open", endpoint="tcp://0.0.0.0:0", replay=None)
    server_public, server_secret = zmq.curve_keypair()
    router_public, router_secret = zmq.curve_keypair()
    other_public, other_secret = zmq.curve_keypair()
    settings = {"curve_secret_key": server_secret.decode(), "curve_clients": [router_public.decode()]}
    ctx = zmq.Context()
    with engine(tmp_path / "curve", **settings) as kv:
        at = kv.kv_events()["endpoint"]

        def subscriber(keys):
            sub = ctx.socket(zmq.SUB)
            sub.linger = 0
            if keys:
                sub.curve_serverkey = server_public
                sub.curve_publickey, sub.curve_secretkey = keys
            sub.connect(at)
            sub.subscribe(b"")
            return sub

        router = subscriber((router_public, router_secret))
        stranger = subscriber((other_public, other_secret))
        plain = subscriber(None)
        decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        layout = layout_of(kv)
        assert router.poll(10_000), "the listed router was not welcomed"
        # The store's blocks, in one BlockStored or several (the RAM tier may admit them
        # in more than one step): their tokens, in order, are the prompt's.
        stored_tokens: list[int] = []
        deadline = time.monotonic() + 20
        kv.store(layout, tokens(5, 2), payload(layout, 5, 2))
        while stored_tokens != tokens(5, 2) and time.monotonic() < deadline:
            if router.poll(1000):
                _topic, _seq, body = router.recv_multipart()
                for e in decoder.decode(body).events:
                    if isinstance(e, BlockStored):
                        stored_tokens.extend(e.token_ids)
        assert stored_tokens == tokens(5, 2)
        # Nothing reached the others: not the welcome, not the store.
        assert not stranger.poll(500) and not plain.poll(500)
        assert kv.stats()["kv_events_refused_clients"] >= 1
    ctx.destroy(linger=0)
