//! Policy domains, management classes and their copy groups.

use super::*;
use crate::sql::{self, Sql};

pub(super) fn define_domain(b: &dyn Backend, name: &str, description: &str) -> Result<DomainId> {
    sql::auto(b, "defining a domain", |s| {
        s.insert(
            "INSERT INTO domains (name, description) VALUES (?1, ?2)",
            &[name.into(), description.into()],
        )
    })
    .map(DomainId)
    .map_err(on_constraint(|| CatalogError::Exists { what: "domain", name: name.into() }))
}

fn domain_from_row(r: &dyn Row) -> Result<Domain> {
    Ok(Domain { id: DomainId(r.int(0)?), name: r.text(1)?, description: r.text(2)? })
}

pub(super) fn domain(b: &dyn Backend, name: &str) -> Result<Option<Domain>> {
    sql::read(b, "reading a domain", |s| {
        s.opt(
            "SELECT id, name, description FROM domains WHERE name = ?1",
            &[name.into()],
            domain_from_row,
        )
    })
}

pub(super) fn domains(b: &dyn Backend) -> Result<Vec<Domain>> {
    sql::read(b, "reading domains", |s| {
        s.all("SELECT id, name, description FROM domains ORDER BY name", &[], domain_from_row)
    })
}

pub(super) fn define_mgmt_class(
    b: &dyn Backend,
    domain: DomainId,
    name: &str,
    backup: BackupCopyGroup,
    archive: ArchiveCopyGroup,
) -> Result<MgmtClassId> {
    sql::txn(b, "defining a management class", |s| {
        // The domain's row kept until the commit, so it cannot go meanwhile.
        let known = s.opt(
            &format!("SELECT id FROM domains WHERE id = ?1{}", s.dialect().for_share()),
            &[domain.0.into()],
            |r| r.int(0),
        )?;
        if known.is_none() {
            return Err(CatalogError::NotFound { what: "domain", key: domain.0.to_string() });
        }
        let id = s
            .insert(
                "INSERT INTO mgmt_classes (domain_id, name) VALUES (?1, ?2)",
                &[domain.0.into(), name.into()],
            )
            .map_err(on_constraint(|| CatalogError::Exists {
                what: "management class",
                name: name.into(),
            }))?;
        s.execute(
            "INSERT INTO backup_copygroups (mgmt_class_id, versions_exist, versions_deleted, \
             retain_extra_days, retain_only_days) VALUES (?1, ?2, ?3, ?4, ?5)",
            &[
                id.into(),
                i64::from(backup.versions_exist).into(),
                i64::from(backup.versions_deleted).into(),
                i64::from(backup.retain_extra_days).into(),
                i64::from(backup.retain_only_days).into(),
            ],
        )
        .map_err(on_constraint(|| {
            CatalogError::Refused(format!(
                "invalid backup copy group for {name}: versions-exist must be at least 1"
            ))
        }))?;
        s.execute(
            "INSERT INTO archive_copygroups (mgmt_class_id, retain_version_days) VALUES (?1, ?2)",
            &[id.into(), i64::from(archive.retain_version_days).into()],
        )?;
        Ok(MgmtClassId(id))
    })
}

pub(super) fn mgmt_classes(b: &dyn Backend, domain: DomainId) -> Result<Vec<MgmtClass>> {
    let u = |r: &dyn Row, i| -> Result<u32> {
        let v = r.int(i)?;
        u32::try_from(v).map_err(|_| CatalogError::Damaged(format!("copy group value {v}")))
    };
    sql::read(b, "reading management classes", |s| {
        s.all(
            "SELECT m.id, m.name, b.versions_exist, b.versions_deleted, b.retain_extra_days, \
             b.retain_only_days, a.retain_version_days, m.retain_min_days FROM mgmt_classes m \
             JOIN backup_copygroups b ON b.mgmt_class_id = m.id \
             JOIN archive_copygroups a ON a.mgmt_class_id = m.id \
             WHERE m.domain_id = ?1 ORDER BY m.name",
            &[domain.0.into()],
            |r| {
                Ok(MgmtClass {
                    id: MgmtClassId(r.int(0)?),
                    domain,
                    name: r.text(1)?,
                    backup: BackupCopyGroup {
                        versions_exist: u(r, 2)?,
                        versions_deleted: u(r, 3)?,
                        retain_extra_days: u(r, 4)?,
                        retain_only_days: u(r, 5)?,
                    },
                    archive: ArchiveCopyGroup { retain_version_days: u(r, 6)? },
                    retain_min_days: u(r, 7)?,
                })
            },
        )
    })
}

/// The row `id` of `table` locked until the commit, or `what` not found.
fn lock_row(s: &mut dyn Sql, table: &str, id: i64, what: &'static str) -> Result<()> {
    let sql = format!("SELECT id FROM {table} WHERE id = ?1{}", s.dialect().for_update());
    match s.opt(&sql, &[id.into()], |r| r.int(0))? {
        Some(_) => Ok(()),
        None => Err(CatalogError::NotFound { what, key: id.to_string() }),
    }
}

