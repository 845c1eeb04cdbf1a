/* fcclReduce: every type x op, every root, in-place and out-of-place, counts {0, 1, 7,
 * 1000003} and a 4 MiB message.  Non-roots may pass recvbuff NULL; when they pass a buffer
 * it is left alone, and a non-root's in-place buffer (its sendbuff) is not modified. */
#include "harness.h"

static void run_case(fcclComm_t comm, int rank, const fccl_pattern* pat, const fccl_ref* ref,
                     size_t count, int root, int inplace, int nonroot_null, size_t base) {
  size_t esz = pat->esz, bytes = count * esz;
  unsigned char* send = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  unsigned char* recv = NULL;
  char what[192], w2[512];
  int own_recv = 0;
  snprintf(what, sizeof what, "reduce %s %s count=%zu root=%d %s%s", fccl_dt_name(pat->dt),
           fccl_op_name(ref->op), count, root, inplace ? "in-place" : "out-of-place",
           (!inplace && nonroot_null) ? " (NULL recvbuff on non-roots)" : "");
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, send, count, fccl_rank_off(base, rank));
  memset(send + bytes, FCCL_SENT_GAP, FCCL_SLACK);
  if (inplace) {
    recv = send;
  } else if (rank == root || !nonroot_null) {
    recv = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
    memset(recv, FCCL_SENT_RECV, bytes + FCCL_SLACK);
    own_recv = 1;
  }

  if (CHECK_OK(fcclReduce(send, recv, count, pat->dt, ref->op, root, comm, NULL))) {
    if (rank == root) REF_CHECK(ref, recv, count, base, what);
  }
  if (rank == root) {
    snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
    BYTES_CHECK(recv + bytes, FCCL_SLACK, inplace ? FCCL_SENT_GAP : FCCL_SENT_RECV, w2);
  } else if (own_recv) {
    snprintf(w2, sizeof w2, "%s: a non-root's recvbuff was written", what);
    BYTES_CHECK(recv, bytes + FCCL_SLACK, FCCL_SENT_RECV, w2);
  }
  if (!inplace || rank != root) {
    snprintf(w2, sizeof w2, "%s: sendbuff was modified%s", what,
             inplace ? " (a non-root's in-place buffer)" : "");
    PATTERN_CHECK(pat, send, count, fccl_rank_off(base, rank), w2);
    snprintf(w2, sizeof w2, "%s: bytes after sendbuff", what);
    BYTES_CHECK(send + bytes, FCCL_SLACK, FCCL_SENT_GAP, w2);
  }
  if (own_recv) free(recv);
  free(send);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  int t, o, root;
  size_t base = 0;
  fccl_pattern pat;
  fccl_ref ref;
  for (t = 0; t < FCCL_NTYPES; t++) {
    for (o = 0; o < FCCL_NOPS; o++) {
      fcclDataType_t dt = fccl_types[t];
      fcclRedOp_t op = fccl_ops[o];
      fccl_pattern_init(&pat, dt, fccl_scheme_for_op(op));
      fccl_ref_init(&ref, &pat, op, nranks);
      run_case(comm, rank, &pat, &ref, 0, o % nranks, t % 2, 1, base += 211);
      for (root = 0; root < nranks; root++) {
        /* across the (type, op) pairs every root sees both counts and placements */
        size_t count = ((root + o) % 2) ? 7 : 1;
        int inplace = (root + t + o) % 2;
        run_case(comm, rank, &pat, &ref, count, root, inplace, (root + t) % 2, base += 211);
      }
      if (fccl_big_case_wanted(dt, op))
        run_case(comm, rank, &pat, &ref, FCCL_BIG_COUNT, (t + o) % nranks, (t + o) % 2, o % 2,
                 base += 211);
      fccl_ref_free(&ref);
      fccl_pattern_free(&pat);
    }
  }
  /* 4 MiB */
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_SUM);
  fccl_ref_init(&ref, &pat, fcclSum, nranks);
  run_case(comm, rank, &pat, &ref, (size_t)1 << 20, nranks - 1, 0, 1, base += 211);
  fccl_ref_free(&ref);
  fccl_pattern_free(&pat);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
