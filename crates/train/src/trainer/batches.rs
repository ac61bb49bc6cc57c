//! The data side of a run: choosing languages, training the tokenizer, tokenizing pairs into
//! [`Example`]s, and cutting the batch of each step as a pure function of `(seed, step)`.

use super::TrainError;
use crate::config::{LongPairs, TrainConfig};
use crate::data::split::{english_hash, english_key};
use crate::data::{Corpus, LangSampler, Pair, Split};
use crate::tokenizer::Tokenizer;
use ir::{DType, Type};
use runtime::HostTensor;
use std::collections::{HashMap, HashSet};

/// One tokenized pair.
#[derive(Clone, Debug)]
pub struct Example {
    pub lang: String,
    /// `<lang> pieces </s>`.
    pub src: Vec<u32>,
    /// `pieces </s>`.
    pub tgt: Vec<u32>,
    pub english: String,
}

/// The data of a run.
pub struct Data {
    pub langs: Vec<String>,
    pub train: Vec<Vec<Example>>,
    pub dev: Vec<Example>,
    pub sampler: LangSampler,
}

pub(super) fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E3779B97F4A7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D049BB133111EB);
    x ^ (x >> 31)
}

/// Choose languages, train the tokenizer on their training pairs, tokenize.
pub fn tokenizer_for(
    cfg: &TrainConfig,
    corpus: &Corpus,
) -> Result<(Vec<String>, Tokenizer), TrainError> {
    let langs = select_langs(cfg, corpus)?;
    let mut texts: Vec<String> = Vec::new();
    for l in &langs {
        for p in corpus
            .split(l, Split::Train)
            .iter()
            .take(cfg.data.tokenizer_pairs_per_lang)
        {
            texts.push(p.english.clone());
            texts.push(p.source.clone());
        }
    }
    let refs: Vec<&str> = langs.iter().map(String::as_str).collect();
    let tok = Tokenizer::train(texts, &refs, cfg.data.vocab_size)?;
    Ok((langs, tok))
}

/// The languages a `langs = []` run takes first, in this order, when the corpus has them:
/// those users try first. The rest of `max_langs` are the largest others.
pub const FIRST_LANGS: [&str; 14] = [
    "fr", "de", "es", "it", "pt-BR", "ru", "zh-Hans", "ja", "ko", "zh-Hant", "pl", "tr", "nl", "cs",
];

/// The run's source languages, in the trainer's order (largest first): `data.langs` as
/// given when set, else `max_langs` of the corpus's, [`FIRST_LANGS`] first (in its order)
/// and then the largest others.
pub fn select_langs(cfg: &TrainConfig, corpus: &Corpus) -> Result<Vec<String>, TrainError> {
    if !cfg.data.langs.is_empty() {
        for l in &cfg.data.langs {
            if corpus.get(l).is_none_or(|d| d.train.is_empty()) {
                return Err(TrainError::Data(format!(
                    "language `{l}` has no training pairs in the corpus; pick from {:?}",
                    corpus.languages()
                )));
            }
        }
        return Ok(cfg.data.langs.clone());
    }
    let sizes = by_size(corpus);
    let first = |l: &str| FIRST_LANGS.iter().position(|f| *f == l);
    // A stable sort: the languages outside FIRST_LANGS go last and stay largest first.
    let mut chosen: Vec<&String> = sizes.iter().collect();
    chosen.sort_by_key(|l| first(l).unwrap_or(usize::MAX));
    chosen.truncate(cfg.data.max_langs);
    let langs: Vec<String> = sizes
        .iter()
        .filter(|l| chosen.contains(l))
        .cloned()
        .collect();
    if langs.is_empty() {
        return Err(TrainError::Data(
            "the corpus has no training pairs; run `gshard data`".into(),
        ));
    }
    Ok(langs)
}

/// `langs` (a run's tokenizer's languages) in the trainer's order, largest first: how a
/// resumed `langs = []` run gets the languages it started with, whichever rule chose them
/// then. Languages the corpus lacks are left out (the caller's check names them).
pub fn langs_by_size(corpus: &Corpus, langs: &[String]) -> Vec<String> {
    by_size(corpus)
        .into_iter()
        .filter(|l| langs.contains(l))
        .collect()
}

