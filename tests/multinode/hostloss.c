/* One rank of a multi-host job for tests/multinode/run.sh: joins through
 * fcclCommInitFromEnv and runs all_reduces until a call fails or the time is up.
 *
 *   hostloss SECONDS COUNT [READY_AFTER]
 *
 * Each all_reduce sums COUNT int32 elements (rank r contributes r + 1 + iteration in
 * every element) and is checked. After READY_AFTER successful calls the rank writes
 * its pid to $FCCL_MN_READY_DIR/rank<R> (written whole, then renamed), so the script
 * knows every rank is mid-run and which processes to kill.
 *
 * Output, one line on stdout, parsed by run.sh:
 *   hostloss rank R: error code C (NAME) at_ns T after I calls: MESSAGE
 *   hostloss rank R: init error code C (NAME) after MS ms: MESSAGE
 *   hostloss rank R: completed I calls in SECONDS s without error
 * at_ns is CLOCK_REALTIME in nanoseconds when the failing call returned.
 * Exit status: 0 completed, 2 a call failed, 3 init failed, 4 wrong result, 64 usage. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "ferroccl.h"

static int64_t realtime_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static double monotonic_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static long parse_arg(const char* s, const char* what, long lo, long hi) {
  char* end = NULL;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) {
    fprintf(stderr, "hostloss: %s must be an integer in [%ld, %ld], got '%s'\n", what, lo, hi, s);
    exit(64);
  }
  return v;
}

/* Writes this process's pid to dir/rank<rank> so that it appears complete or not at all. */
static void announce_ready(int rank) {
  const char* dir = getenv("FCCL_MN_READY_DIR");
  if (dir == NULL || dir[0] == '\0') return;
  char tmp[4096], dst[4096];
  snprintf(tmp, sizeof tmp, "%s/.rank%d.tmp", dir, rank);
  snprintf(dst, sizeof dst, "%s/rank%d", dir, rank);
  FILE* f = fopen(tmp, "w");
  if (f == NULL) {
    fprintf(stderr, "hostloss rank %d: cannot write %s: %s\n", rank, tmp, strerror(errno));
    return;
  }
  fprintf(f, "%ld\n", (long)getpid());
  if (fclose(f) != 0 || rename(tmp, dst) != 0)
    fprintf(stderr, "hostloss rank %d: cannot publish %s: %s\n", rank, dst, strerror(errno));
}

int main(int argc, char** argv) {
  if (argc < 3 || argc > 4) {
    fprintf(stderr, "usage: hostloss SECONDS COUNT [READY_AFTER] (run with FERROCCL_RANK etc. set)\n");
    return 64;
  }
  double seconds = (double)parse_arg(argv[1], "SECONDS", 1, 3600);
  size_t count = (size_t)parse_arg(argv[2], "COUNT", 1, 1L << 28);
  long ready_after = argc > 3 ? parse_arg(argv[3], "READY_AFTER", 1, 1L << 30) : 1;
  setvbuf(stdout, NULL, _IOLBF, 0);

  const char* rank_env = getenv("FERROCCL_RANK");
  int env_rank = rank_env != NULL ? atoi(rank_env) : -1;
  double t0 = monotonic_s();
  fcclComm_t comm = NULL;
  fcclResult_t r = fcclCommInitFromEnv(&comm);
  if (r != fcclSuccess) {
    printf("hostloss rank %d: init error code %d (%s) after %.0f ms: %s\n", env_rank, (int)r,
           fcclGetErrorString(r), (monotonic_s() - t0) * 1e3, fcclGetLastError(NULL));
    return 3;
  }
  int rank = 0, nranks = 0;
  if (fcclCommUserRank(comm, &rank) != fcclSuccess || fcclCommCount(comm, &nranks) != fcclSuccess) {
    printf("hostloss rank %d: init error code -1 (rank/count) after 0 ms: %s\n", env_rank,
           fcclGetLastError(comm));
    fcclCommAbort(comm);
    return 3;
  }

  int32_t* send = malloc(count * sizeof *send);
  int32_t* recv = malloc(count * sizeof *recv);
  if (send == NULL || recv == NULL) {
    fprintf(stderr, "hostloss rank %d: cannot allocate 2 x %zu int32\n", rank, count);
    fcclCommAbort(comm);
    return 3;
  }
  double start = monotonic_s();
  long calls = 0;
  while (monotonic_s() - start < seconds) {
    for (size_t i = 0; i < count; i++) send[i] = rank + 1 + (int32_t)(calls & 0xffff);
    r = fcclAllReduce(send, recv, count, fcclInt32, fcclSum, comm, NULL);
    if (r != fcclSuccess) {
      int64_t at = realtime_ns();
      fcclResult_t async = fcclSuccess;
      fcclCommGetAsyncError(comm, &async);
      printf("hostloss rank %d: error code %d (%s) at_ns %lld after %ld calls (async error %d): %s\n",
             rank, (int)r, fcclGetErrorString(r), (long long)at, calls, (int)async,
             fcclGetLastError(comm));
      fcclCommAbort(comm);
      return 2;
    }
    /* sum over ranks of (q + 1 + k) = n(n+1)/2 + n*k */
    int32_t want = nranks * (nranks + 1) / 2 + nranks * (int32_t)(calls & 0xffff);
    if (recv[0] != want || recv[count - 1] != want) {
      printf("hostloss rank %d: wrong result in call %ld: got %d and %d, want %d\n", rank, calls,
             recv[0], recv[count - 1], want);
      fcclCommAbort(comm);
      return 4;
    }
    if (++calls == ready_after) announce_ready(rank);
  }
  printf("hostloss rank %d: completed %ld calls in %.0f s without error\n", rank, calls, seconds);
  free(send);
  free(recv);
  return fcclCommDestroy(comm) == fcclSuccess ? 0 : 1;
}
