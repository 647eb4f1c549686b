"""A KV-event consumer as a KV-aware router runs one, for the tests: a SUB socket, vLLM's own
decoder (`KVEventBatch`), gap detection with replay, and restarts detected by the epoch (the
sequence number shifted right by 22 bits). Its view is what the publisher says is held where."""

from __future__ import annotations

import time

import msgspec
import zmq
from vllm.distributed.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch

END_SEQ = (-1).to_bytes(8, "big", signed=True)


EPOCH_SHIFT = 22
IN_EPOCH = (1 << EPOCH_SHIFT) - 1


def epoch_of(seq: int) -> int:
    return seq >> EPOCH_SHIFT


class Consumer:
    def __init__(self, endpoint: str, replay_endpoint: str | None, topic: bytes = b"") -> None:
        self.ctx = zmq.Context()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, topic)
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
        self.next_seq: int | None = None
        # Everything applied, in order: (seq, batch).
        self.log: list[tuple[int, KVEventBatch]] = []
        self.replays = 0
        self.epochs_seen: list[int] = []
        # The view: medium -> hashes held; and what each stored block was said to be.
        self.held: dict[str, set[bytes]] = {}
        self.blocks: dict[bytes, BlockStored] = {}
        self.parents: dict[bytes, bytes | None] = {}

    def close(self) -> None:
        self.sub.close(linger=0)
        self.ctx.term()

    # --- the protocol -------------------------------------------------------------------

    def replay(self, start: int, timeout: float = 10.0) -> list[tuple[int, KVEventBatch]]:
        """Every buffered batch from `start` on, decoded, up to the end marker."""
        assert self.replay_endpoint is not None
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.connect(self.replay_endpoint)
        try:
            dealer.send_multipart([b"", start.to_bytes(8, "big")])
            out = []
            deadline = time.monotonic() + timeout
            while True:
                left = deadline - time.monotonic()
                assert left > 0 and dealer.poll(int(left * 1000)), "replay did not end"
                frames = dealer.recv_multipart()
                assert frames[0] == b"", frames
                _, topic, seq, payload = frames
                if seq == END_SEQ:
                    assert topic == b"" and payload == b""
                    return out
                out.append((int.from_bytes(seq, "big"), self.decoder.decode(payload)))
        finally:
            dealer.close(linger=0)
            self.replays += 1

    def sync(self) -> None:
        """Catch up from the replay buffer (what a router does when it first connects)."""
        for seq, batch in self.replay(0 if self.next_seq is None else self.next_seq):
            self._take(seq, batch)

    def pump(self, timeout: float) -> int:
        """Applies what arrives within `timeout` seconds; returns how many batches."""
        taken = 0
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if not self.sub.poll(int(left * 1000)):
                break
            topic, seq_bytes, payload = self.sub.recv_multipart()
            seq = int.from_bytes(seq_bytes, "big")
            batch = self.decoder.decode(payload)
            if self.next_seq is not None and epoch_of(seq) == epoch_of(self.next_seq) and seq > self.next_seq:
                # A gap in this epoch: ask for what was missed, then go on.
                for s, b in self.replay(self.next_seq):
                    self._take(s, b)
            elif (self.next_seq is None or epoch_of(seq) > epoch_of(self.next_seq)) and seq & IN_EPOCH:
                # A new epoch joined late: its start (the listing) is in the replay buffer.
                for s, b in self.replay(seq & ~IN_EPOCH):
                    self._take(s, b)
            taken += self._take(seq, batch)
        return taken

    def wait_for(self, predicate, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            assert time.monotonic() < deadline, f"timed out; view: { {m: len(h) for m, h in self.held.items()} }"
            self.pump(0.1)

    # --- applying -----------------------------------------------------------------------

    def _take(self, seq: int, batch: KVEventBatch) -> int:
        if self.next_seq is not None:
            if epoch_of(seq) < epoch_of(self.next_seq):
                return 0  # an older process's batch
            if epoch_of(seq) == epoch_of(self.next_seq) and seq < self.next_seq:
                return 0  # seen already
        if not self.epochs_seen or self.epochs_seen[-1] != epoch_of(seq):
            self.epochs_seen.append(epoch_of(seq))
        self.next_seq = seq + 1
        self.log.append((seq, batch))
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                self.held.clear()
            elif isinstance(event, BlockStored):
                held = self.held.setdefault(event.medium, set())
                parent = event.parent_block_hash
                for h in event.block_hashes:
                    held.add(h)
                    self.blocks[h] = event
                    self.parents[h] = parent
                    parent = h
            elif isinstance(event, BlockRemoved):
                self.held.setdefault(event.medium, set()).difference_update(event.block_hashes)
        return 1

    def count(self, medium: str) -> int:
        return len(self.held.get(medium, ()))
