//! Host tensors: an [`ir::Type`] plus row-major element data of that dtype, and the one
//! value-conversion rule ([`convert_value`]) that both the `convert` op and
//! [`HostTensor::from_f64_values`] follow.
//!
//! Conversion rules (the `convert` op's semantics):
//! - to `f32`: round to nearest, ties to even (Rust `as f32`); overflow gives +-inf.
//! - to `bf16`: round to nearest, ties to even, correctly rounded from the f64 value
//!   ([`f64_to_bf16`]; `half`'s own `from_f64` drops the low 32 bits first and can misround).
//! - to `f64`: exact.
//! - to `i32`: truncate toward zero and saturate at `i32::MIN`/`i32::MAX`; NaN gives 0
//!   (Rust `as i32`). So `-inf -> i32::MIN`, `+inf -> i32::MAX`.
//! - to `bool`: `x != 0` (so NaN gives `true`); `bool` converts to 0 / 1.

use crate::alloc::{human_bytes, try_collect, try_zeroed_vec, AllocError};
use half::bf16;
use ir::{DType, Type};
use thiserror::Error;

/// Element data of a host tensor, one variant per [`DType`].
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    F32(Vec<f32>),
    F64(Vec<f64>),
    BF16(Vec<bf16>),
    I32(Vec<i32>),
    Bool(Vec<bool>),
}

/// A vector of `T` holding `bytes` (any alignment; the length is a multiple of `T`'s size).
fn pod_from_bytes<T: bytemuck::Pod + bytemuck::Zeroable>(bytes: &[u8]) -> Vec<T> {
    let mut v = vec![T::zeroed(); bytes.len() / std::mem::size_of::<T>()];
    bytemuck::cast_slice_mut::<T, u8>(&mut v).copy_from_slice(bytes);
    v
}

