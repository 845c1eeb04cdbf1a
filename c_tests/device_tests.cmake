# The device-memory contract test (label "device"): every collective and extension of the
# C API on CUDA device memory (c_tests/test_device.c). Included by CMakeLists.txt after
# fccl_add_mpi_test, _fccl_env and ${_core} are defined:
#   include(${CMAKE_CURRENT_SOURCE_DIR}/device_tests.cmake)
# On a GPU host the tests run on the real driver; without a GPU, under the simulated one:
#   bash scripts/sim-gpu.sh ctest --test-dir BUILD -L device
# Without a driver or a device they exit 77 (skipped).
#
#   test_device.np<N>            N processes (ferroccl-run), every rank on device 0
#   test_device.mixed.np<N>      N processes, rank r on device r % 2 (FCCL_TEST_DEVMAP=0,1)
#   test_device.threads<N>       N rank threads of one process, fcclCommInitAll(devlist 0,...,0)
#   test_device.threads_mixed<N> the same with devlist 0,1,0,1,...
#   test_device.ipc.np3          3 processes on device 0 with FERROCCL_CUDA_IPC=1 (the default:
#                                GPU to GPU through CUDA IPC mappings, ordered on the streams)
#   test_device.mps.np<N>        N processes on device 0 with FERROCCL_CUDA_MPS=1: every rank
#                                moves its share of each call, as under MPS
#   test_device.ipc.np10         10 processes on device 0: the reducing calls (every type and
#                                op, one launch over more than 8 ranks' buffers) and the wire
#                                all_reduce, and the refused calls
#   test_device.chunked.np<N>    N processes, everything staged through host memory
#   test_device.chunked.threads3 (FERROCCL_CUDA_IPC=0) in chunks of 256 bytes of host buffer
#                                (FERROCCL_STAGING_CHUNK), so that counts of 37 and 1001 span
#                                many chunks with odd remainders; no >= 16 MiB cases (those
#                                span several chunks at the default size)
# A device the machine lacks (one GPU) is mapped to device 0, and the output says so.

set(_fccl_dev_req ${_core} fcclMemAlloc fcclMemAllocHost fcclMemFree fcclCommCuDevice
    fcclCommSplit fcclCommFinalize fcclCommGetAsyncError fcclGetLastError fcclBroadcast
    fcclReduce fcclAllGather fcclReduceScatter
    fcclAlltoAll fcclGather fcclScatter fcclAlltoAllv fcclSend fcclRecv fcclGroupStart
    fcclGroupEnd fcclAllGatherV fcclReduceScatterV fcclAllGatherAxis fcclReduceScatterAxis
    fcclAllReduceCoalesced fcclBroadcastCoalesced fcclAllReduceWire fcclLocalBroadcast
    fcclLocalScatter fcclLocalGather)
set(_fccl_dev_tests
    test_device.np1 test_device.np2 test_device.np3 test_device.np4
    test_device.mixed.np2 test_device.mixed.np4
    test_device.threads1 test_device.threads2 test_device.threads3 test_device.threads4
    test_device.threads_mixed2 test_device.threads_mixed4 test_device.ipc.np3
    test_device.chunked.np1 test_device.chunked.np2 test_device.chunked.np3
    test_device.chunked.np4 test_device.chunked.threads3
    test_device.mps.np2 test_device.mps.np3 test_device.mps.np4
    test_device.ipc.np10)

_fccl_missing_of(_fccl_dev_miss ${_fccl_dev_req})
if(_fccl_dev_miss)
  _fccl_missing_tests(test_device "${_fccl_dev_miss}" ${_fccl_dev_tests})
