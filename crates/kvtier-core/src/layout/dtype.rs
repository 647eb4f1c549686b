//! KV element encodings.

use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};

/// How one K or V element is encoded in a block payload.
///
/// The code is part of the canonical [`super::LayoutKey`] encoding, so it must never be
/// reused for another meaning: add new variants with new codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum KvDtype {
    /// IEEE 754 binary32.
    F32,
    /// IEEE 754 binary16.
    F16,
    /// bfloat16.
    Bf16,
    /// 8-bit float, 4 exponent bits, 3 mantissa bits.
    Fp8E4M3,
    /// 8-bit float, 5 exponent bits, 2 mantissa bits.
    Fp8E5M2,
    /// Signed 8-bit integers (a quantized codec whose scales live elsewhere).
    I8,
}

impl KvDtype {
    /// Every encoding, in code order.
    pub const ALL: [KvDtype; 6] = [
        KvDtype::F32,
        KvDtype::F16,
        KvDtype::Bf16,
        KvDtype::Fp8E4M3,
        KvDtype::Fp8E5M2,
        KvDtype::I8,
    ];

    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
            KvDtype::Fp8E4M3 | KvDtype::Fp8E5M2 | KvDtype::I8 => 1,
        }
    }

    /// The stable one-byte code used in the canonical layout encoding.
    pub fn code(self) -> u8 {
        match self {
            KvDtype::F32 => 1,
            KvDtype::F16 => 2,
            KvDtype::Bf16 => 3,
            KvDtype::Fp8E4M3 => 4,
            KvDtype::Fp8E5M2 => 5,
            KvDtype::I8 => 6,
        }
    }

    /// The name used in configuration and on the wire.
    pub fn name(self) -> &'static str {
        match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
            KvDtype::Bf16 => "bf16",
            KvDtype::Fp8E4M3 => "fp8_e4m3",
            KvDtype::Fp8E5M2 => "fp8_e5m2",
            KvDtype::I8 => "i8",
        }
    }
}

impl fmt::Display for KvDtype {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for KvDtype {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        KvDtype::ALL
            .into_iter()
            .find(|d| d.name().eq_ignore_ascii_case(s))
            .ok_or_else(|| {
                let known: Vec<&str> = KvDtype::ALL.iter().map(|d| d.name()).collect();
                Error::invalid(format!(
                    "unknown KV dtype `{s}`; expected one of {}",
                    known.join(", ")
                ))
            })
    }
}
