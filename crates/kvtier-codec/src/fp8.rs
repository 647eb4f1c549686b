//! The fp8 codec (lossy): fp8 e4m3 values with one f32 scale per group of elements.
//!
//! ```text
//! u8   source element: 1 f32, 2 f16, 3 bf16
//! u32  LE group: elements per scale (a KV page's head dimension: one scale per token and
//!      head)
//! G ×  f32 LE scale, G = ⌈elements / group⌉
//! E ×  u8 e4m3 code (OCP "fn" variant: no infinities, largest 448)
//!      the page's last (len % width) bytes, as they are
//! ```
//!
//! A group's scale is its largest magnitude over 448, so its largest element is coded
//! exactly at fp8's top and the rest keep 3 mantissa bits of relative precision (subnormals
//! below 2⁻⁶ of the top). Rounding is to nearest, ties to even, both ways. A page holding a
//! NaN or an infinity is not encoded (stored losslessly instead): fp8 cannot say what it
//! was.

use half::{bf16, f16};

use crate::{Cursor, DecodeError, Element, Shape};

/// The largest finite e4m3 value.
const MAX: f32 = 448.0;

/// Encodes `page` (elements of `shape.element`, groups of `shape.group`); `None` for a
/// non-float element type, an empty group, or a non-finite value.
pub fn encode(shape: Shape, page: &[u8]) -> Option<Vec<u8>> {
    let width = shape.element.width();
    let group = shape.group as usize;
    if matches!(shape.element, Element::Bytes { .. }) || group == 0 {
        return None;
    }
    let values = to_f32(shape.element, page);
    let groups = values.len().div_ceil(group);
    let mut out = Vec::with_capacity(5 + 4 * groups + values.len() + width);
    out.push(shape.element.code());
    out.extend_from_slice(&shape.group.to_le_bytes());
    let mut codes = Vec::with_capacity(values.len());
    for g in values.chunks(group) {
        let mut amax = 0f32;
        for v in g {
            if !v.is_finite() {
                return None;
            }
            amax = amax.max(v.abs());
        }
        let scale = amax / MAX;
        out.extend_from_slice(&scale.to_le_bytes());
        if scale == 0.0 || !scale.is_normal() {
            // All zeros (or too small for an f32 scale to describe): zeros.
            codes.extend(std::iter::repeat_n(0u8, g.len()));
            continue;
        }
        let inv = 1.0 / scale;
        codes.extend(g.iter().map(|v| to_e4m3(v * inv)));
    }
    out.extend_from_slice(&codes);
    out.extend_from_slice(&page[values.len() * width..]);
    Some(out)
}

/// Decodes a stream written by [`encode`] into `out` (exactly the page's length).
pub fn decode(stream: &[u8], out: &mut [u8]) -> Result<(), DecodeError> {
    let mut cur = Cursor { rest: stream };
    let element = Element::from_code(cur.u8()?).ok_or(DecodeError::Invalid("fp8 source"))?;
    let group = cur.u32()? as usize;
    if group == 0 {
        return Err(DecodeError::Invalid("fp8 group"));
    }
    let width = element.width();
    let elements = out.len() / width;
    let groups = elements.div_ceil(group);
    let scales = cur.take(4 * groups)?;
    let codes = cur.take(elements)?;
    let tail = cur.take(out.len() - elements * width)?;
    cur.finish()?;
    let table = decode_table();
    let (words, rest) = out.split_at_mut(elements * width);
    for ((scale, codes), words) in scales
        .chunks_exact(4)
        .zip(codes.chunks(group))
        .zip(words.chunks_mut(group * width))
    {
        let scale = f32::from_le_bytes([scale[0], scale[1], scale[2], scale[3]]);
        let values = codes.iter().map(|&c| table[usize::from(c)] * scale);
        match element {
            Element::F32 => {
                for (w, v) in words.chunks_exact_mut(4).zip(values) {
                    w.copy_from_slice(&v.to_le_bytes());
                }
            }
            Element::F16 => {
                for (w, v) in words.chunks_exact_mut(2).zip(values) {
                    w.copy_from_slice(&f16::from_f32(v).to_le_bytes());
                }
            }
            Element::Bf16 => {
                for (w, v) in words.chunks_exact_mut(2).zip(values) {
                    w.copy_from_slice(&bf16::from_f32(v).to_le_bytes());
                }
            }
            Element::Bytes { .. } => return Err(DecodeError::Invalid("fp8 source")),
        }
    }
    rest.copy_from_slice(tail);
    Ok(())
}

/// The page's whole elements as f32.
fn to_f32(element: Element, page: &[u8]) -> Vec<f32> {
    match element {
        Element::F32 => page
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Element::F16 => page
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Element::Bf16 => page
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        Element::Bytes { .. } => Vec::new(),
    }
}

