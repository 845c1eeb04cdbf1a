/* The cost model: what each collective asks of a GPU shared by every rank, per call,
 * held to the roofline's budget on the simulated GPU.
 *
 * Every rank selects device 0, so the GPU-to-GPU path serves every call. Each
 * collective runs twice (buffers repeat: what is set up once per buffer is done), then
 * once more between two readings of the simulated driver's counters (simgpuGetCosts,
 * an export of the simulated driver alone: on a real driver this test skips). The
 * ranks' counts are summed (bytes, launches) or maxed (per-rank costs) over a host
 * all_reduce and rank 0 prints one row per collective:
 *
 *   HBM traffic   bytes read and written in device memory by every rank's kernels and
 *                 copies, against the least any implementation moves (S: nccl-tests'
 *                 size; all_reduce 2nS, reduce_scatter and all_gather (n+1)S, all_to_all
 *                 2nS, broadcast and reduce (n+1)S, gather and scatter 2S)
 *   launches      kernel launches and driver copies, all ranks together
 *   memops        stream memory operations (waits and writes of values), all ranks
 *   blocking      host-blocking driver calls (synchronisations, synchronous copies,
 *                 frees) on the busiest rank
 *   driver        driver calls on the busiest rank
 *   blocks        thread blocks of the launches' grids, all ranks together
 *   exchanges     host exchanges with the other ranks besides the data
 *                 (fcclCommGetLastExchanges): the executor's (rank 0), then the busiest
 *                 other rank's
 *
 * Held: traffic <= 1.05x the minimum (in-place all_to_all: 2(n-1)S, each rank's own
 * block stays) and one launch per call (reduce_scatter_v included: its rows, each with
 * its own inputs and count, go in one launch up to 19 ranks), 3n - 2 stream
 * memory operations (each other rank writes its ready and waits for done; the
 * executor waits for each ready and writes done; posted, 3n - 1: rank 0's stream waits
 * for done too, which its proxy thread's stream writes); with FERROCCL_CUDA_MPS=1 (every rank
 * moves its share) one launch per rank and 2n^2 memory operations (each rank writes a
 * ready and a fin and waits for every other rank's; posted, n(2n + 1): each caller's
 * stream waits for its own fin too, which its proxy thread's stream writes); no blocking
 * call, no kernel the model does not know, driver calls per call that do not grow
 * with the number of live allocations (measured again after 64 more), and a large
 * all_reduce's grid sized from the device: its SMs times the 256-thread blocks one SM
 * holds (the driver's MULTIPROCESSOR_COUNT and MAX_THREADS_PER_MULTIPROCESSOR).
 *
 * Host exchanges: by default (checkMode unset) and with FERROCCL_CHECK=0 the ranks post
 * their descriptors instead of exchanging them once the first call on device memory
 * agreed on it, and rank 0's proxy thread reads them (under MPS every rank's, each
 * enqueuing its share): every rank is held to none (the roofline's budget). With
 * FERROCCL_CHECK=1 (checkMode fingerprint, asked for) every call is agreed first: one
 * exchange per call, the descriptor exchange. The last line says which held. A proxy
 * thread enqueues a posted call after it returned, so each call is measured up to a
 * synchronisation, less what a bare synchronisation costs.
 *
 * Start with ferroccl-run -n N (N >= 2) under scripts/sim-gpu.sh. */
#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferroccl.h"

typedef int CUresult;
static CUresult (*cuInit)(unsigned);
static CUresult (*cuDeviceGetCount)(int*);
static CUresult (*cuDevicePrimaryCtxRetain)(void**, int);
static CUresult (*cuCtxSetCurrent)(void*);
static CUresult (*cuCtxSynchronize)(void);
static CUresult (*cuDeviceGetAttribute)(int*, int, int);
static unsigned (*simgpuGetCosts)(unsigned long long*, unsigned);

/* simgpuGetCosts's order (tools/simgpu/src/costs.rs). */
enum { C_DRIVER, C_BLOCKING, C_LAUNCHES, C_COPIES, C_MEMOPS, C_READ, C_WRITTEN, C_UNMODELLED, C_BLOCKS, C_N };
/* After the driver's counters: the library's own (fcclCommGetLastExchanges). */
enum { C_EXCHANGES = C_N, C_EXCHANGES_OTHERS, C_ALL };

static int failures, g_rank, g_n, g_mps, g_posting;

#include "rank_check.h"

