// commpact_hooks: PyTorch DDP communication hooks backed by commpact compressors over
// the DDP process group (TorchComm), and a Local SGD / QSR model averager.
//
//   import torch.distributed as dist, commpact_hooks
//   state = commpact_hooks.GTopKState(density=0.01)          # the default group
//   ddp.register_comm_hook(state, commpact_hooks.gtopk_hook)
//   state = commpact_hooks.PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=2, random_seed=0)
//   ddp.register_comm_hook(state, commpact_hooks.powersgd_hook)
//   state = commpact_hooks.EFSignState()                     # EF-SignSGD, a scale per row
//   state = commpact_hooks.QSGDState(levels=256)             # QSGD with error feedback
//   avg = commpact_hooks.ModelAverager(period=4, qsr_alpha=0.2)   # without DDP
//   avg.step(list(model.parameters()), lr)
//
// A hook reduces its bucket in place (the mean, as DDP expects) while Python's GIL is
// released, and returns a completed torch.futures.Future: commpact's compressors are
// blocking, so a bucket's communication overlaps the backward of the layers before it
// only as far as DDP runs hooks while autograd goes on (it runs them on the autograd
// thread). Each bucket has its own compressor (its own residual), rebuilt when DDP
// rebuilds its buckets after the first iteration; the residuals follow their parameters
// into the new buckets (feedback_by_parameter.hpp).
//
// CUDA buckets (built with COMMPACT_HOOKS_CUDA, setup.py's CUDA variant): the step runs
// in commpact's CUDA space (commpact_hooks_cuda.cu) on PyTorch's current stream, over
// the same group through a torch_group_link (ProcessGroupNCCL directly; another backend,
// Gloo, staged through host memory), with device memory from PyTorch's caching
// allocator. gtopk_hook and powersgd_hook (with its dense warm-up) queue the step and
// return at once a torch.futures.Future on the bucket's device completed on the stream,
// as PyTorch's own hooks do: Future(devices=[d]) is a c10::ivalue::Future with that CUDA
// device, and set_result (markCompleted) records an event on the current stream after
// the queued step and records the bucket's storage on that stream (caching allocator), so
// DDP's wait() only makes its stream wait and backward goes on while the step runs. The
// step's status is read when the same bucket comes again (the next step's hook raises
// its error, alike on every rank) or at state.synchronize(). topk_hook, efsign_hook and
// qsgd_hook decode after the host read the frames' flags: they wait once per bucket.
//
// PowerSGD follows PyTorch's powerSGD_hook step for step (same rank clamping and
// min_compression_rate rule, P and Q allreduced as sums, Q divided by the world size,
// error feedback, warm start) and draws the first Q exactly as PyTorch does
// (numpy RandomState(random_seed).randint(1e9) seeds torch.randn per bucket, tensors
// grouped by shape), so at the same rank and seed both hooks agree within float
// rounding (tests/torch/test_ddp_hooks.py checks it).
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/extension.h>
#include <pybind11/eval.h>
#if defined(COMMPACT_HOOKS_CUDA)
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAStream.h>

#include <commpact/torch/torch_group_link.hpp>

#include "commpact_hooks_cuda.hpp"
#endif
#include "feedback_by_parameter.hpp"

#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/codecs/per_tensor.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/comm/agree.hpp>
#include <commpact/detail/hash.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/torch/torch_comm.hpp>

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace py = pybind11;
using Comm = commpact::CountingComm<commpact::TorchComm>;

namespace {

c10::intrusive_ptr<c10d::ProcessGroup> group_or_default(py::object pg) {
  if (pg.is_none()) pg = py::module_::import("torch.distributed.distributed_c10d").attr("_get_default_group")();
  try {
    return pg.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
  } catch (const py::cast_error&) {
    throw py::type_error(commpact::detail::cat(
        "commpact_hooks: process_group= must be a torch.distributed ProcessGroup this process belongs to (from "
        "init_process_group or new_group), or None for the default group; got ",
        py::str(py::repr(pg)).cast<std::string>(), "."));
  }
}
c10::intrusive_ptr<c10d::Store> store_or_default(py::object store) {
  if (store.is_none()) store = py::module_::import("torch.distributed.distributed_c10d").attr("_get_default_store")();
  try {
    return store.cast<c10::intrusive_ptr<c10d::Store>>();
  } catch (const py::cast_error&) {
    throw py::type_error(commpact::detail::cat(
        "commpact_hooks: store= must be a torch.distributed Store (TCPStore, FileStore, ...) that every rank of "
        "the group shares, or None for the default group's; got ", py::str(py::repr(store)).cast<std::string>(), "."));
  }
}

//! The options of a new state. Its store keys (the failure notice) are `<name>#<i>`, the
//! i-th state this process made with that name: a state made after another one failed
//! (after a bad argument, say) does not read the old one's notice. Every rank makes its
//! states in the same order, as DDP needs of its hooks anyway.
commpact::torch_options torch_opts(double timeout_s, const std::string& name) {
  // At most commpact::max_timeout (10^12 ms): a longer one overflowed the deadlines.
  constexpr double max_s = static_cast<double>(commpact::max_timeout.count()) / 1000.0;
  if (!std::isfinite(timeout_s) || timeout_s * 1000.0 < 1.0 || timeout_s > max_s)
    throw py::value_error(commpact::detail::cat("commpact_hooks: timeout=", timeout_s,
                                                " must be a finite number of seconds, at least 0.001 and at most 1e9 "
                                                "(about 31 years; the default is 300): it bounds every wait on a peer."));
  static std::mutex m;
  static std::map<std::string, std::int64_t> made;
  commpact::torch_options o;
  o.timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  std::lock_guard<std::mutex> g(m);
  o.name = commpact::detail::cat(name, "#", made[name]++);
  return o;
}

#if defined(COMMPACT_HOOKS_CUDA)
//! Whether the group reduces CUDA tensors with NCCL: a group made for NCCL, or one made
//! for several devices whose CUDA backend is NCCL. PyTorch 2 says so in the group's
//! backend config ("cuda:nccl", "cpu:gloo,cuda:nccl"); its get_backend() names a group
//! made by init_process_group() with no backend "undefined", though that group's CUDA
//! backend is NCCL. PyTorch 1.13 has get_backend() only.
bool cuda_backend_is_nccl(const py::object& pg, const c10d::ProcessGroup& group) {
  std::string b;
  try {
    const auto dist = py::module_::import("torch.distributed");
    b = py::str(py::hasattr(dist, "get_backend_config") ? dist.attr("get_backend_config")(pg)
                                                         : dist.attr("get_backend")(pg));
  } catch (const py::error_already_set&) {
    b = group.getBackendName();
  }
  return b == "nccl" || b.find("cuda:nccl") != std::string::npos;
}

// PyTorch's caching allocator as commpact's stream-ordered allocator hook. PyTorch names
// its default (legacy NULL) stream nullptr; the hooks' executor names it cudaStreamLegacy
// (commpact_hooks_cuda.cu, comm_on), mapped back here so that both use one pool.
void* torch_alloc(std::size_t bytes, void* stream, void*) {
  auto s = static_cast<cudaStream_t>(stream);
  if (s == cudaStreamLegacy) s = nullptr;
  try {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, s);
  } catch (...) {
    return nullptr;  // commpact raises device_error
  }
}
void torch_free(void* p, std::size_t, void*, void*) { c10::cuda::CUDACachingAllocator::raw_delete(p); }
#endif

