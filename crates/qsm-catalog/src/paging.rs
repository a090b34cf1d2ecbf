//! Keyset paging of the full version listing ([`crate::Catalog::for_each_version`]) by whole
//! paths, as both backends read it (issue 23): a restore or `qsm query backup --inactive | less`
//! must not hold a read snapshot while its caller dawdles (on SQLite it stops WAL checkpoints,
//! on PostgreSQL it holds back vacuum), so the listing is read a page at a time, each page in
//! a short read transaction of its own, and the caller sees a page only once it is read.
//!
//! No index covers every state in the listing's order (path, then newest first): the schema
//! has two partial indexes, `objects_active` (filespace, path) for the active version of each
//! path and `objects_inactive` (filespace, path, state) for the others. A page reads up to
//! [`VERSION_ARM`] rows along each, in path order after the previous page's last path, and
//! ends at the smaller of the last paths of the arms that filled up (before it, each arm has
//! read everything); if the inactive arm filled up at that very path, it may have stopped
//! inside it, and that path's inactive versions are read whole. So a page costs two bounded
//! index range scans and a sort of at most a page in memory, never a sort of the filespace;
//! and a page holds whole paths, each read on one snapshot, once, whatever commits interleave
//! between pages.

use crate::Result;
use crate::model::ObjectVersion;

/// Rows read from each of the two indexes per page: a page holds at most twice this, plus
/// the rest of one path's inactive versions. Small enough that a page is a short read
/// transaction and a bounded amount of memory, large enough that the two index seeks a page
/// starts with are noise (`catalog_bench` times the whole listing).
pub(crate) const VERSION_ARM: usize = 5_000;

/// Where a page read as `active` and `inactive` (each up to [`VERSION_ARM`] rows in path
/// order) ends: both are cut to the paths up to the page's last path, which is returned
/// (`None`: they hold everything left, the last page), with whether the inactive versions of
/// that last path must be read again, whole (they were dropped from `inactive`).
pub(crate) fn cut(
    active: &mut Vec<ObjectVersion>,
    inactive: &mut Vec<ObjectVersion>,
) -> (Option<Vec<u8>>, bool) {
    // An arm that did not fill up has read everything after the previous page; one that
    // did knows its index only up to its last path.
    let end = |rows: &[ObjectVersion]| {
        (rows.len() == VERSION_ARM).then(|| rows.last().map(|v| v.path.clone())).flatten()
    };
    let (active_end, inactive_end) = (end(active), end(inactive));
    let last = match (active_end, inactive_end.clone()) {
        (None, None) => return (None, false),
        (Some(end), None) | (None, Some(end)) => end,
        (Some(a), Some(i)) => a.min(i),
    };
    active.retain(|v| v.path <= last);
    let reread = inactive_end.as_ref() == Some(&last);
    if reread {
        inactive.retain(|v| v.path < last);
    } else {
        inactive.retain(|v| v.path <= last);
    }
    (Some(last), reread)
}

/// The page's rows in the listing's order: path, then newest first (inserted, then id).
pub(crate) fn sorted(
    mut active: Vec<ObjectVersion>,
    inactive: Vec<ObjectVersion>,
) -> Vec<ObjectVersion> {
    active.extend(inactive);
    active.sort_by(|a, b| {
        a.path.cmp(&b.path).then(b.inserted.cmp(&a.inserted)).then(b.id.0.cmp(&a.id.0))
    });
    active
}

/// Visits every page `page(after)` returns (rows, and the last path of the page, `None` for
/// the last page), starting after nothing; `visit` runs between pages, with no read open.
pub(crate) fn for_each_in_pages(
    mut page: impl FnMut(Option<&[u8]>) -> Result<(Vec<ObjectVersion>, Option<Vec<u8>>)>,
    visit: &mut dyn FnMut(&ObjectVersion) -> Result<()>,
) -> Result<()> {
    let mut after: Option<Vec<u8>> = None;
    loop {
        let (rows, last) = page(after.as_deref())?;
        for v in &rows {
            visit(v)?;
        }
        match last {
            Some(path) => after = Some(path),
            None => return Ok(()),
        }
    }
}
