//! Byte planes: `w`-byte words taken apart into `w` planes (plane `p` holds byte `p` of
//! every word) and put back together. Only whole words are split; the caller keeps the
//! `len % w` trailing bytes as they are.
//!
//! Splitting 2- and 4-byte words (the KV dtypes) works on 64-bit words: the even bytes
//! of a word are gathered by three mask-and-shift steps, no byte at a time (about 10 GB/s
//! here against 3 for a byte loop the compiler could not vectorize with SSE2 alone).
//! Merging is written per width so the compiler sees constant strides. Where the CPU has
//! AVX2 (checked at run time), word loops compiled for it split about 5× faster still.

/// Words handled per step of the fixed-width merge loops: fixed-size arrays without
/// bounds checks, which the compiler turns into vector shuffles (about 4× the plain loop
/// here).
const STEP: usize = 16;

/// Splits the whole words of `bytes` into `planes` (each exactly `bytes.len() / w` long,
/// `w` = the number of planes).
pub(crate) fn split(bytes: &[u8], planes: &mut [&mut [u8]]) {
    let w = planes.len();
    let n = bytes.len() / w;
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        match planes {
            [a, b] => return avx2::split2(&bytes[..n * 2], a, b),
            [a, b, c, d] => return avx2::split4(&bytes[..n * 4], [a, b, c, d]),
            _ => {}
        }
    }
    match planes {
        [a, b] => split2(&bytes[..n * 2], a, b),
        [a, b, c, d] => split4(&bytes[..n * 4], [a, b, c, d]),
        _ => {
            for (i, word) in bytes.chunks_exact(w).enumerate() {
                for (p, plane) in planes.iter_mut().enumerate() {
                    plane[i] = word[p];
                }
            }
        }
    }
}

/// Bytes 0, 2, 4 and 6 of `x`, packed into the low 32 bits.
#[inline(always)]
fn even_bytes(x: u64) -> u64 {
    let x = x & 0x00ff_00ff_00ff_00ff;
    let x = (x | (x >> 8)) & 0x0000_ffff_0000_ffff;
    (x | (x >> 16)) & 0xffff_ffff
}

/// The even and the odd bytes of 16 bytes, 8 each.
#[inline(always)]
fn deinterleave(a: u64, b: u64) -> (u64, u64) {
    (
        even_bytes(a) | (even_bytes(b) << 32),
        even_bytes(a >> 8) | (even_bytes(b >> 8) << 32),
    )
}

fn word(bytes: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(bytes);
    u64::from_le_bytes(w)
}

fn split2(bytes: &[u8], lo: &mut [u8], hi: &mut [u8]) {
    let whole = bytes.len() / 16 * 16;
    let steps = bytes[..whole]
        .chunks_exact(16)
        .zip(lo.chunks_exact_mut(8))
        .zip(hi.chunks_exact_mut(8));
    for ((src, l), h) in steps {
        let (even, odd) = deinterleave(word(&src[..8]), word(&src[8..]));
        l.copy_from_slice(&even.to_le_bytes());
        h.copy_from_slice(&odd.to_le_bytes());
    }
    for i in whole / 2..bytes.len() / 2 {
        lo[i] = bytes[2 * i];
        hi[i] = bytes[2 * i + 1];
    }
}

fn split4(bytes: &[u8], planes: [&mut [u8]; 4]) {
    let [p0, p1, p2, p3] = planes;
    let whole = bytes.len() / 32 * 32;
    let steps = bytes[..whole]
        .chunks_exact(32)
        .zip(p0.chunks_exact_mut(8))
        .zip(p1.chunks_exact_mut(8))
        .zip(p2.chunks_exact_mut(8))
        .zip(p3.chunks_exact_mut(8));
    for ((((src, d0), d1), d2), d3) in steps {
        // Two rounds of even/odd: bytes 0 and 2 of each word, then byte 0 of those.
        let (e01, o01) = deinterleave(word(&src[..8]), word(&src[8..16]));
        let (e23, o23) = deinterleave(word(&src[16..24]), word(&src[24..]));
        let (b0, b2) = deinterleave(e01, e23);
        let (b1, b3) = deinterleave(o01, o23);
        d0.copy_from_slice(&b0.to_le_bytes());
        d1.copy_from_slice(&b1.to_le_bytes());
        d2.copy_from_slice(&b2.to_le_bytes());
        d3.copy_from_slice(&b3.to_le_bytes());
    }
    for i in whole / 4..bytes.len() / 4 {
        p0[i] = bytes[4 * i];
        p1[i] = bytes[4 * i + 1];
        p2[i] = bytes[4 * i + 2];
        p3[i] = bytes[4 * i + 3];
    }
}

