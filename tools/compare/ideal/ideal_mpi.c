/*
 * ideal_mpi.c: the bare data movement of each collective, behind the MPI calls that
 * tools/compare/ompi_bench.c makes, as a ceiling to hold ferroccl against.
 *
 * MPI_Init forks the ranks (rank 0 is the process started, `--np N` is taken from
 * its arguments) after mapping one shared arena that every rank sees at the same
 * address; ideal_alloc hands out the benchmark's buffers from it (2 MiB aligned and
 * collapsed into huge pages from 2 MiB up, as fcclMemAllocHost's). A collective then
 * publishes its buffer addresses, meets the others at a barrier, and moves the bytes
 * the call needs, each byte once, straight from the buffer that holds it to the
 * buffer that needs it, split evenly over all ranks so that every core works
 * (a broadcast's copies are shared by the root too); reductions run one vectorised
 * pass per block of 128 KiB over all inputs; one more barrier ends the call. There
 * are no messages, rings, handshakes, argument checks or error paths: what is left
 * is the copying and reducing that any implementation on these buffers must do,
 * with glibc's memcpy (streaming stores from 1 MiB) and gcc's vectorised loops, and
 * two barriers per call (three for all_reduce and for MPI_Reduce_scatter_block in
 * place). all_reduce is not pipelined: each rank reduces its part into its recvbuf,
 * and after a barrier copies the others' parts back out of memory, where ferroccl
 * sends results on while they are in cache; so there ferroccl can beat it. Results
 * follow MPI's semantics, so ompi_bench checks them as it checks Open MPI's.
 *
 * Small calls on private memory (ompi_bench's own timing reductions) go through a
 * slot per rank in the shared control block instead.
 */
#define _GNU_SOURCE
#include "mpi.h"

#include <errno.h>
#include <immintrin.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAXN 64
#define SLOT 4096
/* Address space per rank for its buffers (reserved, touched only as used). */
#define REGION ((size_t)16 << 30)
#define HUGE ((size_t)2 << 20)
/* Reductions and rotations work in blocks of this many bytes (stay in L2). */
#define BLOCK ((size_t)128 << 10)

typedef struct {
    _Alignas(64) volatile unsigned arrived;
    _Alignas(64) volatile unsigned sense;
    _Alignas(64) volatile int dead;
    struct {
        _Alignas(64) const char *s;
        char *r;
        int dest, source, inplace;
        int scounts[MAXN], sdispls[MAXN], rcounts[MAXN], rdispls[MAXN];
    } pub[MAXN];
    _Alignas(64) char slot[MAXN][SLOT];
} Ctl;

static Ctl *ctl;
static char *arena;
static int arena_fd;
static int me, np, oversubscribed;
static pid_t kids[MAXN];
static size_t bump, live;
static char *scratch; /* this rank's reduction scratch (MPI_Reduce_scatter_block in place) */
static size_t scratch_len;

static void fail(const char *msg) {
    fprintf(stderr, "ideal_bench: rank %d: %s\n", me, msg);
    if (ctl) ctl->dead = 1;
    _exit(3);
}

/* ---- barrier: spin, then give the core away (ranks may outnumber the cores) ---- */
static unsigned my_sense;
static void barrier(void) {
    my_sense ^= 1;
    if (__atomic_add_fetch(&ctl->arrived, 1, __ATOMIC_ACQ_REL) == (unsigned)np) {
        __atomic_store_n(&ctl->arrived, 0, __ATOMIC_RELAXED);
        __atomic_store_n(&ctl->sense, my_sense, __ATOMIC_RELEASE);
        return;
    }
    unsigned long spins = 0;
    while (__atomic_load_n(&ctl->sense, __ATOMIC_ACQUIRE) != my_sense) {
        if (++spins > (oversubscribed ? 64ul : 20000ul)) {
            sched_yield();
            if ((spins & 1023) == 0 && ctl->dead) fail("a peer rank died");
        } else {
            __builtin_ia32_pause();
        }
    }
}

static void sigchld(int sig) {
    (void)sig;
    int st;
    pid_t p;
    while ((p = waitpid(-1, &st, WNOHANG)) > 0)
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) ctl->dead = 1;
}

