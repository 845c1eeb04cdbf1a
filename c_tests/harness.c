/* Contract-test harness for ferroccl: running modes, checks, reference data.
 * See harness.h.  Nothing here uses the library to compute expected values. */
#include "harness.h"

/* Library calls whose result was checked, over all ranks of this process: the
 * number of cases a run covered. */
static long g_checked_calls;

#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>
#include <unistd.h>

/* ================================================================== running */

#define MAX_PHASE_SLOTS 64
#define MAIN_SLOT (MAX_PHASE_SLOTS - 1)
#define MAX_PRINTED_FAILURES 40

typedef struct {
  int rank; /* -1: main thread in threads mode */
  int failures;
} tctx;

static pthread_key_t g_key;
static pthread_once_t g_key_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_print_mu = PTHREAD_MUTEX_INITIALIZER;
static tctx g_main_ctx = {0, 0};
static int g_threads_mode = 0;
static int g_launched = 0;
static int g_nranks = 1;
static fcclUniqueId g_shared_id;
static int g_have_shared_id = 0;
static pthread_barrier_t g_barrier;
static const char* g_prog = "test";
static int g_verbose = 0;
static char g_phases[MAX_PHASE_SLOTS][192];
static fccl_pre_init_fn g_pre_init = NULL;
static int* g_devlist = NULL; /* threads mode, --devlist: g_nranks entries */

static void make_key(void) { (void)pthread_key_create(&g_key, NULL); }

static tctx* cur_ctx(void) {
  tctx* c;
  pthread_once(&g_key_once, make_key);
  c = (tctx*)pthread_getspecific(g_key);
  return c ? c : &g_main_ctx;
}

static void set_ctx(tctx* c) {
  pthread_once(&g_key_once, make_key);
  (void)pthread_setspecific(g_key, c);
}

void fccl_set_pre_init(fccl_pre_init_fn fn) { g_pre_init = fn; }
const int* fccl_devlist(void) { return g_devlist; }

/* Runs the pre-init hook; returns -1 to go on, else the exit status. */
static int pre_init(int rank, int nranks) {
  int r;
  if (!g_pre_init) return -1;
  fccl_phase("pre-init (device selection)");
  r = g_pre_init(rank, nranks, g_devlist);
  if (r == 0) return -1;
  pthread_mutex_lock(&g_print_mu);
  if (r == FCCL_SKIP)
    printf("%s: %s, %d rank(s): SKIPPED\n", g_prog, g_threads_mode ? "threads" : "process",
           nranks);
  else
    printf("%s: FAILED before creating a communicator (%d failed check(s))\n", g_prog, r);
  fflush(stdout);
  pthread_mutex_unlock(&g_print_mu);
  return r == FCCL_SKIP ? FCCL_SKIP_EXIT : 1;
}

int fccl_threads_mode(void) { return g_threads_mode; }
int fccl_process_launched(void) { return g_launched; }
const fcclUniqueId* fccl_shared_id(void) { return g_have_shared_id ? &g_shared_id : NULL; }
int fccl_failures(void) { return cur_ctx()->failures; }
int fccl_cur_rank(void) { return cur_ctx()->rank; }

static const char* base_name(const char* path) {
  const char* s = strrchr(path, '/');
  return s ? s + 1 : path;
}

static void rank_label(char* out, size_t n) {
  int r = fccl_cur_rank();
  if (r < 0)
    snprintf(out, n, "rank *");
  else
    snprintf(out, n, "rank %d", r);
}

void fccl_fail_at(const char* file, int line, const char* fmt, ...) {
  tctx* c = cur_ctx();
  char msg[2048];
  char who[32];
  va_list ap;
  c->failures++;
  if (c->failures > MAX_PRINTED_FAILURES) {
    if (c->failures == MAX_PRINTED_FAILURES + 1) {
      rank_label(who, sizeof who);
      pthread_mutex_lock(&g_print_mu);
      printf("%s: (further failures of this rank are counted but not printed)\n", who);
      fflush(stdout);
      pthread_mutex_unlock(&g_print_mu);
    }
    return;
  }
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  rank_label(who, sizeof who);
  pthread_mutex_lock(&g_print_mu);
  printf("%s: %s:%d: %s\n", who, base_name(file), line, msg);
  fflush(stdout);
  pthread_mutex_unlock(&g_print_mu);
}

void fccl_phase(const char* fmt, ...) {
  int r = fccl_cur_rank();
  int slot = (r < 0 || r >= MAIN_SLOT) ? MAIN_SLOT : r;
  char buf[192];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  memcpy(g_phases[slot], buf, sizeof buf);
  if (g_verbose) {
    char who[32];
    rank_label(who, sizeof who);
    pthread_mutex_lock(&g_print_mu);
    printf("%s: phase: %s\n", who, buf);
    fflush(stdout);
    pthread_mutex_unlock(&g_print_mu);
  }
}

static void* watchdog_main(void* arg) {
  long secs = *(long*)arg;
  struct timespec ts;
  int i;
  ts.tv_sec = secs;
  ts.tv_nsec = 0;
  while (nanosleep(&ts, &ts) != 0) {
  }
  pthread_mutex_lock(&g_print_mu);
  printf("%s: WATCHDOG: still running after %ld s (FCCL_TEST_WATCHDOG_S); last phases:\n",
         g_prog, secs);
  for (i = 0; i < MAX_PHASE_SLOTS; i++) {
    if (g_phases[i][0]) {
      if (i == MAIN_SLOT)
        printf("  main/process: %s\n", g_phases[i]);
      else
        printf("  rank %d: %s\n", i, g_phases[i]);
    }
  }
  fflush(stdout);
  _exit(1);
  return NULL;
}

