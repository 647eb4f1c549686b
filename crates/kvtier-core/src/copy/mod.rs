//! Copying payloads into memory the cache will keep.
//!
//! A block written into the cache is read again at the next turn, not now, and it lands in
//! memory that is almost never in the CPU cache (the budget is far larger than the cache).
//! A plain `memcpy` first reads every destination line into the cache and then writes it
//! back; non-temporal stores write straight to memory instead, which on the machines we
//! measured moves 2 MiB blocks 1.3-1.5x faster into cold memory and leaves the CPU cache
//! to the model. Small copies and CPUs without AVX2 use the plain copy.
#![expect(
    unsafe_code,
    reason = "non-temporal SIMD stores need core::arch intrinsics"
)]

use bytes::BytesMut;

/// Copies shorter than this use the plain copy.
const NON_TEMPORAL_MIN: usize = 64 << 10;

/// Appends `src` to `buf` (growing it if needed): how a block is filled piece by piece as
/// its bytes arrive from the network.
pub(crate) fn append_into(buf: &mut BytesMut, src: &[u8]) {
    buf.reserve(src.len());
    #[cfg(target_arch = "x86_64")]
    if src.len() >= NON_TEMPORAL_MIN && std::arch::is_x86_feature_detected!("avx2") {
        let had = buf.len();
        let spare = buf.spare_capacity_mut();
        debug_assert!(spare.len() >= src.len());
        // SAFETY: `reserve` guarantees `spare` holds at least `src.len()` bytes; the two
        // regions cannot overlap (`buf` owns its allocation, `src` is borrowed immutably);
        // AVX2 was detected above; after the copy the `src.len()` bytes past the old length
        // are initialised, which is what `set_len` requires.
        unsafe {
            x86::stream_copy(spare.as_mut_ptr().cast::<u8>(), src.as_ptr(), src.len());
            buf.set_len(had + src.len());
        }
        return;
    }
    buf.extend_from_slice(src);
}

/// Copies `src` into `dst` (of the same length) with the same streaming stores as
/// [`append_into`]: how a block is filled in memory the caller already owns (an arena slot).
pub fn copy_to_slice(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "copy_to_slice: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if src.len() >= NON_TEMPORAL_MIN && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: `dst` is valid for `src.len()` bytes of writes (same length, checked
        // above), `src` for as many reads; a `&mut` and a `&` cannot overlap; AVX2 was
        // detected above.
        unsafe { x86::stream_copy(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
        return;
    }
    dst.copy_from_slice(src);
}

/// Copies `src` into `dst` (same length) with streaming stores, as [`copy_to_slice`], and
/// returns the CRC32C of the bytes that landed in `dst`.
///
/// The checksum is of the bytes written, not of the source as it may be by then: a source
/// another process can change during the copy (a client's staging memory) cannot make it
/// describe bytes that are not there. On x86-64 with AVX2 and SSE4.2 the copy and the
/// checksum are one pass (each word loaded once, stored and checksummed from the same
/// register) that runs as fast as the streaming copy alone; elsewhere the copy is followed
/// by a checksum of `dst`, which only this process can write.
pub fn copy_checked(dst: &mut [u8], src: &[u8]) -> u32 {
    assert_eq!(dst.len(), src.len(), "copy_checked: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("sse4.2")
    {
        // SAFETY: `dst` is valid for `src.len()` bytes of writes (same length, checked
        // above), `src` for as many reads; a `&mut` and a `&` cannot overlap; both CPU
        // features were detected above.
        return unsafe { x86::stream_copy_crc32c(dst.as_mut_ptr(), src.as_ptr(), src.len()) };
    }
    copy_to_slice(dst, src);
    crc_fast::crc32_iscsi(dst) as u32
}

mod crc_shift;
#[cfg(target_arch = "x86_64")]
mod x86;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_every_length_and_offset_exactly() {
        for len in [
            0,
            1,
            31,
            33,
            191,
            192,
            193,
            4095,
            NON_TEMPORAL_MIN - 1,
            NON_TEMPORAL_MIN,
            NON_TEMPORAL_MIN + 77,
            300_001,
            (2 << 20) + 5,
        ] {
            for offset in [0usize, 1, 7, 31] {
                let src: Vec<u8> = (0..len + offset).map(|i| (i * 7 + 3) as u8).collect();
                let mut buf = BytesMut::new();
                append_into(&mut buf, &src[offset..]);
                assert_eq!(&buf[..], &src[offset..], "len {len} offset {offset}");
                // Appending in two pieces gives the same bytes.
                let (a, b) = src[offset..].split_at(len / 3);
                let mut appended = BytesMut::with_capacity(len);
                append_into(&mut appended, a);
                append_into(&mut appended, b);
                assert_eq!(&appended[..], &src[offset..], "appended, len {len}");
                // Into memory the caller owns, the same bytes.
                let mut owned = vec![0u8; len];
                copy_to_slice(&mut owned, &src[offset..]);
                assert_eq!(&owned[..], &src[offset..], "to a slice, len {len}");
                // Checked: the same bytes and their CRC32C, from every alignment of `dst`.
                let mut checked = vec![0u8; len + 64];
                let dst = &mut checked[offset..offset + len];
                let crc = copy_checked(dst, &src[offset..]);
                assert_eq!(dst, &src[offset..], "checked, len {len} offset {offset}");
                assert_eq!(
                    crc,
                    crc_fast::crc32_iscsi(&src[offset..]) as u32,
                    "crc, len {len}"
                );
                // Reuse the same allocation for a shorter copy.
                buf.clear();
                append_into(&mut buf, &src[offset..offset + len / 2]);
                assert_eq!(&buf[..], &src[offset..offset + len / 2]);
            }
        }
    }
}