// Where a CPU hook's step is in DDP's terms: the iteration (the state's count of buckets
// with is_last()) and the bucket's index; -1: not a bucket (ModelAverager).
struct ddp_where {
  std::int64_t iteration = -1, bucket = -1;
};

// A non-finite step's error ends with the C++ advice to set on_nonfinite
// (nonfinite_default_remedy), which the Python states do not have: a hook's error says
// what holds in Python instead. Its "at step S" counts the bucket's compressor's steps,
// which start again from 0 when DDP rebuilds its buckets: a hook's error names the
// iteration (counted by the state from its first backward) and DDP's bucket instead.
[[noreturn]] void raise_for_python(const commpact::numeric_error& e, ddp_where where = {}) {
  std::string m = e.what();
  if (constexpr std::string_view at_step = " at step "; where.iteration >= 0)
    if (const auto at = m.find(at_step); at != std::string::npos) {
      auto end = at + at_step.size();
      while (end < m.size() && m[end] >= '0' && m[end] <= '9') ++end;
      m.replace(at, end - at,
                commpact::detail::cat(" at iteration ", where.iteration, " of this state (DDP bucket ", where.bucket, ")"));
    }
  constexpr std::string_view cpp_remedy = commpact::detail::nonfinite_default_remedy;
  // Its first sentence ("Fix the gradient (...)") holds in Python too; the clause from ", or"
  // on names the C++ option.
  constexpr std::size_t keep = cpp_remedy.find(", or ");
  static_assert(keep != std::string_view::npos, "nonfinite_default_remedy's option clause moved");
  if (const auto at = m.find(cpp_remedy); at != std::string::npos)
    m.replace(at + keep, cpp_remedy.size() - keep,
              "; commpact_hooks cannot skip such a step, so dynamic loss scaling (AMP's GradScaler) is not "
              "supported yet (docs/pytorch.md).");
  throw commpact::numeric_error(m);
}

// Runs check() and returns pg: a state's constructor checks its arguments with it in its
// HookBase initializer, so that a bad argument is the error even where the process group
// (resolved by HookBase) is missing.
template <class Check>
py::object checked_first(py::object pg, Check&& check) {
  check();
  return pg;
}

// What every hook state keeps: its communicator over the group (CPU buckets) and, for
// CUDA buckets, the CUDA side (made at the first CUDA bucket).
struct HookBase {
  HookBase(py::object pg, py::object store, double timeout_s, const std::string& name)
      : group(group_or_default(pg)), st(store_or_default(store)), opt(torch_opts(timeout_s, name)),
        comm(commpact::TorchComm{group, st, opt}) {
#if defined(COMMPACT_HOOKS_CUDA)
    cuda_on_nccl = cuda_backend_is_nccl(pg, *group);
#endif
  }
  c10::intrusive_ptr<c10d::ProcessGroup> group;
  c10::intrusive_ptr<c10d::Store> st;
  commpact::torch_options opt;
  Comm comm;
  // DDP iterations this state has seen, counted at each is_last() bucket: PowerSGD's (PyTorch's
  // state.iter; CPU and CUDA), the others' CPU buckets (a non-finite error names it).
  std::int64_t iteration = 0;
#if defined(COMMPACT_HOOKS_CUDA)
  commpact_hooks_cuda::params cuda_params;
  std::shared_ptr<commpact_hooks_cuda::state> cuda;
  bool cuda_on_nccl = false;
  commpact_hooks_cuda::state& cuda_state() {
    if (!cuda) {
      // NCCL takes the device buffers; any other backend (Gloo) is staged through the host.
      cuda = std::make_shared<commpact_hooks_cuda::state>(
          commpact::make_torch_group_link(group, st, opt, !cuda_on_nccl), cuda_params,
          commpact_hooks_cuda::allocator{&torch_alloc, &torch_free, nullptr});
    }
    return *cuda;
  }
#endif
  std::uint64_t bytes_sent() const {
    std::uint64_t b = comm.stats().bytes_sent;
#if defined(COMMPACT_HOOKS_CUDA)
    if (cuda) b += cuda->bytes_sent();
#endif
    return b;
  }
  //! CUDA buckets: finishes the steps still in flight (waits for them on the host) and
  //! raises the first one's error, which aborts the state's communicators as a hook's does.
  void synchronize() {
#if defined(COMMPACT_HOOKS_CUDA)
    if (!cuda) return;
    py::gil_scoped_release nogil;
    try {
      cuda->settle();
    } catch (const commpact::numeric_error& e) {
      abort_for_python(e);
    } catch (const std::exception& e) {
      abort(e.what());
      throw;
    }
#endif
  }
  void abort(const std::string& why) {
    comm.abort(why);
#if defined(COMMPACT_HOOKS_CUDA)
    if (cuda) cuda->abort(why);
#endif
  }
  //! Aborts with e's message as a Python user reads it (raise_for_python) and raises it.
  [[noreturn]] void abort_for_python(const commpact::numeric_error& e) {
    try {
      raise_for_python(e);
    } catch (const commpact::numeric_error& p) {
      abort(p.what());
      throw;
    }
  }

