/* Shape-aware collectives (docs/abi.md "Extensions beyond NCCL"): dense row-major tensors.
 *
 * fcclAllGatherAxis: ndims 1..4, every axis, several shapes (sizes of 1, a zero-size
 * tensor, a ~36k-element one) and types; rank r's block lands at offset r*shape[axis]
 * along the axis.  The ABI's example (2x3 per rank, axis 1 -> rows [a0 a1 a2 b0 b1 b2]),
 * and axis 0 gives the same bytes as fcclAllGather.
 * fcclReduceScatterAxis: ndims 1..4, every axis with shape[axis] = nranks*m, several
 * type/op pairs; rank r gets block r along the axis; axis 0 gives the same bytes as
 * fcclReduceScatter.
 * Errors (every rank makes the same bad call): ndims <= 0, axis -1 / ndims, NULL shape,
 * shape[axis] not divisible by nranks (ReduceScatterAxis), a shape whose byte size
 * overflows size_t (input, or only the gathered output) -> fcclInvalidArgument with a
 * message naming the call and the offending dimension, recvbuff untouched. */
#include "harness.h"

#define MAXD 4

/* Multi-index of flat element f of a tensor of the given shape, as "(i,j,k)". */
static void index_str(char* out, size_t n, int ndims, const size_t* shape, size_t f) {
  size_t idx[MAXD], used = 0;
  int k;
  for (k = ndims - 1; k >= 0; k--) {
    idx[k] = shape[k] ? f % shape[k] : 0;
    f = shape[k] ? f / shape[k] : 0;
  }
  out[0] = 0;
  for (k = 0; k < ndims && used < n; k++) {
    int w = snprintf(out + used, n - used, "%s%zu%s", k ? "," : "(", idx[k],
                     k == ndims - 1 ? ")" : "");
    if (w < 0) break;
    used += (size_t)w;
  }
}

/* Compares got with want element by element; reports the first 3 differing elements with
 * their index in a tensor of shape oshape. */
static void compare_tensor(const char* what, fcclDataType_t dt, const unsigned char* got,
                           const unsigned char* want, int ndims, const size_t* oshape) {
  size_t n = fccl_shape_prod(oshape, 0, ndims), esz = fccl_dt_size(dt), i, bad = 0;
  char g[96], e[96], ix[96];
  if (memcmp(got, want, n * esz) == 0) return;
  for (i = 0; i < n; i++) {
    if (memcmp(got + i * esz, want + i * esz, esz) != 0) {
      if (bad < 3) {
        fccl_format_elem(dt, got, i, g, sizeof g);
        fccl_format_elem(dt, want, i, e, sizeof e);
        index_str(ix, sizeof ix, ndims, oshape, i);
        CHECK(0, "%s: element %s (flat %zu of %zu): expected %s, got %s", what, ix, i, n, e, g);
      }
      bad++;
    }
  }
  CHECK(bad <= 3, "%s: %zu of %zu elements wrong in all", what, bad, n);
}

/* ================================================================== AllGatherAxis */

