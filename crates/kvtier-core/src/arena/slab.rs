//! Which bytes of the arena belong to whom: fixed-size slots in segments.
//!
//! The arena is cut into segments of equal size. A segment, when first needed, is given one
//! slot size (a block size rounded up to whole pages) and cut into as many slots as fit; a
//! segment whose last slot is freed goes back to the pool and can be given another size.
//! An inference server stores blocks of one or a few sizes (one per layout), so nearly every
//! segment is full of slots of the size in use, and a freed slot is reused by the next
//! block of that size without the kernel being asked for memory again.
//!
//! Safe bookkeeping only: offsets in, offsets out. `region.rs` maps the memory.

use std::collections::HashMap;

/// Slot sizes are whole pages: every slot starts page-aligned (for DMA and `O_DIRECT`).
pub(super) const PAGE: usize = 4096;

#[derive(Debug)]
struct Segment {
    /// Slot size in bytes; 0 while the segment is in the free pool.
    stride: usize,
    /// Free slot indices.
    free: Vec<u32>,
    /// Slots handed out.
    used: u32,
}

/// The slot allocator. Not thread-safe by itself: the arena holds it under a mutex, for
/// bookkeeping only (no byte is copied under it).
#[derive(Debug)]
pub(super) struct Slab {
    segment_bytes: usize,
    segments: Vec<Segment>,
    /// Segments with no slot handed out, any size (last freed first: its pages are warm).
    pool: Vec<u32>,
    /// Per slot size, the segments of that size with a free slot.
    partial: HashMap<usize, Vec<u32>>,
    used_bytes: usize,
}

impl Slab {
    /// A slab over `segments` segments of `segment_bytes` bytes each.
    pub fn new(segment_bytes: usize, segments: usize) -> Self {
        Self {
            segment_bytes,
            segments: (0..segments)
                .map(|_| Segment {
                    stride: 0,
                    free: Vec::new(),
                    used: 0,
                })
                .collect(),
            // Popped from the end: segment 0 first.
            pool: (0..segments as u32).rev().collect(),
            partial: HashMap::new(),
            used_bytes: 0,
        }
    }

    /// The slot size a payload of `len` bytes takes, or `None` when it does not fit a
    /// segment (such a payload is kept outside the arena).
    pub fn stride_of(&self, len: usize) -> Option<usize> {
        let stride = len.max(1).checked_next_multiple_of(PAGE)?;
        (stride <= self.segment_bytes).then_some(stride)
    }

    /// A free slot of `stride` bytes (see [`Slab::stride_of`]): its offset in the arena,
    /// or `None` when every segment is taken by slots of other sizes or full.
    pub fn alloc(&mut self, stride: usize) -> Option<usize> {
        let seg = match self.partial.get(&stride).and_then(|s| s.last().copied()) {
            Some(seg) => seg,
            None => {
                let seg = self.pool.pop()?;
                let s = &mut self.segments[seg as usize];
                let slots = (self.segment_bytes / stride) as u32;
                s.stride = stride;
                s.free = (0..slots).rev().collect();
                self.partial.entry(stride).or_default().push(seg);
                seg
            }
        };
        let s = &mut self.segments[seg as usize];
        let slot = s.free.pop()?;
        s.used += 1;
        if s.free.is_empty()
            && let Some(list) = self.partial.get_mut(&stride)
        {
            list.retain(|&x| x != seg);
        }
        self.used_bytes += stride;
        Some(seg as usize * self.segment_bytes + slot as usize * stride)
    }

    /// Gives back the slot at `offset`, which [`Slab::alloc`] handed out and nobody uses
    /// any more.
    pub fn free(&mut self, offset: usize) {
        let seg = offset / self.segment_bytes;
        let Some(s) = self.segments.get_mut(seg) else {
            debug_assert!(false, "freed an offset past the arena");
            return;
        };
        let stride = s.stride;
        debug_assert!(stride > 0 && s.used > 0, "freed a slot of a free segment");
        if stride == 0 || s.used == 0 {
            return;
        }
        let slot = ((offset % self.segment_bytes) / stride) as u32;
        let was_full = s.free.is_empty();
        s.free.push(slot);
        s.used -= 1;
        self.used_bytes -= stride;
        let list = self.partial.entry(stride).or_default();
        if s.used == 0 {
            // The whole segment is free: back to the pool, for any size.
            list.retain(|&x| x != seg as u32);
            s.stride = 0;
            s.free = Vec::new();
            self.pool.push(seg as u32);
        } else if was_full {
            list.push(seg as u32);
        }
    }

    /// The offset of the slot that holds `offset`, or `None` in a free segment.
    pub fn slot_start(&self, offset: usize) -> Option<usize> {
        let seg = offset / self.segment_bytes;
        let stride = self.segments.get(seg)?.stride;
        (stride > 0)
            .then(|| seg * self.segment_bytes + (offset % self.segment_bytes) / stride * stride)
    }

    /// Bytes of slots handed out.
    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_page_aligned_disjoint_and_reused_after_free() {
        let seg = 8 * PAGE;
        let mut slab = Slab::new(seg, 2);
        let stride = slab.stride_of(3 * PAGE - 5).unwrap();
        assert_eq!(stride, 3 * PAGE);
        // Two slots per segment, two segments.
        let got: Vec<usize> = (0..4).map(|_| slab.alloc(stride).unwrap()).collect();
        assert!(slab.alloc(stride).is_none(), "full");
        let mut sorted = got.clone();
        sorted.sort();
        for w in sorted.windows(2) {
            assert!(w[1] >= w[0] + stride, "overlap: {sorted:?}");
        }
        assert!(got.iter().all(|o| o % PAGE == 0 && o + stride <= 2 * seg));
        assert_eq!(slab.used_bytes(), 4 * stride);
        slab.free(got[1]);
        assert_eq!(
            slab.alloc(stride),
            Some(got[1]),
            "the freed slot comes back"
        );
    }

    #[test]
    fn an_empty_segment_can_take_another_size() {
        let seg = 8 * PAGE;
        let mut slab = Slab::new(seg, 1);
        let big = slab.stride_of(8 * PAGE).unwrap();
        let small = slab.stride_of(1).unwrap();
        let a = slab.alloc(big).unwrap();
        assert!(
            slab.alloc(small).is_none(),
            "the only segment holds big slots"
        );
        slab.free(a);
        assert_eq!(slab.used_bytes(), 0);
        let smalls: Vec<usize> = (0..8).map(|_| slab.alloc(small).unwrap()).collect();
        assert!(slab.alloc(small).is_none());
        assert!(slab.alloc(big).is_none());
        for o in smalls {
            slab.free(o);
        }
        assert_eq!(slab.alloc(big), Some(0));
    }

    #[test]
    fn a_payload_larger_than_a_segment_has_no_slot() {
        let slab = Slab::new(8 * PAGE, 1);
        assert_eq!(slab.stride_of(8 * PAGE), Some(8 * PAGE));
        assert_eq!(slab.stride_of(8 * PAGE + 1), None);
        assert_eq!(slab.stride_of(0), Some(PAGE));
    }
}
