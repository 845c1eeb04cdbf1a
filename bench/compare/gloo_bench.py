#!/usr/bin/env python3
"""gloo_bench: ferroccl-bench's sweep against PyTorch's Gloo backend (torch.distributed).

Same sizes, counts, bandwidth factors, timing (warmups, --max-time budget, -a
averaging), buffer rotation and CSV columns as ferroccl-bench (bench/cli.rs,
bench/coll.rs, bench/main.rs, bench/report.rs), so rows can be compared one by one.
It starts its own world: --nranks N processes (multiprocessing spawn), rendezvous
over TCP on 127.0.0.1 and a free port, Gloo over loopback (GLOO_SOCKET_IFNAME=lo),
one intra-op thread per rank (torch.set_num_threads(1)).

Calls and placements (Gloo's torch API has fewer forms than NCCL's):
  all_reduce      dist.all_reduce: in place only (torch has no out-of-place form).
  broadcast       dist.broadcast: one tensor per rank; out of place the root sends from
                  sendbuf and the others receive into recvbuf (the root's recvbuf is not
                  written, so not checked there); in place everyone uses recvbuf.
  reduce          dist.reduce: in place only (the root's tensor receives the result).
  all_gather      dist.all_gather_into_tensor; in place input = recvbuf + rank*count.
  reduce_scatter  dist.reduce_scatter_tensor (Gloo has it natively in this torch);
                  in place output = sendbuf + rank*count, as NCCL.
  all_to_all      dist.all_to_all_single; in place with the same tensor for input and
                  output (not checked, as ferroccl-bench).
  all_to_allv     dist.all_to_all_single with split sizes: the same uneven counts as
                  ferroccl-bench (bench/coll.rs v_count), but Gloo has no displacements,
                  so each rank's blocks are packed one after another instead of starting
                  at d*count. Same bytes moved. Out of place only.
  gather          dist.gather into views of recvbuf; in place input = recvbuf + rank*count.
  scatter         dist.scatter from views of sendbuf; in place output = recvbuf + rank*count.
  send_recv       dist.isend to rank+1 and dist.irecv from rank-1, both waited for. Out of
                  place only.
A placement Gloo has no form for gets no CSV row (N/A in the table).

Inputs are small integers so every result is exact; -o takes sum, prod, max, min
(Gloo has no avg). Types: float, double, int32, int64.

--device cuda: the tensors are CUDA tensors, every rank on --cuda-device (default 0:
ranks sharing one GPU, as bench/device_compare.py compares them); each timed loop
ends with torch.cuda.synchronize(). A collective Gloo cannot run on CUDA tensors in
this torch is skipped with a "# COLL: not run" line naming torch's error, and gets
no CSV row.

Test hook: COMPARE_BENCH_CORRUPT=1 makes every rank change the first element of its
receive buffer before each check, to prove that wrong results are reported.

Only argument parsing runs before torch is imported, so --help works without torch.
"""

import argparse
import datetime
import os
import socket
import sys
import time

COLLS = [
    "all_reduce", "broadcast", "reduce", "all_gather", "reduce_scatter",
    "all_to_all", "all_to_allv", "gather", "scatter", "send_recv",
]
TYPES = {"float": 4, "double": 8, "int32": 4, "int64": 8}
OPS = ["sum", "prod", "max", "min"]
CSV_HEADER = "collective,nranks,type,redop,root,size_bytes,count,placement,time_us,algbw_GBps,busbw_GBps,wrong"

# Placements Gloo has: (out of place, in place).
PLACEMENTS = {
    "all_reduce": (False, True),
    "broadcast": (True, True),
    "reduce": (False, True),
    "all_gather": (True, True),
    "reduce_scatter": (True, True),
    "all_to_all": (True, True),
    "all_to_allv": (True, False),
    "gather": (True, True),
    "scatter": (True, True),
    "send_recv": (True, False),
}


