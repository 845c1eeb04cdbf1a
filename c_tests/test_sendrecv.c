/* fcclSend / fcclRecv: rings inside fcclGroupStart/End for every type and counts {0, 1, 7,
 * 1000003} plus >= 4 MiB messages (both directions), send to self, several messages to
 * one peer (matched in order), all-pairs exchange in one group, blocking pairs outside a
 * group, one side's calls grouped and the other's one at a time (small and large mixed), mismatched counts (fcclCollectiveMismatch on both sides, comm still usable; also
 * inside an exchange, small and large, where the receiver's count crosses the sender's
 * data) and peers out of range (fcclInvalidArgument, nothing written).
 * In place in a group: each rank's fcclRecv overlaps its own fcclSend (the same buffer,
 * or the receive starting 1000 or count/2 elements below or above the send), float32
 * counts {7, 5000, 20000, 300001, 12 MiB} both directions and int8/uint8 at 70000; and
 * both directions at once on two buffers. The sends carry what their buffers held when
 * the group ended (as if every send's data left before any receive wrote), the
 * receives the peers' messages, and nothing else in the buffer is written. */
#include "harness.h"

#define MSG_STRIDE ((size_t)104729)

/* One ring step: send to rank+dir, receive from rank-dir; rank r's message is the pattern
 * from rank_off(base, r).  recv_first posts the fcclRecv before the fcclSend. */
static void ring_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                      size_t count, int dir, int recv_first, size_t base) {
  int next = ((rank + dir) % nranks + nranks) % nranks;
  int prev = ((rank - dir) % nranks + nranks) % nranks;
  size_t esz = pat->esz, bytes = count * esz;
  unsigned char* send = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  unsigned char* recv = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  char what[192], w2[512];
  snprintf(what, sizeof what, "ring %s count=%zu dir=%+d%s", fccl_dt_name(pat->dt), count, dir,
           recv_first ? " (recv posted first)" : "");
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, send, count, fccl_rank_off(base, rank));
  memset(send + bytes, FCCL_SENT_GAP, FCCL_SLACK);
  memset(recv, FCCL_SENT_RECV, bytes + FCCL_SLACK);
  CHECK_OK(fcclGroupStart());
  if (recv_first) CHECK_OK(fcclRecv(recv, count, pat->dt, prev, comm, NULL));
  CHECK_OK(fcclSend(send, count, pat->dt, next, comm, NULL));
  if (!recv_first) CHECK_OK(fcclRecv(recv, count, pat->dt, prev, comm, NULL));
  if (CHECK_OK(fcclGroupEnd())) {
    snprintf(w2, sizeof w2, "%s: message from rank %d", what, prev);
    PATTERN_CHECK(pat, recv, count, fccl_rank_off(base, prev), w2);
  }
  snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
  BYTES_CHECK(recv + bytes, FCCL_SLACK, FCCL_SENT_RECV, w2);
  snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
  PATTERN_CHECK(pat, send, count, fccl_rank_off(base, rank), w2);
  free(send);
  free(recv);
}

/* One ring step in place: one buffer of count + |shift| elements holding this rank's
 * pattern from rank_off(base, rank); `count` elements at send_off go to rank+dir and
 * `count` elements from rank-dir arrive at recv_off, shift = recv_off - send_off (the
 * lower offset is 0), so the receive overlaps the send while |shift| < count.  Every
 * rank uses the same offsets: the message received is the predecessor's pattern from
 * rank_off(base, prev) + send_off, as its buffer held it when the group ended, and the
 * rest of the buffer keeps this rank's own pattern. */
