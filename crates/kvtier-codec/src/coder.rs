//! [`PageCoder`]: the seam a persistent tier encodes and decodes its pages through — which
//! codec a namespace's pages get, what the codec must know of them (element type, scale
//! group, segment size, all from the registered layout), and what it cost. Written once
//! for the SSD and remote tiers.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kvtier_core::layout::{ColdCodec, KvDtype, Layout, LayoutDigest};
use kvtier_core::stats::CodecStats;
use parking_lot::RwLock;

use crate::frame::{self, Frame};
use crate::shares::in_shares;
use crate::{Codec, DecodeError, Element, Shape};

/// Decoded bytes per frame segment, at most (whole pages of a layer are kept together
/// below this): small enough that a one-layer read decodes little more than its layer
/// and a block decodes on several threads, large enough that a segment's fixed cost (a
/// code table per plane, ~140 bytes) stays under 1%.
pub const SEGMENT_BYTES: usize = 256 << 10;

/// Which codec a tier writes pages with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodecConfig {
    /// The codec of every namespace not named in `namespaces` (default raw).
    pub default: Codec,
    /// Per-namespace (layout digest) choices.
    pub namespaces: BTreeMap<LayoutDigest, Codec>,
}

impl Default for CodecConfig {
    fn default() -> Self {
        Self {
            default: Codec::Raw,
            namespaces: BTreeMap::new(),
        }
    }
}

impl CodecConfig {
    /// Checks the choices: the lossy codec is a property of a layout, never a tier
    /// setting (a tier may not change the bytes a layout promises to give back).
    pub fn validate(&self) -> Result<(), String> {
        let lossy = std::iter::once(&self.default)
            .chain(self.namespaces.values())
            .find(|c| !c.is_lossless());
        if let Some(c) = lossy {
            return Err(format!(
                "`{c}` cannot be set on a tier: it is lossy, and only a layout registered with it may use it"
            ));
        }
        Ok(())
    }
}

/// How one layout's pages are encoded.
#[derive(Debug, Clone, Copy)]
struct Plan {
    codec: Codec,
    shape: Shape,
    segment: usize,
}

/// An encoded page, ready to be stored.
#[derive(Debug)]
pub struct Encoded {
    /// The codec of the frame (never raw).
    pub codec: Codec,
    /// The frame.
    pub frame: Vec<u8>,
}

#[derive(Debug, Default)]
struct Counters {
    encoded: AtomicU64,
    not_shrunk: AtomicU64,
    decoded: AtomicU64,
    failures: AtomicU64,
    encode_ns: AtomicU64,
    decode_ns: AtomicU64,
}

/// See the module docs.
#[derive(Debug)]
pub struct PageCoder {
    config: CodecConfig,
    plans: RwLock<HashMap<LayoutDigest, Plan>>,
    counters: Counters,
    threads: usize,
}

/// The element type of a KV dtype, as the codecs see it.
fn element_of(dtype: KvDtype) -> Element {
    match dtype {
        KvDtype::F32 => Element::F32,
        KvDtype::F16 => Element::F16,
        KvDtype::Bf16 => Element::Bf16,
        _ => Element::Bytes {
            width: dtype.size_bytes().clamp(1, 8) as u8,
        },
    }
}

/// Frame segment size for pages of `page_bytes`: whole pages up to [`SEGMENT_BYTES`].
fn segment_for(page_bytes: u64) -> usize {
    let page = usize::try_from(page_bytes).unwrap_or(SEGMENT_BYTES).max(1);
    if page >= SEGMENT_BYTES {
        SEGMENT_BYTES
    } else {
        SEGMENT_BYTES / page * page
    }
}

