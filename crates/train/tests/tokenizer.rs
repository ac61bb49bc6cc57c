//! The byte-level BPE tokenizer: exact round trips on every script, fixed special ids,
//! single-id language tags, typed errors, truncation, save/load and determinism; plus a
//! round trip over a few thousand real lines of CI's prepared corpus
//! (`parallel/de.tsv.gz`) when that file is present (skipped with a notice otherwise).

use std::io::BufRead;
use std::time::Instant;
use train::tokenizer::{Tokenizer, TokenizerError, RESERVED};

/// A small multilingual corpus: English, German, French, Russian, Chinese, Japanese, and
/// software-message placeholders, recombined so pairs repeat and BPE has merges to learn.
fn corpus() -> Vec<String> {
    let subjects = [
        "The file",
        "Die Datei",
        "Le fichier",
        "Файл",
        "文件",
        "ファイル",
        "%(count)s files",
        "{name}",
    ];
    let predicates = [
        "could not be opened.",
        "konnte nicht geöffnet werden.",
        "n'a pas pu être ouvert.",
        "не удалось открыть.",
        "无法打开。",
        "を開けませんでした。",
        "was saved to %s successfully!",
        "is ready 🎉",
    ];
    let mut out = Vec::new();
    for (i, s) in subjects.iter().enumerate() {
        for (j, p) in predicates.iter().enumerate() {
            out.push(format!("{s} {p}"));
            out.push(format!("{s} #{} {p}", i * 8 + j));
        }
    }
    out
}

const LANGS: [&str; 5] = ["fr", "de", "ru", "zh-Hans", "ja"];

fn small() -> Tokenizer {
    Tokenizer::train(corpus(), &LANGS, 600).unwrap()
}

const SAMPLES: &[&str] = &[
    "",
    "Hello, world!",
    "  leading and trailing spaces  ",
    "tabs\tand\nnewlines\r\n and  double  spaces",
    "Café naïve résumé Straße Ångström œuvre",
    "e\u{301} (decomposed) vs é",
    "我爱北京天安门。東京は日本の首都です。한국어 텍스트",
    "Emoji: 🎉👍🏽❤️ 👨‍👩‍👧 🇩🇪",
    "%(count)s files in {name}; %s %1$s %d ${var} {{escaped}}",
    "Literal specials: <s> </s> <pad> <unk> <de> <2en>",
    "Unseen scripts: नमस्ते தமிழ் ქართული አማርኛ 𒀀𒀁",
    "Control \u{0} \u{1b} \u{7f} and \u{feff}BOM",
];

#[test]
fn round_trip_is_exact() {
    let t = small();
    for s in SAMPLES {
        let ids = t.encode_pieces(s).unwrap();
        assert_eq!(&t.decode(&ids), s, "pieces round trip of {s:?}");
        let src = t.encode_source("de", s, usize::MAX).unwrap();
        assert_eq!(&t.decode(&src), s, "source round trip of {s:?}");
        let tgt = t.encode_target(s, usize::MAX).unwrap();
        assert_eq!(&t.decode(&tgt), s, "target round trip of {s:?}");
    }
}

#[test]
fn any_utf8_encodes_without_unk_or_specials() {
    let t = small();
    for s in SAMPLES {
        let ids = t.encode_pieces(s).unwrap();
        assert!(!ids.iter().any(|&id| t.is_special(id)), "{s:?} -> {ids:?}");
        assert!(ids.iter().all(|&id| (id as usize) < t.vocab_size()));
    }
}

#[test]
fn special_ids_are_fixed_and_tags_sorted() {
    let t = small();
    assert_eq!(
        (t.pad_id(), t.bos_id(), t.eos_id(), t.unk_id()),
        (0, 1, 2, 3)
    );
    for (i, s) in RESERVED.iter().enumerate() {
        assert_eq!(t.id_to_token(i as u32).as_deref(), Some(*s));
    }
    assert_eq!(t.langs(), ["de", "fr", "ja", "ru", "zh-Hans"]);
    for (i, l) in t.langs().iter().enumerate() {
        let id = t.lang_id(l).unwrap();
        assert_eq!(id as usize, RESERVED.len() + i);
        assert_eq!(t.id_to_token(id), Some(format!("<{l}>")));
    }
}

#[test]
fn language_tags_are_single_ids() {
    let t = small();
    for l in LANGS {
        let ids = t
            .encode_source(l, "Die Datei konnte nicht geöffnet werden.", 64)
            .unwrap();
        assert_eq!(ids[0], t.lang_id(l).unwrap());
        assert_eq!(*ids.last().unwrap(), t.eos_id());
        assert_eq!(ids.iter().filter(|&&id| t.is_special(id)).count(), 2);
    }
    // The tag's text inside a sentence is ordinary text, never the tag id.
    let ids = t.encode_pieces("<de> <s> </s>").unwrap();
    assert!(!ids.contains(&t.lang_id("de").unwrap()));
    assert!(!ids.contains(&t.bos_id()) && !ids.contains(&t.eos_id()));
}

