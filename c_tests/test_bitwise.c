/* ferroccl's bitwise operators (fcclBand, fcclBor, fcclBxor: integer types only) through
 * every reducing call (all_reduce, reduce, reduce_scatter, its V and axis forms, the
 * coalesced all_reduce), checked bit for bit against the harness's reference on random
 * 64-bit patterns, and on bits that each belong to one rank; then their refusal for
 * every float type (fcclInvalidArgument naming the call, the op and the type). */
#include "harness.h"

#define NINT 6
static const fcclDataType_t INTS[NINT] = {fcclInt8,  fcclUint8,  fcclInt32,
                                          fcclUint32, fcclInt64, fcclUint64};
#define NFLT 6
static const fcclDataType_t FLOATS[NFLT] = {fcclFloat16,  fcclFloat32,    fcclFloat64,
                                            fcclBfloat16, fcclFloat8e4m3, fcclFloat8e5m2};

static void t_allreduce(fcclComm_t comm, int rank, const fccl_pattern* pat, const fccl_ref* ref,
                        size_t count, int inplace, size_t base) {
  size_t bytes = count * pat->esz;
  unsigned char* send = (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  unsigned char* recv = inplace ? send : (unsigned char*)fccl_xmalloc(bytes + FCCL_SLACK);
  char what[160];
  snprintf(what, sizeof what, "allreduce %s %s count=%zu %s", fccl_dt_name(pat->dt),
           fccl_op_name(ref->op), count, inplace ? "in-place" : "out-of-place");
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, send, count, fccl_rank_off(base, rank));
  memset(recv + bytes, FCCL_SENT_RECV, FCCL_SLACK);
  if (CHECK_OK(fcclAllReduce(send, recv, count, pat->dt, ref->op, comm, NULL)))
    REF_CHECK(ref, recv, count, base, what);
  BYTES_CHECK(recv + bytes, FCCL_SLACK, FCCL_SENT_RECV, what);
  if (!inplace) free(recv);
  free(send);
}

static void t_reduce(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                     const fccl_ref* ref, size_t count, int root, size_t base) {
  size_t bytes = count * pat->esz;
  unsigned char* send = (unsigned char*)fccl_xmalloc(bytes);
  unsigned char* recv = rank == root ? (unsigned char*)fccl_xmalloc(bytes + 1) : NULL;
  char what[160];
  snprintf(what, sizeof what, "reduce %s %s count=%zu root=%d of %d", fccl_dt_name(pat->dt),
           fccl_op_name(ref->op), count, root, nranks);
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, send, count, fccl_rank_off(base, rank));
  if (CHECK_OK(fcclReduce(send, recv, count, pat->dt, ref->op, root, comm, NULL)) && recv)
    REF_CHECK(ref, recv, count, base, what);
  free(recv);
  free(send);
}

static void t_reducescatter(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                            const fccl_ref* ref, size_t count, size_t base) {
  size_t total = count * (size_t)nranks;
  unsigned char* send = (unsigned char*)fccl_xmalloc(total * pat->esz);
  unsigned char* recv = (unsigned char*)fccl_xmalloc(count * pat->esz + 1);
  char what[160];
  snprintf(what, sizeof what, "reducescatter %s %s recvcount=%zu", fccl_dt_name(pat->dt),
           fccl_op_name(ref->op), count);
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, send, total, fccl_rank_off(base, rank));
  if (CHECK_OK(fcclReduceScatter(send, recv, count, pat->dt, ref->op, comm, NULL)))
    REF_CHECK(ref, recv, count, base + (size_t)rank * count, what);
  free(recv);
  free(send);
}

/* Uneven blocks: rank p gets p + 2 elements from displacement sdispls[p] (blocks packed
 * with a gap of 3 between them). */
static void t_reducescatterv(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                             const fccl_ref* ref, size_t base) {
  size_t* counts = (size_t*)fccl_xmalloc(sizeof(size_t) * (size_t)nranks);
  size_t* displs = (size_t*)fccl_xmalloc(sizeof(size_t) * (size_t)nranks);
  size_t total = 0;
  unsigned char *send, *recv;
  int p;
  char what[160];
  for (p = 0; p < nranks; p++) {
    counts[p] = (size_t)p + 2;
    displs[p] = total;
    total += counts[p] + 3;
  }
  snprintf(what, sizeof what, "reducescatterv %s %s", fccl_dt_name(pat->dt),
           fccl_op_name(ref->op));
  fccl_phase("%s", what);
  send = (unsigned char*)fccl_xmalloc(total * pat->esz);
  recv = (unsigned char*)fccl_xmalloc(counts[rank] * pat->esz);
  fccl_pattern_fill(pat, send, total, fccl_rank_off(base, rank));
  if (CHECK_OK(fcclReduceScatterV(send, counts, displs, recv, pat->dt, ref->op, comm, NULL)))
    REF_CHECK(ref, recv, counts[rank], base + displs[rank], what);
  free(recv);
  free(send);
  free(displs);
  free(counts);
}