  // The hook and the state arguments the ranks must agree on ("gtopk_hook(density=0.1)"; not
  // momentum, a rank's own error feedback, nor QSGD's seed, which each rank's stream mixes
  // with its rank: the compressors' own agreements leave them out too); set by each state.
  std::string hook;
  bool hook_agreed = false;
  // At the first bucket: one allreduce (max) of a 62-bit hash of the hook, its arguments
  // and the state's name, and its negation, uncounted (bytes_sent() stays what the
  // compressors send): on the communicator's inner one for a CPU bucket, on the CUDA side's
  // control plane for a CUDA bucket (agree_hook_on; ProcessGroupNCCL refuses CPU tensors).
  // Ranks that registered different hooks, arguments or names raise mismatch_error alike,
  // instead of pairing unrelated messages (a size mismatch, or a wait until the timeout:
  // gTop-k's tree against Top-k's allgather) or watching different failure notices (the
  // name keys them).
  void agree_hook() {
    agree_hook_with([&](std::span<std::int64_t> v) { comm.inner().allreduce(v, commpact::reduce_op::max); });
  }
#if defined(COMMPACT_HOOKS_CUDA)
  void agree_hook_on(const commpact_hooks_cuda::bucket& b) {
    agree_hook_with([&](std::span<std::int64_t> v) { cuda_state().agree_uncounted(b, v); });
  }
#endif
  template <class AllreduceMax>
  void agree_hook_with(AllreduceMax&& allreduce_max) {
    if (hook_agreed) return;
    const std::string key = hook + "|" + opt.name;
    std::uint64_t h = 1469598103934665603ull;  // FNV-1a
    for (const unsigned char c : key) h = (h ^ c) * 1099511628211ull;
    const auto mine = static_cast<std::int64_t>(h >> 2);
    std::int64_t v[2] = {mine, -mine};
    allreduce_max(std::span<std::int64_t>(v));
    if (v[0] != mine || v[1] != -mine)
      throw commpact::mismatch_error(commpact::detail::cat(
          "commpact_hooks: the ranks registered different hooks, state arguments or names: rank ", comm.rank(),
          " runs ", hook, " with name=\"", opt.name, "\" and another rank does not. Register the same hook with "
          "the same state arguments on every rank. A name counts the states made with it in this process (#i): "
          "where ranks make states for different process groups, give each group's states a name of their own "
          "(name=...)."));
    hook_agreed = true;
  }
};


// torch_guard (an error reaches every rank) with raise_for_python's message, which is
// also the reason the communicator keeps (a later call's "failed earlier (...)" quotes it).
template <class F>
void hook_guard(Comm& comm, F&& f, ddp_where where = {}) {
  commpact::torch_guard(comm, [&] {
    try {
      f();
    } catch (const commpact::numeric_error& e) {
      raise_for_python(e, where);
    }
  });
}

std::span<float> float_span(const at::Tensor& t, const char* who) {
  commpact::require(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), who,
                    ": the bucket must be a contiguous float32 CPU tensor (got ", t.toString(), ").");
  return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
}

// A CUDA bucket: f(cuda side, bucket) with the GIL released (it queues the step on the
// current stream; an earlier step's error raises here); an exception aborts the state's
// communicators (the other ranks raise too) and is rethrown. Returns the Future on the
// bucket's device, completed on the current stream after the queued step.
#if defined(COMMPACT_HOOKS_CUDA)
// The CUDA side's view of a contiguous float32 CUDA tensor on PyTorch's current stream.
commpact_hooks_cuda::bucket bucket_of(const at::Tensor& t, const char* who) {
  commpact::require(t.is_cuda() && t.scalar_type() == at::kFloat && t.is_contiguous(), who,
                    ": the bucket must be a contiguous float32 CUDA tensor (got ", t.toString(), ").");
  const int dev = static_cast<int>(t.get_device());
  return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel()), dev,
          static_cast<void*>(c10::cuda::getCurrentCUDAStream(static_cast<c10::DeviceIndex>(dev)).stream())};
}
#endif

template <class F>
py::object run_cuda(HookBase& st, const at::Tensor& t, const char* who, F&& f) {
#if defined(COMMPACT_HOOKS_CUDA)
  {
    py::gil_scoped_release nogil;
    try {
      const commpact_hooks_cuda::bucket b = bucket_of(t, who);  // not float32: the others raise too
      st.agree_hook_on(b);
      f(st.cuda_state(), b);
    } catch (const commpact::numeric_error& e) {
      st.abort_for_python(e);
    } catch (const std::exception& e) {
      st.abort(e.what());
      throw;
    }
  }
  py::list devices;
  devices.append(py::cast(t).attr("device"));
  auto fut = py::module_::import("torch.futures").attr("Future")(py::arg("devices") = devices);
  // markCompleted: records an event on the current stream (the value is ready for work
  // queued after it, no host wait) and the bucket's storage on that stream.
  fut.attr("set_result")(t);
  return fut;
#else
  throw commpact::invalid_argument(commpact::detail::cat(
      who, ": the bucket is a CUDA tensor but this commpact_hooks was built without CUDA (the torch it was built "
      "against had none, or COMMPACT_HOOKS_CUDA=0); reinstall it with pip against a PyTorch with CUDA and a CUDA "
      "toolkit (CUDA_HOME)."));
#endif
}

py::object completed_future(const at::Tensor& t) {
  auto fut = py::module_::import("torch.futures").attr("Future")();
  fut.attr("set_result")(t);
  return fut;
}

// The shapes of a bucket's tensors as PyTorch's PowerSGD views them: rows = dim 0.
// An empty tensor (a zero-size parameter) has no place in the buffer and is left out.
commpact::tensor_layout layout_of(const std::vector<at::Tensor>& grads) {
  commpact::tensor_layout l;
  for (const auto& g : grads) {
    if (g.numel() == 0) continue;
    const std::int64_t n = g.dim() == 0 ? 1 : g.size(0);
    l.push_back({n, n == 0 ? 0 : g.numel() / n});
  }
  return l;
}

// A bucket's parameters as feedback_by_parameter.hpp knows them: identity, length, rows.
commpact_hooks::bucket_params params_of(const py::object& bucket) {
  commpact_hooks::bucket_params ps;
  for (const auto& t : bucket.attr("parameters")().cast<std::vector<at::Tensor>>())
    ps.push_back({reinterpret_cast<std::uintptr_t>(t.unsafeGetTensorImpl()), t.numel(),
                  t.dim() == 0 ? 1 : t.size(0)});
  return ps;
}

