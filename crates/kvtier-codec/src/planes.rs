//! Byte planes: `w`-byte words taken apart into `w` planes (plane `p` holds byte `p` of
//! every word) and put back together. Only whole words are split; the caller keeps the
//! `len % w` trailing bytes as they are.
//!
//! The loops are written per width so the compiler sees constant strides (2 and 4 are the
//! KV dtypes); about memcpy speed here.

/// Splits the whole words of `bytes` into `planes` (each exactly `bytes.len() / w` long).
pub(crate) fn split(bytes: &[u8], planes: &mut [Vec<u8>]) {
    let w = planes.len();
    let n = bytes.len() / w;
    for p in planes.iter_mut() {
        p.clear();
        p.resize(n, 0);
    }
    match planes {
        [a, b] => {
            for (i, word) in bytes.chunks_exact(2).enumerate() {
                a[i] = word[0];
                b[i] = word[1];
            }
        }
        [a, b, c, d] => {
            for (i, word) in bytes.chunks_exact(4).enumerate() {
                a[i] = word[0];
                b[i] = word[1];
                c[i] = word[2];
                d[i] = word[3];
            }
        }
        _ => {
            for (i, word) in bytes.chunks_exact(w).enumerate() {
                for (p, plane) in planes.iter_mut().enumerate() {
                    plane[i] = word[p];
                }
            }
        }
    }
}

/// Interleaves `planes` (each `out.len() / planes.len()` long) into the whole words of
/// `out`.
pub(crate) fn merge(planes: &[&[u8]], out: &mut [u8]) {
    let w = planes.len();
    match planes {
        [a, b] => {
            for (i, word) in out.chunks_exact_mut(2).enumerate() {
                word[0] = a[i];
                word[1] = b[i];
            }
        }
        [a, b, c, d] => {
            for (i, word) in out.chunks_exact_mut(4).enumerate() {
                word[0] = a[i];
                word[1] = b[i];
                word[2] = c[i];
                word[3] = d[i];
            }
        }
        _ => {
            for (i, word) in out.chunks_exact_mut(w).enumerate() {
                for (p, plane) in planes.iter().enumerate() {
                    word[p] = plane[i];
                }
            }
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
