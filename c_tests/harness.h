/* Contract-test harness for ferroccl.
 *
 * Every test is one program with a body `int body(fcclComm_t comm, int rank, int nranks)`
 * that returns its number of failures (or FCCL_SKIP).  fccl_main() runs it:
 *   - process mode: under `ferroccl-run -n N prog`, the launcher sets FERROCCL_RANK,
 *     FERROCCL_WORLD_SIZE, ...; each process calls fcclCommInitFromEnv and runs the body
 *     once.  Without the launcher (FERROCCL_RANK unset) the program is a single rank
 *     (fcclGetUniqueId + fcclCommInitRank(&comm, 1, id, 0)).
 *   - threads mode: `prog --threads N`: fcclCommInitAll(comms, N, NULL), one pthread per
 *     rank running the body with comms[r].
 * Exit status: 0 passed, 1 failed, 77 skipped (ctest SKIP_RETURN_CODE).
 *
 * The body must make the same sequence of collective calls on every rank whatever the
 * outcome of its checks, so a failed check never makes another rank hang.
 *
 * References are computed here, independently of the library: element values come from
 * periodic tables (period FCCL_PERIOD, a prime, so misplaced chunks show up), and rank r
 * reads the table rotated by r * FCCL_RANK_STRIDE, which lets every rank compute every
 * other rank's input and the reduction of all of them in O(FCCL_PERIOD * nranks). */
#ifndef FCCL_TEST_HARNESS_H
#define FCCL_TEST_HARNESS_H

#ifndef _POSIX_C_SOURCE
#define _POSIX_C_SOURCE 200809L
#endif

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ferroccl.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ running */

#define FCCL_SKIP_EXIT 77
#define FCCL_SKIP (-77) /* body return value: nothing was tested */

typedef int (*fccl_body_fn)(fcclComm_t comm, int rank, int nranks);
/* Threads mode only: called once from the main thread with all N communicators before
 * the per-rank bodies run (used to drive several communicators from one thread). */
typedef int (*fccl_multi_fn)(fcclComm_t* comms, int nranks);

int fccl_main(int argc, char** argv, fccl_body_fn body);
int fccl_main_ex(int argc, char** argv, fccl_body_fn body, fccl_multi_fn multi);

/* Device selection (used by test_device; tests that do not call these behave as before).
 *
 * fccl_set_pre_init(fn): fccl_main calls fn once per process, after parsing the arguments
 * and before any communicator exists (process mode: before fcclCommInitFromEnv /
 * fcclCommInitRank, on the thread that then runs the body; threads mode: before
 * fcclCommInitAll, on the main thread).  rank: this process's rank from the environment
 * (0 for a single unlaunched process; -1 in threads mode); nranks: the world size
 * (-1 when the environment does not say); devlist: threads mode with --devlist: the
 * nranks device ids, which fn may change (e.g. map a device the machine lacks to 0);
 * else NULL.  fn returns 0 to go on, FCCL_SKIP to skip the test (exit 77 without creating
 * a communicator), or a positive number of failures (exit 1).
 *
 * Threads mode, `prog --threads N --devlist D0,D1,...` (N ids, repeats allowed): the
 * communicators are made with fcclCommInitAll(comms, N, devlist) instead of
 * fcclCommInitAll(comms, N, NULL).  The rank threads make their device current themselves. */
typedef int (*fccl_pre_init_fn)(int rank, int nranks, int* devlist);
void fccl_set_pre_init(fccl_pre_init_fn fn);
/* The --devlist given in threads mode (after fn's changes), nranks entries; NULL otherwise. */
const int* fccl_devlist(void);

int fccl_threads_mode(void);          /* 1 under --threads */
int fccl_process_launched(void);      /* 1 under the launcher */
/* Threads mode: a unique id created by the main thread before the bodies start, for one
 * more nranks-rank communicator (every thread passes it with its own rank).  NULL in
 * process mode. */
const fcclUniqueId* fccl_shared_id(void);
/* Threads mode: a pthread barrier over the N rank threads.  Process mode: fcclBarrier on
 * the given comm.  Used to order local-only steps (not a test of fcclBarrier). */
void fccl_sync(fcclComm_t comm);

/* Non-blocking communicators: polls fcclCommGetAsyncError(comm) as NCCL's documentation
 * shows until it no longer reports fcclInProgress; returns what it then reports (or the
 * failing fcclCommGetAsyncError's own result).  The watchdog names the phase on a hang. */
fcclResult_t fccl_wait_comm(fcclComm_t comm);

