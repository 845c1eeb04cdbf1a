/* ferroccl.h alone, as C99 and (test_header_cxx11.cpp includes this file) as C++11,
 * with -Wall -Wextra -Wpedantic -Werror: every name of docs/abi.md
 * with its exact signature (a function pointer of the ABI's type is initialised with each
 * function, which fails to compile on any difference), the enum values, the unique-id
 * size, FCCL_SPLIT_NOCOLOR and FCCL_CONFIG_INITIALIZER. */
#include "ferroccl.h"

#ifdef __cplusplus
#define FCCL_STATIC_ASSERT(name, cond) static_assert(cond, #name)
#else
#define FCCL_STATIC_ASSERT(name, cond) typedef char fccl_assert_##name[(cond) ? 1 : -1]
#endif

FCCL_STATIC_ASSERT(success, fcclSuccess == 0);
FCCL_STATIC_ASSERT(unhandled_cuda, fcclUnhandledCudaError == 1);
FCCL_STATIC_ASSERT(system_error, fcclSystemError == 2);
FCCL_STATIC_ASSERT(internal_error, fcclInternalError == 3);
FCCL_STATIC_ASSERT(invalid_argument, fcclInvalidArgument == 4);
FCCL_STATIC_ASSERT(invalid_usage, fcclInvalidUsage == 5);
FCCL_STATIC_ASSERT(remote_error, fcclRemoteError == 6);
FCCL_STATIC_ASSERT(in_progress, fcclInProgress == 7);
FCCL_STATIC_ASSERT(timeout, fcclTimeout == 8);
FCCL_STATIC_ASSERT(mismatch, fcclCollectiveMismatch == 100);
FCCL_STATIC_ASSERT(unavailable, fcclUnavailable == 101);
FCCL_STATIC_ASSERT(int8, fcclInt8 == 0 && fcclChar == 0);
FCCL_STATIC_ASSERT(uint8, fcclUint8 == 1);
FCCL_STATIC_ASSERT(int32, fcclInt32 == 2 && fcclInt == 2);
FCCL_STATIC_ASSERT(uint32, fcclUint32 == 3);
FCCL_STATIC_ASSERT(int64, fcclInt64 == 4);
FCCL_STATIC_ASSERT(uint64, fcclUint64 == 5);
FCCL_STATIC_ASSERT(float16, fcclFloat16 == 6 && fcclHalf == 6);
FCCL_STATIC_ASSERT(float32, fcclFloat32 == 7 && fcclFloat == 7);
FCCL_STATIC_ASSERT(float64, fcclFloat64 == 8 && fcclDouble == 8);
FCCL_STATIC_ASSERT(bfloat16, fcclBfloat16 == 9);
FCCL_STATIC_ASSERT(e4m3, fcclFloat8e4m3 == 10);
FCCL_STATIC_ASSERT(e5m2, fcclFloat8e5m2 == 11);
FCCL_STATIC_ASSERT(sum, fcclSum == 0);
FCCL_STATIC_ASSERT(prod, fcclProd == 1);
FCCL_STATIC_ASSERT(max, fcclMax == 2);
FCCL_STATIC_ASSERT(min, fcclMin == 3);
FCCL_STATIC_ASSERT(avg, fcclAvg == 4);
FCCL_STATIC_ASSERT(num_ops, fcclNumOps == 5);
FCCL_STATIC_ASSERT(band, fcclBand == 64);
FCCL_STATIC_ASSERT(bor, fcclBor == 65);
FCCL_STATIC_ASSERT(bxor, fcclBxor == 66);
FCCL_STATIC_ASSERT(nocolor, FCCL_SPLIT_NOCOLOR == -1);
FCCL_STATIC_ASSERT(unique_id_size, sizeof(((fcclUniqueId*)0)->internal) == 128);
FCCL_STATIC_ASSERT(unique_id_char, sizeof(((fcclUniqueId*)0)->internal[0]) == 1);
FCCL_STATIC_ASSERT(backends, FCCL_BACKEND_AUTO != FCCL_BACKEND_HOST &&
                                 FCCL_BACKEND_HOST != FCCL_BACKEND_NCCL &&
                                 FCCL_BACKEND_AUTO != FCCL_BACKEND_NCCL);

