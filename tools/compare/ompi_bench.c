/*
 * ompi_bench: ferroccl-bench's sweep against MPI, for side-by-side comparisons.
 *
 * Same sizes, counts, bandwidth factors, timing (warmups, --max-time budget, -a
 * averaging), buffer rotation and CSV columns as ferroccl-bench (bench/cli.rs,
 * bench/coll.rs, bench/main.rs, bench/report.rs), so that the rows of both can be
 * compared one by one. Build: mpicc -O2 -o ompi_bench ompi_bench.c
 * Run: mpirun --allow-run-as-root --oversubscribe -np 2 ./ompi_bench all --csv x.csv
 * Built with -DFCCL_IDEAL -I tools/compare/ideal and ideal/ideal_mpi.c instead (gcc,
 * no MPI), the same program measures the bare data movement of each call: see
 * ideal/ideal_mpi.c; run it as `ideal_bench --np 2 all --csv x.csv`.
 *
 * MPI calls: MPI_Allreduce, MPI_Bcast, MPI_Reduce, MPI_Allgather,
 * MPI_Reduce_scatter_block, MPI_Alltoall, MPI_Alltoallv, MPI_Gather, MPI_Scatter and
 * MPI_Sendrecv (ring: rank r sends to r+1, receives from r-1).
 *
 * In place uses MPI_IN_PLACE where MPI has it, with ferroccl-bench's buffer offsets:
 *   all_reduce: MPI_IN_PLACE, data in recvbuf.
 *   broadcast: MPI_Bcast has one buffer; out of place the root sends from sendbuf and
 *     the others receive into recvbuf (the root's recvbuf is not written, unlike
 *     ncclBroadcast's, so it is not checked); in place everyone uses recvbuf.
 *   reduce: MPI_IN_PLACE at the root, the others send from recvbuf.
 *   all_gather, gather: MPI_IN_PLACE (at the root for gather), own block at
 *     recvbuf + rank*count; the non-roots of gather send from recvbuf + rank*count.
 *   reduce_scatter: MPI_IN_PLACE; MPI leaves the result at the START of the buffer,
 *     not at recvbuf + rank*count as NCCL does; checked there.
 *   scatter: MPI_IN_PLACE at the root (its block stays at rank*count), the others
 *     receive at recvbuf + rank*count.
 *   all_to_all: MPI_IN_PLACE (checked, as in ferroccl-bench).
 *   all_to_allv: no in-place row. MPI_IN_PLACE makes every rank send what the
 *     recvcounts say it receives, which the uneven pattern (bench/coll.rs v_count) is
 *     not, and sendbuf == recvbuf is not allowed in MPI.
 *   send_recv: MPI_Sendrecv_replace (not checked, as in ferroccl-bench).
 * Inputs are small integers so every result is exact; MPI has no avg, so -o takes
 * sum, prod, max, min. Types: float, double, int32, int64.
 * Test hook: COMPARE_BENCH_CORRUPT=1 makes every rank change the first element of its
 * receive buffer before each check, to prove that wrong results are reported.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <string.h>

enum { AR, BC, RED, AG, RS, A2A, A2AV, GATHER, SCATTER, SR, NCOLL };
static const char *coll_names[NCOLL] = {"all_reduce", "broadcast",   "reduce", "all_gather", "reduce_scatter",
                                        "all_to_all", "all_to_allv", "gather", "scatter",    "send_recv"};

enum { T_FLOAT, T_DOUBLE, T_INT32, T_INT64 };
static const char *type_names[] = {"float", "double", "int32", "int64"};
static const size_t type_sizes[] = {4, 8, 4, 8};
enum { O_SUM, O_PROD, O_MAX, O_MIN };
static const char *op_names[] = {"sum", "prod", "max", "min"};

typedef struct {
    int colls[NCOLL], ncolls;
    uint64_t minb, maxb, factor, stepb;
    long iters, warmup, check;
    int ty, op, average, rotate;
    long root;
    double max_time;
    const char *csv;
} Opts;

static int rank, nranks;

static void die_usage(const char *msg, const char *arg) {
    if (rank == 0) fprintf(stderr, "ompi_bench: %s%s%s\n(ompi_bench --help lists the options)\n", msg, arg ? " " : "", arg ? arg : "");
    MPI_Finalize();
    exit(2);
}

static const char *usage_text =
    "usage: mpirun -np N ompi_bench [COLLECTIVE...] [options]\n"
    "\n"
    "ferroccl-bench's sweep against MPI (same sizes, counts, busbw, timing and CSV).\n"
    "Collectives (default all_reduce): all_reduce broadcast reduce all_gather\n"
    "  reduce_scatter all_to_all all_to_allv gather scatter send_recv; all (these)\n"
    "  -b, --minbytes SIZE   smallest size (default 8; suffixes K M G = 2^10, 2^20, 2^30)\n"
    "  -e, --maxbytes SIZE   largest size (default 64M)\n"
    "  -f, --stepfactor F    multiply by F between sizes (default 2; 1 = add -i)\n"
    "  -i, --stepbytes SIZE  add SIZE between sizes when -f is 1 (default 1M)\n"
    "  -n, --iters N         timed iterations (default 20; see --max-time)\n"
    "  -w, --warmup_iters N  warmup iterations (default 5; see --max-time)\n"
    "  -c, --check N         check iterations on fresh inputs (default 1; 0 = none)\n"
    "  -d, --datatype T      float double int32 int64 (default float)\n"
    "  -o, --op OP           sum prod max min (default sum; MPI has no avg)\n"
    "  -r, --root R          root of broadcast, reduce, gather, scatter (default 0)\n"
    "  -a, --average 0|1|2|3 ranks' times: rank 0, average (default), min, max\n"
    "  --max-time SECONDS    time budget per size and placement (default 0.25), as\n"
    "                        ferroccl-bench: the slowest rank's time of the 2nd warmup\n"
    "                        cuts the timed iterations to the budget (>= 1) and the\n"
    "                        remaining warmups to a quarter of it; 0 = exactly -n, -w\n"
    "  --rotate 0|1          1 (default): iteration i uses offset (i mod k)*size in the\n"
    "                        allocation for the largest size, as ferroccl-bench\n"
    "  --csv FILE            ferroccl-bench's CSV columns\n"
    "  -h, --help            this text\n";

static uint64_t parse_size(const char *s) {
    char *end;
    double v = strtod(s, &end);
    if (end == s || v < 0) die_usage("not a size:", s);
    uint64_t unit = 1;
    switch (*end) {
    case 'k': case 'K': unit = 1ull << 10; end++; break;
    case 'm': case 'M': unit = 1ull << 20; end++; break;
    case 'g': case 'G': unit = 1ull << 30; end++; break;
    }
    if (*end == 'i' || *end == 'I') end++;
    if (*end == 'b' || *end == 'B') end++;
    if (*end) die_usage("not a size:", s);
    return (uint64_t)(v * (double)unit);
}

static long parse_long(const char *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (end == s || *end) die_usage("not a number:", s);
    return v;
}

static void parse(int argc, char **argv, Opts *o) {
    memset(o, 0, sizeof *o);
    o->minb = 8; o->maxb = 64ull << 20; o->factor = 2; o->stepb = 1 << 20;
    o->iters = 20; o->warmup = 5; o->check = 1; o->ty = T_FLOAT; o->op = O_SUM;
    o->average = 1; o->rotate = 1; o->max_time = 0.25;
    int seen[NCOLL] = {0};
    int factor_set = 0, stepb_set = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        char flag[64] = {0};
        const char *val = NULL;
        if (a[0] == '-' && a[1] == '-') {
            const char *eq = strchr(a, '=');
            size_t len = eq ? (size_t)(eq - a) : strlen(a);
            if (len >= sizeof flag) die_usage("unknown option", a);
            memcpy(flag, a, len);
            if (eq) val = eq + 1;
        } else if (a[0] == '-' && a[1] && strlen(a) > 2) {
            memcpy(flag, a, 2);
            val = a + 2;
        } else {
            snprintf(flag, sizeof flag, "%s", a);
        }
        if (!strcmp(flag, "-h") || !strcmp(flag, "--help")) {
            if (rank == 0) fputs(usage_text, stdout);
            MPI_Finalize();
            exit(0);
        }
        if (flag[0] == '-') {
            if (!val) {
                if (i + 1 >= argc) die_usage("needs a value:", flag);
                val = argv[++i];
            }
            if (!strcmp(flag, "-b") || !strcmp(flag, "--minbytes")) o->minb = parse_size(val);
            else if (!strcmp(flag, "-e") || !strcmp(flag, "--maxbytes")) o->maxb = parse_size(val);
            else if (!strcmp(flag, "-f") || !strcmp(flag, "--stepfactor")) { o->factor = (uint64_t)parse_long(val); factor_set = 1; }
            else if (!strcmp(flag, "-i") || !strcmp(flag, "--stepbytes")) { o->stepb = parse_size(val); stepb_set = 1; }
            else if (!strcmp(flag, "-n") || !strcmp(flag, "--iters")) o->iters = parse_long(val);
            else if (!strcmp(flag, "-w") || !strcmp(flag, "--warmup_iters")) o->warmup = parse_long(val);
            else if (!strcmp(flag, "-c") || !strcmp(flag, "--check")) o->check = parse_long(val);
            else if (!strcmp(flag, "-r") || !strcmp(flag, "--root")) o->root = parse_long(val);
            else if (!strcmp(flag, "-a") || !strcmp(flag, "--average")) {
                o->average = (int)parse_long(val);
                if (o->average < 0 || o->average > 3) die_usage("-a: use 0, 1, 2 or 3, not", val);
            } else if (!strcmp(flag, "--max-time") || !strcmp(flag, "--max_time")) {
                char *end;
                o->max_time = strtod(val, &end);
                if (end == val || *end || o->max_time < 0) die_usage("--max-time needs seconds >= 0, not", val);
            } else if (!strcmp(flag, "--rotate")) {
                if (strcmp(val, "0") && strcmp(val, "1")) die_usage("--rotate: use 0 or 1, not", val);
                o->rotate = val[0] == '1';
            } else if (!strcmp(flag, "--csv")) o->csv = val;
            else if (!strcmp(flag, "-d") || !strcmp(flag, "--datatype")) {
                int t = -1;
                for (int k = 0; k < 4; k++) if (!strcmp(val, type_names[k])) t = k;
                if (!strcmp(val, "int")) t = T_INT32;
                if (t < 0) die_usage("-d: one of float double int32 int64, not", val);
                o->ty = t;
            } else if (!strcmp(flag, "-o") || !strcmp(flag, "--op")) {
                int p = -1;
                for (int k = 0; k < 4; k++) if (!strcmp(val, op_names[k])) p = k;
                if (p < 0) die_usage("-o: one of sum prod max min (MPI has no avg), not", val);
                o->op = p;
            } else die_usage("unknown option", flag);
            continue;
        }
        if (!strcmp(a, "all")) {
            for (int c = 0; c < NCOLL; c++) seen[c] = 1;
            continue;
        }
        /* Names as printed, or without underscores (allreduce, alltoallv); '-' = '_'. */
        char sq[64] = {0};
        size_t k = 0;
        for (const char *p = a; *p && k < sizeof sq - 1; p++) if (*p != '_' && *p != '-') sq[k++] = *p;
        int found = -1;
        for (int c = 0; c < NCOLL; c++) {
            char cs[64] = {0};
            size_t m = 0;
            for (const char *p = coll_names[c]; *p; p++) if (*p != '_') cs[m++] = *p;
            if (!strcmp(sq, cs)) found = c;
        }
        if (found < 0) die_usage("unknown collective", a);
        if (!seen[found]) {
            seen[found] = 1;
            o->colls[o->ncolls++] = found;
        }
    }
    /* "all" runs every collective in the canonical order (after any named ones). */
    for (int c = 0; c < NCOLL; c++) {
        int listed = 0;
        for (int k = 0; k < o->ncolls; k++) listed |= o->colls[k] == c;
        if (seen[c] && !listed) o->colls[o->ncolls++] = c;
    }
    if (o->ncolls == 0) o->colls[o->ncolls++] = AR;
    if (factor_set && o->factor == 0) die_usage("-f 0: the step factor must be at least 1", NULL);
    if ((factor_set && o->factor == 1) || (!factor_set && stepb_set)) o->factor = 0;
    if (o->factor == 0 && o->stepb == 0) die_usage("-i 0 with -f 1 would never reach the maximum size", NULL);
    if (o->minb > o->maxb) die_usage("-b is larger than -e", NULL);
    if (o->factor > 1 && o->minb == 0) die_usage("-b 0 with a step factor would never grow", NULL);
    if (o->iters < 1) die_usage("-n needs at least 1 iteration", NULL);
    if (o->warmup < 0 || o->check < 0) die_usage("-w and -c take counts >= 0", NULL);
    if (o->root < 0 || o->root >= nranks) die_usage("-r: the root must be a rank", NULL);
}

