//! Links libferroccl_nccl.so as libnccl.so.2 that exports NCCL's names and nothing else.
//!
//! rustc's own version script exports every `#[no_mangle]` function of the crates
//! linked in, ferroccl's `fccl*` among them; a second script can only hide a name it
//! spells out (a pattern does not override rustc's exact names), so the names come
//! from ferroccl's sources.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// `#[no_mangle]` function names in the .rs files under `dir`.
fn no_mangle_names(dir: &Path, out: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            no_mangle_names(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let mut pending = false;
            for line in text.lines() {
                let l = line.trim();
                if l.starts_with("#[no_mangle]") || l.starts_with("#[unsafe(no_mangle)]") {
                    pending = true;
                } else if pending {
                    if let Some(rest) = l.split_once("fn ").map(|(_, r)| r) {
                        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        out.push(name);
                        pending = false;
                    } else if let Some(rest) = l.split_once("static ").map(|(_, r)| r) {
                        let name: String = rest.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                        out.push(name);
                        pending = false;
                    }
                }
            }
        }
    }
}

fn main() {
    let here = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let list = here.join("nccl-2.28.symbols");
    let src = here.join("../src");
    println!("cargo:rerun-if-changed={}", list.display());
    println!("cargo:rerun-if-changed={}", src.display());
    let exported: Vec<String> = std::fs::read_to_string(&list)
        .expect("nccl/nccl-2.28.symbols")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect();
    let mut hidden = Vec::new();
    no_mangle_names(&src, &mut hidden);
    hidden.sort();
    hidden.dedup();
    let mut script = String::from("{\n  global:\n    ferroccl_nccl_shim;\n");
    for n in &exported {
        let _ = writeln!(script, "    {n};");
    }
    script.push_str("  local:\n");
    for n in &hidden {
        let _ = writeln!(script, "    {n};");
    }
    script.push_str("    *;\n};\n");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets it")).join("libnccl.map");
    std::fs::write(&out, script).expect("write the version script");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={}", out.display());
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
}