pub(super) fn delete_domain(b: &dyn Backend, domain: DomainId) -> Result<()> {
    sql::txn(b, "deleting a domain", |s| {
        lock_row(s, "domains", domain.0, "domain")?;
        let id = [domain.0.into()];
        let nodes = s.int("SELECT count(*) FROM nodes WHERE domain_id = ?1", &id)?;
        if nodes > 0 {
            return Err(CatalogError::Refused(format!(
                "the domain still has {nodes} nodes: move them to another domain first"
            )));
        }
        let bound = s.int(
            "SELECT count(*) FROM objects WHERE mgmt_class_id IN \
             (SELECT id FROM mgmt_classes WHERE domain_id = ?1)",
            &id,
        )?;
        if bound > 0 {
            return Err(CatalogError::Refused(format!(
                "{bound} versions are bound to the domain's management classes"
            )));
        }
        for sql in [
            "DELETE FROM backup_copygroups WHERE mgmt_class_id IN \
             (SELECT id FROM mgmt_classes WHERE domain_id = ?1)",
            "DELETE FROM archive_copygroups WHERE mgmt_class_id IN \
             (SELECT id FROM mgmt_classes WHERE domain_id = ?1)",
            "DELETE FROM mgmt_classes WHERE domain_id = ?1",
            "DELETE FROM events WHERE schedule_id IN \
             (SELECT id FROM schedules WHERE domain_id = ?1)",
            "DELETE FROM associations WHERE schedule_id IN \
             (SELECT id FROM schedules WHERE domain_id = ?1)",
            "DELETE FROM schedules WHERE domain_id = ?1",
            "DELETE FROM domains WHERE id = ?1",
        ] {
            // A version bound meanwhile (PostgreSQL) makes the delete fail on its foreign key.
            s.execute(sql, &id).map_err(on_constraint(|| {
                CatalogError::Refused("versions were just bound to the domain's classes".into())
            }))?;
        }
        Ok(())
    })
}

pub(super) fn update_mgmt_class(
    b: &dyn Backend,
    class: MgmtClassId,
    backup: BackupCopyGroup,
    archive: ArchiveCopyGroup,
) -> Result<()> {
    sql::txn(b, "updating a management class", |s| {
        let n = s
            .execute(
                "UPDATE backup_copygroups SET versions_exist = ?1, versions_deleted = ?2, \
                 retain_extra_days = ?3, retain_only_days = ?4 WHERE mgmt_class_id = ?5",
                &[
                    i64::from(backup.versions_exist).into(),
                    i64::from(backup.versions_deleted).into(),
                    i64::from(backup.retain_extra_days).into(),
                    i64::from(backup.retain_only_days).into(),
                    class.0.into(),
                ],
            )
            .map_err(on_constraint(|| {
                CatalogError::Refused("versions-exist must be at least 1".into())
            }))?;
        if n == 0 {
            return Err(CatalogError::NotFound {
                what: "management class",
                key: class.0.to_string(),
            });
        }
        s.execute(
            "UPDATE archive_copygroups SET retain_version_days = ?1 WHERE mgmt_class_id = ?2",
            &[i64::from(archive.retain_version_days).into(), class.0.into()],
        )?;
        Ok(())
    })
}

pub(super) fn delete_mgmt_class(b: &dyn Backend, class: MgmtClassId) -> Result<()> {
    sql::txn(b, "deleting a management class", |s| {
        lock_row(s, "mgmt_classes", class.0, "management class")?;
        let id = [class.0.into()];
        let bound = s.int("SELECT count(*) FROM objects WHERE mgmt_class_id = ?1", &id)?;
        if bound > 0 {
            return Err(CatalogError::Refused(format!(
                "{bound} versions are bound to the management class"
            )));
        }
        // `standard` is the policy of every version of the domain's nodes not bound to
        // another class: without it they would fall back to the built-in defaults, which
        // may keep far less.
        let nodes = s.int(
            "SELECT count(*) FROM nodes n JOIN mgmt_classes m ON m.domain_id = n.domain_id \
             WHERE m.id = ?1 AND m.name = 'standard'",
            &id,
        )?;
        if nodes > 0 {
            return Err(CatalogError::Refused(format!(
                "it is the default class of the domain's {nodes} nodes: move them to another \
                 domain first"
            )));
        }
        for sql in [
            "DELETE FROM backup_copygroups WHERE mgmt_class_id = ?1",
            "DELETE FROM archive_copygroups WHERE mgmt_class_id = ?1",
            "DELETE FROM mgmt_classes WHERE id = ?1",
        ] {
            s.execute(sql, &id).map_err(on_constraint(|| {
                CatalogError::Refused("versions were just bound to the management class".into())
            }))?;
        }
        Ok(())
    })
}

pub(super) fn set_node_domain(b: &dyn Backend, node: NodeId, domain: DomainId) -> Result<()> {
    let n = sql::txn(b, "moving a node to a domain", |s| {
        let n = s.execute(
            "UPDATE nodes SET domain_id = ?1 WHERE id = ?2",
            &[domain.0.into(), node.0.into()],
        )?;
        // A schedule runs for nodes of its own domain (as TSM's associations do).
        s.execute(
            "DELETE FROM associations WHERE node_id = ?1 AND schedule_id NOT IN \
             (SELECT id FROM schedules WHERE domain_id = ?2)",
            &[node.0.into(), domain.0.into()],
        )?;
        Ok(n)
    })
    .map_err(on_constraint(|| CatalogError::NotFound {
        what: "domain",
        key: domain.0.to_string(),
    }))?;
    if n == 0 {
        return Err(CatalogError::NotFound { what: "node", key: node.0.to_string() });
    }
    Ok(())
}

/// Sets the minimum retention of a management class; versions stored before keep the lock
/// they were given.
pub(super) fn set_retain_min(b: &dyn Backend, class: MgmtClassId, days: u32) -> Result<()> {
    update_one(
        b,
        "setting a minimum retention",
        "UPDATE mgmt_classes SET retain_min_days = ?1 WHERE id = ?2",
        &[i64::from(days).into(), class.0.into()],
        "management class",
        &class.0,
    )
}