/* A {rows, nranks * cols} tensor scattered along axis 1: rank r gets columns
 * [r * cols, (r + 1) * cols) of every row. */
static void t_reducescatter_axis(fcclComm_t comm, int rank, int nranks, const fccl_pattern* pat,
                                 const fccl_ref* ref, size_t base) {
  const size_t rows = 3, cols = 5, width = cols * (size_t)nranks;
  size_t shape[2] = {rows, width}, row;
  unsigned char* send = (unsigned char*)fccl_xmalloc(rows * width * pat->esz);
  unsigned char* recv = (unsigned char*)fccl_xmalloc(rows * cols * pat->esz);
  char what[160];
  snprintf(what, sizeof what, "reducescatter axis 1 %s %s", fccl_dt_name(pat->dt),
           fccl_op_name(ref->op));
  fccl_phase("%s", what);
  fccl_pattern_fill(pat, send, rows * width, fccl_rank_off(base, rank));
  if (CHECK_OK(fcclReduceScatterAxis(send, recv, 2, shape, 1, pat->dt, ref->op, comm, NULL)))
    for (row = 0; row < rows; row++)
      REF_CHECK(ref, recv + row * cols * pat->esz, cols, base + row * width + (size_t)rank * cols,
                what);
  free(recv);
  free(send);
}

/* Two buffers in one bucket and, with a bucket of 8 bytes, one bucket each. */
static void t_coalesced(fcclComm_t comm, int rank, const fccl_pattern* pat, const fccl_ref* ref,
                        size_t base) {
  size_t counts[2] = {13, 301}, off[2] = {base, base + 1000}, bucket, i;
  void* send[2];
  void* recv[2];
  char what[160];
  for (bucket = 0; bucket <= 8; bucket += 8) {
    snprintf(what, sizeof what, "allreduce coalesced %s %s bucket=%zu", fccl_dt_name(pat->dt),
             fccl_op_name(ref->op), bucket);
    fccl_phase("%s", what);
    for (i = 0; i < 2; i++) {
      send[i] = fccl_xmalloc(counts[i] * pat->esz);
      recv[i] = fccl_xmalloc(counts[i] * pat->esz);
      fccl_pattern_fill(pat, send[i], counts[i], fccl_rank_off(off[i], rank));
    }
    if (CHECK_OK(fcclAllReduceCoalesced((const void* const*)send, recv, counts, 2, pat->dt, ref->op,
                                        bucket, comm, NULL)))
      for (i = 0; i < 2; i++) REF_CHECK(ref, recv[i], counts[i], off[i], what);
    for (i = 0; i < 2; i++) {
      free(send[i]);
      free(recv[i]);
    }
  }
}

/* Each rank owns the bits b with b % nranks == rank: or and xor must set every bit (a
 * rank whose bits went missing leaves zeros), and of the complements, and must clear
 * every bit (with one rank: the complement itself, zero). */
static void t_owned_bits(fcclComm_t comm, int rank, int nranks, fcclDataType_t dt) {
  const size_t count = 9;
  size_t esz = fccl_dt_size(dt), bits = 8 * esz, i, b;
  uint64_t mine = 0, all = bits == 64 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
  unsigned char* buf = (unsigned char*)fccl_xmalloc(count * esz);
  int o;
  for (b = 0; b < bits; b++)
    if ((int)(b % (size_t)nranks) == rank) mine |= (uint64_t)1 << b;
  for (o = 0; o < FCCL_NBITOPS; o++) {
    fcclRedOp_t op = fccl_bitops[o];
    uint64_t give = op == fcclBand ? ~mine & all : mine;
    uint64_t want = op == fcclBand ? (nranks == 1 ? ~mine & all : 0) : all;
    fccl_phase("owned bits %s %s", fccl_dt_name(dt), fccl_op_name(op));
    for (i = 0; i < count; i++) fccl_store_i(dt, buf, i, give);
    if (!CHECK_OK(fcclAllReduce(buf, buf, count, dt, op, comm, NULL))) continue;
    for (i = 0; i < count; i++) {
      uint64_t got = fccl_load_i(dt, buf, i) & all;
      CHECK(got == want, "owned bits %s %s element %zu: got 0x%llx, want 0x%llx (rank %d of %d)",
            fccl_dt_name(dt), fccl_op_name(op), i, (unsigned long long)got,
            (unsigned long long)want, rank, nranks);
    }
  }
  free(buf);
}

/* The message names the op and the type, and says which integer type holds the bits. */
static void check_message(const char* call, fcclRedOp_t op, fcclDataType_t dt) {
  const char* m = fcclGetLastError(NULL);
  CHECK(m && strstr(m, call) && strstr(m, fccl_op_name(op)) && strstr(m, fccl_dt_name(dt)) &&
            strstr(m, "integer") && strstr(m, "fcclUint"),
        "%s with %s on %s: the message should name the call, the op and the type and give the "
        "integer type to use: \"%s\"",
        call, fccl_op_name(op), fccl_dt_name(dt), m ? m : "(null)");
}

