//! Every device kernel program the library can generate (every type and operation, and the
//! wire forms) compiles with the real NVRTC, for sm_90, without an error or a warning:
//! the simulated GPU compiles the same sources with the host's C++ compiler, which
//! accepts things NVRTC may not. NVRTC needs no GPU; scripts/nvrtc-check.sh installs
//! PyPI's nvidia-cuda-nvrtc wheel and runs this test with it on LD_LIBRARY_PATH.

use ferroccl::mem::cuda_reduce::{compile_for, Reduction};

#[test]
#[ignore = "needs the real NVRTC on LD_LIBRARY_PATH: scripts/nvrtc-check.sh"]
fn every_kernel_compiles_with_the_real_nvrtc_for_sm_90() {
    let programs = Reduction::programs();
    let all = Reduction::all();
    assert_eq!(all.len(), 123); // 12 types x 5 ops, 6 integer types x 3 bitwise ops, 45 wire kernels
    for (name, src) in &programs {
        // PTX, as the library compiles at run time, and a CUBIN (through ptxas).
        for arch in ["compute_90", "sm_90"] {
            let c = compile_for(src, name, arch).unwrap_or_else(|e| panic!("{name} for {arch}: {}", e.msg));
            assert!(c.log.is_empty(), "{name} for {arch}: NVRTC says:\n{}", c.log);
            if arch == "sm_90" {
                assert!(c.image.starts_with(b"\x7fELF"), "{name}: not a CUBIN: is this the simulated NVRTC?");
                continue;
            }
            let ptx = String::from_utf8_lossy(&c.image);
            assert!(!ptx.contains("simulated NVRTC"), "{name}: the simulated NVRTC answered");
            for r in all.iter().filter(|r| r.program_name() == *name) {
                assert!(ptx.contains(&format!(".entry {}(", r.entry())), "{name} lacks {}", r.entry());
            }
        }
    }
    println!("{} programs ({} kernels) compiled for compute_90 and sm_90 without a warning", programs.len(), all.len());
}

#[test]
#[ignore = "needs the real NVRTC on LD_LIBRARY_PATH: scripts/nvrtc-check.sh"]
fn the_copy_kernels_compile_with_the_real_nvrtc_for_sm_90() {
    use ferroccl::mem::cuda_kernels::{COPY_PROGRAM, COPY_PROGRAM_NAME};
    for arch in ["compute_90", "sm_90"] {
        let c = compile_for(COPY_PROGRAM, COPY_PROGRAM_NAME, arch).unwrap_or_else(|e| panic!("{arch}: {}", e.msg));
        assert!(c.log.is_empty(), "{COPY_PROGRAM_NAME} for {arch}: NVRTC says:\n{}", c.log);
        if arch == "compute_90" {
            let ptx = String::from_utf8_lossy(&c.image);
            for k in ["fccl_copy", "fccl_copy2d"] {
                assert!(ptx.contains(&format!(".entry {k}(")), "{COPY_PROGRAM_NAME} lacks {k}");
            }
        }
    }
}
