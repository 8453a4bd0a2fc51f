//! stub
use crate::client::{Exit, EXIT_ERROR};
use crate::Ctx;
pub async fn defrag(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn snapshot_save(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn alarm(_ctx: &mut Ctx, _d: bool) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
