//! Device queries and memory pools.

use super::{non_null, out, out_str};
use crate::config;
use crate::device;
use crate::error::{bail, err};
use crate::state::{api, lock};
use cudarc::driver::sys::{CUdevice, CUresult, CUuuid};
use std::ffi::{c_char, c_int, c_void, CStr};

/// Device handle for ordinal `ordinal` (the ordinal itself); out of range is CUDA_ERROR_INVALID_DEVICE.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut CUdevice, ordinal: c_int) -> CUresult {
    api("cuDeviceGet", || {
        non_null(dev, "device")?;
        let d = device::check(&lock(), ordinal)?;
        // SAFETY: checked non-NULL.
        unsafe { out(dev, d, "device") }
    })
}

/// Number of visible devices (FERROCCL_SIM_DEVICES filtered by CUDA_VISIBLE_DEVICES).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut c_int) -> CUresult {
    api("cuDeviceGetCount", || {
        let n = lock().devices() as c_int;
        // SAFETY: `out` checks NULL.
        unsafe { out(count, n, "count") }
    })
}

/// "ferroccl simulated GPU", truncated to `len` like the driver.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    api("cuDeviceGetName", || {
        device::check(&lock(), dev)?;
        // SAFETY: `out_str` checks NULL; the caller's buffer holds `len` bytes.
        unsafe { out_str(name, len, device::NAME, "name") }
    })
}

fn uuid_of(dev: CUdevice) -> crate::error::Result<CUuuid> {
    let st = lock();
    device::check(&st, dev)?;
    let bytes = config::uuid(st.physical(dev));
    Ok(CUuuid { bytes: bytes.map(|b| b as c_char) })
}

/// The deterministic UUID of the physical device (the same in every process).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: `out` checks NULL.
    api("cuDeviceGetUuid", || unsafe { out(uuid, uuid_of(dev)?, "uuid") })
}

/// As cuDeviceGetUuid.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut CUuuid, dev: CUdevice) -> CUresult {
    // SAFETY: `out` checks NULL.
    api("cuDeviceGetUuid_v2", || unsafe { out(uuid, uuid_of(dev)?, "uuid") })
}

/// FERROCCL_SIM_MEM_MB (default 8192) MiB.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: CUdevice) -> CUresult {
    api("cuDeviceTotalMem_v2", || {
        let st = lock();
        device::check(&st, dev)?;
        // SAFETY: `out` checks NULL.
        unsafe { out(bytes, st.cfg.mem_bytes, "bytes") }
    })
}

/// `0000:%02x:00.0` with bus 0x10 + physical ordinal.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetPCIBusId(bus_id: *mut c_char, len: c_int, dev: CUdevice) -> CUresult {
    api("cuDeviceGetPCIBusId", || {
        let st = lock();
        device::check(&st, dev)?;
        // SAFETY: `out_str` checks NULL; the caller's buffer holds `len` bytes.
        unsafe { out_str(bus_id, len, &device::bus_id(st.physical(dev)), "pciBusId") }
    })
}

/// The visible device with that bus id (`[domain:]bus:device[.function]`, hex).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetByPCIBusId(dev: *mut CUdevice, bus_id: *const c_char) -> CUresult {
    api("cuDeviceGetByPCIBusId", || {
        non_null(dev, "dev")?;
        non_null(bus_id, "pciBusId")?;
        // SAFETY: a NUL-terminated string (caller).
        let s = unsafe { CStr::from_ptr(bus_id) }.to_string_lossy().into_owned();
        let (dom, bus, d) =
            device::parse_bus_id(&s).ok_or_else(|| err!(CUDA_ERROR_INVALID_VALUE, "{s:?} is not a PCI bus id"))?;
        let st = lock();
        let found = (0..st.devices() as i32).find(|&v| dom == 0 && d == 0 && bus as i32 == device::bus(st.physical(v)));
        let Some(v) = found else { bail!(CUDA_ERROR_INVALID_DEVICE, "no visible device has bus id {s:?}") };
        // SAFETY: checked non-NULL.
        unsafe { out(dev, v, "dev") }
    })
}

/// 9.0.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceComputeCapability(major: *mut c_int, minor: *mut c_int, dev: CUdevice) -> CUresult {
    api("cuDeviceComputeCapability", || {
        device::check(&lock(), dev)?;
        non_null(minor, "minor")?;
        // SAFETY: `out` checks NULL.
        unsafe {
            out(major, device::CC.0, "major")?;
            out(minor, device::CC.1, "minor")
        }
    })
}

