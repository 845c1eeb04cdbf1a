//! CUDA IPC between processes. A handle names the exporter's memfd by (pid, fd number,
//! allocation id); the importer opens `/proc/<pid>/fd/<fd>`, checks by its name and size
//! that it is still that allocation, and maps it at a fresh device address of its own.

use crate::error::{bail, err, Result};
use crate::event::{self, Event, EventSync};
use crate::mem::alloc::{Backing, IpcKey, Kind, LIVE};
use crate::state::{self, HandleKind, State};
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

const MAGIC: u32 = 0x4d53_4346; // "FCSM"
const VERSION: u16 = 1;
const KIND_MEM: u16 = 1;
const KIND_EVENT: u16 = 2;

/// Allocations this process opened: (context, exporter key) -> (device address, opens).
#[derive(Default)]
pub struct IpcTable {
    pub opened: HashMap<(u64, IpcKey), (u64, u32)>,
}

/// The contents of a 64-byte handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handle {
    pub kind: u16,
    pub pid: u32,
    pub fd: i32,
    pub id: u64,
    pub size: u64,
    /// Physical device ordinal.
    pub device: u32,
}

impl Handle {
    pub fn encode(&self) -> [u8; 64] {
        let mut b = [0u8; 64];
        b[0..4].copy_from_slice(&MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.kind.to_le_bytes());
        b[8..12].copy_from_slice(&self.pid.to_le_bytes());
        b[12..16].copy_from_slice(&self.fd.to_le_bytes());
        b[16..24].copy_from_slice(&self.id.to_le_bytes());
        b[24..32].copy_from_slice(&self.size.to_le_bytes());
        b[32..36].copy_from_slice(&self.device.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; 64], kind: u16) -> Result<Handle> {
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4"));
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8"));
        if u32_at(0) != MAGIC || u16_at(4) != VERSION || u16_at(6) != kind {
            bail!(CUDA_ERROR_INVALID_HANDLE, "not a handle made by the simulated driver's cuIpcGet*Handle");
        }
        Ok(Handle { kind, pid: u32_at(8), fd: u32_at(12) as i32, id: u64_at(16), size: u64_at(24), device: u32_at(32) })
    }
}

/// `cuIpcGetMemHandle`: only the base of a cuMemAlloc allocation can be exported.
pub fn get_mem_handle(st: &State, dptr: u64) -> Result<[u8; 64]> {
    let a = match st.mem.dev.get(&dptr) {
        Some(a) if a.state() == LIVE => a,
        _ => {
            let why = match st.mem.find_dev(dptr) {
                Some(a) => format!("{dptr:#x} is inside allocation {:#x}+{}, not its base", a.base, a.size),
                None => format!("{dptr:#x} is not a live device allocation"),
            };
            bail!(CUDA_ERROR_INVALID_VALUE, "{why}");
        }
    };
    if a.kind != Kind::Device {
        bail!(CUDA_ERROR_INVALID_VALUE, "{dptr:#x} is {:?} memory; only cuMemAlloc memory can be exported", a.kind);
    }
    let fd = a.backing.fd.as_ref().ok_or_else(|| err!(CUDA_ERROR_INVALID_VALUE, "allocation has no fd"))?;
    Ok(Handle {
        kind: KIND_MEM,
        pid: state::pid(),
        fd: fd.as_raw_fd(),
        id: a.id,
        size: a.size as u64,
        device: st.physical(a.device) as u32,
    }
    .encode())
}

fn readlink(path: &str) -> Option<String> {
    std::fs::read_link(path).ok().map(|p| p.to_string_lossy().into_owned())
}

