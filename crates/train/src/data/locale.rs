//! Locale codes of catalogs -> corpus language tags.
//!
//! [`norm_locale`] only spells a code the BCP-47 way (`pt_BR.UTF-8` -> `pt-BR`,
//! `sr@latin` -> `sr-Latn`). [`canon_lang`] then merges variants into one corpus tag:
//! regions are dropped except `pt-BR`, `fr-CA` and Latin-American Spanish (`es-419`);
//! Chinese becomes `zh-Hans` / `zh-Hant`; `no` -> `nb`; a language's default script is
//! dropped (`az-Latn` -> `az`); English variants and pseudo-locales give `None`.

/// `@variant` suffixes of glibc locales -> BCP-47 subtags.
const VARIANTS: &[(&str, &str)] = &[
    ("latin", "Latn"),
    ("cyrillic", "Cyrl"),
    ("ijekavian", "ijekavsk"),
    ("ijekavianlatin", "Latn-ijekavsk"),
    ("valencia", "valencia"),
    ("arabic", "Arab"),
    ("devanagari", "Deva"),
    ("shaw", "Shaw"),
];

/// Script subtags that are the default for their language, and so are dropped.
const DEFAULT_SCRIPT: &[(&str, &str)] = &[
    ("az", "Latn"),
    ("uz", "Latn"),
    ("bs", "Latn"),
    ("sr", "Cyrl"),
    ("mn", "Cyrl"),
    ("tk", "Latn"),
    ("ug", "Arab"),
    ("ckb", "Arab"),
    ("kk", "Cyrl"),
    ("ky", "Cyrl"),
    ("tg", "Cyrl"),
    ("pa", "Guru"),
    ("sd", "Arab"),
    ("ks", "Arab"),
    ("ha", "Latn"),
    ("ms", "Latn"),
    ("zlm", "Latn"),
    ("be", "Cyrl"),
    ("kok", "Deva"),
    ("sat", "Olck"),
    ("yue", "Hant"),
    ("vi", "Latn"),
    ("ff", "Latn"),
    ("fuf", "Latn"),
    ("ang", "Latn"),
    ("tzm", "Latn"),
    ("sa", "Deva"),
    ("kmr", "Latn"),
    ("tl", "Latn"),
    ("jv", "Latn"),
    ("mni", "Beng"),
    ("shi", "Tfng"),
    ("zgh", "Tfng"),
    ("ku", "Latn"),
];

/// Pseudo-locales and templates that are not languages.
const SKIP: &[&str] = &[
    "qqq",
    "x-test",
    "template",
    "templates",
    "pot",
    "c",
    "posix",
    "ach",
    "ia-test",
];

fn title(p: &str) -> String {
    let mut cs = p.chars();
    match cs.next() {
        Some(first) => first
            .to_uppercase()
            .chain(cs.flat_map(char::to_lowercase))
            .collect(),
        None => String::new(),
    }
}

/// Spells a locale code the BCP-47 way: `pt_BR` -> `pt-BR`, `sr@latin` -> `sr-Latn`,
/// `zh-hans` -> `zh-Hans`, `de_DE.UTF-8` -> `de-DE`.
pub fn norm_locale(code: &str) -> String {
    let code = code.trim();
    let code = code.split('.').next().unwrap_or("");
    let (code, variant) = match code.split_once('@') {
        Some((c, v)) => (c, Some(v)),
        None => (code, None),
    };
    let mut parts = code.split(['-', '_']);
    let mut out = vec![parts.next().unwrap_or("").to_lowercase()];
    for p in parts {
        let n = p.chars().count();
        if n == 4 && p.chars().all(char::is_alphabetic) {
            out.push(title(p));
        } else if (n == 2 || n == 3)
            && (p.chars().all(char::is_alphabetic) || p.chars().all(|c| c.is_ascii_digit()))
        {
            out.push(p.to_uppercase());
        } else if !p.is_empty() {
            out.push(p.to_lowercase());
        }
    }
    if let Some(v) = variant {
        let v = v.to_lowercase();
        let mapped = VARIANTS
            .iter()
            .find(|(k, _)| *k == v)
            .map_or(v.clone(), |(_, t)| t.to_string());
        out.push(mapped);
    }
    out.join("-")
}

/// True for `en`, `en-GB`, `en@shaw`, ... (every English variant is excluded).
pub fn is_english(code: &str) -> bool {
    let lower = code.to_ascii_lowercase();
    lower == "en" || (lower.starts_with("en") && matches!(lower.as_bytes()[2], b'-' | b'_' | b'@'))
}

/// The corpus language tag of a catalog locale, or `None` for English variants and
/// pseudo-locales.
pub fn canon_lang(raw: &str) -> Option<String> {
    let code = norm_locale(raw);
    let lower = code.to_lowercase();
    if is_english(&code) || SKIP.contains(&lower.as_str()) {
        return None;
    }
    let mut parts = code.split('-');
    let mut base = parts.next().unwrap_or("").to_string();
    let rest: Vec<&str> = parts.collect();
    if base == "no" {
        base = "nb".into();
    }
    if base == "racv" {
        return Some("ca-valencia".into());
    }
    if base == "zh" {
        let trad = rest.iter().any(|p| ["TW", "HK", "MO", "Hant"].contains(p));
        return Some(if trad { "zh-Hant" } else { "zh-Hans" }.into());
    }
    let is_script = |p: &&str| p.len() == 4 && p.starts_with(|c: char| c.is_uppercase());
    let mut scripts: Vec<&str> = rest.iter().copied().filter(is_script).collect();
    scripts.extend(
        rest.iter()
            .copied()
            .filter(|p| *p == "valencia" || *p == "ijekavsk"),
    );
    let regions: Vec<&str> = rest
        .iter()
        .copied()
        .filter(|p| {
            (p.chars().count() == 2
                && p.chars().any(char::is_uppercase)
                && !p.chars().any(char::is_lowercase))
                || (!p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
        })
        .collect();
    let keep_region = if base == "pt" && regions.contains(&"BR") {
        Some("BR")
    } else if base == "es" && regions.first().is_some_and(|r| *r != "ES") {
        Some("419")
    } else if base == "fr" && regions.contains(&"CA") {
        Some("CA")
    } else {
        None
    };
    let default = DEFAULT_SCRIPT
        .iter()
        .find(|(b, _)| *b == base)
        .map(|(_, s)| *s);
    scripts.retain(|s| *s != "ijekavsk" && Some(*s) != default);
    let mut out = vec![base.as_str()];
    out.extend(scripts.first());
    out.extend(keep_region);
    Some(out.join("-"))
}
