//! Byte planes: `w`-byte words taken apart into `w` planes (plane `p` holds byte `p` of
//! every word) and put back together. Only whole words are split; the caller keeps the
//! `len % w` trailing bytes as they are.
//!
//! The loops are written per width so the compiler sees constant strides (2 and 4 are the
//! KV dtypes); about memcpy speed here.

/// Words handled per step of the fixed-width loops: fixed-size arrays without bounds
/// checks, which the compiler turns into vector shuffles (about 4× the plain loop here).
const STEP: usize = 16;

/// Splits the whole words of `bytes` into `planes` (each exactly `bytes.len() / w` long).
pub(crate) fn split(bytes: &[u8], planes: &mut [Vec<u8>]) {
    let w = planes.len();
    let n = bytes.len() / w;
    for p in planes.iter_mut() {
        p.clear();
        p.resize(n, 0);
    }
    match planes {
        [a, b] => split_fixed::<2>(&bytes[..n * 2], [a, b]),
        [a, b, c, d] => split_fixed::<4>(&bytes[..n * 4], [a, b, c, d]),
        _ => {
            for (i, word) in bytes.chunks_exact(w).enumerate() {
                for (p, plane) in planes.iter_mut().enumerate() {
                    plane[i] = word[p];
                }
            }
        }
    }
}

fn split_fixed<const W: usize>(bytes: &[u8], planes: [&mut Vec<u8>; W]) {
    let n = bytes.len() / W;
    let whole = n / STEP * STEP;
    let mut planes = planes.map(|p| p.as_mut_slice());
    for (s, src) in bytes[..whole * W].chunks_exact(STEP * W).enumerate() {
        let src: &[u8; 64] = &pad(src);
        for (p, plane) in planes.iter_mut().enumerate() {
            let dst: &mut [u8] = &mut plane[s * STEP..s * STEP + STEP];
            for i in 0..STEP {
                dst[i] = src[i * W + p];
            }
        }
    }
    for i in whole..n {
        for (p, plane) in planes.iter_mut().enumerate() {
            plane[i] = bytes[i * W + p];
        }
    }
}

/// A step's bytes as a fixed-size array (at most 64: 16 words of up to 4 bytes).
fn pad(src: &[u8]) -> [u8; 64] {
    let mut a = [0u8; 64];
    a[..src.len()].copy_from_slice(src);
    a
}

/// Interleaves `planes` (each `out.len() / planes.len()` long) into the whole words of
/// `out`.
pub(crate) fn merge(planes: &[&[u8]], out: &mut [u8]) {
    let w = planes.len();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_then_merge_gives_back_the_whole_words_for_every_width() {
        let bytes: Vec<u8> = (0..103u32).map(|i| (i * 7 + 3) as u8).collect();
        for w in 1..=8 {
            let mut planes = vec![Vec::new(); w];
            split(&bytes, &mut planes);
            let n = bytes.len() / w;
            assert!(planes.iter().all(|p| p.len() == n));
            assert_eq!(planes[0][1], bytes[w]);
            let refs: Vec<&[u8]> = planes.iter().map(Vec::as_slice).collect();
            let mut out = vec![0u8; n * w];
            merge(&refs, &mut out);
            assert_eq!(out, bytes[..n * w]);
        }
    }
}
