//! Every device kernel program the library can generate (every type and operation, and the
//! wire forms) compiles with the real NVRTC, for sm_90, without an error or a warning:
//! the simulated GPU compiles the same sources with the host's C++ compiler, which
//! accepts things NVRTC may not. NVRTC needs no GPU; scripts/nvrtc-check.sh installs
//! PyPI's nvidia-cuda-nvrtc wheel and runs this test with it on LD_LIBRARY_PATH.
//! The PTX is read too: every plain reduction kernel (each rank-count variant) must load
//! and store 16 bytes at a time on its vector path, and keep nothing in local memory.

use ferroccl::mem::cuda_kernels::{reduce_param_bytes, PARAM_LIMIT};
use ferroccl::mem::cuda_reduce::{compile_for, Reduction, RANKS};

/// The PTX of each entry: `.entry NAME(` up to the next entry.
fn entries(ptx: &str) -> Vec<(&str, &str)> {
    ptx.split(".entry ").skip(1).map(|e| (e.split('(').next().unwrap_or(""), e)).collect()
}

/// Whether PTX `body` has a 128-bit global access `op` (`ld` or `st`): four 32-bit
/// lanes (`.v4.u32`, `.v4.f32`, ...) or two 64-bit ones (`.v2.u64`, `.v2.f64`, ...),
/// loads also through the non-coherent path (`ld.global.nc`).
fn has_128_bit(body: &str, op: &str) -> bool {
    const WIDE: [&str; 8] = ["v4.u32", "v4.b32", "v4.f32", "v4.s32", "v2.u64", "v2.b64", "v2.f64", "v2.s64"];
    body.lines().map(str::trim).any(|l| {
        let Some(rest) = l.strip_prefix(op).and_then(|r| r.strip_prefix(".global.")) else { return false };
        let rest = rest.strip_prefix("nc.").unwrap_or(rest);
        WIDE.iter().any(|w| rest.starts_with(w))
    })
}

/// The bytes of an entry's parameters (its PTX from `(` on): each `.param` (`.u32`,
/// `.b64`, ... or `.align A .b8 NAME[SIZE]`) at its alignment.
fn param_bytes(body: &str) -> usize {
    let mut end = 0usize;
    for l in body.lines().map(str::trim).skip(1).take_while(|l| !l.starts_with(')')) {
        let Some(p) = l.strip_prefix(".param ") else { continue };
        let (align, size) = match p.strip_prefix(".align ") {
            Some(r) => {
                let a: usize = r.split(' ').next().and_then(|a| a.parse().ok()).unwrap_or(1);
                let sz = p.split('[').nth(1).and_then(|r| r.split(']').next()).and_then(|n| n.parse().ok());
                (a, sz.unwrap_or_else(|| panic!("a .param without a size: {l}")))
            }
            None => {
                let bits: usize = p[2..].chars().take_while(char::is_ascii_digit).collect::<String>().parse().unwrap();
                (bits / 8, bits / 8)
            }
        };
        end = end.div_ceil(align) * align + size;
    }
    end
}

#[test]
#[ignore = "needs the real NVRTC on LD_LIBRARY_PATH: scripts/nvrtc-check.sh"]
fn every_kernel_compiles_with_the_real_nvrtc_for_sm_90() {
    let programs = Reduction::programs();
    let all = Reduction::all();
    assert_eq!(all.len(), 123); // 12 types x 5 ops, 6 integer types x 3 bitwise ops, 45 wire kernels
    let mut vector_kernels = 0;
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
            let found = entries(&ptx);
            for r in all.iter().filter(|r| r.program_name() == *name) {
                for k in [0].into_iter().chain(RANKS) {
                    let e = r.entry_for(k);
                    let (_, body) = found.iter().find(|(n, _)| *n == e).unwrap_or_else(|| panic!("{name} lacks {e}"));
                    assert!(!body.contains(".local"), "{e} keeps values in local memory");
                    // Its parameters as the library lays them out, within the classic 4 KiB.
                    let want = reduce_param_bytes(r.wire.is_some());
                    assert!(
                        want <= PARAM_LIMIT && param_bytes(body) == want,
                        "{e}: {} bytes of parameters",
                        param_bytes(body)
                    );
                    assert!(has_128_bit(body, "ld"), "{e}: no 128-bit load in its PTX:\n{body}");
                    assert!(has_128_bit(body, "st"), "{e}: no 128-bit store in its PTX:\n{body}");
                    vector_kernels += 1;
                }
            }
        }
    }
    // 78 plain reductions and 45 wire ones, each for any count and for 2, 4 and 8 inputs.
    assert_eq!(vector_kernels, 123 * 4);
    println!(
        "{} programs ({} reductions, {} kernels) compiled for compute_90 and sm_90 without a warning; \
         all {vector_kernels} reduction kernels (wire forms included) load and store 16 bytes at a time",
        programs.len(),
        all.len(),
        all.len() * (1 + RANKS.len())
    );
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
            let found = entries(&ptx);
            for k in ["fccl_copy", "fccl_copy2d", "fccl_copy_batch", "fccl_swap_batch"] {
                let (_, body) =
                    found.iter().find(|(n, _)| *n == k).unwrap_or_else(|| panic!("{COPY_PROGRAM_NAME} lacks {k}"));
                assert!(has_128_bit(body, "ld") && has_128_bit(body, "st"), "{k}: no 128-bit load or store:\n{body}");
            }
        }
    }
}