else()
  add_executable(test_device test_device.c)
  target_link_libraries(test_device PRIVATE fccl_harness ${CMAKE_DL_LIBS})

  # _fccl_device_test(name nranks env-list command...)
  function(_fccl_device_test name n env)
    add_test(NAME ${name} COMMAND ${ARGN})
    set_tests_properties(${name} PROPERTIES
      LABELS "device;np${n}"
      ENVIRONMENT "${env}"
      TIMEOUT 300
      SKIP_RETURN_CODE 77
      PROCESSORS ${n})
  endfunction()

  foreach(_n 1 2 3 4)
    _fccl_device_test(test_device.np${_n} ${_n} "${_fccl_env}"
      "${FERROCCL_RUN}" -n ${_n} $<TARGET_FILE:test_device>)
  endforeach()
  foreach(_n 2 4)
    _fccl_device_test(test_device.mixed.np${_n} ${_n} "${_fccl_env};FCCL_TEST_DEVMAP=0,1"
      "${FERROCCL_RUN}" -n ${_n} $<TARGET_FILE:test_device>)
  endforeach()
  # GPU to GPU through CUDA IPC, named explicitly (FERROCCL_CUDA_IPC=1 is the default)
  _fccl_device_test(test_device.ipc.np3 3 "${_fccl_env};FERROCCL_CUDA_IPC=1"
    "${FERROCCL_RUN}" -n 3 $<TARGET_FILE:test_device>)
  # MPS forced on (the simulated GPU reports none): every rank moves its share
  foreach(_n 2 3 4)
    _fccl_device_test(test_device.mps.np${_n} ${_n} "${_fccl_env};FERROCCL_CUDA_MPS=1"
      "${FERROCCL_RUN}" -n ${_n} $<TARGET_FILE:test_device>)
  endforeach()
  # More ranks than a launch took pointers before (8): the reductions and wire forms only
  _fccl_device_test(test_device.ipc.np10 10
    "${_fccl_env};FCCL_TEST_DEVICE_SKIP=roots,moving,p2p,groups,split,big,axis,coalesced"
    "${FERROCCL_RUN}" -n 10 $<TARGET_FILE:test_device>)
  # staged in small chunks: the pipeline's boundaries and remainders at every count
  set(_fccl_chunked "${_fccl_env};FERROCCL_CUDA_IPC=0;FERROCCL_STAGING_CHUNK=256;FCCL_TEST_DEVICE_BIG=0")
  foreach(_n 1 2 3 4)
    _fccl_device_test(test_device.chunked.np${_n} ${_n} "${_fccl_chunked}"
      "${FERROCCL_RUN}" -n ${_n} $<TARGET_FILE:test_device>)
  endforeach()
  _fccl_device_test(test_device.chunked.threads3 3 "${_fccl_chunked}"
    $<TARGET_FILE:test_device> --threads 3 --devlist 0,1,0)
  # threads: --devlist 0,0,... and (mixed) 0,1,0,1,...
  foreach(_n 1 2 3 4)
    set(_fccl_same "")
    set(_fccl_alt "")
    math(EXPR _last "${_n} - 1")
    foreach(_r RANGE ${_last})
      math(EXPR _d "${_r} % 2")
      list(APPEND _fccl_same 0)
      list(APPEND _fccl_alt ${_d})
    endforeach()
    string(REPLACE ";" "," _fccl_same "${_fccl_same}")
    string(REPLACE ";" "," _fccl_alt "${_fccl_alt}")
    _fccl_device_test(test_device.threads${_n} ${_n} "${_fccl_env}"
      $<TARGET_FILE:test_device> --threads ${_n} --devlist ${_fccl_same})
    if(_n EQUAL 2 OR _n EQUAL 4)
      _fccl_device_test(test_device.threads_mixed${_n} ${_n} "${_fccl_env}"
        $<TARGET_FILE:test_device> --threads ${_n} --devlist ${_fccl_alt})
    endif()
  endforeach()
endif()

# What served each call (c_tests/test_device_path.c): every collective and extension of
# ranks sharing device 0 says backend "ipc" (GPU to GPU), with and without MPS shares;
# with FERROCCL_CUDA_IPC=0 every one says "staged"; managed memory falls back with one
# WARN. Fails when the GPU-to-GPU path's gate refuses a stock driver. Run with
# FERROCCL_CHECK=1: its mismatched counts must fail the call alone, which needs every
# call agreed (by default device calls are posted: test_device_posted holds those).
_fccl_missing_of(_fccl_path_miss ${_fccl_dev_req} fcclCommGetLastPath)
set(_fccl_path_tests test_device_path.np2 test_device_path.np4 test_device_path.mps.np3
    test_device_path.staged.np2)
if(_fccl_path_miss)
  _fccl_missing_tests(test_device_path "${_fccl_path_miss}" ${_fccl_path_tests})
else()
  add_executable(test_device_path test_device_path.c)
  target_link_libraries(test_device_path PRIVATE ferroccl ${CMAKE_DL_LIBS})
  foreach(_n 2 4)
    _fccl_device_test(test_device_path.np${_n} ${_n} "${_fccl_env};FERROCCL_CHECK=1"
      "${FERROCCL_RUN}" -n ${_n} $<TARGET_FILE:test_device_path>)
  endforeach()
  _fccl_device_test(test_device_path.mps.np3 3 "${_fccl_env};FERROCCL_CUDA_MPS=1;FERROCCL_CHECK=1"
    "${FERROCCL_RUN}" -n 3 $<TARGET_FILE:test_device_path>)
  _fccl_device_test(test_device_path.staged.np2 2 "${_fccl_env};FERROCCL_CUDA_IPC=0;FERROCCL_CHECK=1"
    "${FERROCCL_RUN}" -n 2 $<TARGET_FILE:test_device_path>)
endif()

