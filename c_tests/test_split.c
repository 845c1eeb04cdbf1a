/* fcclCommSplit: color = rank % 2 with key = -rank (new ranks in reverse order), the same
 * with FCCL_SPLIT_NOCOLOR for the last rank (which gets newcomm == NULL), equal keys (old
 * order kept) with a config, and a split of a split.  Sizes and ranks are checked against
 * "ordered by key, then by old rank", and each new comm runs checked all_reduces (small,
 * and 1000003 float32).  In threads mode every rank's thread splits concurrently. */
#include "cuda_probe.h"
#include "harness.h"

static char g_dummy_comm_object; /* its address stands for "not written" */

typedef struct {
  int size;    /* expected size of my new comm (0: I get none) */
  int newrank; /* expected rank in it */
  int members[256];
} expect_t;

/* color_of / key_of over the old ranks; members sorted by (key, old rank) */
static void expected(int rank, int nranks, const int* colors, const int* keys, expect_t* e) {
  int r, i, j;
  e->size = 0;
  e->newrank = -1;
  if (colors[rank] == FCCL_SPLIT_NOCOLOR) return;
  for (r = 0; r < nranks; r++)
    if (colors[r] == colors[rank]) e->members[e->size++] = r;
  for (i = 1; i < e->size; i++) { /* insertion sort by (key, old rank) */
    int m = e->members[i];
    for (j = i - 1; j >= 0; j--) {
      int o = e->members[j];
      if (keys[o] < keys[m] || (keys[o] == keys[m] && o < m)) break;
      e->members[j + 1] = o;
    }
    e->members[j + 1] = m;
  }
  for (i = 0; i < e->size; i++)
    if (e->members[i] == rank) e->newrank = i;
}

/* all_reduce of (old rank + 1) * 1000 + i: the sum over the members */
static void member_sum_check(fcclComm_t nc, int rank, const expect_t* e, const char* what) {
  enum { N = 37 };
  int64_t send[N], recv[N];
  int64_t msum = 0;
  int i;
  for (i = 0; i < e->size; i++) msum += (int64_t)(e->members[i] + 1) * 1000;
  for (i = 0; i < N; i++) send[i] = (int64_t)(rank + 1) * 1000 + i;
  memset(recv, 0, sizeof recv);
  if (CHECK_OK(fcclAllReduce(send, recv, N, fcclInt64, fcclSum, nc, NULL)))
    for (i = 0; i < N; i++)
      CHECK(recv[i] == msum + (int64_t)e->size * i, "%s: allreduce element %d = %lld, expected %lld",
            what, i, (long long)recv[i], (long long)(msum + (int64_t)e->size * i));
}

/* rank 0 of the new comm broadcasts its old rank; everyone checks the member order */
static void order_check(fcclComm_t nc, int rank, const expect_t* e, const char* what) {
  int32_t* all = (int32_t*)fccl_xmalloc((size_t)e->size * sizeof(int32_t));
  int i;
  for (i = 0; i < e->size; i++) all[i] = (e->members[i] == rank) ? rank : 0;
  /* sum of one-hot vectors = the old rank at every new position */
  if (CHECK_OK(fcclAllReduce(all, all, (size_t)e->size, fcclInt32, fcclSum, nc, NULL)))
    for (i = 0; i < e->size; i++)
      CHECK(all[i] == e->members[i], "%s: new rank %d is old rank %d, expected old rank %d",
            what, i, (int)all[i], e->members[i]);
  free(all);
}

static void big_check(fcclComm_t nc, const expect_t* e, const char* what) {
  fccl_pattern pat;
  fccl_ref ref;
  float* buf = (float*)fccl_xmalloc(FCCL_BIG_COUNT * sizeof(float));
  char w[192];
  fccl_pattern_init(&pat, fcclFloat32, FCCL_SCHEME_SUM);
  fccl_ref_init(&ref, &pat, fcclSum, e->size);
  fccl_pattern_fill(&pat, buf, FCCL_BIG_COUNT, fccl_rank_off(12345, e->newrank));
  snprintf(w, sizeof w, "%s: allreduce float32 count=%zu in-place", what, FCCL_BIG_COUNT);
  if (CHECK_OK(fcclAllReduce(buf, buf, FCCL_BIG_COUNT, fcclFloat32, fcclSum, nc, NULL)))
    REF_CHECK(&ref, buf, FCCL_BIG_COUNT, 12345, w);
  fccl_ref_free(&ref);
  fccl_pattern_free(&pat);
  free(buf);
}