/// Interleaves `planes` (each `out.len() / planes.len()` long) into the whole words of
/// `out`.
pub(crate) fn merge(planes: &[&[u8]], out: &mut [u8]) {
    let w = planes.len();
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        match planes {
            [a, b] => return avx2::merge::<2>([a, b], out),
            [a, b, c, d] => return avx2::merge::<4>([a, b, c, d], out),
            _ => {}
        }
    }
    match planes {
        [a, b] => merge_fixed::<2>([a, b], out),
        [a, b, c, d] => merge_fixed::<4>([a, b, c, d], out),
        _ => {
            for (i, word) in out.chunks_exact_mut(w).enumerate() {
                for (p, plane) in planes.iter().enumerate() {
                    word[p] = plane[i];
                }
            }
        }
    }
}

#[inline(always)]
fn merge_fixed<const W: usize>(planes: [&[u8]; W], out: &mut [u8]) {
    let n = out.len() / W;
    let whole = n / STEP * STEP;
    for (s, dst) in out[..whole * W].chunks_exact_mut(STEP * W).enumerate() {
        let mut words = [0u8; 64];
        for (p, plane) in planes.iter().enumerate() {
            let src: &[u8] = &plane[s * STEP..s * STEP + STEP];
            for i in 0..STEP {
                words[i * W + p] = src[i];
            }
        }
        dst.copy_from_slice(&words[..STEP * W]);
    }
    for i in whole..n {
        for (p, plane) in planes.iter().enumerate() {
            out[i * W + p] = plane[i];
        }
    }
}

