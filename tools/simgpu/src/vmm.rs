//! Virtual memory management (cuMemCreate and friends): physical allocations (a memfd each),
//! address reservations carved from the device address range, mappings of the one into the
//! other (each mapping an allocation of the table, `Kind::Vmm`, inaccessible until
//! cuMemSetAccess), and POSIX file descriptors as shareable handles.

use crate::error::{bail, err, Result};
use crate::mem::alloc::{Alloc, Backing, Kind, VmmMap, LIVE};
use crate::mem::space::{round_up, GAP, PAGE};
use crate::state::{self, HandleKind, State};
use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// The minimum (and recommended) allocation granularity of a Hopper GPU: sizes of physical
/// allocations and mappings, and mapping addresses, are multiples of it.
pub const GRANULARITY: usize = 2 << 20;

/// CUmemAllocationHandleType bits.
pub const HANDLE_POSIX_FD: u32 = 1;
const HANDLE_WIN32: u32 = 2;
const HANDLE_WIN32_KMT: u32 = 4;
const HANDLE_FABRIC: u32 = 8;

/// CUmemLocation (the CUDA 13.0 layout), read as raw integers so that values outside the
/// enums are refused instead of being undefined behaviour.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Location {
    pub type_: u32,
    pub id: i32,
}

/// CUmemAllocationProp (the CUDA 13.0 layout).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Prop {
    pub type_: u32,
    pub handle_types: u32,
    pub location: Location,
    pub win32: *mut std::ffi::c_void,
    pub compression: u8,
    pub rdma: u8,
    pub usage: u16,
    pub reserved: [u8; 4],
}

/// CUmemAccessDesc.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct AccessDesc {
    pub location: Location,
    pub flags: u32,
}

const LOCATION_DEVICE: u32 = 1;
const ALLOCATION_PINNED: u32 = 1;

/// A physical allocation: its memfd and what it was created with.
pub struct Phys {
    pub backing: Backing,
    pub size: usize,
    /// Visible device ordinal in this process.
    pub device: i32,
    pub handle_types: u32,
    /// Counted against the device's memory in this process (created here, not imported).
    pub charged: bool,
}

struct Entry {
    phys: Arc<Phys>,
    /// cuMemCreate / import / retain count, less cuMemRelease: 0 once released.
    refs: usize,
    /// Live mappings.
    maps: usize,
}

#[derive(Default)]
pub struct VmmTable {
    handles: HashMap<u64, Entry>,
    /// Reservations: start -> size asked for.
    reserved: BTreeMap<u64, usize>,
}

/// Checks a CUmemAllocationProp as cuMemCreate and cuMemGetAllocationGranularity do.
pub fn check_prop(st: &State, p: &Prop) -> Result<()> {
    if p.type_ != ALLOCATION_PINNED {
        bail!(CUDA_ERROR_INVALID_VALUE, "prop.type {} is not CU_MEM_ALLOCATION_TYPE_PINNED", p.type_);
    }
    if p.location.type_ != LOCATION_DEVICE {
        bail!(
            CUDA_ERROR_INVALID_VALUE,
            "prop.location.type {} is not CU_MEM_LOCATION_TYPE_DEVICE (host locations are not simulated)",
            p.location.type_
        );
    }
    if p.location.id < 0 || p.location.id as usize >= st.devices() {
        bail!(CUDA_ERROR_INVALID_DEVICE, "prop.location.id {} is not a device", p.location.id);
    }
    let t = p.handle_types;
    if t & !(HANDLE_POSIX_FD | HANDLE_WIN32 | HANDLE_WIN32_KMT | HANDLE_FABRIC) != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "prop.requestedHandleTypes {t:#x} has bits outside CUmemAllocationHandleType");
    }
    if t & (HANDLE_WIN32 | HANDLE_WIN32_KMT) != 0 {
        bail!(CUDA_ERROR_NOT_SUPPORTED, "prop.requestedHandleTypes {t:#x}: Win32 handles on Linux");
    }
    if p.compression != 0 {
        bail!(CUDA_ERROR_NOT_SUPPORTED, "prop.allocFlags.compressionType {}: compressible memory", p.compression);
    }
    if p.rdma != 0 {
        bail!(CUDA_ERROR_NOT_SUPPORTED, "prop.allocFlags.gpuDirectRDMACapable: no GPUDirect RDMA with VMM");
    }
    if p.usage != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "prop.allocFlags.usage {:#x}", p.usage);
    }
    Ok(())
}

