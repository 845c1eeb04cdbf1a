/* Single copy: large messages out of fcclMemAllocHost buffers are read by peers
 * straight from the sender's buffer (mapped shared memory between processes; any
 * memory between thread ranks). Every collective and send/recv on such buffers, at
 * sizes around the single-copy thresholds (32 KiB for messages, where a broadcast
 * root also hands its call from the board to the links; 64 KiB a rank, where
 * all_gather, gather and broadcast leave the board) and above them, at offsets inside
 * the allocation, in and out of place; buffers rewritten between calls (a peer must
 * see the new data), freed and allocated again (a peer must not read a stale
 * mapping), and mixed with malloc'd buffers (which go through the rings).
 * Send/recv in place in a group on fcclMemAllocHost buffers (100 KB, 1 MB, 16 MiB; at
 * two ranks also with the receive 4096 elements below the send): the receive gets the
 * peer's message, the send carries what its buffer held when the group ended, and
 * nothing else in the buffer is written. */
#include "harness.h"

#include <stdint.h>

/* Element i of rank r's input in call k: distinct per rank, index and call. */
static uint32_t val(int r, size_t i, unsigned k) {
  return (uint32_t)(i * 2654435761u) ^ (uint32_t)(r * 40503u + k * 977u + 1u);
}

static size_t g_fail_reports;

static void expect(const uint32_t* got, size_t n, uint32_t (*want)(size_t, const void*),
                   const void* ctx, const char* what) {
  size_t i, bad = 0;
  for (i = 0; i < n; i++) {
    uint32_t w = want(i, ctx);
    if (got[i] != w) {
      if (bad < 3 && g_fail_reports < 20) {
        CHECK(0, "%s: element %zu is %u, expected %u", what, i, (unsigned)got[i], (unsigned)w);
        g_fail_reports++;
      } else if (bad == 0) {
        CHECK(0, "%s: wrong", what);
      }
      bad++;
    }
  }
}

typedef struct {
  int r;
  unsigned k;
  size_t first;
} src_ctx;

static uint32_t want_src(size_t i, const void* c) {
  const src_ctx* s = (const src_ctx*)c;
  return val(s->r, s->first + i, s->k);
}

typedef struct {
  int nranks;
  unsigned k;
  size_t first;
} sum_ctx;

static uint32_t want_sum(size_t i, const void* c) {
  const sum_ctx* s = (const sum_ctx*)c;
  uint32_t acc = 0;
  int r;
  for (r = 0; r < s->nranks; r++) acc += val(r, s->first + i, s->k);
  return acc;
}

static void fill(uint32_t* p, size_t n, int r, size_t first, unsigned k) {
  size_t i;
  for (i = 0; i < n; i++) p[i] = val(r, first + i, k);
}

/* Two buffers of `bytes` each, `off` bytes into allocations from fcclMemAllocHost
 * (or malloc when `host` is 0). */
typedef struct {
  void* alloc[2];
  uint32_t* buf[2];
  int host[2];
} bufs;

static int bufs_get(bufs* b, size_t bytes, size_t off, int host_send, int host_recv) {
  int j;
  for (j = 0; j < 2; j++) {
    b->host[j] = j == 0 ? host_send : host_recv;
    b->alloc[j] = NULL;
    if (b->host[j]) {
      if (!CHECK_OK(fcclMemAllocHost(&b->alloc[j], bytes + off))) return 0;
    } else {
      b->alloc[j] = fccl_xmalloc(bytes + off);
    }
    b->buf[j] = (uint32_t*)((unsigned char*)b->alloc[j] + off);
  }
  return 1;
}

static void bufs_put(bufs* b) {
  int j;
  for (j = 0; j < 2; j++) {
    if (b->host[j])
      CHECK_OK(fcclMemFree(b->alloc[j]));
    else
      free(b->alloc[j]);
  }
}

/* Every collective once on count elements per rank (per block where a call has
 * one block per rank), inputs of call number k. */