/* Communicators */
static fcclResult_t (*const p_get_version)(int*) = fcclGetVersion;
static fcclResult_t (*const p_get_unique_id)(fcclUniqueId*) = fcclGetUniqueId;
static fcclResult_t (*const p_init_rank)(fcclComm_t*, int, fcclUniqueId, int) = fcclCommInitRank;
static fcclResult_t (*const p_init_rank_config)(fcclComm_t*, int, fcclUniqueId, int,
                                                fcclConfig_t*) = fcclCommInitRankConfig;
static fcclResult_t (*const p_init_all)(fcclComm_t*, int, const int*) = fcclCommInitAll;
static fcclResult_t (*const p_init_env)(fcclComm_t*) = fcclCommInitFromEnv;
static fcclResult_t (*const p_split)(fcclComm_t, int, int, fcclComm_t*, fcclConfig_t*) =
    fcclCommSplit;
static fcclResult_t (*const p_finalize)(fcclComm_t) = fcclCommFinalize;
static fcclResult_t (*const p_destroy)(fcclComm_t) = fcclCommDestroy;
static fcclResult_t (*const p_abort)(fcclComm_t) = fcclCommAbort;
static fcclResult_t (*const p_async)(fcclComm_t, fcclResult_t*) = fcclCommGetAsyncError;
static fcclResult_t (*const p_count)(const fcclComm_t, int*) = fcclCommCount;
static fcclResult_t (*const p_user_rank)(const fcclComm_t, int*) = fcclCommUserRank;
static fcclResult_t (*const p_cu_device)(const fcclComm_t, int*) = fcclCommCuDevice;
static const char* (*const p_error_string)(fcclResult_t) = fcclGetErrorString;
static const char* (*const p_last_error)(fcclComm_t) = fcclGetLastError;
/* Memory */
static fcclResult_t (*const p_mem_alloc)(void**, size_t) = fcclMemAlloc;
static fcclResult_t (*const p_mem_alloc_host)(void**, size_t) = fcclMemAllocHost;
static fcclResult_t (*const p_mem_free)(void*) = fcclMemFree;
/* Collectives */
static fcclResult_t (*const p_all_reduce)(const void*, void*, size_t, fcclDataType_t, fcclRedOp_t,
                                          fcclComm_t, fcclStream_t) = fcclAllReduce;
static fcclResult_t (*const p_broadcast)(const void*, void*, size_t, fcclDataType_t, int,
                                         fcclComm_t, fcclStream_t) = fcclBroadcast;
static fcclResult_t (*const p_barrier)(fcclComm_t, fcclStream_t) = fcclBarrier;
static fcclResult_t (*const p_group_start)(void) = fcclGroupStart;
static fcclResult_t (*const p_group_end)(void) = fcclGroupEnd;
#ifndef FCCL_MISSING_fcclReduce
static fcclResult_t (*const p_reduce)(const void*, void*, size_t, fcclDataType_t, fcclRedOp_t, int,
                                      fcclComm_t, fcclStream_t) = fcclReduce;
#endif
#ifndef FCCL_MISSING_fcclAllGather
static fcclResult_t (*const p_all_gather)(const void*, void*, size_t, fcclDataType_t, fcclComm_t,
                                          fcclStream_t) = fcclAllGather;
#endif
#ifndef FCCL_MISSING_fcclReduceScatter
static fcclResult_t (*const p_reduce_scatter)(const void*, void*, size_t, fcclDataType_t,
                                              fcclRedOp_t, fcclComm_t, fcclStream_t) =
    fcclReduceScatter;
#endif
#ifndef FCCL_MISSING_fcclAlltoAll
static fcclResult_t (*const p_all_to_all)(const void*, void*, size_t, fcclDataType_t, fcclComm_t,
                                          fcclStream_t) = fcclAlltoAll;
#endif
#ifndef FCCL_MISSING_fcclGather
static fcclResult_t (*const p_gather)(const void*, void*, size_t, fcclDataType_t, int, fcclComm_t,
                                      fcclStream_t) = fcclGather;
#endif
#ifndef FCCL_MISSING_fcclScatter
static fcclResult_t (*const p_scatter)(const void*, void*, size_t, fcclDataType_t, int, fcclComm_t,
                                       fcclStream_t) = fcclScatter;
#endif
#ifndef FCCL_MISSING_fcclAlltoAllv
static fcclResult_t (*const p_all_to_allv)(const void*, const size_t*, const size_t*, void*,
                                           const size_t*, const size_t*, fcclDataType_t,
                                           fcclComm_t, fcclStream_t) = fcclAlltoAllv;
