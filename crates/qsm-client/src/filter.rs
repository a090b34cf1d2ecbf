//! Include and exclude patterns: which entries a backup or archive takes.
//!
//! A pattern is a glob (`*` and `?` stop at `/`, `**` crosses it, `[a-z]`, `{a,b}`), read the
//! way `.gitignore` reads them, because that is what users already know:
//! - without a `/`, it matches an entry's name at any depth (`*.o`, `.cache`);
//! - starting with `/`, it matches the entry's absolute path (`/home/*/.cache`), so one list in
//!   `client.toml` serves every root;
//! - any other pattern with a `/` is anchored at the root being backed up (`build/out`);
//! - a trailing `/` matches directories only (`target/`).
//!
//! An excluded directory is not entered. When includes are given, only entries matching one,
//! or below a directory matching one, are taken; directories are still walked (and recorded,
//! so a restore gets their metadata) to find them. An exclude beats an include.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use globset::{Candidate, GlobBuilder, GlobSet, GlobSetBuilder};

use crate::error::{ClientError, Result};

/// Compiled include and exclude lists.
#[derive(Debug, Clone, Default)]
pub struct Filter {
    include: Rules,
    exclude: Rules,
    /// The patterns as given, sorted: what [`Filter::fingerprint`] names.
    patterns: (Vec<String>, Vec<String>),
}

/// What the filter says about one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Not taken; a directory is not entered.
    Excluded,
    /// Taken, and so is everything below it that is not excluded.
    Included,
    /// Includes are given and this entry matches none: a directory is still walked and
    /// recorded, anything else is skipped.
    Unmatched,
}

/// One list: patterns on relative paths, on absolute paths, and the directory-only ones.
#[derive(Debug, Clone, Default)]
struct Rules {
    relative: GlobSet,
    absolute: GlobSet,
    relative_dirs: GlobSet,
    absolute_dirs: GlobSet,
    any: bool,
}

impl Filter {
    /// Compiles the patterns; a malformed one is named in the error.
    pub fn new(include: &[String], exclude: &[String]) -> Result<Filter> {
        let sorted = |list: &[String]| {
            let mut list = list.to_vec();
            list.sort();
            list.dedup();
            list
        };
        Ok(Filter {
            include: Rules::new(include, "include")?,
            exclude: Rules::new(exclude, "exclude")?,
            patterns: (sorted(include), sorted(exclude)),
        })
    }

    /// Names the set of patterns (order and repeats aside): two filters with one fingerprint
    /// take the same entries. The change journal keeps it with a consumed backup, so changes
    /// an exclude skipped are not taken as done by a backup without it.
    pub fn fingerprint(&self) -> String {
        let mut text = String::new();
        for (tag, list) in [("i", &self.patterns.0), ("e", &self.patterns.1)] {
            for p in list {
                text.push_str(tag);
                text.push_str(&p.len().to_string());
                text.push(':');
                text.push_str(p);
            }
        }
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
    }

    /// Whether the filter can skip anything at all.
    pub fn is_empty(&self) -> bool {
        !self.include.any && !self.exclude.any
    }

    /// The verdict on an entry at `rel` (relative to the root, `/`-separated) and `abs`, given
    /// whether it is a directory and whether its parent directory was included.
    pub fn verdict(&self, rel: &[u8], abs: &Path, is_dir: bool, parent_included: bool) -> Verdict {
        if self.is_empty() {
            return Verdict::Included;
        }
        let rel = Candidate::new(Path::new(std::ffi::OsStr::from_bytes(rel)));
        let abs = Candidate::new(abs);
        if self.exclude.matches(&rel, &abs, is_dir) {
            Verdict::Excluded
        } else if !self.include.any || parent_included || self.include.matches(&rel, &abs, is_dir) {
            Verdict::Included
        } else {
            Verdict::Unmatched
        }
    }
}

impl Rules {
    fn new(patterns: &[String], what: &str) -> Result<Rules> {
        let mut sets = [(); 4].map(|()| GlobSetBuilder::new());
        for pattern in patterns {
            let bad =
                |why: String| ClientError::Usage(format!("{what} pattern {pattern:?}: {why}"));
            let body = pattern.trim_end_matches('/');
            let dirs_only = body.len() < pattern.len();
            if body.is_empty() {
                return Err(bad("empty".into()));
            }
            let (glob, absolute) = if body.starts_with('/') {
                (body.to_owned(), true)
            } else if body.contains('/') {
                (body.to_owned(), false)
            } else {
                (format!("**/{body}"), false)
            };
            let glob = GlobBuilder::new(&glob)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| bad(e.kind().to_string()))?;
            sets[usize::from(absolute) + 2 * usize::from(dirs_only)].add(glob);
        }
        let [relative, absolute, relative_dirs, absolute_dirs] = sets
            .map(|b| b.build().map_err(|e| ClientError::Usage(format!("{what} patterns: {e}"))));
        Ok(Rules {
            relative: relative?,
            absolute: absolute?,
            relative_dirs: relative_dirs?,
            absolute_dirs: absolute_dirs?,
            any: !patterns.is_empty(),
        })
    }

    fn matches(&self, rel: &Candidate<'_>, abs: &Candidate<'_>, is_dir: bool) -> bool {
        self.any
            && (self.relative.is_match_candidate(rel)
                || self.absolute.is_match_candidate(abs)
                || (is_dir
                    && (self.relative_dirs.is_match_candidate(rel)
                        || self.absolute_dirs.is_match_candidate(abs))))
    }
}

/// Management-class bindings (TSM's `include PATTERN CLASS`): files matching a pattern are
/// bound to a class of the node's policy domain instead of its default. Patterns read as
/// include patterns do; when several match, the last one wins, as TSM reads its include
/// statements from the bottom up.
#[derive(Debug, Clone, Default)]
pub struct Bindings {
    list: Vec<(Rules, String)>,
}