fn check_size(size: usize, what: &str) -> Result<()> {
    if size == 0 || !size.is_multiple_of(GRANULARITY) {
        bail!(
            CUDA_ERROR_INVALID_VALUE,
            "{what} {size} is not a positive multiple of the granularity {GRANULARITY} \
             (cuMemGetAllocationGranularity)"
        );
    }
    Ok(())
}

fn dup(fd: BorrowedFd<'_>) -> Result<OwnedFd> {
    fd.try_clone_to_owned().map_err(|e| err!(CUDA_ERROR_OUT_OF_MEMORY, "dup of a memfd: {e}"))
}

impl VmmTable {
    fn live(&self, h: u64) -> Result<&Entry> {
        match self.handles.get(&h) {
            Some(e) if e.refs > 0 => Ok(e),
            Some(_) => bail!(CUDA_ERROR_INVALID_VALUE, "handle {h:#x} was released"),
            None => bail!(CUDA_ERROR_INVALID_VALUE, "{h:#x} is not an allocation handle"),
        }
    }

    /// The physical allocation of live handle `h`.
    pub fn phys(&self, h: u64) -> Result<Arc<Phys>> {
        Ok(self.live(h)?.phys.clone())
    }

    /// Drops the entry of `h` once it is released and unmapped (the memory is freed).
    fn settle(st: &mut State, h: u64) {
        let gone = st.vmm.handles.get(&h).is_some_and(|e| e.refs == 0 && e.maps == 0);
        if gone {
            let e = st.vmm.handles.remove(&h).expect("present");
            if e.phys.charged {
                let used = &mut st.mem.used[e.phys.device as usize];
                *used = used.saturating_sub(e.phys.size);
            }
        }
    }
}

fn insert(st: &mut State, phys: Phys) -> u64 {
    let h = st.new_handle(HandleKind::Mem);
    st.vmm.handles.insert(h, Entry { phys: Arc::new(phys), refs: 1, maps: 0 });
    h
}

/// cuMemCreate.
pub fn create(st: &mut State, size: usize, p: &Prop, flags: u64) -> Result<u64> {
    if flags != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} must be 0");
    }
    check_prop(st, p)?;
    check_size(size, "size")?;
    let d = p.location.id;
    let (limit, used) = (st.cfg.mem_bytes, st.mem.used[d as usize]);
    if size > limit.saturating_sub(used) {
        bail!(
            CUDA_ERROR_OUT_OF_MEMORY,
            "{size} bytes requested, {} of {limit} bytes of device {d} free (FERROCCL_SIM_MEM_MB)",
            limit.saturating_sub(used)
        );
    }
    let id = st.mem.next_id();
    let name = format!("fccl-vmm-{}-{id}-{}-{}", state::pid(), st.physical(d), p.handle_types);
    let backing = Backing::create(&name, size, true)?;
    st.mem.used[d as usize] += size;
    Ok(insert(st, Phys { backing, size, device: d, handle_types: p.handle_types, charged: true }))
}

/// cuMemRelease.
pub fn release(st: &mut State, h: u64) -> Result<()> {
    st.vmm.live(h)?;
    st.vmm.handles.get_mut(&h).expect("live").refs -= 1;
    VmmTable::settle(st, h);
    Ok(())
}

/// cuMemAddressReserve: `size` bytes (a multiple of the page size) aligned to `align` (0 or a
/// power of two; at least the granularity), followed by an unmapped guard page.
pub fn reserve(st: &mut State, size: usize, align: usize, flags: u64) -> Result<u64> {
    if flags != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} must be 0");
    }
    if size == 0 || !size.is_multiple_of(PAGE) {
        bail!(CUDA_ERROR_INVALID_VALUE, "size {size} is not a positive multiple of the page size {PAGE}");
    }
    if align != 0 && !align.is_power_of_two() {
        bail!(CUDA_ERROR_INVALID_VALUE, "alignment {align} is not 0 or a power of two");
    }
    let len = size.checked_add(GAP).ok_or_else(|| err!(CUDA_ERROR_OUT_OF_MEMORY, "{size} bytes"))?;
    let start = st.mem.reserve_range(len, align.max(GRANULARITY))? as u64;
    st.vmm.reserved.insert(start, size);
    Ok(start)
}

