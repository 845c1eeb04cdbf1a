//! Kernels: functions of objects the simulated NVRTC compiled from CUDA C source
//! ([`crate::jit`]), their parameter layouts and queued launches.

use crate::jit::{self, Entry, Param};
use std::sync::Arc;

/// A kernel of a loaded module.
#[derive(Clone)]
pub struct Kernel(pub Arc<Entry>);

impl Kernel {
    pub fn params(&self) -> &[Param] {
        &self.0.params
    }

    /// Offsets of the parameters in the argument buffer and its total size (the layout of
    /// `CU_LAUNCH_PARAM_BUFFER_POINTER`: each parameter at its natural alignment).
    pub fn layout(&self) -> (Vec<usize>, usize) {
        let mut offsets = Vec::new();
        let mut end = 0usize;
        for p in self.params() {
            let off = end.div_ceil(p.align) * p.align;
            offsets.push(off);
            end = off + p.size;
        }
        (offsets, end)
    }
}

/// The argument values of one launch, copied at `cuLaunchKernel`.
#[derive(Clone)]
pub struct Args {
    pub bytes: Vec<u8>,
    pub offsets: Vec<usize>,
}

/// A launch queued on a stream.
#[derive(Clone)]
pub struct Launch {
    pub kernel: Kernel,
    pub args: Args,
    pub ctx: u64,
    pub grid: [u32; 3],
    pub block: [u32; 3],
}

impl Launch {
    /// Runs every thread of the grid; `Err` fails the context (a fault on a GPU).
    pub fn run(self) -> Result<(), String> {
        jit::run::run(&self.kernel.0, &self.args.bytes, &self.args.offsets, self.grid, self.block, self.ctx)
    }
}
