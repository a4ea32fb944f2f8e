// The CUDA side of commpact_hooks (commpact_hooks_cuda.hpp): the hooks' compressors in
// commpact's CUDA space, over TorchCudaComm on the DDP group's link, on PyTorch's
// current stream, with device memory from PyTorch's caching allocator (the executor's
// stream-ordered allocator hook).
//
// Overlap: every hook queues its step (start: for Top-k, EF-SignSGD and QSGD the
// CodecCompressor decode and the gated write of the mean included) and returns without a
// host wait; the step's finish (one fence, the headers and status read, errors raised
// alike on every rank) and commit run when the same bucket index comes again (the next
// step's hook), or at state::settle() (synchronize() in Python). That fence waits for the
// step's own work (a cuda_fence_point at the event recorded after its start), not for the
// backward queued after it. Compiled by nvcc when the module is built against a PyTorch
// with CUDA (setup.py); tests/torch/check_torch_cuda_objects.cmake compiles it to an
// object without a GPU.
#include "commpact_hooks_cuda.hpp"

#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/codecs/per_tensor.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/compress/device_codecs.cuh>
#include <commpact/kernels/cuda/ops.cuh>
#include <commpact/space/cuda.hpp>
#include <commpact/torch/torch_cuda_comm.hpp>

#include <exception>
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace commpact_hooks_cuda {

namespace cp = commpact;
using Comm = cp::TorchCudaComm;
using GTopK = cp::gTopK<cp::TreeComm<Comm>>;
using TopK = cp::TopK<Comm>;
using Power = cp::PowerCompressor<1, cp::cuda_space>;
using SignK = cp::per_tensor<cp::sign_codec>;
using EfSign = cp::CodecCompressor<SignK, cp::Allgather<Comm>>;
using Qsgd = cp::CodecCompressor<cp::qsgd_codec, cp::Allgather<Comm>>;

namespace {
void* alloc_hook(std::size_t bytes, cudaStream_t s, void* ctx) {
  const auto* a = static_cast<const allocator*>(ctx);
  return a->alloc(bytes, static_cast<void*>(s), a->ctx);
}
void free_hook(void* p, std::size_t bytes, cudaStream_t s, void* ctx) {
  const auto* a = static_cast<const allocator*>(ctx);
  a->free(p, bytes, static_cast<void*>(s), a->ctx);
}

template <class C>
struct slot {
  std::size_t n = 0;
  cp::tensor_layout layout;
  std::unique_ptr<C> c;
};
}  // namespace

//! A step queued and not yet finished: its bucket, the point of the stream after its
//! work, and how to finish + commit it or drop it.
struct step_in_flight {
  std::int64_t index = 0;
  cp::cuda_event done;
  std::function<void()> finish;
  std::function<void()> cancel;
};

struct state::impl {
  std::shared_ptr<cp::torch_group_link> link;
  params prm;
  allocator alloc;
  cp::cuda_allocator hook{};
  std::optional<cp::cuda_space::exec> exec;
  std::optional<Comm> comm;
  std::map<std::int64_t, slot<cp::Dense<Comm>>> dense;
  commpact_hooks::bucket_compressors<GTopK> gtopk;  // by bucket index, known by its parameters
  commpact_hooks::bucket_compressors<TopK> topk;
  std::map<std::int64_t, slot<Power>> power;
  commpact_hooks::bucket_compressors<EfSign> efsign;
  commpact_hooks::bucket_compressors<Qsgd> qsgd;
  std::vector<step_in_flight> pending;  // in the order they were started
  std::uint64_t uncounted = 0;          // bytes of agree_uncounted's allreduces

  //! Runs on the exec's device: ~state holds it current until every member is gone too.
  ~impl() {
    for (auto& p : pending) p.cancel();  // noexcept: completes the queued work, drops the step
  }

  //! Finishes and commits every step in flight, in order (each fence waits for that step's
  //! work only); the first error cancels the rest and is raised.
  void settle() {
    if (pending.empty()) return;
    const cp::cuda_device_guard on_device(exec->device());  // synchronize() comes from any thread
    auto list = std::move(pending);
    pending.clear();
    std::exception_ptr err;
    for (auto& p : list) {
      if (err) {
        p.cancel();
        continue;
      }
      try {
        cp::cuda_fence_point at(*exec, p.done);
        p.finish();
      } catch (...) {
        err = std::current_exception();
      }
    }
    if (err) std::rethrow_exception(err);
  }
  //! A bucket index that comes again while its previous step is in flight starts a new
  //! DDP step: the previous step's buckets are finished first.
  void settle_before(std::int64_t index) {
    for (const auto& p : pending)
      if (p.index == index) return settle();
  }
  //! Queues c's step on the bucket and leaves it in flight (finished by settle()).
  template <class C>
  void start(C& c, std::int64_t index, cp::cuda_span<float> g) {
    c.start(g);
    step_in_flight f{index, cp::cuda_space::record(*exec), [&c] {
                  c.finish();
                  c.commit();
                },
                [&c]() noexcept { c.cancel(); }};
    pending.push_back(std::move(f));
  }

  //! The communicator on the first bucket's stream; every bucket must come on it.
  Comm& comm_on(const bucket& b) {
    // PyTorch's default stream is the legacy NULL stream, and its handle is nullptr; to
    // make_exec a null stream means "make a stream of your own", so the NULL stream is
    // named by its explicit handle (the work is then ordered with PyTorch's, as required).
    const auto s = b.stream ? static_cast<cudaStream_t>(b.stream) : cudaStreamLegacy;
    if (!comm) {  // both or neither: a communicator that failed to build leaves no exec behind
      auto e = cp::cuda_space::make_exec(s, alloc.alloc ? &hook : cp::cuda_default_allocator(), b.device);
      comm.emplace(cp::TorchCudaComm{link, e});
      exec = std::move(e);
    }
    cp::require(exec->stream() == s && exec->device() == b.device, "commpact_hooks: a CUDA bucket came on another "
                "stream or device than the first (device ", b.device, "); run the backward of every step on one "
                "stream, or make a new state for the other.");
    return *comm;
  }
  static cp::cuda_span<float> view(const bucket& b) { return cp::cuda_access::wrap(b.data, b.n); }

  template <class C, class Make>
  C& get(std::map<std::int64_t, slot<C>>& m, std::int64_t index, const bucket& b, const cp::tensor_layout* layout,
         Make&& make) {
    auto& s = m[index];
    if (!s.c || s.n != b.n || (layout && !(s.layout == *layout))) {
      s.c.reset();
      s.c = std::make_unique<C>(make());
      s.n = b.n;
      if (layout) s.layout = *layout;
    }
    return *s.c;
  }
  //! Bucket index's compressor for its parameters (commpact_hooks::bucket_compressors):
  //! the steps in flight are finished before compressors give their feedback up.
  template <class C, class Make>
  C& get(commpact_hooks::bucket_compressors<C>& m, std::int64_t index, const bucket& b,
         const commpact_hooks::bucket_params& ps, Make&& make) {
    return m.get(
        index, ps, static_cast<std::int64_t>(b.n), [&] { return std::make_unique<C>(make()); }, [this] { settle(); });
  }
  Power& power_at(std::int64_t index) const {
    const auto it = power.find(index);
    cp::require(it != power.end() && it->second.c, "commpact_hooks: bucket ", index, " has no PowerSGD compressor; "
                "call power_prepare first.");
    return *it->second.c;
  }
};

state::state(std::shared_ptr<cp::torch_group_link> link, params p, allocator a) : p_(std::make_unique<impl>()) {
  cp::require(link != nullptr, "commpact_hooks: the group link is null.");
  p_->link = std::move(link);
  p_->prm = p;
  p_->alloc = a;
  p_->hook = cp::cuda_allocator{&alloc_hook, &free_hook, &p_->alloc};
}

// The exec's device stays current while the whole impl goes, its members included (the
// compressors' buffers and events, the communicator, the exec's own events), not only
// while ~impl's body runs: a guard there would restore the caller's device before the
// members are destroyed (a multi-GPU process tearing a state down from another device).
state::~state() {
  const cp::cuda_device_guard on_device(p_ && p_->exec ? p_->exec->device() : -1, std::nothrow);
  p_.reset();
}

// Every entry point makes the bucket's device current for its launches (and for
// cudaStreamLegacy, which names the current device's NULL stream): DDP calls the hooks on
// its autograd thread, on that device, but synchronize() and ModelAverager come from
// Python's thread, whose current device may be another (a model moved to cuda:r without
// torch.cuda.set_device(r)).
void state::reduce(std::int64_t index, const bucket& b, const cp::tensor_layout& layout,
                   const commpact_hooks::bucket_params& ps) {
  const cp::cuda_device_guard on_device(b.device);
  auto& I = *p_;
  Comm& c = I.comm_on(b);
  I.settle_before(index);
  const auto g = impl::view(b);
  const auto& o = I.prm;
  switch (o.m) {
    case method::gtopk:
      I.start(I.get(I.gtopk, index, b, ps, [&] {
                return GTopK{c, cp::sparse_options{.density = o.density, .momentum = o.momentum}};
              }),
              index, g);
      break;
    case method::topk:
      I.start(I.get(I.topk, index, b, ps, [&] {
                return TopK{c, cp::sparse_options{.density = o.density, .momentum = o.momentum}};
              }),
              index, g);
      break;
    case method::powersgd:
      I.start(I.power_at(index), index, g);
      break;
    case method::efsign:
      I.start(I.get(I.efsign, index, b, ps, [&] {
                return EfSign{c, SignK{cp::split_rows(layout), cp::sign_codec{}},
                              cp::codec_options{.momentum = o.momentum}};
              }),
              index, g);
      break;
    case method::qsgd:
      I.start(I.get(I.qsgd, index, b, ps, [&] {
                return Qsgd{c, cp::qsgd_codec{o.levels, o.seed, o.qsgd_bucket},
                            cp::codec_options{.momentum = o.momentum}};
              }),
              index, g);
      break;
  }
}

void state::reduce_dense(std::int64_t index, const bucket& b) {
  const cp::cuda_device_guard on_device(b.device);
  auto& I = *p_;
  Comm& c = I.comm_on(b);
  I.settle_before(index);
  I.start(I.get(I.dense, index, b, nullptr, [&] { return cp::Dense<Comm>{c}; }), index, impl::view(b));
}

bool state::power_prepare(std::int64_t index, const bucket& b, const cp::tensor_layout& layout) {
  const cp::cuda_device_guard on_device(b.device);
  auto& I = *p_;
  Comm& c = I.comm_on(b);
  I.settle_before(index);
  auto& s = I.power[index];
  if (s.c && s.n == b.n && s.layout == layout) return false;
  s.c.reset();
  s.c = std::make_unique<Power>(
      cp::any_space_communicator<cp::cuda_space>(c), layout,
      cp::power_options{.approximation_rank = I.prm.rank, .min_compression_rate = I.prm.min_rate});
  s.n = b.n;
  s.layout = layout;
  return true;
}
bool state::is_compressed(std::int64_t index, std::size_t tensor) const {
  return p_->power_at(index).is_compressed(tensor);
}
std::size_t state::rank_of(std::int64_t index, std::size_t tensor) const {
  return p_->power_at(index).rank_of(tensor);
}
void state::set_q_factor(std::int64_t index, std::size_t tensor, std::span<const float> q) {
  const cp::cuda_device_guard on_device(p_->exec ? p_->exec->device() : -1);
  p_->power_at(index).set_q_factor(tensor, q);
}

void state::settle() { p_->settle(); }
bool state::in_flight() const { return !p_->pending.empty(); }

void state::agree_uncounted(const bucket& b, std::span<std::int64_t> words) {
  const cp::cuda_device_guard on_device(b.device);
  Comm& c = p_->comm_on(b);
  const std::uint64_t before = c.bytes_sent();
  try {
    c.allreduce(words, cp::reduce_op::max);
  } catch (...) {
    p_->uncounted += c.bytes_sent() - before;
    throw;
  }
  p_->uncounted += c.bytes_sent() - before;
}
void state::require_same(const bucket& b, std::initializer_list<cp::agreement_item> items) {
  const cp::cuda_device_guard on_device(b.device);
  cp::require_same(p_->comm_on(b), items);
}

std::uint64_t state::bytes_sent() const { return p_->comm ? p_->comm->bytes_sent() - p_->uncounted : 0; }

void state::abort(std::string_view why) noexcept { p_->link->abort(why); }

}  // namespace commpact_hooks_cuda
