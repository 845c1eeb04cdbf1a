/*
 * ferroccl/nccl.h: NCCL source compatibility for ferroccl.
 *
 * Hand-written (not generated): a program written against NCCL's host API compiles
 * unchanged against ferroccl with this header in place of NCCL's nccl.h, and links with
 * -lferroccl instead of -lnccl.
 */

/**
 * @file nccl.h
 * @brief NCCL's API mapped onto ferroccl: compile NCCL programs unchanged.
 *
 * Use it in either of two ways:
 *   - `#include <ferroccl/nccl.h>`, or
 *   - leave the program's `#include <nccl.h>` as it is and put
 *     `<prefix>/include/ferroccl` on the include path (CMake: link
 *     `ferroccl::nccl`; pkg-config: `ferroccl-nccl`).
 *
 * Every NCCL function is a `static inline` wrapper with NCCL's exact signature that
 * calls the `fccl` function of the same meaning, so the library exports no `nccl*`
 * symbol and cannot collide with a real libnccl in the same process. Values of
 * ncclResult_t, ncclDataType_t and ncclRedOp_t are NCCL's, which are also ferroccl's.
 *
 * **Version.** The `NCCL_*` version macros describe the NCCL API this header mirrors,
 * **NCCL 2.28**: NCCL_MAJOR 2, NCCL_MINOR 28, NCCL_PATCH 0, NCCL_VERSION_CODE 22800,
 * and ncclGetVersion() reports the same number, so version checks such as
 * `#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 19, 0)` select the code paths whose
 * functions this header provides. ferroccl's own version is FCCL_MAJOR, FCCL_MINOR,
 * FCCL_PATCH and FCCL_VERSION_CODE (from ferroccl.h) and fcclGetVersion(); the
 * compatibility layer itself is identified by FERROCCL_NCCL_COMPAT.
 *
 * **Differences from NCCL** (see docs/api.md for the full list):
 *   - ncclComm_t handles and fcclComm_t handles are the same objects;
 *     fcclCommFromNccl() / ncclCommFromFccl() convert, so ferroccl's extensions
 *     (fcclAllGatherV, ...) can be used on a communicator made through this header.
 *   - ncclResult_t may hold ferroccl's own codes: fcclCollectiveMismatch (100) and
 *     fcclUnavailable (101, also returned by the NCCL features ferroccl does not have:
 *     ncclRedOpCreatePreMulSum, ncclCommShrink, ncclGroupSimulateEnd). ncclTimeout (8)
 *     is NCCL >= 2.29's value for the same condition. In C++ the enum has `int` as its
 *     fixed underlying type so these values are valid.
 *   - Of ncclConfig_t, `blocking` and `commName` are honoured; the other fields are
 *     tuning knobs of NCCL's GPU kernels and are accepted and ignored.
 *   - ncclCommRegister and ncclCommWindowRegister succeed without doing anything
 *     (registration is an optimisation in NCCL; ferroccl needs none).
 *   - cudaStream_t: CUDA's `struct CUstream_st*`, the same type as fcclStream_t. When
 *     `<cuda_runtime.h>` is available it is included, as NCCL's header does (define
 *     FERROCCL_NCCL_NO_CUDA_RUNTIME to prevent that); otherwise cudaStream_t is declared
 *     here so host-memory programs build with no CUDA installed. (With that macro, in
 *     C99, include <cuda_runtime.h> before this header: C99 forbids repeating a typedef.)
 */

#ifndef FERROCCL_NCCL_H
#define FERROCCL_NCCL_H

#if defined(NCCL_H_)
#error "ferroccl/nccl.h: NCCL's own nccl.h was included first; include only one of them"
#endif
/* NCCL's include guard: a later #include of a real nccl.h becomes a no-op. */
#define NCCL_H_

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

/* Relative to this file, so both `-I<prefix>/include` and `-I<prefix>/include/ferroccl`
 * work. */
#include "../ferroccl.h"

/* ------------------------------------------------------------------ CUDA types */

