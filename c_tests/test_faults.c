/* Failure handling: a rank killed mid-collective, abort from another thread, a
 * timeout, mismatched calls under checkMode, and no debris afterwards.
 *
 * Self-contained: the program makes the unique id and forks its ranks itself, so it
 * can kill one and still judge the survivors. Usage: test_faults SCENARIO NRANKS
 * with SCENARIO one of kill, kill-mapped, kill-shift, abort, timeout, timeout-shift,
 * freeze, freeze-mapped, mismatch, leave, exit (a peer that destroyed its communicator
 * or exited), abort-init (non-blocking creations aborted), kill-init (a rank killed
 * during set-up), kill-root-early, kill-root-late (the process that created the
 * unique id killed during set-up). Prints the measured
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
#include <poll.h>
#include <sys/inotify.h>
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

static int count_entries(const char* dir) {
  int n = 0;
  DIR* d = opendir(dir);
  struct dirent* e;
  if (!d) return -1;
  while ((e = readdir(d)) != NULL)
    if (e->d_name[0] != '.') n++;
  closedir(d);
  return n;
}

static int count_threads(void) {
  return count_entries("/proc/self/task");
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
/* Where a freeze rank says that its warm-up is done (one byte): main() stops rank F
 * only once every rank loops, however slowly a loaded machine started them. */
static int g_ready_fd = -1;

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
  if (strcmp(scenario, "freeze") == 0 && write(g_ready_fd, "r", 1) != 1) FAIL("cannot tell main() it is ready");

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
      /* The peer aborted in the middle of this very call: it fails fast instead of
       * hanging. (The same call: with another count the verdict would be a mismatch,
       * which the peer's announcement, published before its abort, shows.) */
      double t0 = now_ms();
      fcclResult_t r = fcclAllReduce(a, b, count, fcclFloat32, fcclSum, comm, NULL);
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
  } else if (strcmp(scenario, "leave") == 0 || strcmp(scenario, "exit") == 0) {
    /* Rank 1 leaves while the others call an all_reduce: after destroying its
     * communicator (leave), or without (exit; exit() runs the library's handler). The
     * others must say which, not that it died. */
    int leave = strcmp(scenario, "leave") == 0;
    if (rank == 1) {
      if (leave) OK(fcclCommDestroy(comm));
      fflush(stdout);
      exit(0);
    }
    double t0 = now_ms();
    fcclResult_t r = fcclAllReduce(a, b, count, fcclFloat32, fcclSum, comm, NULL);
    double dt = now_ms() - t0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", fcclGetLastError(NULL));
    const char* want = "rank 1 (pid";
    const char* how = leave ? "destroyed its communicator and its process exited" : "without destroying its communicator";
    if (r != fcclRemoteError) FAIL("all_reduce with a peer gone returned %d (%s), want fcclRemoteError", r, msg);
    if (strstr(msg, "reported by rank")) {
      /* Heard second-hand, from a rank that stopped because of rank 1. */
      if (!strstr(msg, "rank 1")) FAIL("message does not name rank 1: %s", msg);
    } else if (!strstr(msg, want) || !strstr(msg, how) || strstr(msg, "died")) {
      FAIL("message must say that rank 1 %s, not that it died: %s", leave ? "destroyed its communicator" : "exited", msg);
    }
    printf("rank %d: peer that %s seen after %.1f ms: %s\n", rank, leave ? "destroyed its communicator" : "exited",
           dt, msg);
    if (dt > 2000) FAIL("detection took %.1f ms, more than 2 s", dt);
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

static int count_fds(void) {
  return count_entries("/proc/self/fd") - 1; /* the directory's own descriptor */
}

/* abort-init: 30 non-blocking creations given up with fcclCommAbort, half at once and
 * half once they wait for the missing ranks at the rendezvous: each abort returns at
 * once, and the creations' threads and sockets are gone within 500 ms (they used to
 * stay until the 30 s timeout). The rendezvous points live in a child process, so that
 * this process's threads and descriptors are the creations' alone. */
static int abort_init(int nranks) {
  int rank = -1;
  enum { N = 30 };
  int p[2];
  if (pipe(p) != 0) FAIL("pipe failed");
  fflush(stdout);
  pid_t srv = fork();
  if (srv == 0) {
    close(p[0]);
    for (int i = 0; i < N; i++) {
      fcclUniqueId id;
      if (fcclGetUniqueId(&id) != fcclSuccess) _exit(3);
      if (write(p[1], &id, sizeof id) != (ssize_t)sizeof id) _exit(3);
    }
    close(p[1]);
    pause(); /* serves the points until killed */
    _exit(0);
  }
  close(p[1]);
  fcclUniqueId ids[N];
  for (int i = 0; i < N; i++) {
    size_t got = 0;
    while (got < sizeof ids[i]) {
      ssize_t k = read(p[0], (char*)&ids[i] + got, sizeof ids[i] - got);
      if (k <= 0) FAIL("the child serving the rendezvous points died");
      got += (size_t)k;
    }
  }
  close(p[0]);
  int threads0 = count_threads(), fds0 = count_fds();
  fcclComm_t comms[N];
  for (int i = 0; i < N; i++) {
    fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    cfg.timeoutMs = 30000;
    /* The last rank of nranks: the others never come. */
    fcclResult_t r = fcclCommInitRankConfig(&comms[i], nranks, ids[i], nranks - 1, &cfg);
    if (r != fcclInProgress) FAIL("non-blocking init %d returned %d (%s)", i, r, fcclGetLastError(NULL));
  }
  double slowest = 0, t;
  for (int i = 0; i < N; i += 2) {
    t = now_ms();
    OK(fcclCommAbort(comms[i]));
    if (now_ms() - t > slowest) slowest = now_ms() - t;
  }
  usleep(300 * 1000);
  int threads1 = count_threads(), fds1 = count_fds();
  for (int i = 1; i < N; i += 2) {
    fcclResult_t st;
    OK(fcclCommGetAsyncError(comms[i], &st));
    if (st != fcclInProgress) FAIL("creation %d ended on its own (%d) before the abort", i, st);
    t = now_ms();
    OK(fcclCommAbort(comms[i]));
    if (now_ms() - t > slowest) slowest = now_ms() - t;
  }
  double aborted = now_ms(), back = -1;
  int threads2 = 0, fds2 = 0;
  while (now_ms() - aborted < 3000) {
    threads2 = count_threads();
    fds2 = count_fds();
    if (threads2 == threads0 && fds2 == fds0) {
      back = now_ms() - aborted;
      break;
    }
    usleep(1000);
  }
  kill(srv, SIGKILL);
  waitpid(srv, NULL, 0);
  printf("abort-init: %d creations (%d waiting: %d threads, %d descriptors above the baseline); slowest "
         "fcclCommAbort %.2f ms; threads and descriptors back to %d and %d after %.1f ms\n",
         N, N / 2, threads1 - threads0, fds1 - fds0, slowest, threads0, fds0, back);
  if (slowest > 50) FAIL("fcclCommAbort of a creation took %.1f ms", slowest);
  if (back < 0 || back > 500)
    FAIL("%d threads and %d descriptors (baseline %d and %d) 3 s after the aborts", threads2, fds2, threads0, fds0);
  printf("abort-init with %d ranks: passed\n", nranks);
  return 0;
}

/* The id, then main's pid, from a pipe. */
static void read_all(int fd, void* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    ssize_t k = read(fd, (char*)buf + got, n - got);
    if (k <= 0) _exit(3);
    got += (size_t)k;
  }
}

