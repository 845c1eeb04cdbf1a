/* fcclAllGather: every type, sendcount {0, 1, 7, ~1000003/nranks} and a 4 MiB-per-rank
 * message, out-of-place and in-place (sendbuff == recvbuff + rank * sendcount). */
#include "harness.h"

static void run_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                     size_t count, int inplace, size_t base) {
  size_t esz = pat->esz, bytes = count * esz, rbytes = bytes * (size_t)nranks;
  unsigned char* recv = (unsigned char*)fccl_xmalloc(rbytes + FCCL_SLACK);
  unsigned char* send;
  char what[192], w2[512];
  int r;
  snprintf(what, sizeof what, "allgather %s sendcount=%zu %s", fccl_dt_name(pat->dt), count,
           inplace ? "in-place" : "out-of-place");
  fccl_phase("%s", what);
  memset(recv, FCCL_SENT_RECV, rbytes + FCCL_SLACK);
  if (inplace) {
    send = recv + (size_t)rank * bytes;
  } else {
    send = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
    memset(send + bytes, FCCL_SENT_GAP, FCCL_SLACK);
  }
  fccl_pattern_fill(pat, send, count, fccl_rank_off(base, rank));

  if (CHECK_OK(fcclAllGather(send, recv, count, pat->dt, comm, NULL))) {
    for (r = 0; r < nranks; r++) {
      snprintf(w2, sizeof w2, "%s: block of rank %d", what, r);
      PATTERN_CHECK(pat, recv + (size_t)r * bytes, count, fccl_rank_off(base, r), w2);
    }
  }
  snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
  BYTES_CHECK(recv + rbytes, FCCL_SLACK, FCCL_SENT_RECV, w2);
  if (!inplace) {
    snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
    PATTERN_CHECK(pat, send, count, fccl_rank_off(base, rank), w2);
    snprintf(w2, sizeof w2, "%s: bytes after sendbuff", what);
    BYTES_CHECK(send + bytes, FCCL_SLACK, FCCL_SENT_GAP, w2);
    free(send);
  }
  free(recv);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  static const size_t small[] = {0, 1, 7};
  int t, c, ip;
  size_t base = 0;
  fccl_pattern pat;
  for (t = 0; t < FCCL_NTYPES; t++) {
    fccl_pattern_init(&pat, fccl_types[t], FCCL_SCHEME_FULL);
    for (c = 0; c < 3; c++)
      for (ip = 0; ip < 2; ip++) run_case(comm, rank, nranks, &pat, small[c], ip, base += 307);
    run_case(comm, rank, nranks, &pat, fccl_big_per_rank(nranks), t % 2, base += 307);
    fccl_pattern_free(&pat);
  }
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_FULL);
  run_case(comm, rank, nranks, &pat, (size_t)1 << 20, 0, base += 307);
  run_case(comm, rank, nranks, &pat, ((size_t)1 << 20) + 1, 1, base += 307);
  fccl_pattern_free(&pat);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
