//! A safetensors file written as a stream: the header first (every size is known from the
//! shapes), then each tensor's bytes through one bounded buffer, hashed on the way (SHA-256
//! of the file, of each tensor, and of each chunk of a tensor), so writing holds no copy of
//! the data. The header lists the tensors in the order written, padded with spaces to a
//! multiple of 8 bytes, as the `safetensors` crate writes it; any safetensors reader loads
//! the file.

use super::{io_err, CheckpointError, CHUNK_BYTES};
use ir::DType;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::Path;

// Tensor bytes are written as the host holds them; safetensors is little-endian.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "checkpoints are written from little-endian memory"
);

/// The size of the write buffer.
pub const WRITE_BUFFER: usize = 1 << 20;

/// One tensor of a file: its name, dtype and (dense) shape.
pub struct Entry {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl Entry {
    pub fn bytes(&self) -> u64 {
        self.shape.iter().product::<usize>() as u64 * self.dtype.size_bytes() as u64
    }
}

/// Where one tensor's bytes went, and their hashes.
pub struct Placed {
    pub start: u64,
    pub end: u64,
    pub sha256: String,
    pub chunks: Vec<String>,
}

/// A written file: its size, hash and tensors (in the entries' order).
pub struct Written {
    pub bytes: u64,
    pub sha256: String,
    pub tensors: Vec<Placed>,
}

pub fn hex(d: impl AsRef<[u8]>) -> String {
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

fn st_dtype(d: DType) -> &'static str {
    match d {
        DType::F32 => "F32",
        DType::F64 => "F64",
        DType::BF16 => "BF16",
        DType::I32 => "I32",
        DType::Bool => "BOOL",
    }
}

/// The header bytes (length prefix included) of a file holding `entries` in that order.
pub fn header(entries: &[Entry], metadata: &BTreeMap<String, String>) -> Vec<u8> {
    let mut obj = serde_json::Map::new();
    let mut at = 0u64;
    for e in entries {
        let end = at + e.bytes();
        obj.insert(
            e.name.clone(),
            serde_json::json!({"dtype": st_dtype(e.dtype), "shape": e.shape, "data_offsets": [at, end]}),
        );
        at = end;
    }
    if !metadata.is_empty() {
        obj.insert("__metadata__".into(), serde_json::json!(metadata));
    }
    let mut json = serde_json::Value::Object(obj).to_string().into_bytes();
    while !(8 + json.len()).is_multiple_of(8) {
        json.push(b' ');
    }
    let mut out = (json.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&json);
    out
}

/// The data sink of one tensor: bytes go to the file and into its hashes.
pub struct Sink<'a> {
    out: &'a mut BufWriter<File>,
    file_hash: &'a mut Sha256,
    whole: Sha256,
    chunk: Sha256,
    in_chunk: u64,
    chunks: Vec<String>,
    written: u64,
}

impl Sink<'_> {
    pub fn write(&mut self, mut bytes: &[u8]) -> std::io::Result<()> {
        self.out.write_all(bytes)?;
        self.file_hash.update(bytes);
        self.whole.update(bytes);
        self.written += bytes.len() as u64;
        while !bytes.is_empty() {
            let take = ((CHUNK_BYTES - self.in_chunk) as usize).min(bytes.len());
            self.chunk.update(&bytes[..take]);
            self.in_chunk += take as u64;
            bytes = &bytes[take..];
            if self.in_chunk == CHUNK_BYTES {
                self.chunks
                    .push(hex(std::mem::take(&mut self.chunk).finalize()));
                self.in_chunk = 0;
            }
        }
        Ok(())
    }
}

/// Write `entries` to `path` (created; synced before returning): `fill(i, sink)` writes
/// entry `i`'s bytes, exactly [`Entry::bytes`] of them.
pub fn write_file(
    path: &Path,
    entries: &[Entry],
    metadata: &BTreeMap<String, String>,
    mut fill: impl FnMut(usize, &mut Sink) -> Result<(), CheckpointError>,
) -> Result<Written, CheckpointError> {
    let io = || io_err(path);
    let head = header(entries, metadata);
    let file = File::create(path).map_err(io())?;
    let mut out = BufWriter::with_capacity(WRITE_BUFFER, file);
    let mut file_hash = Sha256::new();
    out.write_all(&head).map_err(io())?;
    file_hash.update(&head);
    let mut at = head.len() as u64;
    let mut tensors = Vec::with_capacity(entries.len());
    for (i, e) in entries.iter().enumerate() {
        let mut sink = Sink {
            out: &mut out,
            file_hash: &mut file_hash,
            whole: Sha256::new(),
            chunk: Sha256::new(),
            in_chunk: 0,
            chunks: Vec::new(),
            written: 0,
        };
        fill(i, &mut sink)?;
        if sink.written != e.bytes() {
            return Err(CheckpointError::Corrupt {
                path: path.to_path_buf(),
                reason: format!(
                    "tensor `{}` gave {} bytes, its shape needs {}",
                    e.name,
                    sink.written,
                    e.bytes()
                ),
            });
        }
        if sink.in_chunk > 0 {
            let last = hex(std::mem::take(&mut sink.chunk).finalize());
            sink.chunks.push(last);
        }
        let (whole, chunks) = (hex(sink.whole.finalize()), sink.chunks);
        tensors.push(Placed {
            start: at,
            end: at + e.bytes(),
            sha256: whole,
            chunks,
        });
        at += e.bytes();
    }
    let file = out.into_inner().map_err(|e| io_err(path)(e.into_error()))?;
    file.sync_all().map_err(io())?;
    Ok(Written {
        bytes: at,
        sha256: hex(file_hash.finalize()),
        tensors,
    })
}

/// Make the renames in `dir` durable.
pub fn sync_dir(dir: &Path) -> Result<(), CheckpointError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}
