/*
 * An NCCL program written the way nccl-tests writes them, built against the installed
 * <nccl.h> and linked with -lnccl (tests/nccl/run.sh): optional functions declared weak
 * and probed with dlsym, a weak fallback of ncclGetLastError, nothing of ferroccl's.
 * Host memory (ferroccl takes host pointers through the same API).
 *
 *   nccl_style                  one rank
 *   nccl_style --threads N      N threads, ncclGetUniqueId + ncclCommInitRank(Config) each
 *   nccl_style --initall N      ncclCommInitAll, one thread driving N ranks in groups
 *   nccl_style --group N        the same with ncclCommInitRank inside a group (nccl-tests)
 *   ferroccl-run -n N nccl_style   N processes; the id comes from FERROCCL_UNIQUE_ID
 *
 * Checks every collective (AllReduce with every operator on several types, Broadcast,
 * Bcast, Reduce, AllGather, ReduceScatter, AlltoAll, Gather, Scatter, Send/Recv in
 * groups), PreMulSum operators, CommSplit and error paths. Exit 0 when every check passed.
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* nccl-tests' style: functions newer than the oldest NCCL supported are weak, and
 * their presence is probed at run time. */
#pragma weak ncclCommWindowRegister
#pragma weak ncclCommWindowDeregister
#pragma weak ncclGroupSimulateEnd
#pragma weak ncclCommShrink
extern ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win,
                                           int winFlags);
extern ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/* The weak fallback nccl-tests defines for libraries without ncclGetLastError. As with
 * NVIDIA's library, the executable's own definition is the one its calls reach. */
__attribute__((weak)) const char* ncclGetLastError(ncclComm_t comm) {
  (void)comm;
  return "(ncclGetLastError fallback of the program)";
}

static pthread_mutex_t print_lock = PTHREAD_MUTEX_INITIALIZER;
static int failures_total = 0;

#define CHECK(rank, cond, ...)                                        \
  do {                                                                \
    (*checks)++;                                                      \
    if (!(cond)) {                                                    \
      pthread_mutex_lock(&print_lock);                                \
      failures_total++;                                               \
      fprintf(stderr, "rank %d: FAIL %s:%d: ", rank, __FILE__, __LINE__); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
      pthread_mutex_unlock(&print_lock);                              \
    }                                                                 \
  } while (0)

#define NCCLOK(rank, call)                                                               \
  do {                                                                                   \
    ncclResult_t r_ = (call);                                                            \
    CHECK(rank, r_ == ncclSuccess, "%s: %s (%s)", #call, ncclGetErrorString(r_),         \
          pncclGetLastError(NULL));                                                      \
  } while (0)

/* Non-blocking communicators, as nccl-tests drives them: a call that returns
 * ncclInProgress is followed by polling ncclCommGetAsyncError until the communicator
 * leaves that state; its final state is the call's result. Blocking ones never return
 * ncclInProgress, so the same code serves both. */
static ncclResult_t settle(ncclComm_t comm, ncclResult_t r) {
  ncclResult_t st = ncclInProgress;
  if (r != ncclInProgress) return r;
  do {
    r = ncclCommGetAsyncError(comm, &st);
    if (r != ncclSuccess) return r;
  } while (st == ncclInProgress);
  return st;
}

#define NCCLDO(rank, comm, call)                                                         \
  do {                                                                                   \
    ncclResult_t r_ = (call);                                                            \
    r_ = settle((comm), r_);                                                             \
    CHECK(rank, r_ == ncclSuccess, "%s: %s (%s)", #call, ncclGetErrorString(r_),         \
          pncclGetLastError(NULL));                                                      \
  } while (0)

/* ------------------------------------------------------------------ element types */

static uint16_t f32_to_f16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = (int32_t)((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (f == 0.0f) return (uint16_t)sign;
  if (exp <= 0 || exp >= 31) return (uint16_t)(sign | 0x7c00u); /* not used by the values here */
  return (uint16_t)(sign | ((uint32_t)exp << 10) | (mant >> 13));
}
static float f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu;
  uint32_t x = exp == 0 ? sign : (sign | ((exp - 15 + 127) << 23) | (mant << 13));
  float f;
  memcpy(&f, &x, 4);
  return f;
}
static uint16_t f32_to_bf16(float f) {
  uint32_t x;
  memcpy(&x, &f, 4);
  return (uint16_t)(x >> 16);
}
static float bf16_to_f32(uint16_t h) {
  uint32_t x = (uint32_t)h << 16;
  float f;
  memcpy(&f, &x, 4);
  return f;
}

