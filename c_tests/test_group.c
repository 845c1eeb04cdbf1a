/* fcclGroupStart / fcclGroupEnd.
 * Threads mode: ONE thread drives all N communicators of fcclCommInitAll through groups
 * (all_reduce, broadcast, send/recv rings, nested groups, collectives mixed with p2p),
 * which only works if the calls are queued and run together at the outer fcclGroupEnd.
 * Every mode, per rank: groups holding two collectives, a collective with a ring, nested
 * groups (nothing runs before the outer end), an empty group; every type, counts {0, 1, 7}
 * and 1000003 / 4 MiB for float32. */
#include "harness.h"

#define MAXR 256

/* ------------------------------------------------ one thread, all communicators */

typedef struct {
  int n;
  const fccl_pattern* pat;
  size_t count, bytes, base;
  unsigned char* send[MAXR];
  unsigned char* recv[MAXR];
} bufs_t;

static void bufs_init(bufs_t* b, int n, const fccl_pattern* pat, size_t count, size_t base) {
  int r;
  b->n = n;
  b->pat = pat;
  b->count = count;
  b->bytes = count * pat->esz;
  b->base = base;
  for (r = 0; r < n; r++) {
    b->send[r] = (unsigned char*)fccl_xmalloc(b->bytes + FCCL_SLACK);
    b->recv[r] = (unsigned char*)fccl_xmalloc(b->bytes + FCCL_SLACK);
    fccl_pattern_fill(pat, b->send[r], count, fccl_rank_off(base, r));
    memset(b->recv[r], FCCL_SENT_RECV, b->bytes + FCCL_SLACK);
  }
}

static void bufs_free(bufs_t* b) {
  int r;
  for (r = 0; r < b->n; r++) {
    free(b->send[r]);
    free(b->recv[r]);
  }
}

static void check_untouched(const bufs_t* b, const char* what) {
  int r;
  char w[512];
  for (r = 0; r < b->n; r++) {
    snprintf(w, sizeof w, "%s: rank %d's recvbuff written before the outer fcclGroupEnd", what, r);
    BYTES_CHECK(b->recv[r], b->bytes + FCCL_SLACK, FCCL_SENT_RECV, w);
  }
}

static void check_allreduce(const bufs_t* b, const fccl_ref* ref, const char* what) {
  int r;
  char w[512];
  for (r = 0; r < b->n; r++) {
    snprintf(w, sizeof w, "%s: rank %d", what, r);
    REF_CHECK(ref, b->recv[r], b->count, b->base, w);
    snprintf(w, sizeof w, "%s: rank %d, bytes after recvbuff", what, r);
    BYTES_CHECK(b->recv[r] + b->bytes, FCCL_SLACK, FCCL_SENT_RECV, w);
  }
}

static void check_ring(const bufs_t* b, const char* what) {
  int r;
  char w[512];
  for (r = 0; r < b->n; r++) {
    int prev = (r + b->n - 1) % b->n;
    snprintf(w, sizeof w, "%s: rank %d's message from rank %d", what, r, prev);
    PATTERN_CHECK(b->pat, b->recv[r], b->count, fccl_rank_off(b->base, prev), w);
  }
}

static void queue_allreduce(fcclComm_t* comms, bufs_t* b) {
  int r;
  for (r = 0; r < b->n; r++)
    CHECK_OK(fcclAllReduce(b->send[r], b->recv[r], b->count, b->pat->dt, fcclSum, comms[r], NULL));
}

static void queue_ring(fcclComm_t* comms, bufs_t* b) {
  int r;
  for (r = 0; r < b->n; r++) {
    CHECK_OK(fcclSend(b->send[r], b->count, b->pat->dt, (r + 1) % b->n, comms[r], NULL));
    CHECK_OK(fcclRecv(b->recv[r], b->count, b->pat->dt, (r + b->n - 1) % b->n, comms[r], NULL));
  }
}

