/* ferroccl from C: join the ranks a launcher started, sum a vector over all of them,
 * gather one block from every rank, and handle an error.
 *
 *   cc allreduce.c -I<ferroccl>/include -L<ferroccl>/target/release -lferroccl \
 *      -Wl,-rpath,<ferroccl>/target/release -o allreduce
 *   ferroccl-run -n 4 ./allreduce
 *
 * (With an installed copy: cc allreduce.c $(pkg-config --cflags --libs ferroccl) \
 *   -Wl,-rpath,$(pkg-config --variable=libdir ferroccl), or the loader finds no libferroccl.so.0.) */
#include <ferroccl.h>
#include <stdio.h>
#include <stdlib.h>

/* Every call returns a fcclResult_t. On failure, fcclGetLastError() names the call,
 * the values it was given and what to do: print it and stop. */
#define CHECK(call)                                                                      \
  do {                                                                                   \
    fcclResult_t res_ = (call);                                                          \
    if (res_ != fcclSuccess) {                                                           \
      fprintf(stderr, "%s:%d: %s\n  %s\n", __FILE__, __LINE__, fcclGetErrorString(res_), \
              fcclGetLastError(NULL));                                                   \
      exit(1);                                                                           \
    }                                                                                    \
  } while (0)

enum { N = 1 << 20, BLOCK = 4 };

int main(void) {
  fcclComm_t comm;
  int rank, nranks, i, wrong = 0;

  /* Rank, world size and the rendezvous come from the launcher's environment
   * (ferroccl-run, torchrun, mpirun or srun). */
  CHECK(fcclCommInitFromEnv(&comm));
  CHECK(fcclCommUserRank(comm, &rank));
  CHECK(fcclCommCount(comm, &nranks));

  /* all_reduce in place: every rank holds x[i] = rank + i and gets the sum over ranks.
   * Buffers are plain host memory; a large buffer used again and again is faster
   * from fcclMemAllocHost (peers on this host then read it where it lies). The
   * stream is NULL for host memory (a cudaStream_t for device memory). */
  float* x = malloc(N * sizeof *x);
  if (x == NULL) return 1;
  for (i = 0; i < N; i++) x[i] = (float)(rank + i % 1000);
  CHECK(fcclAllReduce(x, x, N, fcclFloat32, fcclSum, comm, NULL));
  for (i = 0; i < N; i++) {
    /* sum over r of (r + v) = n(n-1)/2 + n*v, exact in float for these values */
    float want = (float)(nranks * (nranks - 1) / 2 + nranks * (i % 1000));
    if (x[i] != want) wrong++;
  }

  /* all_gather: rank r's BLOCK ints land at offset r*BLOCK of everyone's result. */
  int mine[BLOCK];
  int* all = malloc((size_t)nranks * BLOCK * sizeof *all);
  if (all == NULL) return 1;
  for (i = 0; i < BLOCK; i++) mine[i] = 100 * rank + i;
  CHECK(fcclAllGather(mine, all, BLOCK, fcclInt32, comm, NULL));
  for (i = 0; i < nranks * BLOCK; i++) {
    if (all[i] != 100 * (i / BLOCK) + i % BLOCK) wrong++;
  }

  /* A call with a bad argument (a root that is no rank) fails on every rank before
   * anything moves, and the communicator stays usable. */
  fcclResult_t res = fcclBroadcast(x, x, N, fcclFloat32, nranks, comm, NULL);
  if (res != fcclInvalidArgument) wrong++;
  if (rank == 0) printf("a bad root is refused: %s\n", fcclGetLastError(comm));
  CHECK(fcclAllReduce(mine, mine, BLOCK, fcclInt32, fcclMax, comm, NULL));

  CHECK(fcclCommDestroy(comm));
  free(all);
  free(x);
  if (wrong) {
    fprintf(stderr, "rank %d: %d wrong results\n", rank, wrong);
    return 1;
  }
  if (rank == 0) printf("all_reduce and all_gather over %d ranks: correct\n", nranks);
  return 0;
}