/// The stock-driver profile's value (tools/simgpu/profile/stock-hopper.json; 0 for what
/// the simulator does not implement), CUDA_ERROR_INVALID_VALUE outside the enum.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetAttribute(pi: *mut c_int, attrib: c_int, dev: CUdevice) -> CUresult {
    api("cuDeviceGetAttribute", || {
        let st = lock();
        device::check(&st, dev)?;
        let v = device::attribute(&st, attrib, dev)
            .ok_or_else(|| err!(CUDA_ERROR_INVALID_VALUE, "{attrib} is not a device attribute"))?;
        // SAFETY: `out` checks NULL.
        unsafe { out(pi, v, "pi") }
    })
}

/// 1 between two different devices, 0 for a device and itself.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceCanAccessPeer(can: *mut c_int, dev: CUdevice, peer: CUdevice) -> CUresult {
    api("cuDeviceCanAccessPeer", || {
        let st = lock();
        device::check(&st, dev)?;
        device::check(&st, peer)?;
        // SAFETY: `out` checks NULL.
        unsafe { out(can, (dev != peer) as c_int, "canAccessPeer") }
    })
}

/// Peer attributes: performance rank 0, access and native atomics supported between
/// different devices; CUDA_ERROR_INVALID_DEVICE for a device and itself.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetP2PAttribute(
    value: *mut c_int,
    attrib: c_int,
    src: CUdevice,
    dst: CUdevice,
) -> CUresult {
    api("cuDeviceGetP2PAttribute", || {
        let st = lock();
        device::check(&st, src)?;
        device::check(&st, dst)?;
        if src == dst {
            bail!(CUDA_ERROR_INVALID_DEVICE, "source and destination are both device {src}");
        }
        let v = match attrib {
            1 => 0,     // PERFORMANCE_RANK
            2..=4 => 1, // ACCESS_SUPPORTED, NATIVE_ATOMIC_SUPPORTED, ACCESS_ACCESS_SUPPORTED
            5 => 0,     // ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED
            _ => bail!(CUDA_ERROR_INVALID_VALUE, "{attrib} is not a P2P attribute"),
        };
        // SAFETY: `out` checks NULL.
        unsafe { out(value, v, "value") }
    })
}

/// The device's default memory pool (a handle; pools have no other state in the simulator).
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetDefaultMemPool(pool: *mut *mut c_void, dev: CUdevice) -> CUresult {
    api("cuDeviceGetDefaultMemPool", || {
        let st = lock();
        device::check(&st, dev)?;
        // SAFETY: `out` checks NULL.
        unsafe { out(pool, st.pools[dev as usize] as *mut c_void, "pool") }
    })
}

/// The current pool of a device: always its default pool.
#[no_mangle]
pub unsafe extern "C" fn cuDeviceGetMemPool(pool: *mut *mut c_void, dev: CUdevice) -> CUresult {
    // SAFETY: same contract.
    unsafe { cuDeviceGetDefaultMemPool(pool, dev) }
}

fn check_pool(st: &crate::state::State, pool: *mut c_void) -> crate::error::Result<usize> {
    st.pools
        .iter()
        .position(|&p| p == pool as u64)
        .ok_or_else(|| err!(CUDA_ERROR_INVALID_VALUE, "{pool:?} is not a memory pool"))
}

/// Accepted and ignored (the pool has no reuse policy to tune); attribute values are checked.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolSetAttribute(pool: *mut c_void, attr: c_int, value: *mut c_void) -> CUresult {
    api("cuMemPoolSetAttribute", || {
        check_pool(&lock(), pool)?;
        non_null(value, "value")?;
        if !(1..=8).contains(&attr) {
            bail!(CUDA_ERROR_INVALID_VALUE, "{attr} is not a memory pool attribute");
        }
        Ok(())
    })
}

/// 0 for every attribute (4-byte for the reuse flags 1-3, 8-byte for the sizes 4-8).
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolGetAttribute(pool: *mut c_void, attr: c_int, value: *mut c_void) -> CUresult {
    api("cuMemPoolGetAttribute", || {
        check_pool(&lock(), pool)?;
        non_null(value, "value")?;
        match attr {
            // SAFETY: an int-sized value (caller).
            1..=3 => unsafe { (value as *mut c_int).write_unaligned(0) },
            // SAFETY: a cuuint64_t-sized value (caller).
            4..=8 => unsafe { (value as *mut u64).write_unaligned(0) },
            _ => bail!(CUDA_ERROR_INVALID_VALUE, "{attr} is not a memory pool attribute"),
        }
        Ok(())
    })
}

/// Nothing to trim: freed memory is returned at once.
#[no_mangle]
pub unsafe extern "C" fn cuMemPoolTrimTo(pool: *mut c_void, _min_bytes_to_keep: usize) -> CUresult {
    api("cuMemPoolTrimTo", || check_pool(&lock(), pool).map(|_| ()))
}