#if !defined(FERROCCL_NCCL_NO_CUDA_RUNTIME) && defined(__has_include)
#if __has_include(<cuda_runtime.h>)
#include <cuda_runtime.h>
#endif
#endif

/* CUDA's driver_types.h (pulled in by cuda_runtime.h) declares cudaStream_t under
 * this guard; declare the identical type only when it has not. */
#if !defined(__DRIVER_TYPES_H__) && !defined(FERROCCL_CUDA_STREAM_T_DEFINED)
#define FERROCCL_CUDA_STREAM_T_DEFINED
/** CUDA's stream type (`struct CUstream_st*`), the same type as fcclStream_t. */
typedef struct CUstream_st* cudaStream_t;
#endif

/* ------------------------------------------------------------------ versions */

/** Set by this header: the program is compiled against ferroccl's NCCL layer. */
#define FERROCCL_NCCL_COMPAT 1

/** Major version of the NCCL API mirrored (2.28). */
#define NCCL_MAJOR 2
/** Minor version of the NCCL API mirrored (2.28). */
#define NCCL_MINOR 28
/** Patch level of the NCCL API mirrored. */
#define NCCL_PATCH 0
/** NCCL's version suffix; names ferroccl so printed versions are not mistaken for NCCL. */
#define NCCL_SUFFIX "+ferroccl"

/** NCCL's version encoding (for X.Y.Z after 2.8: X*10000 + Y*100 + Z). */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
/** The mirrored NCCL version, 22800; also what ncclGetVersion() reports. */
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

/* ------------------------------------------------------------------ types */

#ifdef __cplusplus
extern "C" {
#endif

/**
 * Opaque communicator handle (NCCL's `struct ncclComm*`). The object behind it is a
 * ferroccl communicator: see fcclCommFromNccl().
 */
typedef struct ncclComm* ncclComm_t;
/** NCCL's null communicator. */
#define NCCL_COMM_NULL NULL

/** NCCL's memory-window handle (ncclCommWindowRegister); not dereferenced by ferroccl. */
typedef struct ncclWindow_vidmem* ncclWindow_t;

/** Bytes in a ncclUniqueId (128, as NCCL and ferroccl). */
#define NCCL_UNIQUE_ID_BYTES 128
/** The rendezvous handle: ferroccl's fcclUniqueId (`struct { char internal[128]; }`). */
typedef fcclUniqueId ncclUniqueId;

/**
 * Result codes: NCCL's values. Calls may also return ferroccl's fcclCollectiveMismatch
 * (100) and fcclUnavailable (101); ncclGetErrorString() describes every value.
 */
typedef enum
#if defined(__cplusplus)
    : int
#endif
{ ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclTimeout = 8, /**< a wait exceeded the communicator's timeout (NCCL >= 2.29's value) */
  ncclNumResults = 9 } ncclResult_t;

/** An int field of ncclConfig_t left at its default. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
/** A pointer field of ncclConfig_t left at its default. */
#define NCCL_CONFIG_UNDEF_PTR NULL
/** Colour for ncclCommSplit: this rank joins no new communicator. */
#define NCCL_SPLIT_NOCOLOR FCCL_SPLIT_NOCOLOR
/** A float left undefined (ncclSimInfo_t). */
#define NCCL_UNDEF_FLOAT -1.0f
/** Magic of ncclConfig_t (NCCL internal use). */
#define NCCL_API_MAGIC 0xcafebeef

/** ncclCommWindowRegister flags (accepted, ignored). */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/** ncclConfig_t.CTAPolicy values (accepted, ignored). */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/** ncclCommShrink flags. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/**
 * Communicator options, NCCL 2.28's layout. ferroccl honours `blocking` and `commName`;
 * every other field is accepted and ignored. Initialise with NCCL_CONFIG_INITIALIZER.
 */
typedef struct ncclConfig_v22800 {
  size_t size;           /**< sizeof(ncclConfig_t), set by NCCL_CONFIG_INITIALIZER */
  unsigned int magic;    /**< NCCL_API_MAGIC, set by NCCL_CONFIG_INITIALIZER */
  unsigned int version;  /**< NCCL_VERSION_CODE, set by NCCL_CONFIG_INITIALIZER */
  int blocking;          /**< 1 (default) or 0; passed to fcclConfig_t.blocking */
  int cgaClusterSize;    /**< ignored */
  int minCTAs;           /**< ignored */
  int maxCTAs;           /**< ignored */
  const char* netName;   /**< ignored */
  int splitShare;        /**< ignored */
  int trafficClass;      /**< ignored */
  const char* commName;  /**< passed to fcclConfig_t.commName (names the comm in logs) */
  int collnetEnable;     /**< ignored */
  int CTAPolicy;         /**< ignored */
  int shrinkShare;       /**< ignored */
  int nvlsCTAs;          /**< ignored */
  int nChannelsPerNetPeer; /**< ignored */
  int nvlinkCentricSched;  /**< ignored */
} ncclConfig_t;

/** Initialiser for ncclConfig_t: every field at its default (NCCL's macro). */
#define NCCL_CONFIG_INITIALIZER {                                       \
  sizeof(ncclConfig_t),                     /* size */                  \
  NCCL_API_MAGIC,                           /* magic */                 \
  NCCL_VERSION_CODE,                        /* version */               \
  NCCL_CONFIG_UNDEF_INT,                    /* blocking */              \
  NCCL_CONFIG_UNDEF_INT,                    /* cgaClusterSize */        \
  NCCL_CONFIG_UNDEF_INT,                    /* minCTAs */               \
  NCCL_CONFIG_UNDEF_INT,                    /* maxCTAs */               \
  NCCL_CONFIG_UNDEF_PTR,                    /* netName */               \
  NCCL_CONFIG_UNDEF_INT,                    /* splitShare */            \
  NCCL_CONFIG_UNDEF_INT,                    /* trafficClass */          \
  NCCL_CONFIG_UNDEF_PTR,                    /* commName */              \
  NCCL_CONFIG_UNDEF_INT,                    /* collnetEnable */         \
  NCCL_CONFIG_UNDEF_INT,                    /* CTAPolicy */             \
  NCCL_CONFIG_UNDEF_INT,                    /* shrinkShare */           \
  NCCL_CONFIG_UNDEF_INT,                    /* nvlsCTAs */              \
  NCCL_CONFIG_UNDEF_INT,                    /* nChannelsPerNetPeer */   \
  NCCL_CONFIG_UNDEF_INT                     /* nvlinkCentricSched */    \
}