/* The sweep's sizes (bytes as given). */
static int sizes(const Opts *o, uint64_t *out, int max) {
    int k = 0;
    for (uint64_t s = o->minb; s <= o->maxb && k < max;) {
        out[k++] = s;
        uint64_t next = o->factor > 1 ? s * o->factor : s + o->stepb;
        if (next <= s) break;
        s = next;
    }
    return k;
}

/* ferroccl-bench's Layout (nccl-tests' getCollByteCount), in elements. */
typedef struct { size_t param, send, recv, send_inplace, recv_inplace; } Layout;

static Layout layout(int c, size_t count, int n) {
    size_t per = count / (size_t)n;
    Layout l;
    switch (c) {
    case AR: case BC: case RED: case SR: l = (Layout){count, count, count, 0, 0}; break;
    case AG: case GATHER: l = (Layout){per, per, per * n, per, 0}; break;
    case RS: case SCATTER: l = (Layout){per, per * n, per, 0, per}; break;
    default: l = (Layout){per, per * n, per * n, 0, 0}; break; /* all_to_all(v) */
    }
    return l;
}

static double alg_bytes(int c, const Layout *l, size_t esize, int n) {
    if (c == AR || c == BC || c == RED || c == SR) return (double)(l->param * esize);
    return (double)(l->param * (size_t)n * esize);
}

