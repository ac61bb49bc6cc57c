//! safetensors bytes <-> named [`HostTensor`]s, through the `safetensors` crate. Bytes only:
//! the `cli` crate reads and writes files.
//!
//! Reading maps `F32`, `F64`, `BF16`, `I32` and `BOOL` directly. Other dtypes are converted
//! when that is lossless: `I8`, `U8`, `I16`, `U16` -> i32 always; `I64`, `U32`, `U64` -> i32
//! when every value fits (else [`IoError::OutOfRange`] names the first value that does not);
//! `F16` -> f32 always. The rest (fp8, fp4/fp6, complex) are [`IoError::UnsupportedDType`].
//! A corrupt or truncated buffer is an error naming what is wrong, never a panic; so is a
//! tensor or buffer the machine cannot hold ([`IoError::OutOfMemory`]). Tensors come
//! back in file (data-offset) order. safetensors data is not aligned, so elements are decoded
//! one by one with `from_le_bytes`. Written headers list every object's keys in sorted
//! order, so the same tensors and metadata always give the same bytes.

use crate::alloc::{check_room, human_bytes, try_collect, AllocError};
use crate::tensor::{Data, HostTensor};
use half::{bf16, f16};
use ir::Type;
use safetensors::tensor::{Dtype, SafeTensorError, TensorInfo, View};
use std::borrow::Cow;
use std::collections::HashMap;
use thiserror::Error;

impl From<SafeTensorError> for IoError {
    fn from(e: SafeTensorError) -> IoError {
        IoError::Format(e)
    }
}

/// A safetensors buffer that cannot be read or tensors that cannot be written.
#[derive(Debug, Error)]
pub enum IoError {
    /// The cause is in the message, not chained as a source, so a printed chain says it once.
    #[error("not a valid safetensors buffer: {0}")]
    Format(SafeTensorError),
    #[error("safetensors tensor `{name}` has dtype {dtype}, which has no lossless equivalent among f32, f64, bf16, i32, bool; convert it before saving")]
    UnsupportedDType { name: String, dtype: String },
    #[error("safetensors tensor `{name}` ({dtype}) holds {value} at element {index}, which does not fit in i32; only in-range integer tensors can be loaded")]
    OutOfRange {
        name: String,
        dtype: String,
        index: usize,
        value: String,
    },
    #[error("safetensors tensor `{name}` (BOOL) holds byte {byte} at element {index}; bool bytes must be 0 or 1")]
    BadBool {
        name: String,
        index: usize,
        byte: u8,
    },
    #[error("safetensors tensor `{name}`: its {dtype} data is {got} bytes but shape {shape:?} needs {expected}")]
    BadLength {
        name: String,
        dtype: String,
        shape: Vec<usize>,
        expected: usize,
        got: usize,
    },
    #[error("tensor name `{0}` is given twice; every tensor needs a distinct name")]
    DuplicateName(String),
    #[error("cannot allocate {} for {what}: out of memory; use smaller tensors", human_bytes(*.bytes))]
    OutOfMemory {
        /// What needed it: "tensor `w`", "the safetensors buffer".
        what: String,
        bytes: usize,
    },
}

/// [`IoError::OutOfMemory`] for tensor `name`.
fn out_of_memory(name: &str) -> impl FnOnce(AllocError) -> IoError + '_ {
    move |e| IoError::OutOfMemory {
        what: format!("tensor `{name}`"),
        bytes: e.bytes,
    }
}

/// The tensors of a safetensors buffer (in file order) and its `__metadata__`, if any.
#[allow(clippy::type_complexity)]
pub fn read_safetensors(
    bytes: &[u8],
) -> Result<(Vec<(String, HostTensor)>, Option<HashMap<String, String>>), IoError> {
    let (header_len, meta) = safetensors::SafeTensors::read_metadata(bytes)?;
    // read_metadata checked that the data section ends exactly at the buffer's end.
    let data = bytes.get(8 + header_len..).unwrap_or(&[]);
    let mut out = Vec::new();
    for name in meta.offset_keys() {
        let Some(info) = meta.info(&name) else {
            continue;
        };
        let (s, e) = info.data_offsets;
        let raw = data
            .get(s..e)
            .ok_or_else(|| IoError::Format(SafeTensorError::InvalidOffset(name.clone())))?;
        let tensor = decode(&name, info, raw)?;
        out.push((name, tensor));
    }
    Ok((out, meta.metadata().clone()))
}

