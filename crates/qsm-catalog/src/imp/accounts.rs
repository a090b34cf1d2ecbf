//! Nodes, administrators, and the nodes' stored keys.

use super::*;
use crate::sql;

pub(super) fn register_node(
    b: &dyn Backend,
    name: &str,
    password_hash: &str,
    domain: DomainId,
) -> Result<NodeId> {
    sql::auto(b, "registering a node", |s| {
        s.insert(
            "INSERT INTO nodes (name, password_hash, domain_id, locked, registered) \
             VALUES (?1, ?2, ?3, 0, ?4)",
            &[name.into(), password_hash.into(), domain.0.into(), crate::now().into()],
        )
    })
    .map(NodeId)
    .map_err(|e| {
        if e.is_unique() {
            CatalogError::Exists { what: "node", name: name.into() }
        } else if e.is_constraint() {
            CatalogError::NotFound { what: "domain", key: domain.0.to_string() }
        } else {
            e
        }
    })
}

const NODE_COLUMNS: &str = "id, name, password_hash, domain_id, locked, registered, replica_of";

fn node_from_row(r: &dyn Row) -> Result<Node> {
    Ok(Node {
        id: NodeId(r.int(0)?),
        name: r.text(1)?,
        password_hash: r.text(2)?,
        domain: DomainId(r.int(3)?),
        locked: r.int(4)? != 0,
        registered: r.int(5)?,
        replica_of: r.opt_text(6)?,
    })
}

pub(super) fn node(b: &dyn Backend, name: &str) -> Result<Option<Node>> {
    sql::read(b, "reading a node", |s| {
        s.opt(
            &format!("SELECT {NODE_COLUMNS} FROM nodes WHERE name = ?1"),
            &[name.into()],
            node_from_row,
        )
    })
}

pub(super) fn nodes(b: &dyn Backend) -> Result<Vec<Node>> {
    sql::read(b, "reading nodes", |s| {
        s.all(&format!("SELECT {NODE_COLUMNS} FROM nodes ORDER BY name"), &[], node_from_row)
    })
}

pub(super) fn set_node_locked(b: &dyn Backend, node: NodeId, locked: bool) -> Result<()> {
    update_one(
        b,
        "locking a node",
        "UPDATE nodes SET locked = ?1 WHERE id = ?2",
        &[i64::from(locked).into(), node.0.into()],
        "node",
        &node.0,
    )
}

pub(super) fn delete_node(b: &dyn Backend, node: NodeId) -> Result<()> {
    sql::txn(b, "deleting a node", |s| {
        let sql = format!("SELECT id FROM nodes WHERE id = ?1{}", s.dialect().for_update());
        if s.opt(&sql, &[node.0.into()], |r| r.int(0))?.is_none() {
            return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
        }
        let id = [node.0.into()];
        let filespaces = s.int("SELECT count(*) FROM filespaces WHERE node_id = ?1", &id)?;
        if filespaces > 0 {
            return Err(CatalogError::Refused(format!(
                "the node still has {filespaces} filespaces: delete them first"
            )));
        }
        s.execute("DELETE FROM sessions WHERE node_id = ?1", &id)?;
        s.execute("DELETE FROM events WHERE node_id = ?1", &id)?;
        s.execute("DELETE FROM associations WHERE node_id = ?1", &id)?;
        s.execute("DELETE FROM holds WHERE node_id = ?1", &id)?;
        s.execute("DELETE FROM nodes WHERE id = ?1", &id)?;
        Ok(())
    })
}

pub(super) fn register_admin(
    b: &dyn Backend,
    name: &str,
    password_hash: &str,
    privileges: &[Privilege],
) -> Result<()> {
    let privileges = Privilege::join(privileges);
    sql::auto(b, "registering an administrator", |s| {
        s.execute(
            "INSERT INTO admins (name, password_hash, locked, registered, privileges) \
             VALUES (?1, ?2, 0, ?3, ?4)",
            &[name.into(), password_hash.into(), crate::now().into(), (&privileges).into()],
        )
    })
    .map(|_| ())
    .map_err(on_constraint(|| CatalogError::Exists { what: "administrator", name: name.into() }))
}

pub(super) fn set_admin_privileges(
    b: &dyn Backend,
    name: &str,
    privileges: &[Privilege],
) -> Result<()> {
    update_one(
        b,
        "granting privileges",
        "UPDATE admins SET privileges = ?1 WHERE name = ?2",
        &[(&Privilege::join(privileges)).into(), name.into()],
        "administrator",
        &name,
    )
}

pub(super) fn set_password(b: &dyn Backend, admin: bool, name: &str, hash: &str) -> Result<()> {
    let (sql, what) = if admin {
        ("UPDATE admins SET password_hash = ?1 WHERE name = ?2", "administrator")
    } else {
        ("UPDATE nodes SET password_hash = ?1 WHERE name = ?2", "node")
    };
    update_one(b, "changing a password", sql, &[hash.into(), name.into()], what, &name)
}

pub(super) fn set_admin_locked(b: &dyn Backend, name: &str, locked: bool) -> Result<()> {
    update_one(
        b,
        "locking an administrator",
        "UPDATE admins SET locked = ?1 WHERE name = ?2",
        &[i64::from(locked).into(), name.into()],
        "administrator",
        &name,
    )
}

pub(super) fn remove_admin(b: &dyn Backend, name: &str) -> Result<()> {
    update_one(
        b,
        "removing an administrator",
        "DELETE FROM admins WHERE name = ?1",
        &[name.into()],
        "administrator",
        &name,
    )
}

pub(super) fn admin(b: &dyn Backend, name: &str) -> Result<Option<Admin>> {
    sql::read(b, "reading an administrator", |s| {
        s.opt(
            "SELECT name, password_hash, locked, registered, privileges FROM admins \
             WHERE name = ?1",
            &[name.into()],
            |r| {
                let name = r.text(0)?;
                let privileges = Privilege::parse_list(&r.text(4)?)
                    .map_err(|e| CatalogError::Damaged(format!("administrator {name}: {e}")))?;
                Ok(Admin {
                    password_hash: r.text(1)?,
                    locked: r.int(2)? != 0,
                    registered: r.int(3)?,
                    name,
                    privileges,
                })
            },
        )
    })
}

pub(super) fn node_key(b: &dyn Backend, node: NodeId) -> Result<Option<Vec<u8>>> {
    sql::read(b, "reading a node's key", |s| {
        s.opt("SELECT key_file FROM nodes WHERE id = ?1", &[node.0.into()], |r| r.opt_bytes(0))
    })?
    .ok_or_else(|| CatalogError::NotFound { what: "node", key: node.0.to_string() })
}

pub(super) fn set_node_key(b: &dyn Backend, node: NodeId, key_file: &[u8]) -> Result<()> {
    update_one(
        b,
        "storing a node's key",
        "UPDATE nodes SET key_file = ?1 WHERE id = ?2",
        &[key_file.into(), node.0.into()],
        "node",
        &node.0,
    )
}