/** ncclGroupSimulateEnd's result (NCCL's layout). */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

/** Initialiser for ncclSimInfo_t (NCCL's macro). */
#define NCCL_SIM_INFO_INITIALIZER {                                  \
  sizeof(ncclSimInfo_t),                     /* size */              \
  0x74685283,                                /* magic */             \
  NCCL_VERSION_CODE,                         /* version */           \
  NCCL_UNDEF_FLOAT                           /* estimated time */    \
}

/** Reduction operators: NCCL's (and ferroccl's) values. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum { ncclSum = 0,
               ncclProd = 1,
               ncclMax = 2,
               ncclMin = 3,
               ncclAvg = 4, /**< sum / nranks (integer division for integer types) */
               ncclNumOps = 5,
               ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/** Element types: NCCL's (and ferroccl's) values. */
typedef enum { ncclInt8 = 0, ncclChar = 0,
               ncclUint8 = 1,
               ncclInt32 = 2, ncclInt = 2,
               ncclUint32 = 3,
               ncclInt64 = 4,
               ncclUint64 = 5,
               ncclFloat16 = 6, ncclHalf = 6,
               ncclFloat32 = 7, ncclFloat = 7,
               ncclFloat64 = 8, ncclDouble = 8,
               ncclBfloat16 = 9,
               ncclFloat8e4m3 = 10,
               ncclFloat8e5m2 = 11,
               ncclNumTypes = 12
} ncclDataType_t;

/** Where ncclRedOpCreatePreMulSum's scalar lives (NCCL's values). */
typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

/* ------------------------------------------------------------------ helpers */