static void put(ncclDataType_t t, void* buf, size_t i, double v) {
  switch (t) {
    case ncclInt8: ((int8_t*)buf)[i] = (int8_t)v; break;
    case ncclUint8: ((uint8_t*)buf)[i] = (uint8_t)v; break;
    case ncclInt32: ((int32_t*)buf)[i] = (int32_t)v; break;
    case ncclUint32: ((uint32_t*)buf)[i] = (uint32_t)v; break;
    case ncclInt64: ((int64_t*)buf)[i] = (int64_t)v; break;
    case ncclUint64: ((uint64_t*)buf)[i] = (uint64_t)v; break;
    case ncclFloat16: ((uint16_t*)buf)[i] = f32_to_f16((float)v); break;
    case ncclBfloat16: ((uint16_t*)buf)[i] = f32_to_bf16((float)v); break;
    case ncclFloat32: ((float*)buf)[i] = (float)v; break;
    default: ((double*)buf)[i] = v; break;
  }
}
static double get(ncclDataType_t t, const void* buf, size_t i) {
  switch (t) {
    case ncclInt8: return ((const int8_t*)buf)[i];
    case ncclUint8: return ((const uint8_t*)buf)[i];
    case ncclInt32: return ((const int32_t*)buf)[i];
    case ncclUint32: return ((const uint32_t*)buf)[i];
    case ncclInt64: return (double)((const int64_t*)buf)[i];
    case ncclUint64: return (double)((const uint64_t*)buf)[i];
    case ncclFloat16: return f16_to_f32(((const uint16_t*)buf)[i]);
    case ncclBfloat16: return bf16_to_f32(((const uint16_t*)buf)[i]);
    case ncclFloat32: return ((const float*)buf)[i];
    default: return ((const double*)buf)[i];
  }
}
static int is_int(ncclDataType_t t) { return t <= ncclUint64; }

/* Small values keep every reduction exact: 1 or 2. */
static double val(int rank, size_t i) { return (double)(1 + (int)((rank + (int)i) % 2)); }

/* ------------------------------------------------------------------ one rank's checks */

#define N 37