impl Bindings {
    /// Compiles `PATTERN=CLASS` specifications; a malformed one is named in the error.
    pub fn new(specs: &[String]) -> Result<Bindings> {
        let mut list = Vec::new();
        for spec in specs {
            let (pattern, class) = spec
                .rsplit_once('=')
                .filter(|(p, c)| !p.is_empty() && !c.trim().is_empty())
                .ok_or_else(|| {
                    ClientError::Usage(format!(
                        "management-class binding {spec:?}: write PATTERN=CLASS"
                    ))
                })?;
            list.push((Rules::new(&[pattern.to_owned()], "binding")?, class.trim().to_owned()));
        }
        Ok(Bindings { list })
    }

    /// The class `rel` (at `abs`) is bound to, if a binding matches it.
    pub fn class_of(&self, rel: &[u8], abs: &Path, is_dir: bool) -> Option<&str> {
        if self.list.is_empty() {
            return None;
        }
        let rel = Candidate::new(Path::new(std::ffi::OsStr::from_bytes(rel)));
        let abs = Candidate::new(abs);
        self.list.iter().rev().find(|(r, _)| r.matches(&rel, &abs, is_dir)).map(|(_, c)| c.as_str())
    }

    /// Drops the bindings to classes not in `known`, and returns those classes.
    pub fn keep_known(&mut self, known: &[String]) -> Vec<String> {
        let mut unknown: Vec<String> = Vec::new();
        self.list.retain(|(_, c)| {
            let ok = known.contains(c);
            if !ok && !unknown.contains(c) {
                unknown.push(c.clone());
            }
            ok
        });
        unknown
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(f: &Filter, rel: &str, is_dir: bool, parent: bool) -> Verdict {
        let abs = Path::new("/root").join(rel);
        f.verdict(rel.as_bytes(), &abs, is_dir, parent)
    }

    fn strings(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn names_match_at_any_depth_and_slashes_anchor() {
        let f = Filter::new(&[], &strings(&["*.o", "build/out", "/root/abs", "cache/"])).unwrap();
        assert_eq!(v(&f, "a.o", false, true), Verdict::Excluded);
        assert_eq!(v(&f, "x/y/a.o", false, true), Verdict::Excluded);
        assert_eq!(v(&f, "a.oo", false, true), Verdict::Included);
        assert_eq!(v(&f, "build/out", true, true), Verdict::Excluded);
        assert_eq!(v(&f, "x/build/out", true, true), Verdict::Included, "anchored at the root");
        assert_eq!(v(&f, "abs", false, true), Verdict::Excluded, "absolute path");
        assert_eq!(v(&f, "x/abs", false, true), Verdict::Included);
        assert_eq!(v(&f, "x/cache", true, true), Verdict::Excluded);
        assert_eq!(v(&f, "x/cache", false, true), Verdict::Included, "directories only");
    }

    #[test]
    fn includes_select_and_excludes_win() {
        let f = Filter::new(&strings(&["*.rs", "docs"]), &strings(&["secret.rs"])).unwrap();
        assert_eq!(v(&f, "src/main.rs", false, false), Verdict::Included);
        assert_eq!(v(&f, "src/main.c", false, false), Verdict::Unmatched);
        assert_eq!(v(&f, "src", true, false), Verdict::Unmatched);
        assert_eq!(v(&f, "docs", true, false), Verdict::Included);
        assert_eq!(v(&f, "docs/a.txt", false, true), Verdict::Included, "below an included dir");
        assert_eq!(v(&f, "src/secret.rs", false, false), Verdict::Excluded);
        assert_eq!(v(&f, "docs/secret.rs", false, true), Verdict::Excluded);
    }

    #[test]
    fn star_does_not_cross_directories_but_double_star_does() {
        let f = Filter::new(&[], &strings(&["a/*.tmp", "b/**/*.tmp"])).unwrap();
        assert_eq!(v(&f, "a/x.tmp", false, true), Verdict::Excluded);
        assert_eq!(v(&f, "a/d/x.tmp", false, true), Verdict::Included);
        assert_eq!(v(&f, "b/x.tmp", false, true), Verdict::Excluded);
        assert_eq!(v(&f, "b/d/e/x.tmp", false, true), Verdict::Excluded);
    }

    #[test]
    fn malformed_and_empty_patterns_are_named() {
        let e = Filter::new(&[], &strings(&["a[b"])).unwrap_err().to_string();
        assert!(e.contains("exclude pattern \"a[b\""), "{e}");
        let e = Filter::new(&strings(&["/"]), &[]).unwrap_err().to_string();
        assert!(e.contains("include pattern \"/\": empty"), "{e}");
        assert!(Filter::new(&[], &[]).unwrap().is_empty());
    }

    #[test]
    fn bindings_take_the_last_match_and_name_bad_ones() {
        let b = Bindings::new(&strings(&["*.db=databases", "/root/logs/**=short", "x.db=one"]))
            .unwrap();
        let class = |rel: &str| b.class_of(rel.as_bytes(), &Path::new("/root").join(rel), false);
        assert_eq!(class("a/b.db"), Some("databases"));
        assert_eq!(class("x.db"), Some("one"), "the last match wins");
        assert_eq!(class("logs/today"), Some("short"));
        assert_eq!(class("a.txt"), None);
        let e = Bindings::new(&strings(&["*.db"])).unwrap_err().to_string();
        assert!(e.contains("PATTERN=CLASS"), "{e}");
        let mut b = b;
        assert_eq!(b.keep_known(&strings(&["databases", "short"])), ["one"]);
        assert_eq!(b.class_of(b"x.db", Path::new("/root/x.db"), false), Some("databases"));
    }
}
