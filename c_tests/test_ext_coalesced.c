/* Coalesced collectives (docs/abi.md "Extensions beyond NCCL"): many buffers packed into buckets
 * of at most bucketBytes (0 = default), one collective per bucket.
 *
 * fcclAllReduceCoalesced: 1000 buffers of 0..3000 elements (zeros, NULL pointers for some
 * empty ones), laid out with one-element gaps in one arena; bucketBytes 0, 4096 and 1000
 * (less than many buffers: those travel alone); 200-buffer parts with 0, 4096 and 2 (less
 * than one element: every buffer alone).  Results must be
 * bitwise identical to fcclAllReduce called per buffer: float32 sum on wide-range data
 * (inexact sums, so the order of reduction shows), int32 sum (wrapping), bfloat16 sum
 * (float32 accumulation, one rounding; also checked against the reference).  Out-of-place
 * and in-place (recvbuffs[i] == sendbuffs[i]); gaps and sendbuffs untouched.
 * fcclBroadcastCoalesced: the same buffers, every root, every bucket size, against
 * fcclBroadcast called per buffer (and the root's data).
 * Errors: nbuffers < 0, NULL counts, a NULL buffer with a count > 0, root out of range ->
 * fcclInvalidArgument; nbuffers 0 -> fcclSuccess. */
#include "harness.h"

#define NBUF 1000
#define NBUCKETS 4
static const size_t bucket_sizes[NBUCKETS] = {0, 4096, 1000, 2};
/* bucket sizes of the all-reduce parts (indices into bucket_sizes): the 1000-buffer part
 * runs 0, 4096 and 1000; the smaller parts 0, 4096 and 2 (every buffer alone) */
static const int big_part_buckets[3] = {0, 1, 2}, small_part_buckets[3] = {0, 1, 3};

typedef struct {
  int n;
  size_t counts[NBUF];
  size_t offs[NBUF]; /* element offset in the arena; a one-element gap before each buffer */
  size_t total;      /* arena length in elements (trailing gap included) */
} layout_t;

static uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/* mostly small buffers (0..300 elements), one in ten up to 3000, exact 0 and 3000 included */
static void layout_init(layout_t* L, int n, uint64_t salt) {
  size_t pos = 0;
  int i;
  L->n = n;
  for (i = 0; i < n; i++) {
    uint64_t h = mix(salt * 1000003u + (uint64_t)i);
    size_t c;
    if (i == 1) c = 3000;
    else if (i % 97 == 0 || i % 211 == 5) c = 0;
    else if (h % 10u == 3u) c = (size_t)((h >> 8) % 3001u);
    else c = (size_t)((h >> 8) % 301u);
    pos += 1; /* gap */
    L->counts[i] = c;
    L->offs[i] = pos;
    pos += c;
  }
  L->total = pos + 1;
}

/* Pointers into an arena; empty buffers with odd index get NULL. */
static void make_ptrs(const layout_t* L, unsigned char* arena, size_t esz, void** ptrs) {
  int i;
  for (i = 0; i < L->n; i++)
    ptrs[i] = (L->counts[i] == 0 && i % 2 == 1) ? NULL : (void*)(arena + L->offs[i] * esz);
}

static void fill_arena(const layout_t* L, const fccl_pattern* pat, unsigned char* arena,
                       size_t base, int rank) {
  int i;
  memset(arena, FCCL_SENT_GAP, L->total * pat->esz);
  for (i = 0; i < L->n; i++)
    fccl_pattern_fill(pat, arena + L->offs[i] * pat->esz, L->counts[i],
                      fccl_rank_off(base + L->offs[i], rank));
}

/* Compares the buffers of got with those of want (bitwise); the gaps of got must hold
 * gapbyte.  Reports the first differing buffers. */
