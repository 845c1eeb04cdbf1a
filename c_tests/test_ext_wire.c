/* fcclAllReduceWire (docs/abi.md "Extensions beyond NCCL"): partial results reduced in the
 * accumulation precision of datatype, cast to wireType only for transfer.
 *
 * Narrow wires, against a float64 reference computed here from the inputs of every rank:
 *   float32 data over bfloat16 (u = 2^-8) and float16 (u = 2^-11), float64 data over
 *   float32 (u = 2^-24); sum, avg, max, min; counts 0, 1, 7, 50003; in-place too.
 *   The documented bound: each contribution is rounded once to the wire type, the partial
 *   sums (accumulated in the data type) are rounded to the wire type for each transfer,
 *   the result once more:
 *       sum: |result - exact| <= (nranks + 1) * u * sum_i |x_i|
 *   plus (nranks * eps_acc * sum_i |x_i|) for the rounding of the accumulation itself
 *   (eps_acc = 2^-24 for float32 data, 2^-53 for float64); avg: the same divided by nranks;
 *   max / min: one rounding, |result - exact| <= u * |exact|.
 *   Sum, max and min results are values of the wire type (rounded to it last).  float64
 *   inputs are scaled by (1 + 2^-20/3) so that they do not fit a float32 wire exactly.
 *   Every rank must get bitwise identical results (checked with an all-gather of the bytes).
 * Same-width wire: float32 over float32 must give exactly the bytes of fcclAllReduce (sum,
 * prod, max, min, avg), and float64 over float64 likewise for sum.
 * Unsupported combinations -> fcclInvalidArgument naming the call: integer data (int32 over
 * int32, bfloat16, float32), a wire wider than the data (float32 over float64, bfloat16 /
 * float16 over float32), an integer wire for float data, unknown wire type / op. */
#include "harness.h"

#include <math.h>

static const char* wname(fcclDataType_t dt) { return fccl_dt_name(dt); }

/* Checks every rank got the same bytes: all-gather them and compare with our own. */
static void same_on_all_ranks(fcclComm_t comm, int rank, int nranks, const void* buf,
                              size_t bytes, const char* what) {
  unsigned char* all = (unsigned char*)fccl_xmalloc(bytes * (size_t)nranks + 1);
  int r;
  if (CHECK_OK(fcclAllGather(buf, all, bytes, fcclUint8, comm, NULL))) {
    for (r = 0; r < nranks; r++) {
      if (memcmp(all + (size_t)r * bytes, buf, bytes) != 0) {
        size_t j = 0;
        while (j < bytes && all[(size_t)r * bytes + j] == ((const unsigned char*)buf)[j]) j++;
        CHECK(0, "%s: rank %d's result differs from rank %d's (first at byte %zu)", what, r,
              rank, j);
      }
    }
  }
  free(all);
}

/* Input element i of rank r: the pattern value, for float64 data scaled by (1 + 2^-20/3) so
 * that it is not representable in float32 (a float32 wire then has something to round). */
static double input_of(const fccl_pattern* pat, size_t base, int r, size_t i) {
  double v = fccl_load_f(pat->dt, pat->bytes, (fccl_rank_off(base, r) + i) % FCCL_PERIOD);
  return pat->dt == fcclFloat64 ? v * (1.0 + ldexp(1.0, -20) / 3.0) : v;
}

static void fill_input(const fccl_pattern* pat, void* buf, size_t count, size_t base, int r) {
  size_t i;
  for (i = 0; i < count; i++) fccl_store_f(pat->dt, buf, i, input_of(pat, base, r, i));
}

/* float64 reference: exact op over ranks and sum of |x| for element i */
static void exact_of(const fccl_pattern* pat, size_t base, int nranks, fcclRedOp_t op, size_t i,
                     double* exact, double* sabs) {
  double acc = 0.0, s = 0.0;
  int r;
  for (r = 0; r < nranks; r++) {
    double x = input_of(pat, base, r, i);
    s += fabs(x);
    if (r == 0) acc = x;
    else if (op == fcclMax) acc = x > acc ? x : acc;
    else if (op == fcclMin) acc = x < acc ? x : acc;
    else acc += x;
  }
  if (op == fcclAvg) acc /= (double)nranks;
  *exact = acc;
  *sabs = s;
}

static double unit_roundoff(fcclDataType_t wire) {
  switch ((int)wire) {
    case fcclBfloat16: return ldexp(1.0, -8);
    case fcclFloat16: return ldexp(1.0, -11);
    case fcclFloat32: return ldexp(1.0, -24);
    default: return ldexp(1.0, -53);
  }
}

/* v is a value of the wire type */
static int representable(fcclDataType_t wire, double v) {
  switch ((int)wire) {
    case fcclBfloat16: return fccl_bf16_to_double(fccl_bf16_from_double(v)) == v;
    case fcclFloat16: return fccl_f16_to_double(fccl_f16_from_double(v)) == v;
    case fcclFloat32: return (double)(float)v == v;
    default: return 1;
  }
}