static double bus_factor(int c, int n) {
    if (c == AR) return 2.0 * (n - 1) / n;
    if (c == BC || c == RED || c == SR) return 1.0;
    return (double)(n - 1) / n;
}

static int reduces(int c) { return c == AR || c == RED || c == RS; }
static int has_root(int c) { return c == BC || c == RED || c == GATHER || c == SCATTER; }
static int inplace_checked(int c) { return c != A2AV && c != SR; }
/* Whether MPI has an in-place form of the call (see the top of the file). */
static int has_inplace(int c) { return c != A2AV; }

/* all_to_allv's count from rank s to rank d (bench/coll.rs v_count). */
static size_t v_count(size_t per, int s, int d, int n) {
    size_t f = (size_t)(((s + 1) * (d + 2)) % (n + 1));
    return per - per * f / (2 * (size_t)n);
}

/* ---- inputs: small integers, exact in every type ---- */
static uint64_t data_val(int r, size_t j, uint64_t seed) { return (j * 7 + (uint64_t)r * 131 + seed * 17) % 101; }
static uint64_t red_val(int op, int r, size_t j, uint64_t seed) {
    if (op == O_PROD) return 1 + ((j * 3 + (uint64_t)r + seed) % 4 == 0);
    return data_val(r, j, seed);
}
static uint64_t red_expect(int op, size_t j, uint64_t seed) {
    uint64_t acc = red_val(op, 0, j, seed);
    for (int r = 1; r < nranks; r++) {
        uint64_t v = red_val(op, r, j, seed);
        switch (op) {
        case O_SUM: acc += v; break;
        case O_PROD: acc *= v; break;
        case O_MAX: acc = v > acc ? v : acc; break;
        default: acc = v < acc ? v : acc; break;
        }
    }
    return acc;
}