static void gather_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                        int ndims, const size_t* shape, int axis, size_t base) {
  size_t esz = pat->esz, n = fccl_shape_prod(shape, 0, ndims), outer = fccl_shape_prod(shape, 0, axis);
  size_t inner = fccl_shape_prod(shape, axis + 1, ndims), S = shape[axis];
  size_t oshape[MAXD], on = n * (size_t)nranks, obytes = on * esz, o, a;
  unsigned char *send, *recv, *want, *in_r;
  char what[256], w2[512], sh[64];
  int r, k;
  for (k = 0; k < ndims; k++) oshape[k] = shape[k];
  oshape[axis] = S * (size_t)nranks;
  fccl_shape_str(sh, sizeof sh, ndims, shape);
  snprintf(what, sizeof what, "fcclAllGatherAxis %s shape=%s ndims=%d axis=%d",
           fccl_dt_name(pat->dt), sh, ndims, axis);
  fccl_phase("%s", what);
  send = (unsigned char*)fccl_xmalloc(n * esz + FCCL_SLACK);
  recv = (unsigned char*)fccl_xmalloc(obytes + FCCL_SLACK);
  want = (unsigned char*)fccl_xmalloc(obytes + 1);
  in_r = (unsigned char*)fccl_xmalloc(n * esz + 1);
  fccl_pattern_fill(pat, send, n, fccl_rank_off(base, rank));
  memset(send + n * esz, FCCL_SENT_GAP, FCCL_SLACK);
  memset(recv, FCCL_SENT_RECV, obytes + FCCL_SLACK);
  /* want[o][r*S + a][i] = input_r[o][a][i] */
  for (r = 0; r < nranks; r++) {
    fccl_pattern_fill(pat, in_r, n, fccl_rank_off(base, r));
    for (o = 0; o < outer; o++)
      for (a = 0; a < S; a++)
        memcpy(want + ((o * S * (size_t)nranks + (size_t)r * S + a) * inner) * esz,
               in_r + ((o * S + a) * inner) * esz, inner * esz);
  }
  if (CHECK_OK(fcclAllGatherAxis(send, recv, ndims, shape, axis, pat->dt, comm, NULL)))
    compare_tensor(what, pat->dt, recv, want, ndims, oshape);
  snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
  BYTES_CHECK(recv + obytes, FCCL_SLACK, FCCL_SENT_RECV, w2);
  snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
  PATTERN_CHECK(pat, send, n, fccl_rank_off(base, rank), w2);
  BYTES_CHECK(send + n * esz, FCCL_SLACK, FCCL_SENT_GAP, w2);

  if (axis == 0) { /* the same bytes as a plain all-gather of the flat tensor */
    unsigned char* plain = (unsigned char*)fccl_xmalloc(obytes + 1);
    snprintf(w2, sizeof w2, "%s vs fcclAllGather(sendcount=%zu)", what, n);
    fccl_phase("%s", w2);
    memset(plain, FCCL_SENT_RECV, obytes + 1);
    if (CHECK_OK(fcclAllGather(send, plain, n, pat->dt, comm, NULL)))
      CHECK(memcmp(plain, recv, obytes) == 0, "%s: results differ", w2);
    free(plain);
  }
  free(send);
  free(recv);
  free(want);
  free(in_r);
}

/* docs/abi.md: two ranks, each a 2x3 tensor, axis 1 -> 2x6 with rows [a0 a1 a2 b0 b1 b2];
 * generalised to nranks: row i = row i of rank 0, of rank 1, ... */
static void abi_example(fcclComm_t comm, int rank, int nranks) {
  static const size_t shape[2] = {2, 3};
  float send[6], *recv, *want;
  size_t cols = 3 * (size_t)nranks, i, j;
  int r, ok = 1;
  fccl_phase("fcclAllGatherAxis ABI example 2x3 axis 1");
  recv = (float*)fccl_xmalloc(6 * (size_t)nranks * sizeof(float));
  want = (float*)fccl_xmalloc(6 * (size_t)nranks * sizeof(float));
  for (i = 0; i < 6; i++) send[i] = (float)(100 * rank + (int)i); /* a_i = rank*100 + i */
  for (i = 0; i < 6 * (size_t)nranks; i++) recv[i] = -1.0f;
  for (i = 0; i < 2; i++)
    for (r = 0; r < nranks; r++)
      for (j = 0; j < 3; j++) want[i * cols + (size_t)r * 3 + j] = (float)(100 * r + (int)(i * 3 + j));
  if (nranks == 2) { /* spelled out: rows [a0 a1 a2 b0 b1 b2] and [a3 a4 a5 b3 b4 b5] */
    static const float lit[12] = {0, 1, 2, 100, 101, 102, 3, 4, 5, 103, 104, 105};
    CHECK(memcmp(lit, want, sizeof lit) == 0, "test bug: ABI example reference");
  }
  if (CHECK_OK(fcclAllGatherAxis(send, recv, 2, shape, 1, fcclFloat32, comm, NULL))) {
    for (i = 0; i < 6 * (size_t)nranks; i++)
      if (recv[i] != want[i]) ok = 0;
    if (!ok) {
      char gs[512], ws[512];
      size_t gu = 0, wu = 0;
      for (i = 0; i < 6 * (size_t)nranks && gu < 400; i++) {
        gu += (size_t)snprintf(gs + gu, sizeof gs - gu, "%s%g", i % cols ? " " : (i ? " | " : ""),
                               (double)recv[i]);
        wu += (size_t)snprintf(ws + wu, sizeof ws - wu, "%s%g", i % cols ? " " : (i ? " | " : ""),
                               (double)want[i]);
      }
      CHECK(0, "fcclAllGatherAxis 2x3 axis=1 over %d ranks (rank r's a_i = 100r+i): "
               "expected rows [%s], got [%s]", nranks, ws, gs);
    }
  }
  free(recv);
  free(want);
}

/* ================================================================== ReduceScatterAxis */

