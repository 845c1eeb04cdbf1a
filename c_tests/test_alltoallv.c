/* fcclAlltoAllv: every type with uneven counts (zeros included) and displacements with
 * gaps, blocks laid out forwards or backwards; scaled counts (~1000003 elements per rank)
 * and a >= 4 MiB case; gaps and bytes past the end stay untouched.  Ranks with no traffic
 * at all (rank 0 idle while the others exchange > 64 KiB; only rank 1 busy, with itself)
 * must return with the others, not wait or make them wait.  Then mismatched
 * counts: rank 0 sends 1111 elements to rank 1, which expects 2222: both get
 * fcclCollectiveMismatch with a message naming both counts, and the comm still works. */
#include "harness.h"

#define BLOCK_STRIDE ((size_t)104729) /* rotation between the blocks of one sender */

enum { LAYOUT_SMALL, LAYOUT_SCALED, LAYOUT_4MIB, LAYOUT_IDLE0, LAYOUT_SELF1 };

/* Above 64 KiB per exchange, where the counts no longer travel with the data. */
#define IDLE_PAIR_COUNT ((size_t)16383 + 2)

/* elements rank s sends to rank d */
static size_t pair_count(int layout, int s, int d, int nranks, int salt) {
  size_t base = (size_t)((s * 3 + d * 5 + salt) % 5); /* 0..4: zeros included */
  switch (layout) {
    case LAYOUT_SMALL: return base;
    case LAYOUT_SCALED: return base * ((FCCL_BIG_COUNT / (2 * (size_t)nranks)) | 1u);
    /* rank 0 takes part with all-zero counts while the others exchange (mixture-of-experts
     * routing with an idle expert): it must still return, and the others must not wait */
    case LAYOUT_IDLE0: return (s == 0 || d == 0) ? 0 : IDLE_PAIR_COUNT + (size_t)(s + d);
    /* only rank 1 has traffic, with itself */
    case LAYOUT_SELF1: return (s == 1 && d == 1) ? IDLE_PAIR_COUNT : 0;
    default: /* every rank sends >= 4 MiB of float32 in all, and nothing to its successor */
      if (nranks > 1 && d == (s + 1) % nranks) return 0;
      return (((size_t)1 << 20) + (size_t)(nranks > 1 ? nranks - 2 : 0)) /
             (size_t)(nranks > 1 ? nranks - 1 : 1);
  }
}

/* Lays blocks out with gaps of (peer % 3) elements before each, forwards or backwards;
 * returns the buffer length in elements (with a trailing gap of 2). */
static size_t layout_displs(int nranks, const size_t* counts, size_t* displs, int reverse) {
  size_t pos = 0;
  int j;
  for (j = 0; j < nranks; j++) {
    int d = reverse ? nranks - 1 - j : j;
    pos += (size_t)(d % 3);
    displs[d] = pos;
    pos += counts[d];
  }
  return pos + 2;
}

typedef struct {
  size_t *sc, *sd, *rc, *rd;
  size_t slen, rlen; /* elements */
} plan_t;

static void plan_init(plan_t* p, int layout, int rank, int nranks, int salt, int reverse) {
  int q;
  p->sc = (size_t*)fccl_xmalloc((size_t)nranks * sizeof(size_t));
  p->sd = (size_t*)fccl_xmalloc((size_t)nranks * sizeof(size_t));
  p->rc = (size_t*)fccl_xmalloc((size_t)nranks * sizeof(size_t));
  p->rd = (size_t*)fccl_xmalloc((size_t)nranks * sizeof(size_t));
  for (q = 0; q < nranks; q++) {
    p->sc[q] = pair_count(layout, rank, q, nranks, salt);
    p->rc[q] = pair_count(layout, q, rank, nranks, salt);
  }
  p->slen = layout_displs(nranks, p->sc, p->sd, reverse);
  p->rlen = layout_displs(nranks, p->rc, p->rd, !reverse);
}

static void plan_free(plan_t* p) {
  free(p->sc);
  free(p->sd);
  free(p->rc);
  free(p->rd);
}