int MPI_Init(int *argc, char ***argv) {
    np = 1;
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        const char *a = (*argv)[i];
        if (!strcmp(a, "--np") && i + 1 < *argc) np = atoi((*argv)[++i]);
        else if (!strncmp(a, "--np=", 5)) np = atoi(a + 5);
        else (*argv)[out++] = (*argv)[i];
    }
    *argc = out;
    (*argv)[out] = NULL;
    if (np < 1 || np > MAXN) {
        fprintf(stderr, "ideal_bench: --np takes 1 to %d ranks\n", MAXN);
        exit(2);
    }
    ctl = mmap(NULL, sizeof(Ctl), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    /* A memfd (huge pages can be collapsed in it, unlike in shared anonymous memory),
     * mapped 2 MiB aligned. */
    size_t len = REGION * (size_t)np;
    arena_fd = memfd_create("ideal-arena", MFD_CLOEXEC);
    char *res = mmap(NULL, len + HUGE, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (ctl == MAP_FAILED || arena_fd < 0 || ftruncate(arena_fd, (off_t)len) || res == MAP_FAILED) {
        perror("ideal_bench: arena");
        exit(3);
    }
    arena = mmap((char *)(((uintptr_t)res + HUGE - 1) & ~(uintptr_t)(HUGE - 1)), len, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_FIXED, arena_fd, 0);
    if (arena == MAP_FAILED) {
        perror("ideal_bench: mmap");
        exit(3);
    }
    cpu_set_t allowed;
    int cpus[CPU_SETSIZE], ncpu = 0;
    if (sched_getaffinity(0, sizeof allowed, &allowed) == 0)
        for (int c = 0; c < CPU_SETSIZE; c++)
            if (CPU_ISSET(c, &allowed)) cpus[ncpu++] = c;
    oversubscribed = np > ncpu;
    signal(SIGCHLD, sigchld);
    fflush(NULL);
    for (int r = 1; r < np; r++) {
        pid_t p = fork();
        if (p < 0) fail("fork failed");
        if (p == 0) {
            me = r;
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            signal(SIGCHLD, SIG_DFL);
            break;
        }
        kids[r] = p;
    }
    /* As mpirun and ferroccl-bench: rank r on the r-th CPU when there are enough. */
    if (!oversubscribed) {
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpus[me], &one);
        sched_setaffinity(0, sizeof one, &one);
    }
    barrier();
    return 0;
}

int MPI_Finalize(void) {
    barrier();
    if (me != 0) _exit(0);
    signal(SIGCHLD, SIG_DFL);
    int bad = ctl->dead;
    for (int r = 1; r < np; r++) {
        int st;
        if (waitpid(kids[r], &st, 0) == kids[r] && (!WIFEXITED(st) || WEXITSTATUS(st) != 0)) bad = 1;
    }
    if (bad) {
        fprintf(stderr, "ideal_bench: a rank failed\n");
        exit(3);
    }
    return 0;
}

int MPI_Abort(MPI_Comm comm, int code) {
    (void)comm;
    ctl->dead = 1;
    _exit(code ? code : 1);
}

int MPI_Comm_rank(MPI_Comm comm, int *rank) { (void)comm; *rank = me; return 0; }
int MPI_Comm_size(MPI_Comm comm, int *size) { (void)comm; *size = np; return 0; }
int MPI_Get_version(int *v, int *s) { *v = 3; *s = 1; return 0; }
int MPI_Get_library_version(char *v, int *len) {
    *len = snprintf(v, MPI_MAX_LIBRARY_VERSION_STRING, "ideal: bare data movement over shared memory (tools/compare/ideal)");
    return 0;
}
double MPI_Wtime(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}
int MPI_Barrier(MPI_Comm comm) { (void)comm; barrier(); return 0; }

/* ---- buffers ---- */
static int in_arena(const void *p) {
    return (const char *)p >= arena && (const char *)p < arena + REGION * (size_t)np;
}

void *ideal_alloc(size_t bytes) {
    size_t align = bytes >= HUGE ? HUGE : 4096;
    size_t at = (bump + align - 1) & ~(align - 1);
    if (bytes == 0) bytes = 1;
    if (at + bytes > REGION / 2) fail("out of arena (16 GiB per rank)");
    char *p = arena + REGION * (size_t)me + at;
    bump = at + bytes;
    live++;
    if (bytes >= HUGE) {
        fallocate(arena_fd, 0, p - arena, (off_t)bytes);
        if (madvise(p, bytes, 25 /* MADV_COLLAPSE, Linux 6.1+; 4 KiB pages where it fails */) && getenv("IDEAL_DEBUG")) perror("madvise");
    }
    return p;
}

