// A C++ program that uses an installed ferroccl: built by tests/install/run.sh against
// the CMake package (ferroccl::ferroccl, ferroccl::ferroccl_static) and pkg-config.
//
//   consumer [N]     N ranks (default 1) as threads of this process, fcclCommInitAll
//   consumer --env   one rank of a job started by ferroccl-run (fcclCommInitFromEnv)
//
// Each rank all-reduces (sum) a float buffer and checks the result; the program also
// checks that the library's fcclGetVersion matches the header it was compiled with and,
// when the build passes FERROCCL_PKG_VERSION, the version the package manager reported.
#include <ferroccl.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#define STR2(x) #x
#define STR(x) STR2(x)

static int all_reduce(fcclComm_t comm, int rank, int nranks) {
  const size_t n = 4099;
  std::vector<float> send(n), recv(n, -1.0f);
  for (size_t i = 0; i < n; i++) send[i] = static_cast<float>(rank + 1) + static_cast<float>(i % 17);
  fcclResult_t r = fcclAllReduce(send.data(), recv.data(), n, fcclFloat32, fcclSum, comm, nullptr);
  if (r != fcclSuccess) {
    std::fprintf(stderr, "rank %d: fcclAllReduce: %s: %s\n", rank, fcclGetErrorString(r), fcclGetLastError(comm));
    return 1;
  }
  for (size_t i = 0; i < n; i++) {
    const float want = static_cast<float>(nranks * (nranks + 1) / 2) + static_cast<float>(nranks) * static_cast<float>(i % 17);
    if (recv[i] != want) {
      std::fprintf(stderr, "rank %d: element %zu is %g, expected %g\n", rank, i, static_cast<double>(recv[i]),
                   static_cast<double>(want));
      return 1;
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  int version = 0;
  if (fcclGetVersion(&version) != fcclSuccess || version != FCCL_VERSION_CODE) {
    std::fprintf(stderr, "fcclGetVersion gives %d, the header FCCL_VERSION_CODE %d\n", version, FCCL_VERSION_CODE);
    return 1;
  }
  const std::string header_version =
      std::to_string(FCCL_MAJOR) + "." + std::to_string(FCCL_MINOR) + "." + std::to_string(FCCL_PATCH);
#ifdef FERROCCL_PKG_VERSION
  if (header_version != STR(FERROCCL_PKG_VERSION)) {
    std::fprintf(stderr, "package version %s, header version %s\n", STR(FERROCCL_PKG_VERSION), header_version.c_str());
    return 1;
  }
#endif

  int failures = 0;
  if (argc > 1 && std::strcmp(argv[1], "--env") == 0) {
    fcclComm_t comm = nullptr;
    if (fcclCommInitFromEnv(&comm) != fcclSuccess) {
      std::fprintf(stderr, "fcclCommInitFromEnv: %s\n", fcclGetLastError(nullptr));
      return 1;
    }
    int rank = -1, nranks = 0;
    fcclCommUserRank(comm, &rank);
    fcclCommCount(comm, &nranks);
    failures += all_reduce(comm, rank, nranks);
    fcclCommDestroy(comm);
    std::printf("consumer rank %d/%d (ferroccl %s): %s\n", rank, nranks, header_version.c_str(),
                failures ? "FAILED" : "OK");
    return failures ? 1 : 0;
  }

  const int nranks = argc > 1 ? std::atoi(argv[1]) : 1;
  if (nranks < 1 || nranks > 64) {
    std::fprintf(stderr, "usage: %s [N | --env]\n", argv[0]);
    return 2;
  }
  std::vector<fcclComm_t> comms(static_cast<size_t>(nranks));
  if (fcclCommInitAll(comms.data(), nranks, nullptr) != fcclSuccess) {
    std::fprintf(stderr, "fcclCommInitAll: %s\n", fcclGetLastError(nullptr));
    return 1;
  }
  std::vector<int> fails(static_cast<size_t>(nranks), 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < nranks; r++)
    threads.emplace_back([&, r] { fails[static_cast<size_t>(r)] = all_reduce(comms[static_cast<size_t>(r)], r, nranks); });
  for (auto& t : threads) t.join();
  for (int r = 0; r < nranks; r++) {
    failures += fails[static_cast<size_t>(r)];
    fcclCommDestroy(comms[static_cast<size_t>(r)]);
  }
  std::printf("consumer: %d rank(s) (ferroccl %s): %s\n", nranks, header_version.c_str(), failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
