// A native c10d::Backend for the "ferroccl" torch.distributed backend (ferroccl/torch.py
// builds it with torch.utils.cpp_extension at first use). Each call runs the C call on
// the caller's thread (host tensors: done when it returns; CUDA tensors: queued on the
// current stream) and returns a completed Work, so torch -> C costs a virtual call and
// no thread hand-off. startCoalescing/endCoalescing are fcclGroupStart/End, which is
// what dist.batch_isend_irecv needs. libferroccl is reached through dlopen of the path
// the Python package loaded (the same library instance, so its unique ids work here).

#include <dlfcn.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>
#include <torch/extension.h>

namespace ferroccl_torch {

namespace py = pybind11;

// The ABI's types (include/ferroccl.h), declared here so the source builds from the package alone.
using Res = int;
using Comm = void*;
using Stream = void*;
struct UniqueId {
  char internal[128];
};
struct Config {
  size_t size;
  uint32_t magic;
  uint32_t version;
  int blocking;
  int timeoutMs;
  int backend;
  const char* commName;
  int checkMode;
};
constexpr int kUndef = INT32_MIN;

struct Api {
  Res (*CommInitRankConfig)(Comm*, int, UniqueId, int, Config*);
  Res (*CommDestroy)(Comm);
  Res (*CommAbort)(Comm);
  const char* (*GetLastError)(Comm);
  const char* (*GetErrorString)(Res);
  Res (*AllReduce)(const void*, void*, size_t, int, int, Comm, Stream);
  Res (*Broadcast)(const void*, void*, size_t, int, int, Comm, Stream);
  Res (*Reduce)(const void*, void*, size_t, int, int, int, Comm, Stream);
  Res (*AllGather)(const void*, void*, size_t, int, Comm, Stream);
  Res (*ReduceScatter)(const void*, void*, size_t, int, int, Comm, Stream);
  Res (*ReduceScatterV)(const void*, const size_t*, const size_t*, void*, int, int, Comm, Stream);
  Res (*AlltoAll)(const void*, void*, size_t, int, Comm, Stream);
  Res (*AlltoAllv)(const void*, const size_t*, const size_t*, void*, const size_t*, const size_t*, int, Comm,
                   Stream);
  Res (*Gather)(const void*, void*, size_t, int, int, Comm, Stream);
  Res (*Scatter)(const void*, void*, size_t, int, int, Comm, Stream);
  Res (*Send)(const void*, size_t, int, int, Comm, Stream);
  Res (*Recv)(void*, size_t, int, int, Comm, Stream);
  Res (*Barrier)(Comm, Stream);
  Res (*GroupStart)();
  Res (*GroupEnd)();
  Res (*AllReduceCoalesced)(const void* const*, void* const*, const size_t*, int, int, int, size_t, Comm, Stream);
};

// A failed C call: the translator below turns it into ferroccl.FcclError(call, code, message).
struct CallError : std::runtime_error {
  std::string call;
  int code;
  std::string message;
  CallError(std::string c, int r, std::string m)
      : std::runtime_error(c + ": " + m), call(std::move(c)), code(r), message(std::move(m)) {}
};

template <typename F>
void sym(void* h, const char* name, F& fn) {
  fn = reinterpret_cast<F>(dlsym(h, name));
  TORCH_CHECK(fn != nullptr, "ferroccl native torch backend: ", name, " not found in libferroccl (", dlerror(), ")");
}

const Api& api(const std::string& path) {
  static Api a = [&] {
    Api x{};
    void* h = dlopen(path.c_str(), RTLD_NOW);
    TORCH_CHECK(h != nullptr, "ferroccl native torch backend: cannot load ", path, ": ", dlerror());
    sym(h, "fcclCommInitRankConfig", x.CommInitRankConfig);
    sym(h, "fcclCommDestroy", x.CommDestroy);
    sym(h, "fcclCommAbort", x.CommAbort);
    sym(h, "fcclGetLastError", x.GetLastError);
    sym(h, "fcclGetErrorString", x.GetErrorString);
    sym(h, "fcclAllReduce", x.AllReduce);
    sym(h, "fcclBroadcast", x.Broadcast);
    sym(h, "fcclReduce", x.Reduce);
    sym(h, "fcclAllGather", x.AllGather);
    sym(h, "fcclReduceScatter", x.ReduceScatter);
    sym(h, "fcclReduceScatterV", x.ReduceScatterV);
    sym(h, "fcclAlltoAll", x.AlltoAll);
    sym(h, "fcclAlltoAllv", x.AlltoAllv);
    sym(h, "fcclGather", x.Gather);
    sym(h, "fcclScatter", x.Scatter);
    sym(h, "fcclSend", x.Send);
    sym(h, "fcclRecv", x.Recv);
    sym(h, "fcclBarrier", x.Barrier);
    sym(h, "fcclGroupStart", x.GroupStart);
    sym(h, "fcclGroupEnd", x.GroupEnd);
    sym(h, "fcclAllReduceCoalesced", x.AllReduceCoalesced);
    return x;
  }();
  return a;
}

const Api* A = nullptr;

void check(const char* call, Res r) {
  if (r == 0) return;
  // The message is per thread, and the call ran on this one.
  const char* m = A->GetLastError(nullptr);
  std::string msg = (m && *m) ? m : A->GetErrorString(r);
  throw CallError(call, r, msg);
}

// The library's type for t; bool travels as uint8, int16 as two uint8 per element (`n`),
// and reductions of int16 run on an int32 copy (`reducing`).
int dtype(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case c10::ScalarType::Char: return 0;
    case c10::ScalarType::Byte: return 1;
    case c10::ScalarType::Bool: return 1;
    case c10::ScalarType::Short: return 1;
    case c10::ScalarType::Int: return 2;
    case c10::ScalarType::UInt32: return 3;
    case c10::ScalarType::Long: return 4;
    case c10::ScalarType::UInt64: return 5;
    case c10::ScalarType::Half: return 6;
    case c10::ScalarType::Float: return 7;
    case c10::ScalarType::Double: return 8;
    case c10::ScalarType::BFloat16: return 9;
    case c10::ScalarType::Float8_e4m3fn: return 10;
    case c10::ScalarType::Float8_e5m2: return 11;
    default:
      TORCH_CHECK(false, "ferroccl backend: dtype ", t.scalar_type(), " is not supported");
  }
}

