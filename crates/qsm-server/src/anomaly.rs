//! Telling a suspect backup from a filespace's usual ones (issue 30): ransomware that
//! encrypts a client's files makes its next backup change far more files than usual, with
//! data that no longer compresses or deduplicates. The server counts these figures itself,
//! from the versions and frames it receives ([`BackupStats`]): what a client claims of its
//! run (whole or partial, its warnings) does not enter them.
//!
//! The rules, against the filespace's last [`KEEP`] whole backups not found suspect
//! (the baseline; at least [`MIN_BASELINE`] of them, else nothing is judged), for a backup
//! of a filespace of at least [`MIN_FILES`] entries that stored at least [`MIN_CHANGED`]:
//! - **changed**: the share of the filespace's entries the backup stored is at least 30%,
//!   and at least three times the baseline's median share plus 10 points;
//! - **incompressible**: its new data stored at 90% or more of its size, where the
//!   baseline's (all its new data together, at least 1 MiB) stored at 75% or less;
//! - **undeduplicated**: for a node that deduplicates, at most a third of the baseline's
//!   median share of chunks found already stored, where that share was at least half.
//!
//! A backup is suspect when it changed that much and its data also turned incompressible or
//! undeduplicated. Where neither signal can speak (data that never compressed, such as
//! photos, on a node without deduplication), changing at least 90% of the entries where the
//! baseline changed at most 10% is suspect alone. A selective backup that sends unchanged
//! files again, a tree re-encoded with data that still compresses, are not.

use qsm_catalog::BackupStats;

/// Whole backups remembered per filespace.
pub const KEEP: usize = 30;
/// Backups a baseline needs before any is judged.
pub const MIN_BASELINE: usize = 3;
/// New data a compression figure needs to mean anything.
const MIN_RAW: u64 = 1 << 20;
/// Entries a filespace needs before its backups are judged: in a handful of files, one
/// rewritten is a large share.
pub const MIN_FILES: u64 = 20;
/// Versions a backup must store to be judged.
pub const MIN_CHANGED: u64 = 10;

fn fraction(s: &BackupStats) -> Option<f64> {
    (s.files > 0).then(|| s.changed.min(s.files) as f64 / s.files as f64)
}

fn dedup_share(s: &BackupStats) -> Option<f64> {
    let all = s.chunks + s.refs;
    (all > 0).then(|| s.refs as f64 / all as f64)
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    Some(v[v.len() / 2])
}

/// A share as said to an administrator: whole percents, a decimal below ten ("0.4%").
fn percent(v: f64) -> String {
    if v < 0.1 { format!("{:.1}%", v * 100.0) } else { format!("{:.0}%", v * 100.0) }
}