/* send block for peer d of rank s: pattern from rank_off(base, s) + d * BLOCK_STRIDE */
static void run_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat, int layout,
                     int salt, int reverse, size_t base) {
  plan_t p;
  size_t esz = pat->esz, sbytes, rbytes;
  unsigned char *send, *recv, *send_copy;
  char what[192], w2[512];
  int q;
  plan_init(&p, layout, rank, nranks, salt, reverse);
  sbytes = p.slen * esz;
  rbytes = p.rlen * esz;
  snprintf(what, sizeof what, "alltoallv %s layout=%s salt=%d %s", fccl_dt_name(pat->dt),
           layout == LAYOUT_SMALL    ? "small"
           : layout == LAYOUT_SCALED ? "scaled"
           : layout == LAYOUT_4MIB   ? "4MiB"
           : layout == LAYOUT_IDLE0  ? "rank 0 idle"
                                     : "only rank 1, to itself",
           salt, reverse ? "reversed" : "forward");
  fccl_phase("%s", what);
  send = (unsigned char*)fccl_xmalloc(sbytes + FCCL_SLACK);
  recv = (unsigned char*)fccl_xmalloc(rbytes + FCCL_SLACK);
  memset(send, FCCL_SENT_GAP, sbytes + FCCL_SLACK);
  for (q = 0; q < nranks; q++)
    fccl_pattern_fill(pat, send + p.sd[q] * esz, p.sc[q],
                      fccl_rank_off(base, rank) + (size_t)q * BLOCK_STRIDE);
  send_copy = (unsigned char*)fccl_xmalloc(sbytes + FCCL_SLACK);
  memcpy(send_copy, send, sbytes + FCCL_SLACK);
  memset(recv, FCCL_SENT_RECV, rbytes + FCCL_SLACK);

  if (CHECK_OK(fcclAlltoAllv(send, p.sc, p.sd, recv, p.rc, p.rd, pat->dt, comm, NULL))) {
    for (q = 0; q < nranks; q++) {
      snprintf(w2, sizeof w2, "%s: block from rank %d (%zu elements at %zu)", what, q, p.rc[q],
               p.rd[q]);
      PATTERN_CHECK(pat, recv + p.rd[q] * esz, p.rc[q],
                    fccl_rank_off(base, q) + (size_t)rank * BLOCK_STRIDE, w2);
    }
  }
  /* blank the blocks: everything else (gaps, the tail) must still be the sentinel */
  for (q = 0; q < nranks; q++) memset(recv + p.rd[q] * esz, FCCL_SENT_RECV, p.rc[q] * esz);
  snprintf(w2, sizeof w2, "%s: recvbuff outside the blocks (gaps, tail)", what);
  BYTES_CHECK(recv, rbytes + FCCL_SLACK, FCCL_SENT_RECV, w2);
  snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
  CHECK(memcmp(send, send_copy, sbytes + FCCL_SLACK) == 0, "%s", w2);
  free(send);
  free(send_copy);
  free(recv);
  plan_free(&p);
}

static void allreduce_works(fcclComm_t comm, int rank, int nranks, const char* when) {
  int64_t send[5], recv[5];
  int i;
  for (i = 0; i < 5; i++) send[i] = (int64_t)rank * 10 + i;
  memset(recv, 0, sizeof recv);
  if (CHECK_OK(fcclAllReduce(send, recv, 5, fcclInt64, fcclSum, comm, NULL)))
    for (i = 0; i < 5; i++)
      CHECK(recv[i] == (int64_t)(10 * nranks * (nranks - 1) / 2 + nranks * i),
            "allreduce %s: element %d = %lld", when, i, (long long)recv[i]);
}

/* rank 0 says it sends 1111 elements to rank 1, rank 1 says it receives 2222 from rank 0 */
static void mismatch_case(fcclComm_t comm, int rank, int nranks) {
  plan_t p;
  unsigned char *send, *recv;
  fcclResult_t res;
  const size_t esz = 4;
  fccl_phase("alltoallv mismatched counts");
  plan_init(&p, LAYOUT_SMALL, rank, nranks, 1, 0);
  if (rank == 0) p.sc[1] = 1111;
  if (rank == 1) p.rc[0] = 2222;
  p.slen = layout_displs(nranks, p.sc, p.sd, 0);
  p.rlen = layout_displs(nranks, p.rc, p.rd, 1);
  send = (unsigned char*)fccl_xmalloc(p.slen * esz);
  recv = (unsigned char*)fccl_xmalloc(p.rlen * esz);
  memset(send, 1, p.slen * esz);
  memset(recv, FCCL_SENT_RECV, p.rlen * esz);
  res = fcclAlltoAllv(send, p.sc, p.sd, recv, p.rc, p.rd, fcclInt32, comm, NULL);
  if (rank <= 1) {
    if (CHECK_ERR(res, fcclCollectiveMismatch, "fcclAlltoAllv")) {
      const char* msg = fcclGetLastError(NULL);
      CHECK(msg && strstr(msg, "1111") && strstr(msg, "2222"),
            "mismatch message should name both counts (1111 sent, 2222 expected): \"%s\"",
            msg ? msg : "(NULL)");
    }
  } else {
    CHECK(res == fcclSuccess || res == fcclCollectiveMismatch,
          "rank not involved in the mismatch got %d (%s); fcclGetLastError: \"%s\"", (int)res,
          fccl_res_name(res), fcclGetLastError(NULL));
  }
  free(send);
  free(recv);
  plan_free(&p);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  int t, salt;
  size_t base = 0;
  fccl_pattern pat;
  for (t = 0; t < FCCL_NTYPES; t++) {
    fccl_pattern_init(&pat, fccl_types[t], FCCL_SCHEME_FULL);
    for (salt = 0; salt < 3; salt++)
      run_case(comm, rank, nranks, &pat, LAYOUT_SMALL, salt + t, salt % 2, base += 811);
    run_case(comm, rank, nranks, &pat, LAYOUT_SCALED, t, t % 2, base += 811);
    fccl_pattern_free(&pat);
  }
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_FULL);
  run_case(comm, rank, nranks, &pat, LAYOUT_4MIB, 0, 1, base += 811);
  /* ranks without traffic: every rank returns, none waits for them */
  run_case(comm, rank, nranks, &pat, LAYOUT_IDLE0, 0, 0, base += 811);
  run_case(comm, rank, nranks, &pat, LAYOUT_SELF1, 0, 1, base += 811);
  allreduce_works(comm, rank, nranks, "after all_to_allv with idle ranks");
  if (nranks >= 2) {
    mismatch_case(comm, rank, nranks);
    fccl_phase("alltoallv after the mismatch");
    run_case(comm, rank, nranks, &pat, LAYOUT_SMALL, 2, 0, base += 811);
    allreduce_works(comm, rank, nranks, "after the alltoallv mismatch");
    run_case(comm, rank, nranks, &pat, LAYOUT_SMALL, 3, 1, base += 811);
  }
  fccl_pattern_free(&pat);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