/// `x` (finite, |x| ≤ 448 up to rounding) as the nearest e4m3 code, ties to even;
/// magnitudes past 448 saturate to it.
pub fn to_e4m3(x: f32) -> u8 {
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = x.abs();
    let code = if a >= 1.0 / 64.0 {
        // Normal: 3 mantissa bits kept of f32's 23, rounded to nearest even, carrying into
        // the exponent when the mantissa overflows.
        let u = a.to_bits();
        let r = u + 0x7_FFFF + ((u >> 20) & 1);
        let exp = (r >> 23) as i32 - 127 + 7;
        let mant = (r >> 20) & 7;
        if exp > 15 || (exp == 15 && mant == 7) {
            0x7E
        } else {
            ((exp as u32) << 3 | mant) as u8
        }
    } else {
        // Subnormal steps of 2⁻⁹; 8 steps is the smallest normal (code 0x08), which the
        // code's bit pattern says too.
        (a * 512.0).round_ties_even() as u8
    };
    sign | code
}

/// The value of every e4m3 code (NaN for 0x7F and 0xFF, which [`to_e4m3`] never makes).
fn decode_table() -> &'static [f32; 256] {
    static TABLE: std::sync::OnceLock<[f32; 256]> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut t = [0f32; 256];
        for (c, v) in t.iter_mut().enumerate() {
            *v = from_e4m3(c as u8);
        }
        t
    })
}

/// The value of e4m3 code `c`.
pub fn from_e4m3(c: u8) -> f32 {
    let sign = if c & 0x80 != 0 { -1.0 } else { 1.0 };
    let exp = i32::from((c >> 3) & 0xF);
    let mant = f32::from(c & 7);
    if exp == 15 && c & 7 == 7 {
        return f32::NAN;
    }
    let magnitude = if exp == 0 {
        mant / 8.0 * 2f32.powi(-6)
    } else {
        (1.0 + mant / 8.0) * 2f32.powi(exp - 7)
    };
    sign * magnitude
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_code_encodes_to_itself_and_midpoints_round_to_even() {
        for c in 0u8..=255 {
            if c & 0x7F == 0x7F {
                continue;
            }
            let v = from_e4m3(c);
            let back = to_e4m3(v);
            // +0 and -0 are both zeros.
            assert!(
                back == c || (v == 0.0 && back & 0x7F == 0),
                "code {c:#x} → {v} → {back:#x}"
            );
        }
        // Halfway between 1.0 (0x38) and 1.125 (0x39): to the even code.
        assert_eq!(to_e4m3(1.0625), 0x38);
        // Halfway between 1.125 and 1.25 (0x3A): to the even code.
        assert_eq!(to_e4m3(1.1875), 0x3A);
        assert_eq!(to_e4m3(448.0), 0x7E);
        assert_eq!(to_e4m3(1000.0), 0x7E);
        assert_eq!(to_e4m3(-448.0), 0xFE);
        assert_eq!(from_e4m3(0x7E), 448.0);
    }

    #[test]
    fn a_bf16_page_comes_back_within_fp8_precision_of_each_group() {
        let group = 64usize;
        let values: Vec<f32> = (0..group * 8)
            .map(|i| ((i as f32) * 0.37).sin() * (1 + i / group) as f32)
            .collect();
        let page: Vec<u8> = values
            .iter()
            .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
            .collect();
        let shape = Shape {
            element: Element::Bf16,
            group: group as u32,
        };
        let enc = encode(shape, &page).unwrap();
        assert!(enc.len() < page.len() * 6 / 10);
        let mut out = vec![0u8; page.len()];
        decode(&enc, &mut out).unwrap();
        for (g, chunk) in values.chunks(group).enumerate() {
            let amax = chunk.iter().fold(0f32, |m, v| m.max(v.abs()));
            for (i, v) in chunk.iter().enumerate() {
                let at = 2 * (g * group + i);
                let got = bf16::from_le_bytes([out[at], out[at + 1]]).to_f32();
                // 3 mantissa bits: half an ulp is 1/16 relative, plus the scale's own
                // rounding and bf16's.
                assert!((got - v).abs() <= amax / 14.0, "{v} came back as {got}");
            }
        }
    }

    #[test]
    fn a_page_with_a_nan_or_an_infinity_is_not_encoded() {
        let shape = Shape {
            element: Element::F32,
            group: 4,
        };
        for bad in [f32::NAN, f32::INFINITY] {
            let page: Vec<u8> = [1.0f32, bad, 2.0, 3.0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            assert!(encode(shape, &page).is_none());
        }
    }
}
