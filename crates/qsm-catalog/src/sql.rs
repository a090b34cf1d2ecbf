//! SQL written once for both backends: statements with `?N` placeholders (PostgreSQL's
//! backend rewrites them `$N`), run through the small interface each backend provides
//! ([`Backend`]: connections and transactions; [`Sql`]: statements on one connection). The
//! whole [`crate::Catalog`] is written this way ([`crate::imp`]), and so is the coordination
//! of servers sharing a catalog ([`crate::coord`]).
//!
//! Only the portable subset is used: `BIGINT`, `TEXT` and bytes, `RETURNING`,
//! `ON CONFLICT`, `CAST(... AS BIGINT)` around aggregates whose result types differ (`SUM` is
//! NUMERIC on PostgreSQL). What truly differs is asked of the [`Dialect`]: row locks, array
//! parameters, the random generation number, the database's size, the writers' lock.
//!
//! Parameters are borrowed ([`Arg`]) and rows are read in place through a callback
//! ([`Row`]), so the hot paths (a commit's thousands of inserts, an inventory of millions of
//! rows) copy nothing they did not copy before. Each backend caches its prepared statements
//! by the statement's text.

pub use crate::copy::Value;
use crate::error::{CatalogError, Result};
pub use crate::migrations::Dialect;

/// A statement's parameter, borrowed from the caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arg<'a> {
    /// SQL NULL.
    Null,
    /// An integer.
    Int(i64),
    /// Text.
    Text(&'a str),
    /// Bytes.
    Bytes(&'a [u8]),
    /// An array of integers (`= ANY(?N)`), where [`Dialect::arrays`] says there are arrays.
    Ints(&'a [i64]),
    /// An array of byte strings, likewise.
    ByteList(&'a [&'a [u8]]),
}

impl From<i64> for Arg<'_> {
    fn from(v: i64) -> Self {
        Arg::Int(v)
    }
}

impl<'a> From<&'a str> for Arg<'a> {
    fn from(v: &'a str) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a String> for Arg<'a> {
    fn from(v: &'a String) -> Self {
        Arg::Text(v)
    }
}

impl<'a> From<&'a [u8]> for Arg<'a> {
    fn from(v: &'a [u8]) -> Self {
        Arg::Bytes(v)
    }
}

impl<'a> From<&'a Vec<u8>> for Arg<'a> {
    fn from(v: &'a Vec<u8>) -> Self {
        Arg::Bytes(v)
    }
}

impl<'a, T: Into<Arg<'a>>> From<Option<T>> for Arg<'a> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Arg::Null, Into::into)
    }
}

impl<'a> From<&'a Value> for Arg<'a> {
    fn from(v: &'a Value) -> Self {
        match v {
            Value::Null => Arg::Null,
            Value::Int(i) => Arg::Int(*i),
            Value::Text(s) => Arg::Text(s),
            Value::Bytes(b) => Arg::Bytes(b),
        }
    }
}

/// A row of a result, read in place. Integers read booleans as 0 and 1 (PostgreSQL's
/// `EXISTS`); a NULL where a value is required is an error.
pub trait Row {
    /// Column `i` as an integer.
    fn int(&self, i: usize) -> Result<i64>;
    /// Column `i` as an integer or NULL.
    fn opt_int(&self, i: usize) -> Result<Option<i64>>;
    /// Column `i` as text.
    fn text(&self, i: usize) -> Result<String>;
    /// Column `i` as text or NULL.
    fn opt_text(&self, i: usize) -> Result<Option<String>>;
    /// Column `i` as bytes.
    fn bytes(&self, i: usize) -> Result<Vec<u8>>;
    /// Column `i` as bytes or NULL.
    fn opt_bytes(&self, i: usize) -> Result<Option<Vec<u8>>>;
    /// Column `i` as whatever it holds.
    fn value(&self, i: usize) -> Result<Value>;
    /// The number of columns.
    fn columns(&self) -> usize;
}

