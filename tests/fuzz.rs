//! Bounded fuzzing, run by `cargo test`: the rendezvous protocol decoders and the
//! exported functions' argument validation must never panic or crash, whatever they
//! are given. Seeds live in tests/fuzz_seeds; inputs are seeds mutated by a
//! deterministic generator. Run longer by hand with FERROCCL_FUZZ_ITERS=1000000.

use ferroccl::comm::bootstrap::{decode_round, read_frame, Challenge, Hello, UniqueId};
use ferroccl::ffi::*;
// Deterministic: a failure reproduces from its iteration number.
use ferroccl_testutil::Rng;
use std::ptr::{null, null_mut};

fn iters(default: u64) -> u64 {
    std::env::var("FERROCCL_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn seeds() -> Vec<Vec<u8>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fuzz_seeds");
    let mut v: Vec<Vec<u8>> =
        std::fs::read_dir(dir).unwrap().map(|e| std::fs::read(e.unwrap().path()).unwrap()).collect();
    v.sort();
    assert!(!v.is_empty(), "fuzz seeds are committed in tests/fuzz_seeds");
    v
}

fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut b = seed.to_vec();
    for _ in 0..=rng.below(8) {
        match rng.below(5) {
            0 if !b.is_empty() => {
                let i = rng.below(b.len() as u64) as usize;
                b[i] ^= 1 << rng.below(8);
            }
            1 if !b.is_empty() => {
                let i = rng.below(b.len() as u64) as usize;
                b[i] = rng.next_u64() as u8;
            }
            2 => b.truncate(rng.below(b.len() as u64 + 1) as usize),
            3 => b.extend((0..rng.below(64)).map(|_| rng.next_u64() as u8)),
            _ => {
                // Interesting lengths in the frame prefix.
                let v = [0u32, 1, 47, 48, 49, 65535, 65536, u32::MAX][rng.below(8) as usize];
                if b.len() >= 4 {
                    b[0..4].copy_from_slice(&v.to_le_bytes());
                }
            }
        }
    }
    b
}

#[test]
fn rendezvous_decoders_never_panic() {
    let seeds = seeds();
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    for _ in 0..iters(50_000) {
        let seed = &seeds[rng.below(seeds.len() as u64) as usize];
        let input = mutate(&mut rng, seed);
        if let Ok(h) = Hello::decode(&input) {
            let _ = h.check_ranks();
            let _ = h.verify(&[1; 32], &[2; 32]);
        }
        let _ = Challenge::decode(&input);
        let _ = decode_round(&input);
        let _ = read_frame(&mut std::io::Cursor::new(&input), 1 << 16);
        let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
        let _ = UniqueId::from_hex(&hex);
        let _ = UniqueId::from_hex(&String::from_utf8_lossy(&input));
    }
    // A valid hello still decodes: the fuzzing above is not vacuous.
    let h = Hello::new(&[1; 32], &[2; 32], 2, 1, 1000).unwrap();
    assert!(Hello::decode(&h.encode()).is_ok_and(|d| d.verify(&[1; 32], &[2; 32]) && d.check_ranks().is_ok()));
}

