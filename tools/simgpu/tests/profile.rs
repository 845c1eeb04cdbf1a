//! The simulated GPU against its stock-driver profile (tools/simgpu/profile/stock-hopper.json):
//! every attribute and entry point the library relies on has a stock value there and the
//! simulator reports exactly it, the profile covers CUDA 13.0's whole attribute enum, the V1
//! stream memory operations are refused as a stock driver refuses them, and
//! tools/simgpu/capture-profile.py --check passes under the simulator.

mod common;
use common::*;
use cudarc::driver::sys::CUdevice_attribute as A;
use ferroccl_simgpu::device;
use serde_json::Value;
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

const HINT: &str = "add its stock value to tools/simgpu/profile/stock-hopper.json";
const NOT_SUPPORTED: CUresult = CUresult::CUDA_ERROR_NOT_SUPPORTED;
/// The V1 stream memory operations: a stock driver disables them (NVreg_EnableStreamMemOPs=0).
const V1_ENTRY_POINTS: [&str; 5] = [
    "cuStreamWaitValue32",
    "cuStreamWaitValue64",
    "cuStreamWriteValue32",
    "cuStreamWriteValue64",
    "cuStreamBatchMemOp",
];
const V1_ATTRIBUTES: [A; 3] = [
    A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1,
    A::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1,
    A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1,
];

fn profile() -> Value {
    serde_json::from_str(device::PROFILE_JSON).expect("the profile is JSON")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for e in entries {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The library's sources (src/ and nccl/src/ of the repository): (path from the root, text).
fn library_sources() -> Vec<(String, String)> {
    let root = repo();
    let mut files = Vec::new();
    for d in ["src", "nccl/src"] {
        rust_files(&root.join(d), &mut files);
    }
    assert!(files.len() > 20, "found only {} library sources under {}", files.len(), root.display());
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (p.strip_prefix(&root).unwrap_or(&p).display().to_string(), text)
        })
        .collect()
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// One string literal of Rust source: its contents, line, and whether it is the label
/// argument of a `check(rc, "...")` call (an error message naming a call, not a symbol).
struct Literal {
    text: String,
    line: usize,
    label: bool,
}

/// The string literals of Rust source, and the source with comments and literals blanked
/// (what is left is code). Enough of Rust's lexical grammar for the library's sources:
/// nested block comments, escapes, raw strings, byte/C string prefixes, char literals vs
/// lifetimes.
fn lex(src: &str) -> (Vec<Literal>, String) {
    let s: Vec<char> = src.chars().collect();
    let mut code = String::with_capacity(src.len());
    let mut lits = Vec::new();
    // For each open parenthesis, the identifier just before it ("check" for check(...)).
    let mut parens: Vec<String> = Vec::new();
    let (mut i, mut line) = (0, 1);
    let blank = |code: &mut String, c: char| code.push(if c == '\n' { '\n' } else { ' ' });
    while i < s.len() {
        let c = s[i];
        let next = s.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < s.len() && s[i] != '\n' {
                blank(&mut code, s[i]);
                i += 1;
            }
            continue;
        }
        if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < s.len() {
                if s[i] == '/' && s.get(i + 1) == Some(&'*') {
                    depth += 1;
                    code.push_str("  ");
                    i += 2;
                } else if s[i] == '*' && s.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    code.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    line += usize::from(s[i] == '\n');
                    blank(&mut code, s[i]);
                    i += 1;
                }
            }
            continue;
        }
        // A raw string: r"..." or r#"..."# (also br / cr), not the end of an identifier.
        let raw_start = c == 'r'
            && (i == 0 || !is_ident(s[i - 1]) || (matches!(s[i - 1], 'b' | 'c') && (i < 2 || !is_ident(s[i - 2]))));
        if raw_start && matches!(next, Some('"') | Some('#')) {
            let mut j = i + 1;
            let mut hashes = 0;
            while s.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if s.get(j) == Some(&'"') {
                let start_line = line;
                code.push(' ');
                for _ in 0..=hashes {
                    code.push(' ');
                }
                j += 1;
                let mut text = String::new();
                loop {
                    if j >= s.len() {
                        break;
                    }
                    if s[j] == '"' && (0..hashes).all(|k| s.get(j + 1 + k) == Some(&'#')) {
                        for _ in 0..=hashes {
                            code.push(' ');
                        }
                        j += 1 + hashes;
                        break;
                    }
                    line += usize::from(s[j] == '\n');
                    text.push(s[j]);
                    blank(&mut code, s[j]);
                    j += 1;
                }
                lits.push(Literal { text, line: start_line, label: parens.last().is_some_and(|p| p == "check") });
                i = j;
                continue;
            }
        }
        if c == '"' {
            let start_line = line;
            code.push(' ');
            let mut j = i + 1;
            let mut text = String::new();
            while j < s.len() && s[j] != '"' {
                if s[j] == '\\' {
                    text.push(s[j]);
                    blank(&mut code, s[j]);
                    j += 1;
                }
                if j < s.len() {
                    line += usize::from(s[j] == '\n');
                    text.push(s[j]);
                    blank(&mut code, s[j]);
                    j += 1;
                }
            }
            code.push(' ');
            lits.push(Literal { text, line: start_line, label: parens.last().is_some_and(|p| p == "check") });
            i = j + 1;
            continue;
        }
        if c == '\'' {
            // A char literal ('x', '\n', '\''); otherwise a lifetime or loop label.
            let end = if next == Some('\\') {
                (i + 3..s.len().min(i + 12)).find(|&k| s[k] == '\'')
            } else if s.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            if let Some(e) = end {
                for _ in i..=e {
                    code.push(' ');
                }
                i = e + 1;
                continue;
            }
        }
        if c == '(' {
            let before = code.trim_end();
            let ident: String =
                before.chars().rev().take_while(|&c| is_ident(c)).collect::<Vec<_>>().into_iter().rev().collect();
            parens.push(ident);
        } else if c == ')' {
            parens.pop();
        }
        line += usize::from(c == '\n');
        code.push(c);
        i += 1;
    }
    (lits, code)
}