static void rs_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                    const fccl_ref* ref, int ndims, const size_t* shape, int axis, size_t base) {
  size_t esz = pat->esz, n = fccl_shape_prod(shape, 0, ndims), outer = fccl_shape_prod(shape, 0, axis);
  size_t inner = fccl_shape_prod(shape, axis + 1, ndims), S = shape[axis], blk = S / (size_t)nranks;
  size_t on = n / (size_t)nranks, obytes = on * esz, o, b, bad = 0;
  unsigned char *send, *recv;
  char what[256], w2[512], sh[64];
  fccl_shape_str(sh, sizeof sh, ndims, shape);
  snprintf(what, sizeof what, "fcclReduceScatterAxis %s %s shape=%s ndims=%d axis=%d",
           fccl_dt_name(pat->dt), fccl_op_name(ref->op), sh, ndims, axis);
  fccl_phase("%s", what);
  send = (unsigned char*)fccl_xmalloc(n * esz + FCCL_SLACK);
  recv = (unsigned char*)fccl_xmalloc(obytes + FCCL_SLACK);
  fccl_pattern_fill(pat, send, n, fccl_rank_off(base, rank));
  memset(send + n * esz, FCCL_SENT_GAP, FCCL_SLACK);
  memset(recv, FCCL_SENT_RECV, obytes + FCCL_SLACK);
  /* recv[o][b][i] = op over ranks of input[o][rank*blk + b][i] = ref[base + flat index] */
  if (CHECK_OK(fcclReduceScatterAxis(send, recv, ndims, shape, axis, pat->dt, ref->op, comm,
                                     NULL))) {
    for (o = 0; o < outer && bad < 3; o++)
      for (b = 0; b < blk && bad < 3; b++) {
        snprintf(w2, sizeof w2, "%s: output block [outer %zu][%zu of %zu along axis] (input row %zu)",
                 what, o, b, blk, (size_t)rank * blk + b);
        if (REF_CHECK(ref, recv + (o * blk + b) * inner * esz, inner,
                      base + (o * S + (size_t)rank * blk + b) * inner, w2))
          bad++;
      }
  }
  snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
  BYTES_CHECK(recv + obytes, FCCL_SLACK, FCCL_SENT_RECV, w2);
  snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
  PATTERN_CHECK(pat, send, n, fccl_rank_off(base, rank), w2);
  BYTES_CHECK(send + n * esz, FCCL_SLACK, FCCL_SENT_GAP, w2);

  if (axis == 0) { /* the same bytes as a plain reduce-scatter of the flat tensor */
    unsigned char* plain = (unsigned char*)fccl_xmalloc(obytes + 1);
    snprintf(w2, sizeof w2, "%s vs fcclReduceScatter(recvcount=%zu)", what, on);
    fccl_phase("%s", w2);
    if (CHECK_OK(fcclReduceScatter(send, plain, on, pat->dt, ref->op, comm, NULL)))
      CHECK(memcmp(plain, recv, obytes) == 0, "%s: results differ", w2);
    free(plain);
  }
  free(send);
  free(recv);
}

/* ================================================================== errors */

/* The message must contain one of the keywords (NULL-terminated list). */
static void check_msg(const char* call, const char* const* keys) {
  const char* msg = fcclGetLastError(NULL);
  int k;
  char want[128];
  size_t u = 0;
  for (k = 0; keys[k]; k++)
    if (msg && strstr(msg, keys[k])) return;
  want[0] = 0;
  for (k = 0; keys[k] && u < sizeof want; k++)
    u += (size_t)snprintf(want + u, sizeof want - u, "%s\"%s\"", k ? " or " : "", keys[k]);
  CHECK(0, "%s: fcclGetLastError(NULL) = \"%s\" should name the dimension (contain %s)", call,
        msg ? msg : "(NULL)", want);
}

#define AX_ERR(call, fname, keys, desc)                                               \
  do {                                                                                \
    fccl_phase("%s: %s", fname, desc);                                                \
    memset(recv, FCCL_SENT_RECV, sizeof recv);                                        \
    if (CHECK_ERR(call, fcclInvalidArgument, fname)) check_msg(fname " (" desc ")", keys); \
    BYTES_CHECK(recv, sizeof recv, FCCL_SENT_RECV, fname " (" desc "): recvbuff written"); \
  } while (0)