def parse_size(s):
    t = s.strip().lower()
    for suf in ("ib", "b"):
        if t.endswith(suf):
            t = t[: -len(suf)]
            break
    unit = 1
    if t and t[-1] in "kmg":
        unit = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}[t[-1]]
        t = t[:-1]
    try:
        v = float(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{s!r} is not a size (e.g. 8, 64K, 1M, 1G)")
    if v < 0:
        raise argparse.ArgumentTypeError(f"{s!r} is not a size")
    return int(v * unit)


def coll_name(s):
    sq = s.lower().replace("-", "").replace("_", "")
    if sq == "all":
        return "all"
    for c in COLLS:
        if c.replace("_", "") == sq:
            return c
    raise argparse.ArgumentTypeError(f"unknown collective {s!r} (one of {' '.join(COLLS)} or all)")


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="gloo_bench.py",
        description="ferroccl-bench's sweep against PyTorch's Gloo backend (same sizes, counts, "
        "busbw, timing and CSV columns). Starts --nranks local ranks itself.",
    )
    p.add_argument("collectives", nargs="*", type=coll_name, help=f"{' '.join(COLLS)}; all (default all_reduce)")
    p.add_argument("--nranks", "--np", type=int, default=2, help="local ranks to start (default 2)")
    p.add_argument("-b", "--minbytes", type=parse_size, default=8, help="smallest size (default 8)")
    p.add_argument("-e", "--maxbytes", type=parse_size, default=64 << 20, help="largest size (default 64M)")
    p.add_argument("-f", "--stepfactor", type=int, default=None, help="size factor between steps (default 2; 1 = add -i)")
    p.add_argument("-i", "--stepbytes", type=parse_size, default=None, help="add this between sizes when -f is 1 (default 1M)")
    p.add_argument("-n", "--iters", type=int, default=20, help="timed iterations (default 20; see --max-time)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="warmup iterations (default 5; see --max-time)")
    p.add_argument("-c", "--check", type=int, default=1, help="check iterations on fresh inputs (default 1; 0 = none)")
    p.add_argument("-d", "--datatype", choices=list(TYPES), default="float")
    p.add_argument("-o", "--op", choices=OPS, default="sum", help="reduction (Gloo has no avg)")
    p.add_argument("-r", "--root", type=int, default=0)
    p.add_argument("-a", "--average", type=int, choices=[0, 1, 2, 3], default=1,
                   help="ranks' times: 0 rank 0, 1 average (default), 2 min, 3 max")
    p.add_argument("--max-time", "--max_time", type=float, default=0.25,
                   help="time budget per size and placement in seconds, as ferroccl-bench (default 0.25; 0 = exactly -n, -w)")
    p.add_argument("--rotate", type=int, choices=[0, 1], default=1,
                   help="1 (default): iteration i uses offset (i mod k)*size in the allocation, as ferroccl-bench")
    p.add_argument("--csv", help="write ferroccl-bench's CSV columns to this file")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="tensor memory: cpu (default) or cuda (every rank on --cuda-device)")
    p.add_argument("--cuda-device", type=int, default=0, help="the GPU of every rank with --device cuda (default 0)")
    o = p.parse_args(argv)
    colls = []
    for c in o.collectives:
        for x in (COLLS if c == "all" else [c]):
            if x not in colls:
                colls.append(x)
    o.colls = colls or ["all_reduce"]
    factor = o.stepfactor
    if factor is not None and factor < 1:
        p.error("-f: the step factor must be at least 1")
    if factor == 1 or (factor is None and o.stepbytes is not None):
        o.factor = 0
    else:
        o.factor = factor or 2
    o.stepbytes = o.stepbytes if o.stepbytes is not None else 1 << 20
    if o.factor == 0 and o.stepbytes == 0:
        p.error("-i 0 with -f 1 would never reach the maximum size")
    if o.minbytes > o.maxbytes:
        p.error("-b is larger than -e")
    if o.factor > 1 and o.minbytes == 0:
        p.error("-b 0 with a step factor would never grow")
    if o.iters < 1 or o.warmup_iters < 0 or o.check < 0:
        p.error("-n needs at least 1; -w and -c at least 0")
    if o.nranks < 1 or not 0 <= o.root < o.nranks:
        p.error("--nranks needs at least 1 and -r must be a rank")
    if o.max_time < 0:
        p.error("--max-time needs seconds >= 0")
    return o


