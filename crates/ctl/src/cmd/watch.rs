//! stub
use crate::client::{Exit, EXIT_ERROR};
use crate::Ctx;
pub async fn watch(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
