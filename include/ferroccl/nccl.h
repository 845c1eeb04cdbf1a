/*
 * ferroccl/nccl.h: NCCL 2.28's API, served by ferroccl's libnccl.so.2.
 *
 * Hand-written (not generated) from NCCL 2.28's published API: the same types, values,
 * struct layouts and function prototypes, so that a program written for NCCL compiles
 * against it unchanged and links ferroccl's NCCL library (libferroccl_nccl.so, installed
 * as <prefix>/lib/ferroccl/libnccl.so.2 with a libnccl.so link):
 *
 *   cc app.c -I<prefix>/include/ferroccl -L<prefix>/lib/ferroccl -lnccl
 *
 * Binaries built against NVIDIA's nccl.h run on the same library unchanged (LD_PRELOAD
 * or LD_LIBRARY_PATH). See docs/nccl.md.
 */

/**
 * @file nccl.h
 * @brief NCCL 2.28's API (types, values, prototypes) for ferroccl's libnccl.so.2.
 *
 * Every function declared here is exported by ferroccl's libnccl.so.2 under its own
 * name and its `pnccl` profiling name, as NCCL's library does. Functions that have a
 * meaning on ferroccl call it; the others return ncclInvalidUsage and say why in
 * ncclGetLastError(). docs/nccl.md lists which is which.
 *
 * **Version.** NCCL_MAJOR/MINOR/PATCH give the NCCL version whose ABI the library
 * provides (2.28.9), and ncclGetVersion() reports NCCL_VERSION_CODE (22809).
 * FERROCCL_NCCL_COMPAT tells a program it is compiled against this header.
 *
 * **Results** are NCCL 2.28's codes only. ferroccl's own conditions map onto them: a
 * timeout waiting for peers is ncclRemoteError, ranks calling mismatched collectives
 * is ncclInvalidUsage, a missing CUDA is ncclUnhandledCudaError; the message of
 * ncclGetLastError() names the exact cause.
 *
 * **Communicators** are ferroccl communicators: ncclCommInitAll() with `devlist` NULL
 * makes host-memory ranks, and any buffer may be host memory or CUDA device memory.
 * Of ncclConfig_t, `blocking` and `commName` are honoured; the other fields tune NCCL's
 * GPU kernels and are accepted and ignored.
 *
 * **cudaStream_t** is CUDA's `struct CUstream_st*`. When `<cuda_runtime.h>` is
 * available it is included, as NCCL's header does (define FERROCCL_NCCL_NO_CUDA_RUNTIME
 * to prevent that); otherwise the type is declared here so that host-memory programs
 * build with no CUDA installed. (With that macro, in C99, include <cuda_runtime.h> before
 * this header: C99 forbids repeating a typedef.)
 */

#ifndef FERROCCL_NCCL_H
#define FERROCCL_NCCL_H

#if defined(NCCL_H_)
#error "ferroccl/nccl.h: another nccl.h was included first; include only one of them"
#endif
/* NCCL's include guard: a later #include of another nccl.h becomes a no-op. */
#define NCCL_H_

#include <limits.h>
#include <stddef.h>

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
/** CUDA's stream type (`struct CUstream_st*`); host-memory calls take NULL. */
typedef struct CUstream_st* cudaStream_t;
#endif

/* ------------------------------------------------------------------ versions */

/** Set by this header (2: the library form, exporting NCCL's functions). */
#define FERROCCL_NCCL_COMPAT 2

/** Major version of the NCCL ABI provided. */
#define NCCL_MAJOR 2
/** Minor version of the NCCL ABI provided. */
#define NCCL_MINOR 28
/** Patch level of the NCCL ABI provided. */
#define NCCL_PATCH 9
/** NCCL's version suffix; names ferroccl so that printed versions are not mistaken for NVIDIA's. */
#define NCCL_SUFFIX "+ferroccl"

/** NCCL's version encoding: X*1000 + Y*100 + Z up to 2.8, X*10000 + Y*100 + Z after. */
#define NCCL_VERSION(X, Y, Z) \
  (((X) <= 2 && (Y) <= 8) ? (X) * 1000 + (Y) * 100 + (Z) : (X) * 10000 + (Y) * 100 + (Z))
/** 22809: what ncclGetVersion() reports. */
#define NCCL_VERSION_CODE NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH)

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------ types */

/** Opaque communicator handle. */
typedef struct ncclComm* ncclComm_t;
/** Opaque memory-window handle (ncclCommWindowRegister). */
typedef struct ncclWindow_vidmem* ncclWindow_t;
/** The null communicator. */
#define NCCL_COMM_NULL NULL