/// Opens the exporter's memfd named `name`, checking that the fd still is that memfd.
fn open_exported(h: &Handle, name: &str) -> Result<(OwnedFd, u64)> {
    let path = format!("/proc/{}/fd/{}", h.pid, h.fd);
    let expect = format!("/memfd:{name}");
    let is_it = |link: Option<String>| link.is_some_and(|l| l == expect || l == format!("{expect} (deleted)"));
    if !is_it(readlink(&path)) {
        bail!(
            CUDA_ERROR_INVALID_HANDLE,
            "the exported memory is gone ({path} is not {expect}: the exporter freed it or exited)"
        );
    }
    let cpath = std::ffi::CString::new(path.clone()).expect("no NUL");
    // SAFETY: a NUL-terminated path; the result is checked.
    let fd = unsafe { libc::open(cpath.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        bail!(CUDA_ERROR_INVALID_HANDLE, "cannot open {path}: {}", std::io::Error::last_os_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    // The exporter may have reused the fd number between the check and the open.
    if !is_it(readlink(&format!("/proc/self/fd/{}", fd.as_raw_fd()))) {
        bail!(CUDA_ERROR_INVALID_HANDLE, "the exported memory is gone ({path} changed while opening)");
    }
    // SAFETY: a valid out-parameter for fstat.
    let mut sb: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and out-parameter.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut sb) } != 0 {
        bail!(CUDA_ERROR_INVALID_HANDLE, "fstat {path}: {}", std::io::Error::last_os_error());
    }
    Ok((fd, sb.st_size as u64))
}

/// The visible ordinal of physical device `p` in this process, if visible.
fn visible_ordinal(st: &State, p: u32) -> Option<i32> {
    st.cfg.visible.iter().position(|&v| v as u32 == p).map(|i| i as i32)
}

/// `cuIpcOpenMemHandle`: maps another process's allocation in context `ctx`; opening the
/// same handle again in the same context returns the same address.
pub fn open_mem(st: &mut State, ctx: u64, raw: &[u8; 64]) -> Result<u64> {
    let h = Handle::decode(raw, KIND_MEM)?;
    if h.pid == state::pid() {
        bail!(CUDA_ERROR_INVALID_CONTEXT, "the handle was exported by this process; it cannot be opened here");
    }
    let key = (h.pid, h.id);
    if let Some((base, n)) = st.ipc.opened.get_mut(&(ctx, key)) {
        *n += 1;
        return Ok(*base);
    }
    let (fd, len) = open_exported(&h, &format!("fccl-sim-{}-{}", h.pid, h.id))?;
    if len < h.size {
        bail!(CUDA_ERROR_INVALID_HANDLE, "the exported memfd has {len} bytes, the handle says {}", h.size);
    }
    let size = h.size as usize;
    let backing = Backing::map(fd, crate::mem::space::round_up(size, crate::mem::space::PAGE).unwrap_or(size))?;
    let backing = backing.without_fd();
    let device = visible_ordinal(st, h.device).unwrap_or(st.ctxs[&ctx].device);
    let base = st.mem.insert_ipc(ctx, device, size, backing, key)?;
    st.ipc.opened.insert((ctx, key), (base, 1));
    Ok(base)
}

/// `cuIpcCloseMemHandle`: one close per open; the mapping goes at the last.
pub fn close_mem(st: &mut State, dptr: u64) -> Result<()> {
    let Some((&k, _)) = st.ipc.opened.iter().find(|(_, &(b, _))| b == dptr) else {
        bail!(CUDA_ERROR_INVALID_VALUE, "{dptr:#x} was not returned by cuIpcOpenMemHandle (or is already closed)");
    };
    let entry = st.ipc.opened.get_mut(&k).expect("found");
    entry.1 -= 1;
    if entry.1 == 0 {
        st.ipc.opened.remove(&k);
        st.mem.remove(dptr);
    }
    Ok(())
}

/// Closes everything context `ctx` opened (context destroyed).
pub fn close_all(st: &mut State, ctx: u64) {
    let keys: Vec<(u64, IpcKey)> = st.ipc.opened.keys().filter(|(c, _)| *c == ctx).copied().collect();
    for k in keys {
        if let Some((base, _)) = st.ipc.opened.remove(&k) {
            st.mem.remove(base);
        }
    }
}

/// `cuIpcGetEventHandle`: the event must have been created with CU_EVENT_INTERPROCESS.
pub fn get_event_handle(st: &State, ev: u64) -> Result<[u8; 64]> {
    let e = event::lookup(st, ev)?;
    let fd = match (&e.sync.shared, e.imported) {
        (Some(b), false) => b.fd.as_ref().map(|f| f.as_raw_fd()),
        _ => None,
    };
    let Some(fd) = fd else {
        bail!(CUDA_ERROR_INVALID_VALUE, "event {ev:#x} was not created with CU_EVENT_INTERPROCESS in this process");
    };
    let device = st.physical(st.ctxs[&e.ctx].device) as u32;
    Ok(Handle { kind: KIND_EVENT, pid: state::pid(), fd, id: e.id, size: 0, device }.encode())
}

/// `cuIpcOpenEventHandle`: an event of context `ctx` sharing the exporter's counters.
pub fn open_event(st: &mut State, ctx: u64, raw: &[u8; 64]) -> Result<u64> {
    let h = Handle::decode(raw, KIND_EVENT)?;
    if h.pid == state::pid() {
        bail!(CUDA_ERROR_INVALID_CONTEXT, "the event handle was exported by this process; it cannot be opened here");
    }
    let (fd, _) = open_exported(&h, &format!("fccl-sim-ev-{}-{}", h.pid, h.id))?;
    let b = Backing::map(fd, 4096)?;
    let sync = EventSync::shared(b.without_fd());
    let id = st.mem.next_id();
    let e = Event {
        ctx,
        flags: event::DISABLE_TIMING | event::INTERPROCESS,
        sync: Arc::new(sync),
        last: None,
        imported: true,
        id,
        cap: None,
    };
    let handle = st.new_handle(HandleKind::Event);
    st.events.insert(handle, e);
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_reject_foreign_bytes() {
        let h = Handle { kind: KIND_MEM, pid: 42, fd: 7, id: 9, size: 4096, device: 1 };
        assert_eq!(Handle::decode(&h.encode(), KIND_MEM).unwrap(), h);
        assert!(Handle::decode(&h.encode(), KIND_EVENT).is_err());
        assert!(Handle::decode(&[0u8; 64], KIND_MEM).is_err());
    }
}
