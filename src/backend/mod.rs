//! Backends execute validated collectives: the built-in backend (`host`, with
//! `staging` and `ipc` for device memory) and NCCL (`nccl`, loaded at run time).

pub mod host;
pub mod ipc;
pub mod nccl;
pub mod staging;
