/* Local (one process, no communicator) and planning extensions of docs/abi.md "Extensions
 * beyond NCCL".  Runs once, as a single process (the harness's 1-rank communicator is not
 * used).
 *
 * fcclLocalBroadcast: host memory (every device -1) to 3 destinations, 1 MiB + 3 bytes and 0.
 * fcclLocalScatter: a 4x6 float32 tensor along dim 0 and dim 1, even (chunkSizes NULL, every
 * ndst that divides, and uneven: the first shape[dim] % ndst chunks one larger, as the header
 * says) and with given chunk sizes ({1,2,3} on dim 1, {1,0,3} on dim 0); 3-d
 * tensors of other types along every dim.  fcclLocalGather: the inverse (dimSizes per
 * source, shape[dim] ignored); scatter -> gather gives back the original.
 * Devices: with no CUDA (fcclMemAlloc says fcclUnavailable) a device id >= 0 gives
 * fcclUnavailable; with CUDA the same calls run host -> device 0 -> host and must round-trip.
 * Errors: chunk sizes that do not sum to shape[dim], dim / ndims out of range, device -2,
 * NULL destinations -> fcclInvalidArgument.
 * fcclCollectiveCounts for every fcclCollective_t value, world sizes 1..8, every rank, roots,
 * counts; fcclCollectiveAdjoint; invalid values -> fcclInvalidArgument. */
#include "harness.h"

#define MAXD 4
#define MAXDST 8

static size_t prod(const size_t* shape, int lo, int hi) {
  size_t p = 1;
  int k;
  for (k = lo; k < hi; k++) p *= shape[k];
  return p;
}

/* out = the slice [start, start + len) of in along dim */
static void slice(const unsigned char* in, unsigned char* out, int ndims, const size_t* shape,
                  int dim, size_t esz, size_t start, size_t len) {
  size_t outer = prod(shape, 0, dim), inner = prod(shape, dim + 1, ndims) * esz, S = shape[dim], o;
  for (o = 0; o < outer; o++)
    memcpy(out + o * len * inner, in + (o * S + start) * inner, len * inner);
}

static int g_have_cuda = -1; /* -1 unknown, 0 no, 1 yes */

/* ================================================================== broadcast */

