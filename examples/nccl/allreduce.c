/* An NCCL program, unchanged, on ferroccl's NCCL library (libferroccl_nccl.so, which
 * is libnccl.so.2): one process per rank, the unique id handed out by the launcher,
 * collectives on host memory.
 *
 *   cc allreduce.c -I<prefix>/include/ferroccl -L<prefix>/lib/ferroccl -lnccl \
 *      -Wl,-rpath,<prefix>/lib/ferroccl -o allreduce_nccl
 *   ferroccl-run -n 4 ./allreduce_nccl
 *
 * NCCL programs usually get the id by MPI_Bcast; ferroccl-run puts it in the
 * environment as 256 hex digits (FERROCCL_UNIQUE_ID) with FERROCCL_RANK and
 * FERROCCL_WORLD_SIZE. The buffers are host memory: ferroccl takes any buffer, host or
 * CUDA, where NVIDIA's library takes device memory only. */
#include <nccl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* On failure, ncclGetLastError() says which call failed and why. */
#define NCCLCHECK(call)                                                                        \
  do {                                                                                         \
    ncclResult_t res_ = (call);                                                                \
    if (res_ != ncclSuccess) {                                                                 \
      fprintf(stderr, "%s:%d: %s\n  %s\n", __FILE__, __LINE__, ncclGetErrorString(res_),       \
              ncclGetLastError(NULL));                                                         \
      exit(1);                                                                                 \
    }                                                                                          \
  } while (0)

/* The id, rank and size that ferroccl-run put in the environment. */
static int id_from_env(ncclUniqueId* id, int* rank, int* nranks) {
  const char* hex = getenv("FERROCCL_UNIQUE_ID");
  const char* r = getenv("FERROCCL_RANK");
  const char* n = getenv("FERROCCL_WORLD_SIZE");
  int i;
  if (hex == NULL || r == NULL || n == NULL || strlen(hex) != 2 * NCCL_UNIQUE_ID_BYTES) return -1;
  for (i = 0; i < NCCL_UNIQUE_ID_BYTES; i++) {
    unsigned v;
    if (sscanf(hex + 2 * i, "%2x", &v) != 1) return -1;
    id->internal[i] = (char)v;
  }
  *rank = atoi(r);
  *nranks = atoi(n);
  return 0;
}

enum { N = 4096 };

int main(void) {
  ncclUniqueId id;
  ncclComm_t comm;
  int rank, nranks, i, wrong = 0;
  static float x[N];
  if (id_from_env(&id, &rank, &nranks) != 0) {
    fprintf(stderr, "start me with ferroccl-run -n N (FERROCCL_UNIQUE_ID, _RANK, _WORLD_SIZE)\n");
    return 2;
  }
  NCCLCHECK(ncclCommInitRank(&comm, nranks, id, rank));

  /* The largest value of every element over all ranks, in place; stream 0 serves host memory. */
  for (i = 0; i < N; i++) x[i] = (float)((rank * 7 + i) % nranks);
  NCCLCHECK(ncclAllReduce(x, x, N, ncclFloat, ncclMax, comm, 0));
  for (i = 0; i < N; i++) {
    if (x[i] != (float)(nranks - 1)) wrong++;
  }

  /* Rank r's two ints land at offset 2r, inside a group as NCCL programs often do. */
  int mine[2] = {rank, -rank};
  int* all = malloc(2 * (size_t)nranks * sizeof *all);
  if (all == NULL) return 1;
  NCCLCHECK(ncclGroupStart());
  NCCLCHECK(ncclAllGather(mine, all, 2, ncclInt32, comm, 0));
  NCCLCHECK(ncclGroupEnd());
  for (i = 0; i < nranks; i++) {
    if (all[2 * i] != i || all[2 * i + 1] != -i) wrong++;
  }

  NCCLCHECK(ncclCommDestroy(comm));
  free(all);
  if (wrong) {
    fprintf(stderr, "rank %d: %d wrong results\n", rank, wrong);
    return 1;
  }
  if (rank == 0) printf("ncclAllReduce and ncclAllGather over %d ranks: correct\n", nranks);
  return 0;
}