static void compare_arenas(const char* what, const layout_t* L, fcclDataType_t dt,
                           const unsigned char* got, const unsigned char* want,
                           unsigned char gapbyte) {
  size_t esz = fccl_dt_size(dt), pos = 0, j;
  int i, bad = 0, badgap = 0;
  char g[96], e[96];
  for (i = 0; i < L->n; i++) {
    const unsigned char* pg = got + L->offs[i] * esz;
    const unsigned char* pw = want + L->offs[i] * esz;
    /* the gap before buffer i */
    for (j = pos * esz; j < L->offs[i] * esz; j++)
      if (got[j] != gapbyte) badgap++;
    pos = L->offs[i] + L->counts[i];
    if (memcmp(pg, pw, L->counts[i] * esz) == 0) continue;
    if (bad < 3) {
      for (j = 0; j < L->counts[i]; j++)
        if (memcmp(pg + j * esz, pw + j * esz, esz) != 0) break;
      fccl_format_elem(dt, pg, j, g, sizeof g);
      fccl_format_elem(dt, pw, j, e, sizeof e);
      CHECK(0, "%s: buffer %d (count %zu): element %zu: expected %s (per-buffer call), got %s",
            what, i, L->counts[i], j, e, g);
    }
    bad++;
  }
  for (j = pos * esz; j < L->total * esz; j++)
    if (got[j] != gapbyte) badgap++;
  CHECK(bad <= 3, "%s: %d of %d buffers differ in all", what, bad, L->n);
  CHECK(badgap == 0, "%s: %d bytes between / after the buffers were written", what, badgap);
}

/* ================================================================== AllReduce */

static void allreduce_part(fcclComm_t comm, int rank, int nranks, fcclDataType_t dt,
                           int scheme, int nbuf, size_t base, int ref_too, const int* bks) {
  layout_t* Lp = (layout_t*)fccl_xmalloc(sizeof(layout_t)); /* per rank thread */
  fccl_pattern pat;
  fccl_ref ref;
  size_t esz = fccl_dt_size(dt), bytes;
  unsigned char *send, *send_copy, *want, *recv;
  void **sp, **rp, **wp;
  char what[256];
  int i, bi, b, ip, ok = 1;
  layout_init(Lp, nbuf, (uint64_t)dt * 31u + (uint64_t)scheme);
  bytes = Lp->total * esz;
  fccl_pattern_init(&pat, dt, scheme);
  fccl_ref_init(&ref, &pat, fcclSum, nranks);
  send = (unsigned char*)fccl_xmalloc(bytes);
  send_copy = (unsigned char*)fccl_xmalloc(bytes);
  want = (unsigned char*)fccl_xmalloc(bytes);
  recv = (unsigned char*)fccl_xmalloc(bytes);
  sp = (void**)fccl_xmalloc((size_t)nbuf * sizeof(void*));
  rp = (void**)fccl_xmalloc((size_t)nbuf * sizeof(void*));
  wp = (void**)fccl_xmalloc((size_t)nbuf * sizeof(void*));
  fill_arena(Lp, &pat, send, base, rank);
  memcpy(send_copy, send, bytes);

  /* the reference: fcclAllReduce per buffer */
  fccl_phase("allreduce-coalesced %s: %d per-buffer fcclAllReduce calls", fccl_dt_name(dt), nbuf);
  memset(want, FCCL_SENT_RECV, bytes);
  make_ptrs(Lp, send, esz, sp);
  make_ptrs(Lp, want, esz, wp);
  for (i = 0; i < nbuf; i++) {
    fcclResult_t res = fcclAllReduce(sp[i], wp[i], Lp->counts[i], dt, fcclSum, comm, NULL);
    if (res != fcclSuccess && ok) {
      CHECK_OK(res);
      CHECK(0, "per-buffer fcclAllReduce of buffer %d (count %zu) failed", i, Lp->counts[i]);
      ok = 0;
    }
  }
  if (ref_too) {
    for (i = 0; i < nbuf; i++) {
      snprintf(what, sizeof what, "per-buffer fcclAllReduce %s sum buffer %d", fccl_dt_name(dt), i);
      if (REF_CHECK(&ref, want + Lp->offs[i] * esz, Lp->counts[i], base + Lp->offs[i], what)) break;
    }
  }

  for (bi = 0; bi < 3; bi++) {
    b = bks[bi];
    for (ip = 0; ip < 2; ip++) {
      snprintf(what, sizeof what,
               "fcclAllReduceCoalesced(%d buffers, %s, sum, bucketBytes=%zu) %s", nbuf,
               fccl_dt_name(dt), bucket_sizes[b], ip ? "in-place" : "out-of-place");
      fccl_phase("%s", what);
      if (ip) {
        memcpy(recv, send, bytes);
        make_ptrs(Lp, recv, esz, rp);
        if (CHECK_OK(fcclAllReduceCoalesced((const void* const*)rp, rp, Lp->counts, nbuf, dt,
                                            fcclSum, bucket_sizes[b], comm, NULL)))
          compare_arenas(what, Lp, dt, recv, want, FCCL_SENT_GAP);
      } else {
        memset(recv, FCCL_SENT_RECV, bytes);
        make_ptrs(Lp, recv, esz, rp);
        if (CHECK_OK(fcclAllReduceCoalesced((const void* const*)sp, rp, Lp->counts, nbuf, dt,
                                            fcclSum, bucket_sizes[b], comm, NULL)))
          compare_arenas(what, Lp, dt, recv, want, FCCL_SENT_RECV);
        CHECK(memcmp(send, send_copy, bytes) == 0, "%s: sendbuffs were modified", what);
      }
    }
  }
  free(send);
  free(send_copy);
  free(want);
  free(recv);
  free(sp);
  free(rp);
  free(wp);
  fccl_ref_free(&ref);
  fccl_pattern_free(&pat);
  free(Lp);
}