static void collectives(ncclComm_t comm, int rank, int n, int* checks) {
  static const ncclDataType_t types[] = {ncclInt8, ncclUint8, ncclInt32, ncclUint64, ncclFloat16,
                                         ncclBfloat16, ncclFloat32, ncclFloat64};
  static const ncclRedOp_t ops[] = {ncclSum, ncclProd, ncclMax, ncclMin, ncclAvg};
  unsigned char* send = calloc((size_t)n * N, 8);
  unsigned char* recv = calloc((size_t)n * N, 8);
  size_t ti, oi, i;
  int p;

  for (ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
    ncclDataType_t t = types[ti];
    for (oi = 0; oi < sizeof ops / sizeof ops[0]; oi++) {
      ncclRedOp_t op = ops[oi];
      int bad = 0;
      for (i = 0; i < N; i++) put(t, send, i, val(rank, i));
      NCCLDO(rank, comm, ncclAllReduce(send, recv, N, t, op, comm, NULL));
      for (i = 0; i < N && !bad; i++) {
        double s = 0, pr = 1, mx = -1e30, mn = 1e30, want = 0, got = get(t, recv, i);
        for (p = 0; p < n; p++) {
          double v = val(p, i);
          s += v; pr *= v; mx = v > mx ? v : mx; mn = v < mn ? v : mn;
        }
        switch (op) {
          case ncclSum: want = s; break;
          case ncclProd: want = pr; break;
          case ncclMax: want = mx; break;
          case ncclMin: want = mn; break;
          default: want = is_int(t) ? floor(s / n) : s / n; break;
        }
        if (fabs(got - want) > (t == ncclFloat16 || t == ncclBfloat16 ? 0.02 * want : 1e-6 * want)) bad = 1;
        CHECK(rank, !bad, "ncclAllReduce type %d op %d element %zu: got %g, want %g", (int)t, (int)op, i,
              got, want);
      }
    }
  }

  /* Broadcast from the last rank, out of place; Bcast in place from rank 0. */
  for (i = 0; i < N; i++) ((float*)send)[i] = (float)(rank * 100 + (int)i);
  memset(recv, 0, (size_t)N * 4);
  NCCLDO(rank, comm, ncclBroadcast(send, recv, N, ncclFloat, n - 1, comm, NULL));
  for (i = 0; i < N; i++)
    if (((float*)recv)[i] != (float)((n - 1) * 100 + (int)i)) break;
  CHECK(rank, i == N, "ncclBroadcast: element %zu wrong", i);
  NCCLDO(rank, comm, ncclBcast(send, N, ncclFloat, 0, comm, NULL));
  for (i = 0; i < N; i++)
    if (((float*)send)[i] != (float)i) break;
  CHECK(rank, i == N, "ncclBcast: element %zu wrong", i);

  /* Reduce (sum of ints) to rank 1 % n. */
  {
    int root = 1 % n;
    for (i = 0; i < N; i++) ((int32_t*)send)[i] = rank + (int)i;
    memset(recv, 0xff, (size_t)N * 4);
    NCCLDO(rank, comm, ncclReduce(send, recv, N, ncclInt32, ncclSum, root, comm, NULL));
    if (rank == root) {
      for (i = 0; i < N; i++)
        if (((int32_t*)recv)[i] != n * (n - 1) / 2 + n * (int)i) break;
      CHECK(rank, i == N, "ncclReduce: element %zu is %d", i, ((int32_t*)recv)[i < N ? i : 0]);
    }
  }

  /* AllGather: rank p's block at p*N. */
  for (i = 0; i < N; i++) ((int64_t*)send)[i] = rank * 1000 + (int64_t)i;
  NCCLDO(rank, comm, ncclAllGather(send, recv, N, ncclInt64, comm, NULL));
  for (p = 0; p < n; p++)
    for (i = 0; i < N; i++)
      CHECK(rank, ((int64_t*)recv)[(size_t)p * N + i] == p * 1000 + (int64_t)i, "ncclAllGather block %d", p);

  /* ReduceScatter: rank r gets the sum of block r. */
  for (p = 0; p < n; p++)
    for (i = 0; i < N; i++) ((double*)send)[(size_t)p * N + i] = (double)(p * 10 + rank);
  NCCLDO(rank, comm, ncclReduceScatter(send, recv, N, ncclDouble, ncclSum, comm, NULL));
  for (i = 0; i < N; i++)
    if (((double*)recv)[i] != (double)(rank * 10 * n + n * (n - 1) / 2)) break;
  CHECK(rank, i == N, "ncclReduceScatter: element %zu wrong", i);

  /* AlltoAll: block p of rank r goes to block r of rank p. */
  for (p = 0; p < n; p++)
    for (i = 0; i < N; i++) ((int32_t*)send)[(size_t)p * N + i] = rank * 100 + p;
  NCCLDO(rank, comm, ncclAlltoAll(send, recv, N, ncclInt32, comm, NULL));
  for (p = 0; p < n; p++)
    CHECK(rank, ((int32_t*)recv)[(size_t)p * N + N - 1] == p * 100 + rank, "ncclAlltoAll block %d", p);

  /* Gather to rank 0 and Scatter from it. */
  for (i = 0; i < N; i++) ((int32_t*)send)[i] = rank * 7;
  NCCLDO(rank, comm, ncclGather(send, recv, N, ncclInt32, 0, comm, NULL));
  if (rank == 0)
    for (p = 0; p < n; p++) CHECK(rank, ((int32_t*)recv)[(size_t)p * N] == p * 7, "ncclGather block %d", p);
  for (p = 0; p < n; p++)
    for (i = 0; i < N; i++) ((int32_t*)send)[(size_t)p * N + i] = p * 3;
  NCCLDO(rank, comm, ncclScatter(send, recv, N, ncclInt32, 0, comm, NULL));
  CHECK(rank, ((int32_t*)recv)[N - 1] == rank * 3, "ncclScatter");

  /* Send/Recv around the ring, in a group (deadlock-free only as a group). */
  {
    int next = (rank + 1) % n, prev = (rank + n - 1) % n;
    for (i = 0; i < N; i++) ((int32_t*)send)[i] = rank * 1000 + (int)i;
    memset(recv, 0, (size_t)N * 4);
    NCCLOK(rank, ncclGroupStart());
    NCCLOK(rank, ncclSend(send, N, ncclInt32, next, comm, NULL));
    NCCLOK(rank, ncclRecv(recv, N, ncclInt32, prev, comm, NULL));
    NCCLDO(rank, comm, ncclGroupEnd());
    for (i = 0; i < N; i++)
      if (((int32_t*)recv)[i] != prev * 1000 + (int)i) break;
    CHECK(rank, i == N, "ncclSend/ncclRecv: element %zu wrong", i);
  }
  free(send);
  free(recv);
}

