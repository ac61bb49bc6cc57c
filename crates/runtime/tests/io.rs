//! safetensors round trips for every dtype, lossless conversion of foreign dtypes, and
//! corrupt / truncated buffers (errors, never panics).

use half::{bf16, f16};
use proptest::prelude::*;
use runtime::io::{read_safetensors, write_safetensors, IoError};
use runtime::HostTensor;
use safetensors::tensor::{Dtype, TensorView};
use std::collections::HashMap;

fn sample_tensors() -> Vec<(String, HostTensor)> {
    vec![
        (
            "w".to_string(),
            HostTensor::from_f32(
                vec![2, 3],
                vec![1.5, -0.0, f32::INFINITY, 1e-40, 3.25, -7.0],
            ),
        ),
        (
            "d".to_string(),
            HostTensor::from_f64(vec![3], vec![0.1, -1e300, f64::MIN_POSITIVE]),
        ),
        (
            "h".to_string(),
            HostTensor::from_bf16(
                vec![2, 2],
                vec![
                    bf16::ONE,
                    bf16::from_f32(-2.5),
                    bf16::MAX,
                    bf16::MIN_POSITIVE,
                ],
            ),
        ),
        (
            "i".to_string(),
            HostTensor::from_i32(vec![4], vec![0, -1, i32::MAX, i32::MIN]),
        ),
        (
            "m".to_string(),
            HostTensor::from_bool(vec![3], vec![true, false, true]),
        ),
        ("s".to_string(), HostTensor::scalar_f32(42.0)),
        ("e".to_string(), HostTensor::from_i32(vec![0, 5], vec![])),
    ]
}

fn write(ts: &[(String, HostTensor)], meta: Option<HashMap<String, String>>) -> Vec<u8> {
    let refs: Vec<(String, &HostTensor)> = ts.iter().map(|(n, t)| (n.clone(), t)).collect();
    write_safetensors(&refs, meta).unwrap()
}

#[test]
fn round_trip_all_dtypes_with_metadata() {
    let ts = sample_tensors();
    let meta: HashMap<String, String> = [("step".to_string(), "12".to_string())].into();
    let bytes = write(&ts, Some(meta.clone()));
    let (back, m) = read_safetensors(&bytes).unwrap();
    assert_eq!(m, Some(meta));
    assert_eq!(back.len(), ts.len());
    for (name, t) in &ts {
        let (_, got) = back.iter().find(|(n, _)| n == name).unwrap();
        assert_eq!(got, t, "{name}");
    }
}