/// `cu[A-Z][A-Za-z0-9_]*`: the shape of a driver entry point's name.
fn is_entry_point_name(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() > 3 && s.starts_with("cu") && b[2].is_ascii_uppercase() && s.chars().all(is_ident)
}

#[test]
fn the_lexer_finds_literals_labels_and_code() {
    let src = "// \"cuNotThis\"\nlet a = lib.get(\"cuA_v2\"); /* \"cuNo\" /* nested */ \"cuNo\" */\n\
               check(cu::cuB_v2(x, 'y', '\\'', f(\"cuC\")), \"cuB\")?; let r = r#\"cuD\"#; fn f<'a>(x: &'a str) {}\n\
               let c = c\"cuE\";";
    let (lits, code) = lex(src);
    let got: Vec<(&str, usize, bool)> = lits.iter().map(|l| (l.text.as_str(), l.line, l.label)).collect();
    assert_eq!(got, [("cuA_v2", 2, false), ("cuC", 3, false), ("cuB", 3, true), ("cuD", 3, false), ("cuE", 4, false)]);
    assert!(code.contains("cu::cuB_v2") && !code.contains("cuNo") && !code.contains("cuNotThis"), "{code}");
    assert_eq!(code.lines().count(), src.lines().count());
}

/// (a) Every device attribute the library names (in code or string literals) has a stock value
/// in the profile (not per_device, not not_simulated), and the simulator's
/// cuDeviceGetAttribute returns exactly it.
#[test]
fn every_attribute_the_library_reads_has_its_stock_value() {
    let p = profile();
    let not_simulated: HashSet<&str> =
        p["not_simulated"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    let prefix = "CU_DEVICE_ATTRIBUTE_";
    let mut used: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut scan = |path: &str, n: usize, line: &str| {
        let mut rest = line;
        while let Some(at) = rest.find(prefix) {
            let tail = &rest[at..];
            let name: String =
                tail.chars().take_while(|&c| c.is_ascii_uppercase() || c.is_ascii_digit() || c == '_').collect();
            rest = &tail[name.len()..];
            if name != "CU_DEVICE_ATTRIBUTE_MAX" && name.len() > prefix.len() {
                used.entry(name).or_default().push(format!("{path}:{n}"));
            }
        }
    };
    // Code and string literals (messages about what the code reads); comments may name
    // attributes the library does not read.
    for (path, text) in library_sources() {
        let (lits, code) = lex(&text);
        for (n, line) in code.lines().enumerate() {
            scan(&path, n + 1, line);
        }
        for l in &lits {
            scan(&path, l.line, &l.text);
        }
    }
    assert!(
        used.contains_key("CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING"),
        "the scan of src/ found none of the attributes the library is known to read: {used:?}"
    );
    let _c = Ctx::new(0);
    let mut n = 0;
    // SAFETY: valid out-pointer.
    ok(unsafe { cuDeviceGetCount(&mut n) });
    for (name, at) in &used {
        let at = at.join(", ");
        let e = &p["attributes"][name.as_str()];
        assert!(e.is_object(), "the library reads {name} ({at}); the stock-driver profile has no entry for it: {HINT}");
        assert!(
            e["per_device"].as_bool() != Some(true),
            "the library reads {name} ({at}), which the profile marks per_device (its value depends on the \
             device instance, so it cannot decide a path): if it is a capability, {HINT} without per_device"
        );
        assert!(
            !not_simulated.contains(name.as_str()),
            "the library reads {name} ({at}), which the profile lists as not_simulated (the simulator reports 0 \
             where a stock driver reports {}): implement the capability in tools/simgpu and take it off \
             not_simulated, so that CI runs the path a GPU runs; {HINT}",
            e["value"]
        );
        let want = e["value"]
            .as_i64()
            .and_then(|v| i32::try_from(v).ok())
            .unwrap_or_else(|| panic!("{name} ({at}) has no integer value in the profile: {HINT}"));
        let id = e["id"].as_i64().unwrap() as i32;
        for dev in 0..n {
            let mut got = -7;
            // SAFETY: valid out-pointer.
            ok(unsafe { cuDeviceGetAttribute(&mut got, id, dev) });
            assert_eq!(
                got, want,
                "cuDeviceGetAttribute({name}, device {dev}): the simulator reports {got}, the profile {want}"
            );
        }
    }
    eprintln!("the library reads {} device attributes, each at its stock value: {:?}", used.len(), used.keys());
}

/// Every attribute's reported value follows the profile: its value, 0 where not simulated,
/// computed where per_device; values outside the enum are CUDA_ERROR_INVALID_VALUE.
#[test]
fn every_attribute_is_reported_as_the_profile_says() {
    let p = profile();
    let not_simulated: HashSet<&str> =
        p["not_simulated"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    let _c = Ctx::new(1);
    for (name, e) in p["attributes"].as_object().unwrap() {
        let id = e["id"].as_i64().unwrap() as i32;
        let mut got = -7;
        // SAFETY: valid out-pointer.
        ok(unsafe { cuDeviceGetAttribute(&mut got, id, 1) });
        let want = if e["per_device"].as_bool() == Some(true) {
            device::per_device(device::attr_enum(id).unwrap(), 1).expect("per_device attributes are computed")
        } else if not_simulated.contains(name.as_str()) {
            0
        } else {
            e["value"].as_i64().unwrap() as i32
        };
        assert_eq!(got, want, "{name} ({id}) on device 1");
    }
    let mut v = 0;
    // SAFETY: valid out-pointer.
    unsafe {
        assert_eq!(cuDeviceGetAttribute(&mut v, 0, 0), CUresult::CUDA_ERROR_INVALID_VALUE);
        let max = A::CU_DEVICE_ATTRIBUTE_MAX as i32;
        assert_eq!(cuDeviceGetAttribute(&mut v, max, 0), CUresult::CUDA_ERROR_INVALID_VALUE);
        let mut version = 0;
        ok(cuDriverGetVersion(&mut version));
        assert_eq!(i64::from(version), p["driver_version"].as_i64().unwrap(), "cuDriverGetVersion vs the profile");
    }
}

/// The V2 entry point a base name denotes (cuda.h maps `cuMemFree` to `cuMemFree_v2`): the
/// newest suffix the profile has.
fn resolve<'a>(eps: &'a serde_json::Map<String, Value>, base: &str) -> Option<(String, &'a Value)> {
    ["_v4", "_v3", "_v2", ""].iter().find_map(|s| {
        let n = format!("{base}{s}");
        eps.get(&n).map(|v| (n, v))
    })
}

/// (b) Every driver entry point the library names (symbol lists, dlsym, calls through
/// cudarc's `cu::`) is one a stock driver serves, and none is a V1 memory operation.
/// `check(rc, "cuX")` labels name the call in error messages by its documented base name;
/// they must resolve to a served entry point the way cuda.h maps them.
#[test]
fn every_entry_point_the_library_names_is_available_on_a_stock_driver() {
    let p = profile();
    let eps = p["entry_points"].as_object().unwrap();
    let mut named: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut labels: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (path, text) in library_sources() {
        let (lits, code) = lex(&text);
        for l in lits.into_iter().filter(|l| is_entry_point_name(&l.text)) {
            let map = if l.label { &mut labels } else { &mut named };
            map.entry(l.text).or_default().push(format!("{path}:{}", l.line));
        }
        for (n, line) in code.lines().enumerate() {
            for (at, _) in line.match_indices("cu::cu") {
                let name: String = line[at + 4..].chars().take_while(|&c| is_ident(c)).collect();
                if is_entry_point_name(&name) {
                    named.entry(name).or_default().push(format!("{path}:{}", n + 1));
                }
            }
        }
    }
    assert!(named.contains_key("cuStreamWaitValue32_v2"), "the scan found no memory operation: {named:?}");
    for (name, at) in &named {
        let at = at.join(", ");
        assert!(
            !V1_ENTRY_POINTS.contains(&name.as_str()),
            "the library names {name} ({at}), a V1 stream memory operation: a stock driver answers \
             CUDA_ERROR_NOT_SUPPORTED (it needs NVreg_EnableStreamMemOPs=1); use {name}_v2"
        );
        match eps.get(name).and_then(Value::as_str) {
            Some("available") => {}
            Some(other) => panic!("the library names {name} ({at}); a stock driver answers {other}"),
            None => panic!(
                "the library names {name} ({at}), which the simulator does not export and the profile does not \
                 describe: implement it in tools/simgpu and {HINT} (entry_points)"
            ),
        }
    }
    for (label, at) in &labels {
        let at = at.join(", ");
        let Some((target, v)) = resolve(eps, label) else {
            panic!("{at}: the label {label:?} names no entry point of the profile")
        };
        assert_eq!(v.as_str(), Some("available"), "{at}: the label {label:?} denotes {target}");
        if V1_ENTRY_POINTS.contains(&label.as_str()) {
            eprintln!("note: {at} labels a call {label:?}, the V1 name; the call is {target} (cuda.h's meaning)");
        }
    }
    eprintln!(
        "the library names {} entry points and {} call labels, all served by a stock driver",
        named.len(),
        labels.len()
    );
}

/// The profile describes every driver function the simulator exports, and nothing else.
#[test]
fn the_profile_describes_every_exported_driver_function() {
    let p = profile();
    let eps = p["entry_points"].as_object().unwrap();
    let exported: HashSet<&str> = exports().iter().map(|(n, _)| *n).collect();
    for n in &exported {
        assert!(
            eps.contains_key(*n),
            "{n} is exported: say in the profile's entry_points how a stock driver answers it"
        );
    }
    for (n, v) in eps {
        assert!(
            exported.contains(n.as_str()),
            "the profile's entry_points has {n}, which the simulator does not export"
        );
        let want = if V1_ENTRY_POINTS.contains(&n.as_str()) { "CUDA_ERROR_NOT_SUPPORTED" } else { "available" };
        assert_eq!(v.as_str(), Some(want), "{n}");
    }
}

/// (c) An entry for every CUdevice_attribute of CUDA 13.0 (1..CU_DEVICE_ATTRIBUTE_MAX), under
/// cudarc's name with cudarc's id; the path-deciding ones carry a note, not_simulated ones a why.
#[test]
fn the_profile_covers_the_attribute_enum_with_its_ids() {
    let p = profile();
    let attrs = p["attributes"].as_object().unwrap();
    let max = A::CU_DEVICE_ATTRIBUTE_MAX as i32;
    assert_eq!(attrs.len(), max as usize - 1, "one entry per attribute 1..{max}");
    for id in 1..max {
        let name = format!("{:?}", device::attr_enum(id).unwrap());
        let e = attrs.get(&name).unwrap_or_else(|| panic!("{name} ({id}) is not in the profile: {HINT}"));
        assert_eq!(e["id"].as_i64(), Some(i64::from(id)), "{name}");
        assert!(e["value"].as_i64().and_then(|v| i32::try_from(v).ok()).is_some(), "{name}: a 32-bit integer value");
        assert_eq!(device::profile().attr_name(id), Some(name.as_str()));
    }
    for a in [
        A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1,
        A::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS_V1,
        A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR_V1,
        A::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS,
        A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR,
        A::CU_DEVICE_ATTRIBUTE_MPS_ENABLED,
        A::CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED,
        A::CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
        A::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED,
        A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
        A::CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED,
        A::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
        A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
        A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
    ] {
        let note = attrs[&format!("{a:?}")]["note"].as_str().unwrap_or("");
        assert!(!note.is_empty(), "{a:?} decides a path: its profile entry needs a note saying why it has its value");
    }
    for e in p["not_simulated"].as_array().unwrap() {
        let n = e["name"].as_str().unwrap();
        assert!(attrs.contains_key(n), "not_simulated names {n}, not an attribute");
        assert!(!e["why"].as_str().unwrap_or("").is_empty(), "not_simulated {n}: say why");
    }
}

/// Host words the device reaches: registered (page-locked, mapped) in place.
#[repr(C, align(4096))]
struct Words {
    w32: [AtomicU32; 8],
    w64: [AtomicU64; 4],
}

/// (d) The V1 attributes are 0 and the V1 entry points CUDA_ERROR_NOT_SUPPORTED (nothing
/// queued); the _v2 ones wait and write on a registered word.
#[test]
fn v1_memory_operations_are_refused_and_v2_ones_work() {
    use cudarc::driver::sys::{
        CUstreamBatchMemOpParams as P, CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st as WaitP,
        CUstreamBatchMemOpParams_union_CUstreamMemOpWaitValueParams_st__bindgen_ty_1 as WaitV,
        CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st as WriteP,
        CUstreamBatchMemOpParams_union_CUstreamMemOpWriteValueParams_st__bindgen_ty_1 as WriteV,
        CUstreamBatchMemOpType as T,
    };
    let _c = Ctx::new(0);
    let attr = |a: A| {
        let mut v = -7;
        // SAFETY: valid out-pointer.
        ok(unsafe { cuDeviceGetAttribute(&mut v, a as i32, 0) });
        v
    };
    for a in V1_ATTRIBUTES {
        assert_eq!(attr(a), 0, "{a:?}: a stock driver reports 0 (the V1 API needs NVreg_EnableStreamMemOPs=1)");
    }
    assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_CAN_USE_64_BIT_STREAM_MEM_OPS), 1);
    assert_eq!(attr(A::CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_WAIT_VALUE_NOR), 1);
    let w = Box::new(Words { w32: Default::default(), w64: Default::default() });
    let host = &*w as *const Words as *mut std::ffi::c_void;
    let mut d: CUdeviceptr = 0;
    let s = stream(1);
    let batch = |d: CUdeviceptr, wait_at: u64, write_at: u64, v: u32| {
        let wait = P {
            waitValue: WaitP {
                operation: T::CU_STREAM_MEM_OP_WAIT_VALUE_32,
                address: d + wait_at,
                __bindgen_anon_1: WaitV { value: v },
                flags: 0,
                alias: 0,
            },
        };
        let write = P {
            writeValue: WriteP {
                operation: T::CU_STREAM_MEM_OP_WRITE_VALUE_32,
                address: d + write_at,
                __bindgen_anon_1: WriteV { value: v + 1 },
                flags: 0,
                alias: 0,
            },
        };
        [wait, write]
    };
    // SAFETY: `w` stays registered until unregistered below, after the stream is synchronised.
    unsafe {
        ok(cuMemHostRegister_v2(host, std::mem::size_of::<Words>(), 0x1 | 0x2));
        ok(cuMemHostGetDevicePointer_v2(&mut d, host, 0));
        let (w32, w64) = (d, d + 32);
        w.w32[0].store(1, Ordering::SeqCst);
        w.w64[0].store(5, Ordering::SeqCst);
        assert_eq!(cuStreamWaitValue32(s, w32, 1, 0), NOT_SUPPORTED);
        assert_eq!(cuStreamWaitValue64(s, w64, 5, 0), NOT_SUPPORTED);
        assert_eq!(cuStreamWriteValue32(s, w32 + 4, 9, 0), NOT_SUPPORTED);
        assert_eq!(cuStreamWriteValue64(s, w64 + 8, 9, 0), NOT_SUPPORTED);
        let mut ops = batch(w32, 0, 8, 1);
        assert_eq!(cuStreamBatchMemOp(s, 2, ops.as_mut_ptr(), 0), NOT_SUPPORTED);
        ok(cuStreamSynchronize(s));
        assert_eq!((w.w32[1].load(Ordering::SeqCst), w.w32[2].load(Ordering::SeqCst)), (0, 0), "V1: nothing queued");
        assert_eq!(w.w64[1].load(Ordering::SeqCst), 0);
        // V2: a wait (already satisfied) then a write, each width, and a batch of both.
        ok(cuStreamWaitValue32_v2(s, w32, 1, 0));
        ok(cuStreamWriteValue32_v2(s, w32 + 4, 7, 0));
        ok(cuStreamWaitValue64_v2(s, w64, 5, 0));
        ok(cuStreamWriteValue64_v2(s, w64 + 8, 1 << 40, 0));
        let mut ops = batch(w32, 0, 8, 1);
        ok(cuStreamBatchMemOp_v2(s, 2, ops.as_mut_ptr(), 0));
        ok(cuStreamSynchronize(s));
        assert_eq!(w.w32[1].load(Ordering::SeqCst), 7);
        assert_eq!(w.w64[1].load(Ordering::SeqCst), 1 << 40);
        assert_eq!(w.w32[2].load(Ordering::SeqCst), 2, "the batch's write");
        ok(cuMemHostUnregister(host));
        ok(cuStreamDestroy_v2(s));
    }
}