static void split(ncclComm_t comm, int rank, int n, int* checks) {
  ncclComm_t sub = NULL;
  int cnt = 0, me = -1, x = rank, y = 0;
  /* config NULL: a non-blocking parent's child is non-blocking too; polled on the child */
  NCCLDO(rank, sub, ncclCommSplit(comm, rank % 2, -rank, &sub, NULL));
  if (sub == NULL) {
    CHECK(rank, 0, "ncclCommSplit gave no communicator");
    return;
  }
  NCCLOK(rank, ncclCommCount(sub, &cnt));
  NCCLOK(rank, ncclCommUserRank(sub, &me));
  CHECK(rank, cnt == (n - rank % 2 + 1) / 2, "split size %d", cnt);
  CHECK(rank, me == cnt - 1 - rank / 2, "split rank %d (key -rank orders ranks backwards)", me);
  NCCLDO(rank, sub, ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, sub, NULL));
  {
    int want = 0, p;
    for (p = rank % 2; p < n; p += 2) want += p;
    CHECK(rank, y == want, "allreduce on the split: %d, want %d", y, want);
  }
  NCCLOK(rank, ncclCommDestroy(sub));
}

/* PreMulSum (PyTorch's ReduceOp.PREMUL_SUM): the sum of each rank's input times the
 * scalar, with distinct per-rank values; an operator serves one communicator and one
 * type; ncclScalarHostImmediate reads the scalar at creation, ncclScalarDevice (a host
 * pointer here) at each call. */