static void error_cases(int rank, int nranks, fcclComm_t comm) {
  static const char* const k_ndims[] = {"ndims", NULL};
  static const char* const k_axis[] = {"axis", NULL};
  static const char* const k_dim[] = {"shape[", "axis", NULL};
  static const char* const k_any[] = {"shape", "axis", "ndims", NULL};
  float send[64];
  unsigned char recv[1024];
  size_t s23[3] = {2, 3, 4};
  size_t big[2], big1[1];
  size_t nd[3];
  (void)rank;
  memset(send, 0, sizeof send);

  AX_ERR(fcclAllGatherAxis(send, recv, 0, s23, 0, fcclFloat32, comm, NULL), "fcclAllGatherAxis",
         k_ndims, "ndims=0");
  AX_ERR(fcclAllGatherAxis(send, recv, -1, s23, 0, fcclFloat32, comm, NULL), "fcclAllGatherAxis",
         k_ndims, "ndims=-1");
  AX_ERR(fcclAllGatherAxis(send, recv, 3, s23, -1, fcclFloat32, comm, NULL), "fcclAllGatherAxis",
         k_axis, "axis=-1");
  AX_ERR(fcclAllGatherAxis(send, recv, 3, s23, 3, fcclFloat32, comm, NULL), "fcclAllGatherAxis",
         k_axis, "axis=ndims=3");
  AX_ERR(fcclAllGatherAxis(send, recv, 2, NULL, 0, fcclFloat32, comm, NULL), "fcclAllGatherAxis",
         k_any, "shape=NULL");
  AX_ERR(fcclReduceScatterAxis(send, recv, 0, s23, 0, fcclFloat32, fcclSum, comm, NULL),
         "fcclReduceScatterAxis", k_ndims, "ndims=0");
  AX_ERR(fcclReduceScatterAxis(send, recv, -3, s23, 0, fcclFloat32, fcclSum, comm, NULL),
         "fcclReduceScatterAxis", k_ndims, "ndims=-3");
  AX_ERR(fcclReduceScatterAxis(send, recv, 3, s23, -1, fcclFloat32, fcclSum, comm, NULL),
         "fcclReduceScatterAxis", k_axis, "axis=-1");
  AX_ERR(fcclReduceScatterAxis(send, recv, 3, s23, 3, fcclFloat32, fcclSum, comm, NULL),
         "fcclReduceScatterAxis", k_axis, "axis=ndims=3");
  AX_ERR(fcclReduceScatterAxis(send, recv, 2, NULL, 0, fcclFloat32, fcclSum, comm, NULL),
         "fcclReduceScatterAxis", k_any, "shape=NULL");

  if (nranks >= 2) { /* shape[1] = nranks + 1 does not divide by nranks */
    nd[0] = 2;
    nd[1] = (size_t)nranks + 1;
    nd[2] = 3;
    AX_ERR(fcclReduceScatterAxis(send, recv, 3, nd, 1, fcclFloat32, fcclSum, comm, NULL),
           "fcclReduceScatterAxis", k_dim, "shape[1]=nranks+1 does not divide by nranks");
    nd[0] = (size_t)nranks * 2 + 1;
    nd[1] = 1;
    AX_ERR(fcclReduceScatterAxis(send, recv, 2, nd, 0, fcclInt32, fcclMax, comm, NULL),
           "fcclReduceScatterAxis", k_dim, "shape[0]=2*nranks+1 does not divide by nranks");
  }

  /* byte size of the input overflows size_t */
  big[0] = SIZE_MAX / 2;
  big[1] = 3;
  AX_ERR(fcclAllGatherAxis(send, recv, 2, big, 1, fcclFloat32, comm, NULL), "fcclAllGatherAxis",
         k_dim, "shape {SIZE_MAX/2, 3} float32 overflows");
  big[0] = 3;
  big[1] = SIZE_MAX / 2;
  AX_ERR(fcclAllGatherAxis(send, recv, 2, big, 0, fcclFloat32, comm, NULL), "fcclAllGatherAxis",
         k_dim, "shape {3, SIZE_MAX/2} float32 overflows");
  big[0] = SIZE_MAX / 4 + 1; /* elements fit, bytes do not */
  big[1] = 1;
  AX_ERR(fcclAllGatherAxis(send, recv, 2, big, 1, fcclFloat32, comm, NULL), "fcclAllGatherAxis",
         k_dim, "shape {SIZE_MAX/4+1, 1} float32: bytes overflow");
  big[0] = (size_t)nranks * ((SIZE_MAX / 2) / (size_t)nranks);
  big[1] = 3;
  AX_ERR(fcclReduceScatterAxis(send, recv, 2, big, 0, fcclFloat32, fcclSum, comm, NULL),
         "fcclReduceScatterAxis", k_dim, "shape {~SIZE_MAX/2, 3} float32 overflows");
  if (nranks >= 2) { /* the input fits; the gathered output (shape[0] * nranks) does not */
    big1[0] = SIZE_MAX / 4 / (size_t)nranks + 1;
    AX_ERR(fcclAllGatherAxis(send, recv, 1, big1, 0, fcclFloat32, comm, NULL), "fcclAllGatherAxis",
           k_dim, "shape {SIZE_MAX/4/nranks+1} float32: output overflows");
  }
}