/// The corpus's languages with training pairs, largest first; ties (a corpus capped per
/// language) by held-out pairs, which are never capped; then by tag.
fn by_size(corpus: &Corpus) -> Vec<String> {
    let held: HashMap<String, usize> = corpus
        .iter()
        .map(|(l, d)| (l.to_string(), d.dev.len() + d.test.len()))
        .collect();
    let mut sizes = corpus.sizes(Split::Train);
    sizes.retain(|(_, n)| *n > 0);
    sizes.sort_by(|a, b| {
        b.1.cmp(&a.1)
            .then(held[&b.0].cmp(&held[&a.0]))
            .then(a.0.cmp(&b.0))
    });
    sizes.into_iter().map(|(l, _)| l).collect()
}

/// `p` as token ids, each side cut to fit `max_len` (the target keeps one slot for `<s>`).
pub(super) fn encode(tok: &Tokenizer, p: &Pair, max_len: usize) -> Result<Example, TrainError> {
    Ok(Example {
        lang: p.lang.to_string(),
        src: tok.encode_source(&p.lang, &p.source, max_len)?,
        tgt: tok.encode_target(&p.english, max_len - 1)?,
        english: p.english.clone(),
    })
}

/// A training pair as [`encode`] makes it, or `None` when `long` is
/// [`LongPairs::Drop`] and a side does not fit `max_len` whole.
fn encode_train(
    tok: &Tokenizer,
    p: &Pair,
    max_len: usize,
    long: LongPairs,
) -> Result<Option<Example>, TrainError> {
    let whole = encode(tok, p, usize::MAX)?;
    let fits = whole.src.len() <= max_len && whole.tgt.len() < max_len;
    match (fits, long) {
        (true, _) => Ok(Some(whole)),
        (false, LongPairs::Drop) => Ok(None),
        (false, LongPairs::Cut) => encode(tok, p, max_len).map(Some),
    }
}

/// Tokenize the chosen languages' train pairs and a fixed, language-balanced dev set.
pub fn prepare_data(
    cfg: &TrainConfig,
    corpus: &Corpus,
    langs: &[String],
    tok: &Tokenizer,
) -> Result<Data, TrainError> {
    let min_words = cfg.data.min_english_words;
    let keep = |p: &&Pair| p.english.split_whitespace().count() >= min_words;
    let mut train = Vec::new();
    let mut sizes = Vec::new();
    for l in langs {
        let ex: Vec<Example> = corpus
            .split(l, Split::Train)
            .iter()
            .filter(keep)
            .filter_map(|p| encode_train(tok, p, cfg.data.max_len, cfg.data.long_pairs).transpose())
            .collect::<Result<_, _>>()?;
        if ex.is_empty() {
            return Err(TrainError::Data(format!(
                "language `{l}` has no training pair with >= {min_words} English words that fits data.max_len = {}; lower data.min_english_words or raise data.max_len",
                cfg.data.max_len
            )));
        }
        sizes.push((l.clone(), ex.len()));
        train.push(ex);
    }
    let dev = dev_set(cfg, corpus, langs, &keep)
        .into_iter()
        .map(|p| encode(tok, p, cfg.data.max_len))
        .collect::<Result<_, _>>()?;
    let sampler = LangSampler::new(&sizes, cfg.data.temperature, cfg.seed as i32)?;
    Ok(Data {
        langs: langs.to_vec(),
        train,
        dev,
        sampler,
    })
}

/// The dev set: [`held_out`] pairs of the dev split, `dev_size` of them.
fn dev_set<'c>(
    cfg: &TrainConfig,
    corpus: &'c Corpus,
    langs: &[String],
    keep: &dyn Fn(&&Pair) -> bool,
) -> Vec<&'c Pair> {
    held_out(corpus, langs, Split::Dev, cfg.data.dev_size, keep)
}

