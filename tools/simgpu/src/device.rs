//! Simulated devices: an H100-like GPU per physical ordinal; PCI bus id and UUID depend on
//! the physical ordinal only, so every process sees the same values for the same GPU.

use crate::error::{bail, Result};
use crate::state::State;
use cudarc::driver::sys::CUdevice_attribute as A;

pub const NAME: &str = "ferroccl simulated GPU";
pub const CC: (i32, i32) = (9, 0);
pub const SM_COUNT: i32 = 132;

/// A visible device ordinal, checked.
pub fn check(st: &State, dev: i32) -> Result<i32> {
    if dev < 0 || dev as usize >= st.devices() {
        bail!(CUDA_ERROR_INVALID_DEVICE, "device {dev} is not one of the {} visible devices", st.devices());
    }
    Ok(dev)
}

/// PCI bus number of a physical device.
pub fn bus(physical: usize) -> i32 {
    0x10 + physical as i32
}

/// `0000:%02x:00.0`, as cuDeviceGetPCIBusId writes it.
pub fn bus_id(physical: usize) -> String {
    format!("0000:{:02x}:00.0", bus(physical))
}

/// Parses `[domain:]bus:device[.function]` (hex), the forms cuDeviceGetByPCIBusId accepts.
pub fn parse_bus_id(s: &str) -> Option<(u32, u32, u32)> {
    let s = s.trim();
    let parts: Vec<&str> = s.split(':').collect();
    let (dom, bus, rest) = match parts.as_slice() {
        [d, b, r] => (u32::from_str_radix(d, 16).ok()?, *b, *r),
        [b, r] => (0, *b, *r),
        _ => return None,
    };
    let dev = rest.split('.').next()?;
    Some((dom, u32::from_str_radix(bus, 16).ok()?, u32::from_str_radix(dev, 16).ok()?))
}

/// `cuDeviceGetAttribute`: `None` for values that are not attributes (CUDA_ERROR_INVALID_VALUE).
pub fn attribute(st: &State, attr: i32, dev: i32) -> Option<i32> {
    if !(1..A::CU_DEVICE_ATTRIBUTE_MAX as i32).contains(&attr) {
        return None;
    }
    // SAFETY: CUdevice_attribute is a `repr(u32)` enum whose variants are exactly the
    // contiguous values 1..CU_DEVICE_ATTRIBUTE_MAX (checked above); MAX itself is excluded.
    let a: A = unsafe { std::mem::transmute::<u32, A>(attr as u32) };
    let phys = st.physical(dev);
    Some(match a {
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK => 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X | A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y => 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z => 64,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X => i32::MAX,
        A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y | A::CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z => 65535,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK => 49152,
        A::CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY => 65536,
        A::CU_DEVICE_ATTRIBUTE_WARP_SIZE => 32,
        A::CU_DEVICE_ATTRIBUTE_MAX_PITCH => i32::MAX,
        A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK | A::CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_MULTIPROCESSOR => {
            65536
        }
        A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE => 1_980_000,
        A::CU_DEVICE_ATTRIBUTE_TEXTURE_ALIGNMENT => 512,
        A::CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT => 32,
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT => SM_COUNT,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_MODE => 0,
        A::CU_DEVICE_ATTRIBUTE_INTEGRATED => 0,
        A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => bus(phys),
        A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID | A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => 0,
        A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE => 2_619_000,
        A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH => 5120,
        A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE => 50 << 20,
        A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR => 2048,
        A::CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT => 2,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR => CC.0,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR => CC.1,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR => 233_472,
        A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN => 232_448,
        A::CU_DEVICE_ATTRIBUTE_RESERVED_SHARED_MEMORY_PER_BLOCK => 1024,
        A::CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR => 32,
        A::CU_DEVICE_ATTRIBUTE_SINGLE_TO_DOUBLE_PRECISION_PERF_RATIO => 2,
        A::CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID => phys as i32,
        A::CU_DEVICE_ATTRIBUTE_MEM_SYNC_DOMAIN_COUNT => 4,
        A::CU_DEVICE_ATTRIBUTE_NUMA_ID | A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID => -1,
        // Capabilities the simulator has.
        A::CU_DEVICE_ATTRIBUTE_GPU_OVERLAP
        | A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY
        | A::CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS
        | A::CU_DEVICE_ATTRIBUTE_ECC_ENABLED
        | A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
        | A::CU_DEVICE_ATTRIBUTE_STREAM_PRIORITIES_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_GLOBAL_L1_CACHE_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_LOCAL_L1_CACHE_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY
        | A::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS
        | A::CU_DEVICE_ATTRIBUTE_COMPUTE_PREEMPTION_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM
        | A::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS
        | A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR
        | A::CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH
        | A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
        | A::CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED => 1,
        // Everything else (textures, VMM, RDMA, MPS, ...): not simulated.
        _ => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_parse_in_every_form() {
        assert_eq!(bus_id(0), "0000:10:00.0");
        assert_eq!(parse_bus_id("0000:11:00.0"), Some((0, 0x11, 0)));
        assert_eq!(parse_bus_id("11:00"), Some((0, 0x11, 0)));
        assert_eq!(parse_bus_id("00000000:1A:00.0"), Some((0, 0x1a, 0)));
        assert_eq!(parse_bus_id("zz"), None);
    }
}