int redop(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return 0;
    case c10d::ReduceOp::PRODUCT: return 1;
    case c10d::ReduceOp::MAX: return 2;
    case c10d::ReduceOp::MIN: return 3;
    case c10d::ReduceOp::AVG: return 4;
    case c10d::ReduceOp::BAND: return 64;
    case c10d::ReduceOp::BOR: return 65;
    case c10d::ReduceOp::BXOR: return 66;
    default:
      TORCH_CHECK(false, "ferroccl backend: reduce op ", static_cast<int>(op.op_),
                  " is not supported (SUM, PRODUCT, MAX, MIN, AVG, BAND, BOR, BXOR are)");
  }
}

// The library's op for reducing t with `op` (from redop): bool as torch means it (or for
// SUM, MAX and BOR; and for PRODUCT, MIN and BAND) on its uint8 carrier; no avg of bool or int16.
int op_for(int op, const at::Tensor& t, const char* call) {
  auto st = t.scalar_type();
  if (op == 4 && (st == c10::ScalarType::Bool || st == c10::ScalarType::Short))
    throw CallError(call, 4, std::string("avg of ") + c10::toString(st) +
                                 " tensors is not defined (the mean of integers or truth values is neither); "
                                 "use SUM and divide, on a float copy");
  if (st != c10::ScalarType::Bool) return op;
  switch (op) {
    case 0: case 2: case 65: return 2;  // max of 0/1: or
    case 1: case 3: case 64: return 3;  // min of 0/1: and
    default: return op;                 // bxor of 0/1 stays 0/1
  }
}