// ---- sparse hooks: TopK and gTopK --------------------------------------------------
template <class C>
struct SparseState : HookBase {
  SparseState(py::object pg, double density, float momentum, py::object store, double timeout_s, std::string name)
      : HookBase(checked_first(pg,
                               [&] {
                                 // Here, not at the first backward (where the error would also
                                 // abort the state), and before the group is resolved.
                                 commpact::detail::validate_sparse_options(
                                     {.density = density, .momentum = momentum},
                                     std::is_same_v<C, commpact::TopK<Comm>> ? "commpact_hooks.TopKState"
                                                                             : "commpact_hooks.GTopKState");
                               }),
                 store, timeout_s, name),
        opt{.density = density, .momentum = momentum} {
    hook = commpact::detail::cat(std::is_same_v<C, commpact::TopK<Comm>> ? "topk_hook" : "gtopk_hook",
                                 "(density=", density, ")");
#if defined(COMMPACT_HOOKS_CUDA)
    cuda_params.m = std::is_same_v<C, commpact::TopK<Comm>> ? commpact_hooks_cuda::method::topk
                                                            : commpact_hooks_cuda::method::gtopk;
    cuda_params.density = density;
    cuda_params.momentum = momentum;
#endif
  }
  commpact::sparse_options opt;
  commpact_hooks::bucket_compressors<C> buckets;  // by bucket index, known by its parameters

  void reduce(std::int64_t index, const commpact_hooks::bucket_params& ps, std::span<float> g) {
    buckets.get(index, ps, static_cast<std::int64_t>(g.size()), [&] { return std::make_unique<C>(comm, opt); })
        .reduce(g);
  }
};
using TopKState = SparseState<commpact::TopK<Comm>>;
using GTopKState = SparseState<commpact::gTopK<commpact::TreeComm<Comm>>>;

template <class S>
py::object sparse_hook(S& st, py::object bucket) {
  at::Tensor buf = bucket.attr("buffer")().cast<at::Tensor>();
  const auto index = bucket.attr("index")().cast<std::int64_t>();
  const auto ps = params_of(bucket);
  if (buf.is_cuda())
    return run_cuda(st, buf, "commpact_hooks", [&](auto& cs, const auto& b) {
      cs.reduce(index, b, {}, ps);
    });
  const bool last = bucket.attr("is_last")().cast<bool>();
  {
    py::gil_scoped_release nogil;
    hook_guard(st.comm, [&] {  // an error reaches every rank, a bucket that is not float32 too
      const auto g = float_span(buf, "commpact_hooks");
      st.agree_hook();
      st.reduce(index, ps, g);
    }, {st.iteration, index});
  }
  if (last) ++st.iteration;
  return completed_future(buf);
}

// ---- PowerSGD ----------------------------------------------------------------------
#if defined(COMMPACT_HOOKS_CUDA)
// A CUDA bucket's PowerSGD compressor as draw_q sees it.
struct cuda_power_view {
  commpact_hooks_cuda::state& s;
  std::int64_t index;
  bool is_compressed(std::size_t i) const { return s.is_compressed(index, i); }
  std::size_t rank_of(std::size_t i) const { return s.rank_of(index, i); }
  void set_q_factor(std::size_t i, std::span<const float> q) { s.set_q_factor(index, i, q); }
};
#endif

struct PowerSGDState : HookBase {
  static void check_args(int rank, std::int64_t start_iter, double min_rate) {
    commpact::require(rank >= 1, "commpact_hooks.PowerSGDState: matrix_approximation_rank is ", rank,
                      "; it must be >= 1.");
    commpact::require(std::isfinite(min_rate) && min_rate >= 0, "commpact_hooks.PowerSGDState: min_compression_rate is ",
                      min_rate, "; it must be a finite number >= 0 (0 compresses every matrix; 2 is PyTorch's "
                      "default).");
    // As PyTorch's PowerSGDState: a bucket's compressor keeps its residual and warm-start
    // factors by position, and DDP reorders its buckets after the first iteration.
    commpact::require(start_iter >= 2, "commpact_hooks.PowerSGDState: start_powerSGD_iter is ", start_iter,
                      "; it must be >= 2 (as PyTorch's PowerSGDState requires): DDP rebuilds its buckets after the "
                      "first iteration, so compression starts after it.");
  }
  PowerSGDState(py::object pg, int rank, std::int64_t start_iter, double min_rate, std::int64_t seed,
                py::object store, double timeout_s, std::string name)
      : HookBase(checked_first(pg, [&] { check_args(rank, start_iter, min_rate); }), store, timeout_s, name),
        rank(rank), start_iter(start_iter), min_rate(min_rate),
        rng(py::module_::import("numpy").attr("random").attr("RandomState")(seed)), dense(comm) {
    hook = commpact::detail::cat("powersgd_hook(matrix_approximation_rank=", rank, ", start_powerSGD_iter=", start_iter,
                                 ", min_compression_rate=", min_rate, ", random_seed=", seed, ")");
#if defined(COMMPACT_HOOKS_CUDA)
    cuda_params.m = commpact_hooks_cuda::method::powersgd;
    cuda_params.rank = rank;
    cuda_params.min_rate = min_rate;
#endif
  }
  int rank;
  std::int64_t start_iter;
  double min_rate;
  py::object rng;
  commpact::Dense<Comm> dense;
  struct entry {
    commpact::tensor_layout layout;
    commpact_hooks::bucket_params params;
    std::unique_ptr<commpact::PowerCompressor<1>> psgd;
  };
  std::map<std::int64_t, entry> buckets;

  // PyTorch's first Q of a bucket: seeded from the numpy generator, randn per tensor in
  // the order of the shape groups, each m x r (row-major), stored column-major here.
  // PyTorch also compresses a vector (n x 1 or 1 x n) when min_compression_rate < n / (n + 1);
  // commpact allreduces vectors dense (exact either way at rank 1), but draws and drops
  // such a vector's Q so that the matrices' Qs are PyTorch's.
  template <class P>
  void draw_q(P& p, const commpact::tensor_layout& l) {
    const auto seed = rng.attr("randint")(1000000000).cast<std::int64_t>();
    auto gen = at::detail::createCPUGenerator(static_cast<std::uint64_t>(seed));
    const auto drawn = [&](std::size_t i) {
      return p.is_compressed(i) ||
             (l[i].is_vector() && commpact::detail::pytorch_compresses(l[i].rows, l[i].cols, rank, min_rate));
    };
    std::vector<std::pair<std::int64_t, std::int64_t>> shapes;  // groups in order of first appearance
    for (std::size_t i = 0; i < l.size(); ++i) {
      if (!drawn(i)) continue;
      const std::pair<std::int64_t, std::int64_t> s{l[i].rows, l[i].cols};
      if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
    }
    for (const auto& s : shapes)
      for (std::size_t i = 0; i < l.size(); ++i) {
        if (!drawn(i) || l[i].rows != s.first || l[i].cols != s.second) continue;
        const auto m = static_cast<std::size_t>(l[i].cols);
        const std::size_t r = p.is_compressed(i) ? p.rank_of(i) : 1;  // a vector's rank clamps to 1
        at::Tensor q = at::randn({static_cast<std::int64_t>(m), static_cast<std::int64_t>(r)}, gen);
        if (!p.is_compressed(i)) continue;  // a vector PyTorch compresses: its draw only
        const float* src = q.data_ptr<float>();
        std::vector<float> cm(m * r);
        for (std::size_t a = 0; a < m; ++a)
          for (std::size_t j = 0; j < r; ++j) cm[j * m + a] = src[a * r + j];
        p.set_q_factor(i, cm);
      }
  }

