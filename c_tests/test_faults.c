/* Failure handling: a rank killed mid-collective, abort from another thread, a
 * timeout, mismatched calls under checkMode, and no debris afterwards.
 *
 * Self-contained: the program makes the unique id and forks its ranks itself, so it
 * can kill one and still judge the survivors. Usage: test_faults SCENARIO NRANKS
 * with SCENARIO one of kill, kill-mapped, kill-shift, abort, timeout, timeout-shift,
 * freeze, freeze-mapped, mismatch. Prints the measured
 * detection/abort latencies (the bounds asserted here are loose on purpose: CI
 * machines are noisy; the figures are what to read). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "ferroccl.h"

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

#define FAIL(...)                                              \
  do {                                                         \
    fprintf(stderr, "rank %d: %s:%d: ", rank, __FILE__, __LINE__); \
    fprintf(stderr, __VA_ARGS__);                              \
    fprintf(stderr, "\n");                                     \
    fflush(stdout);                                            \
    _exit(1);                                                  \
  } while (0)

#define OK(call)                                                                    \
  do {                                                                              \
    fcclResult_t r_ = (call);                                                       \
    if (r_ != fcclSuccess) FAIL("%s -> %d (%s)", #call, r_, fcclGetLastError(NULL)); \
  } while (0)

static int count_threads(void) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  struct dirent* e;
  if (!d) return -1;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

struct abort_arg {
  fcclComm_t comm;
  double at;
};

static void* aborter(void* p) {
  struct abort_arg* a = (struct abort_arg*)p;
  usleep(300 * 1000);
  a->at = now_ms();
  fcclCommAbort(a->comm);
  return NULL;
}

/* Kills this process a few milliseconds after it is started, mid-call. */
static void* killer(void* p) {
  (void)p;
  usleep(3 * 1000);
  raise(SIGKILL);
  return NULL;
}

/* One in-place ring shift: buf goes to the next rank, the previous rank's lands in it. */
static fcclResult_t shift_in_place(float* buf, size_t count, int rank, int nranks, fcclComm_t comm) {
  fcclResult_t r = fcclGroupStart();
  if (r != fcclSuccess) return r;
  fcclResult_t s = fcclSend(buf, count, fcclFloat32, (rank + 1) % nranks, comm, NULL);
  fcclResult_t v = fcclRecv(buf, count, fcclFloat32, (rank + nranks - 1) % nranks, comm, NULL);
  r = fcclGroupEnd();
  if (s != fcclSuccess) return s;
  return v != fcclSuccess ? v : r;
}

/* freeze: the rank that main() stops with SIGSTOP while every rank loops over large
 * all_reduces, and resumes after the timeout. */
#define FREEZE_TIMEOUT_MS 1500
static int frozen_rank(int nranks) { return nranks >= 3 ? 2 : 1; }

/* Every rank's failing call must blame the frozen rank F, and no other: "rank F stopped
 * making progress" (or "comes down to rank F,") and none of the phrases that would blame
 * another rank. */
static int blames_only(const char* msg, int f, int nranks) {
  char want1[64], want2[64], bad[96];
  int x;
  snprintf(want1, sizeof want1, "rank %d stopped making progress", f);
  snprintf(want2, sizeof want2, "down to rank %d,", f);
  if (!strstr(msg, want1) && !strstr(msg, want2)) return 0;
  for (x = 0; x < nranks; x++) {
    if (x == f) continue;
    snprintf(bad, sizeof bad, "rank %d stopped making progress", x);
    if (strstr(msg, bad)) return 0;
    snprintf(bad, sizeof bad, "down to rank %d,", x);
    if (strstr(msg, bad)) return 0;
    snprintf(bad, sizeof bad, "rank %d failed", x);
    if (strstr(msg, bad)) return 0;
    snprintf(bad, sizeof bad, "rank %d died", x);
    if (strstr(msg, bad)) return 0;
  }
  return 1;
}