static int ty;
static void put(void *base, size_t i, double v) {
    switch (ty) {
    case T_FLOAT: ((float *)base)[i] = (float)v; break;
    case T_DOUBLE: ((double *)base)[i] = v; break;
    case T_INT32: ((int32_t *)base)[i] = (int32_t)v; break;
    default: ((int64_t *)base)[i] = (int64_t)v; break;
    }
}
static double get(const void *base, size_t i) {
    switch (ty) {
    case T_FLOAT: return ((const float *)base)[i];
    case T_DOUBLE: return ((const double *)base)[i];
    case T_INT32: return ((const int32_t *)base)[i];
    default: return (double)((const int64_t *)base)[i];
    }
}
#define SENTINEL (-1.0)

static MPI_Datatype mpi_type(void) {
    switch (ty) {
    case T_FLOAT: return MPI_FLOAT;
    case T_DOUBLE: return MPI_DOUBLE;
    case T_INT32: return MPI_INT32_T;
    default: return MPI_INT64_T;
    }
}
static MPI_Op mpi_op(int op) {
    switch (op) {
    case O_SUM: return MPI_SUM;
    case O_PROD: return MPI_PROD;
    case O_MAX: return MPI_MAX;
    default: return MPI_MIN;
    }
}

typedef struct {
    int coll, op, root, rotate;
    Layout l;
    char *send_base, *recv_base;
    size_t buf_bytes, esize;
    int *scounts, *sdispls, *rcounts, *rdispls;
} Case;