/* A bad fcclLocalBroadcast call: fcclInvalidArgument naming the call, nothing written. */
#define BC_ERR(call)                                                                      \
  do {                                                                                    \
    for (k = 0; k < 3; k++) memset(dst[k], FCCL_SENT_RECV, 16);                           \
    CHECK_ERR(call, fcclInvalidArgument, "fcclLocalBroadcast");                           \
    for (k = 0; k < 3; k++) BYTES_CHECK(dst[k], 16, FCCL_SENT_RECV, "failed " #call " wrote"); \
  } while (0)

static void local_broadcast(void) {
  const size_t bytes = ((size_t)1 << 20) + 3;
  unsigned char *src = (unsigned char*)fccl_xmalloc(bytes), *dst[3];
  void* dp[3];
  int dev[3] = {-1, -1, -1}, k;
  size_t i;
  char what[128];
  for (i = 0; i < bytes; i++) src[i] = (unsigned char)((i * 131u + 7u) >> 3);
  for (k = 0; k < 3; k++) {
    dst[k] = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
    memset(dst[k], FCCL_SENT_RECV, bytes + FCCL_SLACK);
    dp[k] = dst[k];
  }
  fccl_phase("fcclLocalBroadcast host -> 3 host destinations");
  if (CHECK_OK(fcclLocalBroadcast(src, -1, bytes, dp, dev, 3))) {
    for (k = 0; k < 3; k++) {
      if (memcmp(dst[k], src, bytes) != 0) {
        for (i = 0; i < bytes && dst[k][i] == src[i]; i++) {
        }
        CHECK(0, "fcclLocalBroadcast(%zu bytes, 3 host destinations): destination %d differs "
                 "at byte %zu: 0x%02x, expected 0x%02x",
              bytes, k, i, dst[k][i], src[i]);
      }
      snprintf(what, sizeof what, "fcclLocalBroadcast: bytes after destination %d", k);
      BYTES_CHECK(dst[k] + bytes, FCCL_SLACK, FCCL_SENT_RECV, what);
    }
  }
  for (k = 0; k < 3; k++) memset(dst[k], FCCL_SENT_RECV, 16);
  CHECK_OK(fcclLocalBroadcast(src, -1, 0, dp, dev, 3));
  for (k = 0; k < 3; k++) BYTES_CHECK(dst[k], 16, FCCL_SENT_RECV, "fcclLocalBroadcast(0 bytes)");

  fccl_phase("fcclLocalBroadcast errors");
  dp[1] = NULL; /* nothing may be written, not even dsts[0] */
  BC_ERR(fcclLocalBroadcast(src, -1, 16, dp, dev, 3));
  dp[1] = dst[1];
  BC_ERR(fcclLocalBroadcast(NULL, -1, 16, dp, dev, 3));
  BC_ERR(fcclLocalBroadcast(src, -1, 16, dp, dev, -1));
  BC_ERR(fcclLocalBroadcast(src, -2, 16, dp, dev, 3));
  dev[2] = -2;
  BC_ERR(fcclLocalBroadcast(src, -1, 16, dp, dev, 3));
  dev[2] = -1;
  for (k = 0; k < 3; k++) free(dst[k]);
  free(src);
}

/* ================================================================== scatter / gather */

/* Scatters src (shape, dim, chunks or NULL = even over ndst) to host buffers, checks each
 * chunk, gathers them back (shape[dim] passed as 999: ignored) and checks the round trip. */
static void scatter_gather(fcclDataType_t dt, int ndims, const size_t* shape, int dim,
                           const size_t* chunks, int ndst) {
  size_t esz = fccl_dt_size(dt), n = prod(shape, 0, ndims), csz[MAXDST], start = 0, i;
  size_t gshape[MAXD], cshape[MAXD];
  unsigned char *src = (unsigned char*)fccl_xmalloc(n * esz + 1), *want, *back;
  unsigned char* dst[MAXDST];
  void* dp[MAXDST];
  const void* sp[MAXDST];
  int dev[MAXDST], k, ok;
  char what[256], desc[160];
  size_t used = 0;
  for (k = 0; k < MAXD; k++) gshape[k] = k < ndims ? shape[k] : 0;
  used += (size_t)snprintf(desc, sizeof desc, "%s shape=", fccl_dt_name(dt));
  for (k = 0; k < ndims && used < sizeof desc; k++)
    used += (size_t)snprintf(desc + used, sizeof desc - used, "%s%zu", k ? "x" : "", shape[k]);
  if (used < sizeof desc)
    used += (size_t)snprintf(desc + used, sizeof desc - used, " dim=%d ndst=%d chunks=", dim, ndst);
  for (k = 0; k < ndst && used < sizeof desc; k++) {
    /* NULL: as even as possible, the first shape[dim] % ndst chunks one larger (header) */
    csz[k] = chunks ? chunks[k]
                    : shape[dim] / (size_t)ndst + ((size_t)k < shape[dim] % (size_t)ndst ? 1u : 0u);
    used += (size_t)snprintf(desc + used, sizeof desc - used, "%s%zu", k ? "," : (chunks ? "{" : "even{"), csz[k]);
  }
  if (used < sizeof desc) snprintf(desc + used, sizeof desc - used, "}");
  for (i = 0; i < n; i++) fccl_store_f(dt, src, i, (double)((int)(i % 97) - 40));
  want = (unsigned char*)fccl_xmalloc(n * esz + 1);
  back = (unsigned char*)fccl_xmalloc(n * esz + FCCL_SLACK);
  for (k = 0; k < ndst; k++) {
    size_t cb = n / (shape[dim] ? shape[dim] : 1) * csz[k] * esz;
    if (shape[dim] == 0) cb = 0;
    dst[k] = (unsigned char*)fccl_xmalloc(cb + FCCL_SLACK);
    memset(dst[k], FCCL_SENT_RECV, cb + FCCL_SLACK);
    dp[k] = dst[k];
    sp[k] = dst[k];
    dev[k] = -1;
  }
  snprintf(what, sizeof what, "fcclLocalScatter(%s)", desc);
  fccl_phase("%s", what);
  ok = CHECK_OK(fcclLocalScatter(src, -1, ndims, shape, dim, dt, chunks, dp, dev, ndst));
  if (ok) {
    for (k = 0; k < ndst; k++) {
      size_t cn, cb;
      memcpy(cshape, gshape, sizeof cshape);
      cshape[dim] = csz[k];
      cn = prod(cshape, 0, ndims);
      cb = cn * esz;
      slice(src, want, ndims, shape, dim, esz, start, csz[k]);
      if (memcmp(dst[k], want, cb) != 0) {
        char g[96], e[96];
        for (i = 0; i < cn; i++)
          if (memcmp(dst[k] + i * esz, want + i * esz, esz) != 0) break;
        fccl_format_elem(dt, dst[k], i, g, sizeof g);
        fccl_format_elem(dt, want, i, e, sizeof e);
        CHECK(0, "%s: destination %d (chunk [%zu, %zu) along dim %d): flat element %zu of %zu: "
                 "expected %s, got %s", what, k, start, start + csz[k], dim, i, cn, e, g);
      }
      snprintf(what, sizeof what, "fcclLocalScatter(%s): bytes after destination %d", desc, k);
      BYTES_CHECK(dst[k] + cb, FCCL_SLACK, FCCL_SENT_RECV, what);
      start += csz[k];
    }
  }

  /* the inverse */
  gshape[dim] = 999; /* ignored */
  memset(back, FCCL_SENT_RECV, n * esz + FCCL_SLACK);
  snprintf(what, sizeof what, "fcclLocalGather(%s) after the scatter", desc);
  fccl_phase("%s", what);
  if (ok && CHECK_OK(fcclLocalGather(sp, dev, csz, ndst, ndims, gshape, dim, dt, back, -1))) {
    if (memcmp(back, src, n * esz) != 0) {
      for (i = 0; i < n; i++)
        if (memcmp(back + i * esz, src + i * esz, esz) != 0) break;
      CHECK(0, "%s: round trip differs from the original at flat element %zu of %zu", what, i, n);
    }
    BYTES_CHECK(back + n * esz, FCCL_SLACK, FCCL_SENT_RECV, what);
  }
  for (k = 0; k < ndst; k++) free(dst[k]);
  free(src);
  free(want);
  free(back);
}

/* A bad fcclLocalScatter call: fcclInvalidArgument naming the call, no destination written. */
#define SC_ERR(call)                                                                     \
  do {                                                                                   \
    memset(d, FCCL_SENT_RECV, sizeof d);                                                 \
    CHECK_ERR(call, fcclInvalidArgument, "fcclLocalScatter");                            \
    BYTES_CHECK(d, sizeof d, FCCL_SENT_RECV, "failed " #call " wrote to the destinations"); \
  } while (0)

static void scatter_errors(void) {
  static const size_t shape[2] = {4, 6};
  static const size_t bad1[3] = {1, 2, 2}, bad2[3] = {1, 2, 4}, bad3[2] = {1, 2};
  float src[24], d[3][24];
  void* dp[3];
  const void* sp[3];
  int dev[3] = {-1, -1, -1}, k;
  size_t gs[2] = {4, 0}, ds[3] = {2, 2, 2};
  for (k = 0; k < 24; k++) src[k] = (float)k;
  for (k = 0; k < 3; k++) {
    dp[k] = d[k];
    sp[k] = d[k];
  }
  fccl_phase("fcclLocalScatter / fcclLocalGather errors");
  SC_ERR(fcclLocalScatter(src, -1, 2, shape, 1, fcclFloat32, bad1, dp, dev, 3));
  SC_ERR(fcclLocalScatter(src, -1, 2, shape, 1, fcclFloat32, bad2, dp, dev, 3));
  SC_ERR(fcclLocalScatter(src, -1, 2, shape, 0, fcclFloat32, bad3, dp, dev, 2));
  SC_ERR(fcclLocalScatter(src, -1, 2, shape, 2, fcclFloat32, NULL, dp, dev, 2));
  SC_ERR(fcclLocalScatter(src, -1, 2, shape, -1, fcclFloat32, NULL, dp, dev, 2));
  SC_ERR(fcclLocalScatter(src, -1, 0, shape, 0, fcclFloat32, NULL, dp, dev, 2));
  SC_ERR(fcclLocalScatter(src, -1, 2, shape, 1, 99, NULL, dp, dev, 2));
  SC_ERR(fcclLocalScatter(src, -2, 2, shape, 1, fcclFloat32, NULL, dp, dev, 2));
  dp[1] = NULL; /* dsts[1] NULL for a non-empty chunk: nothing may be written, not even dsts[0] */
  SC_ERR(fcclLocalScatter(src, -1, 2, shape, 1, fcclFloat32, NULL, dp, dev, 2));
  dp[1] = d[1];

  memset(src, FCCL_SENT_RECV, sizeof src);
  CHECK_ERR(fcclLocalGather(sp, dev, ds, 3, 2, gs, 2, fcclFloat32, src, -1), fcclInvalidArgument,
            "fcclLocalGather");
  CHECK_ERR(fcclLocalGather(sp, dev, ds, 3, 2, gs, -1, fcclFloat32, src, -1), fcclInvalidArgument,
            "fcclLocalGather");
  CHECK_ERR(fcclLocalGather(sp, dev, ds, 3, 0, gs, 0, fcclFloat32, src, -1), fcclInvalidArgument,
            "fcclLocalGather");
  CHECK_ERR(fcclLocalGather(sp, dev, ds, 3, 2, gs, 1, fcclFloat32, NULL, -1), fcclInvalidArgument,
            "fcclLocalGather");
  CHECK_ERR(fcclLocalGather(sp, dev, NULL, 3, 2, gs, 1, fcclFloat32, src, -1), fcclInvalidArgument,
            "fcclLocalGather");
  CHECK_ERR(fcclLocalGather(sp, dev, ds, 3, 2, gs, 1, fcclFloat32, src, -2), fcclInvalidArgument,
            "fcclLocalGather");
  BYTES_CHECK(src, sizeof src, FCCL_SENT_RECV, "fcclLocalGather: a failed call wrote");
}

/* ================================================================== devices */

static void device_cases(void) {
  static const size_t shape[2] = {4, 6};
  static const size_t chunks[3] = {1, 2, 3};
  float src[24], back[24], host[3][24];
  void* dbuf[3] = {NULL, NULL, NULL};
  void* dp[3];
  const void* sp[3];
  int dev0[3] = {0, 0, 0}, devh[3] = {-1, -1, -1}, mixed[3] = {-1, 0, -1}, k;
  fcclResult_t res;
  for (k = 0; k < 24; k++) src[k] = (float)(k * 3 - 7);
  fccl_phase("device ids: fcclMemAlloc probe");
  res = fcclMemAlloc(&dbuf[0], sizeof src);
  if (res == fcclUnavailable) {
    g_have_cuda = 0;
    for (k = 0; k < 3; k++) {
      dp[k] = host[k];
      sp[k] = host[k];
    }
    memset(host, FCCL_SENT_RECV, sizeof host);
    fccl_phase("device ids without CUDA");
    CHECK_ERR(fcclLocalBroadcast(src, -1, sizeof src, dp, mixed, 3), fcclUnavailable,
              "fcclLocalBroadcast");
    CHECK_ERR(fcclLocalBroadcast(src, 0, sizeof src, dp, devh, 3), fcclUnavailable,
              "fcclLocalBroadcast");
    CHECK_ERR2(fcclLocalBroadcast(src, 1000, sizeof src, dp, devh, 3), fcclUnavailable,
               fcclInvalidArgument, "fcclLocalBroadcast");
    CHECK_ERR(fcclLocalScatter(src, -1, 2, shape, 1, fcclFloat32, chunks, dp, dev0, 3),
              fcclUnavailable, "fcclLocalScatter");
    CHECK_ERR(fcclLocalScatter(src, 0, 2, shape, 1, fcclFloat32, chunks, dp, devh, 3),
              fcclUnavailable, "fcclLocalScatter");
    CHECK_ERR(fcclLocalGather(sp, dev0, chunks, 3, 2, shape, 1, fcclFloat32, back, -1),
              fcclUnavailable, "fcclLocalGather");
    CHECK_ERR(fcclLocalGather(sp, devh, chunks, 3, 2, shape, 1, fcclFloat32, back, 0),
              fcclUnavailable, "fcclLocalGather");
    BYTES_CHECK(host, sizeof host, FCCL_SENT_RECV, "device calls without CUDA wrote");
    return;
  }
  if (!CHECK_OK(res) || !dbuf[0]) {
    CHECK(0, "fcclMemAlloc must succeed (CUDA) or return fcclUnavailable (no CUDA)");
    return;
  }
  g_have_cuda = 1;
  for (k = 1; k < 3; k++)
    if (!CHECK_OK(fcclMemAlloc(&dbuf[k], sizeof src))) return;
  /* host -> 3 device buffers -> host */
  fccl_phase("device ids with CUDA: broadcast host -> device 0 -> host");
  for (k = 0; k < 3; k++) dp[k] = dbuf[k];
  if (CHECK_OK(fcclLocalBroadcast(src, -1, sizeof src, dp, dev0, 3))) {
    for (k = 0; k < 3; k++) {
      void* hp = back;
      memset(back, 0, sizeof back);
      if (CHECK_OK(fcclLocalBroadcast(dbuf[k], 0, sizeof src, &hp, devh, 1)))
        CHECK(memcmp(back, src, sizeof src) == 0,
              "fcclLocalBroadcast host -> device 0 -> host: copy %d differs", k);
    }
  }
  /* scatter to devices (chunks {1,2,3} along dim 1), gather back to the host */
  fccl_phase("device ids with CUDA: scatter host -> devices, gather -> host");
  if (CHECK_OK(fcclLocalScatter(src, -1, 2, shape, 1, fcclFloat32, chunks, dp, dev0, 3))) {
    for (k = 0; k < 3; k++) sp[k] = dbuf[k];
    memset(back, 0, sizeof back);
    if (CHECK_OK(fcclLocalGather(sp, dev0, chunks, 3, 2, shape, 1, fcclFloat32, back, -1)))
      CHECK(memcmp(back, src, sizeof src) == 0, "scatter to device 0 and gather back differs");
  }
  for (k = 0; k < 3; k++) fcclMemFree(dbuf[k]);
}

/* ================================================================== planning helpers */

static void expected_counts(int coll, size_t c, int n, int rank, int root, size_t* s, size_t* r) {
  size_t cn = c * (size_t)n;
  int isroot = rank == root;
  switch (coll) {
    case fcclCollAllReduce: *s = c; *r = c; break;
    case fcclCollBroadcast: *s = isroot ? c : 0; *r = c; break;
    case fcclCollReduce: *s = c; *r = isroot ? c : 0; break;
    case fcclCollAllGather: *s = c; *r = cn; break;
    case fcclCollReduceScatter: *s = cn; *r = c; break;
    case fcclCollAlltoAll: *s = cn; *r = cn; break;
    case fcclCollGather: *s = c; *r = isroot ? cn : 0; break;
    default: /* fcclCollScatter */ *s = isroot ? cn : 0; *r = c; break;
  }
}

static const char* coll_name(int c) {
  static const char* names[8] = {"AllReduce", "Broadcast",     "Reduce",   "AllGather",
                                 "ReduceScatter", "AlltoAll", "Gather", "Scatter"};
  return c >= 0 && c < 8 ? names[c] : "invalid";
}

static void planning(void) {
  static const size_t counts[] = {0, 1, 5, 1000003};
  static const int adj[8][2] = {{fcclCollAllReduce, fcclCollAllReduce},
                                {fcclCollBroadcast, fcclCollReduce},
                                {fcclCollReduce, fcclCollBroadcast},
                                {fcclCollAllGather, fcclCollReduceScatter},
                                {fcclCollReduceScatter, fcclCollAllGather},
                                {fcclCollAlltoAll, fcclCollAlltoAll},
                                {fcclCollGather, fcclCollScatter},
                                {fcclCollScatter, fcclCollGather}};
  int coll, n, rank, ri, ci, k, bad = 0;
  size_t s, r, es, er;
  fccl_phase("fcclCollectiveCounts");
  CHECK(fcclCollAllReduce == 0 && fcclCollBroadcast == 1 && fcclCollReduce == 2 &&
            fcclCollAllGather == 3 && fcclCollReduceScatter == 4 && fcclCollAlltoAll == 5 &&
            fcclCollGather == 6 && fcclCollScatter == 7,
        "fcclCollective_t values differ from docs/abi.md");
  for (coll = 0; coll < 8; coll++)
    for (n = 1; n <= 8; n++)
      for (rank = 0; rank < n; rank++)
        for (ri = 0; ri < 3; ri++) {
          int root = ri == 0 ? 0 : ri == 1 ? n - 1 : n / 2;
          for (ci = 0; ci < 4; ci++) {
            fcclResult_t res;
            s = r = (size_t)0xDEADBEEF;
            expected_counts(coll, counts[ci], n, rank, root, &es, &er);
            res = fcclCollectiveCounts(coll, counts[ci], n, rank, root, &s, &r);
            if (res != fcclSuccess || s != es || r != er) {
              if (bad < 10)
                CHECK(0, "fcclCollectiveCounts(coll=%d (%s), count=%zu, nranks=%d, rank=%d, root=%d) "
                         "returned %d with send=%zu recv=%zu; expected fcclSuccess, send=%zu "
                         "recv=%zu; fcclGetLastError: \"%s\"",
                      coll, coll_name(coll), counts[ci], n, rank, root, (int)res, s, r, es, er,
                      res == fcclSuccess ? "" : fcclGetLastError(NULL));
              bad++;
            }
          }
        }
  CHECK(bad <= 10, "fcclCollectiveCounts: %d wrong answers in all", bad);

  fccl_phase("fcclCollectiveCounts errors");
  CHECK_ERR(fcclCollectiveCounts(-1, 5, 2, 0, 0, &s, &r), fcclInvalidArgument, "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(8, 5, 2, 0, 0, &s, &r), fcclInvalidArgument, "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(100, 5, 2, 0, 0, &s, &r), fcclInvalidArgument, "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollAllReduce, 5, 0, 0, 0, &s, &r), fcclInvalidArgument,
            "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollAllGather, 5, -2, 0, 0, &s, &r), fcclInvalidArgument,
            "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollAllGather, 5, 4, 4, 0, &s, &r), fcclInvalidArgument,
            "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollAllGather, 5, 4, -1, 0, &s, &r), fcclInvalidArgument,
            "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollBroadcast, 5, 4, 0, 4, &s, &r), fcclInvalidArgument,
            "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollGather, 5, 4, 0, -1, &s, &r), fcclInvalidArgument,
            "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollScatter, 5, 3, 1, 3, &s, &r), fcclInvalidArgument,
            "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollReduce, 5, 3, 1, 7, &s, &r), fcclInvalidArgument,
            "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollAllGather, SIZE_MAX / 2 + 1, 2, 0, 0, &s, &r),
            fcclInvalidArgument, "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollAlltoAll, SIZE_MAX / 3 + 1, 3, 1, 0, &s, &r),
            fcclInvalidArgument, "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollAllReduce, 5, 2, 0, 0, NULL, &r), fcclInvalidArgument,
            "fcclCollectiveCounts");
  CHECK_ERR(fcclCollectiveCounts(fcclCollAllReduce, 5, 2, 0, 0, &s, NULL), fcclInvalidArgument,
            "fcclCollectiveCounts");
  /* the largest counts that do not overflow are fine */
  if (CHECK_OK(fcclCollectiveCounts(fcclCollAllGather, SIZE_MAX / 2, 2, 1, 0, &s, &r)))
    CHECK(s == SIZE_MAX / 2 && r == (SIZE_MAX / 2) * 2,
          "fcclCollectiveCounts(AllGather, SIZE_MAX/2, 2 ranks): send=%zu recv=%zu", s, r);

  fccl_phase("fcclCollectiveAdjoint");
  for (k = 0; k < 8; k++) {
    int a = -12345, aa = -12345;
    if (CHECK_OK(fcclCollectiveAdjoint(adj[k][0], &a))) {
      CHECK(a == adj[k][1], "fcclCollectiveAdjoint(%d (%s)) = %d (%s), expected %d (%s)", adj[k][0],
            coll_name(adj[k][0]), a, coll_name(a), adj[k][1], coll_name(adj[k][1]));
      if (CHECK_OK(fcclCollectiveAdjoint(a, &aa)))
        CHECK(aa == adj[k][0], "adjoint of the adjoint of %s is %s", coll_name(adj[k][0]),
              coll_name(aa));
    }
  }
  {
    int a = -12345;
    CHECK_ERR(fcclCollectiveAdjoint(-1, &a), fcclInvalidArgument, "fcclCollectiveAdjoint");
    CHECK_ERR(fcclCollectiveAdjoint(8, &a), fcclInvalidArgument, "fcclCollectiveAdjoint");
    CHECK_ERR(fcclCollectiveAdjoint(1000, &a), fcclInvalidArgument, "fcclCollectiveAdjoint");
    CHECK(a == -12345, "fcclCollectiveAdjoint wrote its output on an error (%d)", a);
    CHECK_ERR(fcclCollectiveAdjoint(fcclCollAllGather, NULL), fcclInvalidArgument,
              "fcclCollectiveAdjoint");
  }
}

/* ================================================================== body */

static int body(fcclComm_t comm, int rank, int nranks) {
  static const size_t s46[2] = {4, 6};
  static const size_t c123[3] = {1, 2, 3}, c103[3] = {1, 0, 3}, c6[1] = {6};
  static const size_t s3d[3] = {2, 5, 3};
  static const size_t c203[3] = {2, 0, 3}, c2[1] = {2}, c11[2] = {1, 1}, c0005[4] = {0, 0, 0, 5};
  static const size_t s4d[4] = {2, 3, 1, 4};
  static const size_t s1d[1] = {10}, c37[2] = {3, 7};
  static const size_t sz[3] = {3, 0, 2}, cz[2] = {0, 0};
  (void)comm;
  if (rank != 0 || nranks != 1) {
    printf("test_ext_local is a single-process test (got rank %d of %d): skipped\n", rank, nranks);
    return FCCL_SKIP;
  }
  local_broadcast();

  /* the 4x6 float tensor */
  scatter_gather(fcclFloat32, 2, s46, 0, NULL, 1);
  scatter_gather(fcclFloat32, 2, s46, 0, NULL, 2);
  scatter_gather(fcclFloat32, 2, s46, 0, NULL, 4);
  scatter_gather(fcclFloat32, 2, s46, 1, NULL, 2);
  scatter_gather(fcclFloat32, 2, s46, 1, NULL, 3);
  scatter_gather(fcclFloat32, 2, s46, 1, NULL, 6);
  scatter_gather(fcclFloat32, 2, s46, 1, c123, 3);
  scatter_gather(fcclFloat32, 2, s46, 0, c103, 3);
  scatter_gather(fcclFloat32, 2, s46, 1, c6, 1);
  /* other ranks and types, every dim */
  scatter_gather(fcclBfloat16, 3, s3d, 0, c2, 1);
  scatter_gather(fcclBfloat16, 3, s3d, 0, c11, 2);
  scatter_gather(fcclFloat64, 3, s3d, 1, c203, 3);
  scatter_gather(fcclFloat64, 3, s3d, 1, c0005, 4);
  scatter_gather(fcclInt8, 3, s3d, 2, NULL, 3);
  scatter_gather(fcclInt8, 3, s3d, 2, c123 + 2, 1); /* {3} */
  scatter_gather(fcclInt64, 4, s4d, 3, NULL, 2);
  scatter_gather(fcclInt64, 4, s4d, 1, c123, 2); /* {1,2} sums to 3 */
  scatter_gather(fcclUint8, 1, s1d, 0, c37, 2);
  scatter_gather(fcclUint8, 1, s1d, 0, NULL, 5);
  scatter_gather(fcclUint8, 1, s1d, 0, NULL, 3);   /* uneven: {4,3,3} */
  scatter_gather(fcclFloat32, 2, s46, 0, NULL, 3); /* uneven: {2,1,1} */
  scatter_gather(fcclFloat32, 2, s46, 1, NULL, 4); /* uneven: {2,2,1,1} */
  scatter_gather(fcclFloat16, 3, sz, 1, cz, 2); /* zero-size tensor */
  scatter_errors();
  device_cases();
  planning();
  printf("test_ext_local: CUDA %s\n", g_have_cuda == 1 ? "present: device round trips ran"
                                      : "absent: device ids checked for fcclUnavailable");
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