static void premulsum(ncclComm_t comm, int rank, int n, int* checks) {
  const char* (*last)(ncclComm_t) = pncclGetLastError;
  ncclRedOp_t half_op = ncclSum, dev_op = ncclSum, d_op = ncclSum, h_op = ncclSum;
  float half = 0.5f, fs[N], fr[N];
  int32_t three = 3, is[N], ir[N];
  double quarter = 0.25, ds[N], dr[N];
  uint16_t h_scalar = f32_to_f16(0.5f), *hs = calloc((size_t)n * N, 2), hr[N];
  ncclComm_t other = NULL;
  ncclResult_t r;
  size_t i;
  int p, bad;

  NCCLOK(rank, ncclRedOpCreatePreMulSum(&half_op, &half, ncclFloat, ncclScalarHostImmediate, comm));
  CHECK(rank, half_op == ncclNumOps, "first operator is ncclNumOps: %d", (int)half_op);
  half = 100.0f; /* read at creation: the change is not seen */
  for (i = 0; i < N; i++) fs[i] = (float)(rank * 3 + (int)i + 1);
  NCCLDO(rank, comm, ncclAllReduce(fs, fr, N, ncclFloat, half_op, comm, NULL));
  for (i = 0, bad = 0; i < N && !bad; i++) {
    double want = 0;
    for (p = 0; p < n; p++) want += 0.5 * (p * 3 + (int)i + 1);
    bad = fr[i] != (float)want;
    CHECK(rank, !bad, "PreMulSum 0.5 allreduce element %zu: %g, want %g", i, fr[i], want);
  }
  /* In place, and a second operator gets the next value. */
  NCCLOK(rank, ncclRedOpCreatePreMulSum(&dev_op, &three, ncclInt32, ncclScalarDevice, comm));
  CHECK(rank, dev_op == ncclNumOps + 1, "second operator: %d", (int)dev_op);
  three = -5; /* ncclScalarDevice: read when the collective is called */
  for (i = 0; i < N; i++) is[i] = rank + 1 + (int)i;
  NCCLDO(rank, comm, ncclAllReduce(is, is, N, ncclInt32, dev_op, comm, NULL));
  for (i = 0, bad = 0; i < N && !bad; i++) {
    int want = 0;
    for (p = 0; p < n; p++) want += -5 * (p + 1 + (int)i);
    bad = is[i] != want;
    CHECK(rank, !bad, "PreMulSum -5 (device residence) element %zu: %d, want %d", i, (int)is[i], want);
  }
  /* Reduce to the last rank, inside a group with a plain sum. */
  NCCLOK(rank, ncclRedOpCreatePreMulSum(&d_op, &quarter, ncclDouble, ncclScalarHostImmediate, comm));
  for (i = 0; i < N; i++) ds[i] = (double)(rank * 7 + (int)i);
  for (i = 0; i < N; i++) is[i] = rank;
  NCCLOK(rank, ncclGroupStart());
  NCCLOK(rank, ncclReduce(ds, dr, N, ncclDouble, d_op, n - 1, comm, NULL));
  NCCLOK(rank, ncclAllReduce(is, ir, N, ncclInt32, ncclSum, comm, NULL));
  NCCLDO(rank, comm, ncclGroupEnd());
  if (rank == n - 1)
    for (i = 0, bad = 0; i < N && !bad; i++) {
      double want = 0;
      for (p = 0; p < n; p++) want += 0.25 * (p * 7 + (int)i);
      bad = dr[i] != want;
      CHECK(rank, !bad, "PreMulSum 0.25 reduce element %zu: %g, want %g", i, dr[i], want);
    }
  CHECK(rank, ir[0] == n * (n - 1) / 2, "plain sum beside it in the group: %d", (int)ir[0]);
  /* ReduceScatter on half: rank r gets block r. */
  NCCLOK(rank, ncclRedOpCreatePreMulSum(&h_op, &h_scalar, ncclHalf, ncclScalarHostImmediate, comm));
  for (p = 0; p < n; p++)
    for (i = 0; i < N; i++) hs[(size_t)p * N + i] = f32_to_f16((float)(p + rank + 1));
  NCCLDO(rank, comm, ncclReduceScatter(hs, hr, N, ncclHalf, h_op, comm, NULL));
  {
    double want = 0;
    for (p = 0; p < n; p++) want += 0.5 * (rank + p + 1);
    for (i = 0, bad = 0; i < N && !bad; i++) {
      bad = f16_to_f32(hr[i]) != (float)want;
      CHECK(rank, !bad, "PreMulSum half reduce_scatter element %zu: %g, want %g", i, f16_to_f32(hr[i]), want);
    }
  }
  /* An operator serves its type and its communicator only. */
  r = ncclAllReduce(is, ir, N, ncclInt32, half_op, comm, NULL);
  CHECK(rank, r == ncclInvalidArgument, "float operator on int32: %d", (int)r);
  CHECK(rank, strstr(last(comm), "ncclAllReduce: op 5 was made for datatype 7") != NULL, "%s", last(comm));
  NCCLDO(rank, other, ncclCommSplit(comm, 0, rank, &other, NULL));
  if (other != NULL) {
    r = ncclAllReduce(fs, fr, N, ncclFloat, half_op, other, NULL);
    CHECK(rank, r == ncclInvalidArgument, "operator on another communicator: %d", (int)r);
    r = ncclRedOpDestroy(half_op, other);
    CHECK(rank, r == ncclInvalidArgument, "destroying on another communicator: %d", (int)r);
    NCCLOK(rank, ncclCommDestroy(other));
  }
  r = ncclRedOpCreatePreMulSum(&h_op, &half, ncclFloat, (ncclScalarResidence_t)2, comm);
  CHECK(rank, r == ncclInvalidArgument, "residence 2: %d", (int)r);
  r = ncclRedOpCreatePreMulSum(&h_op, NULL, ncclFloat, ncclScalarHostImmediate, comm);
  CHECK(rank, r == ncclInvalidArgument, "NULL scalar: %d", (int)r);
  /* Destroy: once; built-in operators never. A destroyed value is free again. */
  NCCLOK(rank, ncclRedOpDestroy(half_op, comm));
  r = ncclRedOpDestroy(half_op, comm);
  CHECK(rank, r == ncclInvalidArgument, "destroying twice: %d", (int)r);
  r = ncclAllReduce(fs, fr, N, ncclFloat, half_op, comm, NULL);
  CHECK(rank, r == ncclInvalidArgument, "a destroyed operator: %d", (int)r);
  r = ncclRedOpDestroy(ncclSum, comm);
  CHECK(rank, r == ncclInvalidArgument, "destroying ncclSum: %d", (int)r);
  NCCLOK(rank, ncclRedOpDestroy(d_op, comm));
  /* NCCL's free list: the last freed slot first (ncclNumOps + 2, then ncclNumOps). */
  NCCLOK(rank, ncclRedOpCreatePreMulSum(&d_op, &quarter, ncclDouble, ncclScalarHostImmediate, comm));
  NCCLOK(rank, ncclRedOpCreatePreMulSum(&half_op, &half, ncclFloat, ncclScalarHostImmediate, comm));
  CHECK(rank, d_op == ncclNumOps + 2 && half_op == ncclNumOps, "freed values reused last-freed first: %d %d",
        (int)d_op, (int)half_op);
  NCCLOK(rank, ncclRedOpDestroy(half_op, comm));
  NCCLOK(rank, ncclRedOpDestroy(dev_op, comm));
  NCCLOK(rank, ncclRedOpDestroy(d_op, comm));
  NCCLOK(rank, ncclRedOpDestroy(h_op, comm));
  free(hs);
}