/* (sendbuf, recvbuf) of iteration `iter`, as bench/coll.rs Case::buffers. */
static void buffers(const Case *c, long iter, int inplace, char **s, char **r) {
    size_t total = (c->l.send > c->l.recv ? c->l.send : c->l.recv) * c->esize;
    size_t steps = (total > 0 && c->rotate) ? c->buf_bytes / total : 1;
    if (steps < 1) steps = 1;
    size_t shift = total * ((size_t)iter % steps);
    *s = c->send_base + shift;
    *r = c->recv_base + shift;
    if (inplace) {
        char *rr = *r;
        *s = rr + c->l.send_inplace * (size_t)rank * c->esize;
        *r = rr + c->l.recv_inplace * (size_t)rank * c->esize;
    }
}

static void run(const Case *c, long iter, int inplace) {
    char *s, *r;
    buffers(c, iter, inplace, &s, &r);
    MPI_Datatype t = mpi_type();
    MPI_Comm w = MPI_COMM_WORLD;
    int cnt = (int)c->l.param, me = rank, root = c->root;
    switch (c->coll) {
    case AR:
        MPI_Allreduce(inplace ? MPI_IN_PLACE : s, r, cnt, t, mpi_op(c->op), w);
        break;
    case BC:
        MPI_Bcast(inplace ? r : (me == root ? s : r), cnt, t, root, w);
        break;
    case RED:
        if (inplace) MPI_Reduce(me == root ? MPI_IN_PLACE : r, r, cnt, t, mpi_op(c->op), root, w);
        else MPI_Reduce(s, r, cnt, t, mpi_op(c->op), root, w);
        break;
    case AG:
        /* In place sendbuf = recvbuf + rank*count: the block is already in r. */
        MPI_Allgather(inplace ? MPI_IN_PLACE : s, cnt, t, r, cnt, t, w);
        break;
    case RS:
        /* In place recvbuf = s + rank*count; MPI's buffer is the whole input, s. */
        MPI_Reduce_scatter_block(inplace ? MPI_IN_PLACE : s, inplace ? s : r, cnt, t, mpi_op(c->op), w);
        break;
    case A2A:
        MPI_Alltoall(inplace ? MPI_IN_PLACE : s, cnt, t, r, cnt, t, w);
        break;
    case A2AV:
        MPI_Alltoallv(inplace ? MPI_IN_PLACE : s, c->scounts, c->sdispls, t, r, c->rcounts, c->rdispls, t, w);
        break;
    case GATHER:
        /* In place every rank's block is at s = r + rank*count. */
        MPI_Gather(inplace && me == root ? MPI_IN_PLACE : s, cnt, t, r, cnt, t, root, w);
        break;
    case SCATTER:
        /* In place s is the whole buffer and r = s + rank*count. */
        MPI_Scatter(s, cnt, t, inplace && me == root ? MPI_IN_PLACE : r, cnt, t, root, w);
        break;
    case SR: {
        int to = (me + 1) % nranks, from = (me + nranks - 1) % nranks;
        if (inplace) MPI_Sendrecv_replace(r, cnt, t, to, 0, from, 0, w, MPI_STATUS_IGNORE);
        else MPI_Sendrecv(s, cnt, t, to, 0, r, cnt, t, from, 0, w, MPI_STATUS_IGNORE);
        break;
    }
    }
}

