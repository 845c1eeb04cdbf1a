/* Device-memory contract test: every collective and extension of the C API on CUDA
 * device memory, checked against the harness's references (never the library's).
 *
 * Devices.  Process mode (under ferroccl-run): before its communicator exists each
 * process makes the primary context of its device current, as a CUDA program does: device
 * 0, or devmap[rank % len] with FCCL_TEST_DEVMAP=0,1 in the environment.  Threads mode
 * (--threads N --devlist D0,...): fcclCommInitAll(comms, N, devlist); every rank thread
 * makes its communicator's device (fcclCommCuDevice) current before touching memory.
 * A device the machine lacks is mapped to device 0 (said once in the output).  The
 * driver is loaded with dlopen("libcuda.so.1"); without a driver or a device the test
 * exits 77 (skipped).
 *
 * Every case (one collective call, or one group) runs in modes of
 *   memory:  buffers from fcclMemAlloc, one allocation each (the buffer starts at the
 *            allocation), or sub-buffers at odd element offsets of one fcclMemAlloc arena
 *            (as a caching allocator hands them out);
 *   stream:  the NULL stream with synchronous cuMemcpyHtoD / cuMemcpyDtoH from pageable
 *            memory, or a non-blocking stream from cuStreamCreate: inputs uploaded with
 *            cuMemcpyHtoDAsync from pinned memory (fcclMemAllocHost), the call on that
 *            stream, results downloaded with cuMemcpyDtoHAsync, then one
 *            cuStreamSynchronize (the library must order its work after the uploads and
 *            before the downloads; the simulator delays every stream operation).
 * Each case of the matrix runs twice, in a rotating mode and in its complement (so in both
 * memory and both stream modes; FCCL_TEST_DEVICE_MODES=1 once, =4 in all four), the
 * rotation the same on every rank.  Every buffer the call may write is surrounded by guard
 * bytes (FCCL_SLACK after it, and in the arena FCCL_SLACK plus an odd number of elements
 * before it) set before the call and checked after; so are the gaps of v-collectives;
 * send buffers must come back unchanged.
 *
 * Matrix: types int8, int32, int64, float16, bfloat16, float32, float64, float8e4m3;
 * every op (sum, prod, max, min, avg; the harness's schemes, so results are exact) for the
 * reducing calls; counts 0, 1, 37, 1001; in place and out of place where docs/abi.md defines it;
 * every root for the rooted calls (at count 37; rotating at the others).  >= 16 MiB per
 * call: float32 sum, bfloat16 sum and int8 max for the reducing calls, float32 and int8 for
 * the others, at 1 and 2 ranks; a few at more ranks (FCCL_TEST_DEVICE_BIG=0 none, =all
 * everything at every size).  Then send/recv beyond the matrix (sizes that differ, reported
 * on both sides; sends and receives matched across calls; a ring shift in place; host to
 * device memory and back), fcclBarrier, groups mixing collectives, fcclCommSplit,
 * a non-blocking communicator (config.blocking = 0: calls polled with
 * fcclCommGetAsyncError before the results are downloaded), the local calls (1 rank), and
 * refused calls mixing host and device memory.  Last, every type and op and the wire
 * forms on random significands, against the same call on host memory (the host backend):
 * the bytes must be the same.
 *
 * Every rank makes the same sequence of collective calls whatever its checks found.  A
 * failure names the case (call, type, op, count, root, placement, memory and stream
 * mode, device, rank) and the element.  Each rank prints a one-line summary at the end.
 * FCCL_TEST_DEVICE_SKIP=name,... leaves parts out (for debugging; see part_on()). */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "cuda_driver.h"

static const char* g_prog = "test_device";

/* ================================================================== devices */

#define MAXDEV 64
static int g_ndev = 0;      /* devices the driver shows */
static int g_proc_dev = -1; /* process mode: the device this process selected */
static CUcontext g_ctx[MAXDEV];
static pthread_mutex_t g_ctx_mu = PTHREAD_MUTEX_INITIALIZER;
static char g_note[256]; /* the device mapping, said in the summary */

/* The primary context of dev, retained once per process; NULL on failure (reported). */
static CUcontext ctx_of(int dev) {
  CUcontext c = NULL;
  CUdevice d = 0;
  CUresult r;
  if (dev < 0 || dev >= MAXDEV) return NULL;
  pthread_mutex_lock(&g_ctx_mu);
  if (!g_ctx[dev]) {
    r = cu.DeviceGet(&d, dev);
    if (r == 0) r = cu.DevicePrimaryCtxRetain(&c, d);
    if (r == 0)
      g_ctx[dev] = c;
    else
      CHECK(0, "cuDeviceGet / cuDevicePrimaryCtxRetain(device %d) failed: %d (%s)", dev, r,
            fccl_cu_name(r));
  }
  c = g_ctx[dev];
  pthread_mutex_unlock(&g_ctx_mu);
  return c;
}

static int set_device(int dev) {
  CUcontext c = ctx_of(dev);
  CUresult r;
  if (!c) return 0;
  r = cu.CtxSetCurrent(c);
  CHECK(r == 0, "cuCtxSetCurrent(primary context of device %d) failed: %d (%s)", dev, r,
        fccl_cu_name(r));
  return r == 0;
}

/* Parses "0,1" into map (at most MAXDEV entries); returns the length, 0 if malformed. */
static int parse_map(const char* s, int* map) {
  int n = 0;
  while (*s && n < MAXDEV) {
    char* end;
    long v = strtol(s, &end, 10);
    if (end == s || v < 0 || v >= MAXDEV) return 0;
    map[n++] = (int)v;
    if (*end == ',') end++;
    else if (*end) return 0;
    s = end;
  }
  return n;
}

/* Harness pre-init hook: runs before any communicator exists. */
static int pre_init(int rank, int nranks, int* devlist) {
  CUresult r;
  const char* why;
  int i, remapped = 0;
  if ((why = fccl_cu_load(RTLD_LOCAL, FCCL_CU_BASE | FCCL_CU_STREAM))) {
    printf("%s: skipped: no CUDA driver/GPU (%s)\n", g_prog, why);
    return FCCL_SKIP;
  }
  r = cu.Init(0);
  if (r != 0) {
    printf("%s: skipped: no CUDA driver/GPU (cuInit failed: %d %s)\n", g_prog, r, fccl_cu_name(r));
    return FCCL_SKIP;
  }
  r = cu.DeviceGetCount(&g_ndev);
  if (r != 0 || g_ndev <= 0) {
    printf("%s: skipped: no CUDA driver/GPU (cuDeviceGetCount: %d, result %d)\n", g_prog, g_ndev,
           r);
    return FCCL_SKIP;
  }
  if (g_ndev > MAXDEV) g_ndev = MAXDEV;
  if (fccl_threads_mode()) {
    if (!devlist) {
      printf("%s: threads mode needs --devlist D0,D1,... (one CUDA device per rank)\n", g_prog);
      return 1;
    }
    for (i = 0; i < nranks; i++)
      if (devlist[i] >= g_ndev) {
        devlist[i] = 0;
        remapped = 1;
      }
    if (remapped) {
      snprintf(g_note, sizeof g_note,
               "only %d device(s) visible: --devlist entries >= %d run on device 0", g_ndev,
               g_ndev);
      printf("%s: note: %s\n", g_prog, g_note);
    }
    return 0;
  } else {
    int map[MAXDEV], len = 1;
    const char* e = getenv("FCCL_TEST_DEVMAP");
    map[0] = 0;
    if (e && *e) {
      len = parse_map(e, map);
      if (len == 0) {
        printf("%s: FCCL_TEST_DEVMAP=%s: expected device ids separated by commas\n", g_prog, e);
        return 1;
      }
    }
    g_proc_dev = map[(rank < 0 ? 0 : rank) % len];
    if (g_proc_dev >= g_ndev) {
      snprintf(g_note, sizeof g_note,
               "only %d device(s) visible: FCCL_TEST_DEVMAP device %d of rank %d runs on device 0",
               g_ndev, g_proc_dev, rank);
      printf("%s: note: %s\n", g_prog, g_note);
      g_proc_dev = 0;
    }
    (void)nranks;
    return set_device(g_proc_dev) ? 0 : 1;
  }
}

/* ================================================================== pools */

enum { POOL_PAGEABLE = 0, POOL_PINNED = 1, POOL_DEVICE = 2 };
#define POOL_CHUNKS 24

typedef struct {
  int kind;
  int n;
  unsigned char* base[POOL_CHUNKS];
  size_t cap[POOL_CHUNKS];
  int from_malloc[POOL_CHUNKS]; /* pinned pool: fcclMemAllocHost failed, malloc instead */
  size_t used;                  /* in chunk n - 1 */
  size_t min_cap;
} pool_t;

static void fatal(const char* what) {
  printf("%s: rank %d: cannot go on: %s\n", g_prog, fccl_cur_rank(), what);
  fflush(stdout);
  _exit(1); /* the other ranks would wait for this one's next collective */
}

static void chunk_alloc(pool_t* p, size_t cap) {
  void* m = NULL;
  int i = p->n;
  p->from_malloc[i] = 0;
  if (p->kind == POOL_PAGEABLE) {
    m = fccl_xmalloc(cap);
    p->from_malloc[i] = 1;
  } else if (p->kind == POOL_PINNED) {
    if (!CHECK_OK(fcclMemAllocHost(&m, cap)) || !m) {
      m = fccl_xmalloc(cap);
      p->from_malloc[i] = 1;
    }
  } else {
    char msg[128];
    if (!CHECK_OK(fcclMemAlloc(&m, cap)) || !m) {
      snprintf(msg, sizeof msg, "fcclMemAlloc(%zu) failed", cap);
      fatal(msg);
    }
  }
  p->base[i] = (unsigned char*)m;
  p->cap[i] = cap;
  p->n++;
  p->used = 0;
}

static void chunk_free(pool_t* p, int i) {
  if (p->from_malloc[i])
    free(p->base[i]);
  else
    CHECK_OK(fcclMemFree(p->base[i]));
  p->base[i] = NULL;
}

static void pool_init(pool_t* p, int kind, size_t min_cap) {
  memset(p, 0, sizeof *p);
  p->kind = kind;
  p->min_cap = min_cap;
}

static size_t round_up(size_t v, size_t a) { return (v + a - 1) / a * a; }

static unsigned char* pool_take(pool_t* p, size_t bytes, size_t align) {
  size_t off;
  if (p->n > 0) {
    off = round_up(p->used, align);
    if (off + bytes <= p->cap[p->n - 1]) {
      p->used = off + bytes;
      return p->base[p->n - 1] + off;
    }
  }
  if (p->n == POOL_CHUNKS) fatal("too many pool chunks");
  chunk_alloc(p, bytes + align > p->min_cap ? bytes + align : p->min_cap);
  p->used = bytes;
  return p->base[p->n - 1];
}

/* Forgets everything taken; chunks that grew the pool become one chunk of their sum. */
static void pool_reset(pool_t* p) {
  if (p->n > 1) {
    size_t total = 0;
    int i;
    for (i = 0; i < p->n; i++) {
      total += p->cap[i];
      chunk_free(p, i);
    }
    p->n = 0;
    chunk_alloc(p, total);
  }
  p->used = 0;
}

static void pool_destroy(pool_t* p) {
  int i;
  for (i = 0; i < p->n; i++) chunk_free(p, i);
  p->n = 0;
}

/* ================================================================== cases */

static int part_on(const char* name);

enum { MEM_ALLOC = 0, MEM_ARENA = 1 };
enum { ST_NULL = 0, ST_ASYNC = 1 };
#define MODE(mem, st) ((mem) | ((st) << 1))
#define ROTATE (-1)
#define MAXREG 48

typedef struct {
  const char* name;
  size_t bytes;           /* the buffer */
  size_t pre;             /* guard bytes before it (arena) */
  size_t img;             /* pre + bytes + FCCL_SLACK */
  unsigned char* dev;     /* the buffer on the device */
  unsigned char* up;      /* host image uploaded before the call */
  unsigned char* down;    /* host image downloaded after it */
  void* own;              /* MEM_ALLOC / other device: the fcclMemAlloc to free */
  CUcontext ctx;          /* context of the memory */
  unsigned char guard;
} region;

typedef struct {
  fcclComm_t comm;
  int rank, nranks, dev;
  CUcontext ctx;
  CUstream stream;
  pool_t host_pg, host_pin, arena;
  region reg[MAXREG];
  int nreg;
  int mem, st;
  unsigned long seq;
  int flip; /* pass of EACH_MODE */
  long cases, calls;
  size_t base;
  int big;
  char what[384];
  char w2[640];
  char desc[256];
} dctx;

static const char* mem_name(int m) {
  return m == MEM_ARENA ? "arena sub-buffers" : "fcclMemAlloc buffers";
}
static const char* st_name(int s) { return s == ST_ASYNC ? "async stream" : "NULL stream"; }
static const char* ipn(int ip) { return ip ? "in-place" : "out-of-place"; }
static fcclStream_t STREAM(const dctx* D) { return D->st == ST_ASYNC ? D->stream : NULL; }

static uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* FCCL_TEST_DEVICE_MODES=1|2|4: each case of the matrix runs in that many modes (default 2:
 * the rotated mode and its complement, so every case sees both memory and both stream
 * modes). */
static int g_passes = 2;
static const unsigned FLIPS[4] = {0u, 3u, 1u, 2u};
/* Runs the statement after it once per pass, every pass from the same rotation. */
#define EACH_MODE(D)                                                                   \
  for (unsigned long s0_ = (D)->seq, p_ = 0;                                           \
       p_ < (unsigned long)g_passes ? ((D)->seq = s0_, (D)->flip = (int)p_, 1)          \
                                    : ((D)->flip = 0, 0);                               \
       p_++)

