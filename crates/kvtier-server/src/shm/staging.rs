//! A client's staging memory: a memory file the client maps read-write and the server
//! read-only, and which of its ranges are reserved for stores not yet committed.

use std::collections::BTreeMap;
use std::os::fd::{AsFd, OwnedFd};

use kvtier_client::shm::map::Mapping;

/// Reservations start on pages (for DMA into them).
const PAGE: u64 = 4096;

/// One client's staging memory.
#[derive(Debug)]
pub struct Staging {
    file: OwnedFd,
    map: Mapping,
    /// Free ranges, start → length, coalesced.
    free: BTreeMap<u64, u64>,
}

impl Staging {
    /// A new staging memory of `bytes` bytes: a memory file that can neither shrink nor
    /// grow (the client cannot make the server's reads of it fault), mapped read-only.
    pub fn new(bytes: u64) -> std::io::Result<Self> {
        let len = usize::try_from(bytes).map_err(|_| std::io::ErrorKind::InvalidInput)?;
        let file = kvtier_core::arena::memory_file(c"kvtier-staging", len, false)?;
        let map = Mapping::map(file.as_fd(), len, false)?;
        Ok(Self {
            file,
            map,
            free: BTreeMap::from([(0, bytes)]),
        })
    }

    /// The memory file, to hand to the client.
    pub fn file(&self) -> &OwnedFd {
        &self.file
    }

    /// Bytes of staging memory.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// `count` ranges of `each` bytes, page-aligned and one after another, or `None`
    /// when no free run is that long.
    pub fn reserve(&mut self, count: u64, each: u64) -> Option<Vec<u64>> {
        let stride = each.checked_next_multiple_of(PAGE)?;
        let want = stride.checked_mul(count)?;
        let (&start, &len) = self.free.iter().find(|&(_, &len)| len >= want)?;
        self.free.remove(&start);
        if len > want {
            self.free.insert(start + want, len - want);
        }
        Some((0..count).map(|i| start + i * stride).collect())
    }

    /// Gives back what [`Staging::reserve`] handed out as `offsets` of `each` bytes.
    pub fn release(&mut self, offsets: &[u64], each: u64) {
        let (Some(&start), Some(stride)) = (offsets.first(), each.checked_next_multiple_of(PAGE))
        else {
            return;
        };
        let mut start = start;
        let mut len = stride * offsets.len() as u64;
        if let Some((&next, &next_len)) = self.free.range(start + len..).next()
            && next == start + len
        {
            self.free.remove(&next);
            len += next_len;
        }
        if let Some((&prev, &prev_len)) = self.free.range(..start).next_back()
            && prev + prev_len == start
        {
            self.free.remove(&prev);
            start = prev;
            len += prev_len;
        }
        self.free.insert(start, len);
    }

    /// The bytes `offset..offset + len`, as the client left them.
    ///
    /// The client owns this memory and may write it while the server reads (it must not,
    /// but nothing stops it): whatever the server copies is then checksummed where it
    /// landed, and a block whose checksum is not the one the client declared is refused.
    pub fn bytes(&self, offset: u64, len: u64) -> Option<&[u8]> {
        self.map.holds(offset, len).then(|| {
            // SAFETY: inside the mapping (checked). The protocol says nobody writes a
            // committed range while the server copies it; a client that breaks that can
            // only change what is copied, which the checksum of the copy catches.
            #[expect(unsafe_code, reason = "staging memory is read in place")]
            unsafe {
                self.map.bytes(offset as usize, len as usize)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_handed_out_once_and_coalesce_when_given_back() {
        let mut s = Staging::new(16 * PAGE).unwrap();
        let a = s.reserve(2, 3 * PAGE - 1).unwrap();
        assert_eq!(a, vec![0, 3 * PAGE]);
        let b = s.reserve(1, 10 * PAGE).unwrap();
        assert_eq!(b, vec![6 * PAGE]);
        assert!(s.reserve(1, PAGE).is_none(), "full");
        s.release(&a, 3 * PAGE - 1);
        assert!(s.reserve(1, 7 * PAGE).is_none(), "only six pages free");
        s.release(&b, 10 * PAGE);
        assert_eq!(s.reserve(1, 16 * PAGE), Some(vec![0]), "all coalesced");
        assert_eq!(
            s.bytes(15 * PAGE, PAGE).map(<[u8]>::len),
            Some(PAGE as usize)
        );
        assert!(s.bytes(15 * PAGE, PAGE + 1).is_none());
    }
}
