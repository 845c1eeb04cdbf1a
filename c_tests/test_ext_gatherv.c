/* Uneven collectives (docs/abi.md "Extensions beyond NCCL").
 *
 * fcclAllGatherV: every type, uneven sendcounts with zeros, receive layouts with gaps
 * (each rank lays its receive buffer out its own way: forwards or backwards, the
 * displacements are local), a scaled float32 case, in-place (sendbuff == recvbuff +
 * rdispls[rank]) and NULL sendbuff for a count of 0.  Gaps and the bytes past the end stay
 * untouched.  Mismatch: rank 1 sends 7 elements (and says so in its own recvcounts[1])
 * while the others expect 5: every rank gets fcclCollectiveMismatch, nobody hangs, and the
 * communicator still works.
 *
 * fcclReduceScatterV: float32 / int32 / bfloat16 x sum / max / avg, uneven recvcounts with
 * zeros, send layouts with gaps (local sdispls), out-of-place and in-place (recvbuff ==
 * sendbuff + sdispls[rank]).  Mismatched recvcounts arrays across ranks (different total;
 * same total split differently) -> fcclCollectiveMismatch on every rank. */
#include "harness.h"

#define BLOCK_SALT ((size_t)1009) /* pattern offset between the blocks of ReduceScatterV */

enum { SIZE_SMALL, SIZE_SCALED };

/* elements contributed by rank r (AllGatherV) or received by rank r (ReduceScatterV):
 * 0..4 with zeros for some ranks; SIZE_SCALED: the same times ~200000/nranks */
static size_t count_of(int size, int r, int nranks, int salt) {
  size_t c = (size_t)((r * 3 + salt * 7 + 1) % 5);
  if (size == SIZE_SCALED) c *= ((size_t)200003 / (size_t)(2 * nranks)) | 1u;
  return c;
}

/* Blocks laid out with a gap of ((q + salt) % 3) elements before each, forwards or
 * backwards; returns the buffer length in elements (with a trailing gap of 2). */
static size_t layout_displs(int nranks, const size_t* counts, size_t* displs, int reverse,
                            int salt) {
  size_t pos = 0;
  int j;
  for (j = 0; j < nranks; j++) {
    int q = reverse ? nranks - 1 - j : j;
    pos += (size_t)((q + salt) % 3);
    displs[q] = pos;
    pos += counts[q];
  }
  return pos + 2;
}

