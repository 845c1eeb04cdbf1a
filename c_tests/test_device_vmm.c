/* VMM memory GPU to GPU: buffers allocated as PyTorch's expandable segments allocate them
 * (cuMemCreate chunks with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR requested, mapped side
 * by side into one reserved range; each buffer here spans two chunks), on ranks that share
 * device 0 in separate processes.
 *
 * - Every collective (and a send/recv ring) must be served GPU to GPU (fcclCommGetLastPath
 *   says "ipc") with correct results.
 * - Running them all again exports nothing new: the library logs one INFO line per chunk
 *   it exports ("exported VMM allocation"), counted in the log file this test points
 *   FERROCCL_DEBUG_FILE at. The executor (without MPS) exports only what its ring send's
 *   receiver maps.
 * - A chunk unmapped, released and replaced by a new one at the same address (as the
 *   caching allocator does when a segment shrinks and grows) is not served from the old
 *   mapping: the results use the new chunk's data, and it is exported once.
 * - A VMM allocation made without the POSIX handle type cannot be shared: the call stays
 *   GPU to GPU, the ranks that would export it copy it through device memory the
 *   communicator lends and WARN naming CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR.
 *
 * Data goes in and out with cuMemcpy per chunk. Exits 77 (skipped) without a driver or a
 * device, or where the device has no VMM. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda_driver.h"
#include "ferroccl.h"

static int failures;
static int g_rank, g_n;
static char g_log[256];
static size_t g_gran;

#include "rank_check.h"
#define CU(call)                                             \
  do {                                                       \
    CUresult c_ = (call);                                    \
    CHECK(c_ == 0, "%s failed with CUresult %d", #call, c_); \
  } while (0)

static int skip(const char* why) {
  printf("skipped: %s\n", why);
  return 77;
}

static CUmemAllocationProp prop(int handle_types) {
  CUmemAllocationProp p;
  memset(&p, 0, sizeof p);
  p.type = 1;                             /* CU_MEM_ALLOCATION_TYPE_PINNED */
  p.requestedHandleTypes = handle_types;  /* 1: CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR */
  p.location.type = 1;                    /* CU_MEM_LOCATION_TYPE_DEVICE */
  p.location.id = 0;
  return p;
}

/* An expandable segment: `chunks` physical chunks of the granularity mapped side by side
 * at the start of a reservation twice that size, read-write for device 0. */
typedef struct {
  CUdeviceptr va;
  size_t size;
  int chunks;
  CUmemGenericAllocationHandle h[8];
} Segment;

static CUmemGenericAllocationHandle map_chunk(Segment* s, int i, int handle_types) {
  CUmemAllocationProp p = prop(handle_types);
  CUmemAccessDesc a = {{1, 0}, 3 /* CU_MEM_ACCESS_FLAGS_PROT_READWRITE */};
  CUmemGenericAllocationHandle h = 0;
  CU(cu.MemCreate(&h, g_gran, &p, 0));
  CU(cu.MemMap(s->va + (size_t)i * g_gran, g_gran, 0, h, 0));
  CU(cu.MemSetAccess(s->va + (size_t)i * g_gran, g_gran, &a, 1));
  s->h[i] = h;
  return h;
}

static Segment segment(int chunks, int handle_types) {
  Segment s;
  int i;
  memset(&s, 0, sizeof s);
  s.chunks = chunks;
  s.size = 2 * (size_t)chunks * g_gran;
  CU(cu.MemAddressReserve(&s.va, s.size, 0, 0, 0));
  for (i = 0; i < chunks; i++) map_chunk(&s, i, handle_types);
  return s;
}

static void segment_free(Segment* s) {
  int i;
  CU(cu.CtxSynchronize());
  for (i = 0; i < s->chunks; i++) {
    CU(cu.MemUnmap(s->va + (size_t)i * g_gran, g_gran));
    CU(cu.MemRelease(s->h[i]));
  }
  CU(cu.MemAddressFree(s->va, s->size));
}

