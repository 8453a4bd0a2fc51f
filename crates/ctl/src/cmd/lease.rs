//! stub
use crate::client::{Exit, EXIT_ERROR};
use crate::Ctx;
pub async fn grant(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn revoke(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn timetolive(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn list(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn keep_alive(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
