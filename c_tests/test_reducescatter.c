/* fcclReduceScatter: every type x op, recvcount {0, 1, 7, ~1000003/nranks} and a 4 MiB
 * result per rank, out-of-place and in-place (recvbuff == sendbuff + rank * recvcount). */
#include "harness.h"

static void run_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                     const fccl_ref* ref, size_t count, int inplace, size_t base) {
  size_t esz = pat->esz, bytes = count * esz, sbytes = bytes * (size_t)nranks;
  size_t scount = count * (size_t)nranks;
  unsigned char* send = (unsigned char*)fccl_xmalloc(sbytes + FCCL_SLACK);
  unsigned char* recv;
  char what[192], w2[512];
  snprintf(what, sizeof what, "reducescatter %s %s recvcount=%zu %s", fccl_dt_name(pat->dt),
           fccl_op_name(ref->op), count, inplace ? "in-place" : "out-of-place");
  fccl_phase("%s", what);
  /* rank r's send element j is pattern[rank_off(base, r) + j]: block q of every rank
   * reduces to ref[base + q*count + i] */
  fccl_pattern_fill(pat, send, scount, fccl_rank_off(base, rank));
  memset(send + sbytes, FCCL_SENT_GAP, FCCL_SLACK);
  if (inplace) {
    recv = send + (size_t)rank * bytes;
  } else {
    recv = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
    memset(recv, FCCL_SENT_RECV, bytes + FCCL_SLACK);
  }

  if (CHECK_OK(fcclReduceScatter(send, recv, count, pat->dt, ref->op, comm, NULL)))
    REF_CHECK(ref, recv, count, base + (size_t)rank * count, what);
  if (inplace) {
    snprintf(w2, sizeof w2, "%s: bytes after sendbuff", what);
    BYTES_CHECK(send + sbytes, FCCL_SLACK, FCCL_SENT_GAP, w2);
  } else {
    snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
    BYTES_CHECK(recv + bytes, FCCL_SLACK, FCCL_SENT_RECV, w2);
    snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
    PATTERN_CHECK(pat, send, scount, fccl_rank_off(base, rank), w2);
    snprintf(w2, sizeof w2, "%s: bytes after sendbuff", what);
    BYTES_CHECK(send + sbytes, FCCL_SLACK, FCCL_SENT_GAP, w2);
    free(recv);
  }
  free(send);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  static const size_t small[] = {0, 1, 7};
  int t, o, c, ip;
  size_t base = 0;
  fccl_pattern pat;
  fccl_ref ref;
  for (t = 0; t < FCCL_NTYPES; t++) {
    for (o = 0; o < FCCL_NOPS; o++) {
      fcclDataType_t dt = fccl_types[t];
      fcclRedOp_t op = fccl_ops[o];
      fccl_pattern_init(&pat, dt, fccl_scheme_for_op(op));
      fccl_ref_init(&ref, &pat, op, nranks);
      for (c = 0; c < 3; c++)
        for (ip = 0; ip < 2; ip++)
          run_case(comm, rank, nranks, &pat, &ref, small[c], ip, base += 409);
      if (fccl_big_case_wanted(dt, op))
        run_case(comm, rank, nranks, &pat, &ref, fccl_big_per_rank(nranks), (t + o) % 2,
                 base += 409);
      fccl_ref_free(&ref);
      fccl_pattern_free(&pat);
    }
  }
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_SUM);
  fccl_ref_init(&ref, &pat, fcclSum, nranks);
  run_case(comm, rank, nranks, &pat, &ref, (size_t)1 << 20, 0, base += 409);
  fccl_ref_free(&ref);
  fccl_pattern_free(&pat);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
