//! The committed include/ferroccl.h must be exactly what cbindgen generates from the
//! sources of `src/ffi`. FERROCCL_BLESS=1 rewrites it instead of failing.

use std::path::PathBuf;

#[test]
fn header_is_current() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(root.join("cbindgen.toml")).expect("cbindgen.toml");
    let mut generated = Vec::new();
    cbindgen::Builder::new()
        // Only the C-facing layer: nothing else of the crate belongs in the header.
        .with_src(root.join("src/ffi/mod.rs"))
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header")
        .write(&mut generated);
    let path = root.join("include/ferroccl.h");
    if std::env::var_os("FERROCCL_BLESS").is_some() {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "include/ferroccl.h is stale: the Rust sources changed the ABI. Regenerate it with \
         `FERROCCL_BLESS=1 cargo test --test header` and commit it."
    );
}

#[test]
fn version_is_kept_in_one_place() {
    let v = format!("{}.{}.{}", ferroccl::ffi::FCCL_MAJOR, ferroccl::ffi::FCCL_MINOR, ferroccl::ffi::FCCL_PATCH);
    assert_eq!(v, env!("CARGO_PKG_VERSION"), "FCCL_MAJOR/MINOR/PATCH in src/ffi/mod.rs must match Cargo.toml");
}