/* Buffers come and go together (ompi_bench frees both of a collective at once). */
void ideal_free(void *p) {
    if (p && --live == 0) bump = 0;
}

/* This rank's scratch of at least `bytes`, in the upper half of its region. */
static char *get_scratch(size_t bytes) {
    if (bytes > scratch_len) {
        if (bytes > REGION / 2) fail("scratch beyond the arena");
        scratch = arena + REGION * (size_t)me + REGION / 2;
        scratch_len = bytes;
        if (bytes >= HUGE) {
            fallocate(arena_fd, 0, scratch - arena, (off_t)bytes);
            madvise(scratch, bytes, 25);
        }
    }
    return scratch;
}

/* ---- kernels ---- */
/* Copies of at least this many bytes bypass the caches (streaming stores): the
 * destination is not read again soon, and the stores skip reading it first. */
#define STREAM_MIN ((size_t)1 << 20)

static void copy_nt(char *dst, const char *src, size_t len) {
#ifdef __AVX2__
    {
        size_t head = (size_t)(-(uintptr_t)dst & 31);
        memcpy(dst, src, head);
        dst += head, src += head, len -= head;
        size_t n = len & ~(size_t)127;
        for (size_t i = 0; i < n; i += 128) {
            __m256i a = _mm256_loadu_si256((const __m256i *)(src + i));
            __m256i b = _mm256_loadu_si256((const __m256i *)(src + i + 32));
            __m256i c = _mm256_loadu_si256((const __m256i *)(src + i + 64));
            __m256i d = _mm256_loadu_si256((const __m256i *)(src + i + 96));
            _mm256_stream_si256((__m256i *)(dst + i), a);
            _mm256_stream_si256((__m256i *)(dst + i + 32), b);
            _mm256_stream_si256((__m256i *)(dst + i + 64), c);
            _mm256_stream_si256((__m256i *)(dst + i + 96), d);
        }
        _mm_sfence();
        memcpy(dst + n, src + n, len - n);
        return;
    }
#endif
    memcpy(dst, src, len);
}

static void copy(char *dst, const char *src, size_t len) {
    if (len >= STREAM_MIN) copy_nt(dst, src, len);
    else memcpy(dst, src, len);
}

static size_t tsize(MPI_Datatype t) { return t == MPI_FLOAT || t == MPI_INT32_T ? 4 : 8; }

#define RED_LOOP(T)                                                                          \
    do {                                                                                     \
        T *d = (T *)dst;                                                                     \
        const T *x = (const T *)a, *y = (const T *)b;                                        \
        switch (op) {                                                                        \
        case MPI_SUM: for (size_t i = 0; i < n; i++) d[i] = x[i] + y[i]; break;              \
        case MPI_PROD: for (size_t i = 0; i < n; i++) d[i] = x[i] * y[i]; break;             \
        case MPI_MAX: for (size_t i = 0; i < n; i++) d[i] = x[i] > y[i] ? x[i] : y[i]; break; \
        default: for (size_t i = 0; i < n; i++) d[i] = x[i] < y[i] ? x[i] : y[i]; break;     \
        }                                                                                    \
    } while (0)

/* dst[i] = a[i] op b[i] for n elements; dst may be a or b. */
static void red2(void *dst, const void *a, const void *b, size_t n, MPI_Datatype t, MPI_Op op) {
    switch (t) {
    case MPI_FLOAT: RED_LOOP(float); break;
    case MPI_DOUBLE: RED_LOOP(double); break;
    case MPI_INT32_T: RED_LOOP(int32_t); break;
    case MPI_INT64_T: RED_LOOP(int64_t); break;
    default: RED_LOOP(unsigned long long); break;
    }
}

/* dst = src[0] op src[1] op ... over `bytes`, a block at a time so the partial result
 * stays in cache; dst may be one of the sources. */