static void inplace_ring_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                              size_t count, int dir, int recv_first, size_t base, long shift) {
  int next = ((rank + dir) % nranks + nranks) % nranks;
  int prev = ((rank - dir) % nranks + nranks) % nranks;
  size_t ashift = shift < 0 ? (size_t)(-shift) : (size_t)shift;
  size_t send_off = shift < 0 ? ashift : 0, recv_off = shift > 0 ? ashift : 0;
  size_t esz = pat->esz, span = count + ashift, bytes = span * esz, end = recv_off + count;
  size_t own = fccl_rank_off(base, rank);
  unsigned char* buf = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  char what[192], w2[512];
  snprintf(what, sizeof what, "in-place ring %s count=%zu dir=%+d shift=%+ld%s",
           fccl_dt_name(pat->dt), count, dir, shift, recv_first ? " (recv posted first)" : "");
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, buf, span, own);
  memset(buf + bytes, FCCL_SENT_RECV, FCCL_SLACK);
  CHECK_OK(fcclGroupStart());
  if (recv_first) CHECK_OK(fcclRecv(buf + recv_off * esz, count, pat->dt, prev, comm, NULL));
  CHECK_OK(fcclSend(buf + send_off * esz, count, pat->dt, next, comm, NULL));
  if (!recv_first) CHECK_OK(fcclRecv(buf + recv_off * esz, count, pat->dt, prev, comm, NULL));
  if (CHECK_OK(fcclGroupEnd())) {
    snprintf(w2, sizeof w2, "%s: message from rank %d (at element %zu)", what, prev, recv_off);
    PATTERN_CHECK(pat, buf + recv_off * esz, count, fccl_rank_off(base, prev) + send_off, w2);
  }
  snprintf(w2, sizeof w2, "%s: elements before the received range were modified", what);
  PATTERN_CHECK(pat, buf, recv_off, own, w2);
  snprintf(w2, sizeof w2, "%s: elements from %zu (after the received range) were modified",
           what, end);
  PATTERN_CHECK(pat, buf + end * esz, span - end, own + end, w2);
  snprintf(w2, sizeof w2, "%s: bytes after the buffer", what);
  BYTES_CHECK(buf + bytes, FCCL_SLACK, FCCL_SENT_RECV, w2);
  free(buf);
}

/* Both ring directions in place in one group, on two buffers: A goes to rank+1 and
 * receives rank-1's A, B goes to rank-1 and receives rank+1's B.  At two ranks both
 * messages go to the one peer, matched in posting order (A before B on every rank).
 * sends_first posts both sends before both receives, else send/receive alternate. */
static void inplace_both_ways_case(fcclComm_t comm, int rank, int nranks,
                                   const fccl_pattern* pat, size_t count, int sends_first,
                                   size_t base) {
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks;
  size_t esz = pat->esz, bytes = count * esz;
  unsigned char* a = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  unsigned char* b = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  char what[192], w2[512];
  snprintf(what, sizeof what, "in-place ring both ways %s count=%zu%s", fccl_dt_name(pat->dt),
           count, sends_first ? " (sends posted first)" : "");
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, a, count, fccl_rank_off(base, rank));
  fccl_pattern_fill(pat, b, count, fccl_rank_off(base, rank) + MSG_STRIDE);
  memset(a + bytes, FCCL_SENT_RECV, FCCL_SLACK);
  memset(b + bytes, FCCL_SENT_RECV, FCCL_SLACK);
  CHECK_OK(fcclGroupStart());
  CHECK_OK(fcclSend(a, count, pat->dt, next, comm, NULL));
  if (sends_first) CHECK_OK(fcclSend(b, count, pat->dt, prev, comm, NULL));
  CHECK_OK(fcclRecv(a, count, pat->dt, prev, comm, NULL));
  if (!sends_first) CHECK_OK(fcclSend(b, count, pat->dt, prev, comm, NULL));
  CHECK_OK(fcclRecv(b, count, pat->dt, next, comm, NULL));
  if (CHECK_OK(fcclGroupEnd())) {
    snprintf(w2, sizeof w2, "%s: buffer A: message from rank %d", what, prev);
    PATTERN_CHECK(pat, a, count, fccl_rank_off(base, prev), w2);
    snprintf(w2, sizeof w2, "%s: buffer B: message from rank %d", what, next);
    PATTERN_CHECK(pat, b, count, fccl_rank_off(base, next) + MSG_STRIDE, w2);
  }
  snprintf(w2, sizeof w2, "%s: bytes after buffer A", what);
  BYTES_CHECK(a + bytes, FCCL_SLACK, FCCL_SENT_RECV, w2);
  snprintf(w2, sizeof w2, "%s: bytes after buffer B", what);
  BYTES_CHECK(b + bytes, FCCL_SLACK, FCCL_SENT_RECV, w2);
  free(a);
  free(b);
}