static void errors(ncclComm_t comm, int rank, int* checks) {
  int x = 0, y = 0;
  ncclResult_t r;
  /* The library's message, under its profiling name (the program's own fallback shadows
   * ncclGetLastError). */
  const char* (*last)(ncclComm_t) = pncclGetLastError;
  ncclRedOp_t op;
  ncclComm_t nc = NULL;
  float scalar = 2.0f;

  r = ncclAllReduce(&x, &y, 1, (ncclDataType_t)99, ncclSum, comm, NULL);
  CHECK(rank, r == ncclInvalidArgument, "bad datatype: %d", (int)r);
  CHECK(rank, strstr(last(comm), "ncclAllReduce") != NULL, "message names the call: %s", last(comm));
  r = ncclAllReduce(&x, &y, 1, ncclInt32, (ncclRedOp_t)42, comm, NULL);
  CHECK(rank, r == ncclInvalidArgument, "bad op: %d", (int)r);
  /* 64..66 are ferroccl's bitwise operators: NCCL has no such op, so the shim refuses them. */
  for (int v = 64; v <= 66; v++) {
    r = ncclAllReduce(&x, &y, 1, ncclInt32, (ncclRedOp_t)v, comm, NULL);
    CHECK(rank, r == ncclInvalidArgument, "op %d is not NCCL's: %d", v, (int)r);
    CHECK(rank, strstr(last(comm), "ncclAllReduce: op") != NULL, "%s", last(comm));
    r = ncclReduceScatter(&x, &y, 1, ncclInt32, (ncclRedOp_t)v, comm, NULL);
    CHECK(rank, r == ncclInvalidArgument, "reduce_scatter op %d: %d", v, (int)r);
    r = ncclReduce(&x, &y, 1, ncclInt32, (ncclRedOp_t)v, 0, comm, NULL);
    CHECK(rank, r == ncclInvalidArgument, "reduce op %d: %d", v, (int)r);
  }
  r = ncclBroadcast(&x, &y, 1, ncclInt32, 1 << 20, comm, NULL);
  CHECK(rank, r == ncclInvalidArgument, "bad root: %d", (int)r);
  r = ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, NULL);
  CHECK(rank, r == ncclInvalidArgument, "ncclRedOpCreatePreMulSum on a NULL comm: %d", (int)r);
  CHECK(rank, strstr(last(comm), "ncclRedOpCreatePreMulSum") != NULL, "%s", last(comm));
  {
    int gone = 1 << 20; /* no such rank: refused before anything is sent (tests/nccl/shrink.c shrinks) */
    r = ncclCommShrink(comm, &gone, 1, &nc, NULL, NCCL_SHRINK_DEFAULT);
    CHECK(rank, r == ncclInvalidArgument && nc == NULL, "ncclCommShrink of rank %d: %d", gone, (int)r);
  }
  r = ncclAllReduce(&x, &y, 1, ncclInt32, ncclSum, NULL, NULL);
  CHECK(rank, r == ncclInvalidArgument, "NULL comm: %d", (int)r);
  CHECK(rank, strcmp(ncclGetErrorString(ncclInvalidUsage), ncclGetErrorString(ncclSuccess)) != 0,
        "error strings differ");
  /* The program's own weak fallback is what its calls reach (as with NVIDIA's library). */
  CHECK(rank, strstr(ncclGetLastError(comm), "fallback of the program") != NULL, "weak fallback");

  /* Functions newer than NCCL 2.28 are absent, as from NVIDIA's 2.28.9 library, so
   * probes for them (vLLM loads functions by name) take the older NCCL's path. */
  CHECK(rank, dlsym(RTLD_DEFAULT, "ncclCommSuspend") == NULL && dlsym(RTLD_DEFAULT, "ncclCommResume") == NULL &&
                  dlsym(RTLD_DEFAULT, "ncclCommQueryProperties") == NULL,
        "NCCL 2.29's functions are not exported by a 2.28 library");
  /* Optional functions found by dlsym and through the weak declarations. */
  CHECK(rank, dlsym(RTLD_DEFAULT, "ncclCommWindowRegister") != NULL, "dlsym ncclCommWindowRegister");
  CHECK(rank, ncclCommWindowRegister != NULL, "weak ncclCommWindowRegister resolved");
  if (ncclCommWindowRegister != NULL) {
    ncclWindow_t win = NULL;
    float buf[64];
    NCCLOK(rank, ncclCommWindowRegister(comm, buf, sizeof buf, &win, NCCL_WIN_COLL_SYMMETRIC));
    NCCLOK(rank, ncclCommWindowDeregister(comm, win));
  }
  {
    void* h = NULL;
    float buf[16];
    NCCLOK(rank, ncclCommRegister(comm, buf, sizeof buf, &h));
    NCCLOK(rank, ncclCommDeregister(comm, h));
  }
  if (ncclGroupSimulateEnd != NULL) {
    ncclSimInfo_t si = NCCL_SIM_INFO_INITIALIZER;
    NCCLOK(rank, ncclGroupStart());
    r = ncclGroupSimulateEnd(&si);
    CHECK(rank, r == ncclInvalidUsage, "ncclGroupSimulateEnd: %d", (int)r);
    NCCLOK(rank, ncclGroupEnd());
  }
}