static void reduce_all(char *dst, const char *const *srcs, int nsrc, size_t bytes, MPI_Datatype t, MPI_Op op) {
    size_t es = tsize(t);
    /* A source that is also the destination goes first, before dst is overwritten. */
    const char *src[MAXN];
    memcpy(src, srcs, sizeof(char *) * (size_t)nsrc);
    for (int q = 1; q < nsrc; q++)
        if (src[q] == dst) {
            src[q] = src[0];
            src[0] = dst;
        }
    /* Large results are reduced into a block in cache and streamed out from there. */
    static char blk[BLOCK];
    int stream = bytes >= STREAM_MIN;
    for (size_t off = 0; off < bytes; off += BLOCK) {
        size_t m = bytes - off < BLOCK ? bytes - off : BLOCK;
        if (nsrc == 1) {
            if (dst != src[0]) copy(dst + off, src[0] + off, m);
            continue;
        }
        char *acc = stream ? blk : dst + off;
        red2(acc, src[0] + off, src[1] + off, m / es, t, op);
        for (int q = 2; q < nsrc; q++) red2(acc, acc, src[q] + off, m / es, t, op);
        if (stream) copy_nt(dst + off, blk, m);
    }
}

/* ---- copies shared by all ranks ---- */
typedef struct { char *dst; const char *src; size_t len; int swap; } Job;

/* This rank's share of `jobs`: the bytes [total*me/np, total*(me+1)/np) of their
 * concatenation, cut at 4 KiB so two ranks never write one page. A swap job
 * exchanges its two ranges (in-place all_to_all). */
static void run_jobs(const Job *jobs, int njobs) {
    size_t total = 0;
    for (int j = 0; j < njobs; j++) total += jobs[j].len;
    size_t lo = (total * (size_t)me / (size_t)np) & ~(size_t)4095;
    size_t hi = me == np - 1 ? total : (total * (size_t)(me + 1) / (size_t)np) & ~(size_t)4095;
    size_t at = 0;
    static char tmp[64 << 10];
    for (int j = 0; j < njobs && at < hi; at += jobs[j].len, j++) {
        size_t a = lo > at ? lo - at : 0, b = hi - at < jobs[j].len ? hi - at : jobs[j].len;
        if (a >= b) continue;
        if (!jobs[j].swap) {
            copy(jobs[j].dst + a, jobs[j].src + a, b - a);
            continue;
        }
        char *x = jobs[j].dst, *y = (char *)jobs[j].src;
        for (size_t o = a; o < b; o += sizeof tmp) {
            size_t m = b - o < sizeof tmp ? b - o : sizeof tmp;
            memcpy(tmp, x + o, m);
            memcpy(x + o, y + o, m);
            memcpy(y + o, tmp, m);
        }
    }
}

static Job *jobs_buf(int n) {
    static Job *j;
    static int cap;
    if (n > cap) {
        free(j);
        j = malloc(sizeof(Job) * (size_t)n);
        if (!j) fail("out of memory");
        cap = n;
    }
    return j;
}

/* Publishes this rank's buffers and waits for everyone's. */
static void publish(const void *s, void *r) {
    ctl->pub[me].s = s;
    ctl->pub[me].r = r;
    ctl->pub[me].inplace = s == MPI_IN_PLACE;
    barrier();
}
#define S(q) (ctl->pub[q].s)
#define R(q) (ctl->pub[q].r)

/* Rank q's input: its recvbuf where it passed MPI_IN_PLACE, else its sendbuf. */
static const char *input(int q) { return ctl->pub[q].inplace ? R(q) : S(q); }

/* Runs this rank's share of `jobs` and ends the call. */
static int move(const Job *jobs, int njobs) {
    run_jobs(jobs, njobs);
    barrier();
    return 0;
}

static void part(size_t count, int i, size_t *start, size_t *len) {
    size_t base = count / (size_t)np, rem = count % (size_t)np;
    *start = (size_t)i * base + ((size_t)i < rem ? (size_t)i : rem);
    *len = base + ((size_t)i < rem);
}

/* ---- collectives ---- */
int MPI_Allreduce(const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
    (void)comm;
    size_t es = tsize(t), bytes = (size_t)count * es;
    const char *src[MAXN];
    if (!in_arena(r)) {
        /* Private memory (ompi_bench's timing): through the slots. */
        if (bytes > SLOT) fail("MPI_Allreduce on private memory larger than a slot");
        memcpy(ctl->slot[me], s == MPI_IN_PLACE ? r : s, bytes);
        barrier();
        for (int q = 0; q < np; q++) src[q] = ctl->slot[q];
        reduce_all(r, src, np, bytes, t, op);
        barrier();
        return 0;
    }
    publish(s, r);
    for (int q = 0; q < np; q++) src[q] = input(q);
    size_t st, len;
    part((size_t)count, me, &st, &len);
    const char *mine[MAXN];
    for (int q = 0; q < np; q++) mine[q] = src[q] + st * es;
    reduce_all(R(me) + st * es, mine, np, len * es, t, op);
    barrier();
    for (int q = 0; q < np; q++) {
        if (q == me) continue;
        part((size_t)count, q, &st, &len);
        copy(R(me) + st * es, R(q) + st * es, len * es);
    }
    barrier();
    return 0;
}

