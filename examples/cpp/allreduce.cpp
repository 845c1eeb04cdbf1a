// ferroccl from C++: a small RAII wrapper that owns the communicator, turns failures
// into exceptions that carry the library's message, and maps element types to
// fcclDataType_t at compile time.
//
//   c++ -std=c++11 allreduce.cpp -I<ferroccl>/include -L<ferroccl>/target/release
//       -lferroccl -Wl,-rpath,<ferroccl>/target/release -o allreduce_cpp   (one line)
//   ferroccl-run -n 4 ./allreduce_cpp
#include <ferroccl.h>

#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

namespace {

// The exception for a failed call: the result code and fcclGetLastError's message.
struct Error : std::runtime_error {
  fcclResult_t code;
  Error(const char* call, fcclResult_t c)
      : std::runtime_error(std::string(call) + ": " + fcclGetErrorString(c) + "\n  " + fcclGetLastError(nullptr)),
        code(c) {}
};

void check(const char* call, fcclResult_t res) {
  if (res != fcclSuccess) throw Error(call, res);
}

// The fcclDataType_t of a C++ type; a type without one does not compile.
template <class T> struct DataType;
template <> struct DataType<float> { static constexpr fcclDataType_t value = fcclFloat32; };
template <> struct DataType<double> { static constexpr fcclDataType_t value = fcclFloat64; };
template <> struct DataType<std::int32_t> { static constexpr fcclDataType_t value = fcclInt32; };
template <> struct DataType<std::int64_t> { static constexpr fcclDataType_t value = fcclInt64; };

// One communicator, destroyed with its owner.
class Comm {
 public:
  // Rank, size and rendezvous from the launcher's environment.
  Comm() { check("fcclCommInitFromEnv", fcclCommInitFromEnv(&comm_)); }
  ~Comm() { fcclCommDestroy(comm_); }
  Comm(const Comm&) = delete;
  Comm& operator=(const Comm&) = delete;

  int rank() const {
    int r = -1;
    check("fcclCommUserRank", fcclCommUserRank(comm_, &r));
    return r;
  }
  int size() const {
    int n = 0;
    check("fcclCommCount", fcclCommCount(comm_, &n));
    return n;
  }

  // Reduces `v` over all ranks in place (host memory: no stream).
  template <class T> void all_reduce(std::vector<T>& v, fcclRedOp_t op) {
    check("fcclAllReduce", fcclAllReduce(v.data(), v.data(), v.size(), DataType<T>::value, op, comm_, nullptr));
  }

  // Every rank's `mine`, in rank order.
  template <class T> std::vector<T> all_gather(const std::vector<T>& mine) {
    std::vector<T> all(mine.size() * static_cast<std::size_t>(size()));
    check("fcclAllGather", fcclAllGather(mine.data(), all.data(), mine.size(), DataType<T>::value, comm_, nullptr));
    return all;
  }

  // Copies root's `v` to every rank.
  template <class T> void broadcast(std::vector<T>& v, int root) {
    check("fcclBroadcast", fcclBroadcast(v.data(), v.data(), v.size(), DataType<T>::value, root, comm_, nullptr));
  }

 private:
  fcclComm_t comm_ = nullptr;
};

}  // namespace

int main() {
  try {
    Comm comm;
    const int rank = comm.rank(), n = comm.size();
    int wrong = 0;

    // The mean of every rank's vector (fcclAvg: the sum divided by the ranks).
    std::vector<double> x(1000);
    for (std::size_t i = 0; i < x.size(); i++) x[i] = rank * 2.0 + static_cast<double>(i);
    comm.all_reduce(x, fcclAvg);
    for (std::size_t i = 0; i < x.size(); i++) wrong += x[i] != (n - 1) + static_cast<double>(i);

    // Each rank's rank, squared, from every rank.
    std::vector<std::int64_t> all = comm.all_gather(std::vector<std::int64_t>{rank * rank});
    for (int r = 0; r < n; r++) wrong += all[static_cast<std::size_t>(r)] != r * r;

    // A bad argument throws on every rank; the communicator stays usable.
    try {
      comm.broadcast(x, n);  // there is no rank n
      wrong++;
    } catch (const Error& e) {
      if (e.code != fcclInvalidArgument) wrong++;
      if (rank == 0) std::printf("a bad root is refused: %s\n", e.what());
    }
    comm.broadcast(x, 0);

    if (wrong != 0) {
      std::fprintf(stderr, "rank %d: %d wrong results\n", rank, wrong);
      return 1;
    }
    if (rank == 0) std::printf("all_reduce (avg) and all_gather over %d ranks: correct\n", n);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