/// Up to `size` pairs of a held-out `split`, round-robin over the languages (what the
/// trainer's dev set and `gshard eval` decode). Each language's pairs that `keep` accepts
/// are taken in the order of their English hash ([`english_hash`]: a sample spread over
/// every source, not the corpus file's first source), skipping an English sentence another
/// language already brought while it has others, so the set holds as many distinct
/// references as it can (the corpus is multi-way parallel).
pub fn held_out<'c>(
    corpus: &'c Corpus,
    langs: &[String],
    split: Split,
    size: usize,
    keep: &dyn Fn(&&Pair) -> bool,
) -> Vec<&'c Pair> {
    let mut lists: Vec<Vec<&Pair>> = langs
        .iter()
        .map(|l| corpus.split(l, split).iter().filter(keep).collect())
        .collect();
    for d in &mut lists {
        d.sort_by_cached_key(|p| (english_hash(&p.english), p.english.clone()));
    }
    let mut taken: Vec<Vec<bool>> = lists.iter().map(|d| vec![false; d.len()]).collect();
    let mut seen: HashSet<String> = HashSet::new();
    let mut out = Vec::new();
    while out.len() < size && taken.iter().any(|t| t.contains(&false)) {
        for (d, t) in lists.iter().zip(&mut taken) {
            if out.len() == size {
                break;
            }
            let fresh =
                (0..d.len()).find(|&i| !t[i] && !seen.contains(&english_key(&d[i].english)));
            if let Some(i) = fresh.or_else(|| t.iter().position(|&x| !x)) {
                t[i] = true;
                seen.insert(english_key(&d[i].english));
                out.push(d[i]);
            }
        }
    }
    out
}

/// Host tensors of a batch (padding rows have zero weight).
pub fn batch_tensors(
    cfg: &TrainConfig,
    tok: &Tokenizer,
    rows: &[Option<&Example>],
) -> HashMap<String, HostTensor> {
    let (b, l) = (cfg.data.batch_size, cfg.data.max_len);
    let pad = tok.pad_id() as f64;
    let mut src = vec![pad; b * l];
    let mut src_pad = vec![1.0; b * l];
    let mut tgt_in = vec![pad; b * l];
    let mut tgt_out = vec![pad; b * l];
    let mut w = vec![0.0; b * l];
    for (r, ex) in rows.iter().enumerate().take(b) {
        let Some(ex) = ex else { continue };
        for (k, &id) in ex.src.iter().take(l).enumerate() {
            src[r * l + k] = id as f64;
            src_pad[r * l + k] = 0.0;
        }
        tgt_in[r * l] = tok.bos_id() as f64;
        for (k, &id) in ex.tgt.iter().take(l).enumerate() {
            tgt_out[r * l + k] = id as f64;
            w[r * l + k] = 1.0;
            if k + 1 < l {
                tgt_in[r * l + k + 1] = id as f64;
            }
        }
    }
    let i32t = Type::new(DType::I32, vec![b, l]);
    let f32t = Type::new(DType::F32, vec![b, l]);
    HashMap::from([
        (
            "src".to_string(),
            HostTensor::from_f64_values(i32t.clone(), &src),
        ),
        (
            "src_pad".to_string(),
            HostTensor::from_f64_values(f32t.clone(), &src_pad),
        ),
        (
            "tgt_in".to_string(),
            HostTensor::from_f64_values(i32t.clone(), &tgt_in),
        ),
        (
            "tgt_out".to_string(),
            HostTensor::from_f64_values(i32t, &tgt_out),
        ),
        (
            "tgt_weight".to_string(),
            HostTensor::from_f64_values(f32t, &w),
        ),
    ])
}

/// The training example of draw number `draw`: a language by the sampler, then a pair of
/// it, both pure functions of `(seed, draw)`.
fn draw<'a>(cfg: &TrainConfig, data: &'a Data, draw: u64) -> &'a Example {
    let li = data.sampler.index_at(draw);
    let ex = &data.train[li];
    let k = splitmix(cfg.seed ^ splitmix(draw.wrapping_add(0x5EED))) as usize % ex.len();
    &ex[k]
}

/// The examples of step `step`, one per row: a pure function of `(seed, step)`.
pub fn batch_at<'a>(cfg: &TrainConfig, data: &'a Data, step: u64) -> Vec<Option<&'a Example>> {
    let b = cfg.data.batch_size as u64;
    (0..b)
        .map(|r| Some(draw(cfg, data, step * b + r)))
        .collect()
}