static void case_begin(dctx* D, int mode, const char* fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;
static void case_begin(dctx* D, int mode, const char* fmt, ...) {
  va_list ap;
  if (mode == ROTATE) mode = (int)((mix64(D->seq) & 3u) ^ FLIPS[D->flip & 3]);
  D->seq++;
  D->mem = mode & 1;
  D->st = (mode >> 1) & 1;
  va_start(ap, fmt);
  vsnprintf(D->desc, sizeof D->desc, fmt, ap);
  va_end(ap);
  snprintf(D->what, sizeof D->what, "%s [%s, %s, device %d, rank %d of %d]", D->desc,
           mem_name(D->mem), st_name(D->st), D->dev, D->rank, D->nranks);
  fccl_phase("%s", D->what);
  D->cases++;
  D->base = (D->base + 977) % FCCL_PERIOD;
  D->nreg = 0;
}

/* "<case>: <detail>" in a per-rank buffer (valid until the next call). */
static const char* sub(dctx* D, const char* fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;
static const char* sub(dctx* D, const char* fmt, ...) {
  va_list ap;
  size_t n = (size_t)snprintf(D->w2, sizeof D->w2, "%s: ", D->what);
  if (n < sizeof D->w2) {
    va_start(ap, fmt);
    vsnprintf(D->w2 + n, sizeof D->w2 - n, fmt, ap);
    va_end(ap);
  }
  return D->w2;
}

static int cu_ok(dctx* D, CUresult r, const char* call, const char* file, int line) {
  if (r == 0) return 1;
  fccl_fail_at(file, line, "%s: %s failed: %d (%s)", D->what, call, r, fccl_cu_name(r));
  return 0;
}
#define CU(call) cu_ok(D, (call), #call, __FILE__, __LINE__)

/* A library call of the case: must return fcclSuccess. */
static int dev_ok(dctx* D, fcclResult_t res, const char* call, const char* file, int line) {
  char fn[64];
  size_t k = 0;
  D->calls++;
  if (res == fcclSuccess) return 1;
  while (call[k] && call[k] != '(' && k + 1 < sizeof fn) {
    fn[k] = call[k];
    k++;
  }
  fn[k] = 0;
  fccl_fail_at(file, line, "%s: %s returned %d (%s); fcclGetLastError: \"%s\"", D->what, fn,
               (int)res, fccl_res_name(res), fcclGetLastError(NULL));
  return 0;
}
#define DOK(call) dev_ok(D, (call), #call, __FILE__, __LINE__)

static pool_t* host_pool(dctx* D) { return D->st == ST_ASYNC ? &D->host_pin : &D->host_pg; }

/* A buffer of `bytes` on the device: its image (guards and data) all `guard` bytes. */
static region* reg_new(dctx* D, const char* name, size_t bytes, unsigned char guard, size_t esz) {
  region* r;
  if (D->nreg == MAXREG) fatal("too many regions in one case");
  r = &D->reg[D->nreg++];
  memset(r, 0, sizeof *r);
  r->name = name;
  r->bytes = bytes;
  r->guard = guard;
  r->ctx = D->ctx;
  if (D->mem == MEM_ALLOC) {
    void* p = NULL;
    if (!CHECK_OK(fcclMemAlloc(&p, bytes + FCCL_SLACK)) || !p) fatal("fcclMemAlloc failed");
    r->own = p;
    r->dev = (unsigned char*)p;
    r->pre = 0;
  } else {
    /* FCCL_SLACK guard bytes, then the buffer at an odd element offset (the arena is
     * 256-byte aligned, so the address parity in elements is the offset's) */
    size_t k = 1 + (size_t)(D->nreg % 3) * 2;
    size_t room = FCCL_SLACK + (k + 2) * esz + bytes + FCCL_SLACK;
    unsigned char* start = pool_take(&D->arena, room, 8);
    uintptr_t a = (uintptr_t)(start + FCCL_SLACK + k * esz);
    a = (a + esz - 1) / esz * esz;
    if ((a / esz) % 2 == 0) a += esz;
    r->dev = (unsigned char*)a;
    r->pre = (size_t)(r->dev - start);
  }
  r->img = r->pre + bytes + FCCL_SLACK;
  r->up = pool_take(host_pool(D), r->img, 16);
  r->down = pool_take(host_pool(D), r->img, 16);
  memset(r->up, guard, r->img);
  memset(r->down, 0xEE, r->img);
  return r;
}

/* A buffer on another device (its own fcclMemAlloc, made in that device's context). */
static region* reg_new_on(dctx* D, int dev, const char* name, size_t bytes, unsigned char guard) {
  region* r;
  void* p = NULL;
  CUcontext c = ctx_of(dev);
  if (!c) fatal("no context for a device");
  if (D->nreg == MAXREG) fatal("too many regions in one case");
  r = &D->reg[D->nreg++];
  memset(r, 0, sizeof *r);
  r->name = name;
  r->bytes = bytes;
  r->guard = guard;
  r->ctx = c;
  CU(cu.CtxSetCurrent(c));
  if (!CHECK_OK(fcclMemAlloc(&p, bytes + FCCL_SLACK)) || !p) fatal("fcclMemAlloc failed");
  CU(cu.CtxSetCurrent(D->ctx));
  r->own = p;
  r->dev = (unsigned char*)p;
  r->img = bytes + FCCL_SLACK;
  r->up = pool_take(host_pool(D), r->img, 16);
  r->down = pool_take(host_pool(D), r->img, 16);
  memset(r->up, guard, r->img);
  memset(r->down, 0xEE, r->img);
  return r;
}

static unsigned char* put(region* r) { return r->up + r->pre; }   /* the data to upload */
static unsigned char* got(region* r) { return r->down + r->pre; } /* the data downloaded */

static CUdeviceptr dptr(const region* r) { return (CUdeviceptr)(uintptr_t)(r->dev - r->pre); }

static void case_upload(dctx* D) {
  int i;
  for (i = 0; i < D->nreg; i++) {
    region* r = &D->reg[i];
    if (r->ctx != D->ctx) CU(cu.CtxSetCurrent(r->ctx));
    if (D->st == ST_ASYNC && r->ctx == D->ctx)
      CU(cu.MemcpyHtoDAsync(dptr(r), r->up, r->img, D->stream));
    else
      CU(cu.MemcpyHtoD(dptr(r), r->up, r->img));
    if (r->ctx != D->ctx) CU(cu.CtxSetCurrent(D->ctx));
  }
}

static void case_download(dctx* D) {
  int i;
  for (i = 0; i < D->nreg; i++) {
    region* r = &D->reg[i];
    if (r->ctx != D->ctx) CU(cu.CtxSetCurrent(r->ctx));
    if (D->st == ST_ASYNC && r->ctx == D->ctx)
      CU(cu.MemcpyDtoHAsync(r->down, dptr(r), r->img, D->stream));
    else
      CU(cu.MemcpyDtoH(r->down, dptr(r), r->img));
    if (r->ctx != D->ctx) CU(cu.CtxSetCurrent(D->ctx));
  }
  if (D->st == ST_ASYNC) CU(cu.StreamSynchronize(D->stream));
}

static void case_end(dctx* D) {
  int i;
  for (i = 0; i < D->nreg; i++)
    if (D->reg[i].own) CHECK_OK(fcclMemFree(D->reg[i].own));
  D->nreg = 0;
  pool_reset(&D->arena);
  pool_reset(&D->host_pg);
  pool_reset(&D->host_pin);
}

/* ---- checks on the downloaded images */

static void chk_guards(dctx* D, const region* r) {
  if (r->pre)
    BYTES_CHECK(r->down, r->pre, r->guard,
                sub(D, "guard bytes before %s (written below the buffer)", r->name));
  BYTES_CHECK(r->down + r->pre + r->bytes, FCCL_SLACK, r->guard,
              sub(D, "guard bytes after %s (%zu bytes; written past its end)", r->name, r->bytes));
}

/* The whole image (guards included) must be as uploaded. */
static void chk_unchanged(dctx* D, const region* r, const char* why) {
  size_t i, bad = 0, first = 0;
  if (memcmp(r->down, r->up, r->img) == 0) return;
  for (i = 0; i < r->img; i++)
    if (r->down[i] != r->up[i]) {
      if (!bad) first = i;
      bad++;
    }
  CHECK(0, "%s: %s %s: %zu byte(s) differ, the first at byte %lld of the buffer (%zu bytes): "
           "0x%02x, expected 0x%02x",
        D->what, r->name, why, bad, (long long)first - (long long)r->pre, r->bytes,
        r->down[first], r->up[first]);
}

/* Checks the blocks [displs[q], +counts[q]) were checked elsewhere: blanks them in the
 * downloaded image, then everything else (gaps, guards) must still be the guard byte. */
static void chk_gaps(dctx* D, region* r, const size_t* counts, const size_t* displs, int n,
                     size_t esz) {
  int q;
  for (q = 0; q < n; q++) memset(got(r) + displs[q] * esz, r->guard, counts[q] * esz);
  BYTES_CHECK(r->down, r->img, r->guard,
              sub(D, "%s outside the blocks (gaps between them, guards) was written", r->name));
}

/* ================================================================== the matrix */

#define NT 8
static const fcclDataType_t TYPES[NT] = {fcclInt8,     fcclInt32,   fcclInt64,
                                         fcclFloat16,  fcclBfloat16, fcclFloat32,
                                         fcclFloat64,  fcclFloat8e4m3};
#define NC 4
static const size_t COUNTS[NC] = {0, 1, 37, 1001};
#define BLK ((size_t)104729) /* pattern rotation between the blocks of one sender */

static const char* dtn(fcclDataType_t dt) { return fccl_dt_name(dt) + 4; } /* "Float32" */
static const char* opn(fcclRedOp_t op) { return fccl_op_name(op) + 4; }    /* "Sum" */

/* >= 16 MiB of elements of esz bytes, odd */
static size_t big_count(size_t esz) { return (((size_t)16 << 20) / esz + 5) | 1u; }

/* ================================================================== collectives */

static void t_allreduce(dctx* D, const fccl_pattern* pat, const fccl_ref* ref, size_t count,
                        int ip) {
  size_t esz = pat->esz, bytes = count * esz;
  region *s, *r;
  int ok;
  case_begin(D, ROTATE, "fcclAllReduce %s %s count=%zu %s", dtn(pat->dt), opn(ref->op), count,
             ipn(ip));
  s = reg_new(D, ip ? "buff" : "sendbuff", bytes, FCCL_SENT_GAP, esz);
  fccl_pattern_fill(pat, put(s), count, fccl_rank_off(D->base, D->rank));
  r = ip ? s : reg_new(D, "recvbuff", bytes, FCCL_SENT_RECV, esz);
  case_upload(D);
  ok = DOK(fcclAllReduce(s->dev, r->dev, count, pat->dt, ref->op, D->comm, STREAM(D)));
  case_download(D);
  if (ok) REF_CHECK(ref, got(r), count, D->base, D->what);
  chk_guards(D, r);
  if (!ip) chk_unchanged(D, s, "was modified");
  case_end(D);
}

static void t_broadcast(dctx* D, const fccl_pattern* pat, size_t count, int root, int ip) {
  size_t esz = pat->esz, bytes = count * esz, want;
  region *s, *r;
  int ok;
  case_begin(D, ROTATE, "fcclBroadcast %s count=%zu root=%d %s", dtn(pat->dt), count, root,
             ipn(ip));
  want = fccl_rank_off(D->base, root);
  if (ip) {
    s = r = reg_new(D, "buff", bytes, FCCL_SENT_RECV, esz);
    if (D->rank == root) fccl_pattern_fill(pat, put(s), count, want);
  } else {
    s = reg_new(D, "sendbuff", bytes, FCCL_SENT_GAP, esz); /* only the root's is read */
    fccl_pattern_fill(pat, put(s), count, fccl_rank_off(D->base, D->rank));
    r = reg_new(D, "recvbuff", bytes, FCCL_SENT_RECV, esz);
  }
  case_upload(D);
  ok = DOK(fcclBroadcast(s->dev, r->dev, count, pat->dt, root, D->comm, STREAM(D)));
  case_download(D);
  if (ok) PATTERN_CHECK(pat, got(r), count, want, D->what);
  chk_guards(D, r);
  if (!ip) chk_unchanged(D, s, "was modified");
  case_end(D);
}

static void t_reduce(dctx* D, const fccl_pattern* pat, const fccl_ref* ref, size_t count,
                     int root, int ip, int nonroot_null) {
  size_t esz = pat->esz, bytes = count * esz;
  region *s, *r = NULL;
  int ok, isroot = D->rank == root;
  case_begin(D, ROTATE, "fcclReduce %s %s count=%zu root=%d %s%s", dtn(pat->dt), opn(ref->op),
             count, root, ipn(ip), (!ip && nonroot_null) ? " (non-roots pass recvbuff NULL)" : "");
  s = reg_new(D, ip ? "buff" : "sendbuff", bytes, FCCL_SENT_GAP, esz);
  fccl_pattern_fill(pat, put(s), count, fccl_rank_off(D->base, D->rank));
  if (ip)
    r = s;
  else if (isroot || !nonroot_null)
    r = reg_new(D, "recvbuff", bytes, FCCL_SENT_RECV, esz);
  case_upload(D);
  ok = DOK(fcclReduce(s->dev, r ? r->dev : NULL, count, pat->dt, ref->op, root, D->comm,
                      STREAM(D)));
  case_download(D);
  if (isroot) {
    if (ok) REF_CHECK(ref, got(r), count, D->base, D->what);
    chk_guards(D, r);
  } else if (r && r != s) {
    chk_unchanged(D, r, "(a non-root's) was written");
  }
  if (!ip || !isroot) chk_unchanged(D, s, ip ? "(a non-root's in-place buffer) was modified"
                                             : "was modified");
  case_end(D);
}

static void t_allgather(dctx* D, const fccl_pattern* pat, size_t count, int ip) {
  size_t esz = pat->esz, bytes = count * esz, soff;
  region *s = NULL, *r;
  unsigned char* sp;
  int ok, q;
  case_begin(D, ROTATE, "fcclAllGather %s sendcount=%zu %s", dtn(pat->dt), count, ipn(ip));
  soff = fccl_rank_off(D->base, D->rank);
  r = reg_new(D, "recvbuff", bytes * (size_t)D->nranks, FCCL_SENT_RECV, esz);
  if (ip) {
    fccl_pattern_fill(pat, put(r) + (size_t)D->rank * bytes, count, soff);
    sp = r->dev + (size_t)D->rank * bytes;
  } else {
    s = reg_new(D, "sendbuff", bytes, FCCL_SENT_GAP, esz);
    fccl_pattern_fill(pat, put(s), count, soff);
    sp = s->dev;
  }
  case_upload(D);
  ok = DOK(fcclAllGather(sp, r->dev, count, pat->dt, D->comm, STREAM(D)));
  case_download(D);
  if (ok)
    for (q = 0; q < D->nranks; q++)
      PATTERN_CHECK(pat, got(r) + (size_t)q * bytes, count, fccl_rank_off(D->base, q),
                    sub(D, "block of rank %d", q));
  chk_guards(D, r);
  if (s) chk_unchanged(D, s, "was modified");
  case_end(D);
}

static void t_reducescatter(dctx* D, const fccl_pattern* pat, const fccl_ref* ref, size_t count,
                            int ip) {
  size_t esz = pat->esz, bytes = count * esz, n = (size_t)D->nranks;
  region *s, *r = NULL;
  int ok;
  case_begin(D, ROTATE, "fcclReduceScatter %s %s recvcount=%zu %s", dtn(pat->dt), opn(ref->op),
             count, ipn(ip));
  s = reg_new(D, ip ? "buff" : "sendbuff", bytes * n, FCCL_SENT_GAP, esz);
  fccl_pattern_fill(pat, put(s), count * n, fccl_rank_off(D->base, D->rank));
  if (!ip) r = reg_new(D, "recvbuff", bytes, FCCL_SENT_RECV, esz);
  case_upload(D);
  ok = DOK(fcclReduceScatter(s->dev, ip ? s->dev + (size_t)D->rank * bytes : r->dev, count,
                             pat->dt, ref->op, D->comm, STREAM(D)));
  case_download(D);
  if (ok)
    REF_CHECK(ref, ip ? got(s) + (size_t)D->rank * bytes : got(r), count,
              D->base + (size_t)D->rank * count, D->what);
  if (ip) {
    chk_guards(D, s);
  } else {
    chk_guards(D, r);
    chk_unchanged(D, s, "was modified");
  }
  case_end(D);
}

/* ip: in place (recvbuff = sendbuff), which swaps blocks pairwise on the GPU-to-GPU path. */
static void t_alltoall(dctx* D, const fccl_pattern* pat, size_t count, int ip) {
  size_t esz = pat->esz, bytes = count * esz, n = (size_t)D->nranks;
  region *s, *r;
  int ok, q;
  case_begin(D, ROTATE, "fcclAlltoAll %s count=%zu (per peer) %s", dtn(pat->dt), count, ipn(ip));
  s = reg_new(D, "sendbuff", bytes * n, FCCL_SENT_GAP, esz);
  fccl_pattern_fill(pat, put(s), count * n, fccl_rank_off(D->base, D->rank));
  r = ip ? s : reg_new(D, "recvbuff", bytes * n, FCCL_SENT_RECV, esz);
  case_upload(D);
  ok = DOK(fcclAlltoAll(s->dev, r->dev, count, pat->dt, D->comm, STREAM(D)));
  case_download(D);
  if (ok)
    for (q = 0; q < D->nranks; q++)
      PATTERN_CHECK(pat, got(r) + (size_t)q * bytes, count,
                    fccl_rank_off(D->base, q) + (size_t)D->rank * count,
                    sub(D, "block from rank %d", q));
  chk_guards(D, r);
  if (!ip) chk_unchanged(D, s, "was modified");
  case_end(D);
}

static void t_gather(dctx* D, const fccl_pattern* pat, size_t count, int root, int nonroot_null) {
  size_t esz = pat->esz, bytes = count * esz, n = (size_t)D->nranks;
  region *s, *r = NULL;
  int ok, q, isroot = D->rank == root;
  case_begin(D, ROTATE, "fcclGather %s count=%zu root=%d%s", dtn(pat->dt), count, root,
             nonroot_null ? " (non-roots pass recvbuff NULL)" : "");
  s = reg_new(D, "sendbuff", bytes, FCCL_SENT_GAP, esz);
  fccl_pattern_fill(pat, put(s), count, fccl_rank_off(D->base, D->rank));
  if (isroot || !nonroot_null) r = reg_new(D, "recvbuff", bytes * n, FCCL_SENT_RECV, esz);
  case_upload(D);
  ok = DOK(fcclGather(s->dev, r ? r->dev : NULL, count, pat->dt, root, D->comm, STREAM(D)));
  case_download(D);
  if (isroot) {
    if (ok)
      for (q = 0; q < D->nranks; q++)
        PATTERN_CHECK(pat, got(r) + (size_t)q * bytes, count, fccl_rank_off(D->base, q),
                      sub(D, "block of rank %d", q));
    chk_guards(D, r);
  } else if (r) {
    chk_unchanged(D, r, "(a non-root's) was written");
  }
  chk_unchanged(D, s, "was modified");
  case_end(D);
}

static void t_scatter(dctx* D, const fccl_pattern* pat, size_t count, int root, int nonroot_null) {
  size_t esz = pat->esz, bytes = count * esz, n = (size_t)D->nranks;
  region *s = NULL, *r;
  int ok, isroot = D->rank == root;
  case_begin(D, ROTATE, "fcclScatter %s count=%zu root=%d%s", dtn(pat->dt), count, root,
             nonroot_null ? " (non-roots pass sendbuff NULL)" : "");
  if (isroot || !nonroot_null) {
    s = reg_new(D, "sendbuff", bytes * n, FCCL_SENT_GAP, esz);
    fccl_pattern_fill(pat, put(s), count * n, fccl_rank_off(D->base, D->rank));
  }
  r = reg_new(D, "recvbuff", bytes, FCCL_SENT_RECV, esz);
  case_upload(D);
  ok = DOK(fcclScatter(s ? s->dev : NULL, r->dev, count, pat->dt, root, D->comm, STREAM(D)));
  case_download(D);
  if (ok)
    PATTERN_CHECK(pat, got(r), count, fccl_rank_off(D->base, root) + (size_t)D->rank * count,
                  D->what);
  chk_guards(D, r);
  if (s) chk_unchanged(D, s, "was modified");
  case_end(D);
}

/* Blocks laid out with a gap of 1 + (q + salt) % 3 elements before each, forwards or
 * backwards; returns the buffer length in elements (a trailing gap of 2 included). */
static size_t layout(int n, const size_t* counts, size_t* displs, int reverse, int salt) {
  size_t pos = 0;
  int j;
  for (j = 0; j < n; j++) {
    int q = reverse ? n - 1 - j : j;
    pos += 1 + (size_t)((q + salt) % 3);
    displs[q] = pos;
    pos += counts[q];
  }
  return pos + 2;
}

/* elements rank s sends to rank d: unit * {0..3}; every rank of 2 or more has traffic */
static size_t a2av_count(size_t unit, int s, int d, int salt) {
  return unit * (size_t)((s + 2 * d + salt) % 4);
}

static void t_alltoallv(dctx* D, const fccl_pattern* pat, size_t unit, int salt) {
  size_t esz = pat->esz, sc[64], sd[64], rc[64], rd[64], slen, rlen;
  int n = D->nranks, q, ok, reverse = (D->rank + salt) % 2;
  region *s, *r;
  case_begin(D, ROTATE, "fcclAlltoAllv %s unit=%zu salt=%d (counts unit*{0..3}, gapped displs)",
             dtn(pat->dt), unit, salt);
  for (q = 0; q < n; q++) {
    sc[q] = a2av_count(unit, D->rank, q, salt);
    rc[q] = a2av_count(unit, q, D->rank, salt);
  }
  slen = layout(n, sc, sd, reverse, salt);
  rlen = layout(n, rc, rd, !reverse, salt + 1);
  s = reg_new(D, "sendbuff", slen * esz, FCCL_SENT_GAP, esz);
  for (q = 0; q < n; q++)
    fccl_pattern_fill(pat, put(s) + sd[q] * esz, sc[q],
                      fccl_rank_off(D->base, D->rank) + (size_t)q * BLK);
  r = reg_new(D, "recvbuff", rlen * esz, FCCL_SENT_RECV, esz);
  case_upload(D);
  ok = DOK(fcclAlltoAllv(s->dev, sc, sd, r->dev, rc, rd, pat->dt, D->comm, STREAM(D)));
  case_download(D);
  if (ok)
    for (q = 0; q < n; q++)
      PATTERN_CHECK(pat, got(r) + rd[q] * esz, rc[q],
                    fccl_rank_off(D->base, q) + (size_t)D->rank * BLK,
                    sub(D, "block from rank %d (%zu elements at rdispls %zu)", q, rc[q], rd[q]));
  chk_gaps(D, r, rc, rd, n, esz);
  chk_unchanged(D, s, "was modified");
  case_end(D);
}

/* All_to_allv in place (recvbuff = sendbuff). sym: counts from s to d equal those from d
 * to s and one layout serves sends and receives (blocks swap pairwise); otherwise the
 * counts differ and the receive layout is another, over the same bytes, so every send
 * must be read before any block lands. */
static void t_alltoallv_ip(dctx* D, const fccl_pattern* pat, size_t unit, int salt, int sym) {
  size_t esz = pat->esz, sc[64], sd[64], rc[64], rd[64], slen, rlen;
  int n = D->nranks, q, ok, reverse = (D->rank + salt) % 2;
  region* s;
  case_begin(D, ROTATE, "fcclAlltoAllv %s unit=%zu salt=%d in-place (%s)", dtn(pat->dt), unit, salt,
             sym ? "symmetric counts, one layout" : "other counts and layouts over the same bytes");
  for (q = 0; q < n; q++) {
    sc[q] = sym ? unit * (size_t)((D->rank + q + salt) % 4) : a2av_count(unit, D->rank, q, salt);
    rc[q] = sym ? unit * (size_t)((q + D->rank + salt) % 4) : a2av_count(unit, q, D->rank, salt);
  }
  slen = layout(n, sc, sd, reverse, salt);
  if (sym) {
    memcpy(rd, sd, sizeof(size_t) * (size_t)n);
    rlen = slen;
  } else {
    rlen = layout(n, rc, rd, !reverse, salt + 1);
  }
  s = reg_new(D, "sendbuff", (slen > rlen ? slen : rlen) * esz, FCCL_SENT_GAP, esz);
  for (q = 0; q < n; q++)
    fccl_pattern_fill(pat, put(s) + sd[q] * esz, sc[q], fccl_rank_off(D->base, D->rank) + (size_t)q * BLK);
  case_upload(D);
  ok = DOK(fcclAlltoAllv(s->dev, sc, sd, s->dev, rc, rd, pat->dt, D->comm, STREAM(D)));
  case_download(D);
  if (ok)
    for (q = 0; q < n; q++)
      PATTERN_CHECK(pat, got(s) + rd[q] * esz, rc[q], fccl_rank_off(D->base, q) + (size_t)D->rank * BLK,
                    sub(D, "block from rank %d (%zu elements at rdispls %zu)", q, rc[q], rd[q]));
  if (sym) chk_gaps(D, s, rc, rd, n, esz);
  case_end(D);
}

/* kind 0: ring shift (send to rank+1, receive from rank-1); 1: to and from itself;
 * 2: every pair in one group (counts count + (s + 2d) % 3 from s to d). */
static void t_sendrecv(dctx* D, const fccl_pattern* pat, size_t count, int kind) {
  static const char* const kinds[3] = {"ring shift", "self send/recv", "all pairs in one group"};
  static const char* const sn[8] = {"sendbuff to 0", "sendbuff to 1", "sendbuff to 2",
                                    "sendbuff to 3", "sendbuff to 4+", "sendbuff to 4+",
                                    "sendbuff to 4+", "sendbuff to 4+"};
  static const char* const rn[8] = {"recvbuff from 0", "recvbuff from 1", "recvbuff from 2",
                                    "recvbuff from 3", "recvbuff from 4+", "recvbuff from 4+",
                                    "recvbuff from 4+", "recvbuff from 4+"};
  size_t esz = pat->esz, cnt_to[64], cnt_from[64];
  region *s[64], *r[64];
  int n = D->nranks, q, j, ok, to[64], from[64], np = 0;
  case_begin(D, ROTATE, "fcclSend/fcclRecv %s count=%zu %s", dtn(pat->dt), count, kinds[kind]);
  if (kind == 0) {
    to[0] = (D->rank + 1) % n;
    from[0] = (D->rank + n - 1) % n;
    cnt_to[0] = cnt_from[0] = count;
    np = 1;
  } else if (kind == 1) {
    to[0] = from[0] = D->rank;
    cnt_to[0] = cnt_from[0] = count;
    np = 1;
  } else {
    for (j = 0; j < n; j++) {
      to[j] = (D->rank + j) % n;
      from[j] = (D->rank + n - j) % n;
      cnt_to[j] = count + (size_t)((D->rank + 2 * to[j]) % 3);
      cnt_from[j] = count + (size_t)((from[j] + 2 * D->rank) % 3);
    }
    np = n;
  }
  for (j = 0; j < np; j++) {
    s[j] = reg_new(D, sn[to[j] < 8 ? to[j] : 7], cnt_to[j] * esz, FCCL_SENT_GAP, esz);
    fccl_pattern_fill(pat, put(s[j]), cnt_to[j],
                      fccl_rank_off(D->base, D->rank) + (size_t)to[j] * BLK);
    r[j] = reg_new(D, rn[from[j] < 8 ? from[j] : 7], cnt_from[j] * esz, FCCL_SENT_RECV, esz);
  }
  case_upload(D);
  ok = DOK(fcclGroupStart());
  for (j = 0; j < np; j++)
    ok &= DOK(fcclSend(s[j]->dev, cnt_to[j], pat->dt, to[j], D->comm, STREAM(D)));
  for (j = 0; j < np; j++)
    ok &= DOK(fcclRecv(r[j]->dev, cnt_from[j], pat->dt, from[j], D->comm, STREAM(D)));
  ok &= DOK(fcclGroupEnd());
  case_download(D);
  for (j = 0; j < np; j++) {
    q = from[j];
    if (ok)
      PATTERN_CHECK(pat, got(r[j]), cnt_from[j],
                    fccl_rank_off(D->base, q) + (size_t)D->rank * BLK,
                    sub(D, "received from rank %d (%zu elements)", q, cnt_from[j]));
    chk_guards(D, r[j]);
    chk_unchanged(D, s[j], "was modified");
  }
  case_end(D);
}

/* Sizes that differ: rank 0 sends count+1 elements to rank 1 (to itself with one rank),
 * which receives count; every other send of the ring shift matches. Both ends of that pair
 * get fcclCollectiveMismatch naming both sizes, as on the host, nothing lands in the
 * receive buffer; the other transfers deliver; the communicator keeps working. */
static void t_sendrecv_mismatch(dctx* D, const fccl_pattern* pat, size_t count) {
  size_t esz = pat->esz, nsend, want_s, want_r;
  int n = D->nranks, me = D->rank, to = (me + 1) % n, from = (me + n - 1) % n, ok;
  int bad_send = me == 0, bad_recv = from == 0;
  region *s, *r;
  fcclResult_t res, want;
  const char* le;
  char need[96];
  case_begin(D, ROTATE, "fcclSend/fcclRecv %s count=%zu ring shift, rank 0 sending one more "
             "element than rank %d receives", dtn(pat->dt), count, n > 1 ? 1 : 0);
  nsend = count + (size_t)bad_send;
  s = reg_new(D, "sendbuff", nsend * esz, FCCL_SENT_GAP, esz);
  fccl_pattern_fill(pat, put(s), nsend, fccl_rank_off(D->base, me));
  r = reg_new(D, "recvbuff", count * esz, FCCL_SENT_RECV, esz);
  case_upload(D);
  ok = DOK(fcclGroupStart());
  ok &= DOK(fcclSend(s->dev, nsend, pat->dt, to, D->comm, STREAM(D)));
  ok &= DOK(fcclRecv(r->dev, count, pat->dt, from, D->comm, STREAM(D)));
  res = fcclGroupEnd();
  D->calls++;
  le = fcclGetLastError(D->comm);
  want = bad_send || bad_recv ? fcclCollectiveMismatch : fcclSuccess;
  CHECK(res == want, "%s: fcclGroupEnd returned %d (%s), expected %s; fcclGetLastError: \"%s\"",
        D->what, (int)res, fccl_res_name(res), fccl_res_name(want), le ? le : "(NULL)");
  if (res != fcclSuccess && want != fcclSuccess) {
    /* the pair's sizes, in bytes, on both sides */
    want_s = (count + 1) * esz;
    want_r = count * esz;
    snprintf(need, sizeof need, "sends %zu bytes", want_s);
    CHECK(le && strstr(le, need), "%s: fcclGetLastError = \"%s\" lacks \"%s\"", D->what,
          le ? le : "(NULL)", need);
    snprintf(need, sizeof need, "receives %zu bytes", want_r);
    CHECK(le && strstr(le, need), "%s: fcclGetLastError = \"%s\" lacks \"%s\"", D->what,
          le ? le : "(NULL)", need);
  }
  case_download(D);
  if (bad_recv)
    chk_unchanged(D, r, "was written by a receive whose size differed from the send's");
  else if (ok)
    PATTERN_CHECK(pat, got(r), count, fccl_rank_off(D->base, from),
                  sub(D, "received from rank %d", from));
  chk_guards(D, r);
  chk_unchanged(D, s, "was modified");
  case_end(D);
}

/* Sends and receives matched across calls: in pairs of ranks (2k, 2k+1), one side posts
 * two messages as two separate calls and the other both in one group (`flip` swaps the
 * sides); the k-th send pairs with the k-th receive, as on the host. A rank without a
 * partner takes no part. */
static void t_sendrecv_across_calls(dctx* D, const fccl_pattern* pat, size_t count, int flip) {
  size_t esz = pat->esz, cnt[2] = {count, count + 3};
  int me = D->rank, peer = me ^ 1, sender = (me % 2 == 0) != (flip != 0), grouped = me % 2 == 1, j,
      ok = 1;
  region *b[2];
  case_begin(D, ROTATE, "fcclSend/fcclRecv %s counts %zu and %zu across calls (%s)", dtn(pat->dt),
             cnt[0], cnt[1], flip ? "odd ranks send" : "even ranks send");
  if (peer >= D->nranks) {
    case_end(D);
    return;
  }
  for (j = 0; j < 2; j++) {
    b[j] = reg_new(D, sender ? (j ? "second sendbuff" : "first sendbuff")
                             : (j ? "second recvbuff" : "first recvbuff"),
                   cnt[j] * esz, sender ? FCCL_SENT_GAP : FCCL_SENT_RECV, esz);
    if (sender) fccl_pattern_fill(pat, put(b[j]), cnt[j], fccl_rank_off(D->base, me) + (size_t)j * BLK);
  }
  case_upload(D);
  if (grouped) ok &= DOK(fcclGroupStart());
  for (j = 0; j < 2; j++) {
    if (sender)
      ok &= DOK(fcclSend(b[j]->dev, cnt[j], pat->dt, peer, D->comm, STREAM(D)));
    else
      ok &= DOK(fcclRecv(b[j]->dev, cnt[j], pat->dt, peer, D->comm, STREAM(D)));
  }
  if (grouped) ok &= DOK(fcclGroupEnd());
  case_download(D);
  for (j = 0; j < 2; j++) {
    if (sender) {
      chk_unchanged(D, b[j], "was modified");
    } else {
      if (ok)
        PATTERN_CHECK(pat, got(b[j]), cnt[j], fccl_rank_off(D->base, peer) + (size_t)j * BLK,
                      sub(D, "message %d from rank %d", j, peer));
      chk_guards(D, b[j]);
    }
  }
  case_end(D);
}

/* A ring shift in place: every rank sends its buffer to rank+1 and receives rank-1's
 * into the same buffer, in one group: what it sends is its buffer before the call. */
static void t_sendrecv_in_place(dctx* D, const fccl_pattern* pat, size_t count) {
  size_t esz = pat->esz;
  int n = D->nranks, me = D->rank, to = (me + 1) % n, from = (me + n - 1) % n, ok;
  region* b;
  case_begin(D, ROTATE, "fcclSend/fcclRecv %s count=%zu ring shift in place", dtn(pat->dt), count);
  b = reg_new(D, "buff", count * esz, FCCL_SENT_RECV, esz);
  fccl_pattern_fill(pat, put(b), count, fccl_rank_off(D->base, me));
  case_upload(D);
  ok = DOK(fcclGroupStart());
  ok &= DOK(fcclSend(b->dev, count, pat->dt, to, D->comm, STREAM(D)));
  ok &= DOK(fcclRecv(b->dev, count, pat->dt, from, D->comm, STREAM(D)));
  ok &= DOK(fcclGroupEnd());
  case_download(D);
  if (ok)
    PATTERN_CHECK(pat, got(b), count, fccl_rank_off(D->base, from),
                  sub(D, "received from rank %d", from));
  chk_guards(D, b);
  case_end(D);
}

/* A ring shift between host and device memory: even ranks send from host memory (malloc)
 * and receive into device memory, odd ranks the other way round, so every pair has a host
 * side (a single rank sends host to device to itself). */
static void t_sendrecv_host_device(dctx* D, const fccl_pattern* pat, size_t count) {
  size_t esz = pat->esz;
  int n = D->nranks, me = D->rank, to = (me + 1) % n, from = (me + n - 1) % n, ok;
  int host_send = me % 2 == 0;
  unsigned char *hs = (unsigned char*)fccl_xmalloc(count * esz + 1),
                *hr = (unsigned char*)fccl_xmalloc(count * esz + FCCL_SLACK);
  region *s = NULL, *r = NULL;
  case_begin(D, ROTATE, "fcclSend/fcclRecv %s count=%zu ring shift, %s", dtn(pat->dt), count,
             host_send ? "sending host memory, receiving into device memory"
                       : "sending device memory, receiving into host memory");
  if (host_send) {
    fccl_pattern_fill(pat, hs, count, fccl_rank_off(D->base, me));
    r = reg_new(D, "device recvbuff", count * esz, FCCL_SENT_RECV, esz);
  } else {
    s = reg_new(D, "device sendbuff", count * esz, FCCL_SENT_GAP, esz);
    fccl_pattern_fill(pat, put(s), count, fccl_rank_off(D->base, me));
    memset(hr, FCCL_SENT_RECV, count * esz + FCCL_SLACK);
  }
  case_upload(D);
  ok = DOK(fcclGroupStart());
  ok &= DOK(fcclSend(host_send ? (void*)hs : (void*)s->dev, count, pat->dt, to, D->comm, STREAM(D)));
  ok &= DOK(fcclRecv(host_send ? (void*)r->dev : (void*)hr, count, pat->dt, from, D->comm,
                     STREAM(D)));
  ok &= DOK(fcclGroupEnd());
  case_download(D);
  if (ok)
    PATTERN_CHECK(pat, host_send ? got(r) : hr, count, fccl_rank_off(D->base, from),
                  sub(D, "received from rank %d into %s memory", from, host_send ? "device" : "host"));
  if (r) chk_guards(D, r);
  if (s) chk_unchanged(D, s, "was modified");
  if (!host_send)
    BYTES_CHECK(hr + count * esz, FCCL_SLACK, FCCL_SENT_RECV,
                sub(D, "host bytes after recvbuff (written past its end)"));
  case_end(D);
  free(hs);
  free(hr);
}

/* ---- extensions */

static void t_allgatherv(dctx* D, const fccl_pattern* pat, size_t unit, int salt, int ip) {
  size_t esz = pat->esz, rc[64], rd[64], rlen, soff;
  int n = D->nranks, q, ok;
  region *s = NULL, *r;
  unsigned char* sp;
  case_begin(D, ROTATE, "fcclAllGatherV %s unit=%zu salt=%d %s (counts unit*{0..2}, gapped "
                        "rdispls)", dtn(pat->dt), unit, salt, ipn(ip));
  soff = fccl_rank_off(D->base, D->rank);
  for (q = 0; q < n; q++) rc[q] = unit * (size_t)((q + salt) % 3);
  rlen = layout(n, rc, rd, (D->rank + salt) % 2, salt);
  r = reg_new(D, "recvbuff", rlen * esz, FCCL_SENT_RECV, esz);
  if (ip) {
    fccl_pattern_fill(pat, put(r) + rd[D->rank] * esz, rc[D->rank], soff);
    sp = r->dev + rd[D->rank] * esz;
  } else {
    s = reg_new(D, "sendbuff", rc[D->rank] * esz, FCCL_SENT_GAP, esz);
    fccl_pattern_fill(pat, put(s), rc[D->rank], soff);
    sp = s->dev;
  }
  case_upload(D);
  ok = DOK(fcclAllGatherV(sp, rc[D->rank], r->dev, rc, rd, pat->dt, D->comm, STREAM(D)));
  case_download(D);
  if (ok)
    for (q = 0; q < n; q++)
      PATTERN_CHECK(pat, got(r) + rd[q] * esz, rc[q], fccl_rank_off(D->base, q),
                    sub(D, "block of rank %d (%zu elements at rdispls %zu)", q, rc[q], rd[q]));
  chk_gaps(D, r, rc, rd, n, esz);
  if (s) chk_unchanged(D, s, "was modified");
  case_end(D);
}

#define BSALT ((size_t)1009) /* pattern offset between the blocks of ReduceScatterV */

static void t_reducescatterv(dctx* D, const fccl_pattern* pat, const fccl_ref* ref, size_t unit,
                             int salt, int ip) {
  size_t esz = pat->esz, rc[64], sd[64], slen;
  int n = D->nranks, q, ok;
  region *s, *r = NULL;
  unsigned char* rp;
  case_begin(D, ROTATE, "fcclReduceScatterV %s %s unit=%zu salt=%d %s (counts unit*{0..2}, "
                        "gapped sdispls)", dtn(pat->dt), opn(ref->op), unit, salt, ipn(ip));
  for (q = 0; q < n; q++) rc[q] = unit * (size_t)((q + salt + 1) % 3);
  slen = layout(n, rc, sd, (D->rank + salt) % 2, salt);
  s = reg_new(D, ip ? "buff" : "sendbuff", slen * esz, FCCL_SENT_GAP, esz);
  for (q = 0; q < n; q++)
    fccl_pattern_fill(pat, put(s) + sd[q] * esz, rc[q],
                      fccl_rank_off(D->base + (size_t)q * BSALT, D->rank));
  if (ip) {
    rp = s->dev + sd[D->rank] * esz;
  } else {
    r = reg_new(D, "recvbuff", rc[D->rank] * esz, FCCL_SENT_RECV, esz);
    rp = r->dev;
  }
  case_upload(D);
  ok = DOK(fcclReduceScatterV(s->dev, rc, sd, rp, pat->dt, ref->op, D->comm, STREAM(D)));
  case_download(D);
  if (ok)
    REF_CHECK(ref, ip ? got(s) + sd[D->rank] * esz : got(r), rc[D->rank],
              D->base + (size_t)D->rank * BSALT, D->what);
  if (ip) {
    /* everything but this rank's block must be as it was */
    memcpy(got(s) + sd[D->rank] * esz, put(s) + sd[D->rank] * esz, rc[D->rank] * esz);
    chk_unchanged(D, s, "was modified outside this rank's block");
  } else {
    chk_guards(D, r);
    chk_unchanged(D, s, "was modified");
  }
  case_end(D);
}

static void t_allgather_axis(dctx* D, const fccl_pattern* pat, int ndims, const size_t* shape,
                             int axis) {
  size_t esz = pat->esz, nel = fccl_shape_prod(shape, 0, ndims), outer = fccl_shape_prod(shape, 0, axis);
  size_t inner = fccl_shape_prod(shape, axis + 1, ndims), S = shape[axis], n = (size_t)D->nranks, o;
  region *s, *r;
  char sh[64];
  int ok, q, bad = 0;
  fccl_shape_str(sh, sizeof sh, ndims, shape);
  case_begin(D, ROTATE, "fcclAllGatherAxis %s shape=%s axis=%d", dtn(pat->dt), sh, axis);
  s = reg_new(D, "sendbuff", nel * esz, FCCL_SENT_GAP, esz);
  fccl_pattern_fill(pat, put(s), nel, fccl_rank_off(D->base, D->rank));
  r = reg_new(D, "recvbuff", nel * n * esz, FCCL_SENT_RECV, esz);
  case_upload(D);
  ok = DOK(fcclAllGatherAxis(s->dev, r->dev, ndims, shape, axis, pat->dt, D->comm, STREAM(D)));
  case_download(D);
  /* out[o][q*S + a][i] = input_q[o][a][i]: for each o and q, S*inner contiguous elements */
  if (ok)
    for (o = 0; o < outer && bad < 3; o++)
      for (q = 0; q < D->nranks && bad < 3; q++)
        if (PATTERN_CHECK(pat, got(r) + (o * S * n + (size_t)q * S) * inner * esz, S * inner,
                          fccl_rank_off(D->base, q) + o * S * inner,
                          sub(D, "outer index %zu, block of rank %d along axis %d (flat element "
                                 "%zu)", o, q, axis, (o * S * n + (size_t)q * S) * inner)))
          bad++;
  chk_guards(D, r);
  chk_unchanged(D, s, "was modified");
  case_end(D);
}

static void t_reducescatter_axis(dctx* D, const fccl_pattern* pat, const fccl_ref* ref, int ndims,
                                 const size_t* shape, int axis) {
  size_t esz = pat->esz, nel = fccl_shape_prod(shape, 0, ndims), outer = fccl_shape_prod(shape, 0, axis);
  size_t inner = fccl_shape_prod(shape, axis + 1, ndims), S = shape[axis], blk = S / (size_t)D->nranks, o;
  region *s, *r;
  char sh[64];
  int ok, bad = 0;
  if (!part_on("fcclReduceScatterAxis")) return; /* FCCL_TEST_DEVICE_SKIP */
  fccl_shape_str(sh, sizeof sh, ndims, shape);
  case_begin(D, ROTATE, "fcclReduceScatterAxis %s %s shape=%s axis=%d", dtn(pat->dt),
             opn(ref->op), sh, axis);
  s = reg_new(D, "sendbuff", nel * esz, FCCL_SENT_GAP, esz);
  fccl_pattern_fill(pat, put(s), nel, fccl_rank_off(D->base, D->rank));
  r = reg_new(D, "recvbuff", nel / (size_t)D->nranks * esz, FCCL_SENT_RECV, esz);
  case_upload(D);
  ok = DOK(fcclReduceScatterAxis(s->dev, r->dev, ndims, shape, axis, pat->dt, ref->op, D->comm,
                                 STREAM(D)));
  case_download(D);
  /* out[o][b][i] = reduction of input[o][rank*blk + b][i]: blk*inner contiguous per o */
  if (ok)
    for (o = 0; o < outer && bad < 3; o++)
      if (REF_CHECK(ref, got(r) + o * blk * inner * esz, blk * inner,
                    D->base + (o * S + (size_t)D->rank * blk) * inner,
                    sub(D, "outer index %zu (output flat element %zu)", o, o * blk * inner)))
        bad++;
  chk_guards(D, r);
  chk_unchanged(D, s, "was modified");
  case_end(D);
}

/* ---- coalesced */

#define NCB 8
static const char* const CB_SEND[NCB] = {"sendbuffs[0]", "sendbuffs[1]", "sendbuffs[2]",
                                         "sendbuffs[3]", "sendbuffs[4]", "sendbuffs[5]",
                                         "sendbuffs[6]", "sendbuffs[7]"};
static const char* const CB_RECV[NCB] = {"recvbuffs[0]", "recvbuffs[1]", "recvbuffs[2]",
                                         "recvbuffs[3]", "recvbuffs[4]", "recvbuffs[5]",
                                         "recvbuffs[6]", "recvbuffs[7]"};
static const char* const CB_BUF[NCB] = {"buffs[0]", "buffs[1]", "buffs[2]", "buffs[3]",
                                        "buffs[4]", "buffs[5]", "buffs[6]", "buffs[7]"};

/* Buffer counts: mixed, zeros included (buffer 5 empty and NULL); with bucketBytes 256 the
 * 1001-element buffer (and, for wide types, the 37- and 60-element ones) exceed a bucket. */
static void cb_counts(size_t* counts, size_t big) {
  static const size_t c[NCB] = {37, 0, 1, 1001, 5, 0, 60, 3};
  memcpy(counts, c, sizeof c);
  if (big) counts[3] = big;
}
#define CB_OFF(i) ((size_t)(i) * (size_t)7919 * 3u) /* pattern offset of buffer i */

typedef struct {
  region *s[NCB], *r[NCB];
  const void* sp[NCB];
  void* rp[NCB];
  size_t counts[NCB];
} cbset;

/* Allreduce buffers: filled, recv regions for out-of-place. */
static void cb_setup_allreduce(dctx* D, cbset* c, const fccl_pattern* pat, size_t big, int ip) {
  int i;
  cb_counts(c->counts, big);
  for (i = 0; i < NCB; i++) {
    if (i == 5) { /* empty: NULL */
      c->s[i] = c->r[i] = NULL;
      c->sp[i] = NULL;
      c->rp[i] = NULL;
      continue;
    }
    c->s[i] = reg_new(D, ip ? CB_BUF[i] : CB_SEND[i], c->counts[i] * pat->esz, FCCL_SENT_GAP,
                      pat->esz);
    fccl_pattern_fill(pat, put(c->s[i]), c->counts[i],
                      fccl_rank_off(D->base + CB_OFF(i), D->rank));
    c->r[i] = ip ? c->s[i]
                 : reg_new(D, CB_RECV[i], c->counts[i] * pat->esz, FCCL_SENT_RECV, pat->esz);
    c->sp[i] = c->s[i]->dev;
    c->rp[i] = c->r[i]->dev;
  }
}

static void cb_check_allreduce(dctx* D, cbset* c, const fccl_ref* ref, int ok, int ip) {
  int i;
  for (i = 0; i < NCB; i++) {
    if (!c->s[i]) continue;
    if (ok)
      REF_CHECK(ref, got(c->r[i]), c->counts[i], D->base + CB_OFF(i),
                sub(D, "buffer %d (%zu elements)", i, c->counts[i]));
    chk_guards(D, c->r[i]);
    if (!ip) chk_unchanged(D, c->s[i], "was modified");
  }
}

/* Broadcast buffers: the root's hold the data, the others the sentinel. */
static void cb_setup_broadcast(dctx* D, cbset* c, const fccl_pattern* pat, size_t big, int root) {
  int i;
  cb_counts(c->counts, big);
  for (i = 0; i < NCB; i++) {
    if (i == 5) {
      c->r[i] = c->s[i] = NULL;
      c->rp[i] = NULL;
      continue;
    }
    c->r[i] = c->s[i] =
        reg_new(D, CB_BUF[i], c->counts[i] * pat->esz, FCCL_SENT_RECV, pat->esz);
    if (D->rank == root)
      fccl_pattern_fill(pat, put(c->r[i]), c->counts[i],
                        fccl_rank_off(D->base + CB_OFF(i), root));
    c->rp[i] = c->r[i]->dev;
  }
}

static void cb_check_broadcast(dctx* D, cbset* c, const fccl_pattern* pat, int root, int ok) {
  int i;
  for (i = 0; i < NCB; i++) {
    if (!c->r[i]) continue;
    if (ok)
      PATTERN_CHECK(pat, got(c->r[i]), c->counts[i], fccl_rank_off(D->base + CB_OFF(i), root),
                    sub(D, "buffer %d (%zu elements)", i, c->counts[i]));
    chk_guards(D, c->r[i]);
  }
}

static void t_allreduce_coalesced(dctx* D, const fccl_pattern* pat, const fccl_ref* ref, int ip,
                                  size_t bucket, int grouped, size_t big) {
  cbset c;
  int ok = 1;
  if (!part_on("fcclAllReduceCoalesced")) return; /* FCCL_TEST_DEVICE_SKIP */
  case_begin(D, ROTATE, "fcclAllReduceCoalesced %s %s 8 buffers (counts 37,0,1,%zu,5,0(NULL),60,3) "
                        "bucketBytes=%zu %s%s", dtn(pat->dt), opn(ref->op), big ? big : 1001,
             bucket, ipn(ip), grouped ? " inside fcclGroupStart/End" : "");
  cb_setup_allreduce(D, &c, pat, big, ip);
  case_upload(D);
  if (grouped) ok &= DOK(fcclGroupStart());
  ok &= DOK(fcclAllReduceCoalesced(c.sp, c.rp, c.counts, NCB, pat->dt, ref->op, bucket, D->comm,
                                   STREAM(D)));
  if (grouped) ok &= DOK(fcclGroupEnd());
  case_download(D);
  cb_check_allreduce(D, &c, ref, ok, ip);
  case_end(D);
}

static void t_broadcast_coalesced(dctx* D, const fccl_pattern* pat, int root, size_t bucket,
                                  int grouped, size_t big) {
  cbset c;
  int ok = 1;
  if (!part_on("fcclBroadcastCoalesced")) return; /* FCCL_TEST_DEVICE_SKIP */
  case_begin(D, ROTATE, "fcclBroadcastCoalesced %s 8 buffers (counts 37,0,1,%zu,5,0(NULL),60,3) "
                        "root=%d bucketBytes=%zu%s", dtn(pat->dt), big ? big : 1001, root, bucket,
             grouped ? " inside fcclGroupStart/End" : "");
  cb_setup_broadcast(D, &c, pat, big, root);
  case_upload(D);
  if (grouped) ok &= DOK(fcclGroupStart());
  ok &= DOK(fcclBroadcastCoalesced(c.rp, c.counts, NCB, pat->dt, root, bucket, D->comm,
                                   STREAM(D)));
  if (grouped) ok &= DOK(fcclGroupEnd());
  case_download(D);
  cb_check_broadcast(D, &c, pat, root, ok);
  case_end(D);
}

/* Both coalesced calls (and a plain all_reduce) in one group. */
static void t_coalesced_group(dctx* D, int mode) {
  fccl_pattern pa, pb;
  fccl_ref ra;
  cbset a, b;
  region *s, *r;
  int ok, root = D->nranks - 1;
  fccl_pattern_init(&pa, fcclFloat32, FCCL_SCHEME_SUM);
  fccl_pattern_init(&pb, fcclBfloat16, FCCL_SCHEME_FULL);
  fccl_ref_init(&ra, &pa, fcclSum, D->nranks);
  case_begin(D, mode, "group of fcclAllReduceCoalesced (Float32 Sum, in-place, bucketBytes=256) + "
                      "fcclBroadcastCoalesced (Bfloat16, root %d, bucketBytes=100) + fcclAllReduce "
                      "(Float32 Sum, 37)", root);
  cb_setup_allreduce(D, &a, &pa, 0, 1);
  D->base = (D->base + 5003) % FCCL_PERIOD; /* b's data from another rotation */
  cb_setup_broadcast(D, &b, &pb, 0, root);
  s = reg_new(D, "plain sendbuff", 37 * 4, FCCL_SENT_GAP, 4);
  fccl_pattern_fill(&pa, put(s), 37, fccl_rank_off(D->base + 99, D->rank));
  r = reg_new(D, "plain recvbuff", 37 * 4, FCCL_SENT_RECV, 4);
  case_upload(D);
  ok = DOK(fcclGroupStart());
  ok &= DOK(fcclAllReduceCoalesced(a.sp, a.rp, a.counts, NCB, fcclFloat32, fcclSum, 256, D->comm,
                                   STREAM(D)));
  ok &= DOK(fcclBroadcastCoalesced(b.rp, b.counts, NCB, fcclBfloat16, root, 100, D->comm,
                                   STREAM(D)));
  ok &= DOK(fcclAllReduce(s->dev, r->dev, 37, fcclFloat32, fcclSum, D->comm, STREAM(D)));
  ok &= DOK(fcclGroupEnd());
  case_download(D);
  cb_check_broadcast(D, &b, &pb, root, ok);
  if (ok) REF_CHECK(&ra, got(r), 37, D->base + 99, sub(D, "the plain fcclAllReduce"));
  chk_guards(D, r);
  chk_unchanged(D, s, "was modified");
  D->base = (D->base + FCCL_PERIOD - 5003) % FCCL_PERIOD;
  cb_check_allreduce(D, &a, &ra, ok, 1);
  case_end(D);
  fccl_ref_free(&ra);
  fccl_pattern_free(&pa);
  fccl_pattern_free(&pb);
}

/* ---- wire */

static void t_wire(dctx* D, const fccl_pattern* pat, const fccl_ref* ref, size_t count, int ip) {
  size_t bytes = count * 4;
  region *s, *r;
  int ok;
  case_begin(D, ROTATE, "fcclAllReduceWire Float32 data over a Bfloat16 wire %s count=%zu %s "
                        "(inputs exact in bfloat16)", opn(ref->op), count, ipn(ip));
  s = reg_new(D, ip ? "buff" : "sendbuff", bytes, FCCL_SENT_GAP, 4);
  fccl_pattern_fill(pat, put(s), count, fccl_rank_off(D->base, D->rank));
  r = ip ? s : reg_new(D, "recvbuff", bytes, FCCL_SENT_RECV, 4);
  case_upload(D);
  ok = DOK(fcclAllReduceWire(s->dev, r->dev, count, fcclFloat32, ref->op, fcclBfloat16, D->comm,
                             STREAM(D)));
  case_download(D);
  if (ok) REF_CHECK(ref, got(r), count, D->base, D->what);
  chk_guards(D, r);
  if (!ip) chk_unchanged(D, s, "was modified");
  case_end(D);
}

/* ---- barrier, mixed group, split */

static void t_barrier(dctx* D, int mode) {
  case_begin(D, mode, "fcclBarrier");
  DOK(fcclBarrier(D->comm, STREAM(D)));
  if (D->st == ST_ASYNC) CU(cu.StreamSynchronize(D->stream));
  case_end(D);
}

/* One group: all_reduce, broadcast (in place), reduce, all_gather, reduce_scatter,
 * all_to_all, gather, scatter and a send/recv ring, each of another type. */
static void t_mixed_group(dctx* D, int mode) {
  enum { AR, BC, RD, AG, RS, A2A, GA, SC, SR, NK };
  static const fcclDataType_t dts[NK] = {fcclFloat32, fcclInt32,  fcclFloat64,
                                         fcclBfloat16, fcclInt64, fcclInt8,
                                         fcclFloat16,  fcclFloat8e4m3, fcclFloat16};
  static const fcclRedOp_t ops[NK] = {fcclSum, fcclSum, fcclMin, fcclSum, fcclMax,
                                      fcclSum, fcclSum, fcclSum, fcclSum};
  static const size_t cnt[NK] = {1001, 37, 11, 37, 5, 3, 7, 9, 37};
  fccl_pattern pat[NK];
  fccl_ref ref[NK];
  region *s[NK], *r[NK];
  size_t off[NK], n = (size_t)D->nranks, esz[NK];
  int k, q, ok, root = D->nranks - 1, me = D->rank;
  fcclStream_t st;
  case_begin(D, mode, "group of fcclAllReduce(Float32 Sum 1001) + fcclBroadcast(Int32 37 in place, "
                      "root %d) + fcclReduce(Float64 Min 11, root 0) + fcclAllGather(Bfloat16 37) + "
                      "fcclReduceScatter(Int64 Max 5) + fcclAlltoAll(Int8 3) + fcclGather(Float16 7, "
                      "root 0) + fcclScatter(Float8e4m3 9, root %d) + fcclSend/fcclRecv ring "
                      "(Float16 37)", root, root);
  st = STREAM(D);
  for (k = 0; k < NK; k++) {
    fccl_pattern_init(&pat[k], dts[k], fccl_scheme_for_op(ops[k]));
    fccl_ref_init(&ref[k], &pat[k], ops[k], D->nranks);
    off[k] = (D->base + (size_t)k * 4099) % FCCL_PERIOD;
    esz[k] = pat[k].esz;
  }
  /* inputs */
  s[AR] = reg_new(D, "all_reduce sendbuff", cnt[AR] * esz[AR], FCCL_SENT_GAP, esz[AR]);
  r[AR] = reg_new(D, "all_reduce recvbuff", cnt[AR] * esz[AR], FCCL_SENT_RECV, esz[AR]);
  s[BC] = r[BC] = reg_new(D, "broadcast buff", cnt[BC] * esz[BC], FCCL_SENT_RECV, esz[BC]);
  s[RD] = reg_new(D, "reduce sendbuff", cnt[RD] * esz[RD], FCCL_SENT_GAP, esz[RD]);
  r[RD] = me == 0 ? reg_new(D, "reduce recvbuff", cnt[RD] * esz[RD], FCCL_SENT_RECV, esz[RD]) : NULL;
  s[AG] = reg_new(D, "all_gather sendbuff", cnt[AG] * esz[AG], FCCL_SENT_GAP, esz[AG]);
  r[AG] = reg_new(D, "all_gather recvbuff", cnt[AG] * n * esz[AG], FCCL_SENT_RECV, esz[AG]);
  s[RS] = reg_new(D, "reduce_scatter sendbuff", cnt[RS] * n * esz[RS], FCCL_SENT_GAP, esz[RS]);
  r[RS] = reg_new(D, "reduce_scatter recvbuff", cnt[RS] * esz[RS], FCCL_SENT_RECV, esz[RS]);
  s[A2A] = reg_new(D, "all_to_all sendbuff", cnt[A2A] * n * esz[A2A], FCCL_SENT_GAP, esz[A2A]);
  r[A2A] = reg_new(D, "all_to_all recvbuff", cnt[A2A] * n * esz[A2A], FCCL_SENT_RECV, esz[A2A]);
  s[GA] = reg_new(D, "gather sendbuff", cnt[GA] * esz[GA], FCCL_SENT_GAP, esz[GA]);
  r[GA] = me == 0 ? reg_new(D, "gather recvbuff", cnt[GA] * n * esz[GA], FCCL_SENT_RECV, esz[GA]) : NULL;
  s[SC] = me == root ? reg_new(D, "scatter sendbuff", cnt[SC] * n * esz[SC], FCCL_SENT_GAP, esz[SC]) : NULL;
  r[SC] = reg_new(D, "scatter recvbuff", cnt[SC] * esz[SC], FCCL_SENT_RECV, esz[SC]);
  s[SR] = reg_new(D, "send sendbuff", cnt[SR] * esz[SR], FCCL_SENT_GAP, esz[SR]);
  r[SR] = reg_new(D, "recv recvbuff", cnt[SR] * esz[SR], FCCL_SENT_RECV, esz[SR]);
  fccl_pattern_fill(&pat[AR], put(s[AR]), cnt[AR], fccl_rank_off(off[AR], me));
  if (me == root) fccl_pattern_fill(&pat[BC], put(s[BC]), cnt[BC], fccl_rank_off(off[BC], root));
  fccl_pattern_fill(&pat[RD], put(s[RD]), cnt[RD], fccl_rank_off(off[RD], me));
  fccl_pattern_fill(&pat[AG], put(s[AG]), cnt[AG], fccl_rank_off(off[AG], me));
  fccl_pattern_fill(&pat[RS], put(s[RS]), cnt[RS] * n, fccl_rank_off(off[RS], me));
  fccl_pattern_fill(&pat[A2A], put(s[A2A]), cnt[A2A] * n, fccl_rank_off(off[A2A], me));
  fccl_pattern_fill(&pat[GA], put(s[GA]), cnt[GA], fccl_rank_off(off[GA], me));
  if (s[SC]) fccl_pattern_fill(&pat[SC], put(s[SC]), cnt[SC] * n, fccl_rank_off(off[SC], me));
  fccl_pattern_fill(&pat[SR], put(s[SR]), cnt[SR], fccl_rank_off(off[SR], me));
  case_upload(D);
  ok = DOK(fcclGroupStart());
  ok &= DOK(fcclAllReduce(s[AR]->dev, r[AR]->dev, cnt[AR], dts[AR], ops[AR], D->comm, st));
  ok &= DOK(fcclBroadcast(s[BC]->dev, r[BC]->dev, cnt[BC], dts[BC], root, D->comm, st));
  ok &= DOK(fcclReduce(s[RD]->dev, r[RD] ? r[RD]->dev : NULL, cnt[RD], dts[RD], ops[RD], 0,
                       D->comm, st));
  ok &= DOK(fcclAllGather(s[AG]->dev, r[AG]->dev, cnt[AG], dts[AG], D->comm, st));
  ok &= DOK(fcclReduceScatter(s[RS]->dev, r[RS]->dev, cnt[RS], dts[RS], ops[RS], D->comm, st));
  ok &= DOK(fcclAlltoAll(s[A2A]->dev, r[A2A]->dev, cnt[A2A], dts[A2A], D->comm, st));
  ok &= DOK(fcclGather(s[GA]->dev, r[GA] ? r[GA]->dev : NULL, cnt[GA], dts[GA], 0, D->comm, st));
  ok &= DOK(fcclScatter(s[SC] ? s[SC]->dev : NULL, r[SC]->dev, cnt[SC], dts[SC], root, D->comm,
                        st));
  ok &= DOK(fcclSend(s[SR]->dev, cnt[SR], dts[SR], (me + 1) % D->nranks, D->comm, st));
  ok &= DOK(fcclRecv(r[SR]->dev, cnt[SR], dts[SR], (me + D->nranks - 1) % D->nranks, D->comm,
                     st));
  ok &= DOK(fcclGroupEnd());
  case_download(D);
  if (ok) {
    REF_CHECK(&ref[AR], got(r[AR]), cnt[AR], off[AR], sub(D, "all_reduce"));
    PATTERN_CHECK(&pat[BC], got(r[BC]), cnt[BC], fccl_rank_off(off[BC], root), sub(D, "broadcast"));
    if (r[RD]) REF_CHECK(&ref[RD], got(r[RD]), cnt[RD], off[RD], sub(D, "reduce"));
    for (q = 0; q < D->nranks; q++)
      PATTERN_CHECK(&pat[AG], got(r[AG]) + (size_t)q * cnt[AG] * esz[AG], cnt[AG],
                    fccl_rank_off(off[AG], q), sub(D, "all_gather block of rank %d", q));
    REF_CHECK(&ref[RS], got(r[RS]), cnt[RS], off[RS] + (size_t)me * cnt[RS],
              sub(D, "reduce_scatter"));
    for (q = 0; q < D->nranks; q++)
      PATTERN_CHECK(&pat[A2A], got(r[A2A]) + (size_t)q * cnt[A2A] * esz[A2A], cnt[A2A],
                    fccl_rank_off(off[A2A], q) + (size_t)me * cnt[A2A],
                    sub(D, "all_to_all block from rank %d", q));
    if (r[GA])
      for (q = 0; q < D->nranks; q++)
        PATTERN_CHECK(&pat[GA], got(r[GA]) + (size_t)q * cnt[GA] * esz[GA], cnt[GA],
                      fccl_rank_off(off[GA], q), sub(D, "gather block of rank %d", q));
    PATTERN_CHECK(&pat[SC], got(r[SC]), cnt[SC], fccl_rank_off(off[SC], root) + (size_t)me * cnt[SC],
                  sub(D, "scatter"));
    PATTERN_CHECK(&pat[SR], got(r[SR]), cnt[SR],
                  fccl_rank_off(off[SR], (me + D->nranks - 1) % D->nranks), sub(D, "recv"));
  }
  for (k = 0; k < NK; k++) {
    if (r[k]) chk_guards(D, r[k]);
    if (s[k] && s[k] != r[k]) chk_unchanged(D, s[k], "was modified");
  }
  case_end(D);
  for (k = 0; k < NK; k++) {
    fccl_ref_free(&ref[k]);
    fccl_pattern_free(&pat[k]);
  }
}

/* fcclCommSplit (color rank % 2, key reversing the order), then device all_reduces on the
 * new communicator. */
static void t_split(dctx* D) {
  fcclComm_t nc = NULL;
  int color = D->nranks >= 2 ? D->rank % 2 : 0, nn = 0, nr = -1, want_n = 0, want_r = 0, q;
  int dev = -2, ok;
  fcclComm_t parent = D->comm;
  fccl_phase("fcclCommSplit(color %d, key %d) on rank %d", color, D->nranks - D->rank, D->rank);
  ok = CHECK_OK(fcclCommSplit(D->comm, color, D->nranks - D->rank, &nc, NULL));
  for (q = 0; q < D->nranks; q++)
    if ((D->nranks >= 2 ? q % 2 : 0) == color) {
      want_n++;
      if (q > D->rank) want_r++; /* a higher old rank has a lower key: comes first */
    }
  if (!ok || !nc) {
    CHECK(0, "fcclCommSplit gave no communicator on rank %d: the split's device all_reduces "
             "cannot run (the other ranks will fail or time out)", D->rank);
    return;
  }
  CHECK_OK(fcclCommCount(nc, &nn));
  CHECK_OK(fcclCommUserRank(nc, &nr));
  CHECK_OK(fcclCommCuDevice(nc, &dev));
  CHECK(nn == want_n && nr == want_r, "fcclCommSplit(color %d, key %d): rank %d of %d in the new "
        "communicator, expected %d of %d", color, D->nranks - D->rank, nr, nn, want_r, want_n);
  CHECK(dev == D->dev, "fcclCommCuDevice(split communicator) = %d, expected the parent's device %d",
        dev, D->dev);
  if (nn >= 1 && nr >= 0 && nr < nn) {
    static const fcclDataType_t dts[2] = {fcclFloat32, fcclBfloat16};
    static const fcclRedOp_t ops[2] = {fcclSum, fcclAvg};
    int k, myrank = D->rank, mynranks = D->nranks;
    for (k = 0; k < 2; k++) {
      fccl_pattern pat;
      fccl_ref ref;
      region *s, *r;
      size_t count = k ? 37 : 1001;
      fccl_pattern_init(&pat, dts[k], fccl_scheme_for_op(ops[k]));
      fccl_ref_init(&ref, &pat, ops[k], nn);
      D->comm = nc;
      D->rank = nr;
      D->nranks = nn;
      case_begin(D, k ? MODE(MEM_ALLOC, ST_NULL) : MODE(MEM_ARENA, ST_ASYNC),
                 "fcclAllReduce %s %s count=%zu on the communicator of fcclCommSplit(color %d) "
                 "(parent rank %d)", dtn(dts[k]), opn(ops[k]), count, color, myrank);
      s = reg_new(D, "sendbuff", count * pat.esz, FCCL_SENT_GAP, pat.esz);
      fccl_pattern_fill(&pat, put(s), count, fccl_rank_off(D->base, nr));
      r = reg_new(D, "recvbuff", count * pat.esz, FCCL_SENT_RECV, pat.esz);
      case_upload(D);
      if (DOK(fcclAllReduce(s->dev, r->dev, count, dts[k], ops[k], nc, STREAM(D)))) {
        case_download(D);
        REF_CHECK(&ref, got(r), count, D->base, D->what);
      } else {
        case_download(D);
      }
      chk_guards(D, r);
      chk_unchanged(D, s, "was modified");
      case_end(D);
      D->comm = parent;
      D->rank = myrank;
      D->nranks = mynranks;
      fccl_ref_free(&ref);
      fccl_pattern_free(&pat);
    }
  }
  CHECK_OK(fcclCommDestroy(nc));
}

/* ---- a non-blocking communicator (config.blocking = 0) on device memory, made by
 * fcclCommInitRankConfig (so it picks its backend as any communicator does: the IPC path
 * for processes on one GPU) and by fcclCommSplit (as its parent is served): an all_reduce
 * and an all_gather issued back to back return fcclInProgress (or fcclSuccess);
 * fcclCommGetAsyncError is polled until fcclSuccess, which means the work is enqueued on
 * the stream, as NCCL's; only then are the results downloaded (NCCL's rule: nothing on
 * the stream before that).  Then finalize, polled, and destroy. */
static void t_nonblocking(dctx* D, int by_split) {
  static const int modes[2] = {MODE(MEM_ARENA, ST_ASYNC), MODE(MEM_ALLOC, ST_NULL)};
  fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
  fcclComm_t nb = NULL, parent = D->comm;
  fcclResult_t res, st;
  fcclUniqueId id;
  int m, q;
  cfg.blocking = 0;
  fccl_phase("non-blocking %s on rank %d", by_split ? "fcclCommSplit" : "fcclCommInitRankConfig", D->rank);
  if (by_split) {
    res = fcclCommSplit(D->comm, 0, D->rank, &nb, &cfg);
  } else {
    memset(&id, 0, sizeof id);
    if (fccl_shared_id()) {
      id = *fccl_shared_id();
    } else {
      if (D->rank == 0) CHECK_OK(fcclGetUniqueId(&id));
      if (D->nranks > 1) CHECK_OK(fcclBroadcast(&id, &id, sizeof id, fcclUint8, 0, D->comm, NULL));
    }
    res = fcclCommInitRankConfig(&nb, D->nranks, id, D->rank, &cfg);
  }
  CHECK(res == fcclInProgress && nb != NULL, "non-blocking %s returned %d (%s), comm %p; fcclGetLastError: "
        "\"%s\"", by_split ? "fcclCommSplit" : "fcclCommInitRankConfig", (int)res, fccl_res_name(res),
        (void*)nb, fcclGetLastError(NULL));
  if (!nb) return;
  st = fccl_wait_comm(nb);
  CHECK(st == fcclSuccess, "non-blocking creation ended with %d (%s): \"%s\"", (int)st, fccl_res_name(st),
        fcclGetLastError(NULL));
  for (m = 0; m < 2 && st == fcclSuccess; m++) {
    const size_t n1 = 1001, n2 = 37;
    fccl_pattern pf, pl;
    fccl_ref rf;
    region *s1, *r1, *s2, *r2;
    fcclResult_t a, b;
    size_t base2;
    fccl_pattern_init(&pf, fcclFloat32, FCCL_SCHEME_SUM);
    fccl_pattern_init(&pl, fcclInt64, FCCL_SCHEME_FULL);
    fccl_ref_init(&rf, &pf, fcclSum, D->nranks);
    D->comm = nb;
    case_begin(D, modes[m], "non-blocking fcclAllReduce Float32 Sum count=%zu, then fcclAllGather Int64 "
               "sendcount=%zu, one poll (communicator of %s)", n1, n2,
               by_split ? "fcclCommSplit" : "fcclCommInitRankConfig");
    base2 = (D->base + 5003) % FCCL_PERIOD;
    s1 = reg_new(D, "all_reduce sendbuff", n1 * 4, FCCL_SENT_GAP, 4);
    r1 = reg_new(D, "all_reduce recvbuff", n1 * 4, FCCL_SENT_RECV, 4);
    s2 = reg_new(D, "all_gather sendbuff", n2 * 8, FCCL_SENT_GAP, 8);
    r2 = reg_new(D, "all_gather recvbuff", n2 * 8 * (size_t)D->nranks, FCCL_SENT_RECV, 8);
    fccl_pattern_fill(&pf, put(s1), n1, fccl_rank_off(D->base, D->rank));
    fccl_pattern_fill(&pl, put(s2), n2, fccl_rank_off(base2, D->rank));
    case_upload(D);
    a = fcclAllReduce(s1->dev, r1->dev, n1, fcclFloat32, fcclSum, nb, STREAM(D));
    b = fcclAllGather(s2->dev, r2->dev, n2, fcclInt64, nb, STREAM(D));
    D->calls += 2;
    CHECK((a == fcclInProgress || a == fcclSuccess) && (b == fcclInProgress || b == fcclSuccess),
          "%s: the calls returned %d (%s) and %d (%s); fcclGetLastError: \"%s\"", D->what, (int)a,
          fccl_res_name(a), (int)b, fccl_res_name(b), fcclGetLastError(NULL));
    st = fccl_wait_comm(nb);
    CHECK(st == fcclSuccess, "%s: fcclCommGetAsyncError ended with %d (%s): \"%s\"", D->what, (int)st,
          fccl_res_name(st), fcclGetLastError(NULL));
    case_download(D);
    if (st == fcclSuccess) {
      REF_CHECK(&rf, got(r1), n1, D->base, sub(D, "the all_reduce"));
      for (q = 0; q < D->nranks; q++)
        PATTERN_CHECK(&pl, got(r2) + (size_t)q * n2 * 8, n2, fccl_rank_off(base2, q),
                      sub(D, "the all_gather's block of rank %d", q));
    }
    chk_guards(D, r1);
    chk_guards(D, r2);
    chk_unchanged(D, s1, "was modified");
    chk_unchanged(D, s2, "was modified");
    case_end(D);
    D->comm = parent;
    fccl_ref_free(&rf);
    fccl_pattern_free(&pf);
    fccl_pattern_free(&pl);
  }
  res = fcclCommFinalize(nb);
  CHECK(res == fcclInProgress || res == fcclSuccess, "fcclCommFinalize (non-blocking) returned %d (%s)",
        (int)res, fccl_res_name(res));
  st = fccl_wait_comm(nb);
  CHECK(st == fcclSuccess, "non-blocking finalize ended with %d (%s)", (int)st, fccl_res_name(st));
  CHECK_OK(fcclCommDestroy(nb));
}

/* ---- local calls (one rank): devices 0 and 1 (or 0 twice with one device) and host */

static void t_local(dctx* D) {
  int d1 = g_ndev >= 2 ? 1 : 0, dv[3], k, ok;
  size_t shape[2] = {6, 5}, esz, i;
  fccl_pattern pat;
  region *src, *dst[3], *srcs[2];
  unsigned char* host;
  void* dp[3];
  const void* sp[2];
  if (g_ndev < 2)
    printf("%s: rank 0: note: one device visible: the local calls use device 0 for the "
           "\"device 1\" buffers\n", g_prog);
  /* fcclLocalBroadcast: device 0 -> device 0, device 1, host */
  fccl_pattern_init(&pat, fcclInt8, FCCL_SCHEME_FULL);
  for (k = 0; k < 2; k++) {
    size_t bytes = k ? 1000003 : 37;
    case_begin(D, MODE(MEM_ALLOC, ST_NULL), "fcclLocalBroadcast %zu bytes device %d -> devices "
               "%d, %d and host", bytes, D->dev, D->dev, d1);
    src = reg_new(D, "src", bytes, FCCL_SENT_GAP, 1);
    fccl_pattern_fill(&pat, put(src), bytes, D->base);
    dst[0] = reg_new(D, "dsts[0]", bytes, FCCL_SENT_RECV, 1);
    dst[1] = reg_new_on(D, d1, "dsts[1]", bytes, FCCL_SENT_RECV);
    host = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
    memset(host, FCCL_SENT_RECV, bytes + FCCL_SLACK);
    dp[0] = dst[0]->dev;
    dp[1] = dst[1]->dev;
    dp[2] = host;
    dv[0] = D->dev;
    dv[1] = d1;
    dv[2] = -1;
    case_upload(D);
    ok = DOK(fcclLocalBroadcast(src->dev, D->dev, bytes, dp, dv, 3));
    case_download(D);
    if (ok) {
      PATTERN_CHECK(&pat, got(dst[0]), bytes, D->base, sub(D, "dsts[0]"));
      PATTERN_CHECK(&pat, got(dst[1]), bytes, D->base, sub(D, "dsts[1]"));
      PATTERN_CHECK(&pat, host, bytes, D->base, sub(D, "dsts[2] (host)"));
    }
    chk_guards(D, dst[0]);
    chk_guards(D, dst[1]);
    BYTES_CHECK(host + bytes, FCCL_SLACK, FCCL_SENT_RECV, sub(D, "bytes after dsts[2] (host)"));
    chk_unchanged(D, src, "was modified");
    free(host);
    case_end(D);
  }
  fccl_pattern_free(&pat);

  /* fcclLocalScatter of a 6x5 tensor along dim 0 / dim 1 to (device 1, device 0), then
   * fcclLocalGather back onto device 1 / device 0 */
  for (k = 0; k < 4; k++) {
    static const fcclDataType_t dts[4] = {fcclFloat32, fcclBfloat16, fcclInt64, fcclFloat8e4m3};
    static const size_t chunks_d0[2] = {2, 4}, chunks_d1[2] = {4, 1};
    int dim = k % 2, gdev = (k / 2) ? D->dev : d1;
    const size_t* chunks = k == 1 ? NULL : (dim ? chunks_d1 : chunks_d0);
    size_t c0, c1, inner, outer, sz[2], o;
    fccl_pattern_init(&pat, dts[k], FCCL_SCHEME_FULL);
    esz = pat.esz;
    c0 = chunks ? chunks[0] : (shape[dim] + 1) / 2;
    c1 = shape[dim] - c0;
    sz[0] = c0;
    sz[1] = c1;
    outer = dim ? shape[0] : 1;
    inner = dim ? 1 : shape[1];
    case_begin(D, MODE(MEM_ALLOC, ST_NULL), "fcclLocalScatter %s shape=6x5 dim=%d chunks=%s{%zu,%zu} "
               "device %d -> devices %d, %d", dtn(dts[k]), dim, chunks ? "" : "NULL=", c0, c1,
               D->dev, d1, D->dev);
    src = reg_new(D, "src", 30 * esz, FCCL_SENT_GAP, esz);
    fccl_pattern_fill(&pat, put(src), 30, D->base);
    dst[0] = reg_new_on(D, d1, "dsts[0]", outer * c0 * inner * esz, FCCL_SENT_RECV);
    dst[1] = reg_new(D, "dsts[1]", outer * c1 * inner * esz, FCCL_SENT_RECV, esz);
    dp[0] = dst[0]->dev;
    dp[1] = dst[1]->dev;
    dv[0] = d1;
    dv[1] = D->dev;
    case_upload(D);
    ok = DOK(fcclLocalScatter(src->dev, D->dev, 2, shape, dim, dts[k], chunks, dp, dv, 2));
    case_download(D);
    if (ok) {
      /* chunk j, row o: elements [o][start_j .. start_j + sz_j) along dim */
      for (i = 0; i < 2; i++) {
        size_t start = i ? c0 : 0;
        for (o = 0; o < outer; o++)
          PATTERN_CHECK(&pat, got(dst[i]) + o * sz[i] * inner * esz, sz[i] * inner,
                        D->base + (o * shape[dim] + start) * inner,
                        sub(D, "chunk %zu, outer row %zu", i, o));
      }
    }
    chk_guards(D, dst[0]);
    chk_guards(D, dst[1]);
    chk_unchanged(D, src, "was modified");
    case_end(D);

    /* gather the same chunks (uploaded from the pattern) back */
    case_begin(D, MODE(MEM_ALLOC, ST_NULL), "fcclLocalGather %s dimSizes={%zu,%zu} dim=%d sources "
               "on devices %d, %d -> device %d", dtn(dts[k]), c0, c1, dim, d1, D->dev, gdev);
    srcs[0] = reg_new_on(D, d1, "srcs[0]", outer * c0 * inner * esz, FCCL_SENT_GAP);
    srcs[1] = reg_new(D, "srcs[1]", outer * c1 * inner * esz, FCCL_SENT_GAP, esz);
    for (i = 0; i < 2; i++) {
      size_t start = i ? c0 : 0;
      for (o = 0; o < outer; o++)
        fccl_pattern_fill(&pat, put(srcs[i]) + o * sz[i] * inner * esz, sz[i] * inner,
                          D->base + (o * shape[dim] + start) * inner);
    }
    dst[0] = gdev == D->dev ? reg_new(D, "dst", 30 * esz, FCCL_SENT_RECV, esz)
                            : reg_new_on(D, gdev, "dst", 30 * esz, FCCL_SENT_RECV);
    sp[0] = srcs[0]->dev;
    sp[1] = srcs[1]->dev;
    dv[0] = d1;
    dv[1] = D->dev;
    case_upload(D);
    ok = DOK(fcclLocalGather(sp, dv, sz, 2, 2, shape, dim, dts[k], dst[0]->dev, gdev));
    case_download(D);
    if (ok) PATTERN_CHECK(&pat, got(dst[0]), 30, D->base, D->what);
    chk_guards(D, dst[0]);
    chk_unchanged(D, srcs[0], "was modified");
    chk_unchanged(D, srcs[1], "was modified");
    case_end(D);
    fccl_pattern_free(&pat);
  }
}

/* ---- refused calls: host and device buffers mixed */

static void expect_refused(dctx* D, fcclResult_t res, const char* fname, const char* const* names,
                           int nnames) {
  const char* le = fcclGetLastError(NULL);
  int k;
  D->calls++;
  CHECK(res == fcclInvalidArgument, "%s: %s returned %d (%s), expected fcclInvalidArgument; "
        "fcclGetLastError: \"%s\"", D->what, fname, (int)res, fccl_res_name(res), le ? le : "(NULL)");
  if (res == fcclSuccess) return;
  CHECK(le && strstr(le, fname), "%s: fcclGetLastError = \"%s\" does not name %s", D->what,
        le ? le : "(NULL)", fname);
  for (k = 0; k < nnames; k++)
    CHECK(le && strstr(le, names[k]), "%s: fcclGetLastError = \"%s\" does not name %s", D->what,
          le ? le : "(NULL)", names[k]);
}

static void t_bad_inputs(dctx* D) {
  static const char* const both[2] = {"sendbuff", "recvbuff"};
  static const char* const idx2s[1] = {"sendbuffs[2]"};
  static const char* const idx2b[1] = {"buffs[2]"};
  const size_t count = 37, bytes = count * 4;
  unsigned char* host = (unsigned char*)fccl_xmalloc(bytes);
  void* pinned = NULL;
  region *s, *r, *o;
  cbset c;
  fccl_pattern pat;
  int other = g_ndev >= 2 ? (D->dev == 0 ? 1 : 0) : -1, i;
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_SUM);
  fccl_pattern_fill(&pat, host, count, 0);
  if (!CHECK_OK(fcclMemAllocHost(&pinned, bytes))) pinned = NULL;

  case_begin(D, MODE(MEM_ALLOC, ST_NULL), "refused: fcclAllReduce with a host (malloc) sendbuff "
             "and a device recvbuff");
  r = reg_new(D, "recvbuff", bytes, FCCL_SENT_RECV, 4);
  s = reg_new(D, "sendbuff", bytes, FCCL_SENT_GAP, 4);
  case_upload(D);
  expect_refused(D, fcclAllReduce(host, r->dev, count, fcclFloat32, fcclSum, D->comm, NULL),
                 "fcclAllReduce", both, 2);
  D->desc[0] = 0;
  snprintf(D->what, sizeof D->what, "refused: fcclAllReduce with a device sendbuff and a pinned "
           "host (fcclMemAllocHost) recvbuff [device %d, rank %d of %d]", D->dev, D->rank, D->nranks);
  if (pinned) {
    memset(pinned, FCCL_SENT_RECV, bytes);
    expect_refused(D, fcclAllReduce(s->dev, pinned, count, fcclFloat32, fcclSum, D->comm, NULL),
                   "fcclAllReduce", both, 2);
    BYTES_CHECK(pinned, bytes, FCCL_SENT_RECV, sub(D, "the pinned recvbuff was written"));
  }
  snprintf(D->what, sizeof D->what, "refused: fcclAllReduce on the async stream with a device "
           "sendbuff and a host (malloc) recvbuff [device %d, rank %d of %d]", D->dev,
           D->rank, D->nranks);
  memset(host, FCCL_SENT_RECV, bytes);
  expect_refused(D, fcclAllReduce(s->dev, host, count, fcclFloat32, fcclSum, D->comm, D->stream),
                 "fcclAllReduce", both, 2);
  BYTES_CHECK(host, bytes, FCCL_SENT_RECV, sub(D, "the host recvbuff was written"));
  case_download(D);
  chk_unchanged(D, r, "was written by a refused call");
  chk_unchanged(D, s, "was modified by a refused call");
  case_end(D);

  if (other >= 0) {
    case_begin(D, MODE(MEM_ALLOC, ST_NULL), "refused: fcclAllReduce with a sendbuff on device "
               "%d and a recvbuff on device %d", other, D->dev);
    o = reg_new_on(D, other, "sendbuff", bytes, FCCL_SENT_GAP);
    r = reg_new(D, "recvbuff", bytes, FCCL_SENT_RECV, 4);
    case_upload(D);
    expect_refused(D, fcclAllReduce(o->dev, r->dev, count, fcclFloat32, fcclSum, D->comm, NULL),
                   "fcclAllReduce", both, 2);
    case_download(D);
    chk_unchanged(D, r, "was written by a refused call");
    case_end(D);
  }

  /* coalesced: buffer 2 is host memory, the others device memory */
  case_begin(D, MODE(MEM_ARENA, ST_ASYNC), "refused: fcclAllReduceCoalesced with sendbuffs[2] "
             "in host memory, the other buffers device memory");
  cb_setup_allreduce(D, &c, &pat, 0, 0);
  c.sp[2] = host;
  case_upload(D);
  expect_refused(D, fcclAllReduceCoalesced(c.sp, c.rp, c.counts, NCB, fcclFloat32, fcclSum, 256,
                                           D->comm, STREAM(D)),
                 "fcclAllReduceCoalesced", idx2s, 1);
  case_download(D);
  for (i = 0; i < NCB; i++)
    if (c.r[i]) chk_unchanged(D, c.r[i], "was written by a refused call");
  case_end(D);

  case_begin(D, MODE(MEM_ALLOC, ST_NULL), "refused: fcclBroadcastCoalesced with buffs[2] in "
             "host memory, the other buffers device memory");
  cb_setup_broadcast(D, &c, &pat, 0, 0);
  memset(host, FCCL_SENT_RECV, bytes);
  c.rp[2] = host;
  case_upload(D);
  expect_refused(D, fcclBroadcastCoalesced(c.rp, c.counts, NCB, fcclFloat32, 0, 256, D->comm,
                                           STREAM(D)),
                 "fcclBroadcastCoalesced", idx2b, 1);
  case_download(D);
  for (i = 0; i < NCB; i++)
    if (c.r[i]) chk_unchanged(D, c.r[i], "was written by a refused call");
  case_end(D);

  if (pinned) CHECK_OK(fcclMemFree(pinned));
  free(host);
  fccl_pattern_free(&pat);
}

/* ================================================================== rank order */

/* Inexact float data: mixed signs and magnitudes, element i of rank r (sums depend on
 * the order of their operands). */
static double order_val(int r, size_t i, unsigned long salt) {
  uint64_t m = mix64(((uint64_t)salt << 40) ^ ((uint64_t)r << 32) ^ (uint64_t)i);
  double u = (double)(m >> 11) / 9007199254740992.0 - 0.5;
  return u * (double)(1u << (m & 15u)) / 256.0;
}

/* Element i of the sum over ranks in rank order, accumulated in float32 and rounded once
 * to dt: what every backend must give, bit for bit (docs/abi.md), whatever the call's size and
 * however it is cut. */
static void order_sum(fcclDataType_t dt, int n, size_t i, unsigned long salt, void* out, size_t k) {
  unsigned char in[8];
  float acc = 0.0f;
  int r;
  for (r = 0; r < n; r++) {
    float x;
    fccl_store_f(dt, in, 0, order_val(r, i, salt));
    x = (float)fccl_load_f(dt, in, 0);
    acc = r ? acc + x : x;
  }
  fccl_store_f(dt, out, k, (double)acc);
}

/* fcclAllReduce (rs = 0) or fcclReduceScatter (rs = 1) sum of inexact values on host or
 * device memory: every element equals the rank-order sum bit for bit. */
static void t_rank_order(dctx* D, fcclDataType_t dt, int rs, size_t count, int on_host) {
  size_t esz = fccl_dt_size(dt), n = (size_t)D->nranks, total = rs ? count * n : count, i, bad = 0;
  size_t first = 0, off = rs ? (size_t)D->rank * count : 0;
  unsigned long salt;
  unsigned char *in, *out, want[8];
  region *s = NULL, *r = NULL;
  int ok;
  case_begin(D, ROTATE, "%s %s sum count=%zu of inexact values on %s memory", rs ? "fcclReduceScatter" :
             "fcclAllReduce", dtn(dt), count, on_host ? "host" : "device");
  salt = D->seq;
  if (on_host) {
    in = (unsigned char*)fccl_xmalloc(total * esz);
    out = (unsigned char*)fccl_xmalloc(count * esz);
  } else {
    s = reg_new(D, "sendbuff", total * esz, FCCL_SENT_GAP, esz);
    r = reg_new(D, "recvbuff", count * esz, FCCL_SENT_RECV, esz);
    in = put(s);
    out = got(r);
  }
  for (i = 0; i < total; i++) fccl_store_f(dt, in, i, order_val(D->rank, i, salt));
  if (on_host) {
    ok = rs ? DOK(fcclReduceScatter(in, out, count, dt, fcclSum, D->comm, NULL))
            : DOK(fcclAllReduce(in, out, count, dt, fcclSum, D->comm, NULL));
  } else {
    case_upload(D);
    ok = rs ? DOK(fcclReduceScatter(s->dev, r->dev, count, dt, fcclSum, D->comm, STREAM(D)))
            : DOK(fcclAllReduce(s->dev, r->dev, count, dt, fcclSum, D->comm, STREAM(D)));
    case_download(D);
  }
  for (i = 0; ok && i < count; i++) {
    order_sum(dt, D->nranks, off + i, salt, want, 0);
    if (memcmp(out + i * esz, want, esz) != 0 && !bad++) first = i;
  }
  if (bad) {
    char g[64], w[64];
    order_sum(dt, D->nranks, off + first, salt, want, 0);
    fccl_format_elem(dt, out, first, g, sizeof g);
    fccl_format_elem(dt, want, 0, w, sizeof w);
    CHECK(0, "%s: %zu of %zu elements are not the rank-order sum; the first, element %zu: %s, "
             "expected %s", D->what, bad, count, first, g, w);
  }
  if (on_host) {
    free(in);
    free(out);
  } else {
    chk_guards(D, r);
    chk_unchanged(D, s, "was modified");
  }
  case_end(D);
}

/* Rank-order sums on host and device memory: 1001 elements (several chunks when staging
 * is cut small, FERROCCL_STAGING_CHUNK) and, with the big cases, 6 MiB (several chunks
 * at the default size, with a remainder). */
static void part_order(dctx* D) {
  static const fcclDataType_t dts[2] = {fcclFloat32, fcclBfloat16};
  size_t counts[2] = {1001, ((size_t)6 << 20) / 4 + 3};
  int t, c, rs, h;
  for (c = 0; c < (D->big ? 2 : 1); c++)
    for (t = 0; t < 2; t++)
      for (rs = 0; rs < 2; rs++)
        for (h = 0; h < 2; h++) {
          size_t cnt = rs ? counts[c] / (size_t)D->nranks + 1 : counts[c];
          t_rank_order(D, dts[t], rs, cnt, h);
        }
}

/* ================================================================== the body */

/* >= 16 MiB cases: 2 = all of part_big, 1 = a few (all_reduce, reduce_scatter, all_gather,
 * all_to_all_v), 0 = none.  Default: all at 1 and 2 ranks, a few at more (memory: the
 * simulated devices live in host memory). FCCL_TEST_DEVICE_BIG=0 / all overrides. */
static int big_wanted(int nranks) {
  const char* e = getenv("FCCL_TEST_DEVICE_BIG");
  if (e && strcmp(e, "0") == 0) return 0;
  if (e && strcmp(e, "all") == 0) return 2;
  return nranks <= 2 ? 2 : 1;
}

typedef struct {
  fccl_pattern pat;
  fccl_ref ref;
} pr_t;

static void pr_init(pr_t* p, fcclDataType_t dt, fcclRedOp_t op, int scheme, int nranks) {
  fccl_pattern_init(&p->pat, dt, scheme);
  fccl_ref_init(&p->ref, &p->pat, op, nranks);
}
static void pr_free(pr_t* p) {
  fccl_ref_free(&p->ref);
  fccl_pattern_free(&p->pat);
}

/* Reducing collectives: every type x op x count x placement (roots rotating). */
static void part_reducing(dctx* D) {
  int t, o, c, ip, n = D->nranks, k = 0;
  pr_t p;
  for (t = 0; t < NT; t++)
    for (o = 0; o < FCCL_NOPS; o++) {
      pr_init(&p, TYPES[t], fccl_ops[o], fccl_scheme_for_op(fccl_ops[o]), n);
      for (c = 0; c < NC; c++)
        for (ip = 0; ip < 2; ip++) {
          size_t cnt = COUNTS[c];
          int root = (k++) % n;
          EACH_MODE(D) {
            t_allreduce(D, &p.pat, &p.ref, cnt, ip);
            t_reduce(D, &p.pat, &p.ref, cnt, root, ip, (c + o) % 2);
            t_reducescatter(D, &p.pat, &p.ref, cnt, ip);
            t_reducescatterv(D, &p.pat, &p.ref, cnt, t + c, ip);
          }
        }
      pr_free(&p);
    }
  /* ferroccl's bitwise operators, on the integer types (the device kernels' own code) */
  for (t = 0; t < NT; t++) {
    if (fccl_dt_is_float(TYPES[t])) continue;
    for (o = 0; o < FCCL_NBITOPS; o++) {
      pr_init(&p, TYPES[t], fccl_bitops[o], fccl_scheme_for_op(fccl_bitops[o]), n);
      for (c = 1; c < NC; c++)
        EACH_MODE(D) {
          int root = (k++) % n;
          t_allreduce(D, &p.pat, &p.ref, COUNTS[c], c % 2);
          t_reduce(D, &p.pat, &p.ref, COUNTS[c], root, (c + o) % 2, c % 2);
          t_reducescatter(D, &p.pat, &p.ref, COUNTS[c], (c + 1) % 2);
          t_reducescatterv(D, &p.pat, &p.ref, COUNTS[c], t + c, c % 2);
        }
      pr_free(&p);
    }
  }
}

/* Reduce at every root for every type and op (count 37). */
static void part_reduce_roots(dctx* D) {
  int t, o, root, n = D->nranks;
  pr_t p;
  for (t = 0; t < NT; t++)
    for (o = 0; o < FCCL_NOPS; o++) {
      pr_init(&p, TYPES[t], fccl_ops[o], fccl_scheme_for_op(fccl_ops[o]), n);
      for (root = 0; root < n; root++)
        EACH_MODE(D) t_reduce(D, &p.pat, &p.ref, 37, root, (t + root) % 2, root % 2);
      pr_free(&p);
    }
}

static void part_moving(dctx* D) {
  int t, c, ip, root, n = D->nranks, k = 0;
  fccl_pattern pat;
  for (t = 0; t < NT; t++) {
    fccl_pattern_init(&pat, TYPES[t], FCCL_SCHEME_FULL);
    for (c = 0; c < NC; c++) {
      size_t cnt = COUNTS[c];
      EACH_MODE(D) {
        for (ip = 0; ip < 2; ip++) {
          t_allgather(D, &pat, cnt, ip);
          t_allgatherv(D, &pat, cnt, t + c, ip);
        }
        for (ip = 0; ip < 2; ip++) t_alltoall(D, &pat, cnt, ip);
        t_alltoallv(D, &pat, cnt, t + c);
        t_alltoallv_ip(D, &pat, cnt, t + c, 1);
        t_alltoallv_ip(D, &pat, cnt, t + c, 0);
        t_sendrecv(D, &pat, cnt, 0);
        t_sendrecv(D, &pat, cnt, 1);
        t_sendrecv(D, &pat, cnt, 2);
        /* rooted: every root at 37, rotating at the other counts */
        for (root = 0; root < n; root++) {
          if (cnt != 37 && root != (k % n)) continue;
          t_broadcast(D, &pat, cnt, root, (root + c) % 2);
          t_gather(D, &pat, cnt, root, (root + t) % 2);
          t_scatter(D, &pat, cnt, root, (root + t + 1) % 2);
        }
      }
      k++;
    }
    fccl_pattern_free(&pat);
  }
}

/* Send/recv beyond the matrix's shapes: sizes that differ, matching across calls, in place,
 * between host and device memory; at counts that go whole (small) and in many pieces. */
static void part_p2p(dctx* D) {
  static const size_t counts[3] = {1, 1001, 70001};
  static const fcclDataType_t dts[3] = {fcclInt8, fcclFloat32, fcclFloat64};
  int t, c;
  fccl_pattern pat;
  for (t = 0; t < 3; t++) {
    fccl_pattern_init(&pat, dts[t], FCCL_SCHEME_FULL);
    for (c = 0; c < 3; c++)
      EACH_MODE(D) {
        t_sendrecv_mismatch(D, &pat, counts[c]);
        t_sendrecv_across_calls(D, &pat, counts[c], 0);
        t_sendrecv_across_calls(D, &pat, counts[c], 1);
        t_sendrecv_in_place(D, &pat, counts[c]);
        t_sendrecv_host_device(D, &pat, counts[c]);
      }
    fccl_pattern_free(&pat);
  }
}

static void part_axis(dctx* D) {
  int t, o, n = D->nranks;
  size_t sh2[2], sh3[3];
  fccl_pattern pat;
  pr_t p;
  for (t = 0; t < NT; t++) {
    fccl_pattern_init(&pat, TYPES[t], FCCL_SCHEME_FULL);
    EACH_MODE(D) {
      sh2[0] = 3;
      sh2[1] = 5;
      t_allgather_axis(D, &pat, 2, sh2, 0);
      t_allgather_axis(D, &pat, 2, sh2, 1);
      sh3[0] = 2;
      sh3[1] = (size_t)(t % 3); /* 0 (an empty tensor), 1 or 2 */
      sh3[2] = 7;
      t_allgather_axis(D, &pat, 3, sh3, 1);
      sh3[1] = 3;
      t_allgather_axis(D, &pat, 3, sh3, 2);
      t_allgather_axis(D, &pat, 3, sh3, 0);
    }
    fccl_pattern_free(&pat);
  }
  for (t = 0; t < NT; t++)
    for (o = 0; o < FCCL_NOPS; o++) {
      pr_init(&p, TYPES[t], fccl_ops[o], fccl_scheme_for_op(fccl_ops[o]), n);
      EACH_MODE(D) {
      sh2[0] = (size_t)n * 2;
      sh2[1] = 5;
      t_reducescatter_axis(D, &p.pat, &p.ref, 2, sh2, 0);
      sh2[0] = 3;
      sh2[1] = (size_t)n * 3;
      t_reducescatter_axis(D, &p.pat, &p.ref, 2, sh2, 1);
      sh3[0] = 2;
      sh3[1] = (size_t)n * (size_t)(1 + (t + o) % 2);
      sh3[2] = 7;
      t_reducescatter_axis(D, &p.pat, &p.ref, 3, sh3, 1);
      sh3[1] = 3;
      sh3[2] = (size_t)n;
      t_reducescatter_axis(D, &p.pat, &p.ref, 3, sh3, 2);
      }
      pr_free(&p);
    }
  for (t = 0; t < NT; t++) {
    if (fccl_dt_is_float(TYPES[t])) continue;
    for (o = 0; o < FCCL_NBITOPS; o++) {
      pr_init(&p, TYPES[t], fccl_bitops[o], fccl_scheme_for_op(fccl_bitops[o]), n);
      sh2[0] = 3;
      sh2[1] = (size_t)n * 3;
      EACH_MODE(D) t_reducescatter_axis(D, &p.pat, &p.ref, 2, sh2, 1);
      pr_free(&p);
    }
  }
}

static void part_coalesced(dctx* D) {
  int t, o, ip, root, n = D->nranks;
  pr_t p;
  fccl_pattern pat;
  for (t = 0; t < NT; t++)
    for (o = 0; o < FCCL_NOPS; o++) {
      pr_init(&p, TYPES[t], fccl_ops[o], fccl_scheme_for_op(fccl_ops[o]), n);
      for (ip = 0; ip < 2; ip++)
        EACH_MODE(D)
        t_allreduce_coalesced(D, &p.pat, &p.ref, ip, (t + o + ip) % 4 == 3 ? 0 : 256,
                              (t + o + ip) % 3 == 0, 0);
      pr_free(&p);
    }
  for (t = 0; t < NT; t++) {
    if (fccl_dt_is_float(TYPES[t])) continue;
    for (o = 0; o < FCCL_NBITOPS; o++) {
      pr_init(&p, TYPES[t], fccl_bitops[o], fccl_scheme_for_op(fccl_bitops[o]), n);
      EACH_MODE(D) t_allreduce_coalesced(D, &p.pat, &p.ref, o % 2, o == 1 ? 0 : 256, t % 2, 0);
      pr_free(&p);
    }
  }
  for (t = 0; t < NT; t++) {
    fccl_pattern_init(&pat, TYPES[t], FCCL_SCHEME_FULL);
    for (root = 0; root < n; root++)
      EACH_MODE(D)
      t_broadcast_coalesced(D, &pat, root, (t + root) % 4 == 3 ? 0 : 256, (t + root) % 3 == 1, 0);
    fccl_pattern_free(&pat);
  }
  t_coalesced_group(D, MODE(MEM_ARENA, ST_ASYNC));
  t_coalesced_group(D, MODE(MEM_ALLOC, ST_NULL));
}

static void part_wire(dctx* D) {
  int o, c, ip, n = D->nranks;
  pr_t p;
  for (o = 0; o < FCCL_NOPS; o++) {
    if (fccl_ops[o] == fcclAvg && (n & (n - 1)) != 0) continue; /* avg exact only for 2^k ranks */
    /* sums of more than 4 inputs are not exact in bfloat16: part_vs_host checks them */
    if ((fccl_ops[o] == fcclSum || fccl_ops[o] == fcclAvg) && n > 4) continue;
    /* sum-scheme inputs are k/4, |k| <= 40: exact in bfloat16, and so are sums of <= 4 */
    pr_init(&p, fcclFloat32, fccl_ops[o],
            fccl_ops[o] == fcclProd ? FCCL_SCHEME_PROD : FCCL_SCHEME_SUM, n);
    for (c = 0; c < NC; c++)
      for (ip = 0; ip < 2; ip++) EACH_MODE(D) t_wire(D, &p.pat, &p.ref, COUNTS[c], ip);
    pr_free(&p);
  }
}

/* ---- the host backend's bits */

/* splitmix64 of (salt, rank, element) */
static uint64_t vh_bits(uint64_t salt, int r, size_t i) {
  uint64_t z = salt * 0x9e3779b97f4a7c15ull + (uint64_t)r * 0xbf58476d1ce4e5b9ull + i;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Element i of rank r: random bits for integers; for floats nonzero finite values with a
 * random sign and significand, magnitude 2^-3 .. 2^4, so that no NaN arises and max/min do not
 * depend on the order the host combines them in (it starts from each owner's own data). */
static void vh_fill(fcclDataType_t dt, unsigned char* buf, size_t count, int r, uint64_t salt) {
  size_t i;
  for (i = 0; i < count; i++) {
    uint64_t x = vh_bits(salt, r, i);
    if (dt == fcclInt8 || dt == fcclUint8 || dt == fcclInt32 || dt == fcclUint32 ||
        dt == fcclInt64 || dt == fcclUint64) {
      fccl_store_i(dt, buf, i, x);
    } else {
      double v = ldexp(1.0 + (double)(x >> 12) * ldexp(1.0, -52), (int)(x % 8) - 3);
      fccl_store_f(dt, buf, i, (x >> 3) & 1 ? -v : v);
    }
  }
}

/* One call on device buffers (served by the device backend where ranks share a GPU) and the
 * same call on host buffers (the host backend), on the same inputs: the results must be the
 * same bytes. wire: fcclAllReduceWire's wire type (or -1); scatter: fcclReduceScatter. */
static void vh_case(dctx* D, fcclDataType_t dt, fcclRedOp_t op, int wire, int scatter, uint64_t salt,
                    size_t count) {
  size_t esz = fccl_dt_size(dt), in = scatter ? count * (size_t)D->nranks : count;
  unsigned char *hs = (unsigned char*)fccl_xmalloc(in * esz), *hr, *dr;
  void *ds = NULL, *dd = NULL;
  int ok = 1;
  fcclComm_t c = D->comm;
  hr = (unsigned char*)fccl_xmalloc(count * esz);
  dr = (unsigned char*)fccl_xmalloc(count * esz);
  snprintf(D->what, sizeof D->what, "%s %s %s%s%s count=%zu: device memory against host memory "
           "[device %d, rank %d of %d]", wire >= 0 ? "fcclAllReduceWire" : scatter ?
           "fcclReduceScatter" : "fcclAllReduce", dtn(dt), opn(op), wire >= 0 ? " over " : "",
           wire >= 0 ? dtn((fcclDataType_t)wire) : "", count, D->dev, D->rank, D->nranks);
  fccl_phase("%s", D->what);
  vh_fill(dt, hs, in, D->rank, salt);
  ok &= CHECK_OK(fcclMemAlloc(&ds, in * esz));
  ok &= CHECK_OK(fcclMemAlloc(&dd, count * esz));
  if (ok) ok &= CU(cu.MemcpyHtoD((CUdeviceptr)(uintptr_t)ds, hs, in * esz));
  /* every rank makes both calls whatever happened before */
  if (wire >= 0) {
    ok &= DOK(fcclAllReduceWire(ds, dd, count, dt, op, (fcclDataType_t)wire, c, NULL));
    ok &= DOK(fcclAllReduceWire(hs, hr, count, dt, op, (fcclDataType_t)wire, c, NULL));
  } else if (scatter) {
    ok &= DOK(fcclReduceScatter(ds, dd, count, dt, op, c, NULL));
    ok &= DOK(fcclReduceScatter(hs, hr, count, dt, op, c, NULL));
  } else {
    ok &= DOK(fcclAllReduce(ds, dd, count, dt, op, c, NULL));
    ok &= DOK(fcclAllReduce(hs, hr, count, dt, op, c, NULL));
  }
  if (ok && CU(cu.MemcpyDtoH(dr, (CUdeviceptr)(uintptr_t)dd, count * esz)) &&
      memcmp(dr, hr, count * esz) != 0) {
    size_t i = 0;
    char a[64], b[64];
    while (memcmp(dr + i * esz, hr + i * esz, esz) == 0) i++;
    fccl_format_elem(dt, dr, i, a, sizeof a);
    fccl_format_elem(dt, hr, i, b, sizeof b);
    CHECK(0, "%s: element %zu: device %s, host %s", D->what, i, a, b);
  }
  if (ds) CHECK_OK(fcclMemFree(ds));
  if (dd) CHECK_OK(fcclMemFree(dd));
  free(hs);
  free(hr);
  free(dr);
  D->cases++;
}

/* Every type and op, and the wire forms, with random significands: the device's results are
 * the host backend's, bit for bit (narrow floats accumulated in float32 and rounded once, the
 * wire's owner order and roundings). */
static void part_vs_host(dctx* D) {
  static const int wires[5][2] = {{fcclFloat32, fcclBfloat16}, {fcclFloat32, fcclFloat16},
                                  {fcclFloat32, fcclFloat8e4m3}, {fcclFloat64, fcclFloat32},
                                  {fcclFloat64, fcclFloat8e5m2}};
  int t, o, w;
  for (t = 0; t < FCCL_NTYPES; t++)
    for (o = 0; o < FCCL_NOPS; o++) {
      vh_case(D, fccl_types[t], fccl_ops[o], -1, 0, (uint64_t)(t * 8 + o), 1001);
      if (o % 2 == t % 2) vh_case(D, fccl_types[t], fccl_ops[o], -1, 1, (uint64_t)(t * 8 + o + 100), 1001);
    }
  for (w = 0; w < 5; w++)
    for (o = 0; o < FCCL_NOPS; o++)
      vh_case(D, (fcclDataType_t)wires[w][0], fccl_ops[o], wires[w][1], 0, (uint64_t)(w * 8 + o + 200), 1001);
  /* the host's wire windows are 8 MiB of wire bytes: two of them, each split among owners */
  if (D->big) vh_case(D, fcclFloat32, fcclSum, fcclBfloat16, 0, 300, ((size_t)4 << 20) + 1001);
}

/* >= 16 MiB per call */
static void part_big(dctx* D) {
  static const fcclDataType_t rdt[3] = {fcclFloat32, fcclBfloat16, fcclInt8};
  static const fcclRedOp_t rop[3] = {fcclSum, fcclSum, fcclMax};
  int k, n = D->nranks;
  pr_t p;
  size_t sh[3];
  if (D->big == 1) { /* a few */
    size_t cnt = big_count(4), per = (cnt / (size_t)n) | 1u;
    fccl_pattern pat;
    pr_init(&p, fcclFloat32, fcclSum, FCCL_SCHEME_SUM, n);
    t_allreduce(D, &p.pat, &p.ref, cnt, 0);
    t_reducescatter(D, &p.pat, &p.ref, per, 1);
    pr_free(&p);
    fccl_pattern_init(&pat, fcclInt8, FCCL_SCHEME_FULL);
    t_allgather(D, &pat, (big_count(1) / (size_t)n) | 1u, 0);
    t_alltoallv(D, &pat, (big_count(1) / (size_t)n) | 1u, 2);
    fccl_pattern_free(&pat);
    return;
  }
  for (k = 0; k < 3; k++) {
    size_t esz = fccl_dt_size(rdt[k]), cnt = big_count(esz);
    size_t per = (cnt / (size_t)n) | 1u;
    pr_init(&p, rdt[k], rop[k], fccl_scheme_for_op(rop[k]), n);
    t_allreduce(D, &p.pat, &p.ref, cnt, k % 2);
    t_reducescatter(D, &p.pat, &p.ref, per, (k + 1) % 2);
    if (k == 0) {
      t_reduce(D, &p.pat, &p.ref, cnt, n - 1, 0, 0);
      t_reducescatterv(D, &p.pat, &p.ref, (cnt / (size_t)n) | 1u, 1, 1);
      t_wire(D, &p.pat, &p.ref, cnt, 1);
    }
    pr_free(&p);
  }
  for (k = 0; k < 2; k++) {
    fcclDataType_t dt = k ? fcclInt8 : fcclFloat32;
    size_t esz = fccl_dt_size(dt), cnt = big_count(esz), per = (cnt / (size_t)n) | 1u;
    fccl_pattern pat;
    fccl_pattern_init(&pat, dt, FCCL_SCHEME_FULL);
    t_broadcast(D, &pat, cnt, 0, k);
    t_allgather(D, &pat, per, k);
    t_alltoall(D, &pat, per, k);
    t_gather(D, &pat, per, n - 1, 0);
    t_scatter(D, &pat, per, 0, 1);
    if (k == 0) {
      t_alltoallv(D, &pat, (cnt / (size_t)n) | 1u, 1);
      t_sendrecv(D, &pat, cnt, 0);
      t_allgatherv(D, &pat, per, 1, 1);
      sh[0] = 3;
      sh[1] = 5;
      sh[2] = cnt / 15 / (size_t)n;
      t_allgather_axis(D, &pat, 3, sh, 1);
    }
    fccl_pattern_free(&pat);
  }
}

/* >= 16 MiB: fcclReduceScatterAxis along axis 1 and the coalesced calls (run after
 * everything else: see body()) */
static void part_big_ext(dctx* D) {
  int n = D->nranks;
  size_t cnt = big_count(4), sh[3];
  pr_t p;
  pr_init(&p, fcclFloat32, fcclSum, FCCL_SCHEME_SUM, n);
  sh[0] = 4;
  sh[1] = (size_t)n * 2;
  sh[2] = cnt / 8 / (size_t)n;
  t_reducescatter_axis(D, &p.pat, &p.ref, 3, sh, 1);
  t_allreduce_coalesced(D, &p.pat, &p.ref, 0, 0, 0, cnt);
  pr_free(&p);
  fccl_pattern_init(&p.pat, fcclFloat32, FCCL_SCHEME_FULL);
  t_broadcast_coalesced(D, &p.pat, n - 1, 0, 0, cnt);
  fccl_pattern_free(&p.pat);
}

/* A crash inside the library (a Rust abort, a segfault) names the cases the ranks of this
 * process were running: written with write(2), then the signal goes to its previous
 * handler (the default, or a sanitizer's). */
static dctx* volatile g_running[64];
static struct sigaction g_old_abrt, g_old_segv, g_old_bus;

static void wr(const char* m) {
  if (write(1, m, strlen(m)) < 0) {
  }
}

static void on_fatal(int sig) {
  int i;
  wr(sig == SIGABRT ? "\ntest_device: aborted while running:" : "\ntest_device: fatal signal while running:");
  for (i = 0; i < 64; i++) {
    dctx* D = g_running[i];
    if (D) {
      wr("\n  ");
      wr(D->what);
    }
  }
  wr("\n");
  sigaction(sig, sig == SIGABRT ? &g_old_abrt : sig == SIGSEGV ? &g_old_segv : &g_old_bus, NULL);
  if (sig == SIGABRT) raise(sig); /* else the faulting access runs again, under the old handler */
}

static void catch_fatal(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_fatal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGABRT, &sa, &g_old_abrt);
  sigaction(SIGSEGV, &sa, &g_old_segv);
  sigaction(SIGBUS, &sa, &g_old_bus);
}

/* FCCL_TEST_DEVICE_SKIP=name,name (for debugging; the same on every rank): parts not run,
 * of reducing, roots, order, moving, p2p, axis, coalesced, wire, vs_host, groups, split,
 * nonblocking, bad, local, big, and
 * the calls fcclReduceScatterAxis, fcclAllReduceCoalesced, fcclBroadcastCoalesced. */
static int part_on(const char* name) {
  const char* e = getenv("FCCL_TEST_DEVICE_SKIP");
  size_t n = strlen(name);
  while (e && *e) {
    if (strncmp(e, name, n) == 0 && (e[n] == ',' || e[n] == 0)) return 0;
    e = strchr(e, ',');
    if (e) e++;
  }
  return 1;
}

static int body(fcclComm_t comm, int rank, int nranks) {
  dctx* D = (dctx*)calloc(1, sizeof(dctx));
  int dev = -2, want, t0;
  CUresult r;
  if (!D) return 1;
  D->comm = comm;
  D->rank = rank;
  D->nranks = nranks;
  if (nranks > 64) {
    CHECK(0, "at most 64 ranks");
    free(D);
    return fccl_failures();
  }
  want = fccl_threads_mode() ? fccl_devlist()[rank] : g_proc_dev;
  CHECK_OK(fcclCommCuDevice(comm, &dev));
  CHECK(dev == want, "fcclCommCuDevice = %d, expected %d (the device %s)", dev, want,
        fccl_threads_mode() ? "of this rank's --devlist entry" : "made current before the "
        "communicator was created");
  D->dev = want; /* go on with the right device so that the ranks stay in step */
  snprintf(D->what, sizeof D->what, "setup [device %d, rank %d of %d]", D->dev, rank, nranks);
  D->ctx = ctx_of(D->dev);
  if (!D->ctx || !set_device(D->dev)) fatal("cannot make the device current");
  r = cu.StreamCreate(&D->stream, CU_STREAM_NON_BLOCKING);
  if (r != 0) {
    CHECK(0, "cuStreamCreate(CU_STREAM_NON_BLOCKING) failed: %d (%s); the async cases use the "
             "NULL stream", r, fccl_cu_name(r));
    D->stream = NULL;
  }
  pool_init(&D->host_pg, POOL_PAGEABLE, (size_t)1 << 20);
  pool_init(&D->host_pin, POOL_PINNED, (size_t)1 << 20);
  pool_init(&D->arena, POOL_DEVICE, (size_t)1 << 20);
  D->big = big_wanted(nranks);
  g_running[rank] = D;

  t0 = (int)time(NULL);

  /* the extensions that pack on the device (axis > 0, coalesced) last: a failure there
   * that breaks the context or the process leaves the rest of the report intact */
  if (part_on("reducing")) part_reducing(D);
  if (part_on("roots")) part_reduce_roots(D);
  if (part_on("order")) part_order(D);
  if (part_on("moving")) part_moving(D);
  if (part_on("wire")) part_wire(D);
  if (part_on("vs_host")) part_vs_host(D);
  t_barrier(D, MODE(MEM_ALLOC, ST_NULL));
  t_barrier(D, MODE(MEM_ALLOC, ST_ASYNC));
  if (part_on("groups")) {
    t_mixed_group(D, MODE(MEM_ARENA, ST_ASYNC));
    t_mixed_group(D, MODE(MEM_ALLOC, ST_NULL));
  }
  if (part_on("p2p")) part_p2p(D);
  if (part_on("split")) t_split(D);
  if (part_on("nonblocking")) {
    t_nonblocking(D, 0);
    t_nonblocking(D, 1);
  }
  if (part_on("bad")) {
    pr_t p;
    t_bad_inputs(D);
    /* the communicator still works after the refused calls */
    pr_init(&p, fcclFloat32, fcclSum, FCCL_SCHEME_SUM, nranks);
    t_allreduce(D, &p.pat, &p.ref, 1001, 0);
    pr_free(&p);
  }
  if (nranks == 1 && part_on("local")) t_local(D);
  if (D->big && part_on("big")) part_big(D);
  if (part_on("axis")) part_axis(D);
  if (part_on("coalesced")) part_coalesced(D);
  if (D->big == 2 && part_on("big")) part_big_ext(D);
  t_barrier(D, MODE(MEM_ARENA, ST_ASYNC));

  printf("%s: rank %d of %d (%s, device %d): %ld cases, %ld library calls, %d failed check(s), "
         "%d s%s%s%s\n", g_prog, rank, nranks, fccl_threads_mode() ? "threads" : "process", D->dev,
         D->cases, D->calls, fccl_failures(), (int)time(NULL) - t0,
         D->big == 2 ? "" : D->big ? "; only a few >= 16 MiB cases" : "; no >= 16 MiB cases",
         g_note[0] ? "; note: " : "", g_note);
  fflush(stdout);
  g_running[rank] = NULL;
  pool_destroy(&D->host_pg);
  pool_destroy(&D->host_pin);
  pool_destroy(&D->arena);
  if (D->stream) cu.StreamDestroy(D->stream);
  free(D);
  return fccl_failures();
}

int main(int argc, char** argv) {
  const char* e = getenv("FCCL_TEST_DEVICE_MODES");
  if (e && (atoi(e) == 1 || atoi(e) == 2 || atoi(e) == 4)) g_passes = atoi(e);
  fccl_set_pre_init(pre_init);
  catch_fatal();
  return fccl_main(argc, argv, body);
}