# VMM memory GPU to GPU (c_tests/test_device_vmm.c): buffers in cuMemCreate chunks with
# POSIX file descriptor handles, mapped side by side as PyTorch's expandable segments do
# (each buffer spans two chunks), served GPU to GPU by every collective, with and without
# MPS shares; mappings reused, a replaced chunk re-exported, no-fd VMM memory staged.
_fccl_missing_of(_fccl_vmm_miss ${_fccl_dev_req} fcclCommGetLastPath)
set(_fccl_vmm_tests test_device_vmm.np2 test_device_vmm.np4 test_device_vmm.mps.np3)
if(_fccl_vmm_miss)
  _fccl_missing_tests(test_device_vmm "${_fccl_vmm_miss}" ${_fccl_vmm_tests})
else()
  add_executable(test_device_vmm test_device_vmm.c)
  target_link_libraries(test_device_vmm PRIVATE ferroccl ${CMAKE_DL_LIBS})
  foreach(_n 2 4)
    _fccl_device_test(test_device_vmm.np${_n} ${_n} "${_fccl_env}"
      "${FERROCCL_RUN}" -n ${_n} $<TARGET_FILE:test_device_vmm>)
  endforeach()
  _fccl_device_test(test_device_vmm.mps.np3 3 "${_fccl_env};FERROCCL_CUDA_MPS=1"
    "${FERROCCL_RUN}" -n 3 $<TARGET_FILE:test_device_vmm>)
endif()

# A rank sharing the GPU dies with calls queued (c_tests/test_device_kill.c): the
# survivor's queued copies and reductions end at once instead of running against the
# dead rank's buffers. By default the dead rank had posted its calls up to 16 ahead of
# rank 0, which reads them as it goes; .check1 (FERROCCL_CHECK=1) agrees on every call.
_fccl_missing_of(_fccl_kill_miss ${_fccl_dev_req} fcclCommAbort)
if(_fccl_kill_miss)
  _fccl_missing_tests(test_device_kill "${_fccl_kill_miss}" test_device_kill.np2 test_device_kill.check1.np2)
else()
  add_executable(test_device_kill test_device_kill.c)
  target_link_libraries(test_device_kill PRIVATE ferroccl ${CMAKE_DL_LIBS})
  _fccl_device_test(test_device_kill.np2 2 "${_fccl_env}" $<TARGET_FILE:test_device_kill>)
  _fccl_device_test(test_device_kill.check1.np2 2 "${_fccl_env};FERROCCL_CHECK=1" $<TARGET_FILE:test_device_kill>)
endif()

# The cost model (c_tests/test_device_costs.c): every collective of ranks sharing device
# 0, per call, against the roofline's budget: HBM traffic, launches, host-blocking calls,
# driver calls that do not grow with the live allocations, host exchanges (none by
# default, descriptors posted, with and without MPS; one per call with FERROCCL_CHECK=1:
# .check1, every call agreed). Needs the simulated GPU (its counters); skipped on a real
# driver.
_fccl_missing_of(_fccl_costs_miss ${_fccl_dev_req} fcclCommGetLastPath fcclCommGetLastExchanges)
if(_fccl_costs_miss)
  _fccl_missing_tests(test_device_costs "${_fccl_costs_miss}" test_device_costs.np2 test_device_costs.np4
    test_device_costs.np8 test_device_costs.mps.np4 test_device_costs.check1.np2 test_device_costs.check1.np4
    test_device_costs.check1.np8 test_device_costs.mps.check1.np4)
else()
  add_executable(test_device_costs test_device_costs.c)
  target_link_libraries(test_device_costs PRIVATE ferroccl ${CMAKE_DL_LIBS})
  foreach(_n 2 4 8)
    _fccl_device_test(test_device_costs.np${_n} ${_n} "${_fccl_env}"
      "${FERROCCL_RUN}" -n ${_n} $<TARGET_FILE:test_device_costs>)
    _fccl_device_test(test_device_costs.check1.np${_n} ${_n} "${_fccl_env};FERROCCL_CHECK=1"
      "${FERROCCL_RUN}" -n ${_n} $<TARGET_FILE:test_device_costs>)
  endforeach()
  _fccl_device_test(test_device_costs.mps.np4 4 "${_fccl_env};FERROCCL_CUDA_MPS=1"
    "${FERROCCL_RUN}" -n 4 $<TARGET_FILE:test_device_costs>)
  _fccl_device_test(test_device_costs.mps.check1.np4 4 "${_fccl_env};FERROCCL_CUDA_MPS=1;FERROCCL_CHECK=1"
    "${FERROCCL_RUN}" -n 4 $<TARGET_FILE:test_device_costs>)
endif()

