//! Joining CRC32C checksums computed over neighbouring pieces of a buffer.
//!
//! The checked copy ([`super::copy_checked`]) runs three checksums side by side, one per
//! third of the buffer, because one CRC instruction waits three cycles for the previous
//! one: a single chain would run at a third of the speed the memory allows. The three
//! results are then joined here.
//!
//! A CRC register is linear over GF(2): the register after reading `A` then `B` equals the
//! register after `A` advanced over `|B|` zero bytes, xor the register after reading `B`
//! from zero. Advancing over `n` zero bytes multiplies by `x^(8n)` modulo the polynomial,
//! which costs a few hundred shifts, against the hundred microseconds a 2 MiB block takes
//! to copy. Registers are raw here (no initial or final inversion): the caller applies
//! those to the whole buffer.

/// The CRC32C polynomial, bit-reflected (bit 31 is `x^0`).
const POLY: u32 = 0x82f6_3b78;

/// `x^0` in the reflected representation.
const ONE: u32 = 1 << 31;

/// `a * b mod POLY`, both reflected.
fn multiply(a: u32, mut b: u32) -> u32 {
    let mut product = 0;
    let mut bit = ONE;
    while bit != 0 {
        if a & bit != 0 {
            product ^= b;
        }
        // b *= x
        b = if b & 1 != 0 { (b >> 1) ^ POLY } else { b >> 1 };
        bit >>= 1;
    }
    product
}

/// `x^(8 * bytes) mod POLY`, reflected: the factor that advances a register over `bytes`
/// zero bytes.
pub(super) fn zeros(bytes: usize) -> u32 {
    let mut result = ONE;
    let mut power = ONE >> 8; // x^8: one zero byte
    let mut n = bytes;
    while n != 0 {
        if n & 1 != 0 {
            result = multiply(result, power);
        }
        power = multiply(power, power);
        n >>= 1;
    }
    result
}

/// The raw register after reading `A` then `B`, from the register after `A` (`first`), the
/// register after reading `B` from zero (`second`) and `B`'s length.
pub(super) fn join(first: u32, second: u32, second_len: usize) -> u32 {
    multiply(zeros(second_len), first) ^ second
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Raw register update, one bit at a time: the definition, not the fast path.
    fn raw(mut reg: u32, bytes: &[u8]) -> u32 {
        for &b in bytes {
            reg ^= u32::from(b);
            for _ in 0..8 {
                reg = if reg & 1 != 0 {
                    (reg >> 1) ^ POLY
                } else {
                    reg >> 1
                };
            }
        }
        reg
    }

    #[test]
    fn joining_two_pieces_gives_the_checksum_of_the_whole() {
        let bytes: Vec<u8> = (0..5000u32).map(|i| (i * 31 + 7) as u8).collect();
        for split in [0, 1, 7, 64, 2500, 4999, 5000] {
            let (a, b) = bytes.split_at(split);
            let whole = raw(!0, &bytes);
            assert_eq!(join(raw(!0, a), raw(0, b), b.len()), whole, "split {split}");
        }
        // The raw register of the whole, inverted, is the standard CRC32C.
        assert_eq!(!raw(!0, b"123456789"), 0xe306_9283);
    }

    #[test]
    fn advancing_over_zeros_is_reading_zeros() {
        for n in [0usize, 1, 2, 3, 100, 4096] {
            let reg = 0x1234_5678;
            assert_eq!(multiply(zeros(n), reg), raw(reg, &vec![0; n]), "{n} zeros");
        }
    }
}
