/* fcclAlltoAll: every type, count per peer {0, 1, 7, ~1000003/nranks} (so each buffer holds
 * about 1000003 elements whatever the world size) and >= 4 MiB per rank, out of place and
 * in place (sendbuff == recvbuff), the latter also with blocks larger than the rings
 * between ranks (12 MiB per peer), which must be exchanged without a copy of the input. */
#include "harness.h"

/* rank r's send buffer is the pattern from rank_off(base, r); block q goes to rank q.
 * In place, that buffer is also the receive buffer. */
static void run_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                     size_t count, size_t base, int inplace) {
  size_t esz = pat->esz, bytes = count * esz, tot = bytes * (size_t)nranks;
  unsigned char* send = (unsigned char*)fccl_xmalloc(tot + FCCL_SLACK);
  unsigned char* recv = inplace ? send : (unsigned char*)fccl_xmalloc(tot + FCCL_SLACK);
  char what[192], w2[512];
  int r;
  snprintf(what, sizeof what, "alltoall%s %s count=%zu per peer", inplace ? " in place" : "",
           fccl_dt_name(pat->dt), count);
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, send, count * (size_t)nranks, fccl_rank_off(base, rank));
  memset(send + tot, FCCL_SENT_GAP, FCCL_SLACK);
  if (!inplace) memset(recv, FCCL_SENT_RECV, tot + FCCL_SLACK);
  if (CHECK_OK(fcclAlltoAll(send, recv, count, pat->dt, comm, NULL))) {
    for (r = 0; r < nranks; r++) {
      snprintf(w2, sizeof w2, "%s: block from rank %d", what, r);
      PATTERN_CHECK(pat, recv + (size_t)r * bytes, count,
                    fccl_rank_off(base, r) + (size_t)rank * count, w2);
    }
  }
  snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
  BYTES_CHECK(recv + tot, FCCL_SLACK, inplace ? FCCL_SENT_GAP : FCCL_SENT_RECV, w2);
  if (!inplace) {
    snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
    PATTERN_CHECK(pat, send, count * (size_t)nranks, fccl_rank_off(base, rank), w2);
    snprintf(w2, sizeof w2, "%s: bytes after sendbuff", what);
    BYTES_CHECK(send + tot, FCCL_SLACK, FCCL_SENT_GAP, w2);
    free(recv);
  }
  free(send);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  int t;
  size_t base = 0;
  fccl_pattern pat;
  for (t = 0; t < FCCL_NTYPES; t++) {
    fccl_pattern_init(&pat, fccl_types[t], FCCL_SCHEME_FULL);
    run_case(comm, rank, nranks, &pat, 0, base += 503, 0);
    run_case(comm, rank, nranks, &pat, 1, base += 503, 0);
    run_case(comm, rank, nranks, &pat, 7, base += 503, 0);
    run_case(comm, rank, nranks, &pat, fccl_big_per_rank(nranks), base += 503, 0);
    fccl_pattern_free(&pat);
  }
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_FULL);
  run_case(comm, rank, nranks, &pat, (((size_t)1 << 20) + (size_t)nranks - 1) / (size_t)nranks,
           base += 503, 0);
  run_case(comm, rank, nranks, &pat, 0, base += 503, 1);
  run_case(comm, rank, nranks, &pat, 7, base += 503, 1);
  run_case(comm, rank, nranks, &pat, fccl_big_per_rank(nranks), base += 503, 1);
  /* 12 MiB per peer: three times a ring. */
  run_case(comm, rank, nranks, &pat, (size_t)3 << 20, base += 503, 1);
  fccl_pattern_free(&pat);
  fccl_pattern_init(&pat, fcclInt8, FCCL_SCHEME_FULL);
  run_case(comm, rank, nranks, &pat, 65537, base += 503, 1);
  fccl_pattern_free(&pat);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