# Collectives inside CUDA graph capture (c_tests/test_device_graph.c): every rank, then
# rank 0 alone, captures its stream; fcclAllReduce and send/recv return fcclInvalidUsage
# on every rank alike without a hang, the captures stay valid and their graphs replay, and
# the same calls outside capture work. On the GPU-to-GPU path (processes, MPS shares,
# rank threads of one process) and through host staging. Processes run with
# FERROCCL_CHECK=1, where one rank's capture fails the call alone; by default their
# device calls are posted, and test_device_posted holds what one rank's capture does then.
_fccl_missing_of(_fccl_graph_miss ${_fccl_dev_req})
set(_fccl_graph_tests test_device_graph.np2 test_device_graph.np4 test_device_graph.mps.np2
    test_device_graph.staged.np2 test_device_graph.threads2 test_device_graph.threads4)
if(_fccl_graph_miss)
  _fccl_missing_tests(test_device_graph "${_fccl_graph_miss}" ${_fccl_graph_tests})
else()
  add_executable(test_device_graph test_device_graph.c)
  target_link_libraries(test_device_graph PRIVATE fccl_harness ${CMAKE_DL_LIBS})
  foreach(_n 2 4)
    _fccl_device_test(test_device_graph.np${_n} ${_n} "${_fccl_env};FERROCCL_CHECK=1"
      "${FERROCCL_RUN}" -n ${_n} $<TARGET_FILE:test_device_graph>)
    set(_fccl_zeros "0")
    foreach(_r RANGE 2 ${_n})
      string(APPEND _fccl_zeros ",0")
    endforeach()
    _fccl_device_test(test_device_graph.threads${_n} ${_n} "${_fccl_env}"
      $<TARGET_FILE:test_device_graph> --threads ${_n} --devlist ${_fccl_zeros})
  endforeach()
  _fccl_device_test(test_device_graph.mps.np2 2 "${_fccl_env};FERROCCL_CUDA_MPS=1;FERROCCL_CHECK=1"
    "${FERROCCL_RUN}" -n 2 $<TARGET_FILE:test_device_graph>)
  _fccl_device_test(test_device_graph.staged.np2 2 "${_fccl_env};FERROCCL_CUDA_IPC=0;FERROCCL_CHECK=1"
    "${FERROCCL_RUN}" -n 2 $<TARGET_FILE:test_device_graph>)
endif()

# Posted device calls (c_tests/test_device_posted.c), FERROCCL_CHECK=0: after the first
# call the ranks post their descriptors and only the executor reads them (.mps: every
# rank's proxy reads them and enqueues its share). Right results over repeated, renewed
# and host buffers; what a proxy finds afterwards (different counts, one rank's graph
# capture) fails the communicator on every rank with the reason; every rank's capture is
# refused alike and the communicator goes on. .default leaves FERROCCL_CHECK unset
# (posting from the first call on device memory). The whole device contract suite runs
# posted by default, and agreed call by call with FERROCCL_CHECK=1 (test_device.check1.np3,
# test_device.mps.check1.np3).
_fccl_missing_of(_fccl_posted_miss ${_fccl_dev_req} fcclCommGetLastPath fcclCommGetLastExchanges fcclCommAbort)
if(_fccl_posted_miss)
  _fccl_missing_tests(test_device_posted "${_fccl_posted_miss}" test_device_posted.np2 test_device_posted.np4
    test_device_posted.mps.np3 test_device_posted.default.np2 test_device.check1.np3 test_device.mps.check1.np3)
else()
  add_executable(test_device_posted test_device_posted.c)
  target_link_libraries(test_device_posted PRIVATE ferroccl ${CMAKE_DL_LIBS})
  foreach(_n 2 4)
    _fccl_device_test(test_device_posted.np${_n} ${_n} "${_fccl_env};FERROCCL_CHECK=0"
      "${FERROCCL_RUN}" -n ${_n} $<TARGET_FILE:test_device_posted>)
  endforeach()
  _fccl_device_test(test_device_posted.mps.np3 3 "${_fccl_env};FERROCCL_CHECK=0;FERROCCL_CUDA_MPS=1"
    "${FERROCCL_RUN}" -n 3 $<TARGET_FILE:test_device_posted>)
  _fccl_device_test(test_device_posted.default.np2 2 "${_fccl_env}"
    "${FERROCCL_RUN}" -n 2 $<TARGET_FILE:test_device_posted>)
  if(TARGET test_device)
    _fccl_device_test(test_device.check1.np3 3 "${_fccl_env};FERROCCL_CHECK=1"
      "${FERROCCL_RUN}" -n 3 $<TARGET_FILE:test_device>)
    _fccl_device_test(test_device.mps.check1.np3 3 "${_fccl_env};FERROCCL_CHECK=1;FERROCCL_CUDA_MPS=1"
      "${FERROCCL_RUN}" -n 3 $<TARGET_FILE:test_device>)
  endif()
endif()
