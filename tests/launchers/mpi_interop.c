/* fcclCommInitFromEnv in an MPI program under plain mpirun, where the ranks meet
 * through PMIx: MPI_Init before it (argument "before") or after it ("after") must
 * still work, since both hold PMIx, and the job must end cleanly (each side's
 * PMIx_Finalize). libmpi is opened at run time so that no MPI headers are needed.
 * Prints "mpi_interop ORDER: process, N rank(s): passed" on success. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "ferroccl.h"

typedef int (*mpi_init_fn)(int *, char ***);
typedef int (*mpi_finalize_fn)(void);

static int fail(const char *what) {
  fprintf(stderr, "mpi_interop: %s: %s\n", what, fcclGetLastError(NULL));
  return 1;
}

int main(int argc, char **argv) {
  if (argc != 2 || (strcmp(argv[1], "before") && strcmp(argv[1], "after"))) {
    fprintf(stderr, "usage: mpi_interop before|after\n");
    return 2;
  }
  int before = strcmp(argv[1], "before") == 0;
  void *mpi = dlopen("libmpi.so.40", RTLD_NOW | RTLD_GLOBAL);
  if (!mpi) {
    fprintf(stderr, "mpi_interop: %s\n", dlerror());
    return 1;
  }
  mpi_init_fn mpi_init = (mpi_init_fn)dlsym(mpi, "MPI_Init");
  mpi_finalize_fn mpi_finalize = (mpi_finalize_fn)dlsym(mpi, "MPI_Finalize");
  if (!mpi_init || !mpi_finalize) {
    fprintf(stderr, "mpi_interop: libmpi.so.40 lacks MPI_Init or MPI_Finalize\n");
    return 1;
  }
  if (before && mpi_init(&argc, &argv) != 0) {
    fprintf(stderr, "mpi_interop: MPI_Init before fcclCommInitFromEnv failed\n");
    return 1;
  }
  fcclComm_t comm;
  if (fcclCommInitFromEnv(&comm) != fcclSuccess) return fail("fcclCommInitFromEnv");
  if (!before && mpi_init(&argc, &argv) != 0) {
    fprintf(stderr, "mpi_interop: MPI_Init after fcclCommInitFromEnv failed\n");
    return 1;
  }
  int rank = -1, n = 0;
  if (fcclCommUserRank(comm, &rank) != fcclSuccess || fcclCommCount(comm, &n) != fcclSuccess)
    return fail("fcclCommUserRank/Count");
  float x = (float)(rank + 1);
  if (fcclAllReduce(&x, &x, 1, fcclFloat32, fcclSum, comm, NULL) != fcclSuccess) return fail("fcclAllReduce");
  if (x != (float)n * (n + 1) / 2) {
    fprintf(stderr, "mpi_interop: rank %d: the sum is %g, not %d\n", rank, x, n * (n + 1) / 2);
    return 1;
  }
  if (fcclCommDestroy(comm) != fcclSuccess) return fail("fcclCommDestroy");
  if (mpi_finalize() != 0) {
    fprintf(stderr, "mpi_interop: MPI_Finalize failed\n");
    return 1;
  }
  printf("mpi_interop %s: process, %d rank(s): passed\n", argv[1], n);
  return 0;
}
