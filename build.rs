//! Gives libferroccl.so its SONAME, libferroccl.so.<major>: programs linked against it
//! record that name, so `make install` can place the library as
//! libferroccl.so.<major>.<minor>.<patch> with the .so.<major> and .so links beside it,
//! and a later incompatible major version installs next to it without breaking them.
//!
//! The flag goes to every link of this package (`rustc-link-arg`), not only the cdylib:
//! cargo passes a `rustc-link-arg-cdylib` on to every cdylib that depends on this crate
//! (cargo issue 9562), which would name the NCCL library libferroccl.so.0 too. In an
//! executable (ferroccl-run, the tests) DT_SONAME is inert.
//!
//! A program built in the tree (`-Ltarget/release -lferroccl -Wl,-rpath,...`) looks for
//! libferroccl.so.<major> beside libferroccl.so, so this also puts that link in the
//! profile directory (target/release), the way `make install` does in a prefix.

use std::path::{Path, PathBuf};

fn main() {
    let major = std::env::var("CARGO_PKG_VERSION_MAJOR").expect("cargo sets it");
    println!("cargo:rustc-link-arg=-Wl,-soname,libferroccl.so.{major}");
    println!("cargo:rerun-if-changed=build.rs");
    // OUT_DIR is <profile dir>/build/<package>-<hash>/out.
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets it"));
    if let Some(profile) = out.ancestors().nth(3) {
        let link = profile.join(format!("libferroccl.so.{major}"));
        if std::fs::read_link(&link).ok().as_deref() != Some(Path::new("libferroccl.so")) {
            let _ = std::fs::remove_file(&link);
            if let Err(e) = std::os::unix::fs::symlink("libferroccl.so", &link) {
                println!("cargo:warning=could not link {} to libferroccl.so: {e}", link.display());
            }
        }
    }
}