int MPI_Bcast(void *buf, int count, MPI_Datatype t, int root, MPI_Comm comm) {
    (void)comm;
    size_t bytes = (size_t)count * tsize(t);
    if (!in_arena(buf)) {
        if (bytes > SLOT) fail("MPI_Bcast on private memory larger than a slot");
        if (me == root) memcpy(ctl->slot[root], buf, bytes);
        barrier();
        if (me != root) memcpy(buf, ctl->slot[root], bytes);
        barrier();
        return 0;
    }
    publish(buf, buf);
    Job *j = jobs_buf(np);
    int k = 0;
    for (int q = 0; q < np; q++)
        if (q != root) j[k++] = (Job){R(q), R(root), bytes, 0};
    return move(j, k);
}

int MPI_Reduce(const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm) {
    (void)comm;
    size_t es = tsize(t), st, len;
    publish(s, r);
    const char *src[MAXN];
    for (int q = 0; q < np; q++) src[q] = input(q);
    part((size_t)count, me, &st, &len);
    for (int q = 0; q < np; q++) src[q] += st * es;
    reduce_all(R(root) + st * es, src, np, len * es, t, op);
    barrier();
    return 0;
}

int MPI_Allgather(const void *s, int scount, MPI_Datatype st, void *r, int rcount, MPI_Datatype rt, MPI_Comm comm) {
    (void)comm; (void)rcount; (void)rt;
    size_t bytes = (size_t)scount * tsize(st);
    publish(s, r);
    Job *j = jobs_buf(np * np);
    int k = 0;
    for (int p = 0; p < np; p++)
        for (int q = 0; q < np; q++) {
            if (ctl->pub[p].inplace && p == q) continue;
            const char *from = ctl->pub[q].inplace ? R(q) + (size_t)q * bytes : S(q);
            j[k++] = (Job){R(p) + (size_t)q * bytes, from, bytes, 0};
        }
    return move(j, k);
}

int MPI_Reduce_scatter_block(const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, MPI_Comm comm) {
    (void)comm;
    size_t es = tsize(t), bytes = (size_t)count * es;
    publish(s, r);
    const char *src[MAXN];
    /* In place the input is r and the result goes to its start, which rank 0 reads:
     * reduce into scratch, then copy once everyone has read. */
    for (int q = 0; q < np; q++) src[q] = input(q) + (size_t)me * bytes;
    if (!ctl->pub[me].inplace) {
        reduce_all(R(me), src, np, bytes, t, op);
    } else {
        char *tmp = get_scratch(bytes);
        reduce_all(tmp, src, np, bytes, t, op);
        barrier();
        copy(R(me), tmp, bytes);
    }
    barrier();
    return 0;
}

int MPI_Alltoall(const void *s, int scount, MPI_Datatype st, void *r, int rcount, MPI_Datatype rt, MPI_Comm comm) {
    (void)comm; (void)rcount; (void)rt;
    size_t bytes = (size_t)scount * tsize(st);
    publish(s, r);
    Job *j = jobs_buf(np * np);
    int k = 0;
    if (ctl->pub[me].inplace) {
        /* Block p of rank q and block q of rank p trade places. */
        for (int q = 0; q < np; q++)
            for (int p = q + 1; p < np; p++) j[k++] = (Job){R(q) + (size_t)p * bytes, R(p) + (size_t)q * bytes, bytes, 1};
    } else {
        for (int q = 0; q < np; q++)
            for (int p = 0; p < np; p++) j[k++] = (Job){R(p) + (size_t)q * bytes, S(q) + (size_t)p * bytes, bytes, 0};
    }
    return move(j, k);
}

