//! The integration tests: ONE test binary, one module per area, all against the real local
//! control plane (started once by `support` if none is running).

mod control;
mod daemon;
mod demo;
mod dev;
mod logs;
mod operator;
mod support;