/* Copies split at chunk boundaries (each copy within one mapping). */
static void put(CUdeviceptr d, const float* h, size_t n) {
  size_t bytes = n * sizeof(float), at = 0;
  while (at < bytes) {
    size_t room = g_gran - (size_t)((d + at) % g_gran), k = bytes - at < room ? bytes - at : room;
    CU(cu.MemcpyHtoD(d + at, (const char*)h + at, k));
    at += k;
  }
}
static void get(float* h, CUdeviceptr d, size_t n) {
  size_t bytes = n * sizeof(float), at = 0;
  CU(cu.CtxSynchronize());
  while (at < bytes) {
    size_t room = g_gran - (size_t)((d + at) % g_gran), k = bytes - at < room ? bytes - at : room;
    CU(cu.MemcpyDtoH((char*)h + at, d + at, k));
    at += k;
  }
}
static float in(int r, size_t i, float shift) { return (float)(r * 1000 + (int)i) + shift; }

static void expect(const char* what, const float* got, const float* want, size_t n) {
  size_t i;
  for (i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      CHECK(0, "%s: element %zu is %g, expected %g", what, i, (double)got[i], (double)want[i]);
      return;
    }
  }
}

static void path_is(fcclComm_t comm, const char* what, const char* want) {
  const char* b = NULL;
  const char* a = NULL;
  OK(fcclCommGetLastPath(comm, &b, &a));
  if (!b || !a) {
    CHECK(0, "%s: fcclCommGetLastPath left a NULL string", what);
    return;
  }
  CHECK(strcmp(b, want) == 0, "%s: served by backend %s (algorithm %s), expected %s", what, b, a, want);
}

static int log_count(const char* needle) {
  FILE* f = fopen(g_log, "r");
  char line[4096];
  int k = 0;
  if (!f) return 0;
  while (fgets(line, sizeof line, f))
    if (strstr(line, needle)) k++;
  fclose(f);
  return k;
}

static void fill(CUdeviceptr s, CUdeviceptr d, size_t big, float shift, float* h) {
  size_t i;
  for (i = 0; i < big; i++) h[i] = in(g_rank, i, shift);
  put(s, h, big);
  for (i = 0; i < big; i++) h[i] = -1;
  put(d, h, big);
}