/* ================================================================== Broadcast */

static void broadcast_part(fcclComm_t comm, int rank, int nranks, fcclDataType_t dt, size_t base) {
  layout_t* Lp = (layout_t*)fccl_xmalloc(sizeof(layout_t)); /* per rank thread */
  fccl_pattern pat, junk;
  size_t esz = fccl_dt_size(dt), bytes;
  unsigned char *buf, *want;
  void** bp;
  char what[256];
  int i, b, root, anchor = nranks - 1, ok = 1;
  layout_init(Lp, NBUF, 7u + (uint64_t)dt);
  bytes = Lp->total * esz;
  fccl_pattern_init(&pat, dt, FCCL_SCHEME_FULL);
  fccl_pattern_init(&junk, dt, FCCL_SCHEME_SUM);
  buf = (unsigned char*)fccl_xmalloc(bytes);
  want = (unsigned char*)fccl_xmalloc(bytes);
  bp = (void**)fccl_xmalloc(NBUF * sizeof(void*));

  /* per-buffer fcclBroadcast from the last rank: the result is the root's data */
  fccl_phase("broadcast-coalesced: %d per-buffer fcclBroadcast calls, root %d", NBUF, anchor);
  if (rank == anchor)
    fill_arena(Lp, &pat, buf, base, anchor);
  else
    fill_arena(Lp, &junk, buf, base + 17, rank);
  make_ptrs(Lp, buf, esz, bp);
  for (i = 0; i < NBUF; i++) {
    fcclResult_t res = fcclBroadcast(bp[i], bp[i], Lp->counts[i], dt, anchor, comm, NULL);
    if (res != fcclSuccess && ok) {
      CHECK_OK(res);
      CHECK(0, "per-buffer fcclBroadcast of buffer %d (count %zu) failed", i, Lp->counts[i]);
      ok = 0;
    }
  }
  fill_arena(Lp, &pat, want, base, anchor);
  compare_arenas("per-buffer fcclBroadcast (anchor for the coalesced form)", Lp, dt, buf, want,
                 FCCL_SENT_GAP);

  for (root = 0; root < nranks; root++) {
    fill_arena(Lp, &pat, want, base + (size_t)root * 3, root);
    for (b = 0; b < NBUCKETS; b++) {
      snprintf(what, sizeof what, "fcclBroadcastCoalesced(%d buffers, %s, root=%d, bucketBytes=%zu)",
               NBUF, fccl_dt_name(dt), root, bucket_sizes[b]);
      fccl_phase("%s", what);
      if (rank == root)
        memcpy(buf, want, bytes);
      else
        fill_arena(Lp, &junk, buf, base + (size_t)b, rank);
      make_ptrs(Lp, buf, esz, bp);
      if (CHECK_OK(fcclBroadcastCoalesced(bp, Lp->counts, NBUF, dt, root, bucket_sizes[b], comm,
                                          NULL)))
        compare_arenas(what, Lp, dt, buf, want, FCCL_SENT_GAP);
    }
  }
  free(buf);
  free(want);
  free(bp);
  fccl_pattern_free(&pat);
  fccl_pattern_free(&junk);
  free(Lp);
}

