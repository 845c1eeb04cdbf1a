/*
 * The subset of MPI that tools/compare/ompi_bench.c calls, implemented by
 * ideal_mpi.c as the bare data movement of each collective (see there). Build
 * ompi_bench.c with -DFCCL_IDEAL -I tools/compare/ideal and ideal_mpi.c instead of
 * mpicc; run it as `ideal_bench --np N ARGS...`.
 */
#ifndef FCCL_IDEAL_MPI_H
#define FCCL_IDEAL_MPI_H
#include <stddef.h>

typedef int MPI_Comm;
typedef int MPI_Datatype;
typedef int MPI_Op;
typedef struct { int MPI_SOURCE, MPI_TAG, MPI_ERROR; } MPI_Status;

#define MPI_COMM_WORLD 0
#define MPI_IN_PLACE ((void *)1)
#define MPI_STATUS_IGNORE ((MPI_Status *)0)
#define MPI_MAX_LIBRARY_VERSION_STRING 256

enum { MPI_FLOAT = 1, MPI_DOUBLE, MPI_INT32_T, MPI_INT64_T, MPI_UNSIGNED_LONG_LONG };
enum { MPI_SUM = 1, MPI_PROD, MPI_MAX, MPI_MIN };

int MPI_Init(int *argc, char ***argv);
int MPI_Finalize(void);
int MPI_Abort(MPI_Comm comm, int code);
int MPI_Comm_rank(MPI_Comm comm, int *rank);
int MPI_Comm_size(MPI_Comm comm, int *size);
int MPI_Get_version(int *version, int *subversion);
int MPI_Get_library_version(char *version, int *len);
double MPI_Wtime(void);
int MPI_Barrier(MPI_Comm comm);
int MPI_Allreduce(const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, MPI_Comm comm);
int MPI_Bcast(void *buf, int count, MPI_Datatype t, int root, MPI_Comm comm);
int MPI_Reduce(const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, int root, MPI_Comm comm);
int MPI_Allgather(const void *s, int scount, MPI_Datatype st, void *r, int rcount, MPI_Datatype rt, MPI_Comm comm);
int MPI_Reduce_scatter_block(const void *s, void *r, int count, MPI_Datatype t, MPI_Op op, MPI_Comm comm);
int MPI_Alltoall(const void *s, int scount, MPI_Datatype st, void *r, int rcount, MPI_Datatype rt, MPI_Comm comm);
int MPI_Alltoallv(const void *s, const int *scounts, const int *sdispls, MPI_Datatype st, void *r, const int *rcounts,
                  const int *rdispls, MPI_Datatype rt, MPI_Comm comm);
int MPI_Gather(const void *s, int scount, MPI_Datatype st, void *r, int rcount, MPI_Datatype rt, int root,
               MPI_Comm comm);
int MPI_Scatter(const void *s, int scount, MPI_Datatype st, void *r, int rcount, MPI_Datatype rt, int root,
                MPI_Comm comm);
int MPI_Sendrecv(const void *s, int scount, MPI_Datatype st, int dest, int stag, void *r, int rcount,
                 MPI_Datatype rt, int source, int rtag, MPI_Comm comm, MPI_Status *status);
int MPI_Sendrecv_replace(void *buf, int count, MPI_Datatype t, int dest, int stag, int source, int rtag,
                         MPI_Comm comm, MPI_Status *status);

/* Benchmark buffers: in memory every rank maps at the same address. */
void *ideal_alloc(size_t bytes);
void ideal_free(void *p);
#endif