static int load_driver(void) {
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return 0;
  /* POSIX's way to turn dlsym's void* into a function pointer without a cast. */
  *(void**)(&cuInit) = dlsym(h, "cuInit");
  *(void**)(&cuDeviceGetCount) = dlsym(h, "cuDeviceGetCount");
  *(void**)(&cuDevicePrimaryCtxRetain) = dlsym(h, "cuDevicePrimaryCtxRetain");
  *(void**)(&cuCtxSetCurrent) = dlsym(h, "cuCtxSetCurrent");
  *(void**)(&cuCtxSynchronize) = dlsym(h, "cuCtxSynchronize");
  *(void**)(&cuDeviceGetAttribute) = dlsym(h, "cuDeviceGetAttribute");
  *(void**)(&simgpuGetCosts) = dlsym(h, "simgpuGetCosts");
  return cuInit && cuDeviceGetCount && cuDevicePrimaryCtxRetain && cuCtxSetCurrent && cuCtxSynchronize &&
         cuDeviceGetAttribute;
}

enum Kind { ALL_REDUCE, ALL_REDUCE_IN_PLACE, REDUCE_SCATTER, ALL_GATHER, ALL_TO_ALL, ALL_TO_ALL_IN_PLACE,
            BROADCAST, REDUCE, GATHER, SCATTER, ALL_GATHER_V, ALL_TO_ALLV, REDUCE_SCATTER_V, KINDS };
static const char* const NAMES[KINDS] = {
    "all_reduce",     "all_reduce in place", "reduce_scatter", "all_gather",   "all_to_all",
    "all_to_all in place", "broadcast",     "reduce",         "gather",       "scatter",
    "all_gather_v",   "all_to_allv",         "reduce_scatter_v"};

#define C ((size_t)64 << 10) /* elements per rank and block: 256 KiB of float32 */

static float *g_s, *g_d;
static size_t *g_counts, *g_displs;

static void call(fcclComm_t comm, int k) {
  const size_t c = C;
  switch (k) {
  case ALL_REDUCE: OK(fcclAllReduce(g_s, g_d, c, fcclFloat32, fcclSum, comm, NULL)); break;
  case ALL_REDUCE_IN_PLACE: OK(fcclAllReduce(g_d, g_d, c, fcclFloat32, fcclSum, comm, NULL)); break;
  case REDUCE_SCATTER: OK(fcclReduceScatter(g_s, g_d, c, fcclFloat32, fcclSum, comm, NULL)); break;
  case ALL_GATHER: OK(fcclAllGather(g_s, g_d, c, fcclFloat32, comm, NULL)); break;
  case ALL_TO_ALL: OK(fcclAlltoAll(g_s, g_d, c, fcclFloat32, comm, NULL)); break;
  case ALL_TO_ALL_IN_PLACE: OK(fcclAlltoAll(g_d, g_d, c, fcclFloat32, comm, NULL)); break;
  case BROADCAST: OK(fcclBroadcast(g_s, g_d, c, fcclFloat32, g_n - 1, comm, NULL)); break;
  case REDUCE: OK(fcclReduce(g_s, g_d, c, fcclFloat32, fcclSum, 0, comm, NULL)); break;
  case GATHER: OK(fcclGather(g_s, g_d, c, fcclFloat32, 0, comm, NULL)); break;
  case SCATTER: OK(fcclScatter(g_s, g_d, c, fcclFloat32, 0, comm, NULL)); break;
  case ALL_GATHER_V: OK(fcclAllGatherV(g_s, c, g_d, g_counts, g_displs, fcclFloat32, comm, NULL)); break;
  case ALL_TO_ALLV:
    OK(fcclAlltoAllv(g_s, g_counts, g_displs, g_d, g_counts, g_displs, fcclFloat32, comm, NULL));
    break;
  case REDUCE_SCATTER_V:
    OK(fcclReduceScatterV(g_s, g_counts, g_displs, g_d, fcclFloat32, fcclSum, comm, NULL));
    break;
  }
}

/* The least HBM traffic of kind k, in bytes (S as nccl-tests defines it). */
static double minimum(int k) {
  const double n = g_n, blk = (double)C * sizeof(float), all = blk * n;
  switch (k) {
  case ALL_REDUCE: case ALL_REDUCE_IN_PLACE: return 2 * n * blk;
  case REDUCE_SCATTER: case REDUCE_SCATTER_V: case ALL_GATHER: case ALL_GATHER_V: return (n + 1) * all;
  case ALL_TO_ALL: case ALL_TO_ALLV: return 2 * n * all;
  case ALL_TO_ALL_IN_PLACE: return 2 * (n - 1) * all; /* each rank's own block stays */
  case BROADCAST: case REDUCE: return (n + 1) * blk;
  default: return 2 * all; /* gather, scatter */
  }
}