// In-place and output tensors are written through their pointer: a strided view would be wrong.
const at::Tensor& dense(const at::Tensor& t, const char* what) {
  TORCH_CHECK(t.is_contiguous(), "ferroccl backend: ", what, " needs a contiguous tensor");
  TORCH_CHECK(t.device().is_cpu() || t.device().is_cuda(), "ferroccl backend: ", what, " on ", t.device(),
              " (cpu and cuda tensors are supported)");
  return t;
}

Stream stream(const at::Tensor& t) {
  if (!t.is_cuda()) return nullptr;
  // The current stream, as NCCL's backend uses; the generic guard needs no CUDA headers here.
  c10::impl::VirtualGuardImpl impl(c10::DeviceType::CUDA);
  return impl.getStream(t.device()).native_handle();
}

// Elements of t as the library counts them: its bytes for int16 (carried as uint8).
size_t n(const at::Tensor& t) {
  return static_cast<size_t>(t.numel()) * (t.scalar_type() == c10::ScalarType::Short ? 2 : 1);
}

// Runs the reduction f on t, or for int16 on an int32 copy narrowed back after it: the
// library has no int16, and sums and products wrap as int16's own do once narrowed.
template <typename F>
void reducing(const at::Tensor& t, F&& f) {
  if (t.scalar_type() != c10::ScalarType::Short) {
    f(t);
    return;
  }
  at::Tensor w = t.to(at::kInt);
  f(w);
  t.copy_(w);
}