static void start_watchdog(void) {
  static long secs = 270;
  const char* e = getenv("FCCL_TEST_WATCHDOG_S");
  pthread_t t;
  if (e && *e) secs = atol(e);
  if (secs <= 0) return;
  if (pthread_create(&t, NULL, watchdog_main, &secs) == 0) pthread_detach(t);
}

void fccl_sync(fcclComm_t comm) {
  if (g_threads_mode) {
    pthread_barrier_wait(&g_barrier);
  } else {
    CHECK_OK(fcclBarrier(comm, NULL));
  }
}

fcclResult_t fccl_wait_comm(fcclComm_t comm) {
  fcclResult_t st = fcclInProgress;
  struct timespec pause = {0, 50000};
  for (;;) {
    fcclResult_t r = fcclCommGetAsyncError(comm, &st);
    if (r != fcclSuccess) return r;
    if (st != fcclInProgress) return st;
    nanosleep(&pause, NULL);
  }
}

typedef struct {
  fccl_body_fn body;
  fcclComm_t comm;
  int rank;
  int nranks;
  tctx ctx;
  int ret;
} rank_job;

static int run_body(rank_job* j) {
  int ret;
  fccl_phase("body start");
  ret = j->body(j->comm, j->rank, j->nranks);
  fccl_phase("fcclCommDestroy");
  CHECK_OK(fcclCommDestroy(j->comm));
  fccl_phase("done");
  return ret;
}

static void* rank_thread(void* arg) {
  rank_job* j = (rank_job*)arg;
  set_ctx(&j->ctx);
  j->ret = run_body(j);
  return NULL;
}

/* Combines body return values and counted failures into an exit status. */
static int finish(const char* mode, int nranks, const rank_job* jobs, int njobs, int extra) {
  int failures = extra, skipped = 0, i;
  for (i = 0; i < njobs; i++) {
    int f = jobs[i].ctx.failures;
    if (jobs[i].ret == FCCL_SKIP)
      skipped++;
    else if (jobs[i].ret > f)
      f = jobs[i].ret;
    failures += f;
  }
  pthread_mutex_lock(&g_print_mu);
  if (failures) {
    printf("%s: %s, %d rank(s): FAILED (%d failed check(s))\n", g_prog, mode, nranks, failures);
  } else if (skipped == njobs) {
    printf("%s: %s, %d rank(s): SKIPPED\n", g_prog, mode, nranks);
  } else {
    printf("%s: %s, %d rank(s): passed (%ld checked calls)\n", g_prog, mode, nranks, g_checked_calls);
  }
  fflush(stdout);
  pthread_mutex_unlock(&g_print_mu);
  if (failures) return 1;
  if (skipped == njobs) return FCCL_SKIP_EXIT;
  return 0;
}

static int parse_int_env(const char* name, int* out) {
  const char* s = getenv(name);
  char* end;
  long v;
  if (!s || !*s) return 0;
  v = strtol(s, &end, 10);
  if (*end) return 0;
  *out = (int)v;
  return 1;
}

/* The launchers fcclCommInitFromEnv understands, in its order (src/comm/from_env.rs):
 * the first whose rank variable is set gives the rank and the size. SLURM_PROCID alone
 * is a Slurm batch script, not a task of srun: it counts only with SLURM_STEP_NUM_TASKS. */