#[test]
fn target_is_pieces_then_eos() {
    let t = small();
    let text = "The file could not be opened.";
    let pieces = t.encode_pieces(text).unwrap();
    let mut want = pieces.clone();
    want.push(t.eos_id());
    assert_eq!(t.encode_target(text, 1000).unwrap(), want);
}

#[test]
fn unknown_language_is_a_typed_error() {
    let t = small();
    assert!(matches!(t.lang_id("xx"), Err(TokenizerError::UnknownLanguage(l)) if l == "xx"));
    assert!(matches!(
        t.encode_source("en", "hello", 10),
        Err(TokenizerError::UnknownLanguage(_))
    ));
}

#[test]
fn invalid_language_codes_are_rejected() {
    for bad in ["", "d e", "<de>", "s", "pad", "unk", "é"] {
        let r = Tokenizer::train(corpus(), &[bad], 600);
        assert!(
            matches!(r, Err(TokenizerError::InvalidLanguage { .. })),
            "{bad:?} accepted"
        );
    }
}

#[test]
fn too_small_vocab_is_a_typed_error() {
    let r = Tokenizer::train(corpus(), &LANGS, 100);
    assert!(matches!(
        r,
        Err(TokenizerError::VocabTooSmall {
            vocab_size: 100,
            min: 265
        })
    ));
}

#[test]
fn vocab_size_is_respected() {
    let t = small();
    assert!(t.vocab_size() <= 600, "{}", t.vocab_size());
    assert!(
        t.vocab_size() > RESERVED.len() + LANGS.len() + 256,
        "no merges learned"
    );
}

#[test]
fn truncation_keeps_tag_and_eos() {
    let t = small();
    let text = "Le fichier n'a pas pu être ouvert.";
    let full = t.encode_source("fr", text, usize::MAX).unwrap();
    assert!(full.len() > 5);
    for max_len in 0..full.len() + 2 {
        let ids = t.encode_source("fr", text, max_len).unwrap();
        assert_eq!(ids.len(), max_len.min(full.len()));
        if max_len >= 2 {
            assert_eq!(ids[0], full[0]);
            assert_eq!(*ids.last().unwrap(), t.eos_id());
            assert_eq!(ids[1..ids.len() - 1], full[1..ids.len() - 1]);
        }
        let tgt = t.encode_target(text, max_len).unwrap();
        assert_eq!(tgt.len(), max_len.min(full.len() - 1));
        if max_len >= 1 {
            assert_eq!(*tgt.last().unwrap(), t.eos_id());
        }
    }
    assert_eq!(t.encode_source("fr", text, 1).unwrap(), vec![full[0]]);
}

#[test]
fn decode_skips_specials_and_out_of_range_ids() {
    let t = small();
    let mut ids = vec![t.pad_id(), t.bos_id(), t.lang_id("ja").unwrap()];
    ids.extend(t.encode_pieces("ok 🎉").unwrap());
    ids.extend([
        t.eos_id(),
        t.unk_id(),
        u32::MAX,
        t.vocab_size() as u32,
        t.pad_id(),
    ]);
    assert_eq!(t.decode(&ids), "ok 🎉");
}