static int run_rank(const char* scenario, int rank, int nranks, fcclUniqueId id) {
  int threads_before = count_threads();
  fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
  /* timeout-shift: the ranks but rank 1 shift in place (see kill-shift); rank 1 never
   * calls. */
  int tshift = strcmp(scenario, "timeout-shift") == 0;
  if (tshift) scenario = "timeout";
  if (strcmp(scenario, "timeout") == 0) cfg.timeoutMs = 500;
  if (strncmp(scenario, "freeze", 6) == 0) cfg.timeoutMs = FREEZE_TIMEOUT_MS;
  if (strcmp(scenario, "mismatch") == 0) cfg.checkMode = FCCL_CHECK_FINGERPRINT;
  fcclComm_t comm;
  OK(fcclCommInitRankConfig(&comm, nranks, id, rank, &cfg));
  size_t count = 4u << 20; /* 16 MiB of floats: long enough to be mid-flight */
  /* kill-mapped: the same as kill on buffers that peers map (fcclMemAllocHost), where
   * large reductions run between the ranks' buffers (from 3 ranks; 2 ranks swap). */
  int shift = strcmp(scenario, "kill-shift") == 0;
  int mapped = shift || tshift || strcmp(scenario, "kill-mapped") == 0 || strcmp(scenario, "freeze-mapped") == 0;
  if (strncmp(scenario, "freeze", 6) == 0) scenario = "freeze";
  if (strncmp(scenario, "kill", 4) == 0) scenario = "kill";
  float *a = NULL, *b = NULL;
  if (mapped) {
    OK(fcclMemAllocHost((void**)&a, count * sizeof(float)));
    OK(fcclMemAllocHost((void**)&b, count * sizeof(float)));
  } else {
    a = (float*)malloc(count * sizeof(float));
    b = (float*)malloc(count * sizeof(float));
  }
  if (!a || !b) FAIL("out of memory");
  for (size_t i = 0; i < count; i++) a[i] = 1.0f;
  OK(fcclAllReduce(a, b, 1024, fcclFloat32, fcclSum, comm, NULL));
  if (b[0] != (float)nranks) FAIL("warm-up all_reduce gave %f", b[0]);

  if (strcmp(scenario, "kill") == 0) {
    double t0 = now_ms();
    fcclResult_t r;
    if (shift) {
      /* kill-shift: in-place ring shifts (each rank sends its buffer on and receives
       * the previous rank's into it, as one group), which at 4 ranks on 2 cores go by
       * address with the receivers reading ahead and the senders waiting for their
       * reports. After three shifts that must succeed, rank 1 is killed from a
       * thread while it shifts; the survivors shift until a call fails. */
      for (int it = 0; it < 3; it++) OK(shift_in_place(a, count, rank, nranks, comm));
      if (rank == 1) {
        pthread_t th;
        pthread_create(&th, NULL, killer, NULL);
      }
      for (int it = 0;; it++) {
        if (rank != 1 && it == 100000) FAIL("100000 shifts succeeded with rank 1 killed");
        t0 = now_ms();
        r = shift_in_place(a, count, rank, nranks, comm);
        if (r != fcclSuccess) break;
      }
    } else {
      if (rank == 1) {
        usleep(20 * 1000); /* let the others enter the collective */
        raise(SIGKILL);
      }
      r = fcclAllReduce(a, b, count, fcclFloat32, fcclSum, comm, NULL);
    }
    double dt = now_ms() - t0;
    /* Copied: the message lives until this thread's next failing call. */
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fcclGetLastError(NULL));
    if (r != fcclRemoteError) FAIL("all_reduce with a dead peer returned %d (%s), want fcclRemoteError", r, msg);
    if (!strstr(msg, "rank 1")) FAIL("message does not name the dead rank 1: %s", msg);
    fcclResult_t ae;
    OK(fcclCommGetAsyncError(comm, &ae));
    if (ae != fcclRemoteError) FAIL("fcclCommGetAsyncError gave %d, want fcclRemoteError", ae);
    r = fcclAllReduce(a, b, 16, fcclFloat32, fcclSum, comm, NULL);
    if (r != fcclInvalidUsage) FAIL("a later call returned %d, want fcclInvalidUsage", r);
    printf("rank %d: dead peer detected after %.1f ms: %s\n", rank, dt, msg);
    if (dt > 2000) FAIL("detection took %.1f ms, more than 2 s", dt);
  } else if (strcmp(scenario, "abort") == 0) {
    if (rank == 0) {
      pthread_t th;
      struct abort_arg arg = {comm, 0};
      pthread_create(&th, NULL, aborter, &arg);
      double t0 = now_ms();
      /* The other ranks never join: this blocks until the abort. */
      fcclResult_t r = fcclAllReduce(a, b, count, fcclFloat32, fcclSum, comm, NULL);
      double t1 = now_ms();
      pthread_join(th, NULL);
      if (r == fcclSuccess) FAIL("all_reduce succeeded without its peers");
      printf("rank 0: blocked call returned %.1f ms after fcclCommAbort (code %d, waited %.1f ms): %s\n",
             t1 - arg.at, r, t1 - t0, fcclGetLastError(NULL));
      if (t1 - arg.at > 1000) FAIL("abort took %.1f ms to unblock the call", t1 - arg.at);
      /* The handle is gone after abort. */
      int n;
      if (fcclCommCount(comm, &n) != fcclInvalidArgument) FAIL("aborted handle still accepted");
      comm = NULL;
    } else {
      usleep(800 * 1000);
      /* The peer aborted: calls fail fast instead of hanging. */
      double t0 = now_ms();
      fcclResult_t r = fcclAllReduce(a, b, 1024, fcclFloat32, fcclSum, comm, NULL);
      if (r != fcclRemoteError) FAIL("call after the peer aborted returned %d, want fcclRemoteError", r);
      printf("rank %d: peer's abort seen after %.1f ms: %s\n", rank, now_ms() - t0, fcclGetLastError(NULL));
    }
  } else if (strcmp(scenario, "timeout") == 0 && tshift) {
    if (rank != 1) {
      double t0 = now_ms();
      fcclResult_t r = shift_in_place(a, count, rank, nranks, comm);
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", fcclGetLastError(NULL));
      if (r != fcclTimeout) FAIL("returned %d (%s), want fcclTimeout", r, msg);
      if (!strstr(msg, "fcclGroupEnd") || !strstr(msg, "fcclSend") || !strstr(msg, "fcclRecv"))
        FAIL("message must name the group and its calls: %s", msg);
      /* Ranks 0 and 2 (rank 1's receiver and sender; rank 0 alone at 2 ranks) wait for rank 1. */
      if ((rank == 0 || rank == 2) && !strstr(msg, "waits for data from): 1"))
        FAIL("message must name the missing rank 1: %s", msg);
      printf("rank %d: timed out after %.1f ms: %s\n", rank, now_ms() - t0, msg);
      r = shift_in_place(a, count, rank, nranks, comm);
      if (r != fcclInvalidUsage) FAIL("after a timeout a shift returned %d, want fcclInvalidUsage", r);
    } else {
      usleep(1500 * 1000); /* never shifts */
    }
  } else if (strcmp(scenario, "timeout") == 0) {
    if (rank == 0) {
      double t0 = now_ms();
      fcclResult_t r = fcclAllReduce(a, b, 1024, fcclFloat32, fcclSum, comm, NULL);
      char msg[1024];
      snprintf(msg, sizeof msg, "%s", fcclGetLastError(NULL));
      if (r != fcclTimeout) FAIL("returned %d (%s), want fcclTimeout", r, msg);
      if (!strstr(msg, "fcclAllReduce") || !strstr(msg, "#2") || !strstr(msg, "1"))
        FAIL("message must name the call, its sequence number and the missing ranks: %s", msg);
      printf("rank 0: timed out after %.1f ms: %s\n", now_ms() - t0, msg);
      r = fcclAllReduce(a, b, 16, fcclFloat32, fcclSum, comm, NULL);
      if (r != fcclInvalidUsage) FAIL("after a timeout a call returned %d, want fcclInvalidUsage", r);
    } else {
      usleep(1500 * 1000); /* never calls the collective */
    }
  } else if (strcmp(scenario, "freeze") == 0) {
    /* main() stops rank F mid-loop and resumes it after the timeout; every rank's
     * failing call, F's included, must name F as the cause, and nobody else. */
    int f = frozen_rank(nranks);
    double start = now_ms(), t0 = 0;
    fcclResult_t r = fcclSuccess;
    while (r == fcclSuccess) {
      if (now_ms() - start > 60000) FAIL("all_reduces kept succeeding for 60 s with rank %d stopped", f);
      t0 = now_ms();
      r = fcclAllReduce(a, b, count, fcclFloat32, fcclSum, comm, NULL);
    }
    char msg[2048];
    snprintf(msg, sizeof msg, "%s", fcclGetLastError(NULL));
    double dt = now_ms() - t0;
    if (r != fcclTimeout && r != fcclRemoteError) FAIL("returned %d (%s), want fcclTimeout or fcclRemoteError", r, msg);
    if (!blames_only(msg, f, nranks)) FAIL("the message must blame the stopped rank %d and no other: %s", f, msg);
    printf("rank %d: %s after %.1f ms: %s\n", rank, r == fcclTimeout ? "timed out" : "told", dt, msg);
    /* Within the timeout, plus a margin for the blame (60 ms) and CI noise. */
    if (rank != f && dt > FREEZE_TIMEOUT_MS * 1.1 + 1000)
      FAIL("the failure took %.1f ms with a timeout of %d ms", dt, FREEZE_TIMEOUT_MS);
  } else if (strcmp(scenario, "mismatch") == 0) {
    fcclResult_t r;
    if (rank == 1)
      r = fcclBroadcast(a, b, 1000, fcclFloat32, 0, comm, NULL);
    else
      r = fcclAllReduce(a, b, 1000 + (size_t)rank, fcclFloat32, fcclSum, comm, NULL);
    const char* msg = fcclGetLastError(NULL);
    if (r != fcclCollectiveMismatch) FAIL("mismatched calls returned %d (%s)", r, msg);
    if (!strstr(msg, "fcclBroadcast(count 1000") || !strstr(msg, "fcclAllReduce(count 1000"))
      FAIL("message must give each side's call: %s", msg);
    printf("rank %d: %s\n", rank, msg);
    /* Still usable. */
    OK(fcclAllReduce(a, b, 1024, fcclFloat32, fcclSum, comm, NULL));
    if (b[0] != (float)nranks) FAIL("all_reduce after a mismatch gave %f", b[0]);
  } else {
    FAIL("unknown scenario %s", scenario);
  }
  if (comm) OK(fcclCommDestroy(comm));
  if (mapped) {
    OK(fcclMemFree(a));
    OK(fcclMemFree(b));
  } else {
    free(a);
    free(b);
  }
  int threads_after = count_threads();
  if (threads_after != threads_before) FAIL("%d threads before init, %d after destroy", threads_before, threads_after);
  return 0;
}