static void narrow_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                        fcclRedOp_t op, fcclDataType_t wire, size_t count, int inplace,
                        size_t base) {
  fcclDataType_t dt = pat->dt;
  size_t esz = pat->esz, bytes = count * esz, i, bad = 0, notrep = 0;
  double u = unit_roundoff(wire), eps_acc = dt == fcclFloat64 ? ldexp(1.0, -53) : ldexp(1.0, -24);
  double n = (double)nranks, worst = 0.0;
  unsigned char *send, *send_copy, *recv;
  char what[256];
  snprintf(what, sizeof what, "fcclAllReduceWire(%s data, %s, wire %s, count=%zu%s)", wname(dt),
           fccl_op_name(op), wname(wire), count, inplace ? ", in-place" : "");
  fccl_phase("%s", what);
  send = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  send_copy = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  fill_input(pat, send, count, base, rank);
  memset(send + bytes, FCCL_SENT_GAP, FCCL_SLACK);
  memcpy(send_copy, send, bytes + FCCL_SLACK);
  if (inplace) {
    recv = send;
  } else {
    recv = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
    memset(recv, FCCL_SENT_RECV, bytes + FCCL_SLACK);
  }
  if (CHECK_OK(fcclAllReduceWire(send, recv, count, dt, op, wire, comm, NULL))) {
    for (i = 0; i < count; i++) {
      double exact, sabs, got = fccl_load_f(dt, recv, i), bound, err;
      exact_of(pat, base, nranks, op, i, &exact, &sabs);
      if (op == fcclSum)
        bound = (n + 1.0) * u * sabs + n * eps_acc * sabs;
      else if (op == fcclAvg)
        bound = ((n + 1.0) * u * sabs + n * eps_acc * sabs) / n;
      else
        bound = u * fabs(exact);
      err = fabs(got - exact);
      /* sum, max, min: the result is rounded to the wire type last, so it is a value of it */
      if (op != fcclAvg && !representable(wire, got)) {
        if (notrep < 3)
          CHECK(0, "%s: element %zu: got %.17g, which is not a %s value (the result is rounded "
                   "to the wire type last)", what, i, got, wname(wire));
        notrep++;
      }
      if (!(err <= bound)) { /* NaN fails too */
        if (bad < 3)
          CHECK(0, "%s: element %zu: got %.9g, exact %.17g, error %.3g > bound %.3g "
                   "(sum|x_i| = %.9g, nranks = %d)",
                what, i, got, exact, err, bound, sabs, nranks);
        bad++;
      } else if (bound > 0.0 && err / bound > worst) {
        worst = err / bound;
      }
    }
    CHECK(bad <= 3, "%s: %zu of %zu elements outside the bound", what, bad, count);
    CHECK(notrep <= 3, "%s: %zu of %zu elements not values of the wire type", what, notrep, count);
    if (getenv("FCCL_TEST_VERBOSE") && rank == 0)
      printf("%s: largest error / bound = %.3f\n", what, worst);
  }
  if (!inplace) {
    char w2[320];
    snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
    BYTES_CHECK(recv + bytes, FCCL_SLACK, FCCL_SENT_RECV, w2);
    snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
    CHECK(memcmp(send, send_copy, bytes + FCCL_SLACK) == 0, "%s", w2);
  }
  same_on_all_ranks(comm, rank, nranks, recv, bytes, what);
  if (!inplace) free(recv);
  free(send);
  free(send_copy);
}

/* wire == data type: must be exactly fcclAllReduce */
static void same_width_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                            fcclRedOp_t op, size_t count, int inplace, size_t base) {
  fcclDataType_t dt = pat->dt;
  size_t esz = pat->esz, bytes = count * esz, i;
  unsigned char *send, *recv, *plain;
  char what[256];
  snprintf(what, sizeof what, "fcclAllReduceWire(%s data, %s, wire %s, count=%zu%s) vs fcclAllReduce",
           wname(dt), fccl_op_name(op), wname(dt), count, inplace ? ", in-place" : "");
  fccl_phase("%s", what);
  send = (unsigned char*)fccl_xmalloc(bytes + 1);
  plain = (unsigned char*)fccl_xmalloc(bytes + 1);
  fill_input(pat, send, count, base, rank);
  memset(plain, FCCL_SENT_RECV, bytes + 1);
  CHECK_OK(fcclAllReduce(send, plain, count, dt, op, comm, NULL));
  if (inplace) {
    recv = send;
  } else {
    recv = (unsigned char*)fccl_xmalloc(bytes + 1);
    memset(recv, FCCL_SENT_RECV, bytes + 1);
  }
  if (CHECK_OK(fcclAllReduceWire(send, recv, count, dt, op, dt, comm, NULL))) {
    if (memcmp(recv, plain, bytes) != 0) {
      char g[96], e[96];
      for (i = 0; i < count; i++)
        if (memcmp(recv + i * esz, plain + i * esz, esz) != 0) break;
      fccl_format_elem(dt, recv, i, g, sizeof g);
      fccl_format_elem(dt, plain, i, e, sizeof e);
      CHECK(0, "%s: element %zu: fcclAllReduce gave %s, fcclAllReduceWire gave %s", what, i, e, g);
    }
  }
  same_on_all_ranks(comm, rank, nranks, recv, bytes, what);
  if (!inplace) free(recv);
  free(send);
  free(plain);
}