impl Data {
    /// The dtype of the elements.
    pub fn dtype(&self) -> DType {
        match self {
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
            Data::BF16(_) => DType::BF16,
            Data::I32(_) => DType::I32,
            Data::Bool(_) => DType::Bool,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Data::F32(v) => v.len(),
            Data::F64(v) => v.len(),
            Data::BF16(v) => v.len(),
            Data::I32(v) => v.len(),
            Data::Bool(v) => v.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A zero-filled buffer of `n` elements (`false` for bool).
    pub fn zeros(dtype: DType, n: usize) -> Data {
        match dtype {
            DType::F32 => Data::F32(vec![0.0; n]),
            DType::F64 => Data::F64(vec![0.0; n]),
            DType::BF16 => Data::BF16(vec![bf16::ZERO; n]),
            DType::I32 => Data::I32(vec![0; n]),
            DType::Bool => Data::Bool(vec![false; n]),
        }
    }

    /// [`Data::zeros`] (the same allocation), or the error when it cannot be allocated.
    pub fn try_zeros(dtype: DType, n: usize) -> Result<Data, AllocError> {
        Ok(match dtype {
            DType::F32 => Data::F32(try_zeroed_vec(n)?),
            DType::F64 => Data::F64(try_zeroed_vec(n)?),
            DType::BF16 => Data::BF16(try_zeroed_vec(n)?),
            DType::I32 => Data::I32(try_zeroed_vec(n)?),
            DType::Bool => Data::Bool(try_zeroed_vec(n)?),
        })
    }

    /// The elements as native-endian bytes (bool as 0/1 bytes): what a transport sends.
    pub fn to_bytes(&self) -> Vec<u8> {
        self.as_bytes().into_owned()
    }

    /// The elements' bytes without a copy where the layout allows (every dtype but bool).
    pub fn as_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        use std::borrow::Cow;
        match self {
            Data::F32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            Data::F64(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            Data::BF16(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            Data::I32(v) => Cow::Borrowed(bytemuck::cast_slice(v)),
            Data::Bool(v) => Cow::Owned(v.iter().map(|&b| b as u8).collect()),
        }
    }

    /// The elements as mutable bytes (to receive into), for every dtype but bool.
    pub fn as_bytes_mut(&mut self) -> Option<&mut [u8]> {
        match self {
            Data::F32(v) => Some(bytemuck::cast_slice_mut(v)),
            Data::F64(v) => Some(bytemuck::cast_slice_mut(v)),
            Data::BF16(v) => Some(bytemuck::cast_slice_mut(v)),
            Data::I32(v) => Some(bytemuck::cast_slice_mut(v)),
            Data::Bool(_) => None,
        }
    }

    /// Elements of `dtype` from bytes written by [`Data::to_bytes`] on a machine of the same
    /// endianness; `None` if the length is not a whole number of elements.
    pub fn from_bytes(dtype: DType, bytes: &[u8]) -> Option<Data> {
        let width = dtype.size_bytes();
        if !bytes.len().is_multiple_of(width) {
            return None;
        }
        Some(match dtype {
            DType::F32 => Data::F32(pod_from_bytes(bytes)),
            DType::F64 => Data::F64(pod_from_bytes(bytes)),
            DType::BF16 => Data::BF16(pod_from_bytes(bytes)),
            DType::I32 => Data::I32(pod_from_bytes(bytes)),
            DType::Bool => Data::Bool(bytes.iter().map(|&b| b != 0).collect()),
        })
    }

    /// Data of `dtype` holding `values`, each converted by [`convert_value`].
    pub fn from_f64_values(dtype: DType, values: &[f64]) -> Data {
        let it = values.iter().map(|&x| convert_value(x, dtype));
        match dtype {
            DType::F32 => Data::F32(it.map(|x| x as f32).collect()),
            DType::F64 => Data::F64(it.collect()),
            DType::BF16 => Data::BF16(values.iter().map(|&x| f64_to_bf16(x)).collect()),
            DType::I32 => Data::I32(it.map(|x| x as i32).collect()),
            DType::Bool => Data::Bool(it.map(|x| x != 0.0).collect()),
        }
    }

    /// Data of `dtype` holding `value(i)` for `i` in `0..n`, each converted as by
    /// [`Data::from_f64_values`] (the same bits), built in place: no `f64` copy of the
    /// values, and an error instead of an abort when the memory is not there.
    pub fn try_from_f64_fn(
        dtype: DType,
        n: usize,
        mut value: impl FnMut(usize) -> f64,
    ) -> Result<Data, AllocError> {
        let mut conv = |i: usize| convert_value(value(i), dtype);
        Ok(match dtype {
            DType::F32 => Data::F32(try_collect(n, (0..n).map(|i| conv(i) as f32))?),
            DType::F64 => Data::F64(try_collect(n, (0..n).map(conv))?),
            // Rounded once, from the value itself (as `from_f64_values`).
            DType::BF16 => Data::BF16(try_collect(n, (0..n).map(|i| f64_to_bf16(value(i))))?),
            DType::I32 => Data::I32(try_collect(n, (0..n).map(|i| conv(i) as i32))?),
            DType::Bool => Data::Bool(try_collect(n, (0..n).map(|i| conv(i) != 0.0))?),
        })
    }

    /// Every element as an `f64` (exact for every dtype; bool is 0 / 1).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.range_f64(0, self.len())
    }

    /// Elements `start .. start + len` as `f64` (as [`Data::to_f64_vec`]; panics past the
    /// end): one row of a large result without converting the rest.
    pub fn range_f64(&self, start: usize, len: usize) -> Vec<f64> {
        let r = start..start + len;
        match self {
            Data::F32(v) => v[r].iter().map(|&x| x as f64).collect(),
            Data::F64(v) => v[r].to_vec(),
            Data::BF16(v) => v[r].iter().map(|x| x.to_f64()).collect(),
            Data::I32(v) => v[r].iter().map(|&x| x as f64).collect(),
            Data::Bool(v) => v[r].iter().map(|&x| if x { 1.0 } else { 0.0 }).collect(),
        }
    }
}

/// A malformed [`HostTensor`] (data that does not match its type).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum TensorError {
    #[error("tensor type {ty} needs {} data, got {got} data; give data of the type's dtype", .ty.dtype)]
    DTypeMismatch { ty: Type, got: DType },
    #[error("tensor type {ty} has {expected} elements, got {got} values; give one value per element (row-major)")]
    LengthMismatch {
        ty: Type,
        expected: usize,
        got: usize,
    },
    #[error("cannot allocate {} for a {ty} tensor: out of memory; use smaller tensors", human_bytes(*.bytes))]
    OutOfMemory { ty: Type, bytes: usize },
}

impl TensorError {
    fn out_of_memory(ty: &Type) -> impl FnOnce(AllocError) -> TensorError + '_ {
        |e| TensorError::OutOfMemory {
            ty: ty.clone(),
            bytes: e.bytes,
        }
    }
}

