//! The SQLite catalog: the shared conformance suite, migrations, and bad files.
#![allow(clippy::unwrap_used)] // test helpers outside #[test] functions

use std::path::Path;

use qsm_catalog::migrations::LATEST;
use qsm_catalog::{Catalog, CatalogError, SqliteCatalog, conformance};
use tempfile::TempDir;

#[test]
fn passes_the_conformance_suite() {
    let dir = TempDir::new().unwrap();
    let counter = std::cell::Cell::new(0);
    let failures = conformance::run_all(&|| {
        counter.set(counter.get() + 1);
        let path = dir.path().join(format!("case{}.db", counter.get()));
        Box::new(SqliteCatalog::open(&path).unwrap()) as Box<dyn Catalog>
    });
    assert!(failures.is_empty(), "{failures:#?}");
    assert_eq!(counter.get(), conformance::CASES.len());
}

#[test]
fn migrates_from_every_earlier_version() {
    for from in 0..LATEST {
        let dir = TempDir::new().unwrap();
        let path = dir.path().join("catalog.db");
        let old = SqliteCatalog::open_at(&path, from).unwrap();
        assert_eq!(old.schema_version().unwrap(), from);
        drop(old);
        let cat = SqliteCatalog::open(&path).unwrap();
        assert_eq!(cat.schema_version().unwrap(), LATEST);
        // A migrated catalog is a working one.
        let failures = conformance::policy(&cat);
        assert!(failures.is_ok(), "from version {from}: {failures:?}");
    }
}

#[test]
fn reopening_keeps_everything() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("catalog.db");
    {
        let cat = SqliteCatalog::open(&path).unwrap();
        let d = cat.define_domain("standard", "").unwrap();
        cat.register_node("alpha", "h", d).unwrap();
    }
    let cat = SqliteCatalog::open(&path).unwrap();
    assert!(cat.node("alpha").unwrap().is_some());
}

fn open_err(path: &Path) -> CatalogError {
    match SqliteCatalog::open(path) {
        Ok(_) => panic!("{} opened", path.display()),
        Err(e) => e,
    }
}

#[test]
fn a_file_that_is_not_a_database_is_a_clear_error() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("catalog.db");
    std::fs::write(&path, vec![0x42u8; 8192]).unwrap();
    let err = open_err(&path);
    assert!(matches!(err, CatalogError::NotADatabase { .. }), "{err:?}");
    assert!(err.to_string().contains("catalog.db"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), vec![0x42u8; 8192], "the file was modified");
}

#[test]
fn another_programs_database_is_refused() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("other.db");
    drop(foreign_database(&path));
    let err = open_err(&path);
    assert!(err.to_string().contains("qsm_schema"), "{err}");
}

/// An SQLite database of some other program: one unrelated table, no `qsm_schema`.
fn foreign_database(path: &Path) -> SqliteCatalog {
    let cat = SqliteCatalog::open_at(path, 0).unwrap();
    cat.raw_execute_for_tests("CREATE TABLE photos (id INTEGER PRIMARY KEY)").unwrap();
    cat
}

#[test]
fn a_newer_catalog_is_refused() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("catalog.db");
    let cat = SqliteCatalog::open(&path).unwrap();
    cat.raw_execute_for_tests(&format!("UPDATE qsm_schema SET version = {}", LATEST + 1)).unwrap();
    drop(cat);
    let err = open_err(&path);
    assert!(matches!(err, CatalogError::TooNew { found, .. } if found == LATEST + 1), "{err:?}");
    assert!(err.to_string().contains("upgrade qsm"), "{err}");
}
