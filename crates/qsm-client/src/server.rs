//! What the client needs of a server: the node interface of `qsm-types`, which the embedded
//! server (the server core opened in this process) and [`crate::remote::RemoteServer`] both
//! implement. The client never opens a catalog or a pool itself.

use qsm_types::model::{FilespaceId, ObjectVersion};
pub use qsm_types::node::*;

use crate::error::{ClientError, Result as ClientResult};

/// [`Server::inventory`] with a callback that may fail with the client's own errors (a
/// restore's disk, say): the first such error stops the listing and is returned as it was.
pub fn each_version(
    server: &dyn Server,
    filespace: FilespaceId,
    scope: Scope,
    mut f: impl FnMut(ObjectVersion) -> ClientResult<()>,
) -> ClientResult<()> {
    let mut failed = None;
    let listed = server.inventory(filespace, scope, &mut |v| match f(v) {
        Ok(()) => Ok(()),
        Err(e) => {
            failed = Some(e);
            Err(qsm_types::ServerError::Cancelled("stopped by the client".into()))
        }
    });
    match (failed, listed) {
        (Some(e), _) => Err(e),
        (None, r) => r.map_err(ClientError::from),
    }
}