/// A connection: statements run in the transaction it is in, if any.
pub trait Sql {
    /// The backend's spelling of what differs.
    fn dialect(&self) -> Dialect;
    /// Runs a statement; returns the number of rows it changed.
    fn execute(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<u64>;
    /// Runs an `INSERT` (without `RETURNING`) into a table with an `id` column; returns the
    /// new row's id.
    fn insert(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<i64>;
    /// Runs a query, calling `f` with each row in turn; an error from `f` stops it.
    fn each(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        f: &mut dyn FnMut(&dyn Row) -> Result<()>,
    ) -> Result<()>;

    /// Runs a query once for each `width` arguments of `args` (a point lookup per element,
    /// where there are no arrays), calling `f` with the run's number and each of its rows.
    fn each_of(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        width: usize,
        f: &mut dyn FnMut(usize, &dyn Row) -> Result<()>,
    ) -> Result<()> {
        for (i, args) in args.chunks(width.max(1)).enumerate() {
            self.each(sql, args, &mut |r| f(i, r))?;
        }
        Ok(())
    }
}

/// A connection in a write transaction of its own, rolled back when dropped uncommitted.
pub trait Open: Sql {
    /// Names what the statements that follow do, for their errors.
    fn set_op(&mut self, op: &'static str);
    /// Commits the transaction.
    fn commit(self: Box<Self>) -> Result<()>;
}

impl dyn Sql + '_ {
    /// Runs a statement with owned parameters; returns the number of rows it changed.
    pub fn exec(&mut self, sql: &str, params: &[Value]) -> Result<u64> {
        let args: Vec<Arg<'_>> = params.iter().map(Arg::from).collect();
        self.execute(sql, &args)
    }

    /// Runs a query with owned parameters; returns its rows as values.
    pub fn rows(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>> {
        let args: Vec<Arg<'_>> = params.iter().map(Arg::from).collect();
        self.all(sql, &args, |r| (0..r.columns()).map(|i| r.value(i)).collect())
    }

    /// Every row, each made into a `T` by `f`.
    pub fn all<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        mut f: impl FnMut(&dyn Row) -> Result<T>,
    ) -> Result<Vec<T>> {
        let mut out = Vec::new();
        self.each(sql, args, &mut |r| {
            out.push(f(r)?);
            Ok(())
        })?;
        Ok(out)
    }

    /// The first row, if any, made into a `T` by `f`.
    pub fn opt<T>(
        &mut self,
        sql: &str,
        args: &[Arg<'_>],
        f: impl FnOnce(&dyn Row) -> Result<T>,
    ) -> Result<Option<T>> {
        let (mut f, mut out) = (Some(f), None);
        self.each(sql, args, &mut |r| {
            if let Some(f) = f.take() {
                out = Some(f(r)?);
            }
            Ok(())
        })?;
        Ok(out)
    }

    /// The integer in the first column of the first row (a count, an id).
    pub fn int(&mut self, sql: &str, args: &[Arg<'_>]) -> Result<i64> {
        self.opt(sql, args, |r| r.int(0))?
            .ok_or_else(|| CatalogError::Damaged(format!("no row from {sql}")))
    }
}

/// What a backend provides to SQL written once: its connections, in the transactions asked
/// for, with its own locking and error mapping, and what only it can do.
pub trait Backend: Send + Sync {
    /// The backend's spelling of what differs.
    fn dialect(&self) -> Dialect;

    /// Runs `f` on a reading connection, each statement seeing what is committed when it
    /// runs. `f` may run twice: a connection found broken is replaced once.
    fn read_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()>;

    /// Runs `f` on a reading connection in one read-only transaction: its statements see
    /// one snapshot.
    fn snapshot_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()>;

    /// Runs `f` on a writing connection outside any transaction: each statement commits
    /// alone. Never retried.
    fn autocommit(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()>;

    /// A writing connection in a new transaction (SQLite: `BEGIN IMMEDIATE`, the one writer).
    fn open_txn(&self, op: &'static str) -> Result<Box<dyn Open + '_>>;

    /// The schema version of the open catalog.
    fn read_schema_version(&self) -> Result<u32>;

    /// Writes a copy of the whole catalog, as of one moment, to the new file `dest`.
    fn copy_to(&self, dest: &std::path::Path) -> Result<()>;

    /// Whether other servers may share the catalog.
    fn shared(&self) -> bool;

    /// Where the catalog is, for messages (a file, or a URL without its password).
    fn location(&self) -> String;
}

impl Dialect {
    /// Appended to a `SELECT` in a write transaction to lock the rows it reads until the
    /// transaction ends. SQLite has one writer at a time: nothing to lock.
    pub(crate) fn for_update(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR UPDATE",
        }
    }

    /// Likewise, letting other readers lock the rows too.
    pub(crate) fn for_share(self) -> &'static str {
        match self {
            Dialect::Sqlite => "",
            Dialect::Postgres => " FOR SHARE",
        }
    }

    /// Whether array parameters ([`Arg::Ints`], [`Arg::ByteList`]) can be bound: one
    /// statement (one round trip) instead of one per element.
    pub(crate) fn arrays(self) -> bool {
        matches!(self, Dialect::Postgres)
    }

    /// A random 64-bit integer (PostgreSQL's `random()` is a float in [0, 1)).
    pub(crate) fn random_bigint(self) -> &'static str {
        match self {
            Dialect::Sqlite => "random()",
            Dialect::Postgres => "CAST(random() * 9.2e18 - 4.6e18 AS BIGINT)",
        }
    }

    /// A query of the database's size in bytes.
    pub(crate) fn database_bytes(self) -> &'static str {
        match self {
            Dialect::Sqlite => {
                "SELECT p.page_count * s.page_size FROM pragma_page_count() p, pragma_page_size() s"
            }
            Dialect::Postgres => "SELECT pg_database_size(current_database())",
        }
    }
}

/// The advisory lock that serializes [`write`]'s transactions across PostgreSQL servers
/// ("QSMc" in ASCII).
const COORDINATION_LOCK: i64 = 0x5153_4d63;

/// Runs `f` in a transaction of its own that commits if it returns `Ok`.
pub(crate) fn txn<T>(
    b: &dyn Backend,
    op: &'static str,
    f: impl FnOnce(&mut dyn Sql) -> Result<T>,
) -> Result<T> {
    let mut t = b.open_txn(op)?;
    let out = f(&mut *t)?;
    t.commit()?;
    Ok(out)
}

/// Runs `f` in a transaction that is serialized against every other made through this
/// call (SQLite: `BEGIN IMMEDIATE`; PostgreSQL: an advisory transaction lock), so a check
/// and the write it allows are never interleaved with another server's.
pub(crate) fn write<T>(
    b: &dyn Backend,
    op: &'static str,
    f: impl FnOnce(&mut dyn Sql) -> Result<T>,
) -> Result<T> {
    txn(b, op, |s| {
        if matches!(s.dialect(), Dialect::Postgres) {
            s.execute("SELECT pg_advisory_xact_lock(?1)", &[Arg::Int(COORDINATION_LOCK)])?;
        }
        f(s)
    })
}

/// Runs `f` through `run` (one of the [`Backend`] calls taking a closure), returning what
/// `f` returns.
fn through<T>(
    op: &'static str,
    run: impl FnOnce(&mut dyn FnMut(&mut dyn Sql) -> Result<()>) -> Result<()>,
    mut f: impl FnMut(&mut dyn Sql) -> Result<T>,
) -> Result<T> {
    let mut out = None;
    run(&mut |s| {
        out = Some(f(s)?);
        Ok(())
    })?;
    out.ok_or_else(|| CatalogError::Damaged(format!("{op}: the transaction returned nothing")))
}

/// [`Backend::read_txn`] returning what `f` returns.
pub(crate) fn read<T>(
    b: &dyn Backend,
    op: &'static str,
    f: impl FnMut(&mut dyn Sql) -> Result<T>,
) -> Result<T> {
    through(op, |g| b.read_txn(op, g), f)
}

/// [`Backend::snapshot_txn`] returning what `f` returns.
pub(crate) fn snapshot<T>(
    b: &dyn Backend,
    op: &'static str,
    f: impl FnMut(&mut dyn Sql) -> Result<T>,
) -> Result<T> {
    through(op, |g| b.snapshot_txn(op, g), f)
}

/// [`Backend::autocommit`] returning what `f` returns.
pub(crate) fn auto<T>(
    b: &dyn Backend,
    op: &'static str,
    f: impl FnMut(&mut dyn Sql) -> Result<T>,
) -> Result<T> {
    through(op, |g| b.autocommit(op, g), f)
}

/// `sql` with `?N` placeholders written `$N`, for PostgreSQL. The statements written once hold
/// no `?` in literals.
pub(crate) fn dollar_placeholders(sql: &str) -> String {
    sql.replace('?', "$")
}

/// Column `i` of `row` as an integer.
pub(crate) fn int(row: &[Value], i: usize) -> Result<i64> {
    match row.get(i) {
        Some(Value::Int(v)) => Ok(*v),
        other => Err(CatalogError::Damaged(format!("column {i}: an integer expected, {other:?}"))),
    }
}

/// The id an `INSERT ... RETURNING id` returned.
pub(crate) fn returned_id(rows: &[Vec<Value>]) -> Result<i64> {
    match rows.first() {
        Some(row) => int(row, 0),
        None => Err(CatalogError::Damaged("an insert returned no id".into())),
    }
}

/// Column `i` of `row` as an integer or NULL.
pub(crate) fn opt_int(row: &[Value], i: usize) -> Result<Option<i64>> {
    match row.get(i) {
        Some(Value::Null) => Ok(None),
        _ => int(row, i).map(Some),
    }
}

/// Column `i` of `row` as text (NULL reads as empty).
pub(crate) fn text(row: &[Value], i: usize) -> Result<String> {
    match row.get(i) {
        Some(Value::Text(s)) => Ok(s.clone()),
        Some(Value::Null) => Ok(String::new()),
        other => Err(CatalogError::Damaged(format!("column {i}: text expected, {other:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_and_columns() {
        assert_eq!(dollar_placeholders("a = ?1 AND b = ?12"), "a = $1 AND b = $12");
        let row = vec![Value::Int(3), Value::Null, Value::Text("x".into())];
        assert_eq!(int(&row, 0).unwrap(), 3);
        assert_eq!(opt_int(&row, 1).unwrap(), None);
        assert_eq!(text(&row, 2).unwrap(), "x");
        assert!(int(&row, 2).is_err());
        assert!(int(&row, 9).is_err());
    }
}