/* Checks a failed set-up's result on a surviving rank: fcclRemoteError (or
 * fcclInvalidUsage: refused by a point that already failed), within 2 s, naming
 * `name`. Exits the rank. */
static void judge_survivor(int rank, fcclResult_t r, double dt, const char* name) {
  char msg[2048];
  snprintf(msg, sizeof msg, "%s", fcclGetLastError(NULL));
  printf("rank %d: init returned %d after %.1f ms: %s\n", rank, r, dt, msg);
  fflush(stdout);
  if (r != fcclRemoteError && r != fcclInvalidUsage) FAIL("init returned %d, want fcclRemoteError", r);
  if (!strstr(msg, name)) FAIL("the message does not name %s", name);
  if (dt > 2000) FAIL("the set-up failed after %.1f ms (timeout 20 s), more than 2 s", dt);
  _exit(0);
}

/* One try of kill-init in a process of its own (main calls no ferroccl function, so it
 * may fork again): the ranks start, the last one is stopped as soon as its segment
 * appears in /dev/shm and, while the segment is still there, killed. The survivors must
 * fail within 2 s naming it, and once they have, nothing of the communicator may be
 * left in /dev/shm. Exit status: 0 passed, 1 failed, 4 the kill came too late (the
 * segment was already unlinked). */