/* Each rank sends a distinct message to every rank (itself included) in one group. */
static void all_pairs_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                           size_t count, size_t base) {
  size_t esz = pat->esz, bytes = count * esz, tot = bytes * (size_t)nranks;
  unsigned char* send = (unsigned char*)fccl_xmalloc(tot + 1);
  unsigned char* recv = (unsigned char*)fccl_xmalloc(tot + FCCL_SLACK);
  char what[160], w2[512];
  int q;
  snprintf(what, sizeof what, "all-pairs %s count=%zu", fccl_dt_name(pat->dt), count);
  fccl_phase("%s", what);
  for (q = 0; q < nranks; q++)
    fccl_pattern_fill(pat, send + (size_t)q * bytes, count,
                      fccl_rank_off(base, rank) + (size_t)q * MSG_STRIDE);
  memset(recv, FCCL_SENT_RECV, tot + FCCL_SLACK);
  CHECK_OK(fcclGroupStart());
  for (q = 0; q < nranks; q++) {
    int peer = (rank + q) % nranks; /* start with self, then the others in ring order */
    CHECK_OK(fcclSend(send + (size_t)peer * bytes, count, pat->dt, peer, comm, NULL));
  }
  for (q = nranks - 1; q >= 0; q--) /* receives posted in another order */
    CHECK_OK(fcclRecv(recv + (size_t)q * bytes, count, pat->dt, q, comm, NULL));
  if (CHECK_OK(fcclGroupEnd())) {
    for (q = 0; q < nranks; q++) {
      snprintf(w2, sizeof w2, "%s: message from rank %d", what, q);
      PATTERN_CHECK(pat, recv + (size_t)q * bytes, count,
                    fccl_rank_off(base, q) + (size_t)rank * MSG_STRIDE, w2);
    }
  }
  snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
  BYTES_CHECK(recv + tot, FCCL_SLACK, FCCL_SENT_RECV, w2);
  free(send);
  free(recv);
}

/* Three messages to the next rank in one group, received in posting order. */
static void in_order_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                          size_t base) {
  static const size_t counts[3] = {5, 5, 5}; /* same size: only the order tells them apart */
  int next = (rank + 1) % nranks, prev = (rank + nranks - 1) % nranks, k;
  size_t esz = pat->esz;
  unsigned char* send[3];
  unsigned char* recv[3];
  char w2[160];
  fccl_phase("three messages to one peer");
  for (k = 0; k < 3; k++) {
    send[k] = (unsigned char*)fccl_xmalloc(counts[k] * esz);
    recv[k] = (unsigned char*)fccl_xmalloc(counts[k] * esz);
    fccl_pattern_fill(pat, send[k], counts[k], fccl_rank_off(base, rank) + (size_t)k * MSG_STRIDE);
    memset(recv[k], FCCL_SENT_RECV, counts[k] * esz);
  }
  CHECK_OK(fcclGroupStart());
  for (k = 0; k < 3; k++) CHECK_OK(fcclSend(send[k], counts[k], pat->dt, next, comm, NULL));
  for (k = 0; k < 3; k++) CHECK_OK(fcclRecv(recv[k], counts[k], pat->dt, prev, comm, NULL));
  if (CHECK_OK(fcclGroupEnd())) {
    for (k = 0; k < 3; k++) {
      snprintf(w2, sizeof w2, "message %d of 3 from rank %d (matched in posting order)", k, prev);
      PATTERN_CHECK(pat, recv[k], counts[k], fccl_rank_off(base, prev) + (size_t)k * MSG_STRIDE,
                    w2);
    }
  }
  for (k = 0; k < 3; k++) {
    free(send[k]);
    free(recv[k]);
  }
}