#endif
#ifndef FCCL_MISSING_fcclSend
static fcclResult_t (*const p_send)(const void*, size_t, fcclDataType_t, int, fcclComm_t,
                                    fcclStream_t) = fcclSend;
#endif
#ifndef FCCL_MISSING_fcclRecv
static fcclResult_t (*const p_recv)(void*, size_t, fcclDataType_t, int, fcclComm_t, fcclStream_t) =
    fcclRecv;
#endif
/* Extensions */
#ifndef FCCL_MISSING_fcclAllGatherV
static fcclResult_t (*const p_all_gather_v)(const void*, size_t, void*, const size_t*,
                                            const size_t*, fcclDataType_t, fcclComm_t,
                                            fcclStream_t) = fcclAllGatherV;
#endif
#ifndef FCCL_MISSING_fcclReduceScatterV
static fcclResult_t (*const p_reduce_scatter_v)(const void*, const size_t*, const size_t*, void*,
                                                fcclDataType_t, fcclRedOp_t, fcclComm_t,
                                                fcclStream_t) = fcclReduceScatterV;
#endif
#ifndef FCCL_MISSING_fcclAllGatherAxis
static fcclResult_t (*const p_all_gather_axis)(const void*, void*, int, const size_t*, int,
                                               fcclDataType_t, fcclComm_t, fcclStream_t) =
    fcclAllGatherAxis;
#endif
#ifndef FCCL_MISSING_fcclReduceScatterAxis
static fcclResult_t (*const p_reduce_scatter_axis)(const void*, void*, int, const size_t*, int,
                                                   fcclDataType_t, fcclRedOp_t, fcclComm_t,
                                                   fcclStream_t) = fcclReduceScatterAxis;
#endif
#ifndef FCCL_MISSING_fcclAllReduceCoalesced
static fcclResult_t (*const p_all_reduce_coalesced)(const void* const*, void* const*, const size_t*,
                                                    int, fcclDataType_t, fcclRedOp_t, size_t,
                                                    fcclComm_t, fcclStream_t) =
    fcclAllReduceCoalesced;
#endif
#ifndef FCCL_MISSING_fcclBroadcastCoalesced
static fcclResult_t (*const p_broadcast_coalesced)(void* const*, const size_t*, int, fcclDataType_t,
                                                   int, size_t, fcclComm_t, fcclStream_t) =
    fcclBroadcastCoalesced;
#endif
#ifndef FCCL_MISSING_fcclAllReduceWire
static fcclResult_t (*const p_all_reduce_wire)(const void*, void*, size_t, fcclDataType_t,
                                               fcclRedOp_t, fcclDataType_t, fcclComm_t,
                                               fcclStream_t) = fcclAllReduceWire;
#endif
#ifndef FCCL_MISSING_fcclLocalBroadcast
static fcclResult_t (*const p_local_broadcast)(const void*, int, size_t, void* const*, const int*,
                                               int) = fcclLocalBroadcast;
#endif
#ifndef FCCL_MISSING_fcclLocalScatter
static fcclResult_t (*const p_local_scatter)(const void*, int, int, const size_t*, int,
                                             fcclDataType_t, const size_t*, void* const*,
                                             const int*, int) = fcclLocalScatter;
#endif
#ifndef FCCL_MISSING_fcclLocalGather
static fcclResult_t (*const p_local_gather)(const void* const*, const int*, const size_t*, int, int,
                                            const size_t*, int, fcclDataType_t, void*, int) =
    fcclLocalGather;
#endif
#ifndef FCCL_MISSING_fcclCollectiveCounts
static fcclResult_t (*const p_collective_counts)(int, size_t, int, int, int, size_t*, size_t*) =
    fcclCollectiveCounts;
FCCL_STATIC_ASSERT(coll_values, fcclCollAllReduce == 0 && fcclCollBroadcast == 1 &&
                                    fcclCollReduce == 2 && fcclCollAllGather == 3 &&
                                    fcclCollReduceScatter == 4 && fcclCollAlltoAll == 5 &&
                                    fcclCollGather == 6 && fcclCollScatter == 7);
#endif
#ifndef FCCL_MISSING_fcclCollectiveAdjoint
static fcclResult_t (*const p_collective_adjoint)(int, int*) = fcclCollectiveAdjoint;
#endif