impl PageCoder {
    /// A coder writing pages as `config` says (validated by the caller).
    pub fn new(config: CodecConfig) -> Self {
        let threads = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
            .min(8);
        Self {
            config,
            plans: RwLock::new(HashMap::new()),
            counters: Counters::default(),
            threads,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &CodecConfig {
        &self.config
    }

    /// Threads a whole page is encoded or decoded on, at most.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Learns how `layout`'s blocks are laid out (see `Tier::layout_registered`). A
    /// layout registered with a lossy cold codec gets it whatever the tier's setting: the
    /// layout's digest already promises it, and only such a layout ever does.
    pub fn learn(&self, layout: &Layout) {
        let digest = layout.digest();
        let key = layout.key();
        let codec = match key.cold_codec {
            Some(ColdCodec::Fp8E4M3) => Codec::Fp8E4M3,
            _ => self
                .config
                .namespaces
                .get(&digest)
                .copied()
                .unwrap_or(self.config.default),
        };
        let plan = Plan {
            codec,
            shape: Shape {
                element: element_of(key.dtype),
                group: key.head_dim.max(1),
            },
            segment: segment_for(layout.geometry().page_bytes()),
        };
        self.plans.write().insert(digest, plan);
    }

    /// Encodes block `page` of `layout` on up to [`PageCoder::threads`] threads, or
    /// `None` to store it raw: the namespace's codec is raw, the layout is not known here,
    /// or the page did not shrink (counted).
    pub fn encode_block(&self, layout: LayoutDigest, page: &[u8]) -> Option<Encoded> {
        self.encode_block_on(layout, page, self.threads)
    }

    /// [`PageCoder::encode_block`] on at most `threads` threads (1: the calling thread
    /// only, for a caller encoding several pages at once on threads of its own).
    pub fn encode_block_on(
        &self,
        layout: LayoutDigest,
        page: &[u8],
        threads: usize,
    ) -> Option<Encoded> {
        let plan = *self.plans.read().get(&layout)?;
        self.encode_with(plan, page, threads)
    }

    /// Whether blocks of `layout` go through a codec (it is known here and its codec is
    /// not raw).
    pub fn encodes(&self, layout: LayoutDigest) -> bool {
        self.plans
            .read()
            .get(&layout)
            .is_some_and(|plan| plan.codec != Codec::Raw)
    }

    /// Encodes a recurrent-state blob of `layout` losslessly as 4-byte words (the state
    /// kinds kvtier's models store are f32), or `None` as [`PageCoder::encode_block`].
    pub fn encode_state(&self, layout: LayoutDigest, blob: &[u8]) -> Option<Encoded> {
        let known = self.plans.read().get(&layout).copied()?;
        if known.codec == Codec::Raw {
            return None;
        }
        let plan = Plan {
            codec: Codec::Lossless,
            shape: Shape {
                element: Element::Bytes { width: 4 },
                group: 1,
            },
            segment: SEGMENT_BYTES,
        };
        self.encode_with(plan, blob, self.threads)
    }

    fn encode_with(&self, plan: Plan, page: &[u8], threads: usize) -> Option<Encoded> {
        if plan.codec == Codec::Raw {
            return None;
        }
        let started = Instant::now();
        let frame = frame::encode(plan.codec, plan.shape, page, plan.segment, threads);
        let c = &self.counters;
        c.encode_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match frame {
            Some(frame) => {
                c.encoded.fetch_add(1, Ordering::Relaxed);
                Some(Encoded {
                    codec: plan.codec,
                    frame,
                })
            }
            None => {
                c.not_shrunk.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Decodes `segments` of `frame` from `encoded` (their bytes) into `out`, counted in
    /// the coder's (decode time, decodes, failures).
    pub fn decode_segments(
        &self,
        frame: &Frame<'_>,
        segments: std::ops::Range<usize>,
        encoded: &[u8],
        out: &mut [u8],
    ) -> Result<(), DecodeError> {
        self.timed(|| frame.decode_segments(segments, encoded, out))
    }

    /// Decodes whole frames, each `(codec, frame, out)` with `out` exactly its page (a
    /// run of blocks read at once): several frames are spread over the coder's threads,
    /// one frame over its segments. Counted in the coder's; the first failure is returned.
    pub fn decode_frames(&self, frames: Vec<(Codec, &[u8], &mut [u8])>) -> Result<(), DecodeError> {
        let pages = frames.len() as u64;
        let decoded: usize = frames.iter().map(|(_, _, out)| out.len()).sum();
        let one = |(codec, stream, out): (Codec, &[u8], &mut [u8]), threads: usize| {
            Frame::parse(codec, stream, out.len(), true)?.decode_all(out, threads)
        };
        self.timed_pages(pages, || {
            let threads = self.threads.min(frames.len());
            if threads <= 1 || decoded < frame::PARALLEL_FROM {
                return frames.into_iter().try_for_each(|f| one(f, self.threads));
            }
            // Contiguous shares of frames, one per thread, each decoded on that thread.
            in_shares(frames, threads, |share| {
                share.into_iter().try_for_each(|f| one(f, 1))
            })
            .into_iter()
            .try_for_each(|r| r.unwrap_or(Err(DecodeError::Invalid("decoder thread"))))
        })
    }

    fn timed(&self, f: impl FnOnce() -> Result<(), DecodeError>) -> Result<(), DecodeError> {
        self.timed_pages(1, f)
    }

    /// Runs `f`, a decode of `pages` pages, and counts it: its time, and the pages as
    /// decoded or (once) as a failure.
    fn timed_pages(
        &self,
        pages: u64,
        f: impl FnOnce() -> Result<(), DecodeError>,
    ) -> Result<(), DecodeError> {
        let started = Instant::now();
        let result = f();
        let c = &self.counters;
        c.decode_ns
            .fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        match result {
            Ok(()) => c.decoded.fetch_add(pages, Ordering::Relaxed),
            Err(_) => c.failures.fetch_add(1, Ordering::Relaxed),
        };
        result
    }

    /// The coder's counters; the resident gauges are the tier's to fill.
    pub fn stats(&self) -> CodecStats {
        let c = &self.counters;
        CodecStats {
            encoded_pages: c.encoded.load(Ordering::Relaxed),
            not_shrunk_pages: c.not_shrunk.load(Ordering::Relaxed),
            decoded_pages: c.decoded.load(Ordering::Relaxed),
            decode_failures: c.failures.load(Ordering::Relaxed),
            encode_ns: c.encode_ns.load(Ordering::Relaxed),
            decode_ns: c.decode_ns.load(Ordering::Relaxed),
            ..CodecStats::default()
        }
    }
}

/// Bytes held encoded by a tier, per codec: the resident gauges of [`CodecStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Resident {
    stored: [u64; 3],
    decoded: [u64; 3],
}

impl Resident {
    /// Counts a page of `stored` bytes decoding to `decoded` with `codec` coming in.
    pub fn add(&mut self, codec: Codec, stored: u64, decoded: u64) {
        let i = usize::from(codec.code());
        self.stored[i] += stored;
        self.decoded[i] += decoded;
    }

    /// Counts such a page going.
    pub fn remove(&mut self, codec: Codec, stored: u64, decoded: u64) {
        let i = usize::from(codec.code());
        self.stored[i] = self.stored[i].saturating_sub(stored);
        self.decoded[i] = self.decoded[i].saturating_sub(decoded);
    }

    /// `stats` with the resident gauges filled in.
    pub fn fill(&self, stats: CodecStats) -> CodecStats {
        let l = usize::from(Codec::Lossless.code());
        let f = usize::from(Codec::Fp8E4M3.code());
        CodecStats {
            lossless_stored_bytes: self.stored[l],
            lossless_decoded_bytes: self.decoded[l],
            fp8_stored_bytes: self.stored[f],
            fp8_decoded_bytes: self.decoded[f],
            ..stats
        }
    }
}
