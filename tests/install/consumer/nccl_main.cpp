// An NCCL program, unchanged: `#include <nccl.h>` finds ferroccl's compatibility header
// through ferroccl::nccl (CMake) or ferroccl-nccl (pkg-config). One process, N ranks
// driven from one thread with a group, as NCCL's single-process examples do.
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define NCCLCHECK(cmd)                                                                 \
  do {                                                                                 \
    ncclResult_t r_ = (cmd);                                                           \
    if (r_ != ncclSuccess) {                                                           \
      std::printf("NCCL failure %s:%d '%s'\n", __FILE__, __LINE__, ncclGetErrorString(r_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

int main(int argc, char** argv) {
  const int ndev = argc > 1 ? std::atoi(argv[1]) : 2;
  const size_t size = 1024;
  std::vector<ncclComm_t> comms(static_cast<size_t>(ndev));
  std::vector<std::vector<float> > bufs(static_cast<size_t>(ndev), std::vector<float>(size));
  for (int i = 0; i < ndev; i++)
    for (size_t j = 0; j < size; j++) bufs[static_cast<size_t>(i)][j] = static_cast<float>(i + 1);

  int version = 0;
  NCCLCHECK(ncclGetVersion(&version));
  NCCLCHECK(ncclCommInitAll(comms.data(), ndev, NULL));
  NCCLCHECK(ncclGroupStart());
  for (int i = 0; i < ndev; i++)
    NCCLCHECK(ncclAllReduce(bufs[static_cast<size_t>(i)].data(), bufs[static_cast<size_t>(i)].data(), size,
                            ncclFloat, ncclSum, comms[static_cast<size_t>(i)], NULL));
  NCCLCHECK(ncclGroupEnd());
  for (int i = 0; i < ndev; i++) NCCLCHECK(ncclCommDestroy(comms[static_cast<size_t>(i)]));

  const float want = static_cast<float>(ndev * (ndev + 1) / 2);
  for (int i = 0; i < ndev; i++)
    for (size_t j = 0; j < size; j++)
      if (bufs[static_cast<size_t>(i)][j] != want) {
        std::printf("rank %d element %zu: %g, expected %g\n", i, j, static_cast<double>(bufs[static_cast<size_t>(i)][j]),
                    static_cast<double>(want));
        return 1;
      }
  std::printf("nccl consumer: %d ranks, NCCL API %d.%d.%d%s (code %d): OK\n", ndev, NCCL_MAJOR, NCCL_MINOR, NCCL_PATCH,
              NCCL_SUFFIX, version);
  return 0;
}