/// A tensor in host memory: its type and row-major data.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub ty: Type,
    pub data: Data,
}

impl HostTensor {
    /// A tensor, checking that `data` has the type's dtype and element count.
    pub fn new(ty: Type, data: Data) -> Result<HostTensor, TensorError> {
        if data.dtype() != ty.dtype {
            return Err(TensorError::DTypeMismatch {
                got: data.dtype(),
                ty,
            });
        }
        if data.len() != ty.num_elements() {
            return Err(TensorError::LengthMismatch {
                expected: ty.num_elements(),
                got: data.len(),
                ty,
            });
        }
        Ok(HostTensor { ty, data })
    }

    fn build(dtype: DType, shape: Vec<usize>, data: Data) -> HostTensor {
        HostTensor::new(Type::new(dtype, shape), data).unwrap_or_else(|e| panic!("{e}"))
    }

    /// An f32 tensor. Panics if `values.len()` is not the shape's element count (test and
    /// model code; use [`HostTensor::new`] for data from outside).
    pub fn from_f32(shape: impl Into<Vec<usize>>, values: Vec<f32>) -> HostTensor {
        HostTensor::build(DType::F32, shape.into(), Data::F32(values))
    }

    /// An f64 tensor (panics on a length mismatch, like [`HostTensor::from_f32`]).
    pub fn from_f64(shape: impl Into<Vec<usize>>, values: Vec<f64>) -> HostTensor {
        HostTensor::build(DType::F64, shape.into(), Data::F64(values))
    }

    /// A bf16 tensor (panics on a length mismatch).
    pub fn from_bf16(shape: impl Into<Vec<usize>>, values: Vec<bf16>) -> HostTensor {
        HostTensor::build(DType::BF16, shape.into(), Data::BF16(values))
    }

    /// An i32 tensor (panics on a length mismatch).
    pub fn from_i32(shape: impl Into<Vec<usize>>, values: Vec<i32>) -> HostTensor {
        HostTensor::build(DType::I32, shape.into(), Data::I32(values))
    }

    /// A bool tensor (panics on a length mismatch).
    pub fn from_bool(shape: impl Into<Vec<usize>>, values: Vec<bool>) -> HostTensor {
        HostTensor::build(DType::Bool, shape.into(), Data::Bool(values))
    }

    pub fn scalar_f32(v: f32) -> HostTensor {
        HostTensor::from_f32(vec![], vec![v])
    }

    pub fn scalar_f64(v: f64) -> HostTensor {
        HostTensor::from_f64(vec![], vec![v])
    }

    pub fn scalar_i32(v: i32) -> HostTensor {
        HostTensor::from_i32(vec![], vec![v])
    }

    pub fn scalar_bool(v: bool) -> HostTensor {
        HostTensor::from_bool(vec![], vec![v])
    }

    /// All zeros (false for bool).
    pub fn zeros(ty: Type) -> HostTensor {
        let data = Data::zeros(ty.dtype, ty.num_elements());
        HostTensor { ty, data }
    }

    /// [`HostTensor::zeros`], or an error when the memory is not there.
    pub fn try_zeros(ty: Type) -> Result<HostTensor, TensorError> {
        let data = Data::try_zeros(ty.dtype, ty.num_elements())
            .map_err(TensorError::out_of_memory(&ty))?;
        Ok(HostTensor { ty, data })
    }

    /// A tensor of type `ty` whose element `i` is `value(i)` converted as by
    /// [`HostTensor::from_f64_values`] (the same bits), built without an `f64` copy of the
    /// values; an error when the memory is not there.
    pub fn try_from_f64_fn(
        ty: Type,
        value: impl FnMut(usize) -> f64,
    ) -> Result<HostTensor, TensorError> {
        let data = Data::try_from_f64_fn(ty.dtype, ty.num_elements(), value)
            .map_err(TensorError::out_of_memory(&ty))?;
        Ok(HostTensor { ty, data })
    }

