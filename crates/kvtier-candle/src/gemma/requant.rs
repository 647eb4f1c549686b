//! Exact re-encoding of Q5_0 weights as Q8_0.
//!
//! Most matrices of the 270M GGUF are Q5_0 (their 640-wide rows do not fit the 256-wide
//! k-quant blocks), and candle's CPU kernel for Q5_0 is the scalar fallback: it took 80%
//! of prefill time here. Every Q5_0 value is `d · (q − 16)` with `q` in `0..32`, which a
//! Q8_0 block with the same `d` holds exactly as the `i8` `q − 16`. Both types multiply
//! against activations quantised to Q8_0 with the same integer dot product per block, so
//! the model computes the same thing through a vectorised kernel.

use std::borrow::Cow;

use candle_core::Device;
use candle_core::quantized::{GgmlDType, QStorage, QTensor};

use crate::{Error, Result};

/// Appended to the weights digest: KV computed through these kernels is its own kind.
pub(crate) const RECIPE: &str = "+q5_0-as-q8_0";

const Q5_0_BLOCK_BYTES: usize = 22;
const Q8_0_BLOCK_BYTES: usize = 34;
const BLOCK: usize = 32;

/// `tensor` as Q8_0 if it is Q5_0, else unchanged.
pub(crate) fn widen_q5_0(tensor: QTensor) -> Result<QTensor> {
    if tensor.dtype() != GgmlDType::Q5_0 {
        return Ok(tensor);
    }
    let data = tensor.data()?;
    if !data.len().is_multiple_of(Q5_0_BLOCK_BYTES) {
        return Err(Error::Weights(format!(
            "a Q5_0 tensor of {} bytes is not whole blocks",
            data.len()
        )));
    }
    let mut out = Vec::with_capacity(data.len() / Q5_0_BLOCK_BYTES * Q8_0_BLOCK_BYTES);
    for block in data.chunks_exact(Q5_0_BLOCK_BYTES) {
        let (scale, rest) = block.split_at(2);
        let (qh, qs) = rest.split_at(4);
        let high = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
        out.extend_from_slice(scale);
        let mut values = [0u8; BLOCK];
        for (j, &byte) in qs.iter().enumerate() {
            let lo = (byte & 0x0f) | ((((high >> j) << 4) & 0x10) as u8);
            let hi = (byte >> 4) | (((high >> (j + 12)) & 0x10) as u8);
            values[j] = (i16::from(lo) - 16) as i8 as u8;
            values[j + BLOCK / 2] = (i16::from(hi) - 16) as i8 as u8;
        }
        out.extend_from_slice(&values);
    }
    let shape = tensor.shape().clone();
    let storage = QStorage::from_data(Cow::Owned(out), &Device::Cpu, GgmlDType::Q8_0)?;
    Ok(QTensor::new(storage, shape)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Tensor;

    #[test]
    fn widening_keeps_every_value() {
        let values: Vec<f32> = (0..4 * 64)
            .map(|i| ((i * 37 % 101) as f32 - 50.0) / 7.0)
            .collect();
        let t = Tensor::from_vec(values, (4, 64), &Device::Cpu).unwrap();
        let q5 = QTensor::quantize(&t, GgmlDType::Q5_0).unwrap();
        let q8 = widen_q5_0(QTensor::quantize(&t, GgmlDType::Q5_0).unwrap()).unwrap();
        assert_eq!(q8.dtype(), GgmlDType::Q8_0);
        let values = |q: &QTensor| {
            let t = q.dequantize(&Device::Cpu).unwrap();
            t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        };
        let (a, b) = (values(&q5), values(&q8));
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(x.to_bits(), y.to_bits(), "{x} vs {y}");
        }
    }
}
