use super::cut::*;
use crate::coll::Strided;
use crate::coll::{Coll, CollKind, VCounts};
use crate::types::DataType;
use ferroccl_testutil::Rng;
use CollKind::*;

#[test]
fn cuts_by_shared_arguments_only() {
    let call = |kind, count, dt| Coll::new(kind, 0x1000 as *const u8, 0x9000 as *mut u8, count, dt);
    // Input and output of 4 bytes per element: 375 elements in 3000 bytes.
    let p = Cut::new(&call(AllReduce, 1001, DataType::Float32), 4, 3000).unwrap();
    assert_eq!((p.cols, p.chunks, p.slot), (375, 3, 3000));
    // One block of each of 4 ranks and one's own: 150 elements per block.
    let p = Cut::new(&call(AllGather, 1001, DataType::Float32), 4, 3000).unwrap();
    assert_eq!((p.cols, p.chunks, p.slot), (150, 7, 3000));
    let p = Cut::new(&call(AlltoAll, 10, DataType::Float64), 3, 96).unwrap();
    assert_eq!((p.cols, p.chunks, p.slot), (2, 5, 96));
    // A chunk smaller than one column still moves one element per block.
    let p = Cut::new(&call(ReduceScatter, 5, DataType::Int64), 2, 1).unwrap();
    assert_eq!((p.cols, p.chunks, p.slot), (1, 5, 24));
    // Exactly one chunk, and no chunk but one for a v-call whose counts are all 0.
    assert_eq!(Cut::new(&call(Broadcast, 375, DataType::Float32), 2, 3000).unwrap().chunks, 1);
    let mut v = call(AllGatherV, 0, DataType::Int8);
    v.v = Some(VCounts::gather_v(0, 2, &[0, 0], &[0, 0]));
    assert_eq!(Cut::new(&v, 2, 64).unwrap().chunks, 1);
    // v-calls are cut by the longest block, which every rank knows alike.
    v.v = Some(VCounts::gather_v(0, 3, &[0, 100, 7], &[0, 0, 100]));
    assert_eq!(Cut::new(&v, 3, 64).unwrap(), Cut { cols: 16, chunks: 7, slot: 64, len: 100 });
    // Root, op, pointers and in-place layout (which ranks pass differently) change nothing.
    let base = call(Reduce, 777, DataType::Bfloat16);
    let mut other = call(Reduce, 777, DataType::Bfloat16);
    other.root = 1;
    other.op = crate::types::RedOp::Max;
    other.send = other.recv;
    assert_eq!(Cut::new(&base, 2, 1000), Cut::new(&other, 2, 1000));
    // Staged whole: per-pair counts no rank knows in full, p2p, axis gathers, wire
    // all_reduce, or chunks of 0.
    assert_eq!(Cut::new(&call(AlltoAllv, 10, DataType::Int8), 2, 64), None);
    assert_eq!(Cut::new(&call(Send, 10, DataType::Int8), 2, 64), None);
    let mut axis = call(AllGather, 10, DataType::Int8);
    axis.strided = Some(Strided { outer: 2, block: 5 });
    assert_eq!(Cut::new(&axis, 2, 64), None);
    let mut wire = call(AllReduce, 10, DataType::Float32);
    wire.wire = Some(DataType::Bfloat16);
    assert_eq!(Cut::new(&wire, 2, 64), None);
    assert_eq!(Cut::new(&call(AllReduce, 10, DataType::Int8), 2, 0), None);
}

