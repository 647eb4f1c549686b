//! Timing helpers: samples, medians, and the memcpy baseline.

use std::hint::black_box;
use std::time::Instant;

/// Runs `f` `samples` times and returns the median of what it returns.
pub fn median_of(samples: usize, mut f: impl FnMut() -> f64) -> f64 {
    let mut v: Vec<f64> = (0..samples.max(1)).map(|_| f()).collect();
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Seconds taken by `f`.
pub fn seconds(f: impl FnOnce()) -> f64 {
    let t = Instant::now();
    f();
    t.elapsed().as_secs_f64()
}

/// A source buffer of `size` bytes with a non-trivial pattern.
pub fn pattern(size: usize, seed: u8) -> Vec<u8> {
    (0..size)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 12) as u8)
        .collect()
}

/// Median memcpy throughput in GB/s for `size`-byte copies, `threads` copying at once, each
/// from its own source into its own (pre-faulted, reused) destination: the best the machine
/// does for moving these bytes.
/// The best single-pass copy rate this machine reaches into memory the CPU cache does not
/// hold, as the RAM tier's: `size`-byte copies from one warm source into a ring of warm
/// (already faulted) destinations of `ring_bytes` in all, by `threads` threads — the faster
/// of a plain `memcpy` and streaming (non-temporal) stores.
pub fn cold_copy_gbps(
    size: usize,
    ring_bytes: usize,
    iters: usize,
    samples: usize,
    threads: usize,
) -> f64 {
    let per_thread = (ring_bytes / threads / size).max(2);
    let mut work: Vec<(Vec<u8>, Vec<Vec<u8>>)> = (0..threads)
        .map(|t| {
            let ring = (0..per_thread).map(|i| pattern(size, i as u8)).collect();
            (pattern(size, t as u8), ring)
        })
        .collect();
    let mut rate = |streaming: bool| {
        median_of(samples, || {
            let secs = seconds(|| {
                std::thread::scope(|s| {
                    for (src, ring) in work.iter_mut() {
                        s.spawn(move || {
                            let n = ring.len();
                            for i in 0..iters {
                                let dst = &mut ring[i % n];
                                if streaming {
                                    kvtier_core::copy::copy_to_slice(dst, black_box(src));
                                } else {
                                    dst.copy_from_slice(black_box(src));
                                }
                                black_box(&dst);
                            }
                        });
                    }
                });
            });
            (size * iters * threads) as f64 / secs / 1e9
        })
    };
    rate(false).max(rate(true))
}

pub fn memcpy_gbps(size: usize, iters: usize, samples: usize, threads: usize) -> f64 {
    let bufs: Vec<(Vec<u8>, Vec<u8>)> = (0..threads)
        .map(|t| (pattern(size, t as u8), vec![0u8; size]))
        .collect();
    let mut bufs = bufs;
    median_of(samples, || {
        let secs = seconds(|| {
            std::thread::scope(|s| {
                for (src, dst) in bufs.iter_mut() {
                    s.spawn(move || {
                        for _ in 0..iters {
                            dst.copy_from_slice(black_box(src));
                            black_box(&dst);
                        }
                    });
                }
            });
        });
        (size * iters * threads) as f64 / secs / 1e9
    })
}