/** Bytes in an ncclUniqueId. */
#define NCCL_UNIQUE_ID_BYTES 128
/** The rendezvous handle from ncclGetUniqueId(): opaque, safe to copy between processes. */
typedef struct { char internal[NCCL_UNIQUE_ID_BYTES]; } ncclUniqueId;

/** Result codes (NCCL 2.28's). */
typedef enum {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
  ncclNumResults = 8
} ncclResult_t;

/** An int field of ncclConfig_t left at its default. */
#define NCCL_CONFIG_UNDEF_INT INT_MIN
/** A pointer field of ncclConfig_t left at its default. */
#define NCCL_CONFIG_UNDEF_PTR NULL
/** Colour for ncclCommSplit(): this rank joins no new communicator. */
#define NCCL_SPLIT_NOCOLOR -1
/** A float left undefined (ncclSimInfo_t). */
#define NCCL_UNDEF_FLOAT -1.0f
/** The value of the `magic` field that NCCL_CONFIG_INITIALIZER writes. */
#define NCCL_API_MAGIC 0xcafebeef

/** ncclCommWindowRegister() flags. */
#define NCCL_WIN_DEFAULT 0x00
#define NCCL_WIN_COLL_SYMMETRIC 0x01
/** Alignment NCCL asks of window buffers. */
#define NCCL_WIN_REQUIRED_ALIGNMENT 4096

/** ncclConfig_t.CTAPolicy values (accepted, ignored). */
#define NCCL_CTA_POLICY_DEFAULT 0x00
#define NCCL_CTA_POLICY_EFFICIENCY 0x01
#define NCCL_CTA_POLICY_ZERO 0x02

/** ncclCommShrink() flags. */
#define NCCL_SHRINK_DEFAULT 0x00
#define NCCL_SHRINK_ABORT 0x01

/** ncclCommRevoke() flags. */
#define NCCL_REVOKE_DEFAULT 0x00

/**
 * Communicator options, NCCL 2.28's layout (80 bytes on LP64). Initialise with
 * NCCL_CONFIG_INITIALIZER, then set fields. ferroccl honours `blocking` and `commName`.
 */
typedef struct ncclConfig_v22800 {
  size_t size;             /**< sizeof(ncclConfig_t), set by the initialiser */
  unsigned int magic;      /**< NCCL_API_MAGIC, set by the initialiser */
  unsigned int version;    /**< NCCL_VERSION_CODE, set by the initialiser */
  int blocking;            /**< 1 (default): calls return when done; 0: non-blocking */
  int cgaClusterSize;      /**< ignored */
  int minCTAs;             /**< ignored */
  int maxCTAs;             /**< ignored */
  const char* netName;     /**< ignored */
  int splitShare;          /**< ignored */
  int trafficClass;        /**< ignored */
  const char* commName;    /**< names the communicator in logs and messages */
  int collnetEnable;       /**< ignored */
  int CTAPolicy;           /**< ignored */
  int shrinkShare;         /**< ignored */
  int nvlsCTAs;            /**< ignored */
  int nChannelsPerNetPeer; /**< ignored */
  int nvlinkCentricSched;  /**< ignored */
} ncclConfig_t;

/** Initialiser for ncclConfig_t: every option at its default. */
#define NCCL_CONFIG_INITIALIZER {                                       \
  sizeof(ncclConfig_t),                     /* size */                  \
  NCCL_API_MAGIC,                           /* magic */                 \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */       \
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

/** ncclGroupSimulateEnd()'s result (NCCL's layout). */
typedef struct ncclSimInfo_v22200 {
  size_t size;
  unsigned int magic;
  unsigned int version;
  float estimatedTime;
} ncclSimInfo_t;

/** Initialiser for ncclSimInfo_t. */
#define NCCL_SIM_INFO_INITIALIZER {                                      \
  sizeof(ncclSimInfo_t),                            /* size */           \
  0x74685283,                                       /* magic */          \
  NCCL_VERSION(NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH), /* version */        \
  NCCL_UNDEF_FLOAT                                  /* estimated time */ \
}

/** Reduction operators. */
typedef enum { ncclNumOps_dummy = 5 } ncclRedOp_dummy_t;
typedef enum {
  ncclSum = 0,
  ncclProd = 1,
  ncclMax = 2,
  ncclMin = 3,
  ncclAvg = 4, /**< sum / nranks (integer division for integer types) */
  ncclNumOps = 5,
  /** The largest value an operator handle can take (the enum's width). */
  ncclMaxRedOp = 0x7fffffff >> (32 - 8 * sizeof(ncclRedOp_dummy_t))
} ncclRedOp_t;

