//! Backends execute validated collectives. The built-in host backend is the only
//! one so far; the NCCL backend joins it with CUDA support.

pub mod host;