/// Serialise `tensors` (names must be distinct) with optional metadata to safetensors bytes.
pub fn write_safetensors(
    tensors: &[(String, &HostTensor)],
    metadata: Option<HashMap<String, String>>,
) -> Result<Vec<u8>, IoError> {
    let mut seen: Vec<&str> = Vec::new();
    for (name, _) in tensors {
        if seen.contains(&name.as_str()) {
            return Err(IoError::DuplicateName(name.clone()));
        }
        seen.push(name);
    }
    let views = tensors
        .iter()
        .map(|(n, t)| Ok((n.as_str(), TensorBytes::new(n, t)?)))
        .collect::<Result<Vec<_>, IoError>>()?;
    // `serialize` builds the buffer with allocations that cannot fail: check the room first
    // (the header is small next to the data).
    let data: usize = views.iter().map(|(_, v)| v.bytes.len()).sum();
    let total = data.saturating_add(1 << 20);
    check_room(total).map_err(|e| IoError::OutOfMemory {
        what: "the safetensors buffer".into(),
        bytes: e.bytes,
    })?;
    let mut bytes = safetensors::serialize(views, metadata)?;
    canonical_header(&mut bytes);
    Ok(bytes)
}

/// Rewrite the JSON header of safetensors `bytes` with every object's keys in sorted order
/// (the same length: only the order changes), so that the same tensors and metadata give
/// the same bytes in every run. `safetensors` writes the metadata from a `HashMap`, whose
/// order changes from one process (and one map) to the next: two checkpoints of the same
/// state would differ in their header.
fn canonical_header(bytes: &mut [u8]) {
    let Some(len) = bytes
        .get(..8)
        .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")) as usize)
    else {
        return;
    };
    let Some(header) = bytes.get_mut(8..8 + len) else {
        return;
    };
    let Ok(value) = serde_json::from_slice::<serde_json::Value>(header) else {
        return;
    };
    // `serde_json`'s maps are ordered by key (a `BTreeMap`: the workspace does not enable its
    // `preserve_order` feature; the io test checks the order), so printing the parsed value
    // sorts every object's keys.
    let out = value.to_string();
    // The same compact JSON in another order has the same length; the padding (spaces up to
    // the data's alignment) stays where it was. Anything else is left as written.
    let used = header.iter().rposition(|&b| b != b' ').map_or(0, |p| p + 1);
    if out.len() == used {
        header[..used].copy_from_slice(out.as_bytes());
    }
}

/// The `n` bytes of `it` for tensor `name`, reserved once.
fn le_bytes(name: &str, n: usize, it: impl Iterator<Item = u8>) -> Result<Vec<u8>, IoError> {
    try_collect(n, it).map_err(out_of_memory(name))
}

/// A host tensor as little-endian bytes, for `safetensors::serialize`.
struct TensorBytes<'a> {
    dtype: Dtype,
    shape: &'a [usize],
    bytes: Vec<u8>,
}