/* The wrappers are static inline: no symbol of this header reaches any object file
 * unless it is used, and none is ever exported. */
#if defined(__GNUC__) || defined(__clang__)
#define FERROCCL_NCCL_API static inline __attribute__((unused))
#else
#define FERROCCL_NCCL_API static inline
#endif
/* Casts that stay quiet under C++'s -Wold-style-cast. */
#ifdef __cplusplus
#define FERROCCL_NCCL_CAST(T, x) static_cast<T>(x)
#define FERROCCL_NCCL_PCAST(T, x) reinterpret_cast<T>(x)
#else
#define FERROCCL_NCCL_CAST(T, x) ((T)(x))
#define FERROCCL_NCCL_PCAST(T, x) ((T)(void*)(x))
#endif

/** The ferroccl communicator behind an NCCL handle (same object, no copy). */
FERROCCL_NCCL_API fcclComm_t fcclCommFromNccl(ncclComm_t comm) { return FERROCCL_NCCL_PCAST(fcclComm_t, comm); }
/** The NCCL handle of a ferroccl communicator (same object, no copy). */
FERROCCL_NCCL_API ncclComm_t ncclCommFromFccl(fcclComm_t comm) { return FERROCCL_NCCL_PCAST(ncclComm_t, comm); }

/* fcclResult_t -> ncclResult_t: the same values (a function, not a cast of a call, so
 * -Wbad-function-cast stays quiet). */
FERROCCL_NCCL_API ncclResult_t ferroccl_nccl_res(fcclResult_t r) { return FERROCCL_NCCL_CAST(ncclResult_t, r); }
#define FERROCCL_NCCL_RES(x) ferroccl_nccl_res(x)

/* ncclConfig_t -> fcclConfig_t: blocking and commName; NULL stays NULL. magic is passed
 * through (NCCL_API_MAGIC == FCCL_CONFIG_MAGIC) and a config too small to be an
 * ncclConfig_t is passed on with its size, so the library rejects a config that was
 * not made by NCCL_CONFIG_INITIALIZER with a message, as NCCL rejects it. */
FERROCCL_NCCL_API fcclConfig_t* ferroccl_nccl_config(const ncclConfig_t* in, fcclConfig_t* out) {
  fcclConfig_t def = FCCL_CONFIG_INITIALIZER;
  if (in == NULL) return NULL;
  *out = def;
  out->magic = in->magic;
  if (in->size < offsetof(ncclConfig_t, commName) + sizeof(const char*)) {
    out->size = in->size;
    return out;
  }
  out->blocking = in->blocking;
  out->commName = in->commName;
  return out;
}

/* ------------------------------------------------------------------ memory */

/** fcclMemAlloc: CUDA device memory (fcclUnavailable without CUDA). */
FERROCCL_NCCL_API ncclResult_t ncclMemAlloc(void** ptr, size_t size) {
  return FERROCCL_NCCL_RES(fcclMemAlloc(ptr, size));
}
/** fcclMemFree: frees ncclMemAlloc's (or fcclMemAllocHost's) memory; NULL is a no-op. */
FERROCCL_NCCL_API ncclResult_t ncclMemFree(void* ptr) { return FERROCCL_NCCL_RES(fcclMemFree(ptr)); }

/* ------------------------------------------------------------------ communicators */

/**
 * Writes NCCL_VERSION_CODE (the mirrored NCCL API, 22800) to `*version`, after checking
 * that libferroccl answers. ferroccl's own version: fcclGetVersion().
 */
FERROCCL_NCCL_API ncclResult_t ncclGetVersion(int* version) {
  int v = 0;
  fcclResult_t r;
  if (version == NULL) return FERROCCL_NCCL_RES(fcclGetVersion(NULL));
  r = fcclGetVersion(&v);
  if (r == fcclSuccess) *version = NCCL_VERSION_CODE;
  return FERROCCL_NCCL_RES(r);
}

/** fcclGetUniqueId: the rendezvous point lives in the calling process. */
FERROCCL_NCCL_API ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId) {
  return FERROCCL_NCCL_RES(fcclGetUniqueId(uniqueId));
}

