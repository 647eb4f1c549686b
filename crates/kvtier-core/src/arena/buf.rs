//! A block's buffer: an arena slot being filled, then frozen into [`Bytes`] that keep the
//! slot until the last reader lets go.
#![expect(
    unsafe_code,
    reason = "a slot's bytes are a slice of the mapping, handed out under the slab's rule"
)]

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::Shared;

/// Where a block's bytes are written before the cache keeps them: a slot of the arena, or
/// (a payload larger than a segment, an arena with no slot of that size left) a buffer of
/// its own on the heap. Filled with [`BlockBuf::append`], kept with [`BlockBuf::freeze`];
/// dropped unfrozen, its slot goes back at once.
#[derive(Debug)]
pub struct BlockBuf {
    inner: Inner,
}

#[derive(Debug)]
enum Inner {
    Slot(Slot),
    Heap { buf: BytesMut, cap: usize },
}

/// One slot, owned: its bytes are this value's alone until it is dropped.
#[derive(Debug)]
struct Slot {
    arena: Arc<Shared>,
    offset: usize,
    cap: usize,
    len: usize,
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.arena.free(self.offset);
    }
}

impl AsRef<[u8]> for Slot {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: the slab handed `offset..offset + cap` to this slot alone and takes it
        // back only in `Drop`; once frozen nobody writes it (a frozen slot is only read).
        unsafe { self.arena.region.bytes(self.offset, self.len) }
    }
}

impl BlockBuf {
    pub(super) fn slot(arena: Arc<Shared>, offset: usize, cap: usize) -> Self {
        Self {
            inner: Inner::Slot(Slot {
                arena,
                offset,
                cap,
                len: 0,
            }),
        }
    }

    pub(super) fn heap(cap: usize) -> Self {
        Self {
            inner: Inner::Heap {
                buf: BytesMut::with_capacity(cap),
                cap,
            },
        }
    }

    /// Bytes written so far.
    pub fn len(&self) -> usize {
        match &self.inner {
            Inner::Slot(s) => s.len,
            Inner::Heap { buf, .. } => buf.len(),
        }
    }

    /// Whether nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The payload length this buffer was made for.
    pub fn capacity(&self) -> usize {
        match &self.inner {
            Inner::Slot(s) => s.cap,
            Inner::Heap { cap, .. } => *cap,
        }
    }

    /// Room left before the buffer is full.
    pub fn remaining(&self) -> usize {
        self.capacity() - self.len()
    }

    /// Whether the buffer lies in the arena (not on the heap).
    pub fn in_arena(&self) -> bool {
        matches!(self.inner, Inner::Slot(_))
    }

    /// Appends as much of `src` as fits (with streaming stores for large pieces: the block
    /// lands in memory without passing through the CPU cache); returns how many bytes.
    pub fn append(&mut self, src: &[u8]) -> usize {
        let take = src.len().min(self.remaining());
        let src = &src[..take];
        match &mut self.inner {
            Inner::Slot(s) => {
                // SAFETY: the slot's bytes are this value's alone (see `Slot`), and
                // `len + take <= cap` lies inside them.
                let dst = unsafe { s.arena.region.bytes_mut(s.offset + s.len, take) };
                crate::copy::copy_to_slice(dst, src);
                s.len += take;
            }
            Inner::Heap { buf, .. } => crate::copy::append_into(buf, src),
        }
        take
    }

    /// Fills an empty buffer with `src`, exactly its capacity, and freezes it: the block and
    /// the CRC32C of the bytes that landed in it (see [`super::copy_checked`]), which a
    /// shared arena remembers with the slot. `None`, and nothing kept, when `src` is not
    /// exactly the buffer's capacity or something was written already.
    pub fn fill_checked(mut self, src: &[u8]) -> Option<(Bytes, u32)> {
        if !self.is_empty() || src.len() != self.capacity() {
            return None;
        }
        match &mut self.inner {
            Inner::Slot(s) => {
                // SAFETY: the slot's bytes are this value's alone (see `Slot`), and
                // `src.len() == cap` lies inside them.
                let dst = unsafe { s.arena.region.bytes_mut(s.offset, src.len()) };
                let crc = super::copy_checked(dst, src);
                s.len = src.len();
                s.arena.checks.set(s.offset, s.len, crc);
                Some((self.freeze(), crc))
            }
            Inner::Heap { buf, .. } => {
                buf.extend_from_slice(src);
                let crc = super::crc32c(buf);
                Some((self.freeze(), crc))
            }
        }
    }

    /// Where an arena slot's bytes start (`capacity()` of them), for a writer that is not
    /// this process's CPU — a device's DMA engine, a copy kernel — to fill before
    /// [`BlockBuf::freeze_whole`]; `None` for a buffer on the heap.
    pub fn slot_address(&self) -> Option<usize> {
        match &self.inner {
            Inner::Slot(s) => Some(s.arena.region.address() + s.offset),
            Inner::Heap { .. } => None,
        }
    }

    /// An arena slot kept as a whole block of `capacity()` bytes, whatever was written
    /// into it through [`BlockBuf::slot_address`] (`None`, and the slot given back, for a
    /// heap buffer). A slot's memory is always initialized (mapped, then only ever
    /// written), so bytes nobody wrote are zeros or an earlier block's, never undefined.
    pub fn freeze_whole(self) -> Option<Bytes> {
        match self.inner {
            Inner::Slot(mut s) => {
                s.len = s.cap;
                Some(Bytes::from_owner(s))
            }
            Inner::Heap { .. } => None,
        }
    }

    /// The bytes written, as a buffer the cache keeps without a copy. An arena slot stays
    /// taken until the last clone of the result is dropped: it is never reused under a
    /// reader.
    pub fn freeze(self) -> Bytes {
        match self.inner {
            Inner::Slot(s) => Bytes::from_owner(s),
            Inner::Heap { buf, .. } => buf.freeze(),
        }
    }
}