static void run_rank(ncclComm_t comm, int rank, int n, int* checks) {
  int cnt = 0, me = -1, dev = 0;
  ncclResult_t ae = ncclInternalError;
  NCCLOK(rank, ncclCommCount(comm, &cnt));
  NCCLOK(rank, ncclCommUserRank(comm, &me));
  NCCLOK(rank, ncclCommCuDevice(comm, &dev));
  NCCLOK(rank, ncclCommGetAsyncError(comm, &ae));
  CHECK(rank, cnt == n && me == rank, "count %d rank %d", cnt, me);
  CHECK(rank, ae == ncclSuccess, "async error %d", (int)ae);
  collectives(comm, rank, n, checks);
  split(comm, rank, n, checks);
  premulsum(comm, rank, n, checks);
  errors(comm, rank, checks);
}

/* ------------------------------------------------------------------ drivers */

struct thread_arg {
  ncclUniqueId id;
  int rank, n, checks;
};

static void* thread_main(void* p) {
  struct thread_arg* a = p;
  ncclComm_t comm = NULL;
  int* checks = &a->checks;
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  char name[32];
  snprintf(name, sizeof name, "nccl-style-%d", a->rank);
  cfg.commName = name;
  if (a->rank % 2 == 1) {
    /* Non-blocking init, polled as NCCL's documentation shows; every call on this
     * communicator is then non-blocking too (NCCLDO polls). */
    ncclResult_t st = ncclInProgress;
    cfg.blocking = 0;
    ncclResult_t r = ncclCommInitRankConfig(&comm, a->n, a->id, a->rank, &cfg);
    CHECK(a->rank, r == ncclInProgress, "non-blocking init: %d", (int)r);
    while (comm != NULL && st == ncclInProgress) NCCLOK(a->rank, ncclCommGetAsyncError(comm, &st));
    CHECK(a->rank, st == ncclSuccess, "non-blocking init ended with %d", (int)st);
  } else {
    NCCLOK(a->rank, ncclCommInitRankConfig(&comm, a->n, a->id, a->rank, &cfg));
  }
  if (comm == NULL) return NULL;
  run_rank(comm, a->rank, a->n, checks);
  NCCLDO(a->rank, comm, ncclCommFinalize(comm));
  NCCLOK(a->rank, ncclCommDestroy(comm));
  return NULL;
}

static int threads(int n) {
  struct thread_arg* a = calloc((size_t)n, sizeof *a);
  pthread_t* t = calloc((size_t)n, sizeof *t);
  ncclUniqueId id;
  int i, total = 0;
  int* checks = &total;
  NCCLOK(-1, ncclGetUniqueId(&id));
  for (i = 0; i < n; i++) {
    a[i].id = id;
    a[i].rank = i;
    a[i].n = n;
    pthread_create(&t[i], NULL, thread_main, &a[i]);
  }
  for (i = 0; i < n; i++) {
    pthread_join(t[i], NULL);
    total += a[i].checks;
  }
  printf("nccl_style --threads %d: %d checks, %d failed\n", n, total, failures_total);
  free(a);
  free(t);
  return failures_total == 0 ? 0 : 1;
}