static const struct {
  const char* rank;
  const char* sizes[3];
  int needs_size;
} k_launchers[] = {
    {"FERROCCL_RANK", {"FERROCCL_WORLD_SIZE", NULL, NULL}, 0},
    {"RANK", {"WORLD_SIZE", NULL, NULL}, 0},
    {"OMPI_COMM_WORLD_RANK", {"OMPI_COMM_WORLD_SIZE", NULL, NULL}, 0},
    {"PMIX_RANK", {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS"}, 0},
    {"PMI_RANK", {"PMI_SIZE", NULL, NULL}, 0},
    {"SLURM_PROCID", {"SLURM_STEP_NUM_TASKS", NULL, NULL}, 1},
};

static int env_nonblank(const char* name) {
  const char* s = getenv(name);
  if (!s) return 0;
  while (*s == ' ' || *s == '\t' || *s == '\n') s++;
  return *s != 0;
}

/* Whether a launcher started this process, and the rank and size it says (-1 where
 * unset or unreadable: fcclCommInitFromEnv then reports the problem). */
static int launched_by(int* rank, int* size) {
  size_t i, j;
  *rank = -1;
  *size = -1;
  for (i = 0; i < sizeof k_launchers / sizeof k_launchers[0]; i++) {
    const char* size_var = NULL;
    if (!env_nonblank(k_launchers[i].rank)) continue;
    for (j = 0; j < 3 && k_launchers[i].sizes[j] && !size_var; j++)
      if (env_nonblank(k_launchers[i].sizes[j])) size_var = k_launchers[i].sizes[j];
    if (!size_var && k_launchers[i].needs_size) continue;
    (void)parse_int_env(k_launchers[i].rank, rank);
    if (size_var) (void)parse_int_env(size_var, size);
    return 1;
  }
  return 0;
}

static int run_threads(int n, fccl_body_fn body, fccl_multi_fn multi) {
  fcclComm_t* comms = (fcclComm_t*)calloc((size_t)n, sizeof(fcclComm_t));
  rank_job* jobs = (rank_job*)calloc((size_t)n, sizeof(rank_job));
  pthread_t* th = (pthread_t*)calloc((size_t)n, sizeof(pthread_t));
  int i, extra = 0, ok = 1;
  char mode[64];
  if (!comms || !jobs || !th) {
    printf("%s: out of memory\n", g_prog);
    return 1;
  }
  g_main_ctx.rank = -1;
  i = pre_init(-1, n);
  if (i >= 0) {
    free(comms);
    free(jobs);
    free(th);
    return i;
  }
  fccl_phase("fcclCommInitAll(%d)", n);
  if (!CHECK_OK(fcclCommInitAll(comms, n, g_devlist))) return 1;
  for (i = 0; i < n; i++) {
    int v = -2;
    CHECK(comms[i] != NULL, "fcclCommInitAll left comms[%d] NULL", i);
    if (!comms[i]) ok = 0;
    if (comms[i] && CHECK_OK(fcclCommCount(comms[i], &v)))
      CHECK(v == n, "fcclCommCount(comms[%d]) = %d, expected %d", i, v, n);
    v = -2;
    if (comms[i] && CHECK_OK(fcclCommUserRank(comms[i], &v)))
      CHECK(v == i, "fcclCommUserRank(comms[%d]) = %d, expected %d", i, v, i);
  }
  if (!ok) return 1;
  if (CHECK_OK(fcclGetUniqueId(&g_shared_id))) g_have_shared_id = 1;
  pthread_barrier_init(&g_barrier, NULL, (unsigned)n);
  if (multi) {
    fccl_phase("multi-communicator part (one thread)");
    i = multi(comms, n);
    if (i > extra) extra = i;
  }
  if (g_main_ctx.failures > extra) extra = g_main_ctx.failures;
  for (i = 0; i < n; i++) {
    jobs[i].body = body;
    jobs[i].comm = comms[i];
    jobs[i].rank = i;
    jobs[i].nranks = n;
    jobs[i].ctx.rank = i;
    jobs[i].ctx.failures = 0;
    if (pthread_create(&th[i], NULL, rank_thread, &jobs[i]) != 0) {
      printf("%s: pthread_create failed for rank %d\n", g_prog, i);
      _exit(1); /* the other ranks would hang in their first collective */
    }
  }
  for (i = 0; i < n; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&g_barrier);
  snprintf(mode, sizeof mode, "threads");
  i = finish(mode, n, jobs, n, extra);
  free(comms);
  free(jobs);
  free(th);
  return i;
}

static int run_process(fccl_body_fn body) {
  rank_job job;
  fcclComm_t comm = NULL;
  int rank = -1, n = -1, env_rank = -1, env_n = -1;
  memset(&job, 0, sizeof job);
  if (g_launched) {
    (void)launched_by(&env_rank, &env_n);
    g_main_ctx.rank = env_rank;
    if (g_pre_init) {
      int pre = pre_init(env_rank, env_n);
      if (pre >= 0) return pre;
    }
    fccl_phase("fcclCommInitFromEnv");
    if (!CHECK_OK(fcclCommInitFromEnv(&comm))) return 1;
  } else {
    fcclUniqueId id;
    g_main_ctx.rank = 0;
    if (g_pre_init) {
      int pre = pre_init(0, 1);
      if (pre >= 0) return pre;
    }
    fccl_phase("fcclGetUniqueId + fcclCommInitRank(1 rank)");
    if (!CHECK_OK(fcclGetUniqueId(&id))) return 1;
    if (!CHECK_OK(fcclCommInitRank(&comm, 1, id, 0))) return 1;
    env_rank = 0;
    env_n = 1;
  }
  if (!comm) {
    CHECK(0, "communicator initialisation returned fcclSuccess but a NULL comm");
    return 1;
  }
  if (!CHECK_OK(fcclCommUserRank(comm, &rank)) || !CHECK_OK(fcclCommCount(comm, &n))) return 1;
  g_main_ctx.rank = rank;
  CHECK(env_rank < 0 || rank == env_rank, "fcclCommUserRank = %d but the environment says %d",
        rank, env_rank);
  CHECK(env_n < 0 || n == env_n, "fcclCommCount = %d but the environment says %d", n, env_n);
  if (n < 1 || rank < 0 || rank >= n) return 1;
  g_nranks = n;
  job.body = body;
  job.comm = comm;
  job.rank = rank;
  job.nranks = n;
  job.ctx.rank = rank;
  job.ctx.failures = g_main_ctx.failures;
  set_ctx(&job.ctx);
  job.ret = run_body(&job);
  set_ctx(NULL);
  return finish(g_launched ? "process" : "single process", n, &job, 1, 0);
}

/* Parses "D0,D1,..." (non-negative ints) into a new array; returns its length, -1 if bad. */
static int parse_devlist(const char* s, int** out) {
  int n = 1, k = 0;
  const char* p;
  int* v;
  for (p = s; *p; p++)
    if (*p == ',') n++;
  v = (int*)calloc((size_t)n, sizeof(int));
  if (!v) return -1;
  p = s;
  while (k < n) {
    char* end;
    long d = strtol(p, &end, 10);
    if (end == p || d < 0 || d > 1000000 || (*end != ',' && *end != 0)) {
      free(v);
      return -1;
    }
    v[k++] = (int)d;
    p = *end ? end + 1 : end;
  }
  *out = v;
  return n;
}

int fccl_main_ex(int argc, char** argv, fccl_body_fn body, fccl_multi_fn multi) {
  int i, nthreads = 0, ndevlist = 0;
  const char* v = getenv("FCCL_TEST_VERBOSE");
  g_verbose = v && *v && strcmp(v, "0") != 0;
  if (argc > 0 && argv[0]) g_prog = base_name(argv[0]);
  setvbuf(stdout, NULL, _IOLBF, 0);
  for (i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc) {
      nthreads = atoi(argv[++i]);
      if (nthreads < 1) {
        printf("%s: --threads needs a positive count\n", g_prog);
        return 2;
      }
    } else if (strcmp(argv[i], "--devlist") == 0 && i + 1 < argc) {
      free(g_devlist);
      g_devlist = NULL;
      ndevlist = parse_devlist(argv[++i], &g_devlist);
      if (ndevlist < 1) {
        printf("%s: --devlist needs device ids separated by commas, e.g. 0,0,1\n", g_prog);
        return 2;
      }
    } else {
      printf("usage: %s [--threads N]   (or under ferroccl-run -n N, torchrun, mpirun or srun)\n",
             g_prog);
      return 2;
    }
  }
  if (g_devlist && (nthreads < 1 || ndevlist != nthreads)) {
    printf("%s: --devlist is for threads mode and needs one device id per rank "
           "(--threads %d, %d id(s) given)\n", g_prog, nthreads, ndevlist);
    return 2;
  }
  start_watchdog();
  if (nthreads > 0) {
    g_threads_mode = 1;
    g_nranks = nthreads;
    return run_threads(nthreads, body, multi);
  }
  {
    int r, n;
    g_launched = launched_by(&r, &n);
  }
  return run_process(body);
}

int fccl_main(int argc, char** argv, fccl_body_fn body) {
  return fccl_main_ex(argc, argv, body, NULL);
}

/* ================================================================== checks */

static const char* nn(const char* s) { return s ? s : "(NULL)"; }

const char* fccl_res_name(fcclResult_t res) {
  switch ((int)res) {
    case fcclSuccess: return "fcclSuccess";
    case fcclUnhandledCudaError: return "fcclUnhandledCudaError";
    case fcclSystemError: return "fcclSystemError";
    case fcclInternalError: return "fcclInternalError";
    case fcclInvalidArgument: return "fcclInvalidArgument";
    case fcclInvalidUsage: return "fcclInvalidUsage";
    case fcclRemoteError: return "fcclRemoteError";
    case fcclInProgress: return "fcclInProgress";
    case fcclTimeout: return "fcclTimeout";
    case fcclCollectiveMismatch: return "fcclCollectiveMismatch";
    case fcclUnavailable: return "fcclUnavailable";
    default: return "unknown result";
  }
}

static void copy_last_error(char* out, size_t n) {
  const char* le = fcclGetLastError(NULL);
  snprintf(out, n, "%s", nn(le));
}

int fccl_check_ok_at(fcclResult_t res, const char* call, const char* file, int line) {
  char le[1024];
  __sync_fetch_and_add(&g_checked_calls, 1);
  if (res == fcclSuccess) return 1;
  copy_last_error(le, sizeof le);
  fccl_fail_at(file, line, "%s returned %d (%s, \"%s\"); fcclGetLastError: \"%s\"", call,
               (int)res, fccl_res_name(res), nn(fcclGetErrorString(res)), le);
  return 0;
}

int fccl_check_res_at(fcclResult_t res, fcclResult_t want, const char* call, const char* file,
                      int line) {
  char le[1024];
  __sync_fetch_and_add(&g_checked_calls, 1);
  if (res == want) return 1;
  copy_last_error(le, sizeof le);
  fccl_fail_at(file, line, "%s returned %d (%s, \"%s\"), expected %d (%s); fcclGetLastError: \"%s\"",
               call, (int)res, fccl_res_name(res), nn(fcclGetErrorString(res)), (int)want,
               fccl_res_name(want), le);
  return 0;
}

int fccl_check_err_at(fcclResult_t res, fcclResult_t want1, fcclResult_t want2,
                      const char* fname, const char* call, const char* file, int line) {
  char le[1024];
  const char* raw = fcclGetLastError(NULL);
  int ok = 1;
  __sync_fetch_and_add(&g_checked_calls, 1);
  snprintf(le, sizeof le, "%s", nn(raw));
  if (res != want1 && res != want2) {
    if (want1 == want2)
      fccl_fail_at(file, line, "%s returned %d (%s), expected %d (%s); fcclGetLastError: \"%s\"",
                   call, (int)res, fccl_res_name(res), (int)want1, fccl_res_name(want1), le);
    else
      fccl_fail_at(file, line,
                   "%s returned %d (%s), expected %d (%s) or %d (%s); fcclGetLastError: \"%s\"",
                   call, (int)res, fccl_res_name(res), (int)want1, fccl_res_name(want1),
                   (int)want2, fccl_res_name(want2), le);
    ok = 0;
  }
  if (res != fcclSuccess) {
    if (!raw || !raw[0]) {
      fccl_fail_at(file, line, "%s: fcclGetLastError(NULL) is %s after an error", call,
                   raw ? "empty" : "NULL");
      ok = 0;
    } else if (fname && !strstr(raw, fname)) {
      fccl_fail_at(file, line, "%s: fcclGetLastError(NULL) = \"%s\" does not name %s", call, le,
                   fname);
      ok = 0;
    }
  }
  return ok;
}

/* ================================================================== data types */

const fcclDataType_t fccl_types[FCCL_NTYPES] = {
    fcclInt8,    fcclUint8,   fcclInt32,   fcclUint32,     fcclInt64,      fcclUint64,
    fcclFloat16, fcclFloat32, fcclFloat64, fcclBfloat16, fcclFloat8e4m3, fcclFloat8e5m2};
const fcclRedOp_t fccl_ops[FCCL_NOPS] = {fcclSum, fcclProd, fcclMax, fcclMin, fcclAvg};
const fcclRedOp_t fccl_bitops[FCCL_NBITOPS] = {fcclBand, fcclBor, fcclBxor};

size_t fccl_dt_size(fcclDataType_t dt) {
  switch ((int)dt) {
    case fcclInt8: case fcclUint8: case fcclFloat8e4m3: case fcclFloat8e5m2: return 1;
    case fcclFloat16: case fcclBfloat16: return 2;
    case fcclInt32: case fcclUint32: case fcclFloat32: return 4;
    case fcclInt64: case fcclUint64: case fcclFloat64: return 8;
    default: return 0;
  }
}

const char* fccl_dt_name(fcclDataType_t dt) {
  switch ((int)dt) {
    case fcclInt8: return "fcclInt8";
    case fcclUint8: return "fcclUint8";
    case fcclInt32: return "fcclInt32";
    case fcclUint32: return "fcclUint32";
    case fcclInt64: return "fcclInt64";
    case fcclUint64: return "fcclUint64";
    case fcclFloat16: return "fcclFloat16";
    case fcclFloat32: return "fcclFloat32";
    case fcclFloat64: return "fcclFloat64";
    case fcclBfloat16: return "fcclBfloat16";
    case fcclFloat8e4m3: return "fcclFloat8e4m3";
    case fcclFloat8e5m2: return "fcclFloat8e5m2";
    default: return "unknown-type";
  }
}

const char* fccl_op_name(fcclRedOp_t op) {
  switch ((int)op) {
    case fcclSum: return "fcclSum";
    case fcclProd: return "fcclProd";
    case fcclMax: return "fcclMax";
    case fcclMin: return "fcclMin";
    case fcclAvg: return "fcclAvg";
    case fcclBand: return "fcclBand";
    case fcclBor: return "fcclBor";
    case fcclBxor: return "fcclBxor";
    default: return "unknown-op";
  }
}

int fccl_dt_is_float(fcclDataType_t dt) {
  switch ((int)dt) {
    case fcclFloat16: case fcclFloat32: case fcclFloat64: case fcclBfloat16:
    case fcclFloat8e4m3: case fcclFloat8e5m2: return 1;
    default: return 0;
  }
}

int fccl_dt_is_signed_int(fcclDataType_t dt) {
  switch ((int)dt) {
    case fcclInt8: case fcclInt32: case fcclInt64: return 1;
    default: return 0;
  }
}

/* ---- minifloats: one generic binary encoder/decoder ---- */

typedef struct {
  int ebits, mbits, bias;
  int ieee; /* 1: all-ones exponent is inf/NaN; 0: OCP "fn" (only S.1..1.1..1 is NaN) */
} minifmt;

static const minifmt F16 = {5, 10, 15, 1};
static const minifmt BF16 = {8, 7, 127, 1};
static const minifmt E4M3 = {4, 3, 7, 0};
static const minifmt E5M2 = {5, 2, 15, 1};

static double mini_max(const minifmt* f) {
  int emaxfield = (1 << f->ebits) - (f->ieee ? 2 : 1);
  double frac = f->ieee ? 2.0 - ldexp(1.0, -f->mbits) : 2.0 - ldexp(2.0, -f->mbits);
  return ldexp(frac, emaxfield - f->bias);
}

static uint32_t mini_max_bits(const minifmt* f) {
  uint32_t emaxfield = (1u << f->ebits) - (f->ieee ? 2u : 1u);
  uint32_t man = (1u << f->mbits) - (f->ieee ? 1u : 2u);
  return (emaxfield << f->mbits) | man;
}

static uint32_t mini_encode(double v, const minifmt* f) {
  uint32_t sbit = 0, exp, man;
  int e, emin = 1 - f->bias;
  double q, r, fl, d, val;
  if (v != v) /* NaN */
    return f->ieee ? (((1u << f->ebits) - 1u) << f->mbits) | (1u << (f->mbits - 1))
                   : (1u << (f->ebits + f->mbits)) - 1u;
  if (signbit(v)) {
    sbit = 1u << (f->ebits + f->mbits);
    v = -v;
  }
  if (v == 0.0) return sbit;
  if (isinf(v))
    return sbit | (f->ieee ? ((1u << f->ebits) - 1u) << f->mbits : mini_max_bits(f));
  (void)frexp(v, &e);
  e -= 1; /* v in [2^e, 2^(e+1)) */
  if (e < emin) e = emin;
  q = ldexp(1.0, e - f->mbits); /* spacing of representable values around v */
  r = v / q;
  fl = floor(r);
  d = r - fl;
  if (d > 0.5 || (d == 0.5 && fmod(fl, 2.0) != 0.0)) fl += 1.0;
  val = fl * q;
  if (val > mini_max(f))
    return sbit | (f->ieee ? ((1u << f->ebits) - 1u) << f->mbits : mini_max_bits(f));
  if (val == 0.0) return sbit;
  (void)frexp(val, &e);
  e -= 1;
  if (e < emin) { /* subnormal */
    man = (uint32_t)(val / ldexp(1.0, emin - f->mbits));
    return sbit | man;
  }
  exp = (uint32_t)(e + f->bias);
  man = (uint32_t)(val / ldexp(1.0, e - f->mbits)) - (1u << f->mbits);
  return sbit | (exp << f->mbits) | man;
}

static double mini_decode(uint32_t bits, const minifmt* f) {
  uint32_t sign = (bits >> (f->ebits + f->mbits)) & 1u;
  uint32_t expf = (bits >> f->mbits) & ((1u << f->ebits) - 1u);
  uint32_t man = bits & ((1u << f->mbits) - 1u);
  uint32_t allone = (1u << f->ebits) - 1u;
  double val;
  if (f->ieee && expf == allone) {
    val = man ? (double)NAN : (double)INFINITY;
  } else if (!f->ieee && expf == allone && man == (1u << f->mbits) - 1u) {
    val = (double)NAN;
  } else if (expf == 0) {
    val = ldexp((double)man, 1 - f->bias - f->mbits);
  } else {
    val = ldexp((double)((1u << f->mbits) + man), (int)expf - f->bias - f->mbits);
  }
  return sign ? -val : val;
}

uint16_t fccl_f16_from_double(double v) { return (uint16_t)mini_encode(v, &F16); }
double fccl_f16_to_double(uint16_t b) { return mini_decode(b, &F16); }
uint16_t fccl_bf16_from_double(double v) { return (uint16_t)mini_encode(v, &BF16); }
double fccl_bf16_to_double(uint16_t b) { return mini_decode(b, &BF16); }
uint8_t fccl_e4m3_from_double(double v) { return (uint8_t)mini_encode(v, &E4M3); }
double fccl_e4m3_to_double(uint8_t b) { return mini_decode(b, &E4M3); }
uint8_t fccl_e5m2_from_double(double v) { return (uint8_t)mini_encode(v, &E5M2); }
double fccl_e5m2_to_double(uint8_t b) { return mini_decode(b, &E5M2); }

void fccl_store_f(fcclDataType_t dt, void* buf, size_t i, double v) {
  unsigned char* p = (unsigned char*)buf;
  switch ((int)dt) {
    case fcclFloat32: {
      float f = (float)v;
      memcpy(p + i * 4, &f, 4);
      break;
    }
    case fcclFloat64: memcpy(p + i * 8, &v, 8); break;
    case fcclFloat16: {
      uint16_t h = fccl_f16_from_double(v);
      memcpy(p + i * 2, &h, 2);
      break;
    }
    case fcclBfloat16: {
      uint16_t h = fccl_bf16_from_double(v);
      memcpy(p + i * 2, &h, 2);
      break;
    }
    case fcclFloat8e4m3: p[i] = fccl_e4m3_from_double(v); break;
    case fcclFloat8e5m2: p[i] = fccl_e5m2_from_double(v); break;
    default: fccl_store_i(dt, buf, i, (uint64_t)(int64_t)v); break;
  }
}

double fccl_load_f(fcclDataType_t dt, const void* buf, size_t i) {
  const unsigned char* p = (const unsigned char*)buf;
  switch ((int)dt) {
    case fcclFloat32: {
      float f;
      memcpy(&f, p + i * 4, 4);
      return (double)f;
    }
    case fcclFloat64: {
      double d;
      memcpy(&d, p + i * 8, 8);
      return d;
    }
    case fcclFloat16: {
      uint16_t h;
      memcpy(&h, p + i * 2, 2);
      return fccl_f16_to_double(h);
    }
    case fcclBfloat16: {
      uint16_t h;
      memcpy(&h, p + i * 2, 2);
      return fccl_bf16_to_double(h);
    }
    case fcclFloat8e4m3: return fccl_e4m3_to_double(p[i]);
    case fcclFloat8e5m2: return fccl_e5m2_to_double(p[i]);
    default: {
      uint64_t u = fccl_load_i(dt, buf, i);
      if (fccl_dt_is_signed_int(dt)) return (double)(int64_t)u;
      return (double)u;
    }
  }
}

void fccl_store_i(fcclDataType_t dt, void* buf, size_t i, uint64_t v) {
  unsigned char* p = (unsigned char*)buf;
  switch (fccl_dt_size(dt)) {
    case 1: p[i] = (unsigned char)(v & 0xffu); break;
    case 2: {
      uint16_t x = (uint16_t)(v & 0xffffu);
      memcpy(p + i * 2, &x, 2);
      break;
    }
    case 4: {
      uint32_t x = (uint32_t)(v & 0xffffffffu);
      memcpy(p + i * 4, &x, 4);
      break;
    }
    case 8: memcpy(p + i * 8, &v, 8); break;
    default: break;
  }
}

uint64_t fccl_load_i(fcclDataType_t dt, const void* buf, size_t i) {
  const unsigned char* p = (const unsigned char*)buf;
  int sgn = fccl_dt_is_signed_int(dt);
  switch (fccl_dt_size(dt)) {
    case 1: {
      uint64_t v = p[i];
      return (sgn && (v & 0x80u)) ? (v | ~(uint64_t)0xffu) : v;
    }
    case 2: {
      uint16_t x;
      memcpy(&x, p + i * 2, 2);
      return x;
    }
    case 4: {
      uint32_t x;
      uint64_t v;
      memcpy(&x, p + i * 4, 4);
      v = x;
      return (sgn && (v & 0x80000000u)) ? (v | ~(uint64_t)0xffffffffu) : v;
    }
    case 8: {
      uint64_t v;
      memcpy(&v, p + i * 8, 8);
      return v;
    }
    default: return 0;
  }
}

static int64_t as_i64(uint64_t u) {
  return u <= (uint64_t)INT64_MAX ? (int64_t)u : -(int64_t)(~u) - 1;
}

static uint64_t raw_bits(fcclDataType_t dt, const void* p) {
  uint64_t v = 0;
  size_t n = fccl_dt_size(dt);
  const unsigned char* b = (const unsigned char*)p;
  size_t k;
  for (k = 0; k < n; k++) v |= (uint64_t)b[k] << (8 * k); /* little-endian hosts only */
  return v;
}

void fccl_format_elem(fcclDataType_t dt, const void* buf, size_t i, char* out, size_t outsz) {
  size_t esz = fccl_dt_size(dt);
  const unsigned char* p = (const unsigned char*)buf + i * esz;
  uint64_t bits = raw_bits(dt, p);
  if (fccl_dt_is_float(dt)) {
    snprintf(out, outsz, "%.9g (0x%0*" PRIx64 ")", fccl_load_f(dt, buf, i), (int)(2 * esz), bits);
  } else if (fccl_dt_is_signed_int(dt)) {
    snprintf(out, outsz, "%" PRId64, as_i64(fccl_load_i(dt, buf, i)));
  } else {
    snprintf(out, outsz, "%" PRIu64, fccl_load_i(dt, buf, i));
  }
}

uint64_t fccl_ulp_dist(fcclDataType_t dt, const void* a, const void* b) {
  size_t esz = fccl_dt_size(dt);
  uint64_t ba = raw_bits(dt, a), bb = raw_bits(dt, b);
  uint64_t signbit = (uint64_t)1 << (8 * esz - 1);
  uint64_t ma = ba & (signbit - 1), mb = bb & (signbit - 1);
  int sa = (ba & signbit) != 0, sb = (bb & signbit) != 0;
  if (sa == sb) return ma > mb ? ma - mb : mb - ma;
  return ma + mb; /* across zero: +0 and -0 are 0 apart */
}

/* ================================================================== patterns */

static uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

int fccl_scheme_for_op(fcclRedOp_t op) {
  switch ((int)op) {
    case fcclProd: return FCCL_SCHEME_PROD;
    case fcclMax: case fcclMin: return FCCL_SCHEME_FULL;
    /* every bit of every element random, so each bit position is checked */
    case fcclBand: case fcclBor: case fcclBxor: return FCCL_SCHEME_FULL;
    default: return FCCL_SCHEME_SUM;
  }
}

void* fccl_xmalloc(size_t bytes) {
  void* p = malloc(bytes ? bytes : 1);
  if (!p) {
    printf("%s: out of memory allocating %zu bytes\n", g_prog, bytes);
    fflush(stdout);
    _exit(1);
  }
  return p;
}

void fccl_pattern_init(fccl_pattern* p, fcclDataType_t dt, int scheme) {
  static const int64_t sprod[6] = {1, -1, 2, 1, -1, 1};
  static const uint64_t uprod[4] = {1, 2, 3, 1};
  static const double fprod[4] = {1.0, -1.0, 2.0, 0.5};
  size_t k;
  int sgn = fccl_dt_is_signed_int(dt);
  p->dt = dt;
  p->esz = fccl_dt_size(dt);
  p->scheme = scheme;
  p->bytes = (unsigned char*)fccl_xmalloc(FCCL_PERIOD * p->esz);
  for (k = 0; k < FCCL_PERIOD; k++) {
    uint64_t h = splitmix64(((uint64_t)(unsigned)dt << 56) ^ ((uint64_t)(unsigned)scheme << 48) ^ k);
    if (fccl_dt_is_float(dt)) {
      double v;
      if (scheme == FCCL_SCHEME_SUM) {
        v = ((double)(int)(h % 81u) - 40.0) / 4.0;
      } else if (scheme == FCCL_SCHEME_PROD) {
        v = fprod[h % 4u];
      } else {
        int m = (int)(h % 1601u) - 800;
        int e = (int)((h >> 20) % 9u) - 4;
        v = ldexp((double)m / 4.0, e);
      }
      fccl_store_f(dt, p->bytes, k, v);
    } else {
      uint64_t v;
      if (scheme == FCCL_SCHEME_SUM) {
        v = sgn ? (uint64_t)((int64_t)(h % 19u) - 9) : h % 19u;
      } else if (scheme == FCCL_SCHEME_PROD) {
        v = sgn ? (uint64_t)sprod[h % 6u] : uprod[h % 4u];
      } else {
        v = h;
        if ((h >> 59) == 0) { /* 1 in 32: extremes */
          unsigned bits = (unsigned)(8 * p->esz);
          uint64_t umax = bits == 64 ? ~(uint64_t)0 : (((uint64_t)1 << bits) - 1);
          switch ((h >> 8) % 4u) {
            case 0: v = 0; break;
            case 1: v = sgn ? umax >> 1 : umax; break;          /* max */
            case 2: v = sgn ? (umax >> 1) + 1 : 0; break;       /* min */
            default: v = sgn ? ~(uint64_t)0 : umax - 1; break;  /* -1 / max-1 */
          }
        }
      }
      fccl_store_i(dt, p->bytes, k, v);
    }
  }
}

void fccl_pattern_free(fccl_pattern* p) {
  free(p->bytes);
  p->bytes = NULL;
}

void fccl_pattern_fill(const fccl_pattern* p, void* buf, size_t count, size_t off) {
  unsigned char* out = (unsigned char*)buf;
  size_t k = off % FCCL_PERIOD;
  while (count > 0) {
    size_t n = FCCL_PERIOD - k;
    if (n > count) n = count;
    memcpy(out, p->bytes + k * p->esz, n * p->esz);
    out += n * p->esz;
    count -= n;
    k = 0;
  }
}

size_t fccl_pattern_check_at(const fccl_pattern* p, const void* buf, size_t count, size_t off,
                             const char* file, int line, const char* what) {
  const unsigned char* got = (const unsigned char*)buf;
  size_t k = off % FCCL_PERIOD, i = 0, bad = 0, first = 0;
  char g[96], e[96];
  while (i < count) {
    size_t n = FCCL_PERIOD - k, j;
    if (n > count - i) n = count - i;
    if (memcmp(got + i * p->esz, p->bytes + k * p->esz, n * p->esz) != 0) {
      for (j = 0; j < n; j++) {
        if (memcmp(got + (i + j) * p->esz, p->bytes + (k + j) * p->esz, p->esz) != 0) {
          if (bad == 0) first = i + j;
          if (bad < 3) {
            fccl_format_elem(p->dt, got, i + j, g, sizeof g);
            fccl_format_elem(p->dt, p->bytes, k + j, e, sizeof e);
            fccl_fail_at(file, line, "%s: element %zu of %zu: expected %s, got %s", what, i + j,
                         count, e, g);
          }
          bad++;
        }
      }
    }
    i += n;
    k = 0;
  }
  if (bad > 3)
    fccl_fail_at(file, line, "%s: %zu of %zu elements wrong in all (first at %zu)", what, bad,
                 count, first);
  return bad;
}

/* ================================================================== references */

static uint64_t norm_int(fcclDataType_t dt, uint64_t v) {
  unsigned char tmp[8];
  fccl_store_i(dt, tmp, 0, v);
  return fccl_load_i(dt, tmp, 0);
}

void fccl_ref_init(fccl_ref* R, const fccl_pattern* in, fcclRedOp_t op, int nranks) {
  const size_t P = FCCL_PERIOD, S = FCCL_RANK_STRIDE % FCCL_PERIOD;
  fcclDataType_t dt = in->dt;
  size_t k;
  int r;
  R->dt = dt;
  R->op = op;
  R->esz = in->esz;
  R->nranks = nranks;
  R->bytes = (unsigned char*)fccl_xmalloc(P * in->esz);
  R->exact = NULL;
  if (fccl_dt_is_float(dt)) {
    double* d = (double*)fccl_xmalloc(P * sizeof(double));
    R->exact = (double*)fccl_xmalloc(P * sizeof(double));
    for (k = 0; k < P; k++) d[k] = fccl_load_f(dt, in->bytes, k);
    for (k = 0; k < P; k++) {
      size_t idx = k;
      double acc = d[idx];
      for (r = 1; r < nranks; r++) {
        double x;
        idx += S;
        if (idx >= P) idx -= P;
        x = d[idx];
        switch ((int)op) {
          case fcclProd: acc *= x; break;
          case fcclMax: acc = x > acc ? x : acc; break;
          case fcclMin: acc = x < acc ? x : acc; break;
          default: acc += x; break;
        }
      }
      if (op == fcclAvg) acc /= (double)nranks;
      R->exact[k] = acc;
      fccl_store_f(dt, R->bytes, k, acc);
    }
    free(d);
  } else {
    int sgn = fccl_dt_is_signed_int(dt);
    uint64_t* u = (uint64_t*)fccl_xmalloc(P * sizeof(uint64_t));
    for (k = 0; k < P; k++) u[k] = fccl_load_i(dt, in->bytes, k);
    for (k = 0; k < P; k++) {
      size_t idx = k;
      uint64_t acc = u[idx];
      for (r = 1; r < nranks; r++) {
        uint64_t x;
        idx += S;
        if (idx >= P) idx -= P;
        x = u[idx];
        switch ((int)op) {
          case fcclProd: acc *= x; break;
          case fcclMax:
            if (sgn ? as_i64(x) > as_i64(acc) : x > acc) acc = x;
            break;
          case fcclMin:
            if (sgn ? as_i64(x) < as_i64(acc) : x < acc) acc = x;
            break;
          case fcclBand: acc &= x; break;
          case fcclBor: acc |= x; break;
          case fcclBxor: acc ^= x; break;
          default: acc += x; break;
        }
      }
      if (op == fcclAvg) {
        uint64_t s = norm_int(dt, acc); /* the wrapped sum, sign-extended */
        if (sgn)
          acc = (uint64_t)(as_i64(s) / (int64_t)nranks);
        else
          acc = s / (uint64_t)nranks;
      }
      fccl_store_i(dt, R->bytes, k, acc);
    }
    free(u);
  }
}

void fccl_ref_free(fccl_ref* R) {
  free(R->bytes);
  free(R->exact);
  R->bytes = NULL;
  R->exact = NULL;
}

size_t fccl_ref_check_at(const fccl_ref* R, const void* gotv, size_t count, size_t off,
                         const char* file, int line, const char* what) {
  const unsigned char* got = (const unsigned char*)gotv;
  size_t esz = R->esz, k = off % FCCL_PERIOD, i, bad = 0, first = 0;
  int isf = fccl_dt_is_float(R->dt);
  int wide = R->dt == fcclFloat32 || R->dt == fcclFloat64;
  char g[96], e[96];
  for (i = 0; i < count; i++, k = (k + 1 == FCCL_PERIOD) ? 0 : k + 1) {
    const unsigned char* pg = got + i * esz;
    const unsigned char* pe = R->bytes + k * esz;
    int ok;
    if (memcmp(pg, pe, esz) == 0) continue;
    if (!isf) {
      ok = 0;
    } else if (R->op != fcclAvg) {
      ok = fccl_load_f(R->dt, pg, 0) == fccl_load_f(R->dt, pe, 0);
    } else if (wide) {
      double gv = fccl_load_f(R->dt, pg, 0), ev = R->exact[k];
      ok = fabs(gv - ev) <= 1e-6 * (fabs(ev) > 1.0 ? fabs(ev) : 1.0);
    } else {
      ok = fccl_load_f(R->dt, pg, 0) == fccl_load_f(R->dt, pg, 0) && /* not NaN */
           fccl_ulp_dist(R->dt, pg, pe) <= 1;
    }
    if (ok) continue;
    if (bad == 0) first = i;
    if (bad < 3) {
      fccl_format_elem(R->dt, pg, 0, g, sizeof g);
      fccl_format_elem(R->dt, pe, 0, e, sizeof e);
      if (isf)
        fccl_fail_at(file, line, "%s: element %zu of %zu: expected %s (exact %.17g), got %s", what,
                     i, count, e, R->exact[k], g);
      else
        fccl_fail_at(file, line, "%s: element %zu of %zu: expected %s, got %s", what, i, count, e,
                     g);
    }
    bad++;
  }
  if (bad > 3)
    fccl_fail_at(file, line, "%s: %zu of %zu elements wrong in all (first at %zu)", what, bad,
                 count, first);
  return bad;
}

/* ================================================================== buffers */

size_t fccl_bytes_check_at(const void* buf, size_t n, unsigned char v, const char* file, int line,
                           const char* what) {
  const unsigned char* p = (const unsigned char*)buf;
  size_t i, bad = 0, first = 0;
  for (i = 0; i < n; i++) {
    if (p[i] != v) {
      if (!bad) first = i;
      bad++;
    }
  }
  if (bad)
    fccl_fail_at(file, line, "%s: %zu of %zu bytes changed (first at byte %zu: 0x%02x, expected 0x%02x)",
                 what, bad, n, first, p[first], v);
  return bad;
}

/* ================================================================== shapes */

size_t fccl_shape_prod(const size_t* shape, int lo, int hi) {
  size_t p = 1;
  int k;
  for (k = lo; k < hi; k++) p *= shape[k];
  return p;
}

void fccl_shape_str(char* out, size_t n, int ndims, const size_t* shape) {
  size_t used = 0;
  int k;
  out[0] = 0;
  for (k = 0; k < ndims && used < n; k++) {
    int w = snprintf(out + used, n - used, "%s%zu", k ? "x" : "", shape[k]);
    if (w < 0) break;
    used += (size_t)w;
  }
}