/* Inputs of iteration 0's buffers, sentinels where results go (bench/coll.rs fill). */
static void fill(const Case *c, uint64_t seed, int inplace) {
    const Layout *l = &c->l;
    char *sb = c->send_base, *rb = c->recv_base;
    size_t per = l->param, e = c->esize;
    int me = rank, root = c->root;
    for (size_t k = 0; k < l->recv; k++) put(rb, k, SENTINEL);
    switch (c->coll) {
    case AR: case RED: case RS:
        for (size_t k = 0; k < l->send; k++) put(inplace ? rb : sb, k, (double)red_val(c->op, me, k, seed));
        break;
    case BC:
        if (!inplace) for (size_t k = 0; k < l->send; k++) put(sb, k, (double)data_val(me, k, seed));
        else if (me == root) for (size_t k = 0; k < l->recv; k++) put(rb, k, (double)data_val(me, k, seed));
        break;
    case AG: case GATHER:
        if (!inplace) for (size_t k = 0; k < per; k++) put(sb, k, (double)data_val(me, k, seed));
        else for (size_t k = 0; k < per; k++) put(rb + me * per * e, k, (double)data_val(me, k, seed));
        break;
    case SCATTER:
        if (!inplace) for (size_t k = 0; k < l->send; k++) put(sb, k, (double)data_val(me, k, seed));
        else for (size_t k = 0; k < l->send; k++) put(rb, k, me == root ? (double)data_val(me, k, seed) : SENTINEL);
        break;
    case A2A: case A2AV:
        for (size_t k = 0; k < l->send; k++) put(inplace ? rb : sb, k, (double)data_val(me, k, seed));
        break;
    case SR:
        for (size_t k = 0; k < l->send; k++) put(inplace ? rb : sb, k, (double)data_val(me, k, seed));
        break;
    }
}

/* Wrong elements of this rank's results of iteration 0's buffers. */
static uint64_t check(const Case *c, uint64_t seed, int inplace) {
    const Layout *l = &c->l;
    const char *rb = c->recv_base;
    size_t per = l->param, e = c->esize;
    int me = rank, root = c->root, n = nranks;
    uint64_t wrong = 0;
    long first = -1;
#define EXPECT(buf, k, want) do { if (get((buf), (k)) != (double)(want)) { wrong++; if (first < 0) first = (long)(k); } } while (0)
    switch (c->coll) {
    case AR:
        for (size_t k = 0; k < per; k++) EXPECT(rb, k, red_expect(c->op, k, seed));
        break;
    case RED:
        if (me == root) for (size_t k = 0; k < per; k++) EXPECT(rb, k, red_expect(c->op, k, seed));
        break;
    case BC:
        /* Out of place the root's recvbuf is not part of MPI_Bcast. */
        if (inplace || me != root) for (size_t k = 0; k < per; k++) EXPECT(rb, k, data_val(root, k, seed));
        break;
    case AG:
        for (int p = 0; p < n; p++) for (size_t k = 0; k < per; k++) EXPECT(rb, p * per + k, data_val(p, k, seed));
        break;
    case GATHER:
        if (me == root) for (int p = 0; p < n; p++) for (size_t k = 0; k < per; k++) EXPECT(rb, p * per + k, data_val(p, k, seed));
        break;
    case RS:
        /* MPI_IN_PLACE leaves the result at the start of the buffer. */
        for (size_t k = 0; k < per; k++) EXPECT(rb, k, red_expect(c->op, me * per + k, seed));
        break;
    case SCATTER: {
        const char *mine = inplace ? rb + me * per * e : rb;
        for (size_t k = 0; k < per; k++) EXPECT(mine, k, data_val(root, me * per + k, seed));
        break;
    }
    case A2A:
        for (int p = 0; p < n; p++) for (size_t k = 0; k < per; k++) EXPECT(rb, p * per + k, data_val(p, me * per + k, seed));
        break;
    case A2AV:
        for (int p = 0; p < n; p++) {
            size_t v = v_count(per, p, me, n);
            for (size_t k = 0; k < per; k++) {
                if (k < v) EXPECT(rb, p * per + k, data_val(p, me * per + k, seed));
                else EXPECT(rb, p * per + k, SENTINEL); /* past the count: untouched */
            }
        }
        break;
    case SR:
        for (size_t k = 0; k < per; k++) EXPECT(rb, k, data_val((me + n - 1) % n, k, seed));
        break;
    }
#undef EXPECT
    if (first >= 0)
        fprintf(stderr, "ompi_bench: rank %d: %s %s: %llu wrong elements, first at %ld\n", rank, coll_names[c->coll],
                inplace ? "in-place" : "out-of-place", (unsigned long long)wrong, first);
    return wrong;
}

typedef struct {
    double time_us, algbw, busbw;
    long long wrong; /* -1 = not checked */
} Result;