/// cuMemAddressFree: exactly a reservation, with nothing mapped in it.
pub fn address_free(st: &mut State, ptr: u64, size: usize) -> Result<()> {
    match st.vmm.reserved.get(&ptr) {
        Some(&s) if s == size => {}
        Some(&s) => bail!(CUDA_ERROR_INVALID_VALUE, "reservation {ptr:#x} has {s} bytes, not {size}"),
        None => bail!(CUDA_ERROR_INVALID_VALUE, "{ptr:#x} is not the start of a reservation (cuMemAddressReserve)"),
    }
    if let Some((&b, _)) = st.mem.dev.range(ptr..ptr + size as u64).next() {
        bail!(
            CUDA_ERROR_INVALID_VALUE,
            "reservation {ptr:#x}+{size} still has a mapping at {b:#x} (cuMemUnmap it first)"
        );
    }
    st.vmm.reserved.remove(&ptr);
    st.mem.release_range(ptr as usize, size + GAP);
    Ok(())
}

/// The reservation holding `ptr..ptr+size`, or why there is none.
fn in_reservation(st: &State, ptr: u64, size: usize) -> Result<()> {
    let inside = st.vmm.reserved.range(..=ptr).next_back().is_some_and(|(&s, &l)| ptr + size as u64 <= s + l as u64);
    if !inside {
        bail!(CUDA_ERROR_INVALID_VALUE, "{ptr:#x}+{size} does not lie inside one reservation (cuMemAddressReserve)");
    }
    Ok(())
}

/// cuMemMap: `size` bytes of handle `h` (offset 0) at `ptr`, inaccessible until cuMemSetAccess.
pub fn map(st: &mut State, ptr: u64, size: usize, offset: usize, h: u64, flags: u64) -> Result<()> {
    if flags != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} must be 0");
    }
    if offset != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "offset {offset} must be 0");
    }
    let phys = st.vmm.phys(h)?;
    check_size(size, "size")?;
    if !(ptr as usize).is_multiple_of(GRANULARITY) {
        bail!(CUDA_ERROR_INVALID_VALUE, "address {ptr:#x} is not aligned to the granularity {GRANULARITY}");
    }
    if size > phys.size {
        bail!(CUDA_ERROR_INVALID_VALUE, "size {size} exceeds the allocation's {} bytes", phys.size);
    }
    in_reservation(st, ptr, size)?;
    let end = ptr + size as u64;
    let before = st.mem.find_dev(ptr).map(|a| (a.base, a.size));
    let within = st.mem.dev.range(ptr..end).next().map(|(&b, a)| (b, a.size));
    if let Some((b, s)) = before.or(within) {
        bail!(CUDA_ERROR_INVALID_VALUE, "{ptr:#x}+{size} overlaps the mapping {b:#x}+{s} (cuMemUnmap it first)");
    }
    let fd = phys.backing.fd.as_ref().ok_or_else(|| err!(CUDA_ERROR_UNKNOWN, "allocation without its memfd"))?;
    let backing = Backing::map(dup(fd.as_fd())?, size)?.without_fd();
    let a = Alloc {
        id: st.mem.next_id(),
        base: ptr,
        size,
        reserved: size,
        lead: 0,
        kind: Kind::Vmm,
        ctx: 0,
        device: phys.device,
        backing,
        state: AtomicU8::new(LIVE),
        sync_memops: AtomicBool::new(false),
        name: String::new(),
        ipc: None,
        vmm: Some(VmmMap {
            handle: h,
            read: AtomicU64::new(0),
            write: AtomicU64::new(0),
            handle_types: phys.handle_types,
            _phys: phys,
        }),
    };
    st.mem.insert_mapping(Arc::new(a));
    st.vmm.handles.get_mut(&h).expect("live").maps += 1;
    Ok(())
}

/// The mappings that make up exactly `ptr..ptr+size`, in order.
fn mappings_of(st: &State, ptr: u64, size: usize, call: &str) -> Result<Vec<Arc<Alloc>>> {
    if size == 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "size is 0");
    }
    let end = ptr.checked_add(size as u64).ok_or_else(|| err!(CUDA_ERROR_INVALID_VALUE, "range wraps"))?;
    let mut out: Vec<Arc<Alloc>> = Vec::new();
    let mut at = ptr;
    while at < end {
        match st.mem.dev.get(&at) {
            Some(a) if a.kind == Kind::Vmm && a.end() <= end => {
                at = a.end();
                out.push(a.clone());
            }
            _ => bail!(
                CUDA_ERROR_INVALID_VALUE,
                "{call}: {ptr:#x}+{size} is not made of whole mappings (none starts at {at:#x}, or one ends past the range)"
            ),
        }
    }
    Ok(out)
}

