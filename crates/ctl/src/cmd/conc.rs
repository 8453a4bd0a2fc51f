//! stub
use crate::client::{Exit, EXIT_ERROR};
use crate::Ctx;
pub async fn lock(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn elect(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn make_mirror(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn check_perf(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
pub async fn check_datascale(_ctx: &mut Ctx) -> Result<(), Exit> {
    Err(Exit::new(EXIT_ERROR, "not implemented"))
}
