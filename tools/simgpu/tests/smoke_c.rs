//! Builds tests/smoke.c with `cc` and runs it through scripts/sim-gpu.sh: the exported
//! symbol names, the SONAME and the symlinks, as a C program that dlopens libcuda.so.1
//! sees them. Skipped (with a message) when there is no C compiler.

use std::path::Path;
use std::process::Command;

/// scripts/sim-gpu.sh runs `cargo build`, which may relink the library while the other test
/// reads it.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn c_program_runs_through_sim_gpu_sh() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let repo = manifest.join("../..");
    let exe = Path::new(env!("CARGO_TARGET_TMPDIR")).join("simgpu-smoke");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let built = Command::new(&cc).arg(manifest.join("tests/smoke.c")).arg("-o").arg(&exe).arg("-ldl").status();
    match built {
        Err(e) => {
            eprintln!("skipped: no C compiler ({cc}: {e})");
            return;
        }
        Ok(s) => assert!(s.success(), "{cc} failed on tests/smoke.c"),
    }
    let out = Command::new("bash")
        .arg(repo.join("scripts/sim-gpu.sh"))
        .arg(&exe)
        .env_remove("FERROCCL_SIM_TRACE")
        .output()
        .expect("run scripts/sim-gpu.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("smoke ok"),
        "{:?}\nstdout:\n{stdout}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn every_exported_driver_function_is_in_the_proc_address_table() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let exe = std::env::current_exe().unwrap();
    let so = exe.parent().unwrap().parent().unwrap().join("libferroccl_simgpu.so");
    let out = match Command::new("nm").args(["-D", "--defined-only"]).arg(&so).output() {
        Ok(o) if o.status.success() => o,
        other => {
            eprintln!("skipped: cannot run nm on {}: {other:?}", so.display());
            return;
        }
    };
    let text = String::from_utf8_lossy(&out.stdout);
    let names: Vec<&str> =
        text.lines().filter_map(|l| l.split_whitespace().nth(2)).filter(|n| n.starts_with("cu")).collect();
    assert!(names.len() > 100, "{names:?}");
    let table = ferroccl_simgpu::exports();
    for n in &names {
        assert!(table.iter().any(|(t, _)| t == n), "{n} is exported but cuGetProcAddress cannot find it");
    }
    for (t, _) in table {
        assert!(names.contains(t), "{t} is in the table but not exported");
    }
    for n in ["nvrtcCreateProgram", "nvrtcCompileProgram", "nvrtcGetPTX", "nvrtcGetLoweredName"] {
        assert!(text.lines().any(|l| l.ends_with(&format!(" {n}"))), "{n} is not exported");
    }
}