static void round_of_calls(fcclComm_t comm, int rank, int nranks, size_t count, size_t off,
                           int host_send, int host_recv, unsigned k, const char* label) {
  size_t n = (size_t)nranks, big = count * n;
  bufs b;
  char what[256];
  int root = (int)(k % n), r, inplace;
  unsigned kk = k * 32; /* each call its own inputs: a peer must see the new data */
  src_ctx sc;
  sum_ctx uc;
  if (!bufs_get(&b, big * 4, off, host_send, host_recv)) return;
  uint32_t *s = b.buf[0], *d = b.buf[1];

  for (inplace = 0; inplace < 2; inplace++) {
    uint32_t* out = inplace ? s : d;
    snprintf(what, sizeof what, "%s: broadcast count=%zu root=%d %s", label, count, root,
             inplace ? "in place" : "out of place");
    fccl_phase("%s", what);
    kk++;
    if (rank == root) fill(s, count, rank, 0, kk);
    if (CHECK_OK(fcclBroadcast(s, out, count, fcclUint32, root, comm, NULL))) {
      sc.r = root, sc.k = kk, sc.first = 0;
      expect(out, count, want_src, &sc, what);
    }

    snprintf(what, sizeof what, "%s: all_reduce count=%zu %s", label, count,
             inplace ? "in place" : "out of place");
    fccl_phase("%s", what);
    kk++;
    fill(s, count, rank, 0, kk);
    if (CHECK_OK(fcclAllReduce(s, out, count, fcclUint32, fcclSum, comm, NULL))) {
      uc.nranks = nranks, uc.k = kk, uc.first = 0;
      expect(out, count, want_sum, &uc, what);
    }

    snprintf(what, sizeof what, "%s: all_gather count=%zu %s", label, count,
             inplace ? "in place" : "out of place");
    fccl_phase("%s", what);
    kk++;
    fill(out + (size_t)rank * count, count, rank, 0, kk);
    if (CHECK_OK(fcclAllGather(out + (size_t)rank * count, out, count, fcclUint32, comm, NULL))) {
      for (r = 0; r < nranks; r++) {
        sc.r = r, sc.k = kk, sc.first = 0;
        expect(out + (size_t)r * count, count, want_src, &sc, what);
      }
    }

    snprintf(what, sizeof what, "%s: reduce_scatter count=%zu %s", label, count,
             inplace ? "in place" : "out of place");
    fccl_phase("%s", what);
    kk++;
    fill(s, big, rank, 0, kk);
    if (CHECK_OK(fcclReduceScatter(s, inplace ? s + (size_t)rank * count : d, count, fcclUint32,
                                   fcclSum, comm, NULL))) {
      uc.nranks = nranks, uc.k = kk, uc.first = (size_t)rank * count;
      expect(inplace ? s + (size_t)rank * count : d, count, want_sum, &uc, what);
    }

    snprintf(what, sizeof what, "%s: reduce count=%zu root=%d %s", label, count, root,
             inplace ? "in place" : "out of place");
    fccl_phase("%s", what);
    kk++;
    fill(s, count, rank, 0, kk);
    if (CHECK_OK(fcclReduce(s, out, count, fcclUint32, fcclSum, root, comm, NULL)) && rank == root) {
      uc.nranks = nranks, uc.k = kk, uc.first = 0;
      expect(out, count, want_sum, &uc, what);
    }
  }

  snprintf(what, sizeof what, "%s: all_to_all count=%zu", label, count);
  fccl_phase("%s", what);
    kk++;
  fill(s, big, rank, 0, kk);
  if (CHECK_OK(fcclAlltoAll(s, d, count, fcclUint32, comm, NULL))) {
    for (r = 0; r < nranks; r++) {
      sc.r = r, sc.k = kk, sc.first = (size_t)rank * count;
      expect(d + (size_t)r * count, count, want_src, &sc, what);
    }
  }

  snprintf(what, sizeof what, "%s: gather count=%zu root=%d", label, count, root);
  fccl_phase("%s", what);
    kk++;
  fill(s, count, rank, 0, kk);
  if (CHECK_OK(fcclGather(s, d, count, fcclUint32, root, comm, NULL)) && rank == root) {
    for (r = 0; r < nranks; r++) {
      sc.r = r, sc.k = kk, sc.first = 0;
      expect(d + (size_t)r * count, count, want_src, &sc, what);
    }
  }

  snprintf(what, sizeof what, "%s: scatter count=%zu root=%d", label, count, root);
  fccl_phase("%s", what);
    kk++;
  if (rank == root) fill(s, big, rank, 0, kk);
  if (CHECK_OK(fcclScatter(s, d, count, fcclUint32, root, comm, NULL))) {
    sc.r = root, sc.k = kk, sc.first = (size_t)rank * count;
    expect(d, count, want_src, &sc, what);
  }

  if (nranks > 1) {
    int to = (rank + 1) % nranks, from = (rank + nranks - 1) % nranks;
    snprintf(what, sizeof what, "%s: send/recv ring count=%zu", label, count);
    fccl_phase("%s", what);
    kk++;
    fill(s, count, rank, 0, kk);
    CHECK_OK(fcclGroupStart());
    CHECK_OK(fcclSend(s, count, fcclUint32, to, comm, NULL));
    CHECK_OK(fcclRecv(d, count, fcclUint32, from, comm, NULL));
    if (CHECK_OK(fcclGroupEnd())) {
      sc.r = from, sc.k = kk, sc.first = 0;
      expect(d, count, want_src, &sc, what);
      sc.r = rank;
      snprintf(what, sizeof what, "%s: send/recv ring count=%zu: sendbuff was modified", label,
               count);
      expect(s, count, want_src, &sc, what);
    }
  }
  bufs_put(&b);
}