/* What one cuCtxSynchronize with nothing queued costs, counter by counter. */
static void sync_costs(unsigned long long* sync) {
  unsigned long long x[C_N], y[C_N];
  int i;
  simgpuGetCosts(x, C_N);
  CHECK(cuCtxSynchronize() == 0, "cuCtxSynchronize");
  simgpuGetCosts(y, C_N);
  for (i = 0; i < C_N; i++) sync[i] = y[i] - x[i];
}

/* One call of kind k between two readings; sums[] and maxes[] over all ranks; the
 * backend and algorithm that served it. */
static void measure(fcclComm_t comm, int k, unsigned long long* sums, unsigned long long* maxes, const char** b,
                    const char** a) {
  unsigned long long x[C_N], y[C_N], d[C_ALL], sync[C_N];
  int i, exchanges = -1;
  /* Three calls first, each run to the end: what the first ones left to do later (a
   * mapping evicted for this call's buffers, closed once the GPU is past its last use)
   * is done before the reading. */
  for (i = 0; i < 3; i++) {
    call(comm, k);
    CHECK(cuCtxSynchronize() == 0, "cuCtxSynchronize");
  }
  sync_costs(sync);
  simgpuGetCosts(x, C_N);
  call(comm, k);
  /* Proxy threads enqueue posted calls after the call returned: all of it
   * is in once the GPU ran the call. The synchronisation's own costs are taken off. */
  CHECK(cuCtxSynchronize() == 0, "cuCtxSynchronize");
  simgpuGetCosts(y, C_N);
  OK(fcclCommGetLastPath(comm, b, a));
  OK(fcclCommGetLastExchanges(comm, &exchanges));
  for (i = 0; i < C_N; i++) d[i] = y[i] - x[i] - sync[i];
  d[C_EXCHANGES] = g_rank == 0 ? (unsigned long long)exchanges : 0;
  d[C_EXCHANGES_OTHERS] = g_rank == 0 ? 0 : (unsigned long long)exchanges;
  OK(fcclAllReduce(d, sums, C_ALL, fcclUint64, fcclSum, comm, NULL));
  OK(fcclAllReduce(d, maxes, C_ALL, fcclUint64, fcclMax, comm, NULL));
}

