//! Modules (PTX text from the simulated NVRTC, naming the object it compiled) and their
//! functions, and checking a launch.

use crate::error::{bail, Result};
use crate::jit::Object;
use crate::kernels::{Args, Kernel};
use crate::state::{HandleKind, State};
use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::Arc;

/// The comment line of the simulated NVRTC's PTX that names the compiled object.
pub const OBJECT_LINE: &str = "// ferroccl-simgpu-object: ";

pub struct Module {
    pub ctx: u64,
    /// `.entry` names in the image.
    pub entries: Vec<String>,
    pub object: Arc<Object>,
    /// Functions handed out, by name (cuModuleGetFunction returns the same handle again).
    pub functions: HashMap<String, u64>,
}

pub struct Function {
    pub module: u64,
    pub ctx: u64,
    pub name: CString,
    pub kernel: Kernel,
}

/// The `.entry` names of a PTX image and the object it names; CUDA_ERROR_INVALID_IMAGE if
/// it is not PTX text of the simulated NVRTC.
pub fn parse_ptx(image: &[u8]) -> Result<(Vec<String>, std::path::PathBuf)> {
    if image.starts_with(b"\x7fELF") {
        bail!(
            CUDA_ERROR_INVALID_IMAGE,
            "the image is an ELF cubin/fatbin; the simulator only loads PTX text (see docs/sim-gpu.md)"
        );
    }
    let text = std::str::from_utf8(image).map_err(|_| crate::error::err!(CUDA_ERROR_INVALID_IMAGE, "not PTX text"))?;
    let has = |d: &str| text.lines().any(|l| l.trim_start().starts_with(d));
    if !has(".version") || !has(".target") {
        bail!(CUDA_ERROR_INVALID_IMAGE, "not PTX text (no .version / .target directive)");
    }
    let Some(object) = text.lines().find_map(|l| l.strip_prefix(OBJECT_LINE)) else {
        bail!(
            CUDA_ERROR_INVALID_IMAGE,
            "PTX that the simulated NVRTC did not make: the simulator runs kernels it compiled from CUDA C \
             source only (docs/sim-gpu.md)"
        );
    };
    let mut entries = Vec::new();
    for line in text.lines() {
        let mut words = line.split_whitespace().peekable();
        while let Some(w) = words.next() {
            if w == ".entry" {
                if let Some(name) = words.peek() {
                    let name = name.split('(').next().unwrap_or("");
                    if !name.is_empty() {
                        entries.push(name.to_string());
                    }
                }
            }
        }
    }
    Ok((entries, std::path::PathBuf::from(object.trim())))
}

/// Loads `image` into context `ctx`. The object is loaded without the state lock held
/// (`object`), as dlopen may take a while.
pub fn load(st: &mut State, ctx: u64, entries: Vec<String>, object: Arc<Object>) -> Result<u64> {
    let h = st.new_handle(HandleKind::Module);
    st.modules.insert(h, Module { ctx, entries, object, functions: HashMap::new() });
    Ok(h)
}

pub fn lookup(st: &State, h: u64) -> Result<&Module> {
    match st.modules.get(&h) {
        Some(m) => Ok(m),
        None => bail!(CUDA_ERROR_INVALID_HANDLE, "{h:#x} is not a module (unloaded or never loaded)"),
    }
}

/// Unloads module `h`: its functions become invalid handles.
pub fn unload(st: &mut State, h: u64) {
    if let Some(m) = st.modules.remove(&h) {
        for f in m.functions.values() {
            st.functions.remove(f);
        }
    }
}

pub fn get_function(st: &mut State, module: u64, name: &str) -> Result<u64> {
    let m = lookup(st, module)?;
    if let Some(&f) = m.functions.get(name) {
        return Ok(f);
    }
    if !m.entries.iter().any(|e| e == name) {
        bail!(CUDA_ERROR_NOT_FOUND, "module {module:#x} has no entry {name:?} (entries: {:?})", m.entries);
    }
    let Some(entry) = m.object.entry(name) else {
        bail!(CUDA_ERROR_NOT_FOUND, "{name:?} is not a kernel of {}", m.object.path.display());
    };
    let kernel = Kernel(Arc::new(entry));
    let ctx = m.ctx;
    let h = st.new_handle(HandleKind::Function);
    let cname = CString::new(name).expect("PTX names have no NUL");
    st.functions.insert(h, Function { module, ctx, name: cname, kernel });
    st.modules.get_mut(&module).expect("looked up").functions.insert(name.to_string(), h);
    Ok(h)
}

pub fn function(st: &State, h: u64) -> Result<&Function> {
    match st.functions.get(&h) {
        Some(f) => Ok(f),
        None => bail!(CUDA_ERROR_INVALID_HANDLE, "{h:#x} is not a function (its module was unloaded?)"),
    }
}

/// Checks launch dimensions as a Hopper GPU limits them.
pub fn check_dims(grid: [u32; 3], block: [u32; 3], shared: u32) -> Result<()> {
    if grid.contains(&0) || block.contains(&0) {
        bail!(CUDA_ERROR_INVALID_VALUE, "grid {grid:?} and block {block:?} dimensions must be > 0");
    }
    if grid[1] > 65535 || grid[2] > 65535 || grid[0] > i32::MAX as u32 {
        bail!(CUDA_ERROR_INVALID_VALUE, "grid {grid:?} exceeds (2^31-1, 65535, 65535)");
    }
    let threads = u64::from(block[0]) * u64::from(block[1]) * u64::from(block[2]);
    if block[0] > 1024 || block[1] > 1024 || block[2] > 64 || threads > 1024 {
        bail!(CUDA_ERROR_INVALID_VALUE, "block {block:?} has more than 1024 threads or exceeds (1024, 1024, 64)");
    }
    if shared > 48 * 1024 {
        bail!(CUDA_ERROR_INVALID_VALUE, "{shared} bytes of dynamic shared memory (more than 48 KiB needs opt-in)");
    }
    Ok(())
}