/* Uses every pointer (so none is an unused variable). */
static int all_linked(void) {
  const void* const ptrs[] = {
      (const void*)&p_get_version, (const void*)&p_get_unique_id, (const void*)&p_init_rank,
      (const void*)&p_init_rank_config, (const void*)&p_init_all, (const void*)&p_init_env,
      (const void*)&p_split, (const void*)&p_finalize, (const void*)&p_destroy,
      (const void*)&p_abort, (const void*)&p_async, (const void*)&p_count,
      (const void*)&p_user_rank, (const void*)&p_cu_device, (const void*)&p_error_string,
      (const void*)&p_last_error, (const void*)&p_mem_alloc, (const void*)&p_mem_alloc_host,
      (const void*)&p_mem_free, (const void*)&p_all_reduce, (const void*)&p_broadcast,
      (const void*)&p_barrier, (const void*)&p_group_start, (const void*)&p_group_end,
#ifndef FCCL_MISSING_fcclReduce
      (const void*)&p_reduce,
#endif
#ifndef FCCL_MISSING_fcclAllGather
      (const void*)&p_all_gather,
#endif
#ifndef FCCL_MISSING_fcclReduceScatter
      (const void*)&p_reduce_scatter,
#endif
#ifndef FCCL_MISSING_fcclAlltoAll
      (const void*)&p_all_to_all,
#endif
#ifndef FCCL_MISSING_fcclGather
      (const void*)&p_gather,
#endif
#ifndef FCCL_MISSING_fcclScatter
      (const void*)&p_scatter,
#endif
#ifndef FCCL_MISSING_fcclAlltoAllv
      (const void*)&p_all_to_allv,
#endif
#ifndef FCCL_MISSING_fcclSend
      (const void*)&p_send,
#endif
#ifndef FCCL_MISSING_fcclRecv
      (const void*)&p_recv,
#endif
#ifndef FCCL_MISSING_fcclAllGatherV
      (const void*)&p_all_gather_v,
#endif
#ifndef FCCL_MISSING_fcclReduceScatterV
      (const void*)&p_reduce_scatter_v,
#endif
#ifndef FCCL_MISSING_fcclAllGatherAxis
      (const void*)&p_all_gather_axis,
#endif
#ifndef FCCL_MISSING_fcclReduceScatterAxis
      (const void*)&p_reduce_scatter_axis,
#endif
#ifndef FCCL_MISSING_fcclAllReduceCoalesced
      (const void*)&p_all_reduce_coalesced,
#endif
#ifndef FCCL_MISSING_fcclBroadcastCoalesced
      (const void*)&p_broadcast_coalesced,
#endif
#ifndef FCCL_MISSING_fcclAllReduceWire
      (const void*)&p_all_reduce_wire,
#endif
#ifndef FCCL_MISSING_fcclLocalBroadcast
      (const void*)&p_local_broadcast,
#endif
#ifndef FCCL_MISSING_fcclLocalScatter
      (const void*)&p_local_scatter,
#endif
#ifndef FCCL_MISSING_fcclLocalGather
      (const void*)&p_local_gather,
#endif
#ifndef FCCL_MISSING_fcclCollectiveCounts
      (const void*)&p_collective_counts,
#endif
#ifndef FCCL_MISSING_fcclCollectiveAdjoint
      (const void*)&p_collective_adjoint,
#endif
      (const void*)0};
  return (int)(sizeof ptrs / sizeof ptrs[0]) > 0 ? 0 : 1;
}

int main(void) {
  fcclConfig_t cfg = FCCL_CONFIG_INITIALIZER;
  fcclUniqueId id = {{0}};
  fcclComm_t comm = 0;
  fcclStream_t stream = 0;
  fcclResult_t res = fcclSuccess;
  fcclDataType_t dt = fcclFloat8e5m2;
  fcclRedOp_t op = fcclAvg;
  int version = 0;
  (void)comm;
  (void)stream;
  (void)dt;
  (void)op;
  (void)id;
  /* the documented fields exist */
  (void)cfg.blocking;
  (void)cfg.timeoutMs;
  (void)cfg.backend;
  (void)cfg.commName;
  (void)cfg.checkMode;
  (void)cfg.magic;
  (void)cfg.version;
  if ((size_t)cfg.size != sizeof(fcclConfig_t)) return 2; /* FCCL_CONFIG_INITIALIZER fills size */
  res = p_get_version(&version);
  if (res != fcclSuccess || version <= 0) return 3;
  if (!p_error_string(fcclInvalidArgument) || !p_last_error(comm)) return 4;
  return all_linked();
}
