//! stub
use crate::client::{Exit, EXIT_ERROR};
use crate::Ctx;
pub async fn auth_enable(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn auth_disable(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn auth_status(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn user(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn role(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