/* A ring step in place in one group: one fcclMemAllocHost buffer of count + |shift|
 * elements (`off` bytes into the allocation, FCCL_SLACK sentinel bytes after it) holding
 * this rank's inputs of call k; `count` elements at send_off go to rank+1 and `count`
 * from rank-1 arrive at recv_off = send_off + shift (the lower offset is 0).  The
 * message is the predecessor's inputs from send_off as they were when the group ended;
 * the rest of the buffer keeps this rank's own. */
static void inplace_ring(fcclComm_t comm, int rank, int nranks, size_t count, long shift,
                         size_t off, unsigned k) {
  int to = (rank + 1) % nranks, from = (rank + nranks - 1) % nranks;
  size_t ashift = shift < 0 ? (size_t)(-shift) : (size_t)shift;
  size_t send_off = shift < 0 ? ashift : 0, recv_off = shift > 0 ? ashift : 0;
  size_t span = count + ashift, end = recv_off + count;
  void* alloc = NULL;
  uint32_t* buf;
  char what[192], w2[320];
  src_ctx sc;
  unsigned kk = k * 32;
  snprintf(what, sizeof what, "in-place send/recv ring count=%zu shift=%+ld +%zu", count, shift,
           off);
  fccl_phase("%s", what);
  if (!CHECK_OK(fcclMemAllocHost(&alloc, off + span * 4 + FCCL_SLACK))) return;
  buf = (uint32_t*)((unsigned char*)alloc + off);
  fill(buf, span, rank, 0, kk);
  memset(buf + span, FCCL_SENT_RECV, FCCL_SLACK);
  CHECK_OK(fcclGroupStart());
  CHECK_OK(fcclSend(buf + send_off, count, fcclUint32, to, comm, NULL));
  CHECK_OK(fcclRecv(buf + recv_off, count, fcclUint32, from, comm, NULL));
  if (CHECK_OK(fcclGroupEnd())) {
    sc.r = from, sc.k = kk, sc.first = send_off;
    snprintf(w2, sizeof w2, "%s: message from rank %d", what, from);
    expect(buf + recv_off, count, want_src, &sc, w2);
  }
  sc.r = rank, sc.k = kk, sc.first = 0;
  snprintf(w2, sizeof w2, "%s: elements before the received range were modified", what);
  expect(buf, recv_off, want_src, &sc, w2);
  sc.first = end;
  snprintf(w2, sizeof w2, "%s: elements after the received range were modified", what);
  expect(buf + end, span - end, want_src, &sc, w2);
  snprintf(w2, sizeof w2, "%s: bytes after the buffer", what);
  BYTES_CHECK(buf + span, FCCL_SLACK, FCCL_SENT_RECV, w2);
  CHECK_OK(fcclMemFree(alloc));
}

static int body(fcclComm_t comm, int rank, int nranks) {
  /* Bytes per rank: just below, at and above the single-copy thresholds, odd ones,
   * and several pieces of 256 KiB. */
  static const size_t sizes[] = {32764, 32768, 40004, 65532, 65536, 65540, 1048588, 3u << 20};
  static const size_t offs[] = {0, 4096 + 64};
  unsigned k = 0;
  size_t i, j;
  char label[96];
  for (i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
    for (j = 0; j < sizeof offs / sizeof offs[0]; j++) {
      snprintf(label, sizeof label, "fcclMemAllocHost buffers +%zu", offs[j]);
      round_of_calls(comm, rank, nranks, sizes[i] / 4, offs[j], 1, 1, ++k, label);
    }
  }
  /* The same calls again: buffers freed above and allocated anew (peers' cached
   * mappings of the old ones must not be used), twice in a row with new data. */
  round_of_calls(comm, rank, nranks, (2u << 20) / 4, 0, 1, 1, ++k, "after free and allocate");
  round_of_calls(comm, rank, nranks, (2u << 20) / 4, 0, 1, 1, ++k, "again");
  /* One side shared, the other malloc'd. */
  round_of_calls(comm, rank, nranks, (1u << 20) / 4, 8, 1, 0, ++k, "shared send, malloc recv");
  round_of_calls(comm, rank, nranks, (1u << 20) / 4, 8, 0, 1, ++k, "malloc send, shared recv");
  round_of_calls(comm, rank, nranks, 40004 / 4, 8, 1, 0, ++k, "40004 B: shared send, malloc recv");
  round_of_calls(comm, rank, nranks, 40004 / 4, 8, 0, 1, ++k, "40004 B: malloc send, shared recv");
  /* Send/recv in place: the receive overlaps the send of the same group. */
  if (nranks > 1) {
    inplace_ring(comm, rank, nranks, 100000 / 4, 0, 0, ++k);
    inplace_ring(comm, rank, nranks, 1000000 / 4, 0, 4096 + 64, ++k);
    inplace_ring(comm, rank, nranks, (16u << 20) / 4, 0, 0, ++k);
    if (nranks == 2) inplace_ring(comm, rank, nranks, 1000000 / 4, -4096, 0, ++k);
  }
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