/// Draws a packed step may examine (a bound far above what filling its rows takes).
const PACK_DRAWS: u64 = 1 << 20;
/// A packed step stops drawing after this many draws in a row found no room.
const PACK_MISSES: usize = 32;

/// The examples of packed step `step`, several per row: draws, in order, go to the first row
/// with room for both sides (first fit), until [`PACK_MISSES`] draws in a row find none.
/// A pure function of `(seed, step)`.
pub fn packed_batch_at<'a>(cfg: &TrainConfig, data: &'a Data, step: u64) -> Vec<Vec<&'a Example>> {
    let (b, l) = (cfg.data.batch_size, cfg.data.max_len);
    let mut rows: Vec<Vec<&Example>> = vec![Vec::new(); b];
    let mut used = vec![(0usize, 0usize); b];
    let mut misses = 0;
    for i in 0..PACK_DRAWS {
        let ex = draw(cfg, data, step * PACK_DRAWS + i);
        let (s, t) = (ex.src.len().min(l), ex.tgt.len().min(l));
        match used.iter().position(|&(us, ut)| us + s <= l && ut + t <= l) {
            Some(r) => {
                used[r] = (used[r].0 + s, used[r].1 + t);
                rows[r].push(ex);
                misses = 0;
            }
            None if misses + 1 == PACK_MISSES => break,
            None => misses += 1,
        }
    }
    rows
}

/// Host tensors of a packed batch: each row holds its examples one after the other, with
/// segment ids (the example's number in the row from 1; 0 = padding) and in-sentence
/// positions for both sides ([`nn::transformer::Packing::Packed`]).
pub fn packed_tensors(
    cfg: &TrainConfig,
    tok: &Tokenizer,
    rows: &[Vec<&Example>],
) -> HashMap<String, HostTensor> {
    let (b, l) = (cfg.data.batch_size, cfg.data.max_len);
    let pad = tok.pad_id() as f64;
    let mut src = vec![pad; b * l];
    let mut tgt_in = vec![pad; b * l];
    let mut tgt_out = vec![pad; b * l];
    let mut w = vec![0.0; b * l];
    let mut seg = [vec![0.0; b * l], vec![0.0; b * l]];
    let mut pos = [vec![0.0; b * l], vec![0.0; b * l]];
    for (r, row) in rows.iter().enumerate().take(b) {
        let (mut so, mut to) = (r * l, r * l);
        for (k, ex) in row.iter().enumerate() {
            let id = (k + 1) as f64;
            for (j, &tokid) in ex.src.iter().take(l).enumerate() {
                src[so] = tokid as f64;
                seg[0][so] = id;
                pos[0][so] = j as f64;
                so += 1;
            }
            let tgt = &ex.tgt[..ex.tgt.len().min(l)];
            for (j, &tokid) in tgt.iter().enumerate() {
                tgt_in[to] = if j == 0 {
                    tok.bos_id() as f64
                } else {
                    tgt[j - 1] as f64
                };
                tgt_out[to] = tokid as f64;
                w[to] = 1.0;
                seg[1][to] = id;
                pos[1][to] = j as f64;
                to += 1;
            }
        }
    }
    let i32t = Type::new(DType::I32, vec![b, l]);
    let f32t = Type::new(DType::F32, vec![b, l]);
    let int = |v: &[f64]| HostTensor::from_f64_values(i32t.clone(), v);
    HashMap::from([
        ("src".to_string(), int(&src)),
        ("src_seg".to_string(), int(&seg[0])),
        ("src_pos".to_string(), int(&pos[0])),
        ("tgt_in".to_string(), int(&tgt_in)),
        ("tgt_out".to_string(), int(&tgt_out)),
        ("tgt_seg".to_string(), int(&seg[1])),
        ("tgt_pos".to_string(), int(&pos[1])),
        (
            "tgt_weight".to_string(),
            HostTensor::from_f64_values(f32t, &w),
        ),
    ])
}