/* Pairs (2k, 2k+1): one side posts several messages to its partner in one group, the
 * other posts each matching call on its own (legal: calls match in posting order). The
 * sizes mix messages sent with their count and ones whose payload waits for the
 * receiver's count, so a later message's count never blocks an earlier one's payload.
 * grouped_sends: the even rank groups its sends and the odd rank receives one call at a
 * time; otherwise the even rank sends one call at a time and the odd rank groups. */
static void grouped_one_side_case(fcclComm_t comm, int rank, int nranks,
                                  const fccl_pattern* pat, int grouped_sends, size_t base) {
  /* 1.2 MiB, 1 KiB, 70000 B, 64 KiB, 4 MiB, 28 B of float32 */
  static const size_t counts[6] = {300001, 256, 17500, 16384, (size_t)1 << 20, 7};
  int partner = rank ^ 1, k;
  int sender = rank % 2 == 0, grouped = sender ? grouped_sends : !grouped_sends;
  size_t esz = pat->esz;
  unsigned char* buf[6];
  char what[160], w2[256];
  if (partner >= nranks) return;
  snprintf(what, sizeof what, "six messages %d->%d, %s grouped, the %s one call each",
           rank & ~1, rank | 1, grouped_sends ? "sends" : "receives",
           grouped_sends ? "receives" : "sends");
  fccl_phase("%s", what);
  for (k = 0; k < 6; k++) {
    buf[k] = (unsigned char*)fccl_xmalloc(counts[k] * esz + FCCL_SLACK);
    if (sender)
      fccl_pattern_fill(pat, buf[k], counts[k], fccl_rank_off(base, rank) + (size_t)k * MSG_STRIDE);
    else
      memset(buf[k], FCCL_SENT_RECV, counts[k] * esz + FCCL_SLACK);
  }
  if (grouped) CHECK_OK(fcclGroupStart());
  for (k = 0; k < 6; k++) {
    if (sender)
      CHECK_OK(fcclSend(buf[k], counts[k], pat->dt, partner, comm, NULL));
    else
      CHECK_OK(fcclRecv(buf[k], counts[k], pat->dt, partner, comm, NULL));
  }
  if (grouped) CHECK_OK(fcclGroupEnd());
  for (k = 0; k < 6 && !sender; k++) {
    snprintf(w2, sizeof w2, "%s: message %d (count %zu) from rank %d", what, k, counts[k], partner);
    PATTERN_CHECK(pat, buf[k], counts[k], fccl_rank_off(base, partner) + (size_t)k * MSG_STRIDE, w2);
    snprintf(w2, sizeof w2, "%s: bytes after message %d", what, k);
    BYTES_CHECK(buf[k] + counts[k] * esz, FCCL_SLACK, FCCL_SENT_RECV, w2);
  }
  for (k = 0; k < 6; k++) free(buf[k]);
}

static void allreduce_works(fcclComm_t comm, int rank, int nranks, const char* when) {
  int32_t send[9], recv[9];
  int i;
  for (i = 0; i < 9; i++) send[i] = rank + i;
  memset(recv, 0, sizeof recv);
  if (CHECK_OK(fcclAllReduce(send, recv, 9, fcclInt32, fcclSum, comm, NULL)))
    for (i = 0; i < 9; i++)
      CHECK(recv[i] == (int32_t)(nranks * (nranks - 1) / 2 + nranks * i),
            "allreduce %s: element %d = %d", when, i, (int)recv[i]);
}