  // A bucket's compressor (residual and warm-start Q) is known by its parameters: one
  // that comes with other parameters (a state registered on two models) starts afresh
  // instead of compressing one model's gradient with the other's residual.
  void reduce(std::int64_t index, const commpact::tensor_layout& l, const commpact_hooks::bucket_params& ps,
              std::span<float> g, bool last) {
    if (iteration < start_iter) {
      dense.reduce(g);
    } else {
      auto& e = buckets[index];
      if (!e.psgd || !(e.layout == l) || !(e.params == ps)) {
        e.layout = l;
        e.params = ps;
        e.psgd = std::make_unique<commpact::PowerCompressor<1>>(
            comm, l, commpact::power_options{.approximation_rank = rank, .min_compression_rate = min_rate});
        py::gil_scoped_acquire gil;
        draw_q(*e.psgd, l);
      }
      e.psgd->reduce(g);
    }
    if (last) ++iteration;
  }
#if defined(COMMPACT_HOOKS_CUDA)
  // The same steps in the CUDA space: dense before start_iter, then PowerSGD with
  // PyTorch's first Q.
  void reduce_cuda(commpact_hooks_cuda::state& cs, std::int64_t index, const commpact::tensor_layout& l,
                   const commpact_hooks_cuda::bucket& b, bool last) {
    if (iteration < start_iter) {
      cs.reduce_dense(index, b);
    } else {
      if (cs.power_prepare(index, b, l)) {
        cuda_power_view v{cs, index};
        py::gil_scoped_acquire gil;
        draw_q(v, l);
      }
      cs.reduce(index, b, l, {});  // PowerSGD: compression starts after the rebuild
    }
    if (last) ++iteration;
  }
#endif
};

py::object powersgd_hook(PowerSGDState& st, py::object bucket) {
  at::Tensor buf = bucket.attr("buffer")().cast<at::Tensor>();
  const auto index = bucket.attr("index")().cast<std::int64_t>();
  const bool last = bucket.attr("is_last")().cast<bool>();
  const auto l = layout_of(bucket.attr("gradients")().cast<std::vector<at::Tensor>>());
#if defined(COMMPACT_HOOKS_CUDA)
  if (buf.is_cuda())
    return run_cuda(st, buf, "commpact_hooks.powersgd_hook",
                    [&](auto& cs, const auto& b) { st.reduce_cuda(cs, index, l, b, last); });
#else
  if (buf.is_cuda()) return run_cuda(st, buf, "commpact_hooks.powersgd_hook", [](auto&, const auto&) {});
#endif
  const auto ps = params_of(bucket);  // CPU buckets only: the CUDA side keys PowerSGD by layout
  {
    py::gil_scoped_release nogil;
    hook_guard(st.comm, [&] {
      const auto g = float_span(buf, "commpact_hooks.powersgd_hook");
      st.agree_hook();
      st.reduce(index, l, ps, g, last);
    }, {st.iteration, index});
  }
  return completed_future(buf);
}

// ---- codec hooks: EF-SignSGD and QSGD ---------------------------------------------------
// A bucket's codec compressor, rebuilt when the bucket holds other parameters (or
// shapes, hence another layout), its residual following them (feedback_by_parameter.hpp).
template <class C>
struct CodecState : HookBase {
  using Make = std::function<C(Comm&, const commpact::tensor_layout&)>;
  CodecState(py::object pg, py::object store, double timeout_s, std::string name, Make make)
      : HookBase(pg, store, timeout_s, name), make(std::move(make)) {}
  Make make;
  commpact_hooks::bucket_compressors<C> buckets;
  void reduce(std::int64_t index, const commpact_hooks::bucket_params& ps, const commpact::tensor_layout& l,
              std::span<float> g) {
    buckets.get(index, ps, static_cast<std::int64_t>(g.size()), [&] { return std::make_unique<C>(make(comm, l)); })
        .reduce(g);
  }
};
using SignK = commpact::per_tensor<commpact::sign_codec>;
using EFSignState = CodecState<commpact::CodecCompressor<SignK, commpact::Allgather<Comm>>>;
using QSGDState = CodecState<commpact::CodecCompressor<commpact::qsgd_codec, commpact::Allgather<Comm>>>;

// Checked when the state is made, not at the first backward (where the error would also
// abort the state): the codec compressors' own checks name C++ classes.
void check_codec_momentum(float momentum, const char* who) {
  commpact::require(momentum >= 0.0f && momentum < 1.0f, who, ": momentum is ", momentum,
                    "; it must be in [0, 1) (0 turns momentum correction off).");
}

EFSignState make_efsign(py::object pg, float momentum, py::object store, double timeout_s, std::string name) {
  check_codec_momentum(momentum, "commpact_hooks.EFSignState");
  EFSignState s(pg, store, timeout_s, std::move(name), [momentum](Comm& c, const commpact::tensor_layout& l) {
    // A scale per row of each weight matrix and per bias (split_rows), as the LibTorch CNN.
    return EFSignState::Make::result_type{c, SignK{commpact::split_rows(l), commpact::sign_codec{}},
                                          commpact::codec_options{.momentum = momentum}};
  });
  s.hook = "efsign_hook()";
#if defined(COMMPACT_HOOKS_CUDA)
  s.cuda_params.m = commpact_hooks_cuda::method::efsign;
  s.cuda_params.momentum = momentum;
#endif
  return s;
}
QSGDState make_qsgd(py::object pg, std::uint32_t levels, std::size_t bucket, std::uint64_t seed, float momentum,
                    py::object store, double timeout_s, std::string name) {
  check_codec_momentum(momentum, "commpact_hooks.QSGDState");
  commpact::require(levels >= 1 && levels <= commpact::qsgd_codec::max_levels, "commpact_hooks.QSGDState: levels is ",
                    levels, "; it must be in [1, ", commpact::qsgd_codec::max_levels, "] (256 is the default; with "
                    "error feedback, few levels can make training diverge: docs/pytorch.md).");
  QSGDState s(pg, store, timeout_s, std::move(name), [=](Comm& c, const commpact::tensor_layout&) {
    return QSGDState::Make::result_type{c, commpact::qsgd_codec{levels, seed, bucket},
                                        commpact::codec_options{.momentum = momentum}};
  });
  s.hook = commpact::detail::cat("qsgd_hook(levels=", levels, ", bucket=", bucket, ")");
#if defined(COMMPACT_HOOKS_CUDA)
  s.cuda_params.m = commpact_hooks_cuda::method::qsgd;
  s.cuda_params.levels = levels;
  s.cuda_params.qsgd_bucket = bucket;
  s.cuda_params.seed = seed;
  s.cuda_params.momentum = momentum;
#endif
  return s;
}