/** Element types. */
typedef enum {
  ncclInt8 = 0, ncclChar = 0,
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

/** Where ncclRedOpCreatePreMulSum()'s scalar lives. */
typedef enum { ncclScalarDevice = 0, ncclScalarHostImmediate = 1 } ncclScalarResidence_t;

#if defined(__GNUC__) || defined(__clang__)
#define FERROCCL_NCCL_DEPRECATED(msg) __attribute__((deprecated(msg)))
#else
#define FERROCCL_NCCL_DEPRECATED(msg)
#endif

/* ------------------------------------------------------------------ memory */

/** CUDA device memory on the current device (an error without CUDA). */
ncclResult_t ncclMemAlloc(void** ptr, size_t size);
ncclResult_t pncclMemAlloc(void** ptr, size_t size);
/** Frees ncclMemAlloc()'s memory; NULL is a no-op. */
ncclResult_t ncclMemFree(void* ptr);
ncclResult_t pncclMemFree(void* ptr);

/* ------------------------------------------------------------------ communicators */

/** Writes NCCL_VERSION_CODE of the ABI provided (22809) to `*version`. */
ncclResult_t ncclGetVersion(int* version);
ncclResult_t pncclGetVersion(int* version);

/** Makes a unique id; its rendezvous point lives in the calling process until every rank joined. */
ncclResult_t ncclGetUniqueId(ncclUniqueId* uniqueId);
ncclResult_t pncclGetUniqueId(ncclUniqueId* uniqueId);

/** Joins rank `rank` of `nranks` to the communicator of `commId`, with options (NULL: defaults). */
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                    ncclConfig_t* config);
ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank,
                                     ncclConfig_t* config);

/** Joins rank `rank` of `nranks` to the communicator of `commId`. */
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);
ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId commId, int rank);

/** `ndev` ranks in this process; `devlist` NULL makes host-memory ranks. */
ncclResult_t ncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);
ncclResult_t pncclCommInitAll(ncclComm_t* comm, int ndev, const int* devlist);

/** Waits for the communicator's outstanding work. */
ncclResult_t ncclCommFinalize(ncclComm_t comm);
ncclResult_t pncclCommFinalize(ncclComm_t comm);

/** Releases the communicator. */
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t pncclCommDestroy(ncclComm_t comm);

/** Ends the communicator from any thread; every blocked call on it returns. */
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t pncclCommAbort(ncclComm_t comm);

/** Not supported by ferroccl (ncclInvalidUsage): use ncclCommAbort(). */
ncclResult_t ncclCommRevoke(ncclComm_t comm, int revokeFlags);
ncclResult_t pncclCommRevoke(ncclComm_t comm, int revokeFlags);

/** Splits by `color` (NCCL_SPLIT_NOCOLOR: none), ranked by `key`; `config` NULL inherits. */
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);
ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm, ncclConfig_t* config);

/** Not supported by ferroccl (ncclInvalidUsage): use ncclCommSplit() with NCCL_SPLIT_NOCOLOR. */
ncclResult_t ncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                            ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);
ncclResult_t pncclCommShrink(ncclComm_t comm, int* excludeRanksList, int excludeRanksCount,
                             ncclComm_t* newcomm, ncclConfig_t* config, int shrinkFlags);

/** Initialisation from `nId` ids, the same on every rank (ferroccl uses the first). */
ncclResult_t ncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                      ncclUniqueId* commIds, ncclConfig_t* config);
ncclResult_t pncclCommInitRankScalable(ncclComm_t* newcomm, int nranks, int myrank, int nId,
                                       ncclUniqueId* commIds, ncclConfig_t* config);

/** A fixed description of any result value. */
const char* ncclGetErrorString(ncclResult_t result);
const char* pncclGetErrorString(ncclResult_t result);

/** This thread's last error message: the call, the values, the cause (`comm` may be NULL). */
const char* ncclGetLastError(ncclComm_t comm);
const char* pncclGetLastError(ncclComm_t comm);

/** Has no effect on ferroccl (log settings are read once per process). */
FERROCCL_NCCL_DEPRECATED("ncclResetDebugInit is not part of NCCL's supported API")
void ncclResetDebugInit(void);
FERROCCL_NCCL_DEPRECATED("pncclResetDebugInit is not part of NCCL's supported API")
void pncclResetDebugInit(void);

