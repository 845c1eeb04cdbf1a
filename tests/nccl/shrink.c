/*
 * ncclCommShrink as PyTorch's shrink_group makes it (tests/nccl/run.sh): the ranks that
 * remain call it with the list of those that leave, the leaving ranks do not call it.
 *
 *   shrink --threads N [--nonblocking]       N ranks as threads of this process
 *   ferroccl-run -n N shrink [--nonblocking] one rank per process
 *
 * Each rank: bad arguments refused without any communication (a rank out of range,
 * a rank twice, the caller itself in the list, unknown flags, NULL newcomm); then the
 * last rank (and rank 1 from 4 ranks) leaves: the others shrink, check the new
 * communicator's size and their ranks in it (in the order of their old ranks), and
 * all_reduce their old ranks on it; then every rank shrinks by nobody. Exit 0 when
 * every check passed.
 */
#define _GNU_SOURCE
#include <nccl.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"


/* A shrink with bad arguments: ncclInvalidArgument naming `want`, *newcomm NULL. */
static void refused(int rank, ncclComm_t comm, int* list, int count, int flags, const char* want) {
  ncclComm_t nc = (ncclComm_t)&lock; /* not NULL: the call must set it */
  ncclResult_t r = ncclCommShrink(comm, list, count, &nc, NULL, flags);
  const char* msg = ncclGetLastError(NULL);
  CHECK(rank, r == ncclInvalidArgument, "shrink excluding %d ranks, flags %d: %s, want ncclInvalidArgument", count,
        flags, ncclGetErrorString(r));
  CHECK(rank, nc == NULL, "a refused shrink must set *newcomm to NULL");
  CHECK(rank, msg && strstr(msg, "ncclCommShrink") && strstr(msg, want), "message '%s' must name ncclCommShrink and '%s'",
        msg ? msg : "(null)", want);
}

/* Ranks `left` (count k) leave; the others shrink and check the new communicator. */
static void shrink_without(int rank, int n, ncclComm_t comm, int* left, int k, ncclConfig_t* cfg) {
  int i, gone = 0, newrank = 0, want_sum = 0;
  for (i = 0; i < k; i++) gone |= left[i] == rank;
  if (gone) return; /* a leaving rank does not call it */
  for (i = 0; i < n; i++) {
    int j, out = 0;
    for (j = 0; j < k; j++) out |= left[j] == i;
    if (out) continue;
    if (i < rank) newrank++;
    want_sum += i;
  }
  ncclComm_t nc = NULL;
  DO(rank, comm, ncclCommShrink(comm, left, k, &nc, cfg, NCCL_SHRINK_DEFAULT));
  if (nc == NULL) return;
  DO(rank, nc, ncclInProgress); /* waits for a non-blocking child's set-up */
  int count = -1, me = -1;
  DO(rank, nc, ncclCommCount(nc, &count));
  DO(rank, nc, ncclCommUserRank(nc, &me));
  CHECK(rank, count == n - k, "the shrunk communicator has %d ranks, want %d", count, n - k);
  CHECK(rank, me == newrank, "rank %d is rank %d of the shrunk communicator, want %d", rank, me, newrank);
  int x = rank, sum = -1;
  DO(rank, nc, ncclAllReduce(&x, &sum, 1, ncclInt32, ncclSum, nc, NULL));
  DO(rank, nc, ncclInProgress);
  CHECK(rank, sum == want_sum, "all_reduce of the old ranks on the shrunk communicator gave %d, want %d", sum, want_sum);
  DO(rank, nc, ncclCommDestroy(nc));
}

static void rank_main(ncclUniqueId id, int rank, int n, int blocking) {
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = blocking;
  ncclComm_t comm = NULL;
  DO(rank, comm, ncclCommInitRankConfig(&comm, n, id, rank, &cfg));
  DO(rank, comm, ncclInProgress);
  if (comm == NULL) return;

  int out_of_range[1] = {n}, twice[2] = {(rank + 1) % n, (rank + 1) % n}, self[1] = {rank}, other[1] = {(rank + 1) % n};
  refused(rank, comm, out_of_range, 1, NCCL_SHRINK_DEFAULT, "ranks are 0..");
  refused(rank, comm, twice, 2, NCCL_SHRINK_DEFAULT, "twice");
  refused(rank, comm, self, 1, NCCL_SHRINK_DEFAULT, "excludeRanksList");
  refused(rank, comm, other, 1, 7, "shrinkFlags");
  CHECK(rank, ncclCommShrink(comm, other, 1, NULL, NULL, NCCL_SHRINK_DEFAULT) == ncclInvalidArgument,
        "a NULL newcomm must be ncclInvalidArgument");

  int left[2] = {n - 1, 1};
  shrink_without(rank, n, comm, left, n >= 4 ? 2 : 1, &cfg);
  shrink_without(rank, n, comm, left, 0, &cfg);
  /* The parent still works for every rank, the leaving ones included. */
  int one = 1, total = 0;
  DO(rank, comm, ncclAllReduce(&one, &total, 1, ncclInt32, ncclSum, comm, NULL));
  DO(rank, comm, ncclInProgress);
  CHECK(rank, total == n, "all_reduce on the parent after the shrinks gave %d, want %d", total, n);
  DO(rank, comm, ncclCommDestroy(comm));
}

struct targ {
  ncclUniqueId id;
  int rank, n, blocking;
};

static void* thread_main(void* p) {
  struct targ* a = p;
  rank_main(a->id, a->rank, a->n, a->blocking);
  return NULL;
}

int main(int argc, char** argv) {
  int blocking = 1, n = 0, i;
  const char* hex = getenv("FERROCCL_UNIQUE_ID");
  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--nonblocking") == 0) blocking = 0;
    else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) n = atoi(argv[++i]);
  }
  if (n > 0) {
    struct targ* a = calloc((size_t)n, sizeof *a);
    pthread_t* t = calloc((size_t)n, sizeof *t);
    ncclUniqueId id;
    CHECK(-1, ncclGetUniqueId(&id) == ncclSuccess, "ncclGetUniqueId");
    for (i = 0; i < n; i++) {
      a[i].id = id;
      a[i].rank = i;
      a[i].n = n;
      a[i].blocking = blocking;
      pthread_create(&t[i], NULL, thread_main, &a[i]);
    }
    for (i = 0; i < n; i++) pthread_join(t[i], NULL);
    free(a);
    free(t);
  } else if (hex != NULL && strlen(hex) == 2 * NCCL_UNIQUE_ID_BYTES && getenv("FERROCCL_RANK") &&
             getenv("FERROCCL_WORLD_SIZE")) {
    ncclUniqueId id;
    for (i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
      unsigned v = 0;
      if (sscanf(hex + 2 * i, "%2x", &v) != 1) return 2;
      id.internal[i] = (char)v;
    }
    n = atoi(getenv("FERROCCL_WORLD_SIZE"));
    rank_main(id, atoi(getenv("FERROCCL_RANK")), n, blocking);
  } else {
    fprintf(stderr, "usage: shrink --threads N [--nonblocking], or under ferroccl-run -n N\n");
    return 2;
  }
  printf("shrink %d ranks, %s: %d checks, %d failed\n", n, blocking ? "blocking" : "non-blocking", checks, failures);
  return failures == 0 ? 0 : 1;
}