template <class S>
py::object codec_hook(S& st, py::object bucket) {
  at::Tensor buf = bucket.attr("buffer")().cast<at::Tensor>();
  const auto index = bucket.attr("index")().cast<std::int64_t>();
  const auto l = layout_of(bucket.attr("gradients")().cast<std::vector<at::Tensor>>());
  const auto ps = params_of(bucket);
  if (buf.is_cuda())
    return run_cuda(st, buf, "commpact_hooks", [&](auto& cs, const auto& b) { cs.reduce(index, b, l, ps); });
  const bool last = bucket.attr("is_last")().cast<bool>();
  {
    py::gil_scoped_release nogil;
    hook_guard(st.comm, [&] {
      const auto g = float_span(buf, "commpact_hooks");
      st.agree_hook();
      st.reduce(index, ps, l, g);
    }, {st.iteration, index});
  }
  if (last) ++st.iteration;
  return completed_future(buf);
}

// ---- Local SGD / QSR model averaging -------------------------------------------------
// Parameters in host memory are averaged by Dense over TorchComm; CUDA parameters on the
// device, by the CUDA side's Dense over the group (TorchCudaComm: ProcessGroupNCCL takes the
// device buffer; Gloo is staged), on PyTorch's current stream, waited for before step() returns.
struct ModelAverager : HookBase {
  ModelAverager(py::object pg, std::int64_t period, double qsr_alpha, std::int64_t warmup, py::object store,
                double timeout_s, std::string name)
      : HookBase(checked_first(pg,
                               [&] {
                                 commpact::require(period >= 1, "commpact_hooks.ModelAverager: period is ", period,
                                                   "; it must be >= 1.");
                                 commpact::require(qsr_alpha >= 0, "commpact_hooks.ModelAverager: qsr_alpha must be "
                                                                   ">= 0 (0: Local SGD).");
                               }),
                 store, timeout_s, name),
        dense(comm) {
    if (qsr_alpha > 0) policy.emplace<commpact::QSRPolicy>(qsr_alpha, period, warmup);
    else policy.emplace<commpact::LocalSgd>(period);
  }
  commpact::Dense<Comm> dense;
  std::variant<commpact::LocalSgd, commpact::QSRPolicy> policy{commpact::LocalSgd{1}};
  std::int64_t step_ = 0, next_ = -1, rounds_ = 0;
  std::vector<float> flat;

  //! Call after each optimizer step with the parameters and the step's learning rate;
  //! averages them (in place, the same on every rank) when the period ends. Returns
  //! whether it did.
  bool step(const std::vector<at::Tensor>& params, double lr) {
    if (next_ < 0) next_ = end_of_period(lr);
    ++step_;
    if (step_ < next_) return false;
    const bool on_device = !params.empty() && params.front().is_cuda();
    {
      py::gil_scoped_release nogil;
      hook_guard(comm, [&] {
        check_float32(params);  // inside the guard: the other ranks raise too
        if (!on_device)  // CUDA parameters: average_on_device checks on the CUDA side (NCCL refuses CPU tensors)
          require_same_round(
              [&](std::initializer_list<commpact::agreement_item> items) { commpact::require_same(comm, items); },
              shapes_hash(params));
      });
    }
    if (on_device) average_on_device(params);
    else average_on_host(params);
    ++rounds_;
    next_ = end_of_period(lr);
    return true;
  }
  //! One allreduce of 4 int64 per round (by `same`, commpact::require_same's shape): ranks
  //! whose periods or parameters differ raise here, alike.
  template <class Same>
  void require_same_round(Same&& same, std::int64_t shapes) const {
    same({{"the step of this averaging round (ModelAverager)", step_,
           "every rank must pass the same period, qsr_alpha, warmup and learning rates, and call step() after "
           "every optimizer step."},
          {"parameter shapes, in order (ModelAverager; a hash of them)", shapes,
           "every rank must pass the same parameters in the same order."}});
  }
  //! The average is taken in float32: another dtype would be rounded (float64) or
  //! truncated (integers) silently.
  static void check_float32(const std::vector<at::Tensor>& params) {
    for (std::size_t i = 0; i < params.size(); ++i)
      commpact::require(params[i].scalar_type() == at::kFloat, "commpact_hooks.ModelAverager.step: parameter ", i,
                        " is ", c10::toString(params[i].scalar_type()), "; the averager averages float32 "
                        "parameters only (another dtype would be rounded or truncated). Pass the float32 ones.");
  }
  //! A 62-bit hash (detail::hash_words) of the number of tensors and each one's shape, in order.
  static std::int64_t shapes_hash(const std::vector<at::Tensor>& params) {
    std::vector<std::int64_t> w{static_cast<std::int64_t>(params.size())};
    for (const auto& p : params) {
      w.push_back(p.dim());
      w.insert(w.end(), p.sizes().begin(), p.sizes().end());
    }
    return commpact::detail::hash_words(w);
  }
  //! The step after which the period that starts now ends: saturated, since QSR's period
  //! at lr = 0 (or a tiny lr) is INT64_MAX: the run has no end known here, so no round.
  std::int64_t end_of_period(double lr) const {
    const std::int64_t p = period_at(step_, lr);
    return p > std::numeric_limits<std::int64_t>::max() - step_ ? std::numeric_limits<std::int64_t>::max() : step_ + p;
  }
  void average_on_host(const std::vector<at::Tensor>& params) {
    std::size_t n = 0;
    for (const auto& p : params) n += static_cast<std::size_t>(p.numel());
    flat.resize(n);
    std::size_t off = 0;
    for (const auto& p : params) {
      commpact::require(!p.is_cuda(), "commpact_hooks.ModelAverager: the parameters are on different devices "
                        "(the first is in host memory, another is ", p.device().str(), "); pass one device's.");
      auto c = p.detach().to(at::kFloat).contiguous();
      std::memcpy(flat.data() + off, c.data_ptr<float>(), static_cast<std::size_t>(c.numel()) * sizeof(float));
      off += static_cast<std::size_t>(c.numel());
    }
    {
      py::gil_scoped_release nogil;
      hook_guard(comm, [&] {
        try {
          dense.reduce(flat);
        } catch (const commpact::numeric_error&) {  // Dense's message speaks of gradients
          throw commpact::numeric_error(
              "commpact_hooks.ModelAverager.step: the average of the parameters is not finite (NaN or Inf) on "
              "some rank: a parameter is NaN or Inf, or the sum overflowed. No parameter changed; the averager "
              "cannot go on (make a new one after fixing the model).");
        }
      });
    }
    off = 0;
    at::NoGradGuard ng;
    for (const auto& p : params) {
      auto src = at::from_blob(flat.data() + off, p.sizes(), at::TensorOptions().dtype(at::kFloat));
      p.detach().copy_(src);
      off += static_cast<std::size_t>(p.numel());
    }
  }
  //! The parameters flattened into one float32 CUDA tensor on the current stream, its mean
  //! over the ranks in place (the CUDA side's Dense, then a wait for it), copied back.
  void average_on_device(const std::vector<at::Tensor>& params) {
#if defined(COMMPACT_HOOKS_CUDA)
    at::NoGradGuard ng;
    at::Tensor flat;
    {
      py::gil_scoped_release nogil;
      try {  // an error aborts the communicators: the other ranks raise too
        std::vector<at::Tensor> parts;
        for (const auto& p : params) {
          commpact::require(p.device() == params.front().device(), "commpact_hooks.ModelAverager: the parameters "
                            "are on different devices (", params.front().device().str(), " and ", p.device().str(),
                            "); pass one device's.");
          parts.push_back(p.detach().reshape(-1).to(at::kFloat));
        }
        flat = at::cat(parts);
        const auto b = bucket_of(flat, "commpact_hooks.ModelAverager");
        auto& cs = cuda_state();
        require_same_round([&](std::initializer_list<commpact::agreement_item> items) { cs.require_same(b, items); },
                           shapes_hash(params));
        cs.reduce_dense(0, b);
        cs.settle();
      } catch (const std::exception& e) {
        abort(e.what());
        throw;
      }
    }
    std::int64_t off = 0;
    for (const auto& p : params) {
      p.detach().copy_(flat.narrow(0, off, p.numel()).view_as(p));
      off += p.numel();
    }
#else
    throw commpact::invalid_argument(commpact::detail::cat(
        "commpact_hooks.ModelAverager: the parameters are on ", params.front().device().str(), " but this "
        "commpact_hooks was built without CUDA; reinstall it with pip against a PyTorch with CUDA."));
#endif
  }
  std::int64_t period_at(std::int64_t s, double lr) const {
    const auto plan = std::visit([&](const auto& p) { return p.plan(s, lr); }, policy);
    return std::max<std::int64_t>(1, plan.period);
  }
};

}  // namespace