/** fcclCommInitRankConfig with ncclConfig_t's blocking and commName. */
FERROCCL_NCCL_API ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId,
                                                      int rank, ncclConfig_t* config) {
  fcclConfig_t fc;
  fcclConfig_t* p = ferroccl_nccl_config(config, &fc);
  return FERROCCL_NCCL_RES(
      fcclCommInitRankConfig(FERROCCL_NCCL_PCAST(fcclComm_t*, comm), nranks, commId, rank, p));
}

/** fcclCommInitRank. */
FERROCCL_NCCL_API ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank) {
  return FERROCCL_NCCL_RES(fcclCommInitRank(FERROCCL_NCCL_PCAST(fcclComm_t*, comm), nranks, commId, rank));
}

/**
 * NCCL's scalable init with nId ids: every rank passes the same list, so the first id
 * names the one rendezvous ferroccl needs.
 */
FERROCCL_NCCL_API ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                                        ncclUniqueId* commIds, ncclConfig_t* config) {
  if (nId < 1 || commIds == NULL) return ncclInvalidArgument;
  return ncclCommInitRankConfig(newcomm, nranks, commIds[0], myrank, config);
}

/**
 * fcclCommInitAll: `ndev` ranks in this process. `devlist` NULL makes host-memory
 * ranks (NCCL would take the first ndev GPUs); a device list needs CUDA.
 */
FERROCCL_NCCL_API ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist) {
  return FERROCCL_NCCL_RES(fcclCommInitAll(FERROCCL_NCCL_PCAST(fcclComm_t*, comm), ndev, devlist));
}

/** fcclCommFinalize. */
FERROCCL_NCCL_API ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return FERROCCL_NCCL_RES(fcclCommFinalize(fcclCommFromNccl(comm)));
}
/** fcclCommDestroy. */
FERROCCL_NCCL_API ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return FERROCCL_NCCL_RES(fcclCommDestroy(fcclCommFromNccl(comm)));
}
/** fcclCommAbort. */
FERROCCL_NCCL_API ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return FERROCCL_NCCL_RES(fcclCommAbort(fcclCommFromNccl(comm)));
}

/** fcclCommSplit; `config` NULL inherits the parent's options. */
FERROCCL_NCCL_API ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                                             ncclConfig_t* config) {
  fcclConfig_t fc;
  fcclConfig_t* p = ferroccl_nccl_config(config, &fc);
  return FERROCCL_NCCL_RES(
      fcclCommSplit(fcclCommFromNccl(comm), color, key, FERROCCL_NCCL_PCAST(fcclComm_t*, newcomm), p));
}

/**
 * Not available in ferroccl (the excluded ranks would have to take part): returns
 * fcclUnavailable. Use ncclCommSplit with NCCL_SPLIT_NOCOLOR on the excluded ranks.
 */
FERROCCL_NCCL_API ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                                              ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags) {
  (void)comm; (void)excludeRanksList; (void)excludeRanksCount; (void)config; (void)shrinkFlags;
  if (newcomm != NULL) *newcomm = NULL;
  return FERROCCL_NCCL_RES(fcclUnavailable);
}

/** fcclGetErrorString: a fixed description of any result value. */
FERROCCL_NCCL_API const char* ncclGetErrorString(ncclResult_t result) {
  return fcclGetErrorString(FERROCCL_NCCL_CAST(fcclResult_t, result));
}

/** fcclGetLastError: this thread's last error message (the call, the values, the cause). */
FERROCCL_NCCL_API const char* ncclGetLastError(ncclComm_t comm) {
  return fcclGetLastError(fcclCommFromNccl(comm));
}

/** No-op: ferroccl reads FERROCCL_DEBUG when a communicator is created. */
FERROCCL_NCCL_API void ncclResetDebugInit(void) {}