static void t_refused(fcclComm_t comm, int rank, int nranks) {
  double send[64], recv[64];
  size_t counts[64], displs[64], shape[2] = {1, (size_t)nranks};
  const void* sends[1] = {send};
  void* recvs[1] = {recv};
  size_t one = 1;
  int t, o, p, bad[3] = {5, 63, 67};
  for (p = 0; p < nranks && p < 64; p++) {
    counts[p] = 1;
    displs[p] = (size_t)p;
  }
  memset(send, 0, sizeof send);
  for (t = 0; t < NFLT; t++)
    for (o = 0; o < FCCL_NBITOPS; o++) {
      fcclDataType_t dt = FLOATS[t];
      fcclRedOp_t op = fccl_bitops[o];
      fccl_phase("refused %s %s", fccl_dt_name(dt), fccl_op_name(op));
      if (CHECK_ERR(fcclAllReduce(send, recv, 1, dt, op, comm, NULL), fcclInvalidArgument,
                    "fcclAllReduce"))
        check_message("fcclAllReduce", op, dt);
      if (CHECK_ERR(fcclReduce(send, recv, 1, dt, op, 0, comm, NULL), fcclInvalidArgument,
                    "fcclReduce"))
        check_message("fcclReduce", op, dt);
      if (CHECK_ERR(fcclReduceScatter(send, recv, 1, dt, op, comm, NULL), fcclInvalidArgument,
                    "fcclReduceScatter"))
        check_message("fcclReduceScatter", op, dt);
      if (CHECK_ERR(fcclReduceScatterV(send, counts, displs, recv, dt, op, comm, NULL),
                    fcclInvalidArgument, "fcclReduceScatterV"))
        check_message("fcclReduceScatterV", op, dt);
      if (CHECK_ERR(fcclReduceScatterAxis(send, recv, 2, shape, 1, dt, op, comm, NULL),
                    fcclInvalidArgument, "fcclReduceScatterAxis"))
        check_message("fcclReduceScatterAxis", op, dt);
      if (CHECK_ERR(fcclAllReduceCoalesced(sends, recvs, &one, 1, dt, op, 0, comm, NULL),
                    fcclInvalidArgument, "fcclAllReduceCoalesced"))
        check_message("fcclAllReduceCoalesced", op, dt);
      /* the wire-type all_reduce takes float data, so no bitwise op passes it */
      if (dt == fcclFloat32 || dt == fcclFloat64)
        if (CHECK_ERR(fcclAllReduceWire(send, recv, 1, dt, op, fcclBfloat16, comm, NULL),
                      fcclInvalidArgument, "fcclAllReduceWire"))
          check_message("fcclAllReduceWire", op, dt);
    }
  /* values next to the extension's are still no operator */
  for (o = 0; o < 3; o++) {
    CHECK_ERR(fcclAllReduce(send, recv, 1, fcclInt32, (fcclRedOp_t)bad[o], comm, NULL),
              fcclInvalidArgument, "fcclAllReduce");
    CHECK(strstr(fcclGetLastError(NULL), "fcclBand") != NULL,
          "op %d: the message should list the valid ops: \"%s\"", bad[o], fcclGetLastError(NULL));
  }
  /* and the integer wire all_reduce is refused for its data type, whatever the op */
  CHECK_ERR(fcclAllReduceWire(send, recv, 1, fcclInt32, fcclBxor, fcclInt8, comm, NULL),
            fcclInvalidArgument, "fcclAllReduceWire");
  (void)rank;
}

static int body(fcclComm_t comm, int rank, int nranks) {
  static const size_t counts[] = {1, 7, 1001};
  int t, o, c;
  size_t base = 0;
  fccl_pattern pat;
  fccl_ref ref;
  t_refused(comm, rank, nranks);
  for (t = 0; t < NINT; t++) {
    fcclDataType_t dt = INTS[t];
    for (o = 0; o < FCCL_NBITOPS; o++) {
      fcclRedOp_t op = fccl_bitops[o];
      fccl_pattern_init(&pat, dt, fccl_scheme_for_op(op));
      fccl_ref_init(&ref, &pat, op, nranks);
      for (c = 0; c < 3; c++) {
        t_allreduce(comm, rank, &pat, &ref, counts[c], c % 2, base += 409);
        t_reduce(comm, rank, nranks, &pat, &ref, counts[c], (t + o + c) % nranks, base += 409);
        t_reducescatter(comm, rank, nranks, &pat, &ref, counts[c], base += 409);
      }
      /* large enough for the pipelined and chunked algorithms */
      if ((t + o) % 3 == 0)
        t_allreduce(comm, rank, &pat, &ref, FCCL_BIG_COUNT, (t + o) % 2, base += 409);
      t_reducescatterv(comm, rank, nranks, &pat, &ref, base += 409);
      t_reducescatter_axis(comm, rank, nranks, &pat, &ref, base += 409);
      t_coalesced(comm, rank, &pat, &ref, base += 409);
      fccl_ref_free(&ref);
      fccl_pattern_free(&pat);
    }
    t_owned_bits(comm, rank, nranks, dt);
  }
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
