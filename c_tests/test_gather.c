/* fcclGather: every type, every root, count per rank {0, 1, 7, ~1000003/nranks} and a
 * 4 MiB-per-rank message.  Non-roots pass recvbuff NULL. */
#include "harness.h"

static void run_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                     size_t count, int root, size_t base) {
  size_t esz = pat->esz, bytes = count * esz, tot = bytes * (size_t)nranks;
  unsigned char* send = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  unsigned char* recv = NULL;
  char what[192], w2[512];
  int r;
  snprintf(what, sizeof what, "gather %s count=%zu root=%d", fccl_dt_name(pat->dt), count, root);
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, send, count, fccl_rank_off(base, rank));
  memset(send + bytes, FCCL_SENT_GAP, FCCL_SLACK);
  if (rank == root) {
    recv = (unsigned char*)fccl_xmalloc(tot + FCCL_SLACK);
    memset(recv, FCCL_SENT_RECV, tot + FCCL_SLACK);
  }
  if (CHECK_OK(fcclGather(send, recv, count, pat->dt, root, comm, NULL)) && rank == root) {
    for (r = 0; r < nranks; r++) {
      snprintf(w2, sizeof w2, "%s: block of rank %d", what, r);
      PATTERN_CHECK(pat, recv + (size_t)r * bytes, count, fccl_rank_off(base, r), w2);
    }
  }
  if (rank == root) {
    snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
    BYTES_CHECK(recv + tot, FCCL_SLACK, FCCL_SENT_RECV, w2);
  }
  snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
  PATTERN_CHECK(pat, send, count, fccl_rank_off(base, rank), w2);
  snprintf(w2, sizeof w2, "%s: bytes after sendbuff", what);
  BYTES_CHECK(send + bytes, FCCL_SLACK, FCCL_SENT_GAP, w2);
  free(send);
  free(recv);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  int t, root;
  size_t base = 0;
  fccl_pattern pat;
  for (t = 0; t < FCCL_NTYPES; t++) {
    fccl_pattern_init(&pat, fccl_types[t], FCCL_SCHEME_FULL);
    run_case(comm, rank, nranks, &pat, 0, t % nranks, base += 601);
    for (root = 0; root < nranks; root++)
      run_case(comm, rank, nranks, &pat, ((root + t) % 2) ? 7 : 1, root, base += 601);
    run_case(comm, rank, nranks, &pat, fccl_big_per_rank(nranks), (t + 1) % nranks, base += 601);
    fccl_pattern_free(&pat);
  }
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_FULL);
  run_case(comm, rank, nranks, &pat, (size_t)1 << 20, nranks - 1, base += 601);
  fccl_pattern_free(&pat);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
