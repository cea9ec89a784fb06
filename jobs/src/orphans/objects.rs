//! Object-store roots (DC-4, §10).

use std::sync::Arc;

use crate::files::object::ObjectRoot;

use super::Error;
use super::scan::Ctx;

/// Scans the object root `objects` into `ctx`.
///
/// # Errors
/// A database error.
pub(super) async fn scan_root(ctx: &mut Ctx<'_>, objects: &Arc<ObjectRoot>) -> Result<(), Error> {
    ctx.counts.state = "unsupported";
    ctx.counts.error = Some(format!("{objects}: object-store roots are not scanned yet"));
    Ok(())
}
