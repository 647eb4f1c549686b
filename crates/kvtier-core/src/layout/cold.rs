//! [`ColdCodec`]: a lossy encoding a layout allows its pages in the cold tiers.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// A lossy encoding the SSD and remote tiers may hold a layout's pages in (ADR 0021). Only
/// a layout registered with one ever gets it, and it is part of the layout's digest, so a
/// page held lossily is never served under a layout that expects exact bytes. The code is
/// part of the canonical encoding: never reuse one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum ColdCodec {
    /// fp8 e4m3 with one f32 scale per token and head (a group of `head_dim` values).
    Fp8E4M3,
}

impl ColdCodec {
    /// Every cold codec, in code order.
    pub const ALL: [ColdCodec; 1] = [ColdCodec::Fp8E4M3];

    /// The stable code in the canonical layout encoding.
    pub fn code(self) -> u8 {
        match self {
            ColdCodec::Fp8E4M3 => 1,
        }
    }

    /// The name in settings and on the wire (the same as the codec's).
    pub fn name(self) -> &'static str {
        match self {
            ColdCodec::Fp8E4M3 => "fp8_e4m3",
        }
    }
}

impl fmt::Display for ColdCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ColdCodec {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        ColdCodec::ALL
            .into_iter()
            .find(|c| c.name() == s)
            .ok_or_else(|| Error::invalid(format!("unknown cold codec `{s}`; expected fp8_e4m3")))
    }
}