namespace {
//! A commpact message as a Python user reads it: the C++ option that bounds a wait on a
//! peer is the state's `timeout=` argument here (in seconds).
std::string python_advice(std::string msg) {
  // The library prefixes "commpact::" to the name it is given, which here is Python's already.
  constexpr std::string_view doubled = "commpact::commpact_hooks.";
  if (msg.starts_with(doubled)) msg.erase(0, std::string_view("commpact::").size());
  constexpr std::string_view cxx = "torch_options::timeout";  // detail::torch_timeout_advice names it
  constexpr std::string_view py = "the state's timeout= (seconds)";
  for (auto at = msg.find(cxx); at != std::string::npos; at = msg.find(cxx, at + py.size()))
    msg.replace(at, cxx.size(), py);
  // A failed TorchComm's advice (torch_failure.hpp); in Python a new state makes a new one.
  constexpr std::string_view rebuild = "Build a new group.";
  if (const auto at = msg.find(rebuild); at != std::string::npos)
    msg.replace(at, rebuild.size(), "Make a new state (and register it) to go on.");
  return msg;
}
}  // namespace

#if defined(__GLIBC__)
#include <execinfo.h>
#include <unistd.h>
namespace {
// COMMPACT_HOOKS_BACKTRACE=1 (bench/cuda/bench_ddp_hooks.py sets it): a fatal signal prints
// the native frames (the libraries and exported functions) to stderr, then goes to the
// handler that was there before (Python's faulthandler prints its stack) and the process
// dies as it would have, so that a crash in a one-shot GPU run names where it happened.
constexpr int fatal_signals[] = {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT};
struct sigaction previous_action[32];
void print_native_frames(int sig) {
  void* frames[64];
  const int n = backtrace(frames, 64);
  const char head[] = "commpact_hooks: fatal signal; native frames:\n";
  (void)!write(2, head, sizeof(head) - 1);
  backtrace_symbols_fd(frames, n, 2);
  sigaction(sig, &previous_action[sig], nullptr);
  raise(sig);
}
void install_native_frames() {
  const char* on = std::getenv("COMMPACT_HOOKS_BACKTRACE");
  if (!on || std::string(on) != "1") return;
  void* warm[1];
  (void)backtrace(warm, 1);  // loads libgcc now, not in the handler
  struct sigaction a {};
  a.sa_handler = print_native_frames;
  sigemptyset(&a.sa_mask);
  for (int sig : fatal_signals) sigaction(sig, &a, &previous_action[sig]);
}
}  // namespace
#else
namespace {
void install_native_frames() {}
}  // namespace
#endif

