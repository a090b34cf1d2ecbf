//! Reclamation: moving the live frames out of a container whose live fraction has fallen
//! below a threshold, so that the container can be deleted.
//!
//! The pool does not know which frames are live; the catalog does. Reclaiming one container
//! is therefore three steps, in this order, and a crash between any two leaves every chunk
//! readable:
//!
//! 1. [`copy_frames`] copies the live frames into new containers and syncs them; the old
//!    container is untouched, so a crash here leaves only unreferenced copies.
//! 2. The caller repoints the chunks to the new locations in **one** catalog transaction; a
//!    crash before it commits leaves the catalog on the old, intact container.
//! 3. The caller deletes the old container with [`crate::Pool::delete`]; a crash before that
//!    leaves an unreferenced container, which the next reclamation deletes.
//!
//! Frames are verified as they are read, so damage is never copied into a new container: a
//! damaged live frame makes [`copy_frames`] fail with [`PoolError::Corrupt`] naming it, and the
//! caller decides (mark the chunk damaged in the catalog and copy the others, or keep the old
//! container). [`crate::Pool::audit`] lists all damaged frames beforehand.

use crate::{FrameLocation, Pool, PoolError, PoolWriter};

/// Reads (verified) and appends each frame of `frames` through `writer`, syncs, and returns
/// the new locations in the same order. The writer may belong to another pool, which moves
/// the frames there. Only after this returns may the catalog point at the new locations.
pub fn copy_frames(
    pool: &dyn Pool,
    frames: &[FrameLocation],
    writer: &mut dyn PoolWriter,
) -> Result<Vec<FrameLocation>, PoolError> {
    let mut buf = Vec::new();
    let mut moved = Vec::with_capacity(frames.len());
    for loc in frames {
        pool.read_frame(loc, None, &mut buf)?;
        moved.push(writer.append(&buf)?);
    }
    writer.sync()?;
    Ok(moved)
}
