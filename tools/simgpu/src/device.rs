//! Simulated devices: an H100/H200 as a stock driver describes it. Every device attribute comes
//! from the stock-driver profile (`profile/stock-hopper.json`, compiled in; docs/sim-gpu.md):
//! the profile's value, a value computed per device (PCI bus id, ...), or 0 for a capability
//! the simulator does not implement (never more than a stock driver offers). PCI bus id and
//! UUID depend on the physical ordinal only, so every process sees the same values for the
//! same GPU.

use crate::error::{bail, Error, Result};
use crate::state::State;
use cudarc::driver::sys::{CUdevice_attribute as A, CUresult};
use serde_json::Value;
use std::collections::HashMap;
use std::sync::OnceLock;

pub const NAME: &str = "ferroccl simulated GPU";
/// COMPUTE_CAPABILITY_MAJOR / MINOR of the profile (checked when it is parsed).
pub const CC: (i32, i32) = (9, 0);
/// MULTIPROCESSOR_COUNT of the profile (checked when it is parsed).
pub const SM_COUNT: i32 = 132;

/// The stock-driver profile, compiled in: the simulator reads no file at run time.
pub const PROFILE_JSON: &str = include_str!("../profile/stock-hopper.json");

/// How the simulator reports one attribute.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Report {
    /// The stock value.
    Value(i32),
    /// Depends on the device (PCI ids, NUMA ids, board group): computed by [`per_device`].
    PerDevice,
    /// A capability the simulator does not implement: reported as 0 (the stock value is `stock`).
    NotSimulated { stock: i32, why: String },
}

/// The profile, parsed and checked.
pub struct Profile {
    pub name: String,
    pub driver_version: i32,
    /// Indexed by attribute id (0 unused): the enum name and how it is reported.
    attrs: Vec<Option<(String, Report)>>,
    /// Entry point -> None where a stock driver serves it, Some(code) where every call returns code.
    entry_points: HashMap<String, Option<CUresult>>,
}

/// The attribute enum value `attr`, if it is one (1..CU_DEVICE_ATTRIBUTE_MAX).
pub fn attr_enum(attr: i32) -> Option<A> {
    if !(1..A::CU_DEVICE_ATTRIBUTE_MAX as i32).contains(&attr) {
        return None;
    }
    // SAFETY: CUdevice_attribute is a `repr(u32)` enum whose variants are exactly the
    // contiguous values 1..CU_DEVICE_ATTRIBUTE_MAX (checked above); MAX itself is excluded.
    Some(unsafe { std::mem::transmute::<u32, A>(attr as u32) })
}

/// The CUresult named `name` ("CUDA_ERROR_NOT_SUPPORTED").
fn code_named(name: &str) -> Option<CUresult> {
    (0..=1000u32)
        .find(|&v| crate::error::name(v).is_some_and(|n| n.to_bytes() == name.as_bytes()))
        .and_then(crate::error::from_raw)
}

fn bad(why: String) -> Error {
    Error::new(CUresult::CUDA_ERROR_UNKNOWN, why)
}

impl Profile {
    /// Parses and checks a profile: every attribute of the enum exactly once under its enum
    /// name, integer values, per-device attributes the simulator can compute, known CUresults.
    pub fn parse(text: &str) -> Result<Profile> {
        let v: Value = serde_json::from_str(text).map_err(|e| bad(format!("not JSON: {e}")))?;
        let int = |v: &Value, what: &str| -> Result<i32> {
            v.as_i64().and_then(|x| i32::try_from(x).ok()).ok_or_else(|| bad(format!("{what} is not a 32-bit integer")))
        };
        let name = v["profile"].as_str().ok_or_else(|| bad("no \"profile\" name".into()))?.to_string();
        let driver_version = int(&v["driver_version"], "driver_version")?;
        let mut ns = HashMap::new();
        for e in v["not_simulated"].as_array().ok_or_else(|| bad("no \"not_simulated\" list".into()))? {
            let (Some(n), Some(why)) = (e["name"].as_str(), e["why"].as_str()) else {
                return Err(bad(format!("not_simulated entry {e} needs a name and a why")));
            };
            ns.insert(n.to_string(), why.to_string());
        }
        let max = A::CU_DEVICE_ATTRIBUTE_MAX as usize;
        let mut attrs: Vec<Option<(String, Report)>> = vec![None; max];
        let table = v["attributes"].as_object().ok_or_else(|| bad("no \"attributes\" object".into()))?;
        for (n, e) in table {
            let id = int(&e["id"], &format!("{n}.id"))?;
            let a = attr_enum(id).ok_or_else(|| bad(format!("{n}: id {id} is not a CUdevice_attribute")))?;
            if format!("{a:?}") != *n {
                return Err(bad(format!("{n}: id {id} is {a:?} in cudarc's enum")));
            }
            if attrs[id as usize].is_some() {
                return Err(bad(format!("{n}: id {id} appears twice")));
            }
            let value = int(&e["value"], &format!("{n}.value"))?;
            let report = if e["per_device"].as_bool() == Some(true) {
                if per_device(a, 0).is_none() {
                    return Err(bad(format!("{n} is per_device, and the simulator has no way to compute it")));
                }
                if ns.contains_key(n) {
                    return Err(bad(format!("{n} is both per_device and not_simulated")));
                }
                Report::PerDevice
            } else if let Some(why) = ns.remove(n) {
                Report::NotSimulated { stock: value, why }
            } else {
                Report::Value(value)
            };
            attrs[id as usize] = Some((n.clone(), report));
        }
        if let Some(n) = ns.keys().next() {
            return Err(bad(format!("not_simulated names {n}, which is not in \"attributes\"")));
        }
        if let Some(id) = (1..max).find(|&i| attrs[i].is_none()) {
            return Err(bad(format!("attribute {:?} ({id}) is missing", attr_enum(id as i32))));
        }
        let mut entry_points = HashMap::new();
        let eps = v["entry_points"].as_object().ok_or_else(|| bad("no \"entry_points\" object".into()))?;
        for (n, e) in eps {
            let stock = match e.as_str() {
                Some("available") => None,
                Some(s) => Some(code_named(s).ok_or_else(|| bad(format!("entry point {n}: {s} is not a CUresult")))?),
                None => return Err(bad(format!("entry point {n}: {e} is not a string"))),
            };
            entry_points.insert(n.clone(), stock);
        }
        let p = Profile { name, driver_version, attrs, entry_points };
        let get = |a: A| p.report(a as i32).cloned();
        let want = [
            (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, CC.0),
            (A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, CC.1),
            (A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, SM_COUNT),
        ];
        for (a, v) in want {
            if get(a) != Some(Report::Value(v)) {
                return Err(bad(format!("{a:?} must be {v}, as device::CC / SM_COUNT say")));
            }
        }
        Ok(p)
    }

