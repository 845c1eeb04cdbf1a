//! CUDA virtual memory management (cuMemCreate memory, as PyTorch's expandable segments
//! allocate): the physical allocation behind an address, exported and imported as a POSIX
//! file descriptor, and peers' allocations mapped side by side into one reservation.

use super::*;
use std::os::fd::{FromRawFd, OwnedFd};

const VMM_SYMBOLS: &[&str] = &[
    "cuMemRetainAllocationHandle",
    "cuMemRelease",
    "cuMemGetAllocationPropertiesFromHandle",
    "cuMemExportToShareableHandle",
    "cuMemImportFromShareableHandle",
    "cuMemAddressReserve",
    "cuMemAddressFree",
    "cuMemMap",
    "cuMemUnmap",
    "cuMemSetAccess",
];

/// CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
pub const HANDLE_POSIX_FD: u32 = 1;

/// Ok when the driver has the VMM calls sharing needs.
pub fn vmm_ready() -> Result<()> {
    static R: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    R.get_or_init(|| {
        driver().map_err(|e| e.msg)?;
        // SAFETY: the driver is present; only addresses are looked up.
        let lib = unsafe { cu::culib() };
        for s in VMM_SYMBOLS {
            // SAFETY: as above.
            if unsafe { lib.get::<*const ()>(s.as_bytes()) }.is_err() {
                return Err(format!("the CUDA driver lacks {s}"));
            }
        }
        Ok(())
    })
    .clone()
    .map_err(|m| Error::unavailable(format!("CUDA virtual memory management is unavailable: {m}")))
}

/// CUmemAllocationProp as the driver writes it, read as plain integers (a newer driver's
/// enum values must not become invalid Rust enums).
#[repr(C)]
struct RawProp {
    type_: u32,
    handle_types: u32,
    location_type: u32,
    location_id: i32,
    win32: *mut std::ffi::c_void,
    alloc_flags: [u8; 8],
}

/// A reference to the physical allocation mapped at an address (cuMemRetainAllocationHandle);
/// released on drop.
pub struct Retained(u64);

impl Retained {
    /// The allocation mapped at `p`, or the driver's error (memory not made by cuMemMap).
    pub fn at(p: *const u8) -> Result<Retained> {
        vmm_ready()?;
        let mut h: cu::CUmemGenericAllocationHandle = 0;
        // SAFETY: valid out-pointer; the driver only looks the address up.
        let rc = unsafe { cu::cuMemRetainAllocationHandle(&mut h, p as *mut std::ffi::c_void) };
        check(rc, "cuMemRetainAllocationHandle")?;
        Ok(Retained(h))
    }

    /// The handle types the allocation was created with (CU_MEM_HANDLE_TYPE_* bits).
    pub fn handle_types(&self) -> Result<u32> {
        let mut p = RawProp {
            type_: 0,
            handle_types: 0,
            location_type: 0,
            location_id: 0,
            win32: std::ptr::null_mut(),
            alloc_flags: [0; 8],
        };
        // SAFETY: RawProp has CUmemAllocationProp's layout; the handle is live.
        let rc = unsafe { cu::cuMemGetAllocationPropertiesFromHandle((&mut p as *mut RawProp).cast(), self.0) };
        check(rc, "cuMemGetAllocationPropertiesFromHandle")?;
        Ok(p.handle_types)
    }

    /// A new POSIX file descriptor of the allocation (cuMemExportToShareableHandle).
    pub fn export_fd(&self) -> Result<OwnedFd> {
        let mut fd: i32 = -1;
        let t = cu::CUmemAllocationHandleType_enum(HANDLE_POSIX_FD);
        // SAFETY: valid out-pointer of an int, as the POSIX handle type writes.
        let rc = unsafe { cu::cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), self.0, t, 0) };
        check(rc, "cuMemExportToShareableHandle(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)")?;
        // SAFETY: the driver made this descriptor for us to own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for Retained {
    fn drop(&mut self) {
        // SAFETY: one reference this value holds.
        unsafe { cu::cuMemRelease(self.0) };
    }
}

/// A physical allocation another process exported, imported here; released on drop (the
/// memory stays while mapped).
pub struct Imported {
    handle: u64,
    pub size: usize,
}

impl Imported {
    /// Imports the allocation of `fd` (which the caller still closes) of `size` bytes.
    pub fn from_fd(fd: &OwnedFd, size: usize) -> Result<Imported> {
        vmm_ready()?;
        let mut h: cu::CUmemGenericAllocationHandle = 0;
        let raw = std::os::fd::AsRawFd::as_raw_fd(fd);
        let t = cu::CUmemAllocationHandleType_enum(HANDLE_POSIX_FD);
        // SAFETY: valid out-pointer; the POSIX handle type takes the descriptor as the value.
        let rc = unsafe { cu::cuMemImportFromShareableHandle(&mut h, raw as usize as *mut std::ffi::c_void, t) };
        check(rc, "cuMemImportFromShareableHandle")?;
        Ok(Imported { handle: h, size })
    }
}

impl Drop for Imported {
    fn drop(&mut self) {
        // SAFETY: the reference the import made.
        unsafe { cu::cuMemRelease(self.handle) };
    }
}

/// Maps `chunks` side by side into one fresh reservation, read-write for `device`:
/// the start address. Undone on failure.
pub fn map_side_by_side(chunks: &[&Imported], device: i32) -> Result<usize> {
    let total: usize = chunks.iter().map(|c| c.size).sum();
    // Chunk sizes are multiples of the granularity: so is their largest power-of-two divisor.
    let align = chunks.first().map_or(0, |c| if c.size == 0 { 0 } else { 1usize << c.size.trailing_zeros() });
    let mut va: cu::CUdeviceptr = 0;
    // SAFETY: valid out-pointer; the alignment is a power of two.
    check(unsafe { cu::cuMemAddressReserve(&mut va, total, align, 0, 0) }, "cuMemAddressReserve")?;
    let mut at = 0usize;
    let mut res = Ok(());
    for c in chunks {
        // SAFETY: inside the fresh reservation; the handle is live.
        res = check(unsafe { cu::cuMemMap(va + at as u64, c.size, 0, c.handle, 0) }, "cuMemMap");
        if res.is_err() {
            break;
        }
        at += c.size;
    }
    if res.is_ok() {
        let desc = cu::CUmemAccessDesc {
            location: cu::CUmemLocation { type_: cu::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE, id: device },
            flags: cu::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the range is mapped; one descriptor.
        res = check(unsafe { cu::cuMemSetAccess(va, total, &desc, 1) }, "cuMemSetAccess");
    }
    if let Err(e) = res {
        // SAFETY: what was mapped of the fresh reservation, which nothing uses yet.
        unsafe {
            if at > 0 {
                cu::cuMemUnmap(va, at);
            }
            cu::cuMemAddressFree(va, total);
        }
        return Err(e);
    }
    Ok(va as usize)
}

/// Undoes [`map_side_by_side`].
///
/// # Safety
/// `va`/`len` came from `map_side_by_side` and no queued work uses them.
pub unsafe fn unmap_side_by_side(va: usize, len: usize) -> Result<()> {
    // SAFETY: per the caller.
    check(unsafe { cu::cuMemUnmap(va as u64, len) }, "cuMemUnmap")?;
    // SAFETY: the reservation map_side_by_side made, now empty.
    check(unsafe { cu::cuMemAddressFree(va as u64, len) }, "cuMemAddressFree")
}