int MPI_Alltoallv(const void *s, const int *scounts, const int *sdispls, MPI_Datatype st, void *r, const int *rcounts,
                  const int *rdispls, MPI_Datatype rt, MPI_Comm comm) {
    (void)comm; (void)rt;
    if (s == MPI_IN_PLACE) fail("MPI_Alltoallv in place is not implemented");
    size_t es = tsize(st);
    memcpy(ctl->pub[me].scounts, scounts, sizeof(int) * (size_t)np);
    memcpy(ctl->pub[me].sdispls, sdispls, sizeof(int) * (size_t)np);
    memcpy(ctl->pub[me].rcounts, rcounts, sizeof(int) * (size_t)np);
    memcpy(ctl->pub[me].rdispls, rdispls, sizeof(int) * (size_t)np);
    publish(s, r);
    Job *j = jobs_buf(np * np);
    int k = 0;
    for (int q = 0; q < np; q++)
        for (int p = 0; p < np; p++) {
            size_t len = (size_t)ctl->pub[q].scounts[p] * es;
            if (len != (size_t)ctl->pub[p].rcounts[q] * es) fail("MPI_Alltoallv: send and receive counts differ");
            j[k++] = (Job){R(p) + (size_t)ctl->pub[p].rdispls[q] * es, S(q) + (size_t)ctl->pub[q].sdispls[p] * es, len, 0};
        }
    return move(j, k);
}

int MPI_Gather(const void *s, int scount, MPI_Datatype st, void *r, int rcount, MPI_Datatype rt, int root,
               MPI_Comm comm) {
    (void)comm; (void)rcount; (void)rt;
    size_t bytes = (size_t)scount * tsize(st);
    publish(s, r);
    Job *j = jobs_buf(np);
    int k = 0;
    for (int q = 0; q < np; q++)
        if (!(q == root && ctl->pub[root].inplace)) j[k++] = (Job){R(root) + (size_t)q * bytes, S(q), bytes, 0};
    return move(j, k);
}

int MPI_Scatter(const void *s, int scount, MPI_Datatype st, void *r, int rcount, MPI_Datatype rt, int root,
                MPI_Comm comm) {
    (void)comm; (void)rcount; (void)rt;
    size_t bytes = (size_t)scount * tsize(st);
    /* In place the root passes MPI_IN_PLACE as its recvbuf and keeps its block. */
    ctl->pub[me].s = s;
    ctl->pub[me].r = r;
    ctl->pub[me].inplace = r == MPI_IN_PLACE;
    barrier();
    Job *j = jobs_buf(np);
    int k = 0;
    for (int q = 0; q < np; q++)
        if (!(q == root && ctl->pub[root].inplace)) j[k++] = (Job){R(q), S(root) + (size_t)q * bytes, bytes, 0};
    return move(j, k);
}

int MPI_Sendrecv(const void *s, int scount, MPI_Datatype st, int dest, int stag, void *r, int rcount,
                 MPI_Datatype rt, int source, int rtag, MPI_Comm comm, MPI_Status *status) {
    (void)stag; (void)rtag; (void)comm; (void)status; (void)rcount; (void)rt;
    size_t bytes = (size_t)scount * tsize(st);
    ctl->pub[me].dest = dest;
    ctl->pub[me].source = source;
    publish(s, r);
    Job *j = jobs_buf(np);
    for (int q = 0; q < np; q++) {
        int d = ctl->pub[q].dest;
        if (ctl->pub[d].source != q) fail("MPI_Sendrecv: the ranks' destinations and sources do not pair up");
        j[q] = (Job){R(d), S(q), bytes, 0};
    }
    return move(j, np);
}

/* Only the ring (every rank sends to rank+1): each block of 128 KiB is rotated by
 * one rank, through a buffer in cache, so each byte is read and written once. */
int MPI_Sendrecv_replace(void *buf, int count, MPI_Datatype t, int dest, int stag, int source, int rtag,
                         MPI_Comm comm, MPI_Status *status) {
    (void)stag; (void)rtag; (void)comm; (void)status;
    if (dest != (me + 1) % np || source != (me + np - 1) % np) fail("MPI_Sendrecv_replace: only the ring is implemented");
    size_t bytes = (size_t)count * tsize(t);
    publish(buf, buf);
    size_t nblocks = (bytes + BLOCK - 1) / BLOCK;
    static char tmp[BLOCK];
    for (size_t b = nblocks * (size_t)me / (size_t)np; b < nblocks * (size_t)(me + 1) / (size_t)np; b++) {
        size_t o = b * BLOCK, m = bytes - o < BLOCK ? bytes - o : BLOCK;
        memcpy(tmp, R(np - 1) + o, m);
        for (int q = np - 1; q > 0; q--) memcpy(R(q) + o, R(q - 1) + o, m);
        memcpy(R(0) + o, tmp, m);
    }
    barrier();
    return 0;
}