static int multi(fcclComm_t* comms, int n) {
  static const size_t counts[] = {0, 1, 7};
  int t, c, r;
  size_t base = 0;
  fccl_pattern pat;
  fccl_ref ref;
  char what[160];
  if (n > MAXR) return 0;
  for (t = 0; t < FCCL_NTYPES; t++) {
    fcclDataType_t dt = fccl_types[t];
    int nc = (dt == fcclFloat32) ? 4 : 3;
    fccl_pattern_init(&pat, dt, FCCL_SCHEME_SUM);
    fccl_ref_init(&ref, &pat, fcclSum, n);
    for (c = 0; c < nc; c++) {
      size_t count = c < 3 ? counts[c] : FCCL_BIG_COUNT;
      bufs_t b;
      int root = (t + c) % n;

      /* all_reduce on every comm, one group */
      snprintf(what, sizeof what, "one thread, %d comms: allreduce %s count=%zu", n,
               fccl_dt_name(dt), count);
      fccl_phase("%s", what);
      bufs_init(&b, n, &pat, count, base += 1009);
      CHECK_OK(fcclGroupStart());
      queue_allreduce(comms, &b);
      if (CHECK_OK(fcclGroupEnd())) check_allreduce(&b, &ref, what);
      bufs_free(&b);

      /* in-place broadcast on every comm, one group */
      snprintf(what, sizeof what, "one thread, %d comms: broadcast %s count=%zu root=%d", n,
               fccl_dt_name(dt), count, root);
      fccl_phase("%s", what);
      bufs_init(&b, n, &pat, count, base += 1009);
      CHECK_OK(fcclGroupStart());
      for (r = 0; r < n; r++)
        CHECK_OK(fcclBroadcast(b.send[r], b.send[r], count, dt, root, comms[r], NULL));
      if (CHECK_OK(fcclGroupEnd())) {
        for (r = 0; r < n; r++) {
          char w[512];
          snprintf(w, sizeof w, "%s: rank %d", what, r);
          PATTERN_CHECK(&pat, b.send[r], count, fccl_rank_off(b.base, root), w);
        }
      }
      bufs_free(&b);

      /* send/recv ring over every comm, one group */
      snprintf(what, sizeof what, "one thread, %d comms: ring %s count=%zu", n, fccl_dt_name(dt),
               count);
      fccl_phase("%s", what);
      bufs_init(&b, n, &pat, count, base += 1009);
      CHECK_OK(fcclGroupStart());
      queue_ring(comms, &b);
      if (CHECK_OK(fcclGroupEnd())) check_ring(&b, what);
      bufs_free(&b);
    }
    fccl_ref_free(&ref);
    fccl_pattern_free(&pat);
  }

  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_SUM);
  fccl_ref_init(&ref, &pat, fcclSum, n);
  {
    bufs_t b, b2;
    /* 4 MiB ring */
    snprintf(what, sizeof what, "one thread, %d comms: 4 MiB ring", n);
    fccl_phase("%s", what);
    bufs_init(&b, n, &pat, (size_t)1 << 20, base += 1009);
    CHECK_OK(fcclGroupStart());
    queue_ring(comms, &b);
    if (CHECK_OK(fcclGroupEnd())) check_ring(&b, what);
    bufs_free(&b);

    /* nested: nothing runs at the inner end, everything at the outer one */
    snprintf(what, sizeof what, "one thread, %d comms: nested groups", n);
    fccl_phase("%s", what);
    bufs_init(&b, n, &pat, 1000, base += 1009);
    CHECK_OK(fcclGroupStart());
    CHECK_OK(fcclGroupStart());
    queue_allreduce(comms, &b);
    CHECK_OK(fcclGroupEnd());
    check_untouched(&b, what);
    if (CHECK_OK(fcclGroupEnd())) check_allreduce(&b, &ref, what);
    bufs_free(&b);

    /* collectives and p2p in one group */
    snprintf(what, sizeof what, "one thread, %d comms: allreduce + ring in one group", n);
    fccl_phase("%s", what);
    bufs_init(&b, n, &pat, 4099, base += 1009);
    bufs_init(&b2, n, &pat, 77, base += 1009);
    CHECK_OK(fcclGroupStart());
    queue_allreduce(comms, &b);
    queue_ring(comms, &b2);
    if (CHECK_OK(fcclGroupEnd())) {
      check_allreduce(&b, &ref, what);
      check_ring(&b2, what);
    }
    bufs_free(&b);
    bufs_free(&b2);
  }
  fccl_ref_free(&ref);
  fccl_pattern_free(&pat);
  return fccl_failures();
}

/* ------------------------------------------------ per rank, every mode */