#[test]
fn save_load_gives_identical_encodings() {
    let t = small();
    let dir = std::env::temp_dir().join(format!("gshard-tokenizer-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("tokenizer.json");
    t.save(&path).unwrap();
    let u = Tokenizer::load(&path).unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    assert_eq!(u.vocab_size(), t.vocab_size());
    assert_eq!(u.langs(), t.langs());
    assert_eq!(u.to_json().unwrap(), t.to_json().unwrap());
    for s in SAMPLES {
        assert_eq!(
            u.encode_source("ru", s, 256).unwrap(),
            t.encode_source("ru", s, 256).unwrap()
        );
        assert_eq!(
            u.encode_target(s, 256).unwrap(),
            t.encode_target(s, 256).unwrap()
        );
    }
    // Literal specials stay text after loading too.
    assert_eq!(
        u.encode_pieces("<s>").unwrap(),
        t.encode_pieces("<s>").unwrap()
    );
}

#[test]
fn load_errors_are_typed() {
    let missing = std::env::temp_dir().join("gshard-no-such-dir/tokenizer.json");
    assert!(matches!(
        Tokenizer::load(&missing),
        Err(TokenizerError::Io { .. })
    ));
    assert!(matches!(
        Tokenizer::from_json("{}"),
        Err(TokenizerError::Hf(_))
    ));
}

#[test]
fn training_is_deterministic() {
    let a = small().to_json().unwrap();
    let b = small().to_json().unwrap();
    assert_eq!(a, b);
    // Language order and duplicates in the argument do not matter.
    let c = Tokenizer::train(corpus(), &["ja", "zh-Hans", "ru", "de", "fr", "de"], 600)
        .unwrap()
        .to_json()
        .unwrap();
    assert_eq!(a, c);
}

/// `shared/<rel>` next to the repository root or inside it, when present.
fn shared_file(rel: &str) -> Option<std::fs::File> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    [root.join("shared"), root.join("../shared")]
        .iter()
        .find_map(|d| std::fs::File::open(d.join(rel)).ok())
}

/// Up to `limit` (English, German) pairs of the prepared German corpus.
fn real_pairs(limit: usize) -> Option<Vec<(String, String)>> {
    let file = shared_file("data/parallel/de.tsv.gz")?;
    let reader = std::io::BufReader::new(flate2::read::GzDecoder::new(file));
    let mut out = Vec::new();
    for line in reader.lines().take(limit) {
        let line = line.unwrap();
        let f: Vec<&str> = line.split('\t').collect();
        out.push((f[2].to_string(), f[3].to_string()));
    }
    Some(out)
}

#[test]
fn real_data_round_trip() {
    let Some(pairs) = real_pairs(3000) else {
        println!("skipping real_data_round_trip: shared/data/parallel/de.tsv.gz is absent");
        return;
    };
    let texts: Vec<&str> = pairs
        .iter()
        .flat_map(|(en, de)| [en.as_str(), de.as_str()])
        .collect();
    let t0 = Instant::now();
    let t = Tokenizer::train(texts.iter().copied(), &["de"], 4000).unwrap();
    println!(
        "trained {} ids on {} lines in {:.2?}",
        t.vocab_size(),
        texts.len(),
        t0.elapsed()
    );
    assert_eq!(t.vocab_size(), 4000);
    let (mut chars, mut pieces) = (0usize, 0usize);
    for (en, de) in &pairs {
        let src = t.encode_source("de", de, usize::MAX).unwrap();
        assert_eq!(&t.decode(&src), de);
        let tgt = t.encode_target(en, usize::MAX).unwrap();
        assert_eq!(&t.decode(&tgt), en);
        assert!(!src.contains(&t.unk_id()) && !tgt.contains(&t.unk_id()));
        chars += en.chars().count() + de.chars().count();
        pieces += src.len() + tgt.len() - 3;
    }
    // BPE must actually compress: well under one piece per character.
    let ratio = pieces as f64 / chars as f64;
    println!("{pieces} pieces for {chars} characters ({ratio:.3} per character)");
    assert!(ratio < 0.4, "{ratio}");
}

/// On real text, training and encoding agree with HF's own pipeline: the same
/// `tokenizer.json` as `tokenizers::Tokenizer::train` with the same trainer settings, and the
/// same ids as HF's `encode` of that file (special-token matching off).
#[test]
fn real_data_matches_hf_pipeline() {
    use tokenizers::models::bpe::{BpeTrainer, BPE};
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    let Some(pairs) = real_pairs(2000) else {
        println!(
            "skipping real_data_matches_hf_pipeline: shared/data/parallel/de.tsv.gz is absent"
        );
        return;
    };
    let texts: Vec<&str> = pairs
        .iter()
        .flat_map(|(en, de)| [en.as_str(), de.as_str()])
        .collect();
    let ours = Tokenizer::train(texts.iter().copied(), &["de"], 3000).unwrap();

    let specials = ["<pad>", "<s>", "</s>", "<unk>", "<de>"]
        .iter()
        .map(|s| tokenizers::AddedToken::from(*s, true))
        .collect();
    let trainer = BpeTrainer::builder()
        .vocab_size(3000)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .special_tokens(specials)
        .build();
    let mut trainer = tokenizers::models::TrainerWrapper::BpeTrainer(trainer);
    let mut hf = tokenizers::Tokenizer::new(BPE::default());
    hf.with_pre_tokenizer(Some(ByteLevel::new(false, false, true)));
    hf.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));
    hf.train(&mut trainer, texts.iter()).unwrap();
    assert_eq!(ours.to_json().unwrap(), hf.to_string(false).unwrap());

    let mut hf: tokenizers::Tokenizer = ours.to_json().unwrap().parse().unwrap();
    hf.set_encode_special_tokens(true);
    for s in &texts {
        let want = hf.encode(*s, false).unwrap();
        assert_eq!(ours.encode_pieces(s).unwrap(), want.get_ids(), "{s:?}");
        assert_eq!(hf.decode(want.get_ids(), true).unwrap(), *s);
    }
}
