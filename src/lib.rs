//! ferroccl: collective communication for tensors, with a C ABI.
//!
//! Layers, top to bottom (see ARCHITECTURE.md):
//! - [`ffi`]: the only code that speaks C; every exported function lives there.
//! - [`comm`] and [`coll`]: communicators, groups, collective descriptors and validation.
//! - [`backend`]: executes collectives (the built-in host backend).
//! - [`transport`]: moves bytes between ranks (shared memory, in-process, TCP).
//! - [`mem`]: memory kinds, allocation and the reduction kernels.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod backend;
pub mod coll;
pub mod comm;
pub mod env;
pub mod error;
pub mod ffi;
pub mod launch;
pub mod log;
pub mod mem;
pub mod sys;
pub mod transport;
pub mod types;