/** fcclCommGetAsyncError. */
FERROCCL_NCCL_API ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError) {
  fcclResult_t e = fcclSuccess;
  fcclResult_t r = fcclCommGetAsyncError(fcclCommFromNccl(comm), asyncError == NULL ? NULL : &e);
  if (r == fcclSuccess && asyncError != NULL) *asyncError = FERROCCL_NCCL_RES(e);
  return FERROCCL_NCCL_RES(r);
}

/** fcclCommCount. */
FERROCCL_NCCL_API ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return FERROCCL_NCCL_RES(fcclCommCount(fcclCommFromNccl(comm), count));
}
/** fcclCommCuDevice: -1 for host-memory ranks. */
FERROCCL_NCCL_API ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device) {
  return FERROCCL_NCCL_RES(fcclCommCuDevice(fcclCommFromNccl(comm), device));
}
/** fcclCommUserRank. */
FERROCCL_NCCL_API ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return FERROCCL_NCCL_RES(fcclCommUserRank(fcclCommFromNccl(comm), rank));
}

/**
 * Buffer registration is an optimisation in NCCL that ferroccl does not need: checks
 * `comm` and the arguments, sets `*handle` to `buff` and returns ncclSuccess.
 */
FERROCCL_NCCL_API ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle) {
  int n = 0;
  fcclResult_t r = fcclCommCount(fcclCommFromNccl(comm), &n);
  (void)size;
  if (r != fcclSuccess) return FERROCCL_NCCL_RES(r);
  if (handle == NULL) return ncclInvalidArgument;
  *handle = buff;
  return ncclSuccess;
}
/** Releases a ncclCommRegister handle (nothing to do). */
FERROCCL_NCCL_API ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle) {
  int n = 0;
  (void)handle;
  return FERROCCL_NCCL_RES(fcclCommCount(fcclCommFromNccl(comm), &n));
}

/** Like ncclCommRegister: accepted, nothing to do; `*win` is an opaque non-NULL value. */
FERROCCL_NCCL_API ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size,
                                                      ncclWindow_t* win, int winFlags) {
  int n = 0;
  fcclResult_t r = fcclCommCount(fcclCommFromNccl(comm), &n);
  (void)size; (void)winFlags;
  if (r != fcclSuccess) return FERROCCL_NCCL_RES(r);
  if (win == NULL) return ncclInvalidArgument;
  *win = FERROCCL_NCCL_CAST(ncclWindow_t, buff);
  return ncclSuccess;
}
/** Releases a ncclCommWindowRegister window (nothing to do). */
FERROCCL_NCCL_API ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win) {
  int n = 0;
  (void)win;
  return FERROCCL_NCCL_RES(fcclCommCount(fcclCommFromNccl(comm), &n));
}

/** Custom reduction operators are not available in ferroccl: returns fcclUnavailable. */
FERROCCL_NCCL_API ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                                        ncclScalarResidence_t residence, ncclComm_t comm) {
  (void)op; (void)scalar; (void)datatype; (void)residence; (void)comm;
  return FERROCCL_NCCL_RES(fcclUnavailable);
}
/** No operator can have been created: returns ncclInvalidArgument. */
FERROCCL_NCCL_API ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  (void)op; (void)comm;
  return ncclInvalidArgument;
}

/* ------------------------------------------------------------------ collectives */

#define FERROCCL_NCCL_DT(t) FERROCCL_NCCL_CAST(fcclDataType_t, t)
#define FERROCCL_NCCL_OP(o) FERROCCL_NCCL_CAST(fcclRedOp_t, o)

/** fcclReduce. */
FERROCCL_NCCL_API ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count,
                                          ncclDataType_t datatype, ncclRedOp_t op, int root,
                                          ncclComm_t comm, cudaStream_t stream) {
  return FERROCCL_NCCL_RES(fcclReduce(sendbuff, recvbuff, count, FERROCCL_NCCL_DT(datatype),
                                      FERROCCL_NCCL_OP(op), root, fcclCommFromNccl(comm), stream));
}

/** In-place broadcast (deprecated in NCCL): fcclBroadcast(buff, buff, ...). */
FERROCCL_NCCL_API ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root,
                                         ncclComm_t comm, cudaStream_t stream) {
  return FERROCCL_NCCL_RES(fcclBroadcast(buff, buff, count, FERROCCL_NCCL_DT(datatype), root,
                                         fcclCommFromNccl(comm), stream));
}

