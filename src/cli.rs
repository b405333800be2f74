//! The command line (`outbox-relay run | setup | check | status | teardown | probe |
//! import-debezium`): its flags ([`Cli`]), what each command does ([`run`]), and the
//! reference page generated from both ([`reference`](mod@reference)).

mod args;
mod commands;
mod naming;
mod readers;
pub mod reference;
mod teardown;
#[cfg(test)]
mod tests;

pub use args::{Cli, Command, RunArgs};
pub use commands::{exit_code, run};
pub use naming::NamingVariable;
