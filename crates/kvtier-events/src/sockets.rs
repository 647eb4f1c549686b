//! The sockets' thread: numbers each batch, publishes it on the PUB (XPUB) socket, keeps it
//! for replay, greets new subscribers with an empty batch, and answers replay requests on
//! the ROUTER socket.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use crossbeam_channel::{Receiver, RecvTimeoutError};
use kvtier_core::clock::Clock;

use crate::access::Zap;
use crate::wire::{WireEvent, encode_batch};
use crate::zmq::Socket;

/// vLLM's end-of-replay marker: sequence −1.
const END_SEQ: [u8; 8] = (-1i64).to_be_bytes();

/// How long the thread waits for a batch before it looks at the replay socket again (the
/// most a replay request waits while nothing is published).
const REPLAY_POLL: Duration = Duration::from_millis(10);

/// A sequence number is `epoch << EPOCH_SHIFT | n`: `n` counts an epoch's batches in the
/// low 22 bits (4,194,304 of them; a new epoch begins, with a listing, after half).
pub const EPOCH_SHIFT: u32 = 22;

/// Batches in one epoch.
const BATCHES_PER_EPOCH: u64 = 1 << EPOCH_SHIFT;

/// After this many batches of an epoch the observer is asked to re-list, and the listing
/// opens a new epoch (long before the epoch's numbers run out).
const RENEW_EPOCH_AT: u64 = BATCHES_PER_EPOCH / 2;

/// Epochs count milliseconds from 2020-01-01T00:00:00Z: 41 bits last until 2089, and
/// `epoch << 22` stays below 2^63, so a consumer that reads sequences as signed 64-bit
/// numbers sees them positive. Milliseconds, not seconds: a process restarted within the
/// same second must still get a later epoch.
const EPOCH_BASE_UNIX_MS: u64 = 1_577_836_800_000;

/// The largest epoch that fits.
const MAX_EPOCH: u64 = (1 << (63 - EPOCH_SHIFT)) - 1;

/// The last epoch handed out in this process: a new publisher's is later, even within the
/// same second.
static LAST_EPOCH: AtomicU64 = AtomicU64::new(0);

