//! Kernels the simulator implements on the CPU. A kernel's entry name says what it computes
//! and fixes its parameter layout (docs/sim-gpu.md, "Kernel naming convention"): a family
//! is a name prefix, a parameter layout, a parser for the rest of the name and a function
//! that runs it. Adding a family is one entry in [`FAMILIES`] plus its module.

mod reduce_kernel;

use crate::mem::alloc::{Alloc, Kind, FREEING, LIVE};
use crate::mem::Loc;
use std::cell::RefCell;
use std::sync::Arc;

/// Size and alignment of one kernel parameter, as the C compiler lays it out.
#[derive(Clone, Copy, Debug)]
pub struct Param {
    pub size: usize,
    pub align: usize,
}

pub struct Family {
    /// Entry names start with it (`fccl_reduce_`).
    pub prefix: &'static str,
    pub params: &'static [Param],
    /// The rest of the name (`f32_sum`) -> a variant number for `run`.
    pub parse: fn(&str) -> Option<u32>,
    /// Runs the kernel: `Err` fails the launch (the context becomes unusable, as after a
    /// fault on a GPU).
    pub run: fn(u32, &Args, &Access) -> Result<(), String>,
}

/// Every kernel family the simulator implements.
pub static FAMILIES: &[&Family] = &[&reduce_kernel::REDUCE];

/// A kernel: its family and variant.
#[derive(Clone, Copy)]
pub struct Kernel {
    pub family: &'static Family,
    pub variant: u32,
}

/// The kernel an entry name denotes, if the simulator implements it.
pub fn find(name: &str) -> Option<Kernel> {
    FAMILIES.iter().find_map(|f| {
        let rest = name.strip_prefix(f.prefix)?;
        Some(Kernel { family: f, variant: (f.parse)(rest)? })
    })
}

impl Kernel {
    /// Offsets of the parameters in the argument buffer and its total size (the layout of
    /// `CU_LAUNCH_PARAM_BUFFER_POINTER`: each parameter at its natural alignment).
    pub fn layout(&self) -> (Vec<usize>, usize) {
        let mut offsets = Vec::new();
        let mut end = 0usize;
        for p in self.family.params {
            let off = end.div_ceil(p.align) * p.align;
            offsets.push(off);
            end = off + p.size;
        }
        (offsets, end)
    }
}

/// The argument values of one launch, copied at `cuLaunchKernel`.
pub struct Args {
    pub bytes: Vec<u8>,
    pub offsets: Vec<usize>,
    pub params: &'static [Param],
}

impl Args {
    pub fn raw(&self, i: usize) -> &[u8] {
        &self.bytes[self.offsets[i]..self.offsets[i] + self.params[i].size]
    }

    pub fn u64(&self, i: usize) -> u64 {
        u64::from_ne_bytes(self.raw(i).try_into().expect("8-byte parameter"))
    }

    pub fn i32(&self, i: usize) -> i32 {
        i32::from_ne_bytes(self.raw(i).try_into().expect("4-byte parameter"))
    }
}

/// A launch queued on a stream.
pub struct Launch {
    pub kernel: Kernel,
    pub args: Args,
    pub ctx: u64,
}

impl Launch {
    pub fn run(self) -> Result<(), String> {
        let access = Access { ctx: self.ctx, keep: RefCell::new(Vec::new()) };
        (self.kernel.family.run)(self.kernel.variant, &self.args, &access)
    }
}

/// What a kernel may touch: memory of its context's device (or of a peer context with
/// access enabled), IPC-opened, managed and pinned/registered host memory.
pub struct Access {
    ctx: u64,
    /// Allocations resolved by this launch, kept mapped until it ends.
    keep: RefCell<Vec<Arc<Alloc>>>,
}

impl Access {
    /// The address the kernel reads or writes `len` bytes at `addr` through; an error is
    /// the simulated fault.
    pub fn resolve(&self, addr: u64, len: usize, what: &str) -> Result<*mut u8, String> {
        let st = crate::state::lock();
        let fault = |why: String| format!("kernel parameter {what}: {why}");
        // Memory freed by cuMemFreeAsync after this launch was queued is still usable by it.
        let dev = st.mem.find_dev(addr).filter(|a| a.state() == FREEING).cloned();
        let loc = match dev {
            Some(a) if len <= a.size - (addr - a.base) as usize => Loc::Dev(a.clone(), (addr - a.base) as usize),
            _ => st.mem.classify(addr, len, what).map_err(|e| fault(e.why))?,
        };
        match loc {
            Loc::Dev(a, off) => {
                if a.state() != LIVE && a.state() != FREEING {
                    return Err(fault(format!("allocation {:#x}+{} is not live", a.base, a.size)));
                }
                if matches!(a.kind, Kind::Device | Kind::Async) && a.ctx != self.ctx {
                    let mine = st.ctxs.get(&self.ctx);
                    let same_device = mine.is_some_and(|c| c.device == a.device);
                    let peer = mine.is_some_and(|c| c.peers.contains(&a.ctx));
                    if !same_device && !peer {
                        return Err(fault(format!(
                            "{addr:#x} is memory of device {} and peer access to its context is not enabled",
                            a.device
                        )));
                    }
                }
                let p = a.ptr(off);
                self.keep.borrow_mut().push(a);
                Ok(p)
            }
            Loc::Pinned(p) => Ok(p as *mut u8),
            Loc::Pageable(_) => Err(fault(format!("{len} bytes at {addr:#x} are not device-accessible memory"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_layouts_follow_c() {
        let k = find("fccl_reduce_f32_sum").expect("known");
        let (offsets, total) = k.layout();
        assert_eq!(offsets, vec![0, 8, 72, 80]);
        assert_eq!(total, 88);
        assert!(find("fccl_reduce_f32_sum2").is_none());
        assert!(find("fccl_reduce_f33_sum").is_none());
        assert!(find("fccl_reduce").is_none());
        assert!(find("other").is_none());
        for t in ["i8", "u8", "i32", "u32", "i64", "u64", "f16", "bf16", "f32", "f64", "f8e4m3", "f8e5m2"] {
            for o in ["sum", "prod", "max", "min", "avg"] {
                assert!(find(&format!("fccl_reduce_{t}_{o}")).is_some(), "{t} {o}");
            }
        }
    }
}
