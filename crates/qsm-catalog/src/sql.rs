//! SQL written once for both backends: statements with `?N` placeholders (PostgreSQL's
//! backend rewrites them `$N`), run through the small interface each backend provides. The
//! coordination of servers sharing a catalog ([`crate::coord`]) is written this way; the rest
//! of the catalog is to follow (issue 25).
//!
//! Only the portable subset is used: `BIGINT`, `TEXT` and bytes, `RETURNING`,
//! `ON CONFLICT ... DO NOTHING`, no functions whose result types differ (`SUM` is NUMERIC on
//! PostgreSQL).

pub use crate::copy::Value;
use crate::error::{CatalogError, Result};

/// A connection inside a transaction.
pub trait Sql {
    /// Runs a statement; returns the number of rows it changed.
    fn exec(&mut self, sql: &str, params: &[Value]) -> Result<u64>;
    /// Runs a query; returns its rows.
    fn rows(&mut self, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>>;
}

/// What a backend provides to SQL written once.
pub trait Backend: Send + Sync {
    /// Runs `f` in one transaction that commits if it returns `Ok`. Write transactions made
    /// through this call are serialized against each other (SQLite: `BEGIN IMMEDIATE`;
    /// PostgreSQL: an advisory transaction lock), so a check and the write it allows are
    /// never interleaved with another server's.
    fn write_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()>;

    /// Runs `f` on a reading connection, its statements seeing committed data.
    fn read_txn(
        &self,
        op: &'static str,
        f: &mut dyn FnMut(&mut dyn Sql) -> Result<()>,
    ) -> Result<()>;
}

/// [`Backend::write_txn`] returning what `f` returns.
pub(crate) fn write<T>(
    b: &dyn Backend,
    op: &'static str,
    mut f: impl FnMut(&mut dyn Sql) -> Result<T>,
) -> Result<T> {
    let mut out = None;
    b.write_txn(op, &mut |s| {
        out = Some(f(s)?);
        Ok(())
    })?;
    out.ok_or_else(|| CatalogError::Damaged(format!("{op}: the transaction returned nothing")))
}

/// [`Backend::read_txn`] returning what `f` returns.
pub(crate) fn read<T>(
    b: &dyn Backend,
    op: &'static str,
    mut f: impl FnMut(&mut dyn Sql) -> Result<T>,
) -> Result<T> {
    let mut out = None;
    b.read_txn(op, &mut |s| {
        out = Some(f(s)?);
        Ok(())
    })?;
    out.ok_or_else(|| CatalogError::Damaged(format!("{op}: the read returned nothing")))
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