/// A refused V1 call says why under FERROCCL_SIM_TRACE=errors.
#[test]
fn a_refused_v1_call_says_why() {
    let t = "a_refused_v1_call_says_why";
    if is_child(t) {
        let _c = Ctx::new(0);
        // SAFETY: the call is refused before it reads anything.
        assert_eq!(unsafe { cuStreamWaitValue32(std::ptr::null_mut(), 0, 0, 0) }, NOT_SUPPORTED);
        return;
    }
    let out = run_child(t, &[("FERROCCL_SIM_TRACE", "errors")]);
    assert_child_ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("simgpu: cuStreamWaitValue32: ")
            && err.contains("NVreg_EnableStreamMemOPs=1")
            && err.contains("-> CUDA_ERROR_NOT_SUPPORTED"),
        "{err}"
    );
}

/// tools/simgpu/capture-profile.py --check under the simulator: the driver the script sees
/// (this crate's cdylib as libcuda.so.1) reports what the profile says.
#[test]
fn capture_profile_check_passes_under_the_simulator() {
    if Command::new("python3").arg("--version").output().is_err() {
        eprintln!("skipped: no python3 to run tools/simgpu/capture-profile.py");
        return;
    }
    // The cdylib cargo built with this test (target/<profile>/libferroccl_simgpu.so), linked
    // as libcuda.so.1 the way scripts/sim-gpu.sh does.
    let exe = std::env::current_exe().expect("test binary");
    let so = exe.parent().unwrap().parent().unwrap().join("libferroccl_simgpu.so");
    assert!(so.exists(), "{} was not built", so.display());
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("simgpu-capture");
    std::fs::create_dir_all(&dir).unwrap();
    let link = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(&so, &link).unwrap();
    let out = Command::new("python3")
        .arg(repo().join("tools/simgpu/capture-profile.py"))
        .arg("--check")
        .env("LD_LIBRARY_PATH", &dir)
        .env("FERROCCL_SIMGPU", "1")
        .env_remove("CUDA_VISIBLE_DEVICES")
        .env_remove("FERROCCL_SIM_DEVICES")
        .env_remove("FERROCCL_SIM_TRACE")
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("check passed") && stdout.contains("device 0: ferroccl simulated GPU"),
        "capture-profile.py --check: {:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn get_proc_address_gives_callers_older_than_cuda_11_7_the_v1_memory_operations() {
    use ferroccl_simgpu::api::procaddr::lookup;
    for name in ["cuStreamWaitValue32", "cuStreamWriteValue32", "cuStreamWaitValue64", "cuStreamBatchMemOp"] {
        let v1 = lookup(name, 11000).expect("exported");
        let v2 = lookup(name, 13000).expect("exported");
        assert_eq!(lookup(&format!("{name}_v2"), 11000), Some(v2), "{name}_v2 asked for by name");
        assert_ne!(v1, v2, "{name}: a CUDA 11.0 caller gets the V1 entry point, a stock driver's refusal");
        assert_eq!(lookup(name, 11070), Some(v2), "{name}: from CUDA 11.7 on the name means _v2");
    }
}
