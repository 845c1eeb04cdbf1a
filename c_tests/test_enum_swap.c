/* The header's enums are real C enums, so a compiler can tell a data type from a
 * reduction operator. Not built into the suite's programs: ctest compiles it three
 * ways (CMakeLists.txt, "enum_swap"):
 *   - as is, with -Wall -Wextra -Werror (C) and as C++11: the right order compiles;
 *   - with SWAP_CONSTANTS or SWAP_VARIABLES, datatype and op exchanged: GCC (10 and
 *     later) warns in C under -Wextra (-Wenum-conversion), for enumerators and for
 *     variables alike; C++ refuses to compile either (no implicit enum conversion).
 * C itself converts any enum or int to any enum silently; only the compiler's warning
 * catches the swap there, and an int variable passed as either still compiles. */
#include "ferroccl.h"

fcclResult_t all_reduce(const void* send, void* recv, fcclComm_t comm);

fcclResult_t all_reduce(const void* send, void* recv, fcclComm_t comm) {
#if defined(SWAP_CONSTANTS)
  return fcclAllReduce(send, recv, 1, fcclSum, fcclFloat32, comm, NULL);
#elif defined(SWAP_VARIABLES)
  fcclDataType_t dt = fcclFloat32;
  fcclRedOp_t op = fcclSum;
  return fcclAllReduce(send, recv, 1, op, dt, comm, NULL);
#else
  return fcclAllReduce(send, recv, 1, fcclFloat32, fcclSum, comm, NULL);
#endif
}