/// Most bytes of parameters a launch may pass, as the real driver allows on Hopper (CUDA
/// 12.1 and later; 4096 before, and on older architectures).
pub const MAX_PARAM_BYTES: usize = 32764;

const LAUNCH_PARAM_END: usize = 0;
const LAUNCH_PARAM_BUFFER_POINTER: usize = 1;
const LAUNCH_PARAM_BUFFER_SIZE: usize = 2;

/// Copies the argument values of a launch: from `kernelParams` (one pointer per parameter)
/// or from `extra` (a packed buffer), exactly one of which must be given.
///
/// # Safety
/// The pointers are the caller's, as `cuLaunchKernel` receives them: each parameter pointer
/// points at a value of the parameter's size; `extra` is an END-terminated list.
pub unsafe fn copy_args(k: &Kernel, params: *mut *mut c_void, extra: *mut *mut c_void) -> Result<Args> {
    let (offsets, total) = k.layout();
    if total > MAX_PARAM_BYTES {
        bail!(
            CUDA_ERROR_INVALID_VALUE,
            "{}'s parameters take {total} bytes; a launch passes at most {MAX_PARAM_BYTES}: pass large tables \
             through device memory",
            k.0.name
        );
    }
    let mut bytes = vec![0u8; total];
    let fparams = k.params();
    match (params.is_null(), extra.is_null()) {
        (false, false) => bail!(CUDA_ERROR_INVALID_VALUE, "both kernelParams and extra are given"),
        (true, true) if !fparams.is_empty() => {
            bail!(CUDA_ERROR_INVALID_VALUE, "kernelParams and extra are both NULL; the kernel has parameters")
        }
        (true, true) => {}
        (false, true) => {
            for (i, p) in fparams.iter().enumerate() {
                // SAFETY: kernelParams has one entry per parameter (caller).
                let src = unsafe { *params.add(i) } as *const u8;
                if src.is_null() {
                    bail!(CUDA_ERROR_INVALID_VALUE, "kernelParams[{i}] is NULL");
                }
                // SAFETY: it points at a value of the parameter's size (caller).
                unsafe { std::ptr::copy_nonoverlapping(src, bytes.as_mut_ptr().add(offsets[i]), p.size) };
            }
        }
        (true, false) => {
            let (mut buf, mut size): (*const u8, Option<usize>) = (std::ptr::null(), None);
            for i in (0..).step_by(2) {
                // SAFETY: an END-terminated list of (key, value) pairs (caller).
                let key = unsafe { *extra.add(i) } as usize;
                if key == LAUNCH_PARAM_END {
                    break;
                }
                // SAFETY: as above; every key but END has a value.
                let value = unsafe { *extra.add(i + 1) };
                match key {
                    LAUNCH_PARAM_BUFFER_POINTER => buf = value as *const u8,
                    // SAFETY: the value of BUFFER_SIZE points at a size_t (caller).
                    LAUNCH_PARAM_BUFFER_SIZE if !value.is_null() => size = Some(unsafe { *(value as *const usize) }),
                    _ => bail!(CUDA_ERROR_INVALID_VALUE, "extra: unknown or invalid key {key:#x}"),
                }
                if i > 64 {
                    bail!(CUDA_ERROR_INVALID_VALUE, "extra is not terminated by CU_LAUNCH_PARAM_END");
                }
            }
            if buf.is_null() || size.is_none() {
                bail!(CUDA_ERROR_INVALID_VALUE, "extra needs CU_LAUNCH_PARAM_BUFFER_POINTER and _SIZE");
            }
            if size != Some(total) {
                bail!(
                    CUDA_ERROR_INVALID_VALUE,
                    "extra: buffer of {size:?} bytes, the kernel's parameters take {total}"
                );
            }
            // SAFETY: the buffer holds `total` bytes (caller, size checked).
            unsafe { std::ptr::copy_nonoverlapping(buf, bytes.as_mut_ptr(), total) };
        }
    }
    Ok(Args { bytes, offsets })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ptx_entries_are_found_and_other_images_rejected() {
        let ptx = b"// x\n// ferroccl-simgpu-object: /k/1.so\n.version 8.0\n.target sm_90\n.address_size 64\n\n\
                    .visible .entry fccl_reduce_f32_sum(\n)\n{\n}\n";
        let (entries, object) = parse_ptx(ptx).unwrap();
        assert_eq!(entries, vec!["fccl_reduce_f32_sum".to_string()]);
        assert_eq!(object, std::path::PathBuf::from("/k/1.so"));
        assert!(parse_ptx(b".version 8.0\n.target sm_90\n.visible .entry k(\n)\n").is_err(), "no object");
        assert!(parse_ptx(b"\x7fELF\x02").is_err());
        assert!(parse_ptx(b"hello").is_err());
        assert!(check_dims([1, 1, 1], [1024, 1, 1], 0).is_ok());
        assert!(check_dims([1, 1, 1], [1025, 1, 1], 0).is_err());
        assert!(check_dims([0, 1, 1], [1, 1, 1], 0).is_err());
        assert!(check_dims([1, 1, 1], [32, 32, 2], 0).is_err());
    }
}
