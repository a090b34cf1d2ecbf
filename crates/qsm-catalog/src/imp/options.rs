//! Client option sets (issue 26, TSM's DEFINE CLOPTSET and CLIENTOPT).

use super::*;
use crate::sql::{self, Sql};

fn set_id(s: &mut dyn Sql, name: &str) -> Result<i64> {
    s.opt("SELECT id FROM cloptsets WHERE name = ?1", &[name.into()], |r| r.int(0))?
        .ok_or_else(|| CatalogError::NotFound { what: "client option set", key: name.into() })
}

pub(super) fn define_cloptset(b: &dyn Backend, name: &str, description: &str) -> Result<()> {
    sql::auto(b, "defining a client option set", |s| {
        s.execute(
            "INSERT INTO cloptsets (name, description) VALUES (?1, ?2)",
            &[name.into(), description.into()],
        )
    })
    .map(|_| ())
    .map_err(on_constraint(|| CatalogError::Exists {
        what: "client option set",
        name: name.into(),
    }))
}

pub(super) fn delete_cloptset(b: &dyn Backend, name: &str) -> Result<()> {
    sql::txn(b, "deleting a client option set", |s| {
        let id = [set_id(s, name)?.into()];
        // Its nodes go back to their own options, as TSM's DELETE CLOPTSET leaves them.
        s.execute("UPDATE nodes SET cloptset_id = NULL WHERE cloptset_id = ?1", &id)?;
        s.execute("DELETE FROM clientopts WHERE set_id = ?1", &id)?;
        s.execute("DELETE FROM cloptsets WHERE id = ?1", &id)?;
        Ok(())
    })
}

pub(super) fn add_clientopt(
    b: &dyn Backend,
    set: &str,
    opt: &ClientOpt,
    replace: bool,
) -> Result<()> {
    sql::txn(b, "defining a client option", |s| {
        let id = set_id(s, set)?;
        if replace {
            s.execute(
                "DELETE FROM clientopts WHERE set_id = ?1 AND name = ?2",
                &[id.into(), opt.name.as_str().into()],
            )?;
        }
        s.execute(
            "INSERT INTO clientopts (set_id, name, value, force) VALUES (?1, ?2, ?3, ?4)",
            &[
                id.into(),
                opt.name.as_str().into(),
                opt.value.as_str().into(),
                i64::from(opt.force).into(),
            ],
        )?;
        Ok(())
    })
}

pub(super) fn delete_clientopt(b: &dyn Backend, set: &str, name: &str) -> Result<u64> {
    sql::txn(b, "deleting a client option", |s| {
        let id = set_id(s, set)?;
        s.execute(
            "DELETE FROM clientopts WHERE set_id = ?1 AND name = ?2",
            &[id.into(), name.into()],
        )
    })
}

fn options_of(s: &mut dyn Sql, id: i64) -> Result<Vec<ClientOpt>> {
    s.all(
        "SELECT name, value, force FROM clientopts WHERE set_id = ?1 ORDER BY id",
        &[id.into()],
        |r| Ok(ClientOpt { name: r.text(0)?, value: r.text(1)?, force: r.int(2)? != 0 }),
    )
}

pub(super) fn cloptsets(b: &dyn Backend) -> Result<Vec<OptionSet>> {
    sql::read(b, "reading client option sets", |s| {
        let sets =
            s.all("SELECT id, name, description FROM cloptsets ORDER BY name", &[], |r| {
                Ok((r.int(0)?, r.text(1)?, r.text(2)?))
            })?;
        sets.into_iter()
            .map(|(id, name, description)| {
                Ok(OptionSet { name, description, options: options_of(s, id)? })
            })
            .collect()
    })
}

pub(super) fn set_node_cloptset(b: &dyn Backend, node: NodeId, set: Option<&str>) -> Result<()> {
    sql::txn(b, "setting a node's client option set", |s| {
        let id = set.map(|name| set_id(s, name)).transpose()?;
        if s.execute(
            "UPDATE nodes SET cloptset_id = ?1 WHERE id = ?2",
            &[id.into(), node.0.into()],
        )? == 0
        {
            return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
        }
        Ok(())
    })
}

pub(super) fn node_cloptset(b: &dyn Backend, node: NodeId) -> Result<Option<OptionSet>> {
    sql::read(b, "reading a node's client options", |s| {
        let set = s.opt(
            "SELECT c.id, c.name, c.description FROM nodes n \
             JOIN cloptsets c ON c.id = n.cloptset_id WHERE n.id = ?1",
            &[node.0.into()],
            |r| Ok((r.int(0)?, r.text(1)?, r.text(2)?)),
        )?;
        set.map(|(id, name, description)| {
            Ok(OptionSet { name, description, options: options_of(s, id)? })
        })
        .transpose()
    })
}