PYBIND11_MODULE(commpact_hooks, m) {
  m.doc() = "PyTorch DDP communication hooks and a model averager backed by commpact (TorchComm over the group)";
  // The version of the commpact headers the module was built from (setup.py declares the same).
  m.attr("__version__") = std::to_string(COMMPACT_VERSION_MAJOR) + "." + std::to_string(COMMPACT_VERSION_MINOR) + "." +
                          std::to_string(COMMPACT_VERSION_PATCH);
  py::module_::import("torch.distributed");  // registers ProcessGroup and Store with pybind11
  install_native_frames();
  // commpact's errors reach Python as RuntimeError, as before; their advice names the
  // states' Python argument where the C++ message names torch_options::timeout.
  py::register_local_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const commpact::error& e) {
      PyErr_SetString(PyExc_RuntimeError, python_advice(e.what()).c_str());
    }
  });

  py::class_<GTopKState>(m, "GTopKState")
      .def(py::init<py::object, double, float, py::object, double, std::string>(), py::arg("process_group") = py::none(),
           py::arg("density") = 0.01, py::arg("momentum") = 0.f, py::arg("store") = py::none(),
           py::arg("timeout") = 300.0, py::arg("name") = "commpact_hooks/gtopk")
      .def("synchronize", &GTopKState::synchronize,
           "CUDA buckets: waits for the steps in flight and raises their error (call after the last backward)")
      .def("bytes_sent", &GTopKState::bytes_sent, "bytes this rank sent through the hook (CountingComm)")
      .def("abort", &GTopKState::abort, py::arg("why"),
           "marks the hook's communicator failed: every other rank's hook raises instead of waiting");
  py::class_<TopKState>(m, "TopKState")
      .def(py::init<py::object, double, float, py::object, double, std::string>(), py::arg("process_group") = py::none(),
           py::arg("density") = 0.01, py::arg("momentum") = 0.f, py::arg("store") = py::none(),
           py::arg("timeout") = 300.0, py::arg("name") = "commpact_hooks/topk")
      .def("synchronize", &TopKState::synchronize,
           "CUDA buckets: waits for the steps in flight and raises their error (call after the last backward)")
      .def("bytes_sent", &TopKState::bytes_sent)
      .def("abort", &TopKState::abort, py::arg("why"));
  py::class_<PowerSGDState>(m, "PowerSGDState")
      .def(py::init<py::object, int, std::int64_t, double, std::int64_t, py::object, double, std::string>(),
           py::arg("process_group") = py::none(), py::arg("matrix_approximation_rank") = 1,
           py::arg("start_powerSGD_iter") = 1000, py::arg("min_compression_rate") = 2.0, py::arg("random_seed") = 0,
           py::arg("store") = py::none(), py::arg("timeout") = 300.0, py::arg("name") = "commpact_hooks/powersgd")
      .def("synchronize", &PowerSGDState::synchronize,
           "CUDA buckets: waits for the steps in flight and raises their error (call after the last backward)")
      .def("bytes_sent", &PowerSGDState::bytes_sent)
      .def("abort", &PowerSGDState::abort, py::arg("why"))
      .def_readonly("iter", &PowerSGDState::iteration);
  py::class_<EFSignState>(m, "EFSignState")
      .def(py::init(&make_efsign), py::arg("process_group") = py::none(), py::arg("momentum") = 0.f,
           py::arg("store") = py::none(), py::arg("timeout") = 300.0, py::arg("name") = "commpact_hooks/efsign")
      .def("synchronize", &EFSignState::synchronize,
           "CUDA buckets: waits for the steps in flight and raises their error (call after the last backward)")
      .def("bytes_sent", &EFSignState::bytes_sent)
      .def("abort", &EFSignState::abort, py::arg("why"));
  py::class_<QSGDState>(m, "QSGDState")
      .def(py::init(&make_qsgd), py::arg("process_group") = py::none(), py::arg("levels") = 256,
           py::arg("bucket") = 512, py::arg("seed") = 0, py::arg("momentum") = 0.f, py::arg("store") = py::none(),
           py::arg("timeout") = 300.0, py::arg("name") = "commpact_hooks/qsgd")
      .def("synchronize", &QSGDState::synchronize,
           "CUDA buckets: waits for the steps in flight and raises their error (call after the last backward)")
      .def("bytes_sent", &QSGDState::bytes_sent)
      .def("abort", &QSGDState::abort, py::arg("why"));
  py::class_<ModelAverager>(m, "ModelAverager")
      .def(py::init<py::object, std::int64_t, double, std::int64_t, py::object, double, std::string>(),
           py::arg("process_group") = py::none(), py::arg("period") = 4, py::arg("qsr_alpha") = 0.0,
           py::arg("warmup") = 0, py::arg("store") = py::none(), py::arg("timeout") = 300.0,
           py::arg("name") = "commpact_hooks/averager")
      .def(
          "step",
          [](ModelAverager& a, py::iterable params, double lr) {
            std::vector<at::Tensor> v;  // model.parameters() (a generator) as well as a list
            for (const auto& p : params) {
              try {
                v.push_back(p.cast<at::Tensor>());
              } catch (const py::cast_error&) {
                throw py::type_error(commpact::detail::cat(
                    "commpact_hooks.ModelAverager.step: params must hold tensors (model.parameters() or a list of "
                    "them); got ", py::str(py::repr(p)).cast<std::string>(), "."));
              }
            }
            return a.step(v, lr);
          },
          py::arg("params"), py::arg("lr"),
          "after each optimizer step: averages the parameters (in place) when the period ends; returns whether it did")
      .def_readonly("rounds", &ModelAverager::rounds_)
      .def("bytes_sent", &ModelAverager::bytes_sent)
      .def("abort", &ModelAverager::abort, py::arg("why"));

  m.def("_gtopk_hook", &sparse_hook<GTopKState>);
  m.def("_topk_hook", &sparse_hook<TopKState>);
  m.def("_powersgd_hook", &powersgd_hook);
  m.def("_efsign_hook", &codec_hook<EFSignState>);
  m.def("_qsgd_hook", &codec_hook<QSGDState>);
#if defined(COMMPACT_HOOKS_CUDA)
  m.attr("has_cuda") = true;
#else
  m.attr("has_cuda") = false;
#endif
  // DDP inspects a hook's signature (inspect.signature), which a built-in function has
  // not: the hooks are small Python functions over the built-ins.
  py::exec(R"(
import torch
import torch.distributed as _dist

def gtopk_hook(state: GTopKState, bucket: _dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: gTop-k sparsification with error feedback (tree merge over the group)."""
    return _gtopk_hook(state, bucket)

def topk_hook(state: TopKState, bucket: _dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: Top-k sparsification with error feedback (allgather of every rank's k largest)."""
    return _topk_hook(state, bucket)

def powersgd_hook(state: PowerSGDState, bucket: _dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: PowerSGD (commpact::PowerCompressor) with PyTorch powerSGD_hook's semantics."""
    return _powersgd_hook(state, bucket)

def efsign_hook(state: EFSignState, bucket: _dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: EF-SignSGD (sign and a scale per row, error feedback; allgather of every rank's signs)."""
    return _efsign_hook(state, bucket)

def qsgd_hook(state: QSGDState, bucket: _dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP hook: QSGD (stochastic quantisation to `levels` per bucket of values, error feedback; allgather)."""
    return _qsgd_hook(state, bucket)
)", m.attr("__dict__"));
}
