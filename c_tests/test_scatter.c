/* fcclScatter: every type, every root, count per rank {0, 1, 7, ~1000003/nranks} and a
 * 4 MiB-per-rank message.  Non-roots pass sendbuff NULL. */
#include "harness.h"

static void run_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                     size_t count, int root, size_t base) {
  size_t esz = pat->esz, bytes = count * esz, tot = bytes * (size_t)nranks;
  unsigned char* send = NULL;
  unsigned char* recv = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  char what[192], w2[512];
  snprintf(what, sizeof what, "scatter %s count=%zu root=%d", fccl_dt_name(pat->dt), count, root);
  fccl_phase("%s", what);
  if (rank == root) {
    send = (unsigned char*)fccl_xmalloc(tot + FCCL_SLACK);
    fccl_pattern_fill(pat, send, count * (size_t)nranks, fccl_rank_off(base, root));
    memset(send + tot, FCCL_SENT_GAP, FCCL_SLACK);
  }
  memset(recv, FCCL_SENT_RECV, bytes + FCCL_SLACK);
  if (CHECK_OK(fcclScatter(send, recv, count, pat->dt, root, comm, NULL)))
    PATTERN_CHECK(pat, recv, count, fccl_rank_off(base, root) + (size_t)rank * count, what);
  snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
  BYTES_CHECK(recv + bytes, FCCL_SLACK, FCCL_SENT_RECV, w2);
  if (rank == root) {
    snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
    PATTERN_CHECK(pat, send, count * (size_t)nranks, fccl_rank_off(base, root), w2);
    snprintf(w2, sizeof w2, "%s: bytes after sendbuff", what);
    BYTES_CHECK(send + tot, FCCL_SLACK, FCCL_SENT_GAP, w2);
  }
  free(send);
  free(recv);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  int t, root;
  size_t base = 0;
  fccl_pattern pat;
  for (t = 0; t < FCCL_NTYPES; t++) {
    fccl_pattern_init(&pat, fccl_types[t], FCCL_SCHEME_FULL);
    run_case(comm, rank, nranks, &pat, 0, t % nranks, base += 701);
    for (root = 0; root < nranks; root++)
      run_case(comm, rank, nranks, &pat, ((root + t) % 2) ? 7 : 1, root, base += 701);
    run_case(comm, rank, nranks, &pat, fccl_big_per_rank(nranks), (t + 1) % nranks, base += 701);
    fccl_pattern_free(&pat);
  }
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_FULL);
  run_case(comm, rank, nranks, &pat, (size_t)1 << 20, nranks - 1, base += 701);
  fccl_pattern_free(&pat);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