#[test]
fn the_same_tensors_and_metadata_give_the_same_bytes() {
    // Each map iterates in its own order (`RandomState` per map); the header does not.
    let ts = sample_tensors();
    let meta = || -> HashMap<String, String> {
        (0..12)
            .map(|i| (format!("key{i}"), format!("value \"{i}\" ü")))
            .collect()
    };
    let first = write(&ts, Some(meta()));
    for _ in 0..20 {
        assert!(
            write(&ts, Some(meta())) == first,
            "the header's bytes changed"
        );
    }
    // Still a valid file with the same contents, and the metadata keys in sorted order.
    let (back, m) = read_safetensors(&first).unwrap();
    assert_eq!(back.len(), ts.len());
    assert_eq!(m, Some(meta()));
    let len = u64::from_le_bytes(first[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&first[8..8 + len]).unwrap();
    let at = |k: &str| header.find(&format!("\"{k}\"")).unwrap();
    assert!(at("key0") < at("key1") && at("key1") < at("key10") && at("key10") < at("key2"));
}

#[test]
fn round_trip_without_metadata_and_nan_bits() {
    let t = HostTensor::from_f32(vec![2], vec![f32::NAN, -f32::NAN]);
    let bytes = write(&[("n".to_string(), t.clone())], None);
    let (back, m) = read_safetensors(&bytes).unwrap();
    assert_eq!(m, None);
    let bits: Vec<u32> = back[0]
        .1
        .as_f32()
        .unwrap()
        .iter()
        .map(|x| x.to_bits())
        .collect();
    let want: Vec<u32> = t.as_f32().unwrap().iter().map(|x| x.to_bits()).collect();
    assert_eq!(bits, want);
}

#[test]
fn tensors_come_back_in_file_order() {
    let bytes = write(&sample_tensors(), None);
    let (a, _) = read_safetensors(&bytes).unwrap();
    let (b, _) = read_safetensors(&bytes).unwrap();
    let na: Vec<&String> = a.iter().map(|(n, _)| n).collect();
    let nb: Vec<&String> = b.iter().map(|(n, _)| n).collect();
    assert_eq!(na, nb);
}

#[test]
fn duplicate_names_are_rejected() {
    let t = HostTensor::scalar_f32(1.0);
    let e = write_safetensors(&[("a".into(), &t), ("a".into(), &t)], None).unwrap_err();
    assert!(
        matches!(e, IoError::DuplicateName(ref n) if n == "a"),
        "{e}"
    );
}

/// A safetensors buffer holding one foreign tensor.
fn foreign(dtype: Dtype, shape: Vec<usize>, data: &[u8]) -> Vec<u8> {
    let v = TensorView::new(dtype, shape, data).unwrap();
    safetensors::serialize([("t", v)], None).unwrap()
}

fn le<T, const N: usize>(xs: &[T], f: fn(&T) -> [u8; N]) -> Vec<u8> {
    xs.iter().flat_map(f).collect()
}

#[test]
fn lossless_conversions_of_foreign_dtypes() {
    let cases: Vec<(Dtype, Vec<u8>, Vec<i32>)> = vec![
        (Dtype::I8, vec![0x80, 0x7f, 0xff], vec![-128, 127, -1]),
        (Dtype::U8, vec![0, 200, 255], vec![0, 200, 255]),
        (
            Dtype::I16,
            le(&[-300i16, 7, i16::MIN], |x| x.to_le_bytes()),
            vec![-300, 7, -32768],
        ),
        (
            Dtype::U16,
            le(&[65535u16, 1, 0], |x| x.to_le_bytes()),
            vec![65535, 1, 0],
        ),
        (
            Dtype::U32,
            le(&[5u32, i32::MAX as u32, 0], |x| x.to_le_bytes()),
            vec![5, i32::MAX, 0],
        ),
        (
            Dtype::I64,
            le(&[-5i64, i32::MIN as i64, 9], |x| x.to_le_bytes()),
            vec![-5, i32::MIN, 9],
        ),
        (
            Dtype::U64,
            le(&[1u64, 2, 3], |x| x.to_le_bytes()),
            vec![1, 2, 3],
        ),
    ];
    for (dtype, data, want) in cases {
        let (ts, _) = read_safetensors(&foreign(dtype, vec![3], &data)).unwrap();
        assert_eq!(ts[0].1.as_i32(), Some(&want[..]), "{dtype:?}");
        assert_eq!(ts[0].1.shape(), &[3]);
    }
    let hs = [f16::from_f32(1.5), f16::MAX, f16::MIN_POSITIVE_SUBNORMAL];
    let (ts, _) =
        read_safetensors(&foreign(Dtype::F16, vec![3], &le(&hs, |x| x.to_le_bytes()))).unwrap();
    let want: Vec<f32> = hs.iter().map(|h| h.to_f32()).collect();
    assert_eq!(ts[0].1.as_f32(), Some(&want[..]));
}

#[test]
fn lossy_integer_conversions_are_errors() {
    let cases = [
        (
            Dtype::I64,
            le(&[1i64, 1 << 40], |x| x.to_le_bytes()),
            "1099511627776",
        ),
        (
            Dtype::U32,
            le(&[u32::MAX, 0], |x| x.to_le_bytes()),
            "4294967295",
        ),
        (
            Dtype::U64,
            le(&[0u64, u64::MAX], |x| x.to_le_bytes()),
            "18446744073709551615",
        ),
    ];
    for (dtype, data, value) in cases {
        let e = read_safetensors(&foreign(dtype, vec![2], &data)).unwrap_err();
        assert!(matches!(e, IoError::OutOfRange { .. }), "{e}");
        let msg = e.to_string();
        assert!(msg.contains("`t`") && msg.contains(value), "{msg}");
    }
}

#[test]
fn unsupported_dtypes_and_bad_bools_are_errors() {
    let e = read_safetensors(&foreign(Dtype::F8_E4M3, vec![2], &[1, 2])).unwrap_err();
    assert!(matches!(e, IoError::UnsupportedDType { .. }), "{e}");
    assert!(e.to_string().contains("F8_E4M3"), "{e}");
    let e = read_safetensors(&foreign(Dtype::C64, vec![1], &[0; 8])).unwrap_err();
    assert!(matches!(e, IoError::UnsupportedDType { .. }), "{e}");
    let e = read_safetensors(&foreign(Dtype::BOOL, vec![3], &[0, 1, 2])).unwrap_err();
    assert!(
        matches!(
            e,
            IoError::BadBool {
                index: 2,
                byte: 2,
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn corrupt_buffers_are_errors() {
    let good = write(&sample_tensors(), None);
    assert!(read_safetensors(&[]).is_err());
    assert!(read_safetensors(&[1, 2, 3]).is_err());
    // Header length far beyond the buffer.
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(read_safetensors(&huge).is_err());
    // Header that is not JSON.
    let mut junk = 8u64.to_le_bytes().to_vec();
    junk.extend_from_slice(b"not json");
    let e = read_safetensors(&junk).unwrap_err();
    assert!(e.to_string().contains("JSON"), "{e}");
    // Extra trailing bytes.
    let mut long = good.clone();
    long.push(0);
    assert!(read_safetensors(&long).is_err());
}

#[test]
fn every_truncation_is_an_error() {
    let good = write(&sample_tensors(), None);
    for len in 0..good.len() {
        assert!(
            read_safetensors(&good[..len]).is_err(),
            "truncated to {len}"
        );
    }
}

#[test]
fn header_with_inconsistent_offsets_is_an_error() {
    let header = br#"{"t":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}}"#;
    let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(header);
    bytes.extend_from_slice(&[0; 4]);
    let e = read_safetensors(&bytes).unwrap_err();
    assert!(matches!(e, IoError::Format(_)), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Flipping any bytes of a valid buffer never panics.
    #[test]
    fn byte_flips_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4)) {
        let mut bytes = write(&sample_tensors(), None);
        let n = bytes.len();
        for (pos, val) in flips {
            bytes[pos % n] = val;
        }
        let _ = read_safetensors(&bytes);
    }

    /// Random f32 / i32 data round-trips bit-exactly.
    #[test]
    fn random_data_round_trips(f in proptest::collection::vec(any::<u32>(), 0..40),
                               i in proptest::collection::vec(any::<i32>(), 0..40)) {
        let ft = HostTensor::from_f32(vec![f.len()], f.iter().map(|&b| f32::from_bits(b)).collect());
        let it = HostTensor::from_i32(vec![i.len()], i.clone());
        let bytes = write(&[("f".into(), ft), ("i".into(), it)], None);
        let (back, _) = read_safetensors(&bytes).unwrap();
        let fb = &back.iter().find(|(n, _)| n == "f").unwrap().1;
        let bits: Vec<u32> = fb.as_f32().unwrap().iter().map(|x| x.to_bits()).collect();
        prop_assert_eq!(bits, f);
        let ib = &back.iter().find(|(n, _)| n == "i").unwrap().1;
        prop_assert_eq!(ib.as_i32().unwrap(), &i[..]);
    }
}