def sizes(o):
    out, s = [], o.minbytes
    while s <= o.maxbytes:
        out.append(s)
        nxt = s * o.factor if o.factor > 1 else s + o.stepbytes
        if nxt <= s:
            break
        s = nxt
    return out


def layout(c, count, n):
    """bench/coll.rs Layout: (param, send, recv, send_inplace, recv_inplace), in elements."""
    per = count // n
    if c in ("all_reduce", "broadcast", "reduce", "send_recv"):
        return (count, count, count, 0, 0)
    if c in ("all_gather", "gather"):
        return (per, per, per * n, per, 0)
    if c in ("reduce_scatter", "scatter"):
        return (per, per * n, per, 0, per)
    return (per, per * n, per * n, 0, 0)


def alg_bytes(c, param, esize, n):
    if c in ("all_reduce", "broadcast", "reduce", "send_recv"):
        return param * esize
    return param * n * esize


def bus_factor(c, n):
    if c == "all_reduce":
        return 2.0 * (n - 1) / n
    if c in ("broadcast", "reduce", "send_recv"):
        return 1.0
    return (n - 1) / n


def v_count(per, s, d, n):
    f = ((s + 1) * (d + 2)) % (n + 1)
    return per - per * f // (2 * n)


def fmt_time(us):
    if us >= 10000:
        return f"{us:7.0f}"
    if us >= 100:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------- the ranks