    /// How attribute `id` is reported; None outside the enum.
    pub fn report(&self, id: i32) -> Option<&Report> {
        attr_enum(id)?;
        self.attrs[id as usize].as_ref().map(|(_, r)| r)
    }

    /// The enum name of attribute `id`.
    pub fn attr_name(&self, id: i32) -> Option<&str> {
        attr_enum(id)?;
        self.attrs[id as usize].as_ref().map(|(n, _)| n.as_str())
    }

    /// Some(code) where a stock driver answers every call of entry point `name` with code;
    /// None where it serves it (or the profile does not name it).
    pub fn refusal(&self, name: &str) -> Option<CUresult> {
        self.entry_points.get(name).copied().flatten()
    }
}

/// The compiled-in profile, parsed once. It is checked by this crate's tests, so a broken one
/// never ships; if it did, every attribute query would fail with the reason.
pub fn profile() -> &'static Profile {
    static P: OnceLock<Profile> = OnceLock::new();
    P.get_or_init(|| {
        Profile::parse(PROFILE_JSON).unwrap_or_else(|e| panic!("tools/simgpu/profile/stock-hopper.json: {}", e.why))
    })
}

/// The value of a per-device attribute on physical device `phys`; None for the others.
pub fn per_device(a: A, phys: usize) -> Option<i32> {
    Some(match a {
        A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID => bus(phys),
        A::CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID | A::CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID => 0,
        A::CU_DEVICE_ATTRIBUTE_MULTI_GPU_BOARD_GROUP_ID => phys as i32,
        // No NUMA node of its own, and the simulated host has none to name.
        A::CU_DEVICE_ATTRIBUTE_NUMA_ID | A::CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID => -1,
        A::CU_DEVICE_ATTRIBUTE_GPU_PCI_DEVICE_ID | A::CU_DEVICE_ATTRIBUTE_GPU_PCI_SUBSYSTEM_ID => 0,
        _ => return None,
    })
}

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
/// The profile's value; per-device ones computed; 0 for what the simulator does not implement.
pub fn attribute(st: &State, attr: i32, dev: i32) -> Option<i32> {
    let a = attr_enum(attr)?;
    Some(match profile().report(attr)? {
        Report::Value(v) => *v,
        Report::NotSimulated { .. } => 0,
        Report::PerDevice => per_device(a, st.physical(dev))?,
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

    #[test]
    fn the_profile_parses_and_agrees_with_the_constants() {
        let p = profile();
        assert_eq!(p.report(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT as i32), Some(&Report::Value(SM_COUNT)));
        assert_eq!(p.report(A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1 as i32), Some(&Report::Value(0)));
        assert_eq!(p.report(A::CU_DEVICE_ATTRIBUTE_PCI_BUS_ID as i32), Some(&Report::PerDevice));
        assert_eq!(p.refusal("cuStreamWaitValue32"), Some(CUresult::CUDA_ERROR_NOT_SUPPORTED));
        assert_eq!(p.refusal("cuStreamWaitValue32_v2"), None);
        assert_eq!(p.report(0), None);
        assert_eq!(p.report(A::CU_DEVICE_ATTRIBUTE_MAX as i32), None);
    }

    #[test]
    fn a_broken_profile_is_refused_with_the_reason() {
        let mut v: Value = serde_json::from_str(PROFILE_JSON).unwrap();
        v["attributes"].as_object_mut().unwrap().remove("CU_DEVICE_ATTRIBUTE_WARP_SIZE");
        let e = Profile::parse(&v.to_string()).err().expect("a missing attribute");
        assert!(e.why.contains("CU_DEVICE_ATTRIBUTE_WARP_SIZE"), "{}", e.why);
        let mut v: Value = serde_json::from_str(PROFILE_JSON).unwrap();
        v["attributes"]["CU_DEVICE_ATTRIBUTE_WARP_SIZE"]["per_device"] = Value::Bool(true);
        assert!(Profile::parse(&v.to_string()).is_err(), "a per-device attribute the simulator cannot compute");
        let mut v: Value = serde_json::from_str(PROFILE_JSON).unwrap();
        v["entry_points"]["cuInit"] = Value::from("CUDA_ERROR_NO_SUCH_THING");
        assert!(Profile::parse(&v.to_string()).is_err(), "an unknown CUresult");
    }
}
