# Contract tests of the "Extensions beyond NCCL" (docs/abi.md), included by CMakeLists.txt after
# fccl_add_mpi_test and ${_core} are defined:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/ext_tests.cmake)
# The multi-rank ones run at every size of FERROCCL_WORLD_SIZES, as processes under the
# launcher (.npN) and as threads (.threadsN); test_ext_local (no communicator) runs once.

fccl_add_mpi_test(test_ext_gatherv test_ext_gatherv.c REQUIRES ${_core}
  fcclAllGatherV fcclReduceScatterV fcclGetLastError)
fccl_add_mpi_test(test_ext_axis test_ext_axis.c REQUIRES ${_core}
  fcclAllGatherAxis fcclReduceScatterAxis fcclAllGather fcclReduceScatter fcclGetLastError)
fccl_add_mpi_test(test_ext_coalesced test_ext_coalesced.c REQUIRES ${_core}
  fcclAllReduceCoalesced fcclBroadcastCoalesced fcclBroadcast fcclGetLastError)
fccl_add_mpi_test(test_ext_wire test_ext_wire.c REQUIRES ${_core}
  fcclAllReduceWire fcclAllGather fcclGetLastError)
# ferroccl's bitwise operators through every reducing call, and their refusal for floats.
fccl_add_mpi_test(test_bitwise test_bitwise.c REQUIRES ${_core} fcclReduce fcclReduceScatter
  fcclReduceScatterV fcclReduceScatterAxis fcclAllReduceCoalesced fcclAllReduceWire fcclGetLastError)
# Scratch memory bounded whatever the count (peak RSS of one rank per process).
fccl_add_mpi_test(test_scratch_bound test_scratch_bound.c REQUIRES ${_core} fcclAllReduceWire SIZES 2 3)

# One process, no launcher (the harness's single-rank communicator is not used).
set(_fccl_ext_local_req fcclGetUniqueId fcclCommInitRank fcclCommDestroy fcclCommCount
    fcclCommUserRank fcclGetLastError fcclMemAlloc fcclMemFree fcclLocalBroadcast
    fcclLocalScatter fcclLocalGather fcclCollectiveCounts fcclCollectiveAdjoint)
_fccl_missing_of(_fccl_ext_miss ${_fccl_ext_local_req})
if(_fccl_ext_miss)
  _fccl_missing_tests(test_ext_local "${_fccl_ext_miss}" test_ext_local)
else()
  add_executable(test_ext_local test_ext_local.c)
  target_link_libraries(test_ext_local PRIVATE fccl_harness)
  add_test(NAME test_ext_local COMMAND $<TARGET_FILE:test_ext_local>)
  set_tests_properties(test_ext_local PROPERTIES
    LABELS "local;np1"
    ENVIRONMENT "${_fccl_env}"
    TIMEOUT 300
    SKIP_RETURN_CODE 77
    PROCESSORS 1)
endif()