def worker(rank, o, port):
    # Large CPU tensors 2 MiB aligned with huge pages advised, as ferroccl-bench's
    # buffers from fcclMemAllocHost (PyTorch's CPU allocator reads this at start).
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    n = o.nranks
    cuda = o.device == "cuda"
    if cuda:
        torch.cuda.set_device(o.cuda_device)
    dev = torch.device("cuda", o.cuda_device) if cuda else torch.device("cpu")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    # On CUDA tensors a collective Gloo refuses on one rank only would leave the others
    # waiting: at most 5 minutes (Gloo's default is 30).
    extra = dict(timeout=datetime.timedelta(seconds=300)) if cuda else {}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=n, **extra)
    dtype = {"float": torch.float32, "double": torch.float64, "int32": torch.int32, "int64": torch.int64}[o.datatype]
    esize = TYPES[o.datatype]
    rop = {"sum": dist.ReduceOp.SUM, "prod": dist.ReduceOp.PRODUCT, "max": dist.ReduceOp.MAX,
           "min": dist.ReduceOp.MIN}[o.op]
    SENT = -1

    def data_val(r, j, seed):
        return (j * 7 + r * 131 + seed * 17) % 101

    def red_val(r, j, seed):
        if o.op == "prod":
            return 1 + ((j * 3 + r + seed) % 4 == 0).to(torch.int64)
        return data_val(r, j, seed)

    def red_expect(j, seed):
        acc = red_val(0, j, seed)
        for r in range(1, n):
            v = red_val(r, j, seed)
            acc = {"sum": lambda: acc + v, "prod": lambda: acc * v, "max": lambda: torch.maximum(acc, v),
                   "min": lambda: torch.minimum(acc, v)}[o.op]()
        return acc

    def ar(k):
        return torch.arange(k, dtype=torch.int64)

    def combine(local):
        t = torch.tensor([local], dtype=torch.float64)
        if o.average == 0:
            dist.broadcast(t, 0)
        elif o.average == 1:
            dist.all_reduce(t)
            t /= n
        else:
            dist.all_reduce(t, op=dist.ReduceOp.MIN if o.average == 2 else dist.ReduceOp.MAX)
        return t.item()

    def allmax(v):
        t = torch.tensor([v], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return t.item()

    def allsum_int(v):
        t = torch.tensor([v], dtype=torch.int64)
        dist.all_reduce(t)
        return int(t.item())

    szs = sizes(o)
    records = []
    if rank == 0:
        where = f"CUDA tensors on {torch.cuda.get_device_name(o.cuda_device)}" if cuda else "CPU tensors"
        print(f"# gloo_bench: torch {torch.__version__}, backend gloo, TCP over 127.0.0.1, {where}")
        step = f"{o.factor}(factor)" if o.factor > 1 else f"{o.stepbytes}(bytes)"
        print(f"# nRanks {n} minBytes {o.minbytes} maxBytes {o.maxbytes} step: {step} warmup iters: "
              f"{o.warmup_iters} iters: {o.iters} max time: {o.max_time:g} s rotate: {o.rotate} "
              f"validation: {o.check} average: {o.average}", flush=True)
    failed = 0
    for c in o.colls:
        if c == "send_recv" and n < 2:
            if rank == 0:
                print("# send_recv needs 2 ranks or more with Gloo: skipped", flush=True)
            continue
        buf = max(max(layout(c, s // esize, n)[1:3]) for s in szs) if szs else 0
        send = torch.zeros(max(buf, 1), dtype=dtype, device=dev)
        recv = torch.zeros(max(buf, 1), dtype=dtype, device=dev)

        if rank == 0:
            print(f"#\n# Collective: {c}")
            print("#       size         count      type   redop    root     time   algbw   busbw #wrong"
                  "     time   algbw   busbw #wrong")
            print("#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
                  "            (us)  (GB/s)  (GB/s)", flush=True)
        for size in szs:
            count = size // esize
            param, ls, lr, s_in, r_in = layout(c, count, n)
            per = param
            root = o.root if c in ("broadcast", "reduce", "gather", "scatter") else 0
            total = max(ls, lr)
            steps = max(buf // total, 1) if total > 0 and o.rotate else 1
            scounts = [v_count(per, rank, d, n) for d in range(n)]
            rcounts = [v_count(per, s, rank, n) for s in range(n)]

            def views(it, inplace):
                sh = total * (it % steps)
                if inplace:
                    return sh + s_in * rank, sh + r_in * rank, recv
                return sh, sh, send

            def run(it, inplace):
                so, ro, sbuf = views(it, inplace)
                if c == "all_reduce":
                    dist.all_reduce(recv[ro:ro + per], op=rop)
                elif c == "broadcast":
                    t = send[so:so + per] if (not inplace and rank == root) else recv[ro:ro + per]
                    dist.broadcast(t, src=root)
                elif c == "reduce":
                    dist.reduce(recv[ro:ro + per], dst=root, op=rop)
                elif c == "all_gather":
                    whole = so - s_in * rank if inplace else ro
                    dist.all_gather_into_tensor(recv[whole:whole + per * n], sbuf[so:so + per])
                elif c == "reduce_scatter":
                    dist.reduce_scatter_tensor(recv[ro:ro + per], sbuf[so:so + per * n], op=rop)
                elif c == "all_to_all":
                    dist.all_to_all_single(recv[ro:ro + per * n], sbuf[so:so + per * n])
                elif c == "all_to_allv":
                    dist.all_to_all_single(recv[ro:ro + sum(rcounts)], send[so:so + sum(scounts)],
                                           output_split_sizes=rcounts, input_split_sizes=scounts)
                elif c == "gather":
                    whole = so - s_in * rank if inplace else ro
                    gl = list(recv[whole:whole + per * n].split(per)) if rank == root and per > 0 else None
                    if rank == root and per == 0:
                        gl = [recv[whole:whole]] * n
                    dist.gather(sbuf[so:so + per], gather_list=gl, dst=root)
                elif c == "scatter":
                    sl = None
                    if rank == root:
                        sl = list(sbuf[so:so + per * n].split(per)) if per > 0 else [sbuf[so:so]] * n
                    dist.scatter(recv[ro:ro + per], scatter_list=sl, src=root)
                elif c == "send_recv":
                    reqs = [dist.isend(send[so:so + per], (rank + 1) % n),
                            dist.irecv(recv[ro:ro + per], (rank + n - 1) % n)]
                    for q in reqs:
                        q.wait()

            def fill(seed, inplace):
                me = rank
                recv[:lr] = SENT
                if c in ("all_reduce", "reduce", "reduce_scatter"):
                    (recv if inplace else send)[:ls] = red_val(me, ar(ls), seed).to(dtype)
                elif c == "broadcast":
                    if not inplace:
                        send[:ls] = data_val(me, ar(ls), seed).to(dtype)
                    elif me == root:
                        recv[:lr] = data_val(me, ar(lr), seed).to(dtype)
                elif c in ("all_gather", "gather"):
                    dst = recv[me * per:(me + 1) * per] if inplace else send[:per]
                    dst[:] = data_val(me, ar(per), seed).to(dtype)
                elif c == "scatter":
                    if not inplace:
                        send[:ls] = data_val(me, ar(ls), seed).to(dtype)
                    elif me == root:
                        recv[:ls] = data_val(me, ar(ls), seed).to(dtype)
                    else:
                        recv[:ls] = SENT
                else:  # all_to_all(v), send_recv
                    (recv if inplace else send)[:ls] = data_val(me, ar(ls), seed).to(dtype)

            def check(seed, inplace):
                me = rank
                exp, got = None, None
                if c == "all_reduce" or (c == "reduce" and me == root):
                    exp, got = red_expect(ar(per), seed), recv[:per]
                elif c == "broadcast" and (inplace or me != root):
                    exp, got = data_val(root, ar(per), seed), recv[:per]
                elif c == "all_gather" or (c == "gather" and me == root):
                    exp = torch.cat([data_val(p, ar(per), seed) for p in range(n)])
                    got = recv[:per * n]
                elif c == "reduce_scatter":
                    exp = red_expect(me * per + ar(per), seed)
                    got = recv[me * per:(me + 1) * per] if inplace else recv[:per]
                elif c == "scatter":
                    exp = data_val(root, me * per + ar(per), seed)
                    got = recv[me * per:(me + 1) * per] if inplace else recv[:per]
                elif c == "all_to_all":
                    exp = torch.cat([data_val(p, me * per + ar(per), seed) for p in range(n)])
                    got = recv[:per * n]
                elif c == "all_to_allv":
                    # Packed: sender p's block for me starts after its blocks for ranks < me.
                    parts = []
                    for p in range(n):
                        off = sum(v_count(per, p, d, n) for d in range(me))
                        parts.append(data_val(p, off + ar(v_count(per, p, me, n)), seed))
                    exp = torch.cat(parts)
                    got = recv[:len(exp)].cpu()
                    # Nothing past the packed blocks may be written.
                    extra = int((recv[len(exp):lr] != SENT).sum().item())
                    return int((got.to(torch.int64) != exp).sum().item()) + extra
                elif c == "send_recv":
                    exp, got = data_val((me + n - 1) % n, ar(per), seed), recv[:per]
                if exp is None:
                    return 0
                return int((got.cpu().to(torch.int64) != exp.to(torch.int64)).sum().item())

            def measure(inplace):
                fill(0, inplace)
                first = min(o.warmup_iters, 2)
                est = 0.0
                for it in range(first):
                    t = time.perf_counter()
                    run(it, inplace)
                    sync()
                    est = time.perf_counter() - t
                iters, more = o.iters, o.warmup_iters - first
                if o.max_time > 0 and first > 0:
                    m = allmax(est)
                    fit = (lambda b: int(b / m)) if m > 0 else (lambda b: 1 << 62)
                    iters = min(max(fit(o.max_time), 1), o.iters)
                    more = min(more, fit(o.max_time / 4))
                for it in range(first, first + more):
                    run(it, inplace)
                sync()
                dist.barrier()
                t0 = time.perf_counter()
                for it in range(iters):
                    run(it, inplace)
                sync()
                secs = combine((time.perf_counter() - t0) / iters)
                wrong = None
                unchecked = inplace and c in ("all_to_all", "all_to_allv", "send_recv")
                corrupt = os.environ.get("COMPARE_BENCH_CORRUPT", "") not in ("", "0")
                if o.check > 0 and not unchecked:
                    for k in range(o.check):
                        fill(1 + k, inplace)
                        run(0, inplace)
                        if corrupt:
                            recv[0] += 1000
                        w = check(1 + k, inplace)
                        if w:
                            print(f"gloo_bench: rank {rank}: {c} {max(ls, lr) * esize} B "
                                  f"{'in-place' if inplace else 'out-of-place'}: {w} wrong elements",
                                  file=sys.stderr, flush=True)
                        wrong = allsum_int(w)
                        if wrong:
                            break
                algbw = alg_bytes(c, param, esize, n) / secs / 1e9 if secs > 0 else 0.0
                return dict(collective=c, nranks=n, type=o.datatype,
                            redop=o.op if c in ("all_reduce", "reduce", "reduce_scatter") else "none",
                            root=o.root if c in ("broadcast", "reduce", "gather", "scatter") else -1,
                            size_bytes=max(ls, lr) * esize, count=param, placement="in" if inplace else "out",
                            time_us=secs * 1e6, algbw=algbw, busbw=algbw * bus_factor(c, n), wrong=wrong)

            has_out, has_in = PLACEMENTS[c]
            try:
                outp = measure(False) if has_out else None
                inp = measure(True) if has_in else None
            except RuntimeError as e:
                # Gloo refuses some collectives on CUDA tensors, on every rank alike at
                # dispatch: said once, and the collective is left out.
                if not cuda or size != szs[0]:
                    raise
                if rank == 0:
                    why = (str(e).strip().splitlines() or [type(e).__name__])[0]
                    print(f"# {c}: not run: Gloo cannot run it on CUDA tensors in this torch ({why})", flush=True)
                break
            for r in (outp, inp):
                if r is not None:
                    records.append(r)
                    failed += bool(r["wrong"])
            if rank == 0:
                r0 = outp or inp
                line = f"{r0['size_bytes']:>12}  {r0['count']:>12}  {r0['type']:>8}  {r0['redop']:>6}  {r0['root']:>6}"
                for r in (outp, inp):
                    if r is None:
                        line += f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>5}"
                    else:
                        w = "N/A" if r["wrong"] is None else str(r["wrong"])
                        line += f"  {fmt_time(r['time_us'])}  {r['algbw']:6.2f}  {r['busbw']:6.2f}  {w:>5}"
                print(line, flush=True)
        del send, recv
    if rank == 0:
        print(f"# Out of bounds values : {failed} {'FAILED' if failed else 'OK'}\n#", flush=True)
        if o.csv:
            with open(o.csv, "w") as f:
                f.write(CSV_HEADER + "\n")
                for r in records:
                    w = "" if r["wrong"] is None else str(r["wrong"])
                    f.write(f"{r['collective']},{r['nranks']},{r['type']},{r['redop']},{r['root']},{r['size_bytes']},"
                            f"{r['count']},{r['placement']},{r['time_us']:.3f},{r['algbw']:.6f},{r['busbw']:.6f},{w}\n")
    dist.barrier()
    dist.destroy_process_group()
    if failed:
        sys.exit(1)


def main(argv):
    o = parse_args(argv)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    port = free_port()
    os.environ["MASTER_PORT"] = str(port)
    import torch.multiprocessing as mp

    try:
        mp.spawn(worker, args=(o, port), nprocs=o.nranks, join=True)
    except mp.ProcessExitedException as e:
        print(f"gloo_bench: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a rank raised: spawn re-raises it here
        print(f"gloo_bench: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
