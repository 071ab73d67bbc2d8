//! `gabp-loadgen` run as a process against simulated mods and relays: one test binary, a
//! module per command.

mod call;
mod chaos;
mod games;
mod interrupt;
mod measure;
mod mixed;
mod peers;
mod report;
