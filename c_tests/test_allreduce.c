/* fcclAllReduce: every type x every op x {in-place, out-of-place} x counts {0, 1, 7,
 * 1000003}, wrapping integer arithmetic, >= 4 MiB messages, narrow floats rounded once
 * (float32 accumulation), fp8/half overflow, and host buffers from fcclMemAllocHost. */
#include "harness.h"

#include <math.h>

/* One all_reduce of `count` elements of pat's type, rank r's input being the pattern
 * rotated by fccl_rank_off(base, r), checked against ref. */
static void run_case(fcclComm_t comm, int rank, const fccl_pattern* pat, const fccl_ref* ref,
                     size_t count, int inplace, size_t base, int use_fccl_alloc) {
  size_t esz = pat->esz, bytes = count * esz;
  unsigned char *send, *recv;
  char what[192], w2[512];
  snprintf(what, sizeof what, "allreduce %s %s count=%zu %s%s", fccl_dt_name(pat->dt),
           fccl_op_name(ref->op), count, inplace ? "in-place" : "out-of-place",
           use_fccl_alloc ? " (fcclMemAllocHost buffers)" : "");
  fccl_phase("%s", what);
  if (use_fccl_alloc) {
    void *a = NULL, *b = NULL;
    if (!CHECK_OK(fcclMemAllocHost(&a, bytes + FCCL_SLACK)) ||
        !CHECK_OK(fcclMemAllocHost(&b, bytes + FCCL_SLACK))) {
      /* keep the collective sequence identical on every rank */
      a = fccl_xmalloc(bytes + FCCL_SLACK);
      b = fccl_xmalloc(bytes + FCCL_SLACK);
      use_fccl_alloc = 0;
    }
    send = (unsigned char*)a;
    recv = inplace ? send : (unsigned char*)b;
    if (inplace) {
      if (use_fccl_alloc) CHECK_OK(fcclMemFree(b)); else free(b);
    }
  } else {
    send = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
    recv = inplace ? send : (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  }
  fccl_pattern_fill(pat, send, count, fccl_rank_off(base, rank));
  memset(send + bytes, FCCL_SENT_GAP, FCCL_SLACK);
  if (!inplace) memset(recv, FCCL_SENT_RECV, bytes + FCCL_SLACK);

  if (CHECK_OK(fcclAllReduce(send, recv, count, pat->dt, ref->op, comm, NULL)))
    REF_CHECK(ref, recv, count, base, what);
  snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
  BYTES_CHECK(recv + bytes, FCCL_SLACK, inplace ? FCCL_SENT_GAP : FCCL_SENT_RECV, w2);
  if (!inplace) {
    snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
    PATTERN_CHECK(pat, send, count, fccl_rank_off(base, rank), w2);
    snprintf(w2, sizeof w2, "%s: bytes after sendbuff", what);
    BYTES_CHECK(send + bytes, FCCL_SLACK, FCCL_SENT_GAP, w2);
  }
  if (use_fccl_alloc) {
    CHECK_OK(fcclMemFree(send));
    if (!inplace) CHECK_OK(fcclMemFree(recv));
  } else {
    free(send);
    if (!inplace) free(recv);
  }
}

/* A different rotation for every case; the same sequence on every rank. */
static size_t next_base(size_t* b) {
  *b = (*b + 977) % FCCL_PERIOD;
  return *b;
}

/* Narrow floats must be accumulated in float32 and rounded once: element i has 2^m on
 * rank i % nranks (m = mantissa bits, so its spacing is 1) and +-0.5 elsewhere.  Rounding
 * after every step would drop each 0.5 (ties to even), rounding once keeps their sum. */
static void once_rounding_case(fcclComm_t comm, int rank, int nranks, fcclDataType_t dt) {
  const size_t count = 6 * 7 + 5;
  int mbits = dt == fcclFloat16 ? 10 : dt == fcclBfloat16 ? 7 : dt == fcclFloat8e4m3 ? 3 : 2;
  double big = ldexp(1.0, mbits);
  size_t esz = fccl_dt_size(dt), i;
  unsigned char* send = (unsigned char*)fccl_xmalloc(count * esz);
  unsigned char* recv = (unsigned char*)fccl_xmalloc(count * esz + FCCL_SLACK);
  unsigned char* exp = (unsigned char*)fccl_xmalloc(count * esz);
  char what[160], g[96], e[96];
  snprintf(what, sizeof what, "allreduce %s fcclSum once-rounding (2^%d + k*0.5)", fccl_dt_name(dt),
           mbits);
  fccl_phase("%s", what);
  for (i = 0; i < count; i++) {
    double sign = ((i / 7) % 2) ? -1.0 : 1.0;
    int owner = (int)(i % (size_t)nranks);
    double small = (i % 5 == 4) ? 1.5 : 0.5; /* an odd multiple of 0.5 also in the mix */
    fccl_store_f(dt, send, i, sign * (rank == owner ? big : small));
    fccl_store_f(dt, exp, i, sign * (big + small * (double)(nranks - 1)));
  }
  memset(recv, FCCL_SENT_RECV, count * esz + FCCL_SLACK);
  if (CHECK_OK(fcclAllReduce(send, recv, count, dt, fcclSum, comm, NULL))) {
    int shown = 0;
    for (i = 0; i < count; i++) {
      if (fccl_load_f(dt, recv, i) != fccl_load_f(dt, exp, i) && shown++ < 3) {
        fccl_format_elem(dt, recv, i, g, sizeof g);
        fccl_format_elem(dt, exp, i, e, sizeof e);
        CHECK(0, "%s: element %zu: expected %s (exact sum rounded once), got %s", what, i, e, g);
      }
    }
  }
  BYTES_CHECK(recv + count * esz, FCCL_SLACK, FCCL_SENT_RECV, "once-rounding: bytes after recvbuff");
  free(send);
  free(recv);
  free(exp);
}

/* Results beyond the range: fp16/e5m2 become +-inf, OCP e4m3 (no inf) saturates to +-448. */
static void overflow_case(fcclComm_t comm, int rank, int nranks, fcclDataType_t dt, double v) {
  const size_t count = 4;
  size_t esz = fccl_dt_size(dt), i;
  unsigned char* send = (unsigned char*)fccl_xmalloc(count * esz);
  unsigned char* recv = (unsigned char*)fccl_xmalloc(count * esz);
  unsigned char* exp = (unsigned char*)fccl_xmalloc(count * esz);
  char what[160], g[96], e[96];
  (void)rank;
  snprintf(what, sizeof what, "allreduce %s fcclSum overflow (%g from each of %d ranks)",
           fccl_dt_name(dt), v, nranks);
  fccl_phase("%s", what);
  for (i = 0; i < count; i++) {
    double s = (i % 2) ? -v : v;
    fccl_store_f(dt, send, i, s);
    fccl_store_f(dt, exp, i, s * (double)nranks); /* the encoder saturates / overflows */
  }
  memset(recv, FCCL_SENT_RECV, count * esz);
  if (CHECK_OK(fcclAllReduce(send, recv, count, dt, fcclSum, comm, NULL))) {
    for (i = 0; i < count; i++) {
      if (memcmp(recv + i * esz, exp + i * esz, esz) != 0) {
        fccl_format_elem(dt, recv, i, g, sizeof g);
        fccl_format_elem(dt, exp, i, e, sizeof e);
        CHECK(0, "%s: element %zu: expected %s, got %s", what, i, e, g);
      }
    }
  }
  free(send);
  free(recv);
  free(exp);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  static const size_t counts[] = {0, 1, 7, FCCL_BIG_COUNT};
  const int ncounts = (int)(sizeof counts / sizeof counts[0]);
  int t, o, c, ip;
  size_t base = 0;
  fccl_pattern pat;
  fccl_ref ref;

  /* every type x op x count x placement (the big count in one placement per pair) */
  for (t = 0; t < FCCL_NTYPES; t++) {
    for (o = 0; o < FCCL_NOPS; o++) {
      fccl_pattern_init(&pat, fccl_types[t], fccl_scheme_for_op(fccl_ops[o]));
      fccl_ref_init(&ref, &pat, fccl_ops[o], nranks);
      for (c = 0; c < ncounts; c++) {
        for (ip = 0; ip < 2; ip++) {
          if (counts[c] == FCCL_BIG_COUNT && (t + o + ip) % 2) continue;
          run_case(comm, rank, &pat, &ref, counts[c], ip, next_base(&base), 0);
        }
      }
      fccl_ref_free(&ref);
      fccl_pattern_free(&pat);
    }
  }

  /* integers over their full range: sums and products wrap, avg = wrapped sum / n */
  for (t = 0; t < FCCL_NTYPES; t++) {
    static const fcclRedOp_t wrap_ops[3] = {fcclSum, fcclProd, fcclAvg};
    if (fccl_dt_is_float(fccl_types[t])) continue;
    fccl_pattern_init(&pat, fccl_types[t], FCCL_SCHEME_FULL);
    for (o = 0; o < 3; o++) {
      fccl_ref_init(&ref, &pat, wrap_ops[o], nranks);
      run_case(comm, rank, &pat, &ref, 7, 0, next_base(&base), 0);
      run_case(comm, rank, &pat, &ref, 1000, 1, next_base(&base), 0);
      fccl_ref_free(&ref);
    }
    fccl_pattern_free(&pat);
  }

  /* >= 4 MiB messages */
  {
    static const fcclDataType_t dts[4] = {fcclFloat32, fcclBfloat16, fcclInt32, fcclInt8};
    for (t = 0; t < 4; t++) {
      size_t count = ((size_t)4 << 20) / fccl_dt_size(dts[t]);
      fccl_pattern_init(&pat, dts[t], FCCL_SCHEME_SUM);
      fccl_ref_init(&ref, &pat, fcclSum, nranks);
      run_case(comm, rank, &pat, &ref, count, t == 3, next_base(&base), 0);
      fccl_ref_free(&ref);
      fccl_pattern_free(&pat);
    }
  }

  /* buffers from fcclMemAllocHost */
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_SUM);
  fccl_ref_init(&ref, &pat, fcclSum, nranks);
  run_case(comm, rank, &pat, &ref, 100003, 0, next_base(&base), 1);
  run_case(comm, rank, &pat, &ref, 100003, 1, next_base(&base), 1);
  fccl_ref_free(&ref);
  fccl_pattern_free(&pat);

  /* narrow floats: one rounding from a float32 accumulator, overflow rules */
  once_rounding_case(comm, rank, nranks, fcclFloat16);
  once_rounding_case(comm, rank, nranks, fcclBfloat16);
  once_rounding_case(comm, rank, nranks, fcclFloat8e4m3);
  once_rounding_case(comm, rank, nranks, fcclFloat8e5m2);
  overflow_case(comm, rank, nranks, fcclFloat8e4m3, 256.0);   /* n >= 2: saturates at 448 */
  overflow_case(comm, rank, nranks, fcclFloat8e5m2, 40960.0); /* n >= 2: inf */
  overflow_case(comm, rank, nranks, fcclFloat16, 40000.0);    /* n >= 2: inf */

  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
