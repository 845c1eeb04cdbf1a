//! ferroccl-simgpu: a simulated CUDA driver (`libcuda.so.1`) and NVRTC (`libnvrtc.so`) for
//! running ferroccl's device code and tests on machines without a GPU (docs/sim-gpu.md).
//!
//! It behaves like the real driver where programs can observe it, and is at least as strict:
//! device memory cannot be touched by the host (nothing is mapped at device addresses),
//! every call checks its context, handles and ranges, streams run asynchronously on one
//! executor thread with a launch latency, and faults in stream work are sticky errors.
//! Kernels run on the CPU: the simulated NVRTC compiles their CUDA C source with the host's
//! C++ compiler ([`jit`]), and the driver runs every thread of a launch.
//!
//! Layout: [`api`] holds every exported C function; the modules below it hold the state
//! they share: contexts ([`ctx`]), memory ([`mem`], [`attrs`]), streams and the executor
//! ([`stream`]), stream capture and graphs ([`graph`]), [`event`]s, memory operations ([`memop`]), [`ipc`], modules and kernels
//! ([`module`], [`kernels`], [`jit`]), virtual memory management ([`vmm`]), the compiler ([`nvrtc`]) and the cost model
//! ([`costs`]).
#![deny(unsafe_op_in_unsafe_fn)]

pub mod api;
pub mod attrs;
pub mod config;
pub mod costs;
pub mod ctx;
pub mod device;
pub mod error;
pub mod event;
pub mod graph;
pub mod ipc;
pub mod jit;
pub mod kernels;
pub mod mem;
pub mod memop;
pub mod module;
pub mod nvrtc;
pub mod state;
pub mod stream;
pub mod vmm;

// The library's element types and device kernel sources (the ferroccl-kernels crate): the
// cost model names kernels as the library launches them.
use ferroccl_kernels::{cuda_kernels, types};

pub use api::*;