impl<'a> TensorBytes<'a> {
    fn new(name: &str, t: &'a HostTensor) -> Result<TensorBytes<'a>, IoError> {
        let n = t.data.len() * t.data.dtype().size_bytes();
        let (dtype, bytes): (Dtype, Vec<u8>) = match &t.data {
            Data::F32(v) => (
                Dtype::F32,
                le_bytes(name, n, v.iter().flat_map(|x| x.to_le_bytes()))?,
            ),
            Data::F64(v) => (
                Dtype::F64,
                le_bytes(name, n, v.iter().flat_map(|x| x.to_le_bytes()))?,
            ),
            Data::BF16(v) => (
                Dtype::BF16,
                le_bytes(name, n, v.iter().flat_map(|x| x.to_le_bytes()))?,
            ),
            Data::I32(v) => (
                Dtype::I32,
                le_bytes(name, n, v.iter().flat_map(|x| x.to_le_bytes()))?,
            ),
            Data::Bool(v) => (Dtype::BOOL, le_bytes(name, n, v.iter().map(|&x| x as u8))?),
        };
        Ok(TensorBytes {
            dtype,
            shape: t.shape(),
            bytes,
        })
    }
}

impl View for TensorBytes<'_> {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

/// Little-endian elements of `N` bytes each (the caller checked the length).
fn elems<const N: usize>(raw: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
    raw.chunks_exact(N).map(|c| {
        let mut a = [0u8; N];
        a.copy_from_slice(c);
        a
    })
}

/// Integers of any width to i32, failing on the first value that does not fit.
fn to_i32<T: Copy + std::fmt::Display + TryInto<i32>>(
    name: &str,
    dtype: Dtype,
    n: usize,
    vals: impl Iterator<Item = T>,
) -> Result<Data, IoError> {
    let mut out = try_collect(n, std::iter::empty()).map_err(out_of_memory(name))?;
    for (index, v) in vals.enumerate() {
        let x: i32 = v.try_into().map_err(|_| IoError::OutOfRange {
            name: name.to_string(),
            dtype: format!("{dtype:?}"),
            index,
            value: v.to_string(),
        })?;
        out.push(x);
    }
    Ok(Data::I32(out))
}

fn decode(name: &str, info: &TensorInfo, raw: &[u8]) -> Result<HostTensor, IoError> {
    let dtype = info.dtype;
    let n: usize = info.shape.iter().product();
    let width = dtype.bitsize() / 8;
    if !dtype.bitsize().is_multiple_of(8) || n.checked_mul(width) != Some(raw.len()) {
        if !matches!(dtype.bitsize(), 8 | 16 | 32 | 64) {
            return Err(unsupported(name, dtype));
        }
        return Err(IoError::BadLength {
            name: name.to_string(),
            dtype: format!("{dtype:?}"),
            shape: info.shape.clone(),
            expected: n.saturating_mul(width),
            got: raw.len(),
        });
    }
    // Every buffer below holds `n` elements, reserved once (failing as an error).
    let oom = out_of_memory(name);
    let data = match dtype {
        Dtype::F32 => {
            Data::F32(try_collect(n, elems::<4>(raw).map(f32::from_le_bytes)).map_err(oom)?)
        }
        Dtype::F64 => {
            Data::F64(try_collect(n, elems::<8>(raw).map(f64::from_le_bytes)).map_err(oom)?)
        }
        Dtype::BF16 => {
            Data::BF16(try_collect(n, elems::<2>(raw).map(bf16::from_le_bytes)).map_err(oom)?)
        }
        Dtype::F16 => Data::F32(
            try_collect(n, elems::<2>(raw).map(|b| f16::from_le_bytes(b).to_f32())).map_err(oom)?,
        ),
        Dtype::I32 => {
            Data::I32(try_collect(n, elems::<4>(raw).map(i32::from_le_bytes)).map_err(oom)?)
        }
        Dtype::BOOL => {
            let mut out = try_collect(n, std::iter::empty()).map_err(oom)?;
            for (index, &byte) in raw.iter().enumerate() {
                if byte > 1 {
                    return Err(IoError::BadBool {
                        name: name.to_string(),
                        index,
                        byte,
                    });
                }
                out.push(byte == 1);
            }
            Data::Bool(out)
        }
        Dtype::I8 => Data::I32(try_collect(n, raw.iter().map(|&b| b as i8 as i32)).map_err(oom)?),
        Dtype::U8 => Data::I32(try_collect(n, raw.iter().map(|&b| b as i32)).map_err(oom)?),
        Dtype::I16 => Data::I32(
            try_collect(n, elems::<2>(raw).map(|b| i16::from_le_bytes(b) as i32)).map_err(oom)?,
        ),
        Dtype::U16 => Data::I32(
            try_collect(n, elems::<2>(raw).map(|b| u16::from_le_bytes(b) as i32)).map_err(oom)?,
        ),
        Dtype::U32 => to_i32(name, dtype, n, elems::<4>(raw).map(u32::from_le_bytes))?,
        Dtype::I64 => to_i32(name, dtype, n, elems::<8>(raw).map(i64::from_le_bytes))?,
        Dtype::U64 => to_i32(name, dtype, n, elems::<8>(raw).map(u64::from_le_bytes))?,
        // `Dtype` is non-exhaustive: fp8/fp6/fp4, complex and any future dtype.
        _ => return Err(unsupported(name, dtype)),
    };
    let dt = data.dtype();
    HostTensor::new(Type::new(dt, info.shape.clone()), data).map_err(|_| IoError::BadLength {
        name: name.to_string(),
        dtype: format!("{dtype:?}"),
        shape: info.shape.clone(),
        expected: n.saturating_mul(width),
        got: raw.len(),
    })
}

fn unsupported(name: &str, dtype: Dtype) -> IoError {
    IoError::UnsupportedDType {
        name: name.to_string(),
        dtype: format!("{dtype:?}"),
    }
}
