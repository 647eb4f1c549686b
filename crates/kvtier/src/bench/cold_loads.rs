//! The SSD load rows' measurement, written once: the tier reading its blocks with a cold
//! page cache, against cached and O_DIRECT `pread`s of the same bytes from a plain file.

use std::fs::{File, OpenOptions};
use std::hint::black_box;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

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
    primer: Option<Primer>,
}

/// Bytes of the file a [`Primer`] reads.
const PRIMER_BYTES: u64 = 64 << 20;
/// Bytes per read of a [`Primer`].
const PRIMER_READ: usize = 2 << 20;
/// How long a [`Primer`] reads at least: longer than the idle spell before a load plus
/// the throttle's slice (100 ms on this machine's disk), so no credit is left.
const PRIMER_TIME: Duration = Duration::from_millis(300);

/// Untimed `O_DIRECT` reads of a file of its own right before each timed load, so that
/// every contender starts with the disk busy. This matters under a block-I/O throttle
/// (`scripts/slow-disk.sh`, where the disk is made the limit): the kernel's throttle lets
/// a reader that arrives after an idle spell spend that spell's allowance at once (the
/// spell plus up to one time slice at the full rate), and the spells differ — dropping a
/// page cache full of the previous contender's bytes takes 10–180 ms, dropping none 10.
/// Measured without it (BENCHMARKS.md, issue 40), a 256 MiB read's rate depended more on
/// who went before than on how it read. On a disk with no throttle the primer changes
/// nothing but the time a row takes.
struct Primer {
    file: File,
}

impl Primer {
    /// Writes the primer's file at `path` (synced, untimed) and opens it for direct reads;
    /// `None` where the filesystem has no `O_DIRECT` (nothing to throttle there either).
    fn write(path: &Path) -> anyhow::Result<Option<Self>> {
        let piece = vec![0x5au8; PRIMER_READ];
        let file = File::create(path)?;
        for at in (0..PRIMER_BYTES).step_by(PRIMER_READ) {
            file.write_all_at(&piece, at)?;
        }
        file.sync_data()?;
        Ok(kvtier_ssd::store::direct::open_direct(path).map(|file| Self { file }))
    }

    /// Reads the file over and over for at least [`PRIMER_TIME`] (whole passes).
    fn read(&self) {
        let started = Instant::now();
        while started.elapsed() < PRIMER_TIME {
            for at in (0..PRIMER_BYTES).step_by(PRIMER_READ) {
                let got = kvtier_ssd::store::direct::read_direct(&self.file, at, PRIMER_READ);
                black_box(got.ok());
            }
        }
    }
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
        let primer = Primer::write(&path.with_extension("primer"))?;
        Ok(Self {
            file,
            path: path.to_path_buf(),
            n,
            size,
            stride,
            primer,
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
    /// whoever it was), then the three contenders, each after dropping the page cache and
    /// a [`Primer`]'s reads, rotating through the three positions by `sample` (the position
    /// matters on this virtual disk, and the baseline must not get more draws than we do).
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
            if let Some(primer) = &raw.primer {
                primer.read();
            }
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