/* Outside a group: pairs (2k, 2k+1); even ranks send first, odd ranks receive first. */
static void blocking_pairs_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                                size_t count, size_t base) {
  int partner = rank ^ 1;
  size_t bytes = count * pat->esz;
  unsigned char* send = (unsigned char*)fccl_xmalloc(bytes);
  unsigned char* recv = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  char what[160];
  snprintf(what, sizeof what, "blocking pair %d<->%d %s count=%zu (no group)", rank, partner,
           fccl_dt_name(pat->dt), count);
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, send, count, fccl_rank_off(base, rank));
  memset(recv, FCCL_SENT_RECV, bytes + FCCL_SLACK);
  if (partner < nranks) {
    int r1, r2;
    if (rank % 2 == 0) {
      r1 = CHECK_OK(fcclSend(send, count, pat->dt, partner, comm, NULL));
      r2 = CHECK_OK(fcclRecv(recv, count, pat->dt, partner, comm, NULL));
    } else {
      r2 = CHECK_OK(fcclRecv(recv, count, pat->dt, partner, comm, NULL));
      r1 = CHECK_OK(fcclSend(send, count, pat->dt, partner, comm, NULL));
    }
    (void)r1;
    if (r2) PATTERN_CHECK(pat, recv, count, fccl_rank_off(base, partner), what);
    BYTES_CHECK(recv + bytes, FCCL_SLACK, FCCL_SENT_RECV, "blocking pair: bytes after recvbuff");
  }
  free(send);
  free(recv);
}

/* Both sides' sizes, in elements or in bytes (types may differ between a send and its
 * receive, so bytes are as good). */
static int names_both_sizes(const char* msg) {
  if (!msg) return 0;
  return (strstr(msg, "1234") && strstr(msg, "4321")) ||
         (strstr(msg, "4936") && strstr(msg, "17284"));
}

/* rank 0 sends 1234 int32 to rank 1, which posts a receive of 4321 */
static void mismatch_case(fcclComm_t comm, int rank) {
  int32_t* buf = (int32_t*)fccl_xmalloc(4321 * sizeof(int32_t));
  fcclResult_t res;
  const char* msg;
  memset(buf, 0, 4321 * sizeof(int32_t));
  fccl_phase("send/recv count mismatch");
  if (rank == 0) {
    res = fcclSend(buf, 1234, fcclInt32, 1, comm, NULL);
    if (CHECK_ERR(res, fcclCollectiveMismatch, "fcclSend")) {
      msg = fcclGetLastError(NULL);
      CHECK(names_both_sizes(msg),
            "send/recv mismatch message should name both sizes (1234 and 4321 elements, or "
            "4936 and 17284 bytes): \"%s\"",
            msg ? msg : "(NULL)");
    }
  } else if (rank == 1) {
    res = fcclRecv(buf, 4321, fcclInt32, 0, comm, NULL);
    if (CHECK_ERR(res, fcclCollectiveMismatch, "fcclRecv")) {
      msg = fcclGetLastError(NULL);
      CHECK(names_both_sizes(msg),
            "send/recv mismatch message should name both sizes (1234 and 4321 elements, or "
            "4936 and 17284 bytes): \"%s\"",
            msg ? msg : "(NULL)");
    }
  }
  free(buf);
}

/* Ranks 0 and 1 exchange `count` int32 in one group, but rank 1 receives `count - 1000`:
 * rank 0's send and rank 1's receive must fail with both sizes named (the group's
 * result), rank 1's message to rank 0 must still arrive intact, and nothing may be
 * written past rank 1's smaller recvbuff. */