/** The communicator's asynchronous error (ncclSuccess, ncclInProgress or the failure). */
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);
ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* asyncError);

/** Number of ranks. */
ncclResult_t ncclCommCount(const ncclComm_t comm, int* count);
ncclResult_t pncclCommCount(const ncclComm_t comm, int* count);

/** The rank's CUDA device (-1 for host-memory ranks). */
ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int* device);
ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device);

/** This rank's index. */
ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank);
ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank);

/** Accepted: ferroccl needs no registration; `*handle` is set for ncclCommDeregister(). */
ncclResult_t ncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buff, size_t size, void** handle);
/** Releases an ncclCommRegister() handle. */
ncclResult_t ncclCommDeregister(const ncclComm_t comm, void* handle);
ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle);

/** Accepted: collectives on the buffer work as on any other; `*win` is an opaque handle. */
ncclResult_t ncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags);
ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buff, size_t size, ncclWindow_t* win, int winFlags);
/** Releases an ncclCommWindowRegister() window. */
ncclResult_t ncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);
ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t win);

/**
 * Makes an operator for `comm` and `datatype`: the sum over ranks of each rank's input
 * times `*scalar` (one `datatype` element), for ncclAllReduce(), ncclReduce() and
 * ncclReduceScatter(). ncclScalarHostImmediate reads the scalar now; ncclScalarDevice
 * reads it (host or device memory) when each collective is called. Device buffers are
 * staged through the host: such a call waits for its stream.
 * `*op` is ncclNumOps + k (opaque); another communicator or type refuses it (ncclInvalidArgument).
 */
ncclResult_t ncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                      ncclScalarResidence_t residence, ncclComm_t comm);
ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t datatype,
                                       ncclScalarResidence_t residence, ncclComm_t comm);
/** Destroys an operator of ncclRedOpCreatePreMulSum() (a built-in or unknown one: ncclInvalidArgument). */
ncclResult_t ncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);
ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm);

/* ------------------------------------------------------------------ collectives */

/** Reduces every rank's `sendbuff` into `recvbuff` of rank `root`. */
ncclResult_t ncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream);

/** In-place broadcast of `root`'s `buff` (NCCL's legacy form of ncclBroadcast()). */
ncclResult_t ncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                       cudaStream_t stream);
ncclResult_t pncclBcast(void* buff, size_t count, ncclDataType_t datatype, int root, ncclComm_t comm,
                        cudaStream_t stream);

/** Copies `root`'s `sendbuff` into every rank's `recvbuff`. */
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclBroadcast(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                            int root, ncclComm_t comm, cudaStream_t stream);

/** Reduces every rank's `sendbuff` into every rank's `recvbuff`. */
ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllReduce(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream);

/** Reduces, and rank r receives block r (`recvcount` elements). */
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t pncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                                ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream);

/** Every rank receives rank r's `sendcount` elements at offset r*sendcount. */
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                            ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);

/** Block p of rank r's `sendbuff` goes to block r of rank p's `recvbuff` (`count` per block). */
ncclResult_t ncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclAlltoAll(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                           ncclComm_t comm, cudaStream_t stream);

/** `root` receives rank r's `count` elements at offset r*count. */
ncclResult_t ncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                        int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclGather(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                         int root, ncclComm_t comm, cudaStream_t stream);

/** Rank r receives block r of `root`'s `sendbuff` (`count` per block). */
ncclResult_t ncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                         int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclScatter(const void* sendbuff, void* recvbuff, size_t count, ncclDataType_t datatype,
                          int root, ncclComm_t comm, cudaStream_t stream);

/** Sends `count` elements to `peer` (matched by its ncclRecv()). */
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t pncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                       ncclComm_t comm, cudaStream_t stream);

/** Receives `count` elements from `peer` (matched by its ncclSend()). */
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                      cudaStream_t stream);
ncclResult_t pncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer, ncclComm_t comm,
                       cudaStream_t stream);

/* ------------------------------------------------------------------ groups */

/** Starts a group: calls are queued until ncclGroupEnd(). */
ncclResult_t ncclGroupStart(void);
ncclResult_t pncclGroupStart(void);
/** Ends a group and runs its calls together. */
ncclResult_t ncclGroupEnd(void);
ncclResult_t pncclGroupEnd(void);
/** Not supported by ferroccl (ncclInvalidUsage; the group stays open). */
ncclResult_t ncclGroupSimulateEnd(ncclSimInfo_t* simInfo);
ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* simInfo);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* FERROCCL_NCCL_H */