/* ================================================================== errors */

static void error_cases(fcclComm_t comm, int rank, int nranks) {
  float a[4] = {1, 2, 3, 4}, r[4];
  void* ab[2];
  const void* sb[2];
  void* rb[2];
  size_t counts[2] = {4, 4};
  (void)rank;
  ab[0] = a;
  ab[1] = r;
  sb[0] = a;
  sb[1] = a;
  rb[0] = r;
  rb[1] = r;
  fccl_phase("coalesced: error cases");
  CHECK_ERR(fcclAllReduceCoalesced(sb, rb, counts, -1, fcclFloat32, fcclSum, 0, comm, NULL),
            fcclInvalidArgument, "fcclAllReduceCoalesced");
  CHECK_ERR(fcclAllReduceCoalesced(sb, rb, NULL, 2, fcclFloat32, fcclSum, 0, comm, NULL),
            fcclInvalidArgument, "fcclAllReduceCoalesced");
  CHECK_ERR(fcclAllReduceCoalesced(NULL, rb, counts, 2, fcclFloat32, fcclSum, 0, comm, NULL),
            fcclInvalidArgument, "fcclAllReduceCoalesced");
  rb[1] = NULL; /* count 4 */
  CHECK_ERR(fcclAllReduceCoalesced(sb, rb, counts, 2, fcclFloat32, fcclSum, 0, comm, NULL),
            fcclInvalidArgument, "fcclAllReduceCoalesced");
  rb[1] = r;
  CHECK_ERR(fcclAllReduceCoalesced(sb, rb, counts, 2, 99, fcclSum, 0, comm, NULL),
            fcclInvalidArgument, "fcclAllReduceCoalesced");
  CHECK_RES(fcclAllReduceCoalesced(sb, rb, counts, 0, fcclFloat32, fcclSum, 0, comm, NULL),
            fcclSuccess);
  CHECK_RES(fcclAllReduceCoalesced(NULL, NULL, NULL, 0, fcclFloat32, fcclSum, 0, comm, NULL),
            fcclSuccess);

  CHECK_ERR(fcclBroadcastCoalesced(ab, counts, -1, fcclFloat32, 0, 0, comm, NULL),
            fcclInvalidArgument, "fcclBroadcastCoalesced");
  CHECK_ERR(fcclBroadcastCoalesced(ab, NULL, 2, fcclFloat32, 0, 0, comm, NULL),
            fcclInvalidArgument, "fcclBroadcastCoalesced");
  CHECK_ERR(fcclBroadcastCoalesced(ab, counts, 2, fcclFloat32, nranks, 0, comm, NULL),
            fcclInvalidArgument, "fcclBroadcastCoalesced");
  CHECK_ERR(fcclBroadcastCoalesced(ab, counts, 2, fcclFloat32, -1, 0, comm, NULL),
            fcclInvalidArgument, "fcclBroadcastCoalesced");
  ab[1] = NULL;
  CHECK_ERR(fcclBroadcastCoalesced(ab, counts, 2, fcclFloat32, 0, 0, comm, NULL),
            fcclInvalidArgument, "fcclBroadcastCoalesced");
  CHECK_RES(fcclBroadcastCoalesced(NULL, NULL, 0, fcclFloat32, 0, 0, comm, NULL), fcclSuccess);
  CHECK(a[0] == 1 && a[1] == 2 && a[2] == 3 && a[3] == 4, "buffers written by a failed call");
}

static int body(fcclComm_t comm, int rank, int nranks) {
  allreduce_part(comm, rank, nranks, fcclFloat32, FCCL_SCHEME_FULL, NBUF, 1000, 0,
                 big_part_buckets);
  allreduce_part(comm, rank, nranks, fcclInt32, FCCL_SCHEME_FULL, 200, 2000, 1,
                 small_part_buckets);
  allreduce_part(comm, rank, nranks, fcclBfloat16, FCCL_SCHEME_SUM, 200, 3000, 1,
                 small_part_buckets);
  broadcast_part(comm, rank, nranks, fcclFloat32, 4000);
  error_cases(comm, rank, nranks);
  /* still works */
  allreduce_part(comm, rank, nranks, fcclFloat64, FCCL_SCHEME_SUM, 50, 5000, 1,
                 small_part_buckets);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