static void exchange_mismatch_case(fcclComm_t comm, int rank, size_t count) {
  const size_t short_count = count - 1000;
  size_t n, i;
  int32_t *send, *recv;
  fcclResult_t res;
  const char* msg;
  char big[32], small[32];
  if (rank > 1) return;
  n = rank == 0 ? count : short_count;
  send = (int32_t*)fccl_xmalloc(count * sizeof(int32_t));
  recv = (int32_t*)fccl_xmalloc(count * sizeof(int32_t));
  for (i = 0; i < count; i++) send[i] = (int32_t)(i * 3 + 1 + (size_t)rank);
  memset(recv, FCCL_SENT_RECV, count * sizeof(int32_t));
  fccl_phase("send/recv count mismatch in an exchange of %zu int32", count);
  CHECK_OK(fcclGroupStart());
  CHECK_OK(fcclSend(send, count, fcclInt32, 1 - rank, comm, NULL));
  CHECK_OK(fcclRecv(recv, n, fcclInt32, 1 - rank, comm, NULL));
  res = fcclGroupEnd();
  if (CHECK_ERR(res, fcclCollectiveMismatch, "fcclGroupEnd")) {
    msg = fcclGetLastError(NULL);
    snprintf(big, sizeof big, "%zu", count * sizeof(int32_t));
    snprintf(small, sizeof small, "%zu", short_count * sizeof(int32_t));
    CHECK(msg && strstr(msg, big) && strstr(msg, small),
          "exchange mismatch message should name %s and %s bytes: \"%s\"", big, small,
          msg ? msg : "(NULL)");
  }
  if (rank == 0) {
    /* rank 1's send matched this receive: its data must be complete */
    for (i = 0; i < count; i++)
      if (recv[i] != (int32_t)(i * 3 + 2)) {
        CHECK(0, "exchange mismatch: rank 0 got %d at element %zu from rank 1, expected %d",
              (int)recv[i], i, (int)(i * 3 + 2));
        break;
      }
  } else {
    BYTES_CHECK(recv + short_count, 1000 * sizeof(int32_t), FCCL_SENT_RECV,
                "exchange mismatch: bytes past rank 1's receive");
  }
  free(send);
  free(recv);
}

static void bad_peer_case(fcclComm_t comm, int nranks) {
  int32_t send[4] = {1, 2, 3, 4}, recv[4];
  fccl_phase("peers out of range");
  memset(recv, FCCL_SENT_RECV, sizeof recv);
  CHECK_ERR(fcclSend(send, 4, fcclInt32, nranks, comm, NULL), fcclInvalidArgument, "fcclSend");
  CHECK_ERR(fcclSend(send, 4, fcclInt32, -1, comm, NULL), fcclInvalidArgument, "fcclSend");
  CHECK_ERR(fcclRecv(recv, 4, fcclInt32, nranks, comm, NULL), fcclInvalidArgument, "fcclRecv");
  CHECK_ERR(fcclRecv(recv, 4, fcclInt32, -1, comm, NULL), fcclInvalidArgument, "fcclRecv");
  BYTES_CHECK(recv, sizeof recv, FCCL_SENT_RECV, "fcclRecv with a bad peer wrote recvbuff");
}

