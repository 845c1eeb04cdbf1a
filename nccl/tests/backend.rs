//! Two libraries called libnccl.so.2 in one process: with ferroccl's NCCL library
//! loaded globally (as it is when a program runs on it), ferroccl's NCCL backend must
//! skip it and find the real NCCL, here a stand-in built by the test, or report that
//! there is none (and the built-in backends serve).

use ferroccl::backend::nccl::lib::{load_from, Candidate};
use std::path::{Path, PathBuf};
use std::process::Command;

/// target/<profile>/libferroccl_nccl.so, built by cargo before this test.
fn shim() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("target/<profile>/deps/..");
    let p = dir.join("libferroccl_nccl.so");
    assert!(p.exists(), "{} is missing: build with cargo build --release", p.display());
    p
}

/// A stand-in "real" NCCL in `dir`/libnccl.so.2: the symbols the backend requires,
/// ncclGetVersion reporting 22703, everything else failing.
fn stand_in(dir: &Path) -> PathBuf {
    let src = dir.join("standin.c");
    let mut c = String::from("int ncclGetVersion(int* v) { *v = 22703; return 0; }\n");
    for f in ferroccl::backend::nccl::lib::REQUIRED.iter().chain(ferroccl::backend::nccl::lib::OPTIONAL) {
        if *f != "ncclGetVersion" && *f != "ncclGetErrorString" {
            c += &format!("int {f}(void) {{ return 3; }}\n");
        }
    }
    c += "const char* ncclGetErrorString(int r) { (void)r; return \"stand-in\"; }\n";
    std::fs::write(&src, c).unwrap();
    let out = dir.join("libnccl.so.2");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let st = Command::new(cc)
        .args(["-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .expect("a C compiler (cc)");
    assert!(st.success(), "building the stand-in failed");
    out
}

#[test]
fn the_backend_skips_the_shim_and_loads_the_real_nccl() {
    let tmp = std::env::temp_dir().join(format!("ferroccl-nccl-backend-{}", std::process::id()));
    let (shim_dir, real_dir) = (tmp.join("shim"), tmp.join("real"));
    std::fs::create_dir_all(&shim_dir).unwrap();
    std::fs::create_dir_all(&real_dir).unwrap();
    let shim_link = shim_dir.join("libnccl.so.2");
    let _ = std::fs::remove_file(&shim_link);
    std::os::unix::fs::symlink(shim(), &shim_link).unwrap();
    let real = stand_in(&real_dir);

    // The process's libnccl.so.2 is the shim, its symbols global, as for a program linked with it.
    // SAFETY: loading the shim runs no initialiser with preconditions.
    let _global = unsafe {
        libloading::os::unix::Library::open(Some(&shim_link), libloading::os::unix::RTLD_NOW | libc::RTLD_GLOBAL)
    }
    .expect("load the shim");

    let cands = [
        Candidate::Loaded("libnccl.so.2".into()),
        Candidate::Open("libnccl.so.2".into()),
        Candidate::Open(shim_link.to_string_lossy().into_owned()),
    ];
    let dirs = |v: &[&Path]| v.iter().map(|p| p.to_string_lossy().into_owned()).collect::<Vec<_>>();

    // The shim's directory comes first on the search path: it is skipped, the stand-in loads.
    let (_lib, api) = load_from(&cands, &dirs(&[&shim_dir, &real_dir])).unwrap_or_else(|e| panic!("{}", e.msg));
    assert_eq!(api.path, real.to_string_lossy(), "the stand-in, not the shim, was loaded");
    assert_eq!(api.version, 22703);

    // The shim alone: no NCCL, and the reason names the shim (the built-in backends serve).
    let e = load_from(&cands, &dirs(&[&shim_dir])).err().expect("only the shim is there");
    assert!(e.msg.contains("ferroccl's own NCCL shim"), "{}", e.msg);
    assert!(!e.msg.contains(&*real.to_string_lossy()), "{}", e.msg);
    let _ = std::fs::remove_dir_all(&tmp);
}
