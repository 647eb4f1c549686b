//! The copy loops, with AVX2 streaming stores and the CPU's CRC32C instruction.

use std::arch::x86_64::{
    __m256i, _mm_crc32_u8, _mm_crc32_u64, _mm_cvtsi128_si64, _mm_extract_epi64, _mm_sfence,
    _mm256_castsi256_si128, _mm256_extracti128_si256, _mm256_loadu_si256, _mm256_stream_si256,
};
use std::ptr;

use super::crc_shift;

/// Copies `len` bytes from `src` to `dst` with non-temporal stores for the 32-byte
/// aligned middle and plain copies for the unaligned ends.
///
/// # Safety
/// `dst` must be valid for `len` bytes of writes, `src` for `len` bytes of reads, the
/// regions must not overlap, and the CPU must support AVX2.
#[target_feature(enable = "avx2")]
pub unsafe fn stream_copy(dst: *mut u8, src: *const u8, len: usize) {
    // SAFETY: the caller's contract covers every pointer offset below, all < `len`.
    unsafe {
        let head = dst.align_offset(32).min(len);
        ptr::copy_nonoverlapping(src, dst, head);
        let mut i = head;
        while i + 128 <= len {
            let a = _mm256_loadu_si256(src.add(i).cast::<__m256i>());
            let b = _mm256_loadu_si256(src.add(i + 32).cast::<__m256i>());
            let c = _mm256_loadu_si256(src.add(i + 64).cast::<__m256i>());
            let d = _mm256_loadu_si256(src.add(i + 96).cast::<__m256i>());
            _mm256_stream_si256(dst.add(i).cast::<__m256i>(), a);
            _mm256_stream_si256(dst.add(i + 32).cast::<__m256i>(), b);
            _mm256_stream_si256(dst.add(i + 64).cast::<__m256i>(), c);
            _mm256_stream_si256(dst.add(i + 96).cast::<__m256i>(), d);
            i += 128;
        }
        ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i);
        // Make the streamed stores visible before the buffer is published.
        _mm_sfence();
    }
}

/// Copies `len` bytes from `src` to `dst` like [`stream_copy`] and returns the CRC32C of
/// the bytes stored.
///
/// Each 64-bit word is loaded once, into a register that is both stored and fed to the
/// CRC: the checksum describes exactly what was written, even if another process changes
/// `src` meanwhile. Three thirds of the buffer are copied side by side, each with its own
/// CRC chain (one chain is bound by the instruction's latency, three by memory), and the
/// three registers are joined at the end.
///
/// # Safety
/// As [`stream_copy`], and the CPU must support SSE4.2 as well.
#[target_feature(enable = "avx2,sse4.2")]
pub unsafe fn stream_copy_crc32c(dst: *mut u8, src: *const u8, len: usize) -> u32 {
    const STEP: usize = 64;
    // SAFETY: the caller's contract covers every pointer offset below, all < `len`.
    unsafe {
        // Up to the first 64-byte boundary of `dst`, byte by byte: every third then starts
        // aligned, as the streaming stores require.
        let head = dst.align_offset(STEP).min(len);
        let reg = copy_crc_scalar(0xffff_ffff, src, dst, head);
        let (src, dst, len) = (src.add(head), dst.add(head), len - head);
        let third = (len / 3) & !(STEP - 1);
        let last = len - 2 * third;
        let (mut a, mut b, mut c) = (u64::from(reg), 0u64, 0u64);
        let mut i = 0;
        while i < third {
            for lane in [0, 32] {
                let x = load_once(src.add(i + lane));
                let y = load_once(src.add(third + i + lane));
                let z = load_once(src.add(2 * third + i + lane));
                _mm256_stream_si256(dst.add(i + lane).cast::<__m256i>(), x);
                _mm256_stream_si256(dst.add(third + i + lane).cast::<__m256i>(), y);
                _mm256_stream_si256(dst.add(2 * third + i + lane).cast::<__m256i>(), z);
                a = crc_words(a, x);
                b = crc_words(b, y);
                c = crc_words(c, z);
            }
            i += STEP;
        }
        // The last third is the longest: it takes what did not divide into steps.
        let tail = 2 * third + third;
        let c = copy_crc_scalar(c as u32, src.add(tail), dst.add(tail), last - third);
        _mm_sfence();
        let ab = crc_shift::join(a as u32, b as u32, third);
        !crc_shift::join(ab, c, last)
    }
}

/// The 32 bytes at `p`, read from memory exactly once.
///
/// A plain load would let the compiler read the words again for the CRC (it did: `crc32q`
/// with a memory operand beside the vector load), which is a second read of memory another
/// process may have changed in between. An `asm!` load has one output, a register, and
/// the compiler cannot repeat it.
///
/// # Safety
/// `p` must be valid for 32 bytes of reads.
#[inline]
#[target_feature(enable = "avx2")]
unsafe fn load_once(p: *const u8) -> __m256i {
    let v: __m256i;
    // SAFETY: the caller's contract; the instruction reads 32 bytes at `p` and writes only
    // its output register.
    unsafe {
        std::arch::asm!(
            "vmovdqu {v}, ymmword ptr [{p}]",
            p = in(reg) p,
            v = out(ymm_reg) v,
            options(nostack, preserves_flags, readonly),
        );
    }
    v
}

/// The CRC register after the four 64-bit words of `v`, in memory order.
#[inline]
#[target_feature(enable = "avx2,sse4.2")]
fn crc_words(reg: u64, v: __m256i) -> u64 {
    let lo = _mm256_castsi256_si128(v);
    let hi = _mm256_extracti128_si256::<1>(v);
    // The casts reinterpret the words' bits; nothing is lost.
    let reg = _mm_crc32_u64(reg, _mm_cvtsi128_si64(lo) as u64);
    let reg = _mm_crc32_u64(reg, _mm_extract_epi64::<1>(lo) as u64);
    let reg = _mm_crc32_u64(reg, _mm_cvtsi128_si64(hi) as u64);
    _mm_crc32_u64(reg, _mm_extract_epi64::<1>(hi) as u64)
}

/// Copies `len` bytes one by one with plain stores, each byte read once and fed to the CRC
/// register `reg` from that same read; returns the register.
///
/// # Safety
/// As [`stream_copy_crc32c`].
#[target_feature(enable = "sse4.2")]
unsafe fn copy_crc_scalar(mut reg: u32, src: *const u8, dst: *mut u8, len: usize) -> u32 {
    for i in 0..len {
        // SAFETY: `i < len`, covered by the caller's contract.
        unsafe {
            let byte = src.add(i).read_volatile();
            dst.add(i).write(byte);
            reg = _mm_crc32_u8(reg, byte);
        }
    }
    reg
}