static int body(fcclComm_t comm, int rank, int nranks) {
  static const size_t counts[] = {0, 1, 7, FCCL_BIG_COUNT};
  int t, c;
  size_t base = 0;
  fccl_pattern pat;
  for (t = 0; t < FCCL_NTYPES; t++) {
    fccl_pattern_init(&pat, fccl_types[t], FCCL_SCHEME_FULL);
    for (c = 0; c < 4; c++) ring_case(comm, rank, nranks, &pat, counts[c], 1, (t + c) % 2, base += 907);
    all_pairs_case(comm, rank, nranks, &pat, 7, base += 907);
    fccl_pattern_free(&pat);
  }
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_FULL);
  ring_case(comm, rank, nranks, &pat, (size_t)1 << 20, 1, 0, base += 907);         /* 4 MiB */
  ring_case(comm, rank, nranks, &pat, ((size_t)3 << 20) + 5, -1, 1, base += 907);  /* 12 MiB */
  all_pairs_case(comm, rank, nranks, &pat, (((size_t)1 << 20) / (size_t)nranks) + 1, base += 907);
  in_order_case(comm, rank, nranks, &pat, base += 907);
  blocking_pairs_case(comm, rank, nranks, &pat, 1000, base += 907);
  blocking_pairs_case(comm, rank, nranks, &pat, (size_t)1 << 20, base += 907);
  grouped_one_side_case(comm, rank, nranks, &pat, 1, base += 907);
  grouped_one_side_case(comm, rank, nranks, &pat, 0, base += 907);
  /* point-to-point involves only its two ranks: at an odd world size the last rank
   * made none of the calls above, and collectives must still match */
  allreduce_works(comm, rank, nranks, "after send/recv between pairs of ranks only");
  fccl_pattern_free(&pat);

  /* send to self */
  fccl_pattern_init(&pat, fcclFloat64, FCCL_SCHEME_FULL);
  {
    const size_t count = 100003;
    double* send = (double*)fccl_xmalloc(count * sizeof(double));
    double* recv = (double*)fccl_xmalloc(count * sizeof(double));
    fccl_phase("send to self");
    fccl_pattern_fill(&pat, send, count, fccl_rank_off(base += 907, rank));
    memset(recv, FCCL_SENT_RECV, count * sizeof(double));
    CHECK_OK(fcclGroupStart());
    CHECK_OK(fcclSend(send, count, fcclFloat64, rank, comm, NULL));
    CHECK_OK(fcclRecv(recv, count, fcclFloat64, rank, comm, NULL));
    if (CHECK_OK(fcclGroupEnd()))
      PATTERN_CHECK(&pat, recv, count, fccl_rank_off(base, rank), "send to self");
    free(send);
    free(recv);
  }
  fccl_pattern_free(&pat);

  /* In place in a group: the receive overlaps the send of the same group. */
  {
    static const size_t counts[] = {7, 5000, 20000, 300001, ((size_t)3 << 20) + 5};
    static const long shifts[] = {-1000, 1000, -150000, 150000}; /* +-count/2 of 300001 */
    int d;
    fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_FULL);
    for (c = 0; c < 5; c++)
      for (d = 0; d < 2; d++)
        inplace_ring_case(comm, rank, nranks, &pat, counts[c], d ? -1 : 1, (c + d) % 2,
                          base += 907, 0);
    for (c = 0; c < 4; c++)
      inplace_ring_case(comm, rank, nranks, &pat, 300001, c % 2 ? -1 : 1, c / 2, base += 907,
                        shifts[c]);
    if (nranks >= 2)
      for (c = 0; c < 5; c++)
        inplace_both_ways_case(comm, rank, nranks, &pat, counts[c], c % 2, base += 907);
    fccl_pattern_free(&pat);
    fccl_pattern_init(&pat, fcclInt8, FCCL_SCHEME_FULL);
    inplace_ring_case(comm, rank, nranks, &pat, 70000, 1, 0, base += 907, 0);
    fccl_pattern_free(&pat);
    fccl_pattern_init(&pat, fcclUint8, FCCL_SCHEME_FULL);
    inplace_ring_case(comm, rank, nranks, &pat, 70000, -1, 1, base += 907, 0);
    fccl_pattern_free(&pat);
  }

  bad_peer_case(comm, nranks);

  if (nranks >= 2) {
    mismatch_case(comm, rank);
    exchange_mismatch_case(comm, rank, 3000);   /* eager: count and data in one message */
    exchange_mismatch_case(comm, rank, 300000); /* large: data only once the counts agree */
    fccl_pattern_init(&pat, fcclInt32, FCCL_SCHEME_FULL);
    ring_case(comm, rank, nranks, &pat, 1000, 1, 0, base += 907);
    fccl_pattern_free(&pat);
  }
  allreduce_works(comm, rank, nranks, "at the end");
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