/// A new epoch: now, in milliseconds since [`EPOCH_BASE_UNIX_MS`], and after every earlier
/// epoch of this process.
pub(crate) fn next_epoch(clock: &dyn Clock) -> u64 {
    let now = (clock.wall_unix_nanos() / 1_000_000).saturating_sub(EPOCH_BASE_UNIX_MS);
    let mut last = LAST_EPOCH.load(Ordering::Relaxed);
    loop {
        let next = now.max(last + 1).min(MAX_EPOCH);
        match LAST_EPOCH.compare_exchange_weak(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

/// The sequence number of the next batch (`listing`: it starts a listing), `n` being the
/// count of the epoch's batches so far.
///
/// Epochs change only where a listing starts, so every epoch opens with `AllBlocksCleared`:
/// once half an epoch's numbers are used, the observer is asked for a listing, which opens
/// the next one. The last resort, never reached while listings flow, keeps numbers from
/// running into the epoch's bits.
fn next_seq(shared: &Shared, clock: &dyn Clock, n: &mut u64, listing: bool) -> u64 {
    if (listing && *n >= RENEW_EPOCH_AT) || *n >= BATCHES_PER_EPOCH {
        shared.epoch.store(next_epoch(clock), Ordering::Relaxed);
        if !listing {
            shared.relist.store(true, Ordering::Relaxed);
        }
        *n = 0;
    } else if *n == RENEW_EPOCH_AT {
        shared.relist.store(true, Ordering::Relaxed);
    }
    let seq = (shared.epoch.load(Ordering::Relaxed) << EPOCH_SHIFT) | *n;
    *n += 1;
    seq
}

/// Counters and the epoch, shared with the publisher's handle.
#[derive(Debug, Default)]
pub(crate) struct Shared {
    pub epoch: AtomicU64,
    pub batches: AtomicU64,
    pub events: AtomicU64,
    pub send_failures: AtomicU64,
    pub replay_requests: AtomicU64,
    pub replayed_batches: AtomicU64,
    pub bad_replay_requests: AtomicU64,
    pub missed: AtomicU64,
    pub relistings: AtomicU64,
    pub welcomes: AtomicU64,
    pub refused_clients: AtomicU64,
    /// Set when an epoch is half used (or, as a last resort, ran out): the observer re-lists
    /// before its next batch, and that listing opens a new epoch.
    pub relist: AtomicBool,
}

/// What the thread owns.
pub(crate) struct SocketLoop {
    pub publisher: Socket,
    pub replay: Option<Socket>,
    /// The CURVE handshakes' judge; dropped after the sockets it authenticates.
    pub zap: Option<Zap>,
    pub topic: Vec<u8>,
    pub buffer_steps: usize,
    pub clock: Arc<dyn Clock>,
    pub shared: Arc<Shared>,
}

impl SocketLoop {
    /// Runs until every sender of `batches` is gone and what they sent is published.
    pub(crate) fn run(self, batches: &Receiver<Vec<WireEvent>>) {
        let mut buffer: VecDeque<(u64, Vec<u8>)> =
            VecDeque::with_capacity(self.buffer_steps.min(1024));
        let mut n: u64 = 0;
        loop {
            match batches.recv_timeout(REPLAY_POLL) {
                Ok(events) => {
                    let listing = matches!(events.first(), Some(WireEvent::AllCleared));
                    let seq = next_seq(&self.shared, self.clock.as_ref(), &mut n, listing);
                    self.publish(seq, &events, &mut buffer);
                }
                Err(RecvTimeoutError::Timeout) => {}
                Err(RecvTimeoutError::Disconnected) => break,
            }
            // Not before the epoch's listing has gone out: its first batch is the listing.
            if n > 0 && self.new_subscriber() {
                let seq = next_seq(&self.shared, self.clock.as_ref(), &mut n, false);
                self.publish(seq, &[], &mut buffer);
            }
            self.serve_replays(&buffer);
            if let Some(zap) = &self.zap {
                let refused = zap.serve();
                self.shared
                    .refused_clients
                    .fetch_add(refused, Ordering::Relaxed);
            }
        }
    }

    /// Whether a subscriber subscribed since the last look. It is then sent an empty batch
    /// (under the next sequence number): a subscriber that (re)connects learns the current
    /// sequence at once — and so a missed range or a new epoch, which it replays — instead
    /// of at the next change, which may be long in coming (PUB/SUB delivers nothing from
    /// before a subscription).
    fn new_subscriber(&self) -> bool {
        let mut any = false;
        while self.publisher.readable(0).unwrap_or(false) {
            match self.publisher.recv_multipart(true) {
                // 1 = subscribe, 0 = unsubscribe, then the topic prefix.
                Ok(m) => any |= m.first().and_then(|f| f.first()) == Some(&1),
                Err(_) => break,
            }
        }
        if any {
            self.shared.welcomes.fetch_add(1, Ordering::Relaxed);
        }
        any
    }

    fn publish(&self, seq: u64, events: &[WireEvent], buffer: &mut VecDeque<(u64, Vec<u8>)>) {
        let ts = self.clock.wall_unix_nanos() as f64 / 1e9;
        let payload = encode_batch(ts, events, 0);
        let frames: [&[u8]; 3] = [&self.topic, &seq.to_be_bytes(), &payload];
        // A PUB socket never blocks: a subscriber over its high-water mark misses the
        // message (and can ask for a replay); an error here is the socket's own.
        if let Err(e) = self.publisher.send_multipart(frames, true) {
            self.shared.send_failures.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(error = %e, seq, "a KV-event batch was not published");
        }
        self.shared.batches.fetch_add(1, Ordering::Relaxed);
        self.shared
            .events
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        if buffer.len() == self.buffer_steps {
            buffer.pop_front();
        }
        buffer.push_back((seq, payload));
    }

    /// Answers every waiting replay request: each buffered batch from the requested
    /// sequence on, then the end marker (vLLM's protocol: the request is
    /// `[identity, "", start]`, each answer `[identity, "", topic, seq, payload]`).
    fn serve_replays(&self, buffer: &VecDeque<(u64, Vec<u8>)>) {
        let Some(replay) = &self.replay else {
            return;
        };
        while replay.readable(0).unwrap_or(false) {
            let Ok(frames) = replay.recv_multipart(true) else {
                return;
            };
            let start = match frames.as_slice() {
                [_, empty, start] if empty.is_empty() && start.len() == 8 => {
                    let mut b = [0u8; 8];
                    b.copy_from_slice(start);
                    u64::from_be_bytes(b)
                }
                _ => {
                    // Not a replay request: no answer (an answer could only be guessed).
                    self.shared
                        .bad_replay_requests
                        .fetch_add(1, Ordering::Relaxed);
                    tracing::debug!(frames = frames.len(), "malformed KV-event replay request");
                    continue;
                }
            };
            self.shared.replay_requests.fetch_add(1, Ordering::Relaxed);
            let id = &frames[0];
            for (seq, payload) in buffer.iter().filter(|(seq, _)| *seq >= start) {
                let reply: [&[u8]; 5] = [id, b"", &self.topic, &seq.to_be_bytes(), payload];
                if replay.send_multipart(reply, true).is_err() {
                    break;
                }
                self.shared.replayed_batches.fetch_add(1, Ordering::Relaxed);
            }
            let end: [&[u8]; 5] = [id, b"", b"", &END_SEQ, b""];
            let _ = replay.send_multipart(end, true);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvtier_core::clock::SystemClock;

    #[test]
    fn epochs_change_at_listings_after_half_an_epoch_and_never_overflow() {
        let clock = SystemClock::new();
        let shared = Shared::default();
        shared.epoch.store(next_epoch(&clock), Ordering::Relaxed);
        let first = shared.epoch.load(Ordering::Relaxed);
        let mut n = 0;
        // The opening listing and an ordinary batch: epoch `first`, numbers 0 and 1.
        assert_eq!(
            next_seq(&shared, &clock, &mut n, true),
            first << EPOCH_SHIFT
        );
        assert_eq!(
            next_seq(&shared, &clock, &mut n, false),
            (first << EPOCH_SHIFT) | 1
        );
        // A listing early in the epoch (after dropped events) stays in it.
        assert_eq!(
            next_seq(&shared, &clock, &mut n, true) >> EPOCH_SHIFT,
            first
        );
        // Half the numbers used: the observer is asked for a listing...
        n = RENEW_EPOCH_AT;
        assert!(!shared.relist.load(Ordering::Relaxed));
        next_seq(&shared, &clock, &mut n, false);
        assert!(shared.relist.swap(false, Ordering::Relaxed));
        // ...and that listing opens a later epoch at number 0.
        let seq = next_seq(&shared, &clock, &mut n, true);
        assert!(seq >> EPOCH_SHIFT > first);
        assert_eq!(seq & (BATCHES_PER_EPOCH - 1), 0);
        // Without any listing, the last number of an epoch is the last one used in it.
        let second = seq >> EPOCH_SHIFT;
        n = BATCHES_PER_EPOCH - 1;
        assert_eq!(
            next_seq(&shared, &clock, &mut n, false),
            (second << EPOCH_SHIFT) | (BATCHES_PER_EPOCH - 1)
        );
        let next = next_seq(&shared, &clock, &mut n, false);
        assert!(
            next >> EPOCH_SHIFT > second,
            "numbers ran into the epoch's bits"
        );
        assert!(shared.relist.load(Ordering::Relaxed));
        // Sequences stay below 2^63.
        assert!(next < 1 << 63);
    }
}