/** fcclBroadcast. */
FERROCCL_NCCL_API ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                                             ncclDataType_t datatype, int root, ncclComm_t comm,
                                             cudaStream_t stream) {
  return FERROCCL_NCCL_RES(fcclBroadcast(sendbuff, recvbuff, count, FERROCCL_NCCL_DT(datatype), root,
                                         fcclCommFromNccl(comm), stream));
}

/** fcclAllReduce. */
FERROCCL_NCCL_API ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                                             ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                             cudaStream_t stream) {
  return FERROCCL_NCCL_RES(fcclAllReduce(sendbuff, recvbuff, count, FERROCCL_NCCL_DT(datatype),
                                         FERROCCL_NCCL_OP(op), fcclCommFromNccl(comm), stream));
}

/** fcclReduceScatter. */
FERROCCL_NCCL_API ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                                 ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                                 cudaStream_t stream) {
  return FERROCCL_NCCL_RES(fcclReduceScatter(sendbuff, recvbuff, recvcount, FERROCCL_NCCL_DT(datatype),
                                             FERROCCL_NCCL_OP(op), fcclCommFromNccl(comm), stream));
}

/** fcclAllGather. */
FERROCCL_NCCL_API ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                                             ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return FERROCCL_NCCL_RES(fcclAllGather(sendbuff, recvbuff, sendcount, FERROCCL_NCCL_DT(datatype),
                                         fcclCommFromNccl(comm), stream));
}

/** fcclAlltoAll. */
FERROCCL_NCCL_API ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count,
                                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return FERROCCL_NCCL_RES(fcclAlltoAll(sendbuff, recvbuff, count, FERROCCL_NCCL_DT(datatype),
                                        fcclCommFromNccl(comm), stream));
}

/** fcclGather. */
FERROCCL_NCCL_API ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count,
                                          ncclDataType_t datatype, int root, ncclComm_t comm,
                                          cudaStream_t stream) {
  return FERROCCL_NCCL_RES(fcclGather(sendbuff, recvbuff, count, FERROCCL_NCCL_DT(datatype), root,
                                      fcclCommFromNccl(comm), stream));
}

/** fcclScatter. */
FERROCCL_NCCL_API ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count,
                                           ncclDataType_t datatype, int root, ncclComm_t comm,
                                           cudaStream_t stream) {
  return FERROCCL_NCCL_RES(fcclScatter(sendbuff, recvbuff, count, FERROCCL_NCCL_DT(datatype), root,
                                       fcclCommFromNccl(comm), stream));
}

/** fcclSend. */
FERROCCL_NCCL_API ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype,
                                        int peer, ncclComm_t comm, cudaStream_t stream) {
  return FERROCCL_NCCL_RES(fcclSend(sendbuff, count, FERROCCL_NCCL_DT(datatype), peer,
                                    fcclCommFromNccl(comm), stream));
}

/** fcclRecv. */
FERROCCL_NCCL_API ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                                        ncclComm_t comm, cudaStream_t stream) {
  return FERROCCL_NCCL_RES(fcclRecv(recvbuff, count, FERROCCL_NCCL_DT(datatype), peer,
                                    fcclCommFromNccl(comm), stream));
}

/* ------------------------------------------------------------------ groups */

/** fcclGroupStart. */
FERROCCL_NCCL_API ncclResult_t ncclGroupStart(void) { return FERROCCL_NCCL_RES(fcclGroupStart()); }
/** fcclGroupEnd. */
FERROCCL_NCCL_API ncclResult_t ncclGroupEnd(void) { return FERROCCL_NCCL_RES(fcclGroupEnd()); }
/** Not available in ferroccl: returns fcclUnavailable and leaves the group open. */
FERROCCL_NCCL_API ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo) {
  (void)simInfo;
  return FERROCCL_NCCL_RES(fcclUnavailable);
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FERROCCL_NCCL_H */