static size_t* xcounts(int nranks) {
  return (size_t*)fccl_xmalloc((size_t)nranks * sizeof(size_t));
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

/* ================================================================== AllGatherV */

/* rank q's contribution: pattern from fccl_rank_off(base, q) */
static void gatherv_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                         int size, int salt, int inplace, size_t base) {
  size_t esz = pat->esz;
  size_t* rc = xcounts(nranks);
  size_t* rd = xcounts(nranks);
  size_t rlen, rbytes, sendcount, sbytes;
  int reverse = (rank + salt) % 2, q;
  unsigned char *recv, *send = NULL;
  const void* sendarg;
  char what[224], w2[512];
  for (q = 0; q < nranks; q++) rc[q] = count_of(size, q, nranks, salt);
  rlen = layout_displs(nranks, rc, rd, reverse, salt);
  rbytes = rlen * esz;
  sendcount = rc[rank];
  sbytes = sendcount * esz;
  snprintf(what, sizeof what, "allgatherv %s %s salt=%d sendcount=%zu %s layout=%s",
           fccl_dt_name(pat->dt), size == SIZE_SMALL ? "small" : "scaled", salt, sendcount,
           inplace ? "in-place" : "out-of-place", reverse ? "backwards" : "forwards");
  fccl_phase("%s", what);
  recv = (unsigned char*)fccl_xmalloc(rbytes + FCCL_SLACK);
  memset(recv, FCCL_SENT_RECV, rbytes + FCCL_SLACK);
  if (inplace) {
    fccl_pattern_fill(pat, recv + rd[rank] * esz, sendcount, fccl_rank_off(base, rank));
    sendarg = recv + rd[rank] * esz;
  } else if (sendcount == 0 && salt % 2 == 0) {
    sendarg = NULL; /* NULL with a count of 0 is legal */
  } else {
    send = (unsigned char*)fccl_xmalloc(sbytes + FCCL_SLACK);
    fccl_pattern_fill(pat, send, sendcount, fccl_rank_off(base, rank));
    memset(send + sbytes, FCCL_SENT_GAP, FCCL_SLACK);
    sendarg = send;
  }

  if (CHECK_OK(fcclAllGatherV(sendarg, sendcount, recv, rc, rd, pat->dt, comm, NULL))) {
    for (q = 0; q < nranks; q++) {
      snprintf(w2, sizeof w2, "%s: block of rank %d (%zu elements at rdispls %zu)", what, q,
               rc[q], rd[q]);
      PATTERN_CHECK(pat, recv + rd[q] * esz, rc[q], fccl_rank_off(base, q), w2);
    }
  }
  for (q = 0; q < nranks; q++) memset(recv + rd[q] * esz, FCCL_SENT_RECV, rc[q] * esz);
  snprintf(w2, sizeof w2, "%s: recvbuff outside the blocks (gaps, tail) was written", what);
  BYTES_CHECK(recv, rbytes + FCCL_SLACK, FCCL_SENT_RECV, w2);
  if (send) {
    snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
    PATTERN_CHECK(pat, send, sendcount, fccl_rank_off(base, rank), w2);
    snprintf(w2, sizeof w2, "%s: bytes after sendbuff", what);
    BYTES_CHECK(send + sbytes, FCCL_SLACK, FCCL_SENT_GAP, w2);
    free(send);
  }
  free(recv);
  free(rc);
  free(rd);
}

/* Everyone expects 5 elements from rank 1; rank 1 sends 7 and its own recvcounts[1] says 7. */
static void gatherv_mismatch(fcclComm_t comm, int rank, int nranks) {
  size_t* rc = xcounts(nranks);
  size_t* rd = xcounts(nranks);
  size_t rlen, sendcount;
  int32_t *send, *recv;
  fcclResult_t res;
  int q;
  fccl_phase("allgatherv mismatch: rank 1 sends 7, the others expect 5");
  for (q = 0; q < nranks; q++) rc[q] = (size_t)(3 + q % 4);
  rc[1] = rank == 1 ? 7 : 5;
  sendcount = rc[rank];
  rlen = layout_displs(nranks, rc, rd, 0, 0);
  send = (int32_t*)fccl_xmalloc(sendcount * sizeof(int32_t));
  recv = (int32_t*)fccl_xmalloc(rlen * sizeof(int32_t));
  for (q = 0; q < (int)sendcount; q++) send[q] = rank * 100 + q;
  memset(recv, FCCL_SENT_RECV, rlen * sizeof(int32_t));
  res = fcclAllGatherV(send, sendcount, recv, rc, rd, fcclInt32, comm, NULL);
  if (!CHECK_ERR(res, fcclCollectiveMismatch, "fcclAllGatherV"))
    CHECK(0, "fcclAllGatherV(sendcount=%zu, recvcounts[1]=%zu on this rank; rank 1 sends 7, "
             "the others expect 5): expected fcclCollectiveMismatch on every rank",
          sendcount, rc[1]);
  free(send);
  free(recv);
  free(rc);
  free(rd);
}

/* ================================================================== ReduceScatterV */

/* Rank r fills block q (at its sdispls[q]) with the pattern from
 * fccl_rank_off(base + q * BLOCK_SALT, r): the reduction received by rank q is the
 * reference from base + q * BLOCK_SALT. */