static void unsupported(fcclComm_t comm, fcclDataType_t dt, fcclRedOp_t op, fcclDataType_t wire) {
  unsigned char send[64], recv[64];
  char what[160];
  memset(send, 0, sizeof send);
  memset(recv, FCCL_SENT_RECV, sizeof recv);
  snprintf(what, sizeof what, "fcclAllReduceWire(%s data, op %d, wire %s (%d)) must be rejected",
           wname(dt), (int)op, wname(wire), (int)wire);
  fccl_phase("%s", what);
  if (!CHECK_ERR(fcclAllReduceWire(send, recv, 4, dt, op, wire, comm, NULL), fcclInvalidArgument,
                 "fcclAllReduceWire"))
    CHECK(0, "%s", what);
  BYTES_CHECK(recv, sizeof recv, FCCL_SENT_RECV, what);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  static const size_t counts[] = {0, 1, 7, 50003};
  static const fcclRedOp_t nops[] = {fcclSum, fcclAvg, fcclMax, fcclMin};
  static const fcclRedOp_t sops[] = {fcclSum, fcclProd, fcclMax, fcclMin, fcclAvg};
  static const fcclDataType_t wires[] = {fcclBfloat16, fcclFloat16};
  size_t base = 0;
  int w, o, c;
  fccl_pattern pat;

  /* float32 data over bfloat16 / float16 wires */
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_FULL);
  for (w = 0; w < 2; w++)
    for (o = 0; o < 4; o++)
      for (c = 0; c < 4; c++)
        narrow_case(comm, rank, nranks, &pat, nops[o], wires[w], counts[c], 0, base += 1237);
  narrow_case(comm, rank, nranks, &pat, fcclSum, fcclBfloat16, 4099, 1, base += 1237);
  narrow_case(comm, rank, nranks, &pat, fcclAvg, fcclFloat16, 4099, 1, base += 1237);
  /* several windows of the library's bounded scratch (8 MiB of wire data each) */
  narrow_case(comm, rank, nranks, &pat, fcclSum, fcclBfloat16, 9000011, 0, base += 1237);
  narrow_case(comm, rank, nranks, &pat, fcclMax, fcclFloat16, 8500003, 1, base += 1237);
  /* float32 over float32 == fcclAllReduce */
  for (o = 0; o < 5; o++) {
    fccl_pattern_free(&pat);
    fccl_pattern_init(&pat, fcclFloat32, sops[o] == fcclProd ? FCCL_SCHEME_PROD : FCCL_SCHEME_FULL);
    same_width_case(comm, rank, nranks, &pat, sops[o], 50003, 0, base += 1237);
    same_width_case(comm, rank, nranks, &pat, sops[o], 7, 1, base += 1237);
  }
  fccl_pattern_free(&pat);

  /* float64 data: over float32, and over float64 (== fcclAllReduce) */
  fccl_pattern_init(&pat, fcclFloat64, FCCL_SCHEME_FULL);
  narrow_case(comm, rank, nranks, &pat, fcclSum, fcclFloat32, 20011, 0, base += 1237);
  narrow_case(comm, rank, nranks, &pat, fcclMax, fcclFloat32, 20011, 1, base += 1237);
  same_width_case(comm, rank, nranks, &pat, fcclSum, 20011, 0, base += 1237);
  fccl_pattern_free(&pat);

  /* unsupported combinations */
  unsupported(comm, fcclInt32, fcclSum, fcclBfloat16);
  unsupported(comm, fcclInt32, fcclSum, fcclFloat32);
  unsupported(comm, fcclInt32, fcclSum, fcclInt32);
  unsupported(comm, fcclUint8, fcclMax, fcclUint8);
  unsupported(comm, fcclFloat32, fcclSum, fcclFloat64);  /* wider than the data */
  unsupported(comm, fcclBfloat16, fcclSum, fcclFloat32); /* wider than the data */
  unsupported(comm, fcclFloat16, fcclSum, fcclFloat32);  /* wider than the data */
  unsupported(comm, fcclFloat32, fcclSum, fcclInt8);     /* integer wire */
  unsupported(comm, fcclFloat32, fcclSum, fcclInt32);    /* integer wire */
  unsupported(comm, fcclFloat32, fcclSum, 99);           /* unknown wire type */
  unsupported(comm, fcclFloat32, 99, fcclBfloat16);      /* unknown op */
  unsupported(comm, 99, fcclSum, fcclBfloat16);          /* unknown data type */

  /* still works after the errors */
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_FULL);
  narrow_case(comm, rank, nranks, &pat, fcclSum, fcclBfloat16, 1001, 0, base += 1237);
  fccl_pattern_free(&pat);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