static int kill_init_try(int nranks) {
  int rank = -1, victim = nranks - 1;
  int in = inotify_init1(IN_CLOEXEC);
  if (in < 0 || inotify_add_watch(in, "/dev/shm", IN_CREATE) < 0) FAIL("inotify on /dev/shm failed");
  pid_t pids[64];
  int pipes[64][2];
  fflush(stdout);
  for (int r = 0; r < nranks; r++) {
    if (pipe(pipes[r]) != 0) FAIL("pipe failed");
    pids[r] = fork();
    if (pids[r] == 0) {
      close(in);
      fcclUniqueId id;
      read_all(pipes[r][0], &id, sizeof id);
      fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
      cfg.timeoutMs = 20000;
      fcclComm_t comm;
      double t0 = now_ms();
      fcclResult_t res = fcclCommInitRankConfig(&comm, nranks, id, r, &cfg);
      if (r == victim) pause(); /* killed meanwhile */
      if (res == fcclSuccess) {
        /* The kill came after the set-up: the next call fails instead. */
        float x = 1, y;
        res = fcclAllReduce(&x, &y, 1, fcclFloat32, fcclSum, comm, NULL);
      }
      char name[32];
      snprintf(name, sizeof name, "rank %d", victim);
      judge_survivor(r, res, now_ms() - t0, name);
    }
    close(pipes[r][0]);
  }
  fcclUniqueId id;
  OK(fcclGetUniqueId(&id));
  for (int r = 0; r < nranks; r++) {
    if (write(pipes[r][1], &id, sizeof id) != (ssize_t)sizeof id) FAIL("write to rank %d failed", r);
    close(pipes[r][1]);
  }
  /* The victim's segment: /dev/shm/fccl-<nonce>-<rank>-p<pid>. */
  char suffix[32], seg[256] = "", nonce[64] = "";
  snprintf(suffix, sizeof suffix, "-p%d", (int)pids[victim]);
  double start = now_ms();
  while (!seg[0] && now_ms() - start < 10000) {
    struct pollfd pf = {in, POLLIN, 0};
    if (poll(&pf, 1, 100) <= 0) continue;
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    ssize_t n = read(in, buf, sizeof buf);
    for (char* q = buf; n > 0 && q < buf + n;) {
      struct inotify_event* ev = (struct inotify_event*)q;
      size_t l = ev->len ? strlen(ev->name) : 0;
      if (l > strlen(suffix) && strncmp(ev->name, "fccl-", 5) == 0 && strncmp(ev->name, "fccl-ctl-", 9) != 0 &&
          strcmp(ev->name + l - strlen(suffix), suffix) == 0) {
        kill(pids[victim], SIGSTOP);
        snprintf(seg, sizeof seg, "%s", ev->name);
        break;
      }
      q += sizeof *ev + ev->len;
    }
  }
  if (!seg[0]) FAIL("rank %d never created its segment", victim);
  char path[300];
  snprintf(path, sizeof path, "/dev/shm/%s", seg);
  int hit = access(path, F_OK) == 0;
  kill(pids[victim], SIGKILL);
  const char* dash = strchr(seg + 5, '-');
  snprintf(nonce, sizeof nonce, "%.*s", (int)(dash - (seg + 5)), seg + 5);
  int failures = 0;
  for (int r = 0; r < nranks; r++) {
    if (r == victim) continue;
    int st;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d ended wrongly (status %#x)\n", r, st);
      failures++;
    }
  }
  /* The survivors have all reported, the victim is still a zombie: what is left of the
   * communicator in /dev/shm is debris. */
  char pre1[96], pre2[96];
  snprintf(pre1, sizeof pre1, "fccl-%s-", nonce);
  snprintf(pre2, sizeof pre2, "fccl-ctl-%s-", nonce);
  DIR* d = opendir("/dev/shm");
  struct dirent* e;
  while (d && (e = readdir(d)) != NULL) {
    if (strncmp(e->d_name, pre1, strlen(pre1)) == 0 || strncmp(e->d_name, pre2, strlen(pre2)) == 0) {
      fprintf(stderr, "debris after the survivors reported rank %d's death: /dev/shm/%s\n", victim, e->d_name);
      char leftover[300];
      snprintf(leftover, sizeof leftover, "/dev/shm/%s", e->d_name);
      unlink(leftover); /* not to disturb later runs */
      failures++;
    }
  }
  if (d) closedir(d);
  waitpid(pids[victim], NULL, 0);
  printf("kill-init: rank %d stopped and killed with its segment %s (%s)\n", victim, seg,
         hit ? "still there" : "already unlinked: too late");
  if (failures) return 1;
  return hit ? 0 : 4;
}