static void rsv_case(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                     const fccl_ref* ref, int size, int salt, int inplace, size_t base) {
  size_t esz = pat->esz;
  size_t* rc = xcounts(nranks);
  size_t* sd = xcounts(nranks);
  size_t slen, sbytes, rcount, rbytes;
  int reverse = (rank + salt) % 2, q;
  unsigned char *send, *send_copy, *recv;
  char what[224], w2[512];
  for (q = 0; q < nranks; q++) rc[q] = count_of(size, q, nranks, salt + 1);
  slen = layout_displs(nranks, rc, sd, reverse, salt);
  sbytes = slen * esz;
  rcount = rc[rank];
  rbytes = rcount * esz;
  snprintf(what, sizeof what, "reducescatterv %s %s %s salt=%d recvcount=%zu %s layout=%s",
           fccl_dt_name(pat->dt), fccl_op_name(ref->op), size == SIZE_SMALL ? "small" : "scaled",
           salt, rcount, inplace ? "in-place" : "out-of-place", reverse ? "backwards" : "forwards");
  fccl_phase("%s", what);
  send = (unsigned char*)fccl_xmalloc(sbytes + FCCL_SLACK);
  memset(send, FCCL_SENT_GAP, sbytes + FCCL_SLACK);
  for (q = 0; q < nranks; q++)
    fccl_pattern_fill(pat, send + sd[q] * esz, rc[q],
                      fccl_rank_off(base + (size_t)q * BLOCK_SALT, rank));
  send_copy = (unsigned char*)fccl_xmalloc(sbytes + FCCL_SLACK);
  memcpy(send_copy, send, sbytes + FCCL_SLACK);
  if (inplace) {
    recv = send + sd[rank] * esz;
  } else {
    recv = (unsigned char*)fccl_xmalloc(rbytes + FCCL_SLACK);
    memset(recv, FCCL_SENT_RECV, rbytes + FCCL_SLACK);
  }

  if (CHECK_OK(fcclReduceScatterV(send, rc, sd, recv, pat->dt, ref->op, comm, NULL)))
    REF_CHECK(ref, recv, rcount, base + (size_t)rank * BLOCK_SALT, what);
  if (inplace) {
    /* everything but this rank's own block must be as it was */
    memcpy(send + sd[rank] * esz, send_copy + sd[rank] * esz, rbytes);
    snprintf(w2, sizeof w2, "%s: sendbuff outside recvbuff was modified", what);
    CHECK(memcmp(send, send_copy, sbytes + FCCL_SLACK) == 0, "%s", w2);
  } else {
    snprintf(w2, sizeof w2, "%s: bytes after recvbuff", what);
    BYTES_CHECK(recv + rbytes, FCCL_SLACK, FCCL_SENT_RECV, w2);
    snprintf(w2, sizeof w2, "%s: sendbuff was modified", what);
    CHECK(memcmp(send, send_copy, sbytes + FCCL_SLACK) == 0, "%s", w2);
    free(recv);
  }
  free(send);
  free(send_copy);
  free(rc);
  free(sd);
}

/* variant 0: rank 0's recvcounts[nranks-1] is 3 larger (different total);
 * variant 1: rank 0 moves 2 elements from recvcounts[0] to recvcounts[1] (same total). */
static void rsv_mismatch(fcclComm_t comm, int rank, int nranks, int variant) {
  size_t* rc = xcounts(nranks);
  size_t* sd = xcounts(nranks);
  size_t slen;
  float *send, *recv;
  fcclResult_t res;
  size_t i;
  int q;
  fccl_phase("reducescatterv mismatch variant %d", variant);
  for (q = 0; q < nranks; q++) rc[q] = (size_t)(4 + q % 3);
  if (rank == 0) {
    if (variant == 0) {
      rc[nranks - 1] += 3;
    } else {
      rc[0] -= 2;
      rc[1] += 2;
    }
  }
  slen = layout_displs(nranks, rc, sd, 0, 1);
  send = (float*)fccl_xmalloc(slen * sizeof(float));
  recv = (float*)fccl_xmalloc((rc[rank] + 1) * sizeof(float));
  for (i = 0; i < slen; i++) send[i] = (float)(i % 17);
  res = fcclReduceScatterV(send, rc, sd, recv, fcclFloat32, fcclSum, comm, NULL);
  if (!CHECK_ERR(res, fcclCollectiveMismatch, "fcclReduceScatterV"))
    CHECK(0, "fcclReduceScatterV with recvcounts differing across ranks (%s; this rank's "
             "recvcounts[0]=%zu, recvcounts[1]=%zu, recvcounts[%d]=%zu): expected "
             "fcclCollectiveMismatch on every rank",
          variant == 0 ? "rank 0's total is 3 larger" : "same total, split differently on rank 0",
          rc[0], rc[1], nranks - 1, rc[nranks - 1]);
  free(send);
  free(recv);
  free(rc);
  free(sd);
}

