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