/* One thread, n ranks of ncclCommInitAll (or, with `group`, of ncclCommInitRank inside
 * a group, as nccl-tests creates several ranks per process): every call for all ranks
 * inside a group. */
static int initall(int n, int group) {
  ncclComm_t* comms = calloc((size_t)n, sizeof *comms);
  float** bufs = calloc((size_t)n, sizeof *bufs);
  int i, j, total = 0;
  int* checks = &total;
  if (group) {
    ncclUniqueId id;
    NCCLOK(-1, ncclGetUniqueId(&id));
    NCCLOK(-1, ncclGroupStart());
    for (i = 0; i < n; i++) NCCLOK(i, ncclCommInitRank(&comms[i], n, id, i));
    NCCLOK(-1, ncclGroupEnd());
    for (i = 0; i < n; i++) {
      int r = -1;
      NCCLOK(i, ncclCommUserRank(comms[i], &r));
      CHECK(i, r == i, "rank %d of the group's init reports %d", i, r);
    }
  } else {
    NCCLOK(-1, ncclCommInitAll(comms, n, NULL));
  }
  for (i = 0; i < n; i++) {
    bufs[i] = malloc(N * sizeof(float));
    for (j = 0; j < N; j++) bufs[i][j] = (float)(i + j);
  }
  NCCLOK(-1, ncclGroupStart());
  for (i = 0; i < n; i++) NCCLOK(i, ncclAllReduce(bufs[i], bufs[i], N, ncclFloat, ncclSum, comms[i], NULL));
  NCCLOK(-1, ncclGroupEnd());
  for (i = 0; i < n; i++)
    for (j = 0; j < N; j++)
      CHECK(i, bufs[i][j] == (float)(n * (n - 1) / 2 + n * j), "initall allreduce rank %d element %d", i, j);
  NCCLOK(-1, ncclGroupStart());
  for (i = 0; i < n; i++) NCCLOK(i, ncclBcast(bufs[i], N, ncclFloat, n - 1, comms[i], NULL));
  NCCLOK(-1, ncclGroupEnd());
  for (i = 0; i < n; i++) CHECK(i, bufs[i][1] == bufs[n - 1][1], "initall bcast rank %d", i);
  for (i = 0; i < n; i++) {
    NCCLOK(i, ncclCommDestroy(comms[i]));
    free(bufs[i]);
  }
  printf("nccl_style --%s %d: %d checks, %d failed\n", group ? "group" : "initall", n, total, failures_total);
  free(comms);
  free(bufs);
  return failures_total == 0 ? 0 : 1;
}

static int from_env(void) {
  const char* hex = getenv("FERROCCL_UNIQUE_ID");
  const char* rs = getenv("FERROCCL_RANK");
  const char* ns = getenv("FERROCCL_WORLD_SIZE");
  ncclUniqueId id;
  ncclComm_t comm = NULL;
  int rank, n, i, total = 0;
  int* checks = &total;
  if (!hex || !rs || !ns || strlen(hex) != 2 * NCCL_UNIQUE_ID_BYTES) {
    fprintf(stderr, "FERROCCL_UNIQUE_ID / FERROCCL_RANK / FERROCCL_WORLD_SIZE are not usable\n");
    return 2;
  }
  for (i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    unsigned v = 0;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return 2;
    id.internal[i] = (char)v;
  }
  rank = atoi(rs);
  n = atoi(ns);
  NCCLOK(rank, ncclCommInitRank(&comm, n, id, rank));
  if (comm == NULL) return 1;
  run_rank(comm, rank, n, checks);
  NCCLOK(rank, ncclCommDestroy(comm));
  printf("nccl_style rank %d/%d: %d checks, %d failed\n", rank, n, total, failures_total);
  return failures_total == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  int version = 0, total = 0;
  int* checks = &total;
  NCCLOK(-1, ncclGetVersion(&version));
  CHECK(-1, version == NCCL_VERSION_CODE && version == 22809, "ncclGetVersion %d", version);
  if (argc == 3 && strcmp(argv[1], "--threads") == 0) return threads(atoi(argv[2]));
  if (argc == 3 && strcmp(argv[1], "--initall") == 0) return initall(atoi(argv[2]), 0);
  if (argc == 3 && strcmp(argv[1], "--group") == 0) return initall(atoi(argv[2]), 1);
  if (getenv("FERROCCL_UNIQUE_ID") != NULL) return from_env();
  return threads(1);
}