/// cuMemUnmap: one or more whole, adjacent mappings. Work queued before that still uses them
/// fails when it runs, as on a GPU (the driver does not wait for it).
pub fn unmap(st: &mut State, ptr: u64, size: usize) -> Result<()> {
    for a in mappings_of(st, ptr, size, "cuMemUnmap")? {
        st.mem.remove(a.base);
        let h = a.vmm.as_ref().expect("a mapping").handle;
        if let Some(e) = st.vmm.handles.get_mut(&h) {
            e.maps -= 1;
        }
        VmmTable::settle(st, h);
    }
    Ok(())
}

/// cuMemSetAccess over whole mappings.
pub fn set_access(st: &mut State, ptr: u64, size: usize, descs: &[AccessDesc]) -> Result<()> {
    if descs.is_empty() {
        bail!(CUDA_ERROR_INVALID_VALUE, "count is 0");
    }
    for d in descs {
        if d.location.type_ != LOCATION_DEVICE {
            bail!(CUDA_ERROR_INVALID_VALUE, "location.type {} is not CU_MEM_LOCATION_TYPE_DEVICE", d.location.type_);
        }
        if d.location.id < 0 || d.location.id as usize >= st.devices() {
            bail!(CUDA_ERROR_INVALID_DEVICE, "location.id {} is not a device", d.location.id);
        }
        if ![0, 1, 3].contains(&d.flags) {
            bail!(CUDA_ERROR_INVALID_VALUE, "flags {} are not a CUmemAccess_flags value", d.flags);
        }
    }
    let maps = mappings_of(st, ptr, size, "cuMemSetAccess")?;
    for a in maps {
        let v = a.vmm.as_ref().expect("a mapping");
        for d in descs {
            let bit = 1u64 << d.location.id;
            if d.flags & 1 != 0 {
                v.read.fetch_or(bit, Ordering::AcqRel);
            } else {
                v.read.fetch_and(!bit, Ordering::AcqRel);
            }
            if d.flags == 3 {
                v.write.fetch_or(bit, Ordering::AcqRel);
            } else {
                v.write.fetch_and(!bit, Ordering::AcqRel);
            }
        }
    }
    Ok(())
}

/// The live mapping holding `ptr`.
pub fn mapping_at(st: &State, ptr: u64) -> Result<Arc<Alloc>> {
    match st.mem.find_dev(ptr) {
        Some(a) if a.kind == Kind::Vmm && a.state() == LIVE => Ok(a.clone()),
        Some(a) => bail!(CUDA_ERROR_INVALID_VALUE, "{ptr:#x} is {:?} memory, not mapped by cuMemMap", a.kind),
        None => bail!(CUDA_ERROR_INVALID_VALUE, "{ptr:#x} is not mapped by cuMemMap"),
    }
}

/// cuMemGetAccess: CUmemAccess_flags of device `d` on the mapping holding `ptr`.
pub fn get_access(st: &State, ptr: u64, loc: Location) -> Result<u32> {
    if loc.type_ != LOCATION_DEVICE || loc.id < 0 || loc.id as usize >= st.devices() {
        bail!(CUDA_ERROR_INVALID_VALUE, "location {{type {}, id {}}} is not a device", loc.type_, loc.id);
    }
    let a = mapping_at(st, ptr)?;
    let v = a.vmm.as_ref().expect("a mapping");
    let bit = 1u64 << loc.id;
    Ok(if v.write.load(Ordering::Acquire) & bit != 0 {
        3
    } else if v.read.load(Ordering::Acquire) & bit != 0 {
        1
    } else {
        0
    })
}

/// cuMemRetainAllocationHandle: the handle of the allocation mapped at `ptr` (one more
/// reference, released by cuMemRelease).
pub fn retain(st: &mut State, ptr: u64) -> Result<u64> {
    let a = match st.mem.find_dev(ptr) {
        Some(a) if a.kind == Kind::Vmm && a.state() == LIVE => a.clone(),
        _ => bail!(
            CUDA_ERROR_INVALID_VALUE,
            "{ptr:#x} is not mapped by cuMemMap ({})",
            st.mem.find_dev(ptr).map_or("not device memory".to_string(), |a| format!("{:?} memory", a.kind))
        ),
    };
    let h = a.vmm.as_ref().expect("a mapping").handle;
    st.vmm.handles.get_mut(&h).ok_or_else(|| err!(CUDA_ERROR_INVALID_VALUE, "stale mapping"))?.refs += 1;
    Ok(h)
}