/// Every exported collective with random arguments on live, destroyed and bogus
/// handles. Buffers are either NULL or large enough for any small count, and large
/// counts always overflow, so a call the validator accepts is a legal call.
#[test]
fn exported_functions_reject_random_arguments_without_crashing() {
    let mut comms = [null_mut(); 2];
    // SAFETY: comms has room for the one handle this writes; devlist NULL makes a host rank.
    assert_eq!(unsafe { fcclCommInitAll(comms.as_mut_ptr(), 1, null()) }, fcclSuccess);
    // SAFETY: comms[1..] has room for the one handle this writes.
    assert_eq!(unsafe { fcclCommInitAll(comms[1..].as_mut_ptr(), 1, null()) }, fcclSuccess);
    let (live, dead) = (comms[0], comms[1]);
    // SAFETY: dead is a handle fcclCommInitAll just wrote; no other reference to it is used after this.
    assert_eq!(unsafe { fcclCommDestroy(dead) }, fcclSuccess);
    const SMALL: u64 = 64;
    let mut buf_a = vec![0u8; (SMALL as usize) * 8 * 2];
    let mut buf_b = vec![0u8; (SMALL as usize) * 8 * 2];
    let counts = [1usize; 4];
    let mut rng = Rng::new(0xdead_beef_cafe_f00d);
    let valid = |r: i32| [fcclSuccess, fcclInvalidArgument, fcclInvalidUsage, fcclCollectiveMismatch].contains(&r);
    for it in 0..iters(20_000) {
        let comm = match rng.below(4) {
            0 => null_mut(),
            1 => dead,
            2 => (rng.next_u64() & !0xf) as usize as fcclComm_t,
            _ => live,
        };
        let count = if rng.below(3) == 0 {
            (isize::MAX as usize) + 1 + rng.below(1 << 40) as usize
        } else {
            rng.below(SMALL + 1) as usize
        };
        let pick = |rng: &mut Rng, b: &mut Vec<u8>| {
            if rng.below(4) == 0 {
                null_mut()
            } else {
                b.as_mut_ptr() as *mut std::ffi::c_void
            }
        };
        let (a, b) = (pick(&mut rng, &mut buf_a), pick(&mut rng, &mut buf_b));
        let dt = [rng.next_u64() as i32, rng.below(14) as i32 - 1][rng.below(2) as usize];
        let op = [rng.next_u64() as i32, rng.below(7) as i32 - 1][rng.below(2) as usize];
        let root = [rng.next_u64() as i32, rng.below(4) as i32 - 1][rng.below(2) as usize];
        // SAFETY: every pointer is NULL or one of buf_a, buf_b (1 KiB each, enough for any small count of
        // any type on 1 rank), counts (4 entries) or the local `out`; a count that would not fit
        // overflows and is refused; bogus handles are looked up, never dereferenced; and every call
        // on one rank completes before it returns.
        let r = unsafe {
            match rng.below(11) {
                0 => fcclAllReduce(a, b, count, dt, op, comm, null_mut()),
                1 => fcclBroadcast(a, b, count, dt, root, comm, null_mut()),
                2 => fcclReduce(a, b, count, dt, op, root, comm, null_mut()),
                3 => fcclAllGather(a, b, count, dt, comm, null_mut()),
                4 => fcclReduceScatter(a, b, count, dt, op, comm, null_mut()),
                5 => fcclAlltoAll(a, b, count, dt, comm, null_mut()),
                6 => fcclGather(a, b, count, dt, root, comm, null_mut()),
                7 => fcclScatter(a, b, count, dt, root, comm, null_mut()),
                8 => {
                    let c = if rng.below(3) == 0 { null() } else { counts.as_ptr() };
                    fcclAlltoAllv(a, c, counts.as_ptr(), b, counts.as_ptr(), c, dt, comm, null_mut())
                }
                9 => fcclBarrier(comm, null_mut()),
                _ => {
                    let mut out = 0;
                    let p = if rng.below(3) == 0 { None } else { as_out(&mut out) };
                    fcclCommCount(comm, p)
                }
            }
        };
        assert!(valid(r), "iteration {it}: unexpected result {r}");
    }
    // The communicator still works after all that.
    let x = [3.0f32; 4];
    let mut y = [0.0f32; 4];
    assert_eq!(
        // SAFETY: x and y hold 4 floats and outlive the call, which on host memory completes before it returns.
        unsafe { fcclAllReduce(x.as_ptr() as _, y.as_mut_ptr() as _, 4, fcclFloat32, fcclSum, live, null_mut()) },
        fcclSuccess
    );
    assert_eq!(y, [3.0; 4]);
    // SAFETY: live is the handle fcclCommInitAll wrote; it is not used after this.
    assert_eq!(unsafe { fcclCommDestroy(live) }, fcclSuccess);
}