static int kill_init(int nranks) {
  int rank = -1;
  for (int attempt = 0; attempt < 5; attempt++) {
    fflush(stdout);
    pid_t t = fork();
    if (t == 0) _exit(kill_init_try(nranks));
    int st;
    waitpid(t, &st, 0);
    if (!WIFEXITED(st) || (WEXITSTATUS(st) != 0 && WEXITSTATUS(st) != 4)) FAIL("kill-init failed (status %#x)", st);
    if (WEXITSTATUS(st) == 0) {
      printf("kill-init with %d ranks: passed\n", nranks);
      return 0;
    }
  }
  FAIL("in 5 tries the kill never came before the victim unlinked its segment");
}

/* kill-root-early / kill-root-late: rank 0 creates the unique id (its process serves
 * the rendezvous), hands it to the others, and is killed: at once (before most of them
 * reach the point), or after 300 ms (while they wait for it in the first round). The
 * others must fail within 2 s saying that the process that created the id, by its pid,
 * has exited (they used to retry a refused connection until the 20 s timeout). */
static int kill_root(int nranks, int late) {
  int rank = -1;
  pid_t pids[64];
  int pipes[64][2];
  fflush(stdout);
  for (int r = 1; r < nranks; r++) {
    if (pipe(pipes[r]) != 0) FAIL("pipe failed");
    pids[r] = fork();
    if (pids[r] == 0) {
      fcclUniqueId id;
      int root;
      read_all(pipes[r][0], &id, sizeof id);
      read_all(pipes[r][0], &root, sizeof root);
      fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
      cfg.timeoutMs = 20000;
      fcclComm_t comm;
      double t0 = now_ms();
      fcclResult_t res = fcclCommInitRankConfig(&comm, nranks, id, r, &cfg);
      char name[64];
      snprintf(name, sizeof name, "(pid %d) has exited", root);
      judge_survivor(r, res, now_ms() - t0, name);
    }
    close(pipes[r][0]);
  }
  pids[0] = fork();
  if (pids[0] == 0) {
    fcclUniqueId id;
    if (fcclGetUniqueId(&id) != fcclSuccess) _exit(3);
    int me = (int)getpid();
    for (int r = 1; r < nranks; r++) {
      if (write(pipes[r][1], &id, sizeof id) != (ssize_t)sizeof id) _exit(3);
      if (write(pipes[r][1], &me, sizeof me) != (ssize_t)sizeof me) _exit(3);
    }
    if (late) usleep(300 * 1000);
    raise(SIGKILL);
  }
  for (int r = 1; r < nranks; r++) close(pipes[r][1]);
  int failures = 0;
  for (int r = 1; r < nranks; r++) {
    int st;
    waitpid(pids[r], &st, 0);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
      fprintf(stderr, "rank %d ended wrongly (status %#x)\n", r, st);
      failures++;
    }
  }
  waitpid(pids[0], NULL, 0);
  printf("kill-root-%s with %d ranks: %s\n", late ? "late" : "early", nranks, failures ? "FAILED" : "passed");
  return failures ? 1 : 0;
}

int main(int argc, char** argv) {
  int rank = -1;
  if (argc != 3) {
    fprintf(stderr,
            "usage: %s kill|kill-mapped|kill-shift|abort|timeout|timeout-shift|freeze|freeze-mapped|mismatch|leave|exit|"
            "abort-init|kill-init|kill-root-early|kill-root-late NRANKS\n",
            argv[0]);
    return 2;
  }
  const char* scenario = argv[1];
  int nranks = atoi(argv[2]);
  if (nranks < 2 || nranks > 64) {
    fprintf(stderr, "NRANKS must be 2..64\n");
    return 2;
  }
  if (strcmp(scenario, "abort-init") == 0) return abort_init(nranks);
  if (strcmp(scenario, "kill-init") == 0) return kill_init(nranks);
  if (strcmp(scenario, "kill-root-early") == 0) return kill_root(nranks, 0);
  if (strcmp(scenario, "kill-root-late") == 0) return kill_root(nranks, 1);
  /* Ranks are forked before fcclGetUniqueId starts the rendezvous thread: a child
   * forked while that thread held a lock (the allocator's, under ASan) would wait
   * for it forever and never reach the rendezvous. Each child gets the id through
   * a pipe. */
  fflush(stdout);
  pid_t pids[64];
  int pipes[64][2];
  int ready[2];
  if (pipe(ready) != 0) FAIL("pipe failed");
  g_ready_fd = ready[1];
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
    /* Once every rank has warmed up, let them loop, stop one mid-call, resume it after
     * the timeout. */
    int f = frozen_rank(nranks);
    close(ready[1]);
    for (int got = 0; got < nranks;) {
      char c;
      ssize_t k = read(ready[0], &c, 1);
      if (k <= 0) break; /* a rank failed its warm-up: its own message says why */
      got++;
    }
    usleep(300 * 1000);
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
