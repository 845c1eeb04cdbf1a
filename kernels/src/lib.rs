//! ferroccl-kernels: what the library and the simulated GPU must agree on to the bit.
//!
//! - [`types`]: the element types and reduction operators, with NCCL's numbering.
//! - [`reduce`]: the host reduction kernels over raw byte buffers.
//! - [`cuda_kernels`]: the CUDA C source of the device reductions and copies, which the
//!   library compiles with NVRTC and the simulated GPU (tools/simgpu) runs on the CPU.
//!
//! The library re-exports these as `ferroccl::types`, `ferroccl::mem::reduce` and
//! `ferroccl::mem::cuda_kernels`. Nothing here depends on the library.
#![deny(unsafe_op_in_unsafe_fn)]

pub mod cuda_kernels;
pub mod reduce;
pub mod types;