    /// A tensor of type `ty` from `f64` values, each converted to the dtype by
    /// [`convert_value`] (round to nearest even for floats; truncate and saturate for i32;
    /// `!= 0` for bool). Panics on a length mismatch; see [`HostTensor::try_from_f64_values`].
    pub fn from_f64_values(ty: Type, values: &[f64]) -> HostTensor {
        HostTensor::try_from_f64_values(ty, values).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`HostTensor::from_f64_values`] that reports a length mismatch, or memory that is not
    /// there, instead of panicking or aborting.
    pub fn try_from_f64_values(ty: Type, values: &[f64]) -> Result<HostTensor, TensorError> {
        let data = Data::try_from_f64_fn(ty.dtype, values.len(), |i| values[i])
            .map_err(TensorError::out_of_memory(&ty))?;
        HostTensor::new(ty, data)
    }

    pub fn dtype(&self) -> DType {
        self.ty.dtype
    }

    pub fn shape(&self) -> &[usize] {
        &self.ty.shape
    }

    pub fn rank(&self) -> usize {
        self.ty.rank()
    }

    pub fn num_elements(&self) -> usize {
        self.data.len()
    }

    /// Bytes the elements occupy (`num_elements * dtype size`, bool = 1 byte).
    pub fn size_bytes(&self) -> usize {
        self.ty.size_bytes()
    }

    /// Every element as an `f64` (exact for every dtype; bool is 0 / 1).
    pub fn to_f64_vec(&self) -> Vec<f64> {
        self.data.to_f64_vec()
    }

    /// Every element rounded to `f32` (exact unless the dtype is f64).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.to_f64_vec().into_iter().map(|x| x as f32).collect()
    }

    /// The same values converted to `dtype` by [`convert_value`] (the `convert` op).
    pub fn convert(&self, dtype: DType) -> HostTensor {
        HostTensor::from_f64_values(self.ty.with_dtype(dtype), &self.to_f64_vec())
    }

    pub fn as_f32(&self) -> Option<&[f32]> {
        match &self.data {
            Data::F32(v) => Some(v),
            Data::F64(_) | Data::BF16(_) | Data::I32(_) | Data::Bool(_) => None,
        }
    }

    pub fn as_f64(&self) -> Option<&[f64]> {
        match &self.data {
            Data::F64(v) => Some(v),
            Data::F32(_) | Data::BF16(_) | Data::I32(_) | Data::Bool(_) => None,
        }
    }

    pub fn as_bf16(&self) -> Option<&[bf16]> {
        match &self.data {
            Data::BF16(v) => Some(v),
            Data::F32(_) | Data::F64(_) | Data::I32(_) | Data::Bool(_) => None,
        }
    }

    pub fn as_i32(&self) -> Option<&[i32]> {
        match &self.data {
            Data::I32(v) => Some(v),
            Data::F32(_) | Data::F64(_) | Data::BF16(_) | Data::Bool(_) => None,
        }
    }

    pub fn as_bool(&self) -> Option<&[bool]> {
        match &self.data {
            Data::Bool(v) => Some(v),
            Data::F32(_) | Data::F64(_) | Data::BF16(_) | Data::I32(_) => None,
        }
    }
}

/// `x` converted to `dtype` and back to `f64` (the module doc lists the rules). Every value
/// the reference interpreter produces passes through this, so each op's result is rounded to
/// its dtype exactly once.
pub fn convert_value(x: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F64 => x,
        DType::F32 => x as f32 as f64,
        DType::BF16 => f64_to_bf16(x).to_f64(),
        DType::I32 => x as i32 as f64,
        DType::Bool => {
            if x != 0.0 {
                1.0
            } else {
                0.0
            }
        }
    }
}