/* ================================================================== body */

static int body(fcclComm_t comm, int rank, int nranks) {
  static const fcclDataType_t rs_types[3] = {fcclFloat32, fcclInt32, fcclBfloat16};
  static const fcclRedOp_t rs_ops[3] = {fcclSum, fcclMax, fcclAvg};
  int t, o, salt;
  size_t base = 0;
  fccl_pattern pat;
  fccl_ref ref;

  /* ---- AllGatherV */
  for (t = 0; t < FCCL_NTYPES; t++) {
    fccl_pattern_init(&pat, fccl_types[t], FCCL_SCHEME_FULL);
    for (salt = 0; salt < 3; salt++) {
      gatherv_case(comm, rank, nranks, &pat, SIZE_SMALL, salt + t, 0, base += 211);
      gatherv_case(comm, rank, nranks, &pat, SIZE_SMALL, salt + t, 1, base += 211);
    }
    fccl_pattern_free(&pat);
  }
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_FULL);
  gatherv_case(comm, rank, nranks, &pat, SIZE_SCALED, 0, 0, base += 211);
  gatherv_case(comm, rank, nranks, &pat, SIZE_SCALED, 1, 1, base += 211);
  fccl_pattern_free(&pat);
  fccl_pattern_init(&pat, fcclUint8, FCCL_SCHEME_FULL);
  gatherv_case(comm, rank, nranks, &pat, SIZE_SCALED, 2, 0, base += 211);
  fccl_pattern_free(&pat);

  if (nranks >= 2) {
    gatherv_mismatch(comm, rank, nranks);
    fccl_phase("after the allgatherv mismatch");
    allreduce_works(comm, rank, nranks, "after the allgatherv mismatch");
    fccl_pattern_init(&pat, fcclInt64, FCCL_SCHEME_FULL);
    gatherv_case(comm, rank, nranks, &pat, SIZE_SMALL, 1, 0, base += 211);
    gatherv_case(comm, rank, nranks, &pat, SIZE_SMALL, 2, 1, base += 211);
    fccl_pattern_free(&pat);
  }

  /* ---- ReduceScatterV */
  for (t = 0; t < 3; t++) {
    for (o = 0; o < 3; o++) {
      fccl_pattern_init(&pat, rs_types[t], fccl_scheme_for_op(rs_ops[o]));
      fccl_ref_init(&ref, &pat, rs_ops[o], nranks);
      for (salt = 0; salt < 3; salt++) {
        rsv_case(comm, rank, nranks, &pat, &ref, SIZE_SMALL, salt + o, 0, base += 307);
        rsv_case(comm, rank, nranks, &pat, &ref, SIZE_SMALL, salt + t, 1, base += 307);
      }
      if (o == 0 || t == 0)
        rsv_case(comm, rank, nranks, &pat, &ref, SIZE_SCALED, t + o, (t + o) % 2, base += 307);
      fccl_ref_free(&ref);
      fccl_pattern_free(&pat);
    }
  }

  if (nranks >= 2) {
    int variant;
    for (variant = 0; variant < 2; variant++) {
      rsv_mismatch(comm, rank, nranks, variant);
      fccl_phase("after reducescatterv mismatch variant %d", variant);
      allreduce_works(comm, rank, nranks, "after the reducescatterv mismatch");
      fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_SUM);
      fccl_ref_init(&ref, &pat, fcclSum, nranks);
      rsv_case(comm, rank, nranks, &pat, &ref, SIZE_SMALL, variant, variant, base += 307);
      fccl_ref_free(&ref);
      fccl_pattern_free(&pat);
    }
  }
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