/// The split and merge compiled for CPUs with AVX2, where they vectorize.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    #![expect(
        unsafe_code,
        reason = "functions compiled for a CPU feature checked at run time"
    )]

    /// Words of one step: 64 bytes of planes a step for bf16, 128 for f32.
    const N: usize = 32;

    /// [`super::split2`]; only called where AVX2 was detected.
    pub(super) fn split2(bytes: &[u8], lo: &mut [u8], hi: &mut [u8]) {
        // SAFETY: the caller checked that this CPU has AVX2.
        unsafe { split2_avx2(bytes, lo, hi) }
    }

    #[target_feature(enable = "avx2")]
    fn split2_avx2(bytes: &[u8], lo: &mut [u8], hi: &mut [u8]) {
        let whole = bytes.len() / (2 * N) * (2 * N);
        let steps = bytes[..whole]
            .chunks_exact(2 * N)
            .zip(lo.chunks_exact_mut(N))
            .zip(hi.chunks_exact_mut(N));
        for ((src, l), h) in steps {
            let mut words = [0u16; N];
            for (w, b) in words.iter_mut().zip(src.chunks_exact(2)) {
                *w = u16::from_le_bytes([b[0], b[1]]);
            }
            for ((l, h), w) in l.iter_mut().zip(h.iter_mut()).zip(words) {
                *l = w as u8;
                *h = (w >> 8) as u8;
            }
        }
        super::split2(&bytes[whole..], &mut lo[whole / 2..], &mut hi[whole / 2..]);
    }

    /// [`super::split4`]; only called where AVX2 was detected.
    pub(super) fn split4(bytes: &[u8], planes: [&mut [u8]; 4]) {
        // SAFETY: the caller checked that this CPU has AVX2.
        unsafe { split4_avx2(bytes, planes) }
    }

    #[target_feature(enable = "avx2")]
    fn split4_avx2(bytes: &[u8], planes: [&mut [u8]; 4]) {
        let [p0, p1, p2, p3] = planes;
        let whole = bytes.len() / (4 * N) * (4 * N);
        let steps = bytes[..whole]
            .chunks_exact(4 * N)
            .zip(p0.chunks_exact_mut(N))
            .zip(p1.chunks_exact_mut(N))
            .zip(p2.chunks_exact_mut(N))
            .zip(p3.chunks_exact_mut(N));
        for ((((src, d0), d1), d2), d3) in steps {
            let mut words = [0u32; N];
            for (w, b) in words.iter_mut().zip(src.chunks_exact(4)) {
                *w = u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
            for (i, w) in words.into_iter().enumerate() {
                d0[i] = w as u8;
                d1[i] = (w >> 8) as u8;
                d2[i] = (w >> 16) as u8;
                d3[i] = (w >> 24) as u8;
            }
        }
        let n = whole / 4;
        super::split4(
            &bytes[whole..],
            [&mut p0[n..], &mut p1[n..], &mut p2[n..], &mut p3[n..]],
        );
    }

    /// [`super::merge_fixed`]; only called where AVX2 was detected.
    pub(super) fn merge<const W: usize>(planes: [&[u8]; W], out: &mut [u8]) {
        // SAFETY: the caller checked that this CPU has AVX2.
        unsafe { merge_avx2(planes, out) }
    }

    #[target_feature(enable = "avx2")]
    fn merge_avx2<const W: usize>(planes: [&[u8]; W], out: &mut [u8]) {
        super::merge_fixed(planes, out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The vectorized split and merge, where this CPU runs them, give the same planes and
    /// words as the 64-bit steps every CPU runs, for lengths around their step sizes.
    #[test]
    fn the_avx2_paths_match_the_portable_ones() {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            let bytes: Vec<u8> = (0..1000u32).map(|i| (i * 131 + i / 7) as u8).collect();
            for len in [0, 1, 63, 64, 65, 127, 128, 129, 255, 256, 257, 999, 1000] {
                let bytes = &bytes[..len];
                let (n2, n4) = (len / 2, len / 4);
                let (mut a, mut b) = (vec![0u8; n2], vec![0u8; n2]);
                let (mut c, mut d) = (vec![0u8; n2], vec![0u8; n2]);
                split2(&bytes[..n2 * 2], &mut a, &mut b);
                avx2::split2(&bytes[..n2 * 2], &mut c, &mut d);
                assert_eq!((&a, &b), (&c, &d), "split2 of {len}");
                let mut portable = vec![vec![0u8; n4]; 4];
                let mut fast = vec![vec![0u8; n4]; 4];
                let [p0, p1, p2, p3] = &mut portable[..] else {
                    unreachable!()
                };
                split4(&bytes[..n4 * 4], [p0, p1, p2, p3].map(|p| p.as_mut_slice()));
                let [f0, f1, f2, f3] = &mut fast[..] else {
                    unreachable!()
                };
                avx2::split4(&bytes[..n4 * 4], [f0, f1, f2, f3].map(|p| p.as_mut_slice()));
                assert_eq!(portable, fast, "split4 of {len}");
                let (mut m, mut n) = (vec![0u8; n2 * 2], vec![0u8; n2 * 2]);
                merge_fixed::<2>([&a, &b], &mut m);
                avx2::merge::<2>([&a, &b], &mut n);
                assert_eq!(m, n, "merge of {len}");
                assert_eq!(m, bytes[..n2 * 2]);
            }
        }
    }

    #[test]
    fn split_then_merge_gives_back_the_whole_words_for_every_width() {
        let bytes: Vec<u8> = (0..103u32).map(|i| (i * 7 + 3) as u8).collect();
        for w in 1..=8 {
            let n = bytes.len() / w;
            let mut planes = vec![vec![0u8; n]; w];
            let mut dests: Vec<&mut [u8]> = planes.iter_mut().map(Vec::as_mut_slice).collect();
            split(&bytes, &mut dests);
            assert!(planes.iter().all(|p| p.len() == n));
            assert_eq!(planes[0][1], bytes[w]);
            let refs: Vec<&[u8]> = planes.iter().map(Vec::as_slice).collect();
            let mut out = vec![0u8; n * w];
            merge(&refs, &mut out);
            assert_eq!(out, bytes[..n * w]);
        }
    }
}