/* Name of the current step, shown by the watchdog if the test hangs and with
 * FCCL_TEST_VERBOSE=1 in the environment. */
void fccl_phase(const char* fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* ------------------------------------------------------------------ checks */

void fccl_fail_at(const char* file, int line, const char* fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 3, 4)))
#endif
    ;
int fccl_failures(void); /* failures of the calling rank so far */
int fccl_cur_rank(void); /* rank of the calling thread (-1: main thread in threads mode) */

/* Each returns 1 when the check held. */
int fccl_check_ok_at(fcclResult_t res, const char* call, const char* file, int line);
int fccl_check_res_at(fcclResult_t res, fcclResult_t want, const char* call, const char* file,
                      int line);
/* res must be want1 or want2 (pass the same twice for one), fcclGetLastError(NULL) must be
 * non-empty and contain fname. */
int fccl_check_err_at(fcclResult_t res, fcclResult_t want1, fcclResult_t want2,
                      const char* fname, const char* call, const char* file, int line);

#define CHECK(cond, ...)                                    \
  do {                                                      \
    if (!(cond)) fccl_fail_at(__FILE__, __LINE__, __VA_ARGS__); \
  } while (0)
/* The call must return fcclSuccess. */
#define CHECK_OK(call) fccl_check_ok_at((call), #call, __FILE__, __LINE__)
/* The call must return exactly `want`. */
#define CHECK_RES(call, want) fccl_check_res_at((call), (want), #call, __FILE__, __LINE__)
/* A bad call: must return `want` and leave a last-error message naming `fname`. */
#define CHECK_ERR(call, want, fname) \
  fccl_check_err_at((call), (want), (want), (fname), #call, __FILE__, __LINE__)
#define CHECK_ERR2(call, want1, want2, fname) \
  fccl_check_err_at((call), (want1), (want2), (fname), #call, __FILE__, __LINE__)

const char* fccl_res_name(fcclResult_t res);

/* ------------------------------------------------------------------ data types */

#define FCCL_NTYPES 12
#define FCCL_NOPS 5
extern const fcclDataType_t fccl_types[FCCL_NTYPES];
extern const fcclRedOp_t fccl_ops[FCCL_NOPS];
/* ferroccl's bitwise operators (fcclBand, fcclBor, fcclBxor): integer types only. */
#define FCCL_NBITOPS 3
extern const fcclRedOp_t fccl_bitops[FCCL_NBITOPS];

size_t fccl_dt_size(fcclDataType_t dt); /* 0 for unknown */
const char* fccl_dt_name(fcclDataType_t dt);
const char* fccl_op_name(fcclRedOp_t op);
int fccl_dt_is_float(fcclDataType_t dt);
int fccl_dt_is_signed_int(fcclDataType_t dt);

/* Encoders round to nearest, ties to even.  E4M3 is OCP "fn" (no inf, NaN = S.1111.111,
 * max 448) and saturates to +-448; E5M2 is IEEE-like (overflow -> inf). */
uint16_t fccl_f16_from_double(double v);
double fccl_f16_to_double(uint16_t bits);
uint16_t fccl_bf16_from_double(double v);
double fccl_bf16_to_double(uint16_t bits);
uint8_t fccl_e4m3_from_double(double v);
double fccl_e4m3_to_double(uint8_t bits);
uint8_t fccl_e5m2_from_double(double v);
double fccl_e5m2_to_double(uint8_t bits);

/* Element access.  Float types go through double (rounded once, as above); integer types
 * through uint64_t (truncated on store, sign-extended on load for signed types). */
void fccl_store_f(fcclDataType_t dt, void* buf, size_t i, double v);
double fccl_load_f(fcclDataType_t dt, const void* buf, size_t i);
void fccl_store_i(fcclDataType_t dt, void* buf, size_t i, uint64_t v);
uint64_t fccl_load_i(fcclDataType_t dt, const void* buf, size_t i);
/* Human-readable element: value and raw bits. */
void fccl_format_elem(fcclDataType_t dt, const void* buf, size_t i, char* out, size_t outsz);
/* Distance in units in the last place between two float elements (0 if equal values). */
uint64_t fccl_ulp_dist(fcclDataType_t dt, const void* a, const void* b);

/* ------------------------------------------------------------------ patterns */

#define FCCL_PERIOD ((size_t)65521)     /* prime */
#define FCCL_RANK_STRIDE ((size_t)7919) /* rank r's data is rotated by r * stride */

enum {
  FCCL_SCHEME_SUM = 0, /* small values: sums exact, no integer overflow below 8 ranks */
  FCCL_SCHEME_PROD = 1, /* {1,-1,2} / {1,2,3} / {1,-1,2,0.5}: exact products */
  FCCL_SCHEME_FULL = 2  /* full integer range (wrapping sums), wide float range */
};

typedef struct {
  fcclDataType_t dt;
  size_t esz;
  int scheme;
  unsigned char* bytes; /* FCCL_PERIOD elements */
} fccl_pattern;

int fccl_scheme_for_op(fcclRedOp_t op);
void fccl_pattern_init(fccl_pattern* p, fcclDataType_t dt, int scheme);
void fccl_pattern_free(fccl_pattern* p);
/* buf[i] = pattern[(off + i) % FCCL_PERIOD] for i < count. */
void fccl_pattern_fill(const fccl_pattern* p, void* buf, size_t count, size_t off);
/* Checks buf against the pattern; reports the first mismatches; returns their number. */
size_t fccl_pattern_check_at(const fccl_pattern* p, const void* buf, size_t count, size_t off,
                             const char* file, int line, const char* what);
#define PATTERN_CHECK(p, buf, count, off, what) \
  fccl_pattern_check_at((p), (buf), (count), (off), __FILE__, __LINE__, (what))

static inline size_t fccl_rank_off(size_t base, int rank) {
  return base + (size_t)rank * FCCL_RANK_STRIDE;
}

/* ref[k] = op over r < nranks of pattern[(k + r * FCCL_RANK_STRIDE) % FCCL_PERIOD]:
 * element i of the reduction of rank inputs filled with offset fccl_rank_off(base, r)
 * is ref[(base + i) % FCCL_PERIOD].  Integers wrap; integer avg is the wrapped sum
 * divided by nranks with C truncation; float references are the exact result rounded
 * once to the element type. */
typedef struct {
  fcclDataType_t dt;
  fcclRedOp_t op;
  size_t esz;
  int nranks;
  unsigned char* bytes; /* FCCL_PERIOD elements, encoded */
  double* exact;        /* float types: the unrounded value */
} fccl_ref;

void fccl_ref_init(fccl_ref* r, const fccl_pattern* in, fcclRedOp_t op, int nranks);
void fccl_ref_free(fccl_ref* r);
/* Compares got[i] with ref element (off + i): integers exactly; floats by value (sum,
 * prod, max, min) or, for avg, within 1e-6 relative (float32/64) or 1 ulp (narrow). */
size_t fccl_ref_check_at(const fccl_ref* r, const void* got, size_t count, size_t off,
                         const char* file, int line, const char* what);
#define REF_CHECK(r, got, count, off, what) \
  fccl_ref_check_at((r), (got), (count), (off), __FILE__, __LINE__, (what))

/* ------------------------------------------------------------------ shapes */

/* Product of shape[lo..hi) (1 for an empty range). */
size_t fccl_shape_prod(const size_t* shape, int lo, int hi);
/* "2x3x4" into out (at most n bytes, NUL-terminated). */
void fccl_shape_str(char* out, size_t n, int ndims, const size_t* shape);

/* ------------------------------------------------------------------ buffers */

#define FCCL_SLACK 64 /* sentinel bytes kept after every receive buffer */
#define FCCL_SENT_RECV 0xA5
#define FCCL_SENT_GAP 0x5A

void* fccl_xmalloc(size_t bytes); /* exits the test if out of memory; never NULL */
/* Reports the first byte of buf[0..n) that is not v; returns the number of such bytes. */
size_t fccl_bytes_check_at(const void* buf, size_t n, unsigned char v, const char* file,
                           int line, const char* what);
#define BYTES_CHECK(buf, n, v, what) \
  fccl_bytes_check_at((buf), (n), (v), __FILE__, __LINE__, (what))

/* The large count: not a multiple of any power of two or small chunk size. */
#define FCCL_BIG_COUNT ((size_t)1000003)
/* Per-rank count for collectives whose buffers hold nranks blocks: keeps buffers near
 * FCCL_BIG_COUNT elements whatever the world size; odd. */
static inline size_t fccl_big_per_rank(int nranks) {
  return (FCCL_BIG_COUNT / (size_t)nranks) | 1u;
}

/* Which (type, op) pairs of a reducing test also run at FCCL_BIG_COUNT (every pair runs
 * the small counts): sums of every type, every op of float32, uint8 and bfloat16. */
static inline int fccl_big_case_wanted(fcclDataType_t dt, fcclRedOp_t op) {
  return op == fcclSum || dt == fcclFloat32 || dt == fcclUint8 || dt == fcclBfloat16;
}

#ifdef __cplusplus
}
#endif

#endif