/* Leftover segments of this job: names end in -p<pid of a rank>. */
static int debris(const pid_t* pids, int n) {
  int found = 0;
  DIR* d = opendir("/dev/shm");
  struct dirent* e;
  if (!d) return 0;
  while ((e = readdir(d)) != NULL) {
    const char* p = strrchr(e->d_name, 'p');
    if (strncmp(e->d_name, "fccl-", 5) != 0 || !p) continue;
    for (int i = 0; i < n; i++)
      if (atoi(p + 1) == pids[i]) {
        fprintf(stderr, "debris: /dev/shm/%s\n", e->d_name);
        found++;
      }
  }
  closedir(d);
  return found;
}

int main(int argc, char** argv) {
  int rank = -1;
  if (argc != 3) {
    fprintf(stderr, "usage: %s kill|kill-mapped|kill-shift|abort|timeout|timeout-shift|freeze|freeze-mapped|mismatch NRANKS\n",
            argv[0]);
    return 2;
  }
  const char* scenario = argv[1];
  int nranks = atoi(argv[2]);
  if (nranks < 2 || nranks > 64) {
    fprintf(stderr, "NRANKS must be 2..64\n");
    return 2;
  }
  /* Ranks are forked before fcclGetUniqueId starts the rendezvous thread: a child
   * forked while that thread held a lock (the allocator's, under ASan) would wait
   * for it forever and never reach the rendezvous. Each child gets the id through
   * a pipe. */
  fflush(stdout);
  pid_t pids[64];
  int pipes[64][2];
  for (int r = 0; r < nranks; r++) {
    if (pipe(pipes[r]) != 0) FAIL("pipe failed");
    pids[r] = fork();
    if (pids[r] == 0) {
      fcclUniqueId cid;
      size_t got = 0;
      while (got < sizeof cid) {
        ssize_t k = read(pipes[r][0], (char*)&cid + got, sizeof cid - got);
        if (k <= 0) _exit(3);
        got += (size_t)k;
      }
      int rc = run_rank(scenario, r, nranks, cid);
      fflush(stdout);
      _exit(rc);
    }
    close(pipes[r][0]);
  }
  fcclUniqueId id;
  OK(fcclGetUniqueId(&id));
  for (int r = 0; r < nranks; r++) {
    if (write(pipes[r][1], &id, sizeof id) != (ssize_t)sizeof id) FAIL("write to rank %d failed", r);
    close(pipes[r][1]);
  }
  if (strncmp(scenario, "freeze", 6) == 0) {
    /* Let the ranks start looping, stop one mid-call, resume it after the timeout. */
    int f = frozen_rank(nranks);
    usleep(700 * 1000);
    kill(pids[f], SIGSTOP);
    usleep((FREEZE_TIMEOUT_MS + 2500) * 1000);
    kill(pids[f], SIGCONT);
  }
  int failures = 0;
  for (int r = 0; r < nranks; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    int killed = WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL;
    int ok = (strncmp(scenario, "kill", 4) == 0 && r == 1) ? killed : (WIFEXITED(st) && WEXITSTATUS(st) == 0);
    if (!ok) {
      fprintf(stderr, "rank %d ended wrongly (status %#x)\n", r, st);
      failures++;
    }
  }
  if (debris(pids, nranks)) failures++;
  printf("%s with %d ranks: %s\n", scenario, nranks, failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}