class FcclWork : public c10d::Work {
 public:
  FcclWork(int rank, c10d::OpType op, std::vector<at::Tensor> outputs)
      : c10d::Work(rank, op), outputs_(std::move(outputs)) {
    std::vector<c10::Device> devs;
    for (const auto& t : outputs_)
      if (t.is_cuda() && std::find(devs.begin(), devs.end(), t.device()) == devs.end()) devs.push_back(t.device());
    future_ = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()), devs);
  }

  void complete(std::exception_ptr e = nullptr) {
    if (e)
      future_->setError(e);
    else
      future_->markCompleted(c10::IValue(outputs_));
    finish(e);
  }

  std::vector<at::Tensor> result() override { return outputs_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

 private:
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupFerroccl : public c10d::Backend {
 public:
  ProcessGroupFerroccl(const std::string& lib, const py::bytes& uid, int rank, int size, int timeoutMs,
                       const std::string& name)
      : c10d::Backend(rank, size) {
    A = &api(lib);
    std::string id = uid;
    TORCH_CHECK(id.size() == sizeof(UniqueId), "ferroccl backend: unique id of ", id.size(), " bytes");
    UniqueId u;
    std::memcpy(u.internal, id.data(), sizeof(u.internal));
    Config cfg{sizeof(Config), 0xCAFEBEEFu, 1u, kUndef, timeoutMs > 0 ? timeoutMs : kUndef, kUndef, name.c_str(),
               kUndef};
    Res r;
    {
      py::gil_scoped_release nogil;  // the other ranks' threads may need the interpreter meanwhile
      r = A->CommInitRankConfig(&comm_, size, u, rank, &cfg);
    }
    check("fcclCommInitRankConfig", r);
  }

  ~ProcessGroupFerroccl() override {
    if (comm_) A->CommDestroy(comm_);
  }

  const std::string getBackendName() const override { return "ferroccl"; }
  bool supportsCoalescing() const override { return true; }

  void startCoalescing() override {
    std::lock_guard<std::mutex> hold(mu_);
    TORCH_CHECK(!coalescing_, "ferroccl backend: startCoalescing while coalescing");
    check("fcclGroupStart", A->GroupStart());
    coalescing_ = true;
  }

  c10::intrusive_ptr<c10d::Work> endCoalescing() override {
    std::lock_guard<std::mutex> hold(mu_);
    TORCH_CHECK(coalescing_, "ferroccl backend: endCoalescing without startCoalescing");
    coalescing_ = false;
    auto pending = std::move(pending_);
    pending_.clear();
    std::vector<at::Tensor> outs;
    for (auto& w : pending)
      for (auto& t : w->result()) outs.push_back(t);
    auto work = c10::make_intrusive<FcclWork>(rank_, c10d::OpType::COALESCED, outs);
    try {
      check("fcclGroupEnd", A->GroupEnd());
    } catch (...) {
      for (auto& w : pending) w->complete(std::current_exception());
      work->complete(std::current_exception());
      throw;
    }
    for (auto& w : pending) w->complete();
    work->complete();
    return work;
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& ts,
                                           const c10d::AllreduceOptions& o = c10d::AllreduceOptions()) override {
    int op = redop(o.reduceOp);
    return run(c10d::OpType::ALLREDUCE, ts, !has_short(ts), [&] {
      for (auto& t : ts) {
        dense(t, "all_reduce");
        int o = op_for(op, t, "fcclAllReduce");
        reducing(t, [&](const at::Tensor& x) {
          check("fcclAllReduce", A->AllReduce(x.data_ptr(), x.data_ptr(), n(x), dtype(x), o, comm_, stream(x)));
        });
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& ts, const c10d::AllreduceCoalescedOptions& o = c10d::AllreduceCoalescedOptions()) override {
    int op = redop(o.reduceOp);
    return run(c10d::OpType::ALLREDUCE_COALESCED, ts, true, [&] {
      if (ts.empty()) return;
      std::vector<void*> ptrs;
      std::vector<size_t> counts;
      TORCH_CHECK(ts[0].scalar_type() != c10::ScalarType::Short,
                  "ferroccl backend: all_reduce_coalesced of int16 tensors: all_reduce them one by one");
      for (auto& t : ts) {
        dense(t, "all_reduce_coalesced");
        TORCH_CHECK(t.scalar_type() == ts[0].scalar_type(), "ferroccl backend: all_reduce_coalesced of ",
                    ts[0].scalar_type(), " and ", t.scalar_type(), " tensors (one dtype per call)");
        ptrs.push_back(t.data_ptr());
        counts.push_back(n(t));
      }
      check("fcclAllReduceCoalesced", A->AllReduceCoalesced(ptrs.data(), ptrs.data(), counts.data(),
                                                            static_cast<int>(ts.size()), dtype(ts[0]),
                                                            op_for(op, ts[0], "fcclAllReduceCoalesced"), 0,
                                                            comm_, stream(ts[0])));
    });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& ts,
                                           const c10d::BroadcastOptions& o = c10d::BroadcastOptions()) override {
    int root = static_cast<int>(o.rootRank);
    return run(c10d::OpType::BROADCAST, ts, true, [&] {
      for (auto& t : ts) {
        dense(t, "broadcast");
        check("fcclBroadcast", A->Broadcast(t.data_ptr(), t.data_ptr(), n(t), dtype(t), root, comm_, stream(t)));
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& ts,
                                        const c10d::ReduceOptions& o = c10d::ReduceOptions()) override {
    int op = redop(o.reduceOp), root = static_cast<int>(o.rootRank);
    return run(c10d::OpType::REDUCE, ts, !has_short(ts), [&] {
      for (auto& t : ts) {
        dense(t, "reduce");
        int o = op_for(op, t, "fcclReduce");
        reducing(t, [&](const at::Tensor& x) {
          check("fcclReduce", A->Reduce(x.data_ptr(), x.data_ptr(), n(x), dtype(x), o, root, comm_, stream(x)));
        });
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                           const c10d::AllgatherOptions& = c10d::AllgatherOptions()) override {
    return run(c10d::OpType::ALLGATHER, flat(outs), false, [&] {
      TORCH_CHECK(outs.size() == ins.size(), "ferroccl backend: all_gather of ", ins.size(), " inputs into ",
                  outs.size(), " output lists");
      for (size_t i = 0; i < ins.size(); ++i) {
        at::Tensor in = ins[i].contiguous();
        TORCH_CHECK(static_cast<int>(outs[i].size()) == size_, "ferroccl backend: all_gather into ",
                    outs[i].size(), " tensors for ", size_, " ranks");
        at::Tensor tmp = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
        check("fcclAllGather", A->AllGather(in.data_ptr(), tmp.data_ptr(), n(in), dtype(in), comm_, stream(in)));
        for (int p = 0; p < size_; ++p) outs[i][p].copy_(tmp.narrow(0, p * in.numel(), in.numel()).view_as(outs[i][p]));
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> all_gather_single(at::Tensor& out, at::Tensor& in,
                                                   const c10d::AllgatherOptions& = c10d::AllgatherOptions()) override {
    std::vector<at::Tensor> os{out};
    return run(c10d::OpType::_ALLGATHER_BASE, os, true, [&] { gather_one(out, in); });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& o = c10d::AllgatherOptions()) override {
    return all_gather_single(out, in, o);
  }

  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
      const c10d::AllgatherOptions& = c10d::AllgatherOptions()) override {
    return run(c10d::OpType::ALLGATHER_INTO_TENSOR_COALESCED, outs, true, [&] {
      TORCH_CHECK(outs.size() == ins.size(), "ferroccl backend: ", ins.size(), " inputs for ", outs.size(), " outputs");
      grouped([&] {
        for (size_t i = 0; i < ins.size(); ++i) gather_one(outs[i], ins[i]);
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> all_gather_single_coalesced(
      std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
      const c10d::AllgatherOptions& o = c10d::AllgatherOptions()) override {
    return allgather_into_tensor_coalesced(outs, ins, o);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outs,
                                                std::vector<std::vector<at::Tensor>>& ins,
                                                const c10d::ReduceScatterOptions& o = c10d::ReduceScatterOptions()) override {
    int op = redop(o.reduceOp);
    return run(c10d::OpType::REDUCE_SCATTER, outs, false, [&] {
      TORCH_CHECK(outs.size() == ins.size(), "ferroccl backend: reduce_scatter of ", ins.size(), " input lists into ",
                  outs.size(), " outputs");
      for (size_t i = 0; i < outs.size(); ++i) {
        auto& out = dense(outs[i], "reduce_scatter");
        TORCH_CHECK(static_cast<int>(ins[i].size()) == size_, "ferroccl backend: reduce_scatter of ", ins[i].size(),
                    " tensors for ", size_, " ranks");
        std::vector<at::Tensor> parts;
        std::vector<size_t> counts, displs;
        size_t off = 0;
        for (auto& t : ins[i]) {
          parts.push_back(t.reshape(-1));
          counts.push_back(n(t));
          displs.push_back(off);
          off += n(t);
        }
        at::Tensor flatin = at::cat(parts);
        if (flatin.scalar_type() == c10::ScalarType::Short) flatin = flatin.to(at::kInt);
        int o = op_for(op, out, "fcclReduceScatterV");
        reducing(out, [&](const at::Tensor& x) {
          if (x.scalar_type() != out.scalar_type()) {  // int16 was counted in bytes; its int32 copy in elements
            for (auto& c : counts) c /= 2;
            for (auto& d : displs) d /= 2;
          }
          check("fcclReduceScatterV", A->ReduceScatterV(flatin.data_ptr(), counts.data(), displs.data(), x.data_ptr(),
                                                        dtype(x), o, comm_, stream(x)));
        });
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& o = c10d::ReduceScatterOptions()) override {
    int op = redop(o.reduceOp);
    std::vector<at::Tensor> os{out};
    return run(c10d::OpType::_REDUCE_SCATTER_BASE, os, !has_short(os), [&] { scatter_one(out, in, op); });
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& o = c10d::ReduceScatterOptions()) override {
    return reduce_scatter_single(out, in, o);
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
      const c10d::ReduceScatterOptions& o = c10d::ReduceScatterOptions()) override {
    int op = redop(o.reduceOp);
    return run(c10d::OpType::REDUCE_SCATTER_TENSOR_COALESCED, outs, true, [&] {
      TORCH_CHECK(outs.size() == ins.size(), "ferroccl backend: ", ins.size(), " inputs for ", outs.size(), " outputs");
      TORCH_CHECK(!has_short(outs), "ferroccl backend: reduce_scatter_tensor_coalesced of int16 tensors: "
                  "reduce_scatter them one by one");
      grouped([&] {
        for (size_t i = 0; i < ins.size(); ++i) scatter_one(outs[i], ins[i], op);
      });
    });
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter_single_coalesced(
      std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
      const c10d::ReduceScatterOptions& o = c10d::ReduceScatterOptions()) override {
    return reduce_scatter_tensor_coalesced(outs, ins, o);
  }

  c10::intrusive_ptr<c10d::Work> all_to_all_single(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& outSplits,
                                                   std::vector<int64_t>& inSplits,
                                                   const c10d::AllToAllOptions& = c10d::AllToAllOptions()) override {
    std::vector<at::Tensor> os{out};
    return run(c10d::OpType::ALLTOALL_BASE, os, true, [&] {
      dense(out, "all_to_all_single");
      dense(in, "all_to_all_single");
      if (outSplits.empty() && inSplits.empty()) {
        TORCH_CHECK(in.numel() % size_ == 0, "ferroccl backend: all_to_all_single of ", n(in), " elements for ", size_,
                    " ranks");
        check("fcclAlltoAll", A->AlltoAll(in.data_ptr(), out.data_ptr(), n(in) / size_, dtype(in), comm_, stream(in)));
        return;
      }
      std::vector<size_t> sc, sd, rc, rd;
      splits(in, inSplits, sc, sd);
      splits(out, outSplits, rc, rd);
      check("fcclAlltoAllv", A->AlltoAllv(in.data_ptr(), sc.data(), sd.data(), out.data_ptr(), rc.data(), rd.data(),
                                          dtype(in), comm_, stream(in)));
    });
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in, std::vector<int64_t>& outSplits,
                                               std::vector<int64_t>& inSplits,
                                               const c10d::AllToAllOptions& o = c10d::AllToAllOptions()) override {
    return all_to_all_single(out, in, outSplits, inSplits, o);
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outs, std::vector<at::Tensor>& ins,
                                          const c10d::AllToAllOptions& = c10d::AllToAllOptions()) override {
    return run(c10d::OpType::ALLTOALL, outs, false, [&] {
      TORCH_CHECK(static_cast<int>(outs.size()) == size_ && static_cast<int>(ins.size()) == size_,
                  "ferroccl backend: all_to_all of ", ins.size(), " inputs and ", outs.size(), " outputs for ", size_,
                  " ranks");
      std::vector<at::Tensor> parts;
      std::vector<size_t> sc, sd, rc, rd;
      size_t so = 0, ro = 0;
      for (int p = 0; p < size_; ++p) {
        parts.push_back(ins[p].reshape(-1));
        sc.push_back(n(ins[p]));
        sd.push_back(so);
        so += n(ins[p]);
        rc.push_back(n(outs[p]));
        rd.push_back(ro);
        ro += n(outs[p]);
      }
      at::Tensor flatin = at::cat(parts);
      at::Tensor tmp = at::empty({static_cast<int64_t>(ro)}, flatin.options());
      check("fcclAlltoAllv", A->AlltoAllv(flatin.data_ptr(), sc.data(), sd.data(), tmp.data_ptr(), rc.data(),
                                          rd.data(), dtype(flatin), comm_, stream(flatin)));
      for (int p = 0; p < size_; ++p)
        outs[p].copy_(tmp.narrow(0, static_cast<int64_t>(rd[p]), static_cast<int64_t>(rc[p])).view_as(outs[p]));
    });
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outs, std::vector<at::Tensor>& ins,
                                        const c10d::GatherOptions& o = c10d::GatherOptions()) override {
    int root = static_cast<int>(o.rootRank);
    return run(c10d::OpType::GATHER, flat(outs), false, [&] {
      TORCH_CHECK(ins.size() == 1, "ferroccl backend: gather takes one input tensor");
      at::Tensor in = ins[0].contiguous();
      if (rank_ != root) {
        check("fcclGather", A->Gather(in.data_ptr(), nullptr, n(in), dtype(in), root, comm_, stream(in)));
        return;
      }
      TORCH_CHECK(outs.size() == 1 && static_cast<int>(outs[0].size()) == size_,
                  "ferroccl backend: gather's root needs one list of ", size_, " output tensors");
      at::Tensor tmp = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
      check("fcclGather", A->Gather(in.data_ptr(), tmp.data_ptr(), n(in), dtype(in), root, comm_, stream(in)));
      for (int p = 0; p < size_; ++p) outs[0][p].copy_(tmp.narrow(0, p * in.numel(), in.numel()).view_as(outs[0][p]));
    });
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outs, std::vector<std::vector<at::Tensor>>& ins,
                                         const c10d::ScatterOptions& o = c10d::ScatterOptions()) override {
    int root = static_cast<int>(o.rootRank);
    return run(c10d::OpType::SCATTER, outs, false, [&] {
      TORCH_CHECK(outs.size() == 1, "ferroccl backend: scatter takes one output tensor");
      auto& out = dense(outs[0], "scatter");
      if (rank_ != root) {
        check("fcclScatter", A->Scatter(nullptr, out.data_ptr(), n(out), dtype(out), root, comm_, stream(out)));
        return;
      }
      TORCH_CHECK(ins.size() == 1 && static_cast<int>(ins[0].size()) == size_,
                  "ferroccl backend: scatter's root needs one list of ", size_, " input tensors");
      std::vector<at::Tensor> parts;
      for (auto& t : ins[0]) parts.push_back(t.reshape(-1));
      at::Tensor flatin = at::cat(parts);
      check("fcclScatter", A->Scatter(flatin.data_ptr(), out.data_ptr(), n(out), dtype(out), root, comm_, stream(out)));
    });
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& ts, int dst, int /*tag*/) override {
    return run(c10d::OpType::SEND, ts, true, [&] {
      for (auto& t : ts) {
        dense(t, "send");
        check("fcclSend", A->Send(t.data_ptr(), n(t), dtype(t), dst, comm_, stream(t)));
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& ts, int src, int /*tag*/) override {
    return run(c10d::OpType::RECV, ts, true, [&] {
      for (auto& t : ts) {
        dense(t, "recv");
        check("fcclRecv", A->Recv(t.data_ptr(), n(t), dtype(t), src, comm_, stream(t)));
      }
    });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& = c10d::BarrierOptions()) override {
    std::vector<at::Tensor> none;
    return run(c10d::OpType::BARRIER, none, false, [&] { check("fcclBarrier", A->Barrier(comm_, nullptr)); });
  }

  void shutdown() override {
    if (comm_) {
      Comm c = comm_;
      comm_ = nullptr;
      check("fcclCommDestroy", A->CommDestroy(c));
    }
  }

  void abort() override {
    if (comm_) {
      Comm c = comm_;
      comm_ = nullptr;
      A->CommAbort(c);
    }
  }

  // The communicator handle (an int), for tests and for ctypes callers.
  uintptr_t handle() const { return reinterpret_cast<uintptr_t>(comm_); }

 private:
  // Runs the C calls now; inside startCoalescing/endCoalescing they queue in the group and
  // their Work completes at endCoalescing. Calls that copy results out afterwards cannot queue.
  template <typename F>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType op, const std::vector<at::Tensor>& outputs, bool groupable, F&& f) {
    TORCH_CHECK(comm_ != nullptr, "ferroccl backend: the process group was shut down or aborted");
    auto work = c10::make_intrusive<FcclWork>(rank_, op, outputs);
    std::lock_guard<std::mutex> hold(mu_);  // one call at a time on the communicator, as the worker thread did
    if (coalescing_) {
      try {
        TORCH_CHECK(groupable, "ferroccl backend: ", c10d::opTypeToString(op),
                    " cannot be coalesced (its results are copied out after the call)");
        f();
      } catch (...) {
        // torch does not call endCoalescing after an exception: close the group here, or
        // every later call on this thread would queue in it and never run.
        coalescing_ = false;
        A->GroupEnd();
        for (auto& w : pending_) w->complete(std::current_exception());
        pending_.clear();
        throw;
      }
      pending_.push_back(work);
      return work;
    }
    f();  // torch's bindings released the GIL before calling in
    work->complete();
    return work;
  }

  template <typename F>
  void grouped(F&& f) {
    check("fcclGroupStart", A->GroupStart());
    try {
      f();
    } catch (...) {
      A->GroupEnd();
      throw;
    }
    check("fcclGroupEnd", A->GroupEnd());
  }

  void gather_one(at::Tensor& out, at::Tensor& in) {
    dense(out, "all_gather_into_tensor");
    dense(in, "all_gather_into_tensor");
    TORCH_CHECK(n(out) == n(in) * size_, "ferroccl backend: all_gather_into_tensor of ", n(in), " elements into ",
                n(out), " for ", size_, " ranks");
    check("fcclAllGather", A->AllGather(in.data_ptr(), out.data_ptr(), n(in), dtype(in), comm_, stream(in)));
  }

  void scatter_one(at::Tensor& out, at::Tensor& in, int op) {
    dense(out, "reduce_scatter_tensor");
    dense(in, "reduce_scatter_tensor");
    TORCH_CHECK(n(in) == n(out) * size_, "ferroccl backend: reduce_scatter_tensor of ", n(in), " elements into ",
                n(out), " for ", size_, " ranks");
    at::Tensor src = in.scalar_type() == c10::ScalarType::Short ? in.to(at::kInt) : in;
    int o = op_for(op, out, "fcclReduceScatter");
    reducing(out, [&](const at::Tensor& x) {
      check("fcclReduceScatter", A->ReduceScatter(src.data_ptr(), x.data_ptr(), n(x), dtype(x), o, comm_, stream(x)));
    });
  }

  // Reductions of int16 copy their result back after the call: they cannot queue in a batch.
  static bool has_short(const std::vector<at::Tensor>& ts) {
    for (auto& t : ts)
      if (t.scalar_type() == c10::ScalarType::Short) return true;
    return false;
  }

  void splits(const at::Tensor& t, const std::vector<int64_t>& s, std::vector<size_t>& counts,
              std::vector<size_t>& displs) {
    size_t rows = t.dim() > 0 ? static_cast<size_t>(t.size(0)) : 1;
    size_t row = rows ? n(t) / rows : 0;
    if (s.empty()) {
      TORCH_CHECK(rows % size_ == 0, "ferroccl backend: all_to_all_single: ", rows, " rows do not split into ", size_,
                  " equal parts; pass split sizes");
      counts.assign(size_, rows / size_ * row);
    } else {
      TORCH_CHECK(static_cast<int>(s.size()) == size_, "ferroccl backend: all_to_all_single: ", s.size(),
                  " split sizes for ", size_, " ranks");
      for (auto v : s) counts.push_back(static_cast<size_t>(v) * row);
    }
    size_t off = 0;
    for (auto c : counts) {
      displs.push_back(off);
      off += c;
    }
  }

  static std::vector<at::Tensor> flat(const std::vector<std::vector<at::Tensor>>& ls) {
    std::vector<at::Tensor> r;
    for (auto& l : ls)
      for (auto& t : l) r.push_back(t);
    return r;
  }

  Comm comm_ = nullptr;
  std::mutex mu_;
  bool coalescing_ = false;
  std::vector<c10::intrusive_ptr<FcclWork>> pending_;
};

}  // namespace ferroccl_torch

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using ferroccl_torch::CallError;
  using ferroccl_torch::ProcessGroupFerroccl;
  // ferroccl.FcclError with the library's message, as the Python API raises.
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const CallError& e) {
      py::object cls = py::module_::import("ferroccl._lib").attr("FcclError");
      py::object err = cls(e.call, e.code, e.message);
      PyErr_SetObject(cls.ptr(), err.ptr());
    }
  });
  py::class_<ProcessGroupFerroccl, c10d::Backend, c10::intrusive_ptr<ProcessGroupFerroccl>>(m, "ProcessGroupFerroccl")
      .def(py::init<const std::string&, const py::bytes&, int, int, int, const std::string&>(), py::arg("library"),
           py::arg("unique_id"), py::arg("rank"), py::arg("size"), py::arg("timeout_ms"), py::arg("name"))
      .def_property_readonly("handle", &ProcessGroupFerroccl::handle);
}
