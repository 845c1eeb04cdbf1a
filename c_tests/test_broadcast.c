/* fcclBroadcast: every type, every root, counts {0, 1, 7, 1000003} and one 4 MiB message,
 * in-place and out-of-place.  Non-root send buffers hold junk that must be ignored and
 * left alone. */
#include "harness.h"

#define JUNK 0x3C

static void run_case(fcclComm_t comm, int rank, const fccl_pattern* pat, size_t count, int root,
                     int inplace, size_t base) {
  size_t esz = pat->esz, bytes = count * esz;
  unsigned char* send = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  unsigned char* recv = inplace ? send : (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  char what[192], w2[512];
  snprintf(what, sizeof what, "broadcast %s count=%zu root=%d %s", fccl_dt_name(pat->dt), count,
           root, inplace ? "in-place" : "out-of-place");
  fccl_phase("%s", what);
  if (rank == root)
    fccl_pattern_fill(pat, send, count, fccl_rank_off(base, root));
  else
    memset(send, JUNK, bytes);
  memset(send + bytes, FCCL_SENT_GAP, FCCL_SLACK);
  if (!inplace) memset(recv, FCCL_SENT_RECV, bytes + FCCL_SLACK);

  if (CHECK_OK(fcclBroadcast(send, recv, count, pat->dt, root, comm, NULL)))
    PATTERN_CHECK(pat, recv, count, fccl_rank_off(base, root), what);
  snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
  BYTES_CHECK(recv + bytes, FCCL_SLACK, inplace ? FCCL_SENT_GAP : FCCL_SENT_RECV, w2);
  if (!inplace) {
    snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
    if (rank == root)
      PATTERN_CHECK(pat, send, count, fccl_rank_off(base, root), w2);
    else
      BYTES_CHECK(send, bytes, JUNK, w2);
    snprintf(w2, sizeof w2, "%s: bytes after sendbuff", what);
    BYTES_CHECK(send + bytes, FCCL_SLACK, FCCL_SENT_GAP, w2);
    free(recv);
  }
  free(send);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  int t, root, ip;
  size_t base = 0;
  fccl_pattern pat;
  for (t = 0; t < FCCL_NTYPES; t++) {
    fccl_pattern_init(&pat, fccl_types[t], FCCL_SCHEME_FULL);
    for (ip = 0; ip < 2; ip++) run_case(comm, rank, &pat, 0, (t + ip) % nranks, ip, base += 101);
    for (root = 0; root < nranks; root++) {
      for (ip = 0; ip < 2; ip++) {
        run_case(comm, rank, &pat, 1, root, ip, base += 101);
        run_case(comm, rank, &pat, 7, root, ip, base += 101);
      }
    }
    run_case(comm, rank, &pat, FCCL_BIG_COUNT, t % nranks, t % 2, base += 101);
    fccl_pattern_free(&pat);
  }
  /* 4 MiB (and a little more, so not a power of two either) */
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_FULL);
  run_case(comm, rank, &pat, (size_t)1 << 20, nranks - 1, 0, base += 101);
  run_case(comm, rank, &pat, ((size_t)1 << 20) + 3, 0, 1, base += 101);
  fccl_pattern_free(&pat);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