/// `x` rounded to the nearest bf16, ties to even (correctly rounded; NaN stays NaN).
///
/// Method: round to f32 with round-to-odd (exact if representable, else truncate toward zero
/// and set the last bit), then round that f32 to bf16 to nearest even. Round-to-odd at 24
/// bits followed by rounding to 8 bits is exact rounding because 24 >= 8 + 2.
pub fn f64_to_bf16(x: f64) -> bf16 {
    if x.is_nan() {
        return if x.is_sign_negative() {
            -bf16::NAN
        } else {
            bf16::NAN
        };
    }
    let f = x as f32;
    if f.is_infinite() || f as f64 == x {
        // Exact in f32, or beyond f32 range (and so beyond bf16 range too).
        return bf16::from_f32(f);
    }
    let mut bits = f.to_bits();
    if (f as f64).abs() > x.abs() {
        bits -= 1; // one ulp toward zero (sign-magnitude encoding)
    }
    bf16::from_f32(f32::from_bits(bits | 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Built in place, a tensor has the bits `from_f64_values` gives the same values (NaN,
    /// infinities, ties, out-of-range integers included), for every dtype.
    #[test]
    fn try_from_f64_fn_gives_the_bits_of_from_f64_values() {
        let mut values = vec![
            0.0,
            -0.0,
            1.0,
            -2.5,
            f64::NAN,
            -f64::NAN,
            f64::INFINITY,
            f64::NEG_INFINITY,
            1e300,
            -1e-300,
            3e9,
            -3e9,
            0.1,
            1.0 + f64::EPSILON,
            1.0 + 2f64.powi(-8),
            1.0 + 3.0 * 2f64.powi(-9),
            f32::MAX as f64 * 2.0,
        ];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..1000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            values.push(f64::from_bits(x));
        }
        for dt in [DType::F32, DType::F64, DType::BF16, DType::I32, DType::Bool] {
            let built = Data::try_from_f64_fn(dt, values.len(), |i| values[i]).unwrap();
            let want = Data::from_f64_values(dt, &values);
            assert_eq!(built.to_bytes(), want.to_bytes(), "{dt:?}");
        }
    }

    #[test]
    fn bf16_rounding_is_correct_near_ties() {
        // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even -> 1.
        assert_eq!(f64_to_bf16(1.0 + 2f64.powi(-8)), bf16::ONE);
        // Just above the tie (only in the low f64 bits) must round up.
        let above = 1.0 + 2f64.powi(-8) + 2f64.powi(-40);
        assert_eq!(f64_to_bf16(above).to_f64(), 1.0 + 2f64.powi(-7));
        // Just below rounds down.
        let below = 1.0 + 2f64.powi(-8) - 2f64.powi(-40);
        assert_eq!(f64_to_bf16(below), bf16::ONE);
        // 1 + 3 * 2^-8 is a tie between 1+2^-7 (odd) and 1+2^-6 (even): goes up.
        assert_eq!(
            f64_to_bf16(1.0 + 3.0 * 2f64.powi(-8)).to_f64(),
            1.0 + 2f64.powi(-6)
        );
        assert_eq!(f64_to_bf16(-2.5), bf16::from_f32(-2.5));
        assert!(f64_to_bf16(f64::NAN).is_nan());
        assert_eq!(f64_to_bf16(1e300), bf16::INFINITY);
        assert_eq!(f64_to_bf16(-1e300), bf16::NEG_INFINITY);
        assert_eq!(f64_to_bf16(1e-300).to_f64(), 0.0);
        assert_eq!(f64_to_bf16(0.0), bf16::ZERO);
    }

    #[test]
    fn bf16_rounding_matches_half_on_f32_values() {
        // For values exact in f32, half's f32 -> bf16 rounding is correct; we must agree.
        let mut s = 0x1234_5678u32;
        for _ in 0..20000 {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            let f = f32::from_bits(s);
            if f.is_nan() {
                continue;
            }
            assert_eq!(f64_to_bf16(f as f64), bf16::from_f32(f), "{f:e}");
        }
    }

    #[test]
    fn convert_rules() {
        assert_eq!(convert_value(2.7, DType::I32), 2.0);
        assert_eq!(convert_value(-2.7, DType::I32), -2.0);
        assert_eq!(convert_value(f64::NAN, DType::I32), 0.0);
        assert_eq!(convert_value(1e20, DType::I32), i32::MAX as f64);
        assert_eq!(
            convert_value(f64::NEG_INFINITY, DType::I32),
            i32::MIN as f64
        );
        assert_eq!(convert_value(-0.5, DType::Bool), 1.0);
        assert_eq!(convert_value(f64::NAN, DType::Bool), 1.0);
        assert_eq!(convert_value(0.0, DType::Bool), 0.0);
        assert_eq!(convert_value(0.1, DType::F32), 0.1f32 as f64);
    }

    #[test]
    fn constructors_and_accessors() {
        let t = HostTensor::from_f32(vec![2, 2], vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(t.size_bytes(), 16);
        assert_eq!(t.as_f32(), Some(&[1.0, 2.0, 3.0, 4.0][..]));
        assert_eq!(t.as_i32(), None);
        assert_eq!(t.to_f64_vec(), vec![1.0, 2.0, 3.0, 4.0]);
        let z = HostTensor::zeros(Type::new(DType::Bool, vec![3]));
        assert_eq!(z.as_bool(), Some(&[false; 3][..]));
        assert_eq!(z.size_bytes(), 3);
        let b = HostTensor::from_f64_values(Type::new(DType::BF16, vec![2]), &[1.0, 1.00390625]);
        assert_eq!(b.as_bf16().unwrap()[1], bf16::ONE);
        let i = HostTensor::from_f64_values(Type::new(DType::I32, vec![2]), &[3.9, -3.9]);
        assert_eq!(i.as_i32(), Some(&[3, -3][..]));
        assert_eq!(i.convert(DType::F32).as_f32(), Some(&[3.0, -3.0][..]));
        assert!(matches!(
            HostTensor::new(Type::new(DType::F32, vec![3]), Data::F32(vec![1.0])),
            Err(TensorError::LengthMismatch { .. })
        ));
        assert!(matches!(
            HostTensor::new(Type::new(DType::F32, vec![1]), Data::I32(vec![1])),
            Err(TensorError::DTypeMismatch { .. })
        ));
        let e = HostTensor::try_from_f64_values(Type::new(DType::F32, vec![2]), &[1.0])
            .unwrap_err()
            .to_string();
        assert!(e.contains("f32[2]") && e.contains("2 elements"), "{e}");
    }
}

/// One dim of a block inside a larger tensor: `len` elements of data starting at `offset`
/// of the large tensor, stored in a buffer of `padded` elements (the rest is zero padding).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlockDim {
    pub offset: usize,
    pub len: usize,
    pub padded: usize,
}

/// Visit the data of a block as contiguous runs: `f(index in the block buffer, index in
/// the large tensor, run length)`, one call per row of the last dim (the padding, past
/// `len` in any dim, is never visited). A row's elements are consecutive in both buffers.
fn for_each_block_run(
    global: &[usize],
    block: &[BlockDim],
    mut f: impl FnMut(usize, usize, usize),
) {
    let Some((last, outer)) = block.split_last() else {
        // A scalar: its one element.
        f(0, 0, 1);
        return;
    };
    if block.iter().any(|b| b.len == 0) {
        return;
    }
    let local: Vec<usize> = block.iter().map(|b| b.padded).collect();
    let ls = ir::strides(&local);
    let gs = ir::strides(global);
    // Odometer over the outer dims' data coordinates (`< len`), last dim as one run.
    let mut c = vec![0usize; outer.len()];
    loop {
        let mut li = 0;
        let mut gi = last.offset;
        for (d, &cd) in c.iter().enumerate() {
            li += cd * ls[d];
            gi += (block[d].offset + cd) * gs[d];
        }
        f(li, gi, last.len);
        let mut d = outer.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            c[d] += 1;
            if c[d] < outer[d].len {
                break;
            }
            c[d] = 0;
        }
    }
}

impl HostTensor {
    /// Copy out a block (one device's shard), zero-filling its padding.
    pub fn block(&self, block: &[BlockDim]) -> HostTensor {
        let local: Vec<usize> = block.iter().map(|b| b.padded).collect();
        let n: usize = local.iter().product();
        // Element copies in the tensor's own dtype (padding is the dtype's zero).
        fn pick<T: Copy + Default>(
            src: &[T],
            shape: &[usize],
            block: &[BlockDim],
            n: usize,
        ) -> Vec<T> {
            let mut out = vec![T::default(); n];
            for_each_block_run(shape, block, |li, gi, len| {
                out[li..li + len].copy_from_slice(&src[gi..gi + len]);
            });
            out
        }
        let shape = self.shape();
        let data = match &self.data {
            Data::F32(v) => Data::F32(pick(v, shape, block, n)),
            Data::F64(v) => Data::F64(pick(v, shape, block, n)),
            Data::BF16(v) => Data::BF16(pick(v, shape, block, n)),
            Data::I32(v) => Data::I32(pick(v, shape, block, n)),
            Data::Bool(v) => Data::Bool(pick(v, shape, block, n)),
        };
        HostTensor {
            ty: self.ty.with_shape(local),
            data,
        }
    }

    /// Write a block's data (not its padding) into this tensor.
    pub fn set_block(&mut self, block: &[BlockDim], part: &HostTensor) {
        fn put<T: Copy>(dst: &mut [T], src: &[T], shape: &[usize], block: &[BlockDim]) {
            for_each_block_run(shape, block, |li, gi, len| {
                dst[gi..gi + len].copy_from_slice(&src[li..li + len]);
            });
        }
        let shape = self.ty.shape.clone();
        match (&mut self.data, &part.data) {
            (Data::F32(d), Data::F32(s)) => put(d, s, &shape, block),
            (Data::F64(d), Data::F64(s)) => put(d, s, &shape, block),
            (Data::BF16(d), Data::BF16(s)) => put(d, s, &shape, block),
            (Data::I32(d), Data::I32(s)) => put(d, s, &shape, block),
            (Data::Bool(d), Data::Bool(s)) => put(d, s, &shape, block),
            // Different dtypes: through f64, as values convert.
            _ => {
                let mut dst = self.to_f64_vec();
                let src = part.to_f64_vec();
                put(&mut dst, &src, &shape, block);
                *self = HostTensor::from_f64_values(self.ty.clone(), &dst);
            }
        }
    }
}

#[cfg(test)]
mod block_tests {
    use super::*;

    /// Element by element: the block buffer index of every data element and its index in
    /// the large tensor (the rule `block` and `set_block` implement by rows).
    fn naive_pairs(global: &[usize], block: &[BlockDim]) -> Vec<(usize, usize)> {
        let local: Vec<usize> = block.iter().map(|b| b.padded).collect();
        let (ls, gs) = (ir::strides(&local), ir::strides(global));
        let n: usize = local.iter().product();
        (0..n)
            .filter_map(|li| {
                let mut gi = 0;
                for d in 0..local.len() {
                    let c = li / ls[d] % local[d];
                    if c >= block[d].len {
                        return None;
                    }
                    gi += (block[d].offset + c) * gs[d];
                }
                Some((li, gi))
            })
            .collect()
    }

    #[test]
    fn blocks_copy_their_data_rows_and_zero_their_padding() {
        let bd = |offset, len, padded| BlockDim {
            offset,
            len,
            padded,
        };
        let cases: Vec<(Vec<usize>, Vec<BlockDim>)> = vec![
            (vec![], vec![]),
            (vec![7], vec![bd(4, 3, 4)]),
            (vec![6, 5], vec![bd(3, 3, 3), bd(0, 5, 5)]),
            (vec![5, 7], vec![bd(3, 2, 3), bd(4, 3, 4)]),
            (vec![4, 3, 8], vec![bd(2, 2, 2), bd(0, 3, 3), bd(4, 4, 4)]),
            (vec![3, 4, 5], vec![bd(2, 1, 2), bd(3, 1, 2), bd(0, 5, 5)]),
            (vec![3, 4], vec![bd(3, 0, 2), bd(0, 4, 4)]),
        ];
        for (global, block) in cases {
            let n: usize = global.iter().product();
            let t = HostTensor::from_f64_values(
                Type::new(DType::F32, global.clone()),
                &(0..n).map(|i| i as f64 + 1.0).collect::<Vec<_>>(),
            );
            let b = t.block(&block);
            let got = b.to_f64_vec();
            let mut want = vec![0.0; got.len()];
            let pairs = naive_pairs(&global, &block);
            for &(li, gi) in &pairs {
                want[li] = (gi + 1) as f64;
            }
            assert_eq!(got, want, "block {global:?} {block:?}");
            // Back into a zero tensor of the same dtype and of another one (through f64).
            for dtype in [DType::F32, DType::F64] {
                let mut g = HostTensor::zeros(Type::new(dtype, global.clone()));
                g.set_block(&block, &b);
                let mut want = vec![0.0; n];
                for &(_, gi) in &pairs {
                    want[gi] = (gi + 1) as f64;
                }
                assert_eq!(
                    g.to_f64_vec(),
                    want,
                    "set_block {global:?} {block:?} {dtype:?}"
                );
            }
        }
    }
}
