//! ferroccl: collective communication for tensors, with a C ABI.
//!
//! Layers, top to bottom (`tools/check-layers.py` holds the order and checks that no
//! module uses a layer above its own):
//! - [`ffi`]: the only code that speaks C; every exported function lives there
//!   ([`launch`], the launcher's library half, is the other entry point).
//! - [`ops`]: composite calls built from collectives (coalesced, axis, PreMulSum's product, local copies).
//! - [`comm`]: communicators, rendezvous, connecting the ranks, groups.
//! - [`backend`]: executes collectives (the router, host, device and NCCL backends).
//! - [`coll`]: what a call is: collective descriptors, validation, shape math.
//! - [`transport`]: moves bytes between ranks (shared memory, in-process, TCP).
//! - [`mem`]: memory kinds, the CUDA driver, allocation and the reduction kernels.
//! - leaves: [`types`] (from the `ferroccl-kernels` crate), [`error`], [`env`] (the
//!   environment registry), [`log`].
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
pub mod ops;
pub mod sys;
pub mod transport;
/// Element types and reduction operators (the `ferroccl-kernels` crate, which the
/// simulated GPU shares).
pub use ferroccl_kernels::types;