/// Why `run` is suspect against `history` (the filespace's earlier backups, any order), or
/// `None` when it looks like the others or there are too few to tell.
pub fn judge(history: &[BackupStats], run: &BackupStats) -> Option<String> {
    let base: Vec<&BackupStats> = history.iter().filter(|s| !s.suspect).collect();
    if base.len() < MIN_BASELINE || run.files < MIN_FILES || run.changed < MIN_CHANGED {
        return None;
    }
    let changed = fraction(run)?;
    let usual = median(base.iter().filter_map(|s| fraction(s)).collect())?;
    let many = changed >= 0.3 && changed >= 3.0 * usual + 0.1;
    if !many {
        return None;
    }
    let mut why = vec![format!(
        "{} of its {} entries changed where {} is usual",
        percent(changed),
        run.files,
        percent(usual)
    )];
    let (raw, stored) =
        base.iter().fold((0u64, 0u64), |(r, s), b| (r + b.raw_bytes, s + b.stored_bytes));
    let usual_ratio = (raw >= MIN_RAW).then(|| stored as f64 / raw as f64);
    let ratio = (run.raw_bytes >= MIN_RAW).then(|| run.stored_bytes as f64 / run.raw_bytes as f64);
    let compression_speaks = ratio.is_some() && usual_ratio.is_some_and(|u| u <= 0.75);
    let incompressible = match (ratio, usual_ratio) {
        (Some(r), Some(u)) if compression_speaks && r >= 0.9 => {
            why.push(format!(
                "its new data stored at {} of its size where {} is usual",
                percent(r),
                percent(u)
            ));
            true
        }
        _ => false,
    };
    let usual_dedup = median(base.iter().filter_map(|s| dedup_share(s)).collect());
    let dedup_speaks = dedup_share(run).is_some() && usual_dedup.is_some_and(|u| u >= 0.5);
    let undeduplicated = match (dedup_share(run), usual_dedup) {
        (Some(d), Some(u)) if dedup_speaks && d <= u / 3.0 => {
            why.push(format!(
                "{} of its chunks were stored already where {} is usual",
                percent(d),
                percent(u)
            ));
            true
        }
        _ => false,
    };
    let nearly_all = changed >= 0.9 && usual <= 0.1 && !compression_speaks && !dedup_speaks;
    (incompressible || undeduplicated || nearly_all).then(|| why.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MB: u64 = 1 << 20;

    fn run(files: u64, changed: u64, raw: u64, stored: u64) -> BackupStats {
        BackupStats {
            files,
            changed,
            raw_bytes: raw,
            stored_bytes: stored,
            chunks: changed,
            ..Default::default()
        }
    }

    /// A first full backup, then small edits of text that compresses to a third.
    fn usual() -> Vec<BackupStats> {
        let mut h = vec![run(1000, 1000, 100 * MB, 33 * MB)];
        for k in 0..9 {
            h.push(run(1000, 10 + k, 2 * MB, MB * 2 / 3));
        }
        h
    }

    #[test]
    fn small_edits_are_usual_and_encrypted_files_are_suspect() {
        let h = usual();
        for k in 1..h.len() {
            assert_eq!(judge(&h[..k], &h[k]), None, "run {k}");
        }
        // Ransomware: 80% of the files rewritten with random data.
        let why = judge(&h, &run(1000, 800, 80 * MB, 81 * MB)).expect("suspect");
        assert!(why.contains("80% of its 1000 entries changed where 1.5% is usual"), "{why}");
        assert!(why.contains("stored at 101% of its size where 33% is usual"), "{why}");
        // The same number of files changed with data that compresses as before: a big
        // reorganisation, not an attack; so is every file sent again by a selective backup.
        assert_eq!(judge(&h, &run(1000, 800, 80 * MB, 27 * MB)), None);
        assert_eq!(judge(&h, &run(1000, 1000, 100 * MB, 33 * MB)), None);
        // Too small a filespace, or too few files stored, to tell.
        let small: Vec<BackupStats> = (0..5).map(|_| run(2, 1, 4 * MB, MB)).collect();
        assert_eq!(judge(&small, &run(2, 2, 8 * MB, 8 * MB)), None);
        assert_eq!(judge(&h, &run(1000, 9, 9 * MB, 9 * MB)), None);
    }

    #[test]
    fn too_short_a_history_judges_nothing_and_suspect_runs_are_not_the_baseline() {
        let h = usual();
        let attack = run(1000, 950, 95 * MB, 96 * MB);
        assert_eq!(judge(&h[..2], &attack), None);
        let mut flagged: Vec<BackupStats> = h[..2].to_vec();
        flagged.extend(std::iter::repeat_n(BackupStats { suspect: true, ..attack }, 5));
        assert_eq!(judge(&flagged, &attack), None, "two usual runs are still too few");
        flagged.push(h[2]);
        assert!(judge(&flagged, &attack).is_some(), "the suspect runs do not make it usual");
    }

    #[test]
    fn incompressible_data_is_judged_by_the_share_of_files_and_by_dedup() {
        // Photos: they never compressed. Nearly all of them rewritten is suspect alone.
        let mut h = vec![run(500, 500, 500 * MB, 500 * MB)];
        h.extend((0..5).map(|_| run(500, 5, 5 * MB, 5 * MB)));
        assert!(judge(&h, &run(500, 480, 480 * MB, 480 * MB)).is_some());
        assert_eq!(judge(&h, &run(500, 200, 200 * MB, 200 * MB)), None, "40% alone is not");
        // With deduplication: most chunks of a changed file were stored already, until
        // every chunk is new.
        let dedup = |changed: u64, chunks: u64, refs: u64| BackupStats {
            chunks,
            refs,
            ..run(500, changed, 5 * MB, 5 * MB)
        };
        let h: Vec<BackupStats> = (0..5).map(|_| dedup(25, 10, 90)).collect();
        let why = judge(&h, &dedup(200, 1000, 10)).expect("suspect");
        assert!(why.contains("1.0% of its chunks were stored already where 90% is usual"), "{why}");
        assert_eq!(judge(&h, &dedup(200, 100, 900)), None);
        // Where deduplication speaks, nearly every file changed is not suspect alone.
        assert_eq!(judge(&h, &dedup(480, 100, 900)), None);
    }
}