/* all_reduce (out-of-place) and an in-place broadcast in one group */
static void two_collectives(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                            const fccl_ref* ref, size_t count, int root, size_t base, int nested) {
  size_t esz = pat->esz, bytes = count * esz;
  unsigned char* a_send = (unsigned char*)fccl_xmalloc(bytes + 1);
  unsigned char* a_recv = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  unsigned char* b_buf = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  size_t bbase = base + 7777;
  char what[192], w[512];
  snprintf(what, sizeof what, "group{allreduce, broadcast root=%d} %s count=%zu%s", root,
           fccl_dt_name(pat->dt), count, nested ? " (nested groups)" : "");
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, a_send, count, fccl_rank_off(base, rank));
  memset(a_recv, FCCL_SENT_RECV, bytes + FCCL_SLACK);
  if (rank == root)
    fccl_pattern_fill(pat, b_buf, count, fccl_rank_off(bbase, root));
  else
    memset(b_buf, FCCL_SENT_RECV, bytes);
  memset(b_buf + bytes, FCCL_SENT_GAP, FCCL_SLACK);

  CHECK_OK(fcclGroupStart());
  if (nested) CHECK_OK(fcclGroupStart());
  CHECK_OK(fcclAllReduce(a_send, a_recv, count, pat->dt, fcclSum, comm, NULL));
  CHECK_OK(fcclBroadcast(b_buf, b_buf, count, pat->dt, root, comm, NULL));
  if (nested) {
    CHECK_OK(fcclGroupEnd());
    snprintf(w, sizeof w, "%s: recvbuff written before the outer fcclGroupEnd", what);
    BYTES_CHECK(a_recv, bytes + FCCL_SLACK, FCCL_SENT_RECV, w);
  }
  if (CHECK_OK(fcclGroupEnd())) {
    snprintf(w, sizeof w, "%s: allreduce", what);
    REF_CHECK(ref, a_recv, count, base, w);
    snprintf(w, sizeof w, "%s: broadcast", what);
    PATTERN_CHECK(pat, b_buf, count, fccl_rank_off(bbase, root), w);
  }
  snprintf(w, sizeof w, "%s: bytes after the buffers", what);
  BYTES_CHECK(a_recv + bytes, FCCL_SLACK, FCCL_SENT_RECV, w);
  BYTES_CHECK(b_buf + bytes, FCCL_SLACK, FCCL_SENT_GAP, w);
  (void)nranks;
  free(a_send);
  free(a_recv);
  free(b_buf);
}

/* all_reduce and a send/recv ring in one group */
static void collective_and_ring(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                                const fccl_ref* ref, size_t count, size_t base) {
  size_t esz = pat->esz, bytes = count * esz, rbase = base + 5555;
  unsigned char* a_send = (unsigned char*)fccl_xmalloc(bytes + 1);
  unsigned char* a_recv = (unsigned char*)fccl_xmalloc(bytes + 1);
  unsigned char* s = (unsigned char*)fccl_xmalloc(bytes + 1);
  unsigned char* rv = (unsigned char*)fccl_xmalloc(bytes + 1);
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  char what[160], w[512];
  snprintf(what, sizeof what, "group{allreduce, send, recv} %s count=%zu", fccl_dt_name(pat->dt),
           count);
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, a_send, count, fccl_rank_off(base, rank));
  fccl_pattern_fill(pat, s, count, fccl_rank_off(rbase, rank));
  memset(a_recv, FCCL_SENT_RECV, bytes);
  memset(rv, FCCL_SENT_RECV, bytes);
  CHECK_OK(fcclGroupStart());
  CHECK_OK(fcclSend(s, count, pat->dt, next, comm, NULL));
  CHECK_OK(fcclAllReduce(a_send, a_recv, count, pat->dt, fcclSum, comm, NULL));
  CHECK_OK(fcclRecv(rv, count, pat->dt, prev, comm, NULL));
  if (CHECK_OK(fcclGroupEnd())) {
    snprintf(w, sizeof w, "%s: allreduce", what);
    REF_CHECK(ref, a_recv, count, base, w);
    snprintf(w, sizeof w, "%s: message from rank %d", what, prev);
    PATTERN_CHECK(pat, rv, count, fccl_rank_off(rbase, prev), w);
  }
  free(a_send);
  free(a_recv);
  free(s);
  free(rv);
}

static int body(fcclComm_t comm, int rank, int nranks) {
  static const size_t counts[] = {0, 1, 7};
  int t, c;
  size_t base = 0;
  fccl_pattern pat;
  fccl_ref ref;

  fccl_phase("empty group");
  CHECK_OK(fcclGroupStart());
  CHECK_OK(fcclGroupEnd());

  for (t = 0; t < FCCL_NTYPES; t++) {
    fccl_pattern_init(&pat, fccl_types[t], FCCL_SCHEME_SUM);
    fccl_ref_init(&ref, &pat, fcclSum, nranks);
    for (c = 0; c < 3; c++)
      two_collectives(comm, rank, nranks, &pat, &ref, counts[c], (t + c) % nranks, base += 1013,
                      0);
    collective_and_ring(comm, rank, nranks, &pat, &ref, 7, base += 1013);
    fccl_ref_free(&ref);
    fccl_pattern_free(&pat);
  }
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_SUM);
  fccl_ref_init(&ref, &pat, fcclSum, nranks);
  two_collectives(comm, rank, nranks, &pat, &ref, FCCL_BIG_COUNT, nranks - 1, base += 1013, 0);
  two_collectives(comm, rank, nranks, &pat, &ref, (size_t)1 << 20, 0, base += 1013, 1);
  two_collectives(comm, rank, nranks, &pat, &ref, 1000, nranks / 2, base += 1013, 1);
  collective_and_ring(comm, rank, nranks, &pat, &ref, (size_t)1 << 20, base += 1013);
  fccl_ref_free(&ref);
  fccl_pattern_free(&pat);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main_ex(argc, argv, body, multi); }