static double combine(const Opts *o, double local) {
    double v = local;
    switch (o->average) {
    case 0: MPI_Bcast(&v, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD); return v;
    case 1: MPI_Allreduce(&local, &v, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD); return v / nranks;
    case 2: MPI_Allreduce(&local, &v, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD); return v;
    default: MPI_Allreduce(&local, &v, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD); return v;
    }
}

/* Warmups, the timed loop and the checks (bench/main.rs measure). */
static Result measure(const Opts *o, const Case *c, int inplace) {
    fill(c, 0, inplace);
    long first = o->warmup < 2 ? o->warmup : 2;
    double est = 0;
    for (long it = 0; it < first; it++) {
        double t = MPI_Wtime();
        run(c, it, inplace);
        est = MPI_Wtime() - t;
    }
    long iters = o->iters, more = o->warmup - first;
    if (o->max_time > 0 && first > 0) {
        double m;
        MPI_Allreduce(&est, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        double fit_t = m > 0 ? o->max_time / m : 1e18, fit_w = m > 0 ? o->max_time / 4 / m : 1e18;
        iters = fit_t < 1 ? 1 : (fit_t > (double)o->iters ? o->iters : (long)fit_t);
        if (fit_w < (double)more) more = (long)fit_w;
    }
    for (long it = first; it < first + more; it++) run(c, it, inplace);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (long it = 0; it < iters; it++) run(c, it, inplace);
    double local = (MPI_Wtime() - t0) / (double)iters;
    double secs = combine(o, local);

    Result res = {secs * 1e6, 0, 0, -1};
    if (o->check > 0 && (!inplace || inplace_checked(c->coll))) {
        const char *corrupt = getenv("COMPARE_BENCH_CORRUPT");
        unsigned long long total = 0;
        for (long k = 0; k < o->check; k++) {
            uint64_t seed = 1 + (uint64_t)k;
            fill(c, seed, inplace);
            run(c, 0, inplace);
            if (corrupt && *corrupt && strcmp(corrupt, "0")) put(c->recv_base, 0, get(c->recv_base, 0) + 1000);
            unsigned long long w = check(c, seed, inplace);
            MPI_Allreduce(&w, &total, 1, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
            if (total > 0) break;
        }
        res.wrong = (long long)total;
    }
    res.algbw = secs > 0 ? alg_bytes(c->coll, &c->l, c->esize, nranks) / secs / 1e9 : 0;
    res.busbw = res.algbw * bus_factor(c->coll, nranks);
    return res;
}

static void print_time(double us) {
    if (us >= 10000) printf("  %7.0f", us);
    else if (us >= 100) printf("  %7.1f", us);
    else printf("  %7.2f", us);
}

/* Buffers as ferroccl-bench gets them from fcclMemAllocHost: 2 MiB aligned and advised
 * for transparent huge pages from 2 MiB up, so both sides stream through the same kind
 * of memory. */
static char *alloc_buf(size_t bytes) {
#ifdef FCCL_IDEAL
    return (char *)ideal_alloc(bytes);
#endif
    const size_t huge = (size_t)2 << 20;
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    if (posix_memalign(&p, bytes >= huge ? huge : 4096, bytes) != 0) return NULL;
    if (bytes >= huge) madvise(p, bytes, MADV_HUGEPAGE);
    return (char *)p;
}

static void free_buf(char *p) {
#ifdef FCCL_IDEAL
    ideal_free(p);
#else
    free(p);
#endif
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);
    Opts o;
    parse(argc, argv, &o);
    ty = o.ty;
    size_t esize = type_sizes[o.ty];
    uint64_t sz[128];
    int nsz = sizes(&o, sz, 128);
    FILE *csv = NULL;
    if (rank == 0) {
        int ver, sub;
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_version(&ver, &sub);
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl) *nl = 0;
        printf("# ompi_bench: %s (MPI %d.%d)\n", lib, ver, sub);
        printf("# nRanks %d minBytes %llu maxBytes %llu step: %llu(%s) warmup iters: %ld iters: %ld max time: %g s "
               "rotate: %d validation: %ld average: %d\n",
               nranks, (unsigned long long)o.minb, (unsigned long long)o.maxb,
               (unsigned long long)(o.factor > 1 ? o.factor : o.stepb), o.factor > 1 ? "factor" : "bytes", o.warmup,
               o.iters, o.max_time, o.rotate, o.check, o.average);
        if (o.csv) {
            csv = fopen(o.csv, "w");
            if (!csv) {
                fprintf(stderr, "ompi_bench: cannot write %s\n", o.csv);
                MPI_Abort(MPI_COMM_WORLD, 3);
            }
            fprintf(csv, "collective,nranks,type,redop,root,size_bytes,count,placement,time_us,algbw_GBps,busbw_GBps,wrong\n");
        }
    }
    int failed = 0;
    for (int ci = 0; ci < o.ncolls; ci++) {
        int coll = o.colls[ci];
        size_t buf_bytes = 0;
        for (int k = 0; k < nsz; k++) {
            Layout l = layout(coll, (size_t)(sz[k] / esize), nranks);
            size_t b = (l.send > l.recv ? l.send : l.recv) * esize;
            if (b > buf_bytes) buf_bytes = b;
        }
        char *sendb = alloc_buf(buf_bytes), *recvb = alloc_buf(buf_bytes);
        if (!sendb || !recvb) {
            fprintf(stderr, "ompi_bench: out of memory (%zu bytes)\n", buf_bytes);
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
        memset(sendb, 0, buf_bytes);
        memset(recvb, 0, buf_bytes);
        if (rank == 0)
            printf("#\n# Collective: %s\n#       size         count      type   redop    root     time   algbw   busbw #wrong"
                   "     time   algbw   busbw #wrong\n#        (B)    (elements)                               (us)  (GB/s)  (GB/s)"
                   "            (us)  (GB/s)  (GB/s)\n",
                   coll_names[coll]);
        for (int k = 0; k < nsz; k++) {
            size_t count = (size_t)(sz[k] / esize);
            Case c = {coll, o.op, has_root(coll) ? (int)o.root : 0, o.rotate, layout(coll, count, nranks), sendb, recvb,
                      buf_bytes, esize, NULL, NULL, NULL, NULL};
            int sc[nranks], sd[nranks], rc[nranks], rd[nranks];
            if (coll == A2AV) {
                for (int p = 0; p < nranks; p++) {
                    sc[p] = (int)v_count(c.l.param, rank, p, nranks);
                    rc[p] = (int)v_count(c.l.param, p, rank, nranks);
                    sd[p] = (int)(p * c.l.param);
                    rd[p] = (int)(p * c.l.param);
                }
                c.scounts = sc; c.sdispls = sd; c.rcounts = rc; c.rdispls = rd;
            }
            Result r[2] = {{0, 0, 0, -2}, {0, 0, 0, -2}}; /* wrong -2: no such placement */
            for (int inplace = 0; inplace < 1 + has_inplace(coll); inplace++) r[inplace] = measure(&o, &c, inplace);
            if (rank == 0) {
                size_t size_bytes = (c.l.send > c.l.recv ? c.l.send : c.l.recv) * esize;
                const char *redop = reduces(coll) ? op_names[o.op] : "none";
                long rootcol = has_root(coll) ? o.root : -1;
                printf("%12zu  %12zu  %8s  %6s  %6ld", size_bytes, c.l.param, type_names[o.ty], redop, rootcol);
                for (int p = 0; p < 2; p++) {
                    if (r[p].wrong == -2) {
                        printf("  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
                        continue;
                    }
                    print_time(r[p].time_us);
                    printf("  %6.2f  %6.2f  ", r[p].algbw, r[p].busbw);
                    if (r[p].wrong < 0) printf("%5s", "N/A");
                    else printf("%5lld", r[p].wrong);
                    if (csv) {
                        fprintf(csv, "%s,%d,%s,%s,%ld,%zu,%zu,%s,%.3f,%.6f,%.6f,", coll_names[coll], nranks,
                                type_names[o.ty], redop, rootcol, size_bytes, c.l.param, p ? "in" : "out", r[p].time_us,
                                r[p].algbw, r[p].busbw);
                        if (r[p].wrong >= 0) fprintf(csv, "%lld", r[p].wrong);
                        fputc('\n', csv);
                    }
                }
                printf("\n");
                fflush(stdout);
            }
            for (int p = 0; p < 2; p++) failed += r[p].wrong > 0;
        }
        free_buf(sendb);
        free_buf(recvb);
    }
    if (rank == 0) {
        printf("# Out of bounds values : %d %s\n#\n", failed, failed ? "FAILED" : "OK");
        if (csv) fclose(csv);
    }
    MPI_Finalize();
    return failed ? 1 : 0;
}