/* ================================================================== body */

static int body(fcclComm_t comm, int rank, int nranks) {
  /* shapes per ndims; a zero-size tensor and a larger one included */
  static const size_t shapes[][MAXD] = {
      {5, 0, 0, 0}, {1, 0, 0, 0}, {2, 3, 0, 0}, {3, 1, 0, 0}, {1, 4, 0, 0},
      {2, 3, 4, 0}, {1, 5, 2, 0}, {3, 0, 2, 0}, {64, 33, 17, 0}, {2, 1, 3, 2}, {3, 2, 2, 3}};
  static const int shape_nd[] = {1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4};
  static const fcclDataType_t g_types[] = {fcclFloat32, fcclInt8, fcclBfloat16, fcclFloat64,
                                           fcclUint32};
  static const fcclDataType_t r_types[] = {fcclFloat32, fcclInt32, fcclBfloat16, fcclFloat64};
  static const fcclRedOp_t r_ops[] = {fcclSum, fcclMax, fcclAvg, fcclMin};
  static const size_t base_shape[MAXD] = {3, 2, 1, 2};
  size_t base = 0, shape[MAXD];
  int s, axis, nd, m, t;
  fccl_pattern pat;
  fccl_ref ref;

  abi_example(comm, rank, nranks);

  for (s = 0; s < (int)(sizeof shape_nd / sizeof shape_nd[0]); s++) {
    fcclDataType_t dt = g_types[s % 5];
    fccl_pattern_init(&pat, dt, FCCL_SCHEME_FULL);
    for (axis = 0; axis < shape_nd[s]; axis++)
      gather_case(comm, rank, nranks, &pat, shape_nd[s], shapes[s], axis, base += 131);
    fccl_pattern_free(&pat);
  }

  /* reduce-scatter: for every ndims and axis, shape[axis] = nranks * m */
  for (nd = 1; nd <= MAXD; nd++) {
    for (axis = 0; axis < nd; axis++) {
      for (m = 1; m <= 2; m++) {
        t = (nd + axis + m) % 4;
        memcpy(shape, base_shape, sizeof shape);
        shape[axis] = (size_t)nranks * (size_t)m;
        if (m == 2 && nd == 3) shape[(axis + 1) % 3] = 7;
        fccl_pattern_init(&pat, r_types[t], fccl_scheme_for_op(r_ops[(nd + axis) % 4]));
        fccl_ref_init(&ref, &pat, r_ops[(nd + axis) % 4], nranks);
        rs_case(comm, rank, nranks, &pat, &ref, nd, shape, axis, base += 131);
        fccl_ref_free(&ref);
        fccl_pattern_free(&pat);
      }
    }
  }
  /* a larger one and zero-size ones */
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_SUM);
  fccl_ref_init(&ref, &pat, fcclSum, nranks);
  shape[0] = 40;
  shape[1] = (size_t)nranks * 12;
  shape[2] = 33;
  rs_case(comm, rank, nranks, &pat, &ref, 3, shape, 1, base += 131);
  shape[0] = (size_t)nranks * 5;
  rs_case(comm, rank, nranks, &pat, &ref, 3, shape, 0, base += 131);
  shape[0] = 2;
  shape[1] = 0;
  shape[2] = 3;
  rs_case(comm, rank, nranks, &pat, &ref, 3, shape, 1, base += 131);
  shape[0] = 0;
  shape[1] = (size_t)nranks;
  rs_case(comm, rank, nranks, &pat, &ref, 2, shape, 1, base += 131);
  fccl_ref_free(&ref);
  fccl_pattern_free(&pat);

  error_cases(rank, nranks, comm);
  /* still works after the errors */
  fccl_pattern_init(&pat, fcclInt32, FCCL_SCHEME_FULL);
  gather_case(comm, rank, nranks, &pat, 3, shapes[5], 1, base += 131);
  fccl_pattern_free(&pat);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