/// Real (not padding) tokens of a batch's two sides, padded or packed.
pub fn real_tokens(batch: &HashMap<String, HostTensor>) -> f64 {
    let tgt: f64 = batch["tgt_weight"].to_f64_vec().iter().sum();
    let src = match (batch.get("src_pad"), batch.get("src_seg")) {
        (Some(pad), _) => pad.to_f64_vec().iter().filter(|&&p| p == 0.0).count(),
        (None, Some(seg)) => seg.to_f64_vec().iter().filter(|&&s| s != 0.0).count(),
        (None, None) => 0,
    };
    tgt + src as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::split::split_of;

    /// `n` English sentences that the split puts in dev.
    fn dev_english(n: usize) -> Vec<String> {
        (0..)
            .map(|i| format!("held out sentence number {i}"))
            .filter(|e| split_of(e) == Split::Dev)
            .take(n)
            .collect()
    }

    #[test]
    fn the_dev_set_takes_distinct_english_across_languages() {
        // Three languages translate the same 12 sentences (a multi-way parallel corpus),
        // the first six from one source and the rest from another.
        let en = dev_english(12);
        let langs: Vec<String> = ["de", "fr", "ja"].iter().map(|l| l.to_string()).collect();
        let corpus = Corpus::from_pairs(langs.iter().flat_map(|l| {
            en.iter().enumerate().map(move |(i, e)| Pair {
                lang: l.as_str().into(),
                origin: if i < 6 { "first" } else { "second" }.into(),
                english: e.clone(),
                source: format!("{l} {i}"),
            })
        }));
        let mut cfg = TrainConfig::default();
        cfg.data.dev_size = 12;
        let dev = dev_set(&cfg, &corpus, &langs, &|_| true);
        assert_eq!(dev.len(), 12);
        let distinct: HashSet<&str> = dev.iter().map(|p| p.english.as_str()).collect();
        assert_eq!(
            distinct.len(),
            12,
            "each language brings English the others did not"
        );
        for l in &langs {
            assert_eq!(dev.iter().filter(|p| &*p.lang == l).count(), 4, "{l}");
        }
        // The first language's picks follow the English hash, not the file order.
        let first: Vec<&str> = dev
            .iter()
            .filter(|p| &*p.lang == "de")
            .map(|p| p.english.as_str())
            .collect();
        let mut by_hash = en.clone();
        by_hash.sort_by_key(|e| english_hash(e));
        assert_eq!(first[0], by_hash[0]);
        // Past the distinct sentences, repeats fill the set.
        cfg.data.dev_size = 30;
        assert_eq!(dev_set(&cfg, &corpus, &langs, &|_| true).len(), 30);
    }

    /// Two languages of examples with 2..=11 source and 1..=10 target tokens.
    fn toy_data(cfg: &TrainConfig) -> Data {
        let mut x = 7u64;
        let mut next = move |n: u64| {
            x = splitmix(x);
            (x % n) as usize
        };
        let langs = vec!["de".to_string(), "fr".to_string()];
        let train: Vec<Vec<Example>> = langs
            .iter()
            .map(|l| {
                (0..50)
                    .map(|_| Example {
                        lang: l.clone(),
                        src: (0..2 + next(10)).map(|_| 10 + next(90) as u32).collect(),
                        tgt: (0..1 + next(10)).map(|_| 10 + next(90) as u32).collect(),
                        english: String::new(),
                    })
                    .collect()
            })
            .collect();
        let sizes: Vec<(String, usize)> = langs.iter().map(|l| (l.clone(), 50)).collect();
        let sampler = LangSampler::new(&sizes, cfg.data.temperature, cfg.seed as i32).unwrap();
        Data {
            langs,
            train,
            dev: Vec::new(),
            sampler,
        }
    }

    #[test]
    fn packed_rows_hold_their_pairs_whole_with_segments_and_positions() {
        let mut cfg = TrainConfig::default();
        cfg.data.batch_size = 4;
        cfg.data.max_len = 16;
        let data = toy_data(&cfg);
        let tok =
            Tokenizer::train(["eins zwei drei", "un deux trois"], &["de", "fr"], 500).unwrap();
        let rows = packed_batch_at(&cfg, &data, 3);
        // A pure function of (seed, step); another step draws other pairs.
        let again = packed_batch_at(&cfg, &data, 3);
        let same = |a: &[Vec<&Example>], b: &[Vec<&Example>]| {
            a.iter()
                .flatten()
                .zip(b.iter().flatten())
                .all(|(x, y)| std::ptr::eq(*x, *y))
        };
        assert!(same(&rows, &again));
        assert!(!same(&rows, &packed_batch_at(&cfg, &data, 4)));
        let (b, l) = (4, 16);
        let t = packed_tensors(&cfg, &tok, &rows);
        let v = |n: &str| t[n].to_f64_vec();
        let (src, src_seg, src_pos) = (v("src"), v("src_seg"), v("src_pos"));
        let (tgt_in, tgt_out, tgt_seg, tgt_pos, w) = (
            v("tgt_in"),
            v("tgt_out"),
            v("tgt_seg"),
            v("tgt_pos"),
            v("tgt_weight"),
        );
        let mut real = 0;
        for (r, row) in rows.iter().enumerate() {
            assert!(row.len() >= 2, "short pairs share a row");
            for (k, ex) in row.iter().enumerate() {
                let id = (k + 1) as f64;
                let at: Vec<usize> = (r * l..(r + 1) * l).filter(|&i| src_seg[i] == id).collect();
                let toks: Vec<u32> = at.iter().map(|&i| src[i] as u32).collect();
                assert_eq!(toks, ex.src, "row {r} pair {k}");
                let pos: Vec<f64> = at.iter().map(|&i| src_pos[i]).collect();
                assert_eq!(pos, (0..ex.src.len()).map(|j| j as f64).collect::<Vec<_>>());
                let at: Vec<usize> = (r * l..(r + 1) * l).filter(|&i| tgt_seg[i] == id).collect();
                let out: Vec<u32> = at.iter().map(|&i| tgt_out[i] as u32).collect();
                assert_eq!(out, ex.tgt);
                let inp: Vec<u32> = at.iter().map(|&i| tgt_in[i] as u32).collect();
                let mut shifted = vec![tok.bos_id()];
                shifted.extend(&ex.tgt[..ex.tgt.len() - 1]);
                assert_eq!(inp, shifted, "teacher forcing within the pair");
                assert!(at
                    .iter()
                    .all(|&i| w[i] == 1.0 && tgt_pos[i] == (i - at[0]) as f64));
                real += ex.src.len() + ex.tgt.len();
            }
        }
        // Weights mark exactly the target tokens; the rows are mostly full.
        assert_eq!(
            w.iter().sum::<f64>() as usize,
            tgt_seg.iter().filter(|&&s| s != 0.0).count()
        );
        assert_eq!(real_tokens(&t) as usize, real);
        assert!(
            real as f64 >= 0.8 * (2 * b * l) as f64,
            "{real} of {} slots",
            2 * b * l
        );
    }

    #[test]
    fn long_training_pairs_are_dropped_or_cut_whole_ones_kept() {
        let tok =
            Tokenizer::train(["eins zwei drei vier", "one two three four"], &["de"], 300).unwrap();
        let pair = |source: &str, english: &str| Pair {
            lang: "de".into(),
            origin: "test".into(),
            english: english.into(),
            source: source.into(),
        };
        let short = pair("eins zwei", "one two");
        let long_src = pair(&"eins zwei drei vier ".repeat(8), "one two");
        let long_tgt = pair("eins zwei", &"one two three four ".repeat(8));
        let l = 12;
        let whole = encode(&tok, &short, usize::MAX).unwrap();
        assert!(whole.src.len() <= l && whole.tgt.len() < l);
        for mode in [LongPairs::Drop, LongPairs::Cut] {
            let kept = encode_train(&tok, &short, l, mode).unwrap().unwrap();
            assert_eq!((kept.src, kept.tgt), (whole.src.clone(), whole.tgt.clone()));
        }
        for p in [&long_src, &long_tgt] {
            assert!(encode_train(&tok, p, l, LongPairs::Drop).unwrap().is_none());
            let cut = encode_train(&tok, p, l, LongPairs::Cut).unwrap().unwrap();
            assert!(cut.src.len() <= l && cut.tgt.len() < l);
            assert_eq!(cut.tgt.last(), Some(&tok.eos_id()));
        }
    }
}
