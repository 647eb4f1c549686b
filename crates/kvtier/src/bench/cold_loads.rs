//! The SSD load rows' measurement, written once: the tier reading its blocks with a cold
//! page cache, against cached and O_DIRECT `pread`s of the same bytes from a plain file.

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use kvtier_core::tier::{BlockMeta, Tier};

use super::measure::seconds;

/// Drops the page cache; false without permission.
pub fn drop_caches() -> bool {
    std::fs::write("/proc/sys/vm/drop_caches", "1").is_ok()
}

/// The baseline's file: `n` blocks of `size` bytes, block `i` at `4096 + i × stride`.
pub struct RawBlocks {
    file: File,
    path: PathBuf,
    n: usize,
    size: usize,
    stride: u64,
}

impl RawBlocks {
    /// Writes `payloads` (each `size` bytes) to a fresh file at `path`, synced, untimed.
    pub fn write<'a>(
        path: &Path,
        payloads: impl ExactSizeIterator<Item = &'a [u8]>,
        size: usize,
    ) -> anyhow::Result<Self> {
        let stride = kvtier_ssd::format::align_up(size as u64 + 4096);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(path)?;
        let n = payloads.len();
        for (i, p) in payloads.enumerate() {
            file.write_all_at(p, 4096 + i as u64 * stride)?;
        }
        file.sync_data()?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            n,
            size,
            stride,
        })
    }

    fn read_cached(&self, buf: &mut [u8]) {
        for i in 0..self.n as u64 {
            black_box(self.file.read_exact_at(buf, 4096 + i * self.stride).ok());
        }
    }
}

/// Load throughputs, GB/s per sample: `[ours, cached pread, O_DIRECT pread]`.
#[derive(Default)]
pub struct Loads {
    samples: [Vec<f64>; 3],
    /// A drop of the page cache failed (no permission).
    not_dropped: bool,
}

impl Loads {
    /// One sample: an untimed cold pass over the tier and the file first (the virtual disk
    /// is still settling the stores, and the first read after them ran up to 3× slower,
    /// whoever it was), then the three contenders, each after dropping the page cache,
    /// rotating through the three positions by `sample` (the position matters on this
    /// virtual disk, and the baseline must not get more draws than we do).
    pub fn sample(&mut self, sample: usize, ours: &dyn Fn(), raw: &RawBlocks) {
        let direct = kvtier_ssd::store::direct::open_direct(&raw.path);
        let mut buf = vec![0u8; raw.size];
        let bytes = (raw.n * raw.size) as f64;
        drop_caches();
        ours();
        raw.read_cached(&mut buf);
        for turn in 0..3 {
            let contender = (turn + sample) % 3;
            self.not_dropped |= !drop_caches();
            let secs = match contender {
                0 => seconds(ours),
                1 => seconds(|| raw.read_cached(&mut buf)),
                _ => match &direct {
                    Some(file) => seconds(|| {
                        for i in 0..raw.n as u64 {
                            let at = 4096 + i * raw.stride;
                            let got = kvtier_ssd::store::direct::read_direct(file, at, raw.size);
                            black_box(got.ok());
                        }
                    }),
                    None => continue,
                },
            };
            self.samples[contender].push(bytes / secs / 1e9);
        }
    }

    /// [`Loads::sample`] with `tier` reading every block of `metas` as ours.
    pub fn sample_tier(
        &mut self,
        sample: usize,
        tier: &dyn Tier,
        metas: &[BlockMeta],
        raw: &RawBlocks,
    ) {
        let ours = || {
            for m in metas {
                black_box(tier.get(&m.hash).ok());
            }
        };
        self.sample(sample, &ours, raw);
    }

    /// Our median, the baseline (the better median of the two reads) and what it was.
    pub fn medians(self) -> (f64, f64, &'static str) {
        let med = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v.get(v.len() / 2).copied().unwrap_or(0.0)
        };
        let [ours, cached, direct] = self.samples;
        let (ours, cached, direct) = (med(ours), med(cached), med(direct));
        let note = match (!self.not_dropped, cached >= direct) {
            (true, true) => "cached pread of the same bytes (beat O_DIRECT), page cache dropped",
            (true, false) => "O_DIRECT pread of the same bytes (beat cached), page cache dropped",
            (false, _) => {
                "best of cached and O_DIRECT pread; page cache NOT dropped (no permission)"
            }
        };
        (ours, cached.max(direct), note)
    }
}