/* Splits comm with colors[rank], keys[rank]; checks the new comm; returns it (or NULL). */
static fcclComm_t split_and_check(fcclComm_t comm, int rank, int nranks, const int* colors,
                                  const int* keys, fcclConfig_t* cfg, const char* what, int big,
                                  expect_t* e_out) {
  fcclComm_t nc = (fcclComm_t)(void*)&g_dummy_comm_object;
  int v;
  fccl_phase("%s", what);
  expected(rank, nranks, colors, keys, e_out);
  if (!CHECK_OK(fcclCommSplit(comm, colors[rank], keys[rank], &nc, cfg))) return NULL;
  if (e_out->size == 0) {
    CHECK(nc == NULL, "%s: FCCL_SPLIT_NOCOLOR must give newcomm == NULL", what);
    return NULL;
  }
  CHECK(nc != NULL && nc != (fcclComm_t)(void*)&g_dummy_comm_object,
        "%s: fcclCommSplit returned success without a communicator", what);
  if (nc == NULL || nc == (fcclComm_t)(void*)&g_dummy_comm_object) return NULL;
  v = -5;
  if (CHECK_OK(fcclCommCount(nc, &v)))
    CHECK(v == e_out->size, "%s: new size %d, expected %d", what, v, e_out->size);
  v = -5;
  if (CHECK_OK(fcclCommUserRank(nc, &v)))
    CHECK(v == e_out->newrank, "%s: old rank %d has new rank %d, expected %d", what, rank, v,
          e_out->newrank);
  v = -5;
  if (CHECK_OK(fcclCommCuDevice(nc, &v))) {
    int want = fccl_threads_mode() ? -1 : fccl_current_cuda_device(); /* the parent's device */
    CHECK(v == want, "%s: fcclCommCuDevice = %d, expected %d", what, v, want);
  }
  order_check(nc, rank, e_out, what);
  member_sum_check(nc, rank, e_out, what);
  if (big) big_check(nc, e_out, what);
  return nc;
}

static int body(fcclComm_t comm, int rank, int nranks) {
  int* colors = (int*)fccl_xmalloc((size_t)nranks * sizeof(int));
  int* keys = (int*)fccl_xmalloc((size_t)nranks * sizeof(int));
  fcclComm_t a, b, c, d;
  expect_t ea, eb, ec;
  int r;
  if (nranks > 256) return FCCL_SKIP;

  /* A: color = rank % 2, key = -rank */
  for (r = 0; r < nranks; r++) {
    colors[r] = r % 2;
    keys[r] = -r;
  }
  a = split_and_check(comm, rank, nranks, colors, keys, NULL, "split A (rank%2, key -rank)", 1,
                      &ea);

  /* B: as A, but the last rank opts out */
  colors[nranks - 1] = FCCL_SPLIT_NOCOLOR;
  b = split_and_check(comm, rank, nranks, colors, keys, NULL,
                      "split B (rank%2, key -rank, last rank NOCOLOR)", 0, &eb);

  /* C: one color, equal keys (old order kept), with a config */
  {
    fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
    cfg.commName = "ferroccl-test-split";
    for (r = 0; r < nranks; r++) {
      colors[r] = 7;
      keys[r] = 0;
    }
    c = split_and_check(comm, rank, nranks, colors, keys, &cfg, "split C (one color, equal keys)",
                        0, &ec);
  }

  /* D: a split of A, by new rank parity, keys equal */
  if (a) {
    int* dcol = (int*)fccl_xmalloc((size_t)ea.size * sizeof(int));
    int* dkey = (int*)fccl_xmalloc((size_t)ea.size * sizeof(int));
    expect_t tmp;
    for (r = 0; r < ea.size; r++) {
      dcol[r] = r / 2;
      dkey[r] = 1;
    }
    /* in D's checks "rank" is the rank in A */
    d = split_and_check(a, ea.newrank, ea.size, dcol, dkey, NULL, "split D (split of A)", 0, &tmp);
    free(dcol);
    free(dkey);
  } else {
    d = NULL;
  }

  /* the parent still works, and the children work after each other's destruction */
  member_sum_check(comm, rank, &ec, "parent after the splits");
  if (d) CHECK_OK(fcclCommDestroy(d));
  if (b) CHECK_OK(fcclCommDestroy(b));
  if (a) {
    member_sum_check(a, rank, &ea, "split A after destroying B, D");
    CHECK_OK(fcclCommFinalize(a));
    CHECK_OK(fcclCommDestroy(a));
  }
  if (c) {
    member_sum_check(c, rank, &ec, "split C at the end");
    CHECK_OK(fcclCommDestroy(c));
  }
  member_sum_check(comm, rank, &ec, "parent at the end");
  free(colors);
  free(keys);
  return fccl_failures();
}

int main(int argc, char** argv) { return fccl_main(argc, argv, body); }