/// cuMemGetAllocationPropertiesFromHandle.
pub fn properties(st: &State, h: u64) -> Result<Prop> {
    let p = st.vmm.phys(h)?;
    Ok(Prop {
        type_: ALLOCATION_PINNED,
        handle_types: p.handle_types,
        location: Location { type_: LOCATION_DEVICE, id: p.device },
        win32: std::ptr::null_mut(),
        compression: 0,
        rdma: 0,
        usage: 0,
        reserved: [0; 4],
    })
}

/// cuMemExportToShareableHandle: a new file descriptor of the allocation's memfd, for
/// allocations created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested.
pub fn export(st: &State, h: u64, handle_type: u32, flags: u64) -> Result<i32> {
    if flags != 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "flags {flags:#x} must be 0");
    }
    let p = st.vmm.phys(h)?;
    match handle_type {
        HANDLE_POSIX_FD => {}
        // The driver accepts the fabric type at cuMemCreate and refuses it here.
        HANDLE_FABRIC => bail!(
            CUDA_ERROR_INVALID_VALUE,
            "fabric handles: CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 0 (no IMEX)"
        ),
        HANDLE_WIN32 | HANDLE_WIN32_KMT => {
            bail!(CUDA_ERROR_NOT_SUPPORTED, "handle type {handle_type}: Win32 handles on Linux")
        }
        _ => bail!(CUDA_ERROR_INVALID_VALUE, "handle type {handle_type} is not one CUmemAllocationHandleType value"),
    }
    if p.handle_types & HANDLE_POSIX_FD == 0 {
        bail!(
            CUDA_ERROR_INVALID_VALUE,
            "the allocation was created without CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in \
             prop.requestedHandleTypes ({:#x})",
            p.handle_types
        );
    }
    let fd = p.backing.fd.as_ref().ok_or_else(|| err!(CUDA_ERROR_UNKNOWN, "allocation without its memfd"))?;
    let own = dup(fd.as_fd())?;
    Ok(std::os::fd::IntoRawFd::into_raw_fd(own))
}

/// cuMemImportFromShareableHandle of a POSIX file descriptor (the caller keeps and closes it).
pub fn import(st: &mut State, fd: i32, handle_type: u32) -> Result<u64> {
    match handle_type {
        HANDLE_POSIX_FD => {}
        HANDLE_FABRIC => bail!(
            CUDA_ERROR_INVALID_VALUE,
            "fabric handles: CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_FABRIC_SUPPORTED is 0 (no IMEX)"
        ),
        HANDLE_WIN32 | HANDLE_WIN32_KMT => {
            bail!(CUDA_ERROR_NOT_SUPPORTED, "handle type {handle_type}: Win32 handles on Linux")
        }
        _ => bail!(CUDA_ERROR_INVALID_VALUE, "handle type {handle_type} is not one CUmemAllocationHandleType value"),
    }
    // SAFETY: F_GETFD only asks whether `fd` is open.
    if fd < 0 || unsafe { libc::fcntl(fd, libc::F_GETFD) } < 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "{fd} is not an open file descriptor");
    }
    let target =
        std::fs::read_link(format!("/proc/self/fd/{fd}")).map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
    let name = target.strip_prefix("/memfd:fccl-vmm-").map(|n| n.trim_end_matches(" (deleted)"));
    let fields: Vec<&str> = name.map(|n| n.split('-').collect()).unwrap_or_default();
    let (Some(phys_dev), Some(types)) =
        (fields.get(2).and_then(|v| v.parse::<usize>().ok()), fields.get(3).and_then(|v| v.parse::<u32>().ok()))
    else {
        bail!(CUDA_ERROR_INVALID_VALUE, "fd {fd} ({target}) is not a shareable handle of cuMemExportToShareableHandle");
    };
    let Some(device) = st.cfg.visible.iter().position(|&p| p == phys_dev) else {
        bail!(CUDA_ERROR_INVALID_DEVICE, "fd {fd}: its memory is on physical device {phys_dev}, not visible here");
    };
    // SAFETY: `fd` is open (checked above) and borrowed only for this call.
    let own = dup(unsafe { BorrowedFd::borrow_raw(fd) })?;
    // SAFETY: `st` is a plain stat buffer for fstat to fill.
    let mut sb: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid fd and out-pointer.
    if unsafe { libc::fstat(own.as_raw_fd(), &mut sb) } != 0 || sb.st_size <= 0 {
        bail!(CUDA_ERROR_INVALID_VALUE, "fd {fd}: cannot read its size");
    }
    let size = sb.st_size as usize;
    let backing = Backing::map(own, round_up(size, PAGE).unwrap_or(size))?;
    Ok(insert(st, Phys { backing, size, device: device as i32, handle_types: types, charged: false }))
}
