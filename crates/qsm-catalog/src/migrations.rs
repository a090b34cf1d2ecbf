//! Numbered schema migrations. Each is applied once, in order, in one transaction with the
//! update of `qsm_schema`; never edit a released migration, add a new one.
//!
//! The SQL is the portable subset shared with PostgreSQL (the later implementation applies
//! the same numbered steps): `BIGINT`, `BLOB`/`BYTEA` as named per backend by
//! [`Dialect`], partial indexes, no SQLite-only syntax beyond what `Dialect` substitutes.

/// The SQL spelling differences between the backends.
#[derive(Debug, Clone, Copy)]
pub enum Dialect {
    /// SQLite.
    Sqlite,
}

impl Dialect {
    fn substitute(self, sql: &str) -> String {
        match self {
            // AUTOINCREMENT: ids are never reused. Plain rowids restart at the largest id
            // after a delete, so an expired object's or chunk's id would come back naming other
            // data (the kill -9 test caught it). PostgreSQL's identity columns never reuse
            // either: `BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY`.
            Dialect::Sqlite => {
                sql.replace("{ID}", "INTEGER PRIMARY KEY AUTOINCREMENT").replace("{BYTES}", "BLOB")
            }
        }
    }
}

/// Migration `n` is `MIGRATIONS[n - 1]`; the schema version is the number applied.
const MIGRATIONS: &[&str] = &[
    // 1: the initial schema.
    r#"
CREATE TABLE domains (
    id {ID},
    name TEXT NOT NULL UNIQUE,
    description TEXT NOT NULL
);
CREATE TABLE mgmt_classes (
    id {ID},
    domain_id BIGINT NOT NULL REFERENCES domains(id),
    name TEXT NOT NULL,
    UNIQUE (domain_id, name)
);
CREATE TABLE backup_copygroups (
    mgmt_class_id BIGINT PRIMARY KEY REFERENCES mgmt_classes(id),
    versions_exist BIGINT NOT NULL CHECK (versions_exist >= 1),
    versions_deleted BIGINT NOT NULL CHECK (versions_deleted >= 0),
    retain_extra_days BIGINT NOT NULL CHECK (retain_extra_days >= 0),
    retain_only_days BIGINT NOT NULL CHECK (retain_only_days >= 0)
);
CREATE TABLE archive_copygroups (
    mgmt_class_id BIGINT PRIMARY KEY REFERENCES mgmt_classes(id),
    retain_version_days BIGINT NOT NULL CHECK (retain_version_days >= 0)
);
CREATE TABLE nodes (
    id {ID},
    name TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    domain_id BIGINT NOT NULL REFERENCES domains(id),
    locked BIGINT NOT NULL DEFAULT 0,
    registered BIGINT NOT NULL
);
CREATE TABLE filespaces (
    id {ID},
    node_id BIGINT NOT NULL REFERENCES nodes(id),
    name TEXT NOT NULL,
    created BIGINT NOT NULL,
    UNIQUE (node_id, name)
);
CREATE TABLE storage_pools (
    id {ID},
    name TEXT NOT NULL UNIQUE,
    kind TEXT NOT NULL,
    location TEXT NOT NULL
);
CREATE TABLE containers (
    id BIGINT PRIMARY KEY,
    pool_id BIGINT NOT NULL REFERENCES storage_pools(id),
    size BIGINT NOT NULL,
    sealed BIGINT NOT NULL DEFAULT 0
);
-- One row per stored frame. `hash` is the keyed chunk id of deduplication (NULL without).
CREATE TABLE chunks (
    id {ID},
    container_id BIGINT NOT NULL REFERENCES containers(id),
    frame_offset BIGINT NOT NULL,
    stored_len BIGINT NOT NULL,
    raw_len BIGINT NOT NULL,
    codec BIGINT NOT NULL,
    refcount BIGINT NOT NULL CHECK (refcount >= 0),
    hash {BYTES}
);
CREATE INDEX chunks_by_container ON chunks (container_id, frame_offset);
CREATE UNIQUE INDEX chunks_by_hash ON chunks (hash) WHERE hash IS NOT NULL;
-- state: 1 = active backup, 0 = inactive backup, 2 = archive. Two disjoint partial indexes
-- put each row's path in exactly one index (the catalog's size is mostly paths): the unique
-- one serves the active inventory in path order and enforces one active version per path;
-- the other finds inactive versions and archives. Queries must repeat the index's condition
-- literally (`state = 1`, `state <> 1`) for SQLite to use it.
CREATE TABLE objects (
    id {ID},
    filespace_id BIGINT NOT NULL REFERENCES filespaces(id),
    state BIGINT NOT NULL,
    path {BYTES} NOT NULL,
    object_type BIGINT NOT NULL,
    size BIGINT NOT NULL,
    mtime_ns BIGINT NOT NULL,
    ctime_ns BIGINT NOT NULL,
    mode BIGINT NOT NULL,
    uid BIGINT NOT NULL,
    gid BIGINT NOT NULL,
    inserted BIGINT NOT NULL,
    deactivated BIGINT,
    mgmt_class_id BIGINT REFERENCES mgmt_classes(id),
    description TEXT,
    retain_until BIGINT,
    link_target {BYTES},
    chunk_list {BYTES} NOT NULL
);
CREATE UNIQUE INDEX objects_active ON objects (filespace_id, path) WHERE state = 1;
CREATE INDEX objects_inactive ON objects (filespace_id, path, state) WHERE state <> 1;
CREATE TABLE sessions (
    id {ID},
    node_id BIGINT NOT NULL REFERENCES nodes(id),
    started BIGINT NOT NULL,
    ended BIGINT,
    bytes BIGINT NOT NULL DEFAULT 0,
    objects BIGINT NOT NULL DEFAULT 0,
    state TEXT NOT NULL
);
CREATE TABLE processes (
    id {ID},
    kind TEXT NOT NULL,
    started BIGINT NOT NULL,
    ended BIGINT,
    state TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE TABLE activity_log (
    id {ID},
    time BIGINT NOT NULL,
    severity BIGINT NOT NULL,
    message TEXT NOT NULL,
    node_id BIGINT,
    session_id BIGINT,
    process_id BIGINT
);
CREATE INDEX activity_by_time ON activity_log (time);
"#,
    // 2: administrator accounts, apart from nodes: an administrator owns no data and a node
    // administers nothing.
    r#"
CREATE TABLE admins (
    id {ID},
    name TEXT NOT NULL UNIQUE,
    password_hash TEXT NOT NULL,
    locked BIGINT NOT NULL DEFAULT 0,
    registered BIGINT NOT NULL
);
"#,
    // 3: the inode number, one of the attributes an incremental backup compares (a file
    // replaced by another of the same size and times is still a different file). 0 for
    // versions stored before it was recorded: unknown, never compared.
    r#"
ALTER TABLE objects ADD COLUMN ino BIGINT NOT NULL DEFAULT 0;
"#,
    // 4: deduplication and client-side encryption (issue 6). A chunk's `hash` is its keyed id
    // (BLAKE3 keyed by the node's secret); it is shared, and unique, only within its dedup
    // `scope` (NULL: the chunk is not offered for deduplication, e.g. an encrypted chunk of a
    // node with dedup off, whose id is kept for restore to check) and its kind: `sealed` chunks
    // and plaintext ones never stand in for each other, so no node of a scope can plant an
    // encrypted frame (which the server cannot check) under a plaintext chunk's id. A node deduplicates in its
    // own scope unless an administrator puts nodes in one. `key_file` is the server's copy of
    // the node's passphrase-wrapped key, which the server cannot open. `dedup_epoch` rises
    // whenever chunks may have gone, so clients drop their caches of what the server has.
    r#"
DROP INDEX chunks_by_hash;
ALTER TABLE chunks ADD COLUMN scope BIGINT;
ALTER TABLE chunks ADD COLUMN sealed BIGINT NOT NULL DEFAULT 0;
CREATE UNIQUE INDEX chunks_by_scope_hash ON chunks (scope, sealed, hash) WHERE scope IS NOT NULL;
CREATE TABLE dedup_scopes (
    id {ID},
    name TEXT NOT NULL UNIQUE,
    secret {BYTES} NOT NULL
);
ALTER TABLE nodes ADD COLUMN dedup_scope BIGINT REFERENCES dedup_scopes(id);
ALTER TABLE nodes ADD COLUMN key_file {BYTES};
CREATE TABLE catalog_state (
    name TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO catalog_state (name, value) VALUES ('dedup_epoch', 0);
"#,
    // 5: maintenance (issue 7). `damaged` marks a chunk an audit found unreadable or corrupt
    // (it is no longer offered for deduplication, and the next copy of its data stored
    // replaces it) and an object with such a chunk (it leaves the active inventory a client
    // compares with, so the next incremental backup sends the file again). Administrators
    // get privilege classes; those registered before them keep the power they had: system.
    r#"
ALTER TABLE chunks ADD COLUMN damaged BIGINT NOT NULL DEFAULT 0;
ALTER TABLE objects ADD COLUMN damaged BIGINT NOT NULL DEFAULT 0;
ALTER TABLE admins ADD COLUMN privileges TEXT NOT NULL DEFAULT 'system';
"#,
    // 6: journal-based incremental backup (issue 7). A filespace's `generation` takes a new
    // random value whenever its active inventory changes (a version becomes or stops being
    // active, or is marked damaged): a client's change journal is a valid substitute for a
    // full scan only if the inventory is still the one its last backup left.
    r#"
ALTER TABLE filespaces ADD COLUMN generation BIGINT NOT NULL DEFAULT 0;
"#,
];

/// The newest schema version this program knows.
pub const LATEST: u32 = MIGRATIONS.len() as u32;

/// The SQL of migration `version` (1-based) in `dialect`.
pub fn sql(version: u32, dialect: Dialect) -> Option<String> {
    let i = usize::try_from(version).ok()?.checked_sub(1)?;
    MIGRATIONS.get(i).map(|m| dialect.substitute(m))
}