int main(void) {
  void* ctx = NULL;
  int ndev = 0, k, i;
  fcclComm_t comm = NULL;
  unsigned long long sums[C_ALL], maxes[C_ALL];
  unsigned long long driver_before = 0, most_exchanges = 0, most_others = 0;
  {
    /* With the GPU-to-GPU path off every call is staged and synchronous: nothing to test. */
    const char* ipc = getenv("FERROCCL_CUDA_IPC");
    if (ipc && (strcmp(ipc, "0") == 0 || strcmp(ipc, "off") == 0)) {
      printf("skipped: FERROCCL_CUDA_IPC=%s turns off the GPU-to-GPU path this test is about\n", ipc);
      return 77;
    }
  }
  if (!load_driver() || cuInit(0) != 0 || cuDeviceGetCount(&ndev) != 0 || ndev == 0) {
    printf("skipped: no CUDA driver or device\n");
    return 77;
  }
  if (!simgpuGetCosts) {
    printf("skipped: the cost model needs the simulated GPU (scripts/sim-gpu.sh): this driver has no simgpuGetCosts\n");
    return 77;
  }
  if (!getenv("FERROCCL_RANK")) {
    printf("skipped: start it with ferroccl-run -n N (N >= 2)\n");
    return 77;
  }
  if (cuDevicePrimaryCtxRetain(&ctx, 0) != 0 || cuCtxSetCurrent(ctx) != 0) {
    printf("skipped: device 0 unusable\n");
    return 77;
  }
  {
    const char* mps = getenv("FERROCCL_CUDA_MPS");
    const char* check = getenv("FERROCCL_CHECK");
    g_mps = mps && strcmp(mps, "1") == 0;
    /* Descriptors posted, not exchanged, unless every call is to be agreed. */
    g_posting = !(check && strcmp(check, "1") == 0);
  }
  OK(fcclCommInitFromEnv(&comm));
  if (failures) return 1;
  OK(fcclCommUserRank(comm, &g_rank));
  OK(fcclCommCount(comm, &g_n));
  OK(fcclMemAlloc((void**)&g_s, C * (size_t)g_n * sizeof(float)));
  OK(fcclMemAlloc((void**)&g_d, C * (size_t)g_n * sizeof(float)));
  g_counts = calloc((size_t)g_n, sizeof(size_t));
  g_displs = calloc((size_t)g_n, sizeof(size_t));
  for (i = 0; i < g_n; i++) {
    g_counts[i] = C;
    g_displs[i] = (size_t)i * C;
  }
  if (failures) return 1;
  if (g_rank == 0)
    printf("%d ranks on one simulated GPU, %zu KiB per rank and block, per call%s:\n"
           "%-20s %-18s %-10s %-6s %-8s %-6s %-8s %-12s %s\n",
           g_n, C * sizeof(float) >> 10,
           g_posting ? " (descriptors posted)" : " (FERROCCL_CHECK=1: every call agreed)", "collective", "algorithm",
           "traffic", "x min", "launches", "memops", "blocking", "driver calls", "exchanges (0/others)");
  for (k = 0; k < KINDS; k++) {
    const char* b = "?";
    const char* a = "?";
    double traffic, ratio;
    unsigned long long launches;
    /* Under MPS every rank moves its share: one launch each, and the streams order
     * themselves with a ready and a fin per rank, each waited for by every other. */
    unsigned long long launch_budget = g_mps ? (unsigned long long)g_n : 1;
    /* Past 19 ranks the rows of reduce_scatter_v overflow one launch's input table
     * (IN_TABLE, kernels/src/cuda_kernels.rs: 379 pointers): as few launches as hold them. */
    if (k == REDUCE_SCATTER_V && !g_mps && g_n * g_n > 379)
      launch_budget = (unsigned long long)((g_n + 379 / g_n - 1) / (379 / g_n));
    /* Posted: rank 0's stream also waits for done (its proxy's stream writes it); under
     * MPS each caller's stream waits for every fin, its own included. */
    unsigned long long nn = (unsigned long long)g_n;
    unsigned long long memop_budget =
        g_mps ? (g_posting ? nn * (2 * nn + 1) : 2 * nn * nn) : g_posting ? 3 * nn - 1 : 3 * nn - 2;
    measure(comm, k, sums, maxes, &b, &a);
    traffic = (double)(sums[C_READ] + sums[C_WRITTEN]);
    ratio = traffic / minimum(k);
    launches = sums[C_LAUNCHES] + sums[C_COPIES];
    if (g_rank == 0)
      printf("%-20s %-18s %6.2f MiB %5.2fx %8llu %6llu %8llu %-12llu %llu/%llu\n", NAMES[k], a,
             traffic / 1048576.0, ratio, launches, sums[C_MEMOPS], maxes[C_BLOCKING], maxes[C_DRIVER],
             maxes[C_EXCHANGES], maxes[C_EXCHANGES_OTHERS]);
    CHECK(strcmp(b, "ipc") == 0, "%s: served by %s/%s, not the GPU-to-GPU path", NAMES[k], b, a);
    CHECK(sums[C_UNMODELLED] == 0, "%s: %llu launches of kernels the cost model does not know", NAMES[k],
          sums[C_UNMODELLED]);
    CHECK(maxes[C_BLOCKING] == 0, "%s: %llu host-blocking driver calls in one call", NAMES[k], maxes[C_BLOCKING]);
    CHECK(sums[C_MEMOPS] <= memop_budget, "%s: %llu stream memory operations, the budget is %llu", NAMES[k],
          sums[C_MEMOPS], memop_budget);
    CHECK(launches <= launch_budget, "%s: %llu launches, the budget is %llu", NAMES[k], launches, launch_budget);
    CHECK(ratio <= 1.05, "%s: %.0f bytes of HBM traffic, %.2fx the least (%.0f); the budget is 1.05x", NAMES[k],
          traffic, ratio, minimum(k));
    CHECK(maxes[C_EXCHANGES] <= 1 && maxes[C_EXCHANGES_OTHERS] <= 1,
          "%s: %llu/%llu host exchanges between the ranks in one call, the budget is 1", NAMES[k],
          maxes[C_EXCHANGES], maxes[C_EXCHANGES_OTHERS]);
    CHECK(!g_posting || (maxes[C_EXCHANGES] == 0 && maxes[C_EXCHANGES_OTHERS] == 0),
          "%s: %llu/%llu host exchanges per call with posted descriptors; the budget is none (proxy threads read the "
          "posts)",
          NAMES[k], maxes[C_EXCHANGES], maxes[C_EXCHANGES_OTHERS]);
    if (maxes[C_EXCHANGES] > most_exchanges) most_exchanges = maxes[C_EXCHANGES];
    if (maxes[C_EXCHANGES_OTHERS] > most_others) most_others = maxes[C_EXCHANGES_OTHERS];
    if (k == ALL_REDUCE) driver_before = maxes[C_DRIVER];
  }
  if (!g_mps) {
    /* Enough elements for more than one block per thread of the device: the grid is the
     * device filled once, whatever the size. */
    int sms = 0, threads = 0;
    size_t big = (size_t)4 << 20, j;
    float *s = NULL, *d = NULL;
    unsigned long long x[C_N], y[C_N], got[C_N], sync[C_N], full;
    CHECK(cuDeviceGetAttribute(&sms, 16 /* MULTIPROCESSOR_COUNT */, 0) == 0 &&
              cuDeviceGetAttribute(&threads, 39 /* MAX_THREADS_PER_MULTIPROCESSOR */, 0) == 0,
          "cuDeviceGetAttribute");
    full = (unsigned long long)sms * (unsigned long long)(threads / 256);
    OK(fcclMemAlloc((void**)&s, big * sizeof(float)));
    OK(fcclMemAlloc((void**)&d, big * sizeof(float)));
    for (j = 0; j < 2; j++) OK(fcclAllReduce(s, d, big, fcclFloat32, fcclSum, comm, NULL));
    CHECK(cuCtxSynchronize() == 0, "cuCtxSynchronize");
    sync_costs(sync);
    simgpuGetCosts(x, C_N);
    OK(fcclAllReduce(s, d, big, fcclFloat32, fcclSum, comm, NULL));
    CHECK(cuCtxSynchronize() == 0, "cuCtxSynchronize");
    simgpuGetCosts(y, C_N);
    for (j = 0; j < C_N; j++) got[j] = y[j] - x[j] - sync[j];
    OK(fcclAllReduce(got, sums, C_N, fcclUint64, fcclSum, comm, NULL));
    if (g_rank == 0)
      printf("all_reduce of %zu MiB per rank: %llu launch(es) of %llu blocks in all; the device holds %d SMs x %d "
             "blocks of 256 threads = %llu\n",
             big * sizeof(float) >> 20, sums[C_LAUNCHES], sums[C_BLOCKS], sms, threads / 256, full);
    CHECK(sums[C_LAUNCHES] == 1 && sums[C_BLOCKS] == full,
          "all_reduce of %zu floats: %llu launches of %llu blocks in all, expected one of %llu (the device filled once)",
          big, sums[C_LAUNCHES], sums[C_BLOCKS], full);
    OK(fcclMemFree(s));
    OK(fcclMemFree(d));
  }
  {
    /* Driver calls must not grow with the live allocations of the process, each one
     * used in a call (so shared with the peers) first. */
    void* more[64];
    const char* b = "?";
    const char* a = "?";
    for (i = 0; i < 64; i++) {
      OK(fcclMemAlloc(&more[i], 4096));
      OK(fcclAllReduce(more[i], more[i], 1024, fcclFloat32, fcclSum, comm, NULL));
    }
    measure(comm, ALL_REDUCE, sums, maxes, &b, &a);
    if (g_rank == 0)
      printf("all_reduce with 64 more live allocations: %llu driver calls on the busiest rank (before: %llu)\n",
             maxes[C_DRIVER], driver_before);
    /* A call checks up to 4 of the rank's shared allocations for frees (2 before). */
    CHECK(maxes[C_DRIVER] <= driver_before + 2,
          "all_reduce: %llu driver calls with 64 more live allocations, against %llu: the per-call work grows "
          "with the allocations",
          maxes[C_DRIVER], driver_before);
    for (i = 0; i < 64; i++) OK(fcclMemFree(more[i]));
  }
  OK(fcclMemFree(g_s));
  OK(fcclMemFree(g_d));
  OK(fcclCommDestroy(comm));
  free(g_counts);
  free(g_displs);
  if (failures) {
    fprintf(stderr, "rank %d: %d budgets missed\n", g_rank, failures);
    return 1;
  }
  if (g_rank == 0) {
    printf("every collective within its budget at %d ranks\n", g_n);
    if (most_others > 0)
      printf("%llu host exchange(s) between the ranks per call with repeated buffers: FERROCCL_CHECK=1 agrees on "
             "every call before it is enqueued, as asked (by default the descriptors are posted: none)\n",
             most_others);
    else if (most_exchanges > 0)
      printf("not met yet: rank 0 waits on the host for the other ranks' posted descriptors, %llu time(s) per "
             "call (the other ranks wait for nothing); the roofline's budget is none\n",
             most_exchanges);
    else
      printf("no host exchange between the ranks per call with repeated buffers on any rank (descriptors posted, "
             "%s): the roofline's budget holds\n",
             g_mps ? "every rank's proxy thread reads them" : "rank 0's proxy thread reads them");
  }
  return 0;
}