/* Every collective with send buffer `s` and receive buffer `d`, results checked. */
static void every_collective(fcclComm_t comm, CUdeviceptr sp, CUdeviceptr dp, size_t c, float shift) {
  const int r = g_rank, n = g_n;
  const size_t big = c * (size_t)n;
  float* h = calloc(big, sizeof(float));
  float* w = calloc(big, sizeof(float));
  size_t* counts = calloc((size_t)n, sizeof(size_t));
  size_t* displs = calloc((size_t)n, sizeof(size_t));
  void* s = (void*)(size_t)sp;
  void* d = (void*)(size_t)dp;
  size_t i;
  int p;
  for (p = 0; p < n; p++) {
    counts[p] = c;
    displs[p] = (size_t)p * c;
  }
#define RUN(what, call, wantlen, wantexpr)            \
  do {                                                \
    fill(sp, dp, big, shift, h);                      \
    OK(call);                                         \
    path_is(comm, what, "ipc");                       \
    get(h, dp, wantlen);                              \
    for (i = 0; i < (wantlen); i++) w[i] = (wantexpr); \
    expect(what, h, w, wantlen);                      \
  } while (0)
#define SUM(j) ((float)n * shift + (float)(1000 * n * (n - 1) / 2) + (float)n * (float)(j))
  RUN("all_reduce", fcclAllReduce(s, d, c, fcclFloat32, fcclSum, comm, NULL), c, SUM(i));
  RUN("broadcast", fcclBroadcast(s, d, c, fcclFloat32, n - 1, comm, NULL), c, in(n - 1, i, shift));
  RUN("reduce", fcclReduce(s, d, c, fcclFloat32, fcclMax, 0, comm, NULL), r == 0 ? c : 0, in(n - 1, i, shift));
  RUN("all_gather", fcclAllGather(s, d, c, fcclFloat32, comm, NULL), big, in((int)(i / c), i % c, shift));
  RUN("reduce_scatter", fcclReduceScatter(s, d, c, fcclFloat32, fcclSum, comm, NULL), c, SUM((size_t)r * c + i));
  RUN("gather", fcclGather(s, d, c, fcclFloat32, 0, comm, NULL), r == 0 ? big : 0, in((int)(i / c), i % c, shift));
  RUN("scatter", fcclScatter(s, d, c, fcclFloat32, 0, comm, NULL), c, in(0, (size_t)r * c + i, shift));
  RUN("all_to_all", fcclAlltoAll(s, d, c, fcclFloat32, comm, NULL), big,
      in((int)(i / c), (size_t)r * c + i % c, shift));
  RUN("all_gather_v", fcclAllGatherV(s, c, d, counts, displs, fcclFloat32, comm, NULL), big,
      in((int)(i / c), i % c, shift));
  RUN("reduce_scatter_v", fcclReduceScatterV(s, counts, displs, d, fcclFloat32, fcclSum, comm, NULL), c,
      SUM((size_t)r * c + i));
  RUN("all_to_allv", fcclAlltoAllv(s, counts, displs, d, counts, displs, fcclFloat32, comm, NULL), big,
      in((int)(i / c), (size_t)r * c + i % c, shift));
  fill(sp, dp, big, shift, h);
  OK(fcclGroupStart());
  OK(fcclSend(s, c, fcclFloat32, (r + 1) % n, comm, NULL));
  OK(fcclRecv(d, c, fcclFloat32, (r + n - 1) % n, comm, NULL));
  OK(fcclGroupEnd());
  path_is(comm, "send/recv ring", "ipc");
  get(h, dp, c);
  for (i = 0; i < c; i++) w[i] = in((r + n - 1) % n, i, shift);
  expect("send/recv ring", h, w, c);
#undef RUN
#undef SUM
  free(h);
  free(w);
  free(counts);
  free(displs);
}