/// What each collective computes, over every rank's host buffers at once (elements
/// as little-endian integers of the type's size, summed with wraparound): every
/// input is read before any output is written, as in-place calls need.
fn reference(cs: &[Coll]) {
    let n = cs.len();
    let (c0, es) = (&cs[0], cs[0].dtype.size());
    let mask = if es == 8 { u64::MAX } else { (1u64 << (8 * es)) - 1 };
    let get = |p: *const u8, i: usize| -> u64 {
        let mut b = [0u8; 8];
        // SAFETY: the callers name elements inside the calls' buffers.
        unsafe { std::ptr::copy_nonoverlapping(p.add(i * es), b.as_mut_ptr(), es) };
        u64::from_le_bytes(b)
    };
    let sum = |f: &dyn Fn(usize) -> u64| (0..n).fold(0u64, |a, p| a.wrapping_add(f(p))) & mask;
    let (cnt, root) = (c0.count, c0.root);
    let mut out: Vec<(usize, usize, u64)> = Vec::new();
    for r in 0..n {
        let c = &cs[r];
        match c0.kind {
            AllReduce => out.extend((0..c.count).map(|i| (r, i, sum(&|p| get(cs[p].send, i))))),
            Reduce if r == root => out.extend((0..cnt).map(|i| (r, i, sum(&|p| get(cs[p].send, i))))),
            Broadcast => out.extend((0..cnt).map(|i| (r, i, get(cs[root].send, i)))),
            AllGather => out.extend(
                (0..n).flat_map(|p| (0..cnt).map(move |i| (p, i))).map(|(p, i)| (r, p * cnt + i, get(cs[p].send, i))),
            ),
            Gather if r == root => out.extend(
                (0..n).flat_map(|p| (0..cnt).map(move |i| (p, i))).map(|(p, i)| (r, p * cnt + i, get(cs[p].send, i))),
            ),
            ReduceScatter => out.extend((0..cnt).map(|i| (r, i, sum(&|p| get(cs[p].send, r * cnt + i))))),
            Scatter => out.extend((0..cnt).map(|i| (r, i, get(cs[root].send, r * cnt + i)))),
            AlltoAll => out.extend(
                (0..n)
                    .flat_map(|p| (0..cnt).map(move |i| (p, i)))
                    .map(|(p, i)| (r, p * cnt + i, get(cs[p].send, r * cnt + i))),
            ),
            AllGatherV => {
                let v = c.v.as_ref().unwrap();
                for (p, q) in cs.iter().enumerate() {
                    out.extend((0..v.recvcounts()[p]).map(|i| (r, v.rdispls()[p] + i, get(q.send, i))));
                }
            }
            ReduceScatterV => {
                let at = |p: usize| cs[p].v.as_ref().unwrap().sdispls()[r];
                out.extend((0..c.count).map(|i| (r, i, sum(&|p| get(cs[p].send, at(p) + i)))));
            }
            _ => {}
        }
    }
    for (r, i, v) in out {
        // SAFETY: i is inside rank r's receive buffer (the collective's own layout).
        unsafe { std::ptr::copy_nonoverlapping(v.to_le_bytes().as_ptr(), cs[r].recv.add(i * es), es) };
    }
}

/// Applies one span between "device" memory (plain host memory here) and a slot.
fn apply(s: &Span, slot: *mut u8, to_slot: bool) {
    for row in 0..s.rows {
        let (d, h) = ((s.dev + row * s.dev_pitch) as *mut u8, slot.wrapping_add(s.host + row * s.host_pitch));
        let (from, to) = if to_slot { (d as *const u8, h) } else { (h as *const u8, d) };
        // SAFETY: the spans name bytes inside the simulated buffers and the slot.
        unsafe { std::ptr::copy_nonoverlapping(from, to, s.width) };
    }
}

/// One case of the simulation: the call every rank makes, and the chunk size.
struct Case {
    kind: CollKind,
    dt: DataType,
    n: usize,
    cnt: usize,
    root: usize,
    ip: bool,
    /// v-calls: recvcounts, rdispls, then each rank's sdispls.
    v: Vec<Vec<usize>>,
    chunk: usize,
}

/// Rank r's call on its arena: buffers between random guard bytes, in place as
/// the collective defines it when asked.
fn make(case: &Case, r: usize, arena: &mut [u8]) -> Coll {
    let Case { kind, dt, n, cnt, root, ip, ref v, .. } = *case;
    let es = dt.size();
    let g = 40; // guard bytes before each buffer
    let half = arena.len() / 2;
    let (s, rb) = (arena.as_mut_ptr().wrapping_add(g), arena.as_mut_ptr().wrapping_add(half + g));
    let mut c = Coll::new(kind, s, rb, cnt, dt);
    c.root = root;
    match kind {
        AllGatherV => {
            c.count = v[0][r];
            c.v = Some(VCounts::gather_v(c.count, n, &v[0], &v[1]));
        }
        ReduceScatterV => {
            c.count = v[0][r];
            // Each rank lays its send blocks out its own way.
            c.v = Some(VCounts::new(&[], &v[2 + r], &v[0], &[]));
        }
        _ => {}
    }
    if ip {
        let sd = c.v.as_ref().map(|v| v.sdispls().get(r).copied().unwrap_or(0)).unwrap_or(0);
        match kind {
            AllReduce | Reduce | Broadcast | AlltoAll => c.send = c.recv,
            AllGather | Gather => c.send = c.recv.wrapping_add(r * cnt * es),
            ReduceScatter | Scatter => c.recv = (c.send as *mut u8).wrapping_add(r * cnt * es),
            AllGatherV => c.send = c.recv.wrapping_add(v[1][r] * es),
            ReduceScatterV => c.recv = (c.send as *mut u8).wrapping_add(sd * es),
            _ => unreachable!(),
        }
    }
    c.validate(r, n).unwrap_or_else(|e| panic!("{kind:?} rank {r} in place {ip}: {}", e.msg));
    c
}

