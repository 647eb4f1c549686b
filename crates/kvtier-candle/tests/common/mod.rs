//! Helpers shared by the model tests.

#![allow(
    clippy::unwrap_used,
    dead_code,
    reason = "test code; not every test file uses every helper"
)]

use kvtier_node::Settings;
use kvtier_node::units::ByteSize;

/// Server (and embedded SSD) settings on `dir`: loopback on a free port, the SSD tier on,
/// `ram` bytes of RAM, no free-space watermark (the test disk may be nearly full).
pub fn ssd_settings(dir: &std::path::Path, ram: u64) -> Settings {
    let mut s = Settings {
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.to_path_buf(),
        ram: ByteSize(ram),
        ..Default::default()
    };
    s.ssd.min_free = ByteSize(0);
    s
}

/// Every step's logits are finite and equal to the cold run's, bit for bit.
pub fn assert_logits_bit_identical(warm: &[Vec<f32>], cold: &[Vec<f32>]) {
    assert_eq!(warm.len(), cold.len(), "decode lengths differ");
    for (step, (a, b)) in warm.iter().zip(cold).enumerate() {
        assert_eq!(a.len(), b.len());
        assert!(
            a.iter().all(|v| v.is_finite()),
            "step {step}: non-finite logits"
        );
        let differing = a
            .iter()
            .zip(b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(
            differing, 0,
            "step {step}: {differing} logits differ in their bits"
        );
    }
}