int main(void) {
  const char* why;
  CUdevice dev = 0;
  int vmm = 0, fds = 0, mps, exports_to_peers, first, again, after;
  fcclComm_t comm = NULL;
  const size_t c = 1000;
  Segment seg;
  CUdeviceptr s, d;
  snprintf(g_log, sizeof g_log, "/tmp/fccl-test-vmm-%d.log", (int)getpid());
  unlink(g_log);
  setenv("FERROCCL_DEBUG_FILE", g_log, 1);
  setenv("FERROCCL_DEBUG", "INFO", 1);
  if ((why = fccl_cu_load(RTLD_LOCAL, FCCL_CU_BASE | FCCL_CU_VMM)) || (why = fccl_cu_device0(NULL))) return skip(why);
  if (cu.DeviceGet(&dev, 0) != 0) return skip("device 0 unusable");
  /* CU_DEVICE_ATTRIBUTE_VIRTUAL_ADDRESS_MANAGEMENT_SUPPORTED, _HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED */
  if (cu.DeviceGetAttribute(&vmm, 102, dev) != 0 || !vmm) return skip("the device has no VMM");
  if (cu.DeviceGetAttribute(&fds, 103, dev) != 0 || !fds) return skip("the device has no POSIX fd handles");
  if (!getenv("FERROCCL_RANK")) return skip("start it with ferroccl-run -n N (N >= 2)");
  {
    /* With the GPU-to-GPU path off every call is staged: what this test is about is gone
     * (and the simulator refuses a copy across two mappings, which staging would make). */
    const char* ipc = getenv("FERROCCL_CUDA_IPC");
    if (ipc && (strcmp(ipc, "0") == 0 || strcmp(ipc, "off") == 0))
      return skip("FERROCCL_CUDA_IPC turns off the GPU-to-GPU path this test is about");
  }
  {
    CUmemAllocationProp p = prop(1);
    if (cu.MemGetAllocationGranularity(&g_gran, &p, 0) != 0 || g_gran == 0) return skip("no granularity");
  }
  OK(fcclCommInitFromEnv(&comm));
  if (failures) return 1;
  OK(fcclCommUserRank(comm, &g_rank));
  OK(fcclCommCount(comm, &g_n));
  mps = getenv("FERROCCL_CUDA_MPS") && strcmp(getenv("FERROCCL_CUDA_MPS"), "1") == 0;
  exports_to_peers = mps || g_rank != 0;

  /* Four chunks; s spans chunks 0 and 1, d spans chunks 2 and 3. */
  seg = segment(4, 1);
  s = seg.va + g_gran - c * sizeof(float) * (size_t)g_n / 2;
  d = seg.va + 3 * g_gran - c * sizeof(float) * (size_t)g_n / 2;
  every_collective(comm, s, d, c, 0);
  first = log_count("exported VMM allocation");
  /* Every rank's ring send is mapped by its successor; the collectives' buffers only by
   * the executor (or everyone under MPS). */
  CHECK(first >= (exports_to_peers ? 4 : 1), "%d chunks exported on the first pass", first);
  every_collective(comm, s, d, c, 0.5f);
  again = log_count("exported VMM allocation");
  CHECK(again == first, "the second pass exported %d more chunks: mappings must be reused", again - first);

  /* Chunk 1 (the upper part of s) freed and replaced at the same address. */
  CU(cu.CtxSynchronize());
  CU(cu.MemUnmap(seg.va + g_gran, g_gran));
  CU(cu.MemRelease(seg.h[1]));
  map_chunk(&seg, 1, 1);
  every_collective(comm, s, d, c, 7);
  after = log_count("exported VMM allocation");
  /* The ring's send lies in chunk 0: the executor (without MPS) exports nothing anew. */
  CHECK(after == again + (exports_to_peers ? 1 : 0), "%d chunks exported after the new chunk (%d before)", after,
        again);
  segment_free(&seg);

  /* Without the POSIX handle type: still GPU to GPU, the ranks that export copying it
   * through lent device memory and saying why. */
  {
    Segment bad = segment(1, 0);
    float* h = calloc(c, sizeof(float));
    size_t i;
    for (i = 0; i < c; i++) h[i] = in(g_rank, i, 0);
    put(bad.va, h, c);
    OK(fcclAllReduce((void*)(size_t)bad.va, (void*)(size_t)(bad.va + c * sizeof(float)), c, fcclFloat32, fcclSum,
                     comm, NULL));
    path_is(comm, "all_reduce without the POSIX handle type", "ipc");
    get(h, bad.va + c * sizeof(float), c);
    for (i = 0; i < c; i++) {
      float want = (float)(1000 * g_n * (g_n - 1) / 2) + (float)g_n * (float)i;
      if (h[i] != want) {
        CHECK(0, "all_reduce without the POSIX handle type: element %zu is %g, expected %g", i, (double)h[i],
              (double)want);
        break;
      }
    }
    if (exports_to_peers)
      CHECK(log_count("stays GPU to GPU, but its buffer") >= 1 &&
                log_count("CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR") >= 1,
            "no WARN naming CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR in %s", g_log);
    CHECK(log_count("goes through host staging") == 0, "the call was staged (%s)", g_log);
    free(h);
    segment_free(&bad);
  }
  OK(fcclCommDestroy(comm));
  if (failures) {
    fprintf(stderr, "rank %d: %d failures (log: %s)\n", g_rank, failures, g_log);
    return 1;
  }
  unlink(g_log);
  printf("rank %d/%d: every collective on VMM memory spanning two chunks went GPU to GPU (%d exports)\n", g_rank, g_n,
         after);
  return 0;
}