/// Cutting a call into chunks and running each on its staging buffers gives every
/// rank's device buffers exactly what the whole call gives, guard bytes and gaps
/// between v-blocks untouched: every kind, 1-4 ranks, element sizes 1, 2 and 8,
/// in and out of place, every root, chunks of one element per block up to one chunk.
#[test]
fn chunks_give_the_whole_call_byte_for_byte() {
    let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15);
    let kinds =
        [AllReduce, Reduce, Broadcast, AllGather, Gather, ReduceScatter, Scatter, AlltoAll, AllGatherV, ReduceScatterV];
    let mut cases = 0;
    for kind in kinds {
        for n in 1..=4 {
            for dt in [DataType::Int8, DataType::Float16, DataType::Int64] {
                for ip in [false, true] {
                    for cnt in [1, 7, 37] {
                        for chunk in [1, 24, 100, 4096] {
                            let root =
                                if matches!(kind, Reduce | Broadcast | Gather | Scatter) { rng.index(n) } else { 0 };
                            // v-calls: counts up to 2*cnt (some 0), receive displacements in
                            // reverse order with gaps, each rank's send displacements likewise.
                            let rc: Vec<usize> =
                                (0..n).map(|_| if rng.index(4) == 0 { 0 } else { rng.index(2 * cnt + 1) }).collect();
                            let layout = |rng: &mut Rng| {
                                let mut d = vec![0; n];
                                let mut at = 0;
                                for q in (0..n).rev() {
                                    d[q] = at;
                                    at += rc[q] + rng.index(3);
                                }
                                d
                            };
                            let mut v = vec![rc.clone(), layout(&mut rng)];
                            v.extend((0..n).map(|_| layout(&mut rng)));
                            if ip && matches!(kind, AllGatherV | ReduceScatterV) && v[0].iter().all(|&c| c == 0) {
                                continue;
                            }
                            run_case(&Case { kind, dt, n, cnt, root, ip, v, chunk }, &mut rng);
                            cases += 1;
                        }
                    }
                }
            }
        }
    }
    assert!(cases > 2500, "{cases} cases");
}

fn run_case(case: &Case, rng: &mut Rng) {
    let Case { kind, dt, n, cnt, root, ip, ref v, chunk } = *case;
    let es = dt.size();
    let size = 2 * (40 + 4 * 4 * 2 * 37 * 8 + 40);
    let fill = |rng: &mut Rng| (0..size).map(|_| rng.next_u64() as u8).collect::<Vec<u8>>();
    let mut want: Vec<Vec<u8>> = (0..n).map(|_| fill(rng)).collect();
    let mut got = want.clone();
    let whole: Vec<Coll> = (0..n).map(|r| make(case, r, &mut want[r])).collect();
    reference(&whole);
    let calls: Vec<Coll> = (0..n).map(|r| make(case, r, &mut got[r])).collect();
    let plan = Cut::new(&calls[0], n, chunk).unwrap();
    for c in &calls {
        assert_eq!(Cut::new(c, n, chunk), Some(plan), "every rank cuts alike");
    }
    let what = || format!("{kind:?} {dt:?} n {n} count {cnt} root {root} in place {ip} v {v:?} chunk {chunk}");
    let mut moved = vec![0usize; n];
    for k in 0..plan.chunks {
        let pieces: Vec<Piece> = (0..n).map(|r| piece(&calls[r], r, n, &plan, k).unwrap()).collect();
        let mut slots: Vec<Vec<u8>> = pieces.iter().map(|p| vec![0xa5u8; p.bytes.max(1)]).collect();
        let mut host = Vec::new();
        for (r, p) in pieces.iter().enumerate() {
            if plan.chunks > 1 {
                assert!(
                    p.bytes <= plan.slot,
                    "chunk {k} of rank {r} needs {} > {} bytes: {}",
                    p.bytes,
                    plan.slot,
                    what()
                );
            }
            let base = slots[r].as_mut_ptr();
            p.ins.iter().for_each(|s| apply(s, base, true));
            let h = p.bind(base);
            h.validate(r, n).unwrap_or_else(|e| panic!("chunk {k} rank {r}: {}: {}", e.msg, what()));
            host.push(h);
            moved[r] += p.outs.iter().map(|s| s.width * s.rows).sum::<usize>();
        }
        reference(&host);
        for (r, p) in pieces.iter().enumerate() {
            p.outs.iter().for_each(|s| apply(s, slots[r].as_mut_ptr(), false));
        }
    }
    for r in 0..n {
        assert!(got[r] == want[r], "rank {r}: {}", what());
        // Each output byte is copied out once.
        let (_, rb) = whole[r].extents(r, n).unwrap();
        let written = match kind {
            AllGatherV => v[0].iter().sum::<usize>() * es,
            _ => rb,
        };
        assert_eq!(moved[r], if rb == 0 { 0 } else { written }, "rank {r}: {}", what());
    }
}
