/* The header-alone test of test_header_c99.c, compiled as C++11: ferroccl.h must be
 * usable from C++ exactly as from C (FCCL_CONFIG_INITIALIZER included). */
#include "test_header_c99.c"
