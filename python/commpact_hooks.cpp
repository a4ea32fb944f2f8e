// commpact_hooks: PyTorch DDP communication hooks backed by commpact compressors over
// the DDP process group (TorchComm), and a Local SGD / QSR model averager.
//
//   import torch.distributed as dist, commpact_hooks
//   state = commpact_hooks.GTopKState(density=0.01)          # the default group
//   ddp.register_comm_hook(state, commpact_hooks.gtopk_hook)
//   state = commpact_hooks.PowerSGDState(matrix_approximation_rank=1, start_powerSGD_iter=2, random_seed=0)
//   ddp.register_comm_hook(state, commpact_hooks.powersgd_hook)
//   avg = commpact_hooks.ModelAverager(period=4, qsr_alpha=0.2)   # without DDP
//   avg.step(list(model.parameters()), lr)
//
// A hook reduces its bucket in place (the mean, as DDP expects) while Python's GIL is
// released, and returns a completed torch.futures.Future: commpact's compressors are
// blocking, so a bucket's communication overlaps the backward of the layers before it
// only as far as DDP runs hooks while autograd goes on (it runs them on the autograd
// thread). Each bucket has its own compressor (its own residual), rebuilt when DDP
// rebuilds its buckets after the first iteration.
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

#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/torch/torch_comm.hpp>

#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace py = pybind11;
using Comm = commpact::CountingComm<commpact::TorchComm>;

namespace {

c10::intrusive_ptr<c10d::ProcessGroup> group_or_default(py::object pg) {
  if (pg.is_none()) pg = py::module_::import("torch.distributed.distributed_c10d").attr("_get_default_group")();
  return pg.cast<c10::intrusive_ptr<c10d::ProcessGroup>>();
}
c10::intrusive_ptr<c10d::Store> store_or_default(py::object store) {
  if (store.is_none()) store = py::module_::import("torch.distributed.distributed_c10d").attr("_get_default_store")();
  return store.cast<c10::intrusive_ptr<c10d::Store>>();
}

Comm make_comm(py::object pg, py::object store, double timeout_s, const std::string& name) {
  commpact::torch_options o;
  o.timeout = std::chrono::milliseconds(static_cast<long long>(timeout_s * 1000));
  o.name = name;
  return Comm{commpact::TorchComm{group_or_default(pg), store_or_default(store), o}};
}

std::span<float> float_span(const at::Tensor& t, const char* who) {
  commpact::require(t.device().is_cpu() && t.scalar_type() == at::kFloat && t.is_contiguous(), who,
                    ": the bucket must be a contiguous float32 CPU tensor (got ", t.toString(),
                    "); commpact's hooks run over Gloo on the host.");
  return {t.data_ptr<float>(), static_cast<std::size_t>(t.numel())};
}

py::object completed_future(const at::Tensor& t) {
  auto fut = py::module_::import("torch.futures").attr("Future")();
  fut.attr("set_result")(t);
  return fut;
}

// The shapes of a bucket's tensors as PyTorch's PowerSGD views them: rows = dim 0.
commpact::tensor_layout layout_of(const std::vector<at::Tensor>& grads) {
  commpact::tensor_layout l;
  for (const auto& g : grads) {
    const std::int64_t n = g.dim() == 0 ? 1 : g.size(0);
    l.push_back({n, n == 0 ? 0 : g.numel() / n});
  }
  return l;
}

// ---- sparse hooks: TopK and gTopK --------------------------------------------------
template <class C>
struct SparseState {
  SparseState(py::object pg, double density, float momentum, py::object store, double timeout_s, std::string name)
      : comm(make_comm(pg, store, timeout_s, name)), opt{.density = density, .momentum = momentum} {}
  Comm comm;
  commpact::sparse_options opt;
  std::map<std::int64_t, std::pair<std::int64_t, std::unique_ptr<C>>> buckets;  // index -> (numel, compressor)

  void reduce(std::int64_t index, std::span<float> g) {
    auto& b = buckets[index];
    if (!b.second || b.first != static_cast<std::int64_t>(g.size())) {
      b.second = std::make_unique<C>(comm, opt);
      b.first = static_cast<std::int64_t>(g.size());
    }
    b.second->reduce(g);
  }
  std::uint64_t bytes_sent() const { return comm.stats().bytes_sent; }
};
using TopKState = SparseState<commpact::TopK<Comm>>;
using GTopKState = SparseState<commpact::gTopK<commpact::TreeComm<Comm>>>;

template <class S>
py::object sparse_hook(S& st, py::object bucket) {
  at::Tensor buf = bucket.attr("buffer")().cast<at::Tensor>();
  const auto index = bucket.attr("index")().cast<std::int64_t>();
  auto g = float_span(buf, "commpact_hooks");
  {
    py::gil_scoped_release nogil;
    commpact::torch_guard(st.comm, [&] { st.reduce(index, g); });  // an error reaches every rank
  }
  return completed_future(buf);
}

// ---- PowerSGD ----------------------------------------------------------------------
struct PowerSGDState {
  PowerSGDState(py::object pg, int rank, std::int64_t start_iter, double min_rate, std::int64_t seed,
                py::object store, double timeout_s, std::string name)
      : comm(make_comm(pg, store, timeout_s, name)), rank(rank), start_iter(start_iter), min_rate(min_rate),
        rng(py::module_::import("numpy").attr("random").attr("RandomState")(seed)), dense(comm) {
    commpact::require(rank >= 1, "commpact_hooks.PowerSGDState: matrix_approximation_rank is ", rank,
                      "; it must be >= 1.");
  }
  Comm comm;
  int rank;
  std::int64_t start_iter, iter = 0;
  double min_rate;
  py::object rng;
  commpact::Dense<Comm> dense;
  struct entry {
    commpact::tensor_layout layout;
    std::unique_ptr<commpact::PowerCompressor<1>> psgd;
  };
  std::map<std::int64_t, entry> buckets;

  // PyTorch's first Q of a bucket: seeded from the numpy generator, randn per tensor in
  // the order of the shape groups, each m x r (row-major), stored column-major here.
  void draw_q(commpact::PowerCompressor<1>& p, const commpact::tensor_layout& l) {
    const auto seed = rng.attr("randint")(1000000000).cast<std::int64_t>();
    auto gen = at::detail::createCPUGenerator(static_cast<std::uint64_t>(seed));
    std::vector<std::pair<std::int64_t, std::int64_t>> shapes;  // groups in order of first appearance
    for (std::size_t i = 0; i < l.size(); ++i) {
      if (!p.is_compressed(i)) continue;
      const std::pair<std::int64_t, std::int64_t> s{l[i].rows, l[i].cols};
      if (std::find(shapes.begin(), shapes.end(), s) == shapes.end()) shapes.push_back(s);
    }
    for (const auto& s : shapes)
      for (std::size_t i = 0; i < l.size(); ++i) {
        if (!p.is_compressed(i) || l[i].rows != s.first || l[i].cols != s.second) continue;
        const auto m = static_cast<std::size_t>(l[i].cols), r = p.rank_of(i);
        at::Tensor q = at::randn({static_cast<std::int64_t>(m), static_cast<std::int64_t>(r)}, gen);
        const float* src = q.data_ptr<float>();
        std::vector<float> cm(m * r);
        for (std::size_t a = 0; a < m; ++a)
          for (std::size_t j = 0; j < r; ++j) cm[j * m + a] = src[a * r + j];
        p.set_q_factor(i, cm);
      }
  }

  void reduce(std::int64_t index, const commpact::tensor_layout& l, std::span<float> g, bool last) {
    if (iter < start_iter) {
      dense.reduce(g);
    } else {
      auto& e = buckets[index];
      if (!e.psgd || !(e.layout == l)) {
        e.layout = l;
        e.psgd = std::make_unique<commpact::PowerCompressor<1>>(
            comm, l, commpact::power_options{.approximation_rank = rank, .min_compression_rate = min_rate});
        py::gil_scoped_acquire gil;
        draw_q(*e.psgd, l);
      }
      e.psgd->reduce(g);
    }
    if (last) ++iter;
  }
  std::uint64_t bytes_sent() const { return comm.stats().bytes_sent; }
};

py::object powersgd_hook(PowerSGDState& st, py::object bucket) {
  at::Tensor buf = bucket.attr("buffer")().cast<at::Tensor>();
  const auto index = bucket.attr("index")().cast<std::int64_t>();
  const bool last = bucket.attr("is_last")().cast<bool>();
  const auto l = layout_of(bucket.attr("gradients")().cast<std::vector<at::Tensor>>());
  auto g = float_span(buf, "commpact_hooks.powersgd_hook");
  {
    py::gil_scoped_release nogil;
    commpact::torch_guard(st.comm, [&] { st.reduce(index, l, g, last); });
  }
  return completed_future(buf);
}

// ---- Local SGD / QSR model averaging -------------------------------------------------
struct ModelAverager {
  ModelAverager(py::object pg, std::int64_t period, double qsr_alpha, std::int64_t warmup, py::object store,
                double timeout_s, std::string name)
      : comm(make_comm(pg, store, timeout_s, name)), dense(comm) {
    commpact::require(period >= 1, "commpact_hooks.ModelAverager: period is ", period, "; it must be >= 1.");
    commpact::require(qsr_alpha >= 0, "commpact_hooks.ModelAverager: qsr_alpha must be >= 0 (0: Local SGD).");
    if (qsr_alpha > 0) policy.emplace<commpact::QSRPolicy>(qsr_alpha, period, warmup);
    else policy.emplace<commpact::LocalSgd>(period);
  }
  Comm comm;
  commpact::Dense<Comm> dense;
  std::variant<commpact::LocalSgd, commpact::QSRPolicy> policy{commpact::LocalSgd{1}};
  std::int64_t step_ = 0, next_ = -1, rounds_ = 0;
  std::vector<float> flat;

  //! Call after each optimizer step with the parameters and the step's learning rate;
  //! averages them (in place, the same on every rank) when the period ends. Returns
  //! whether it did.
  bool step(const std::vector<at::Tensor>& params, double lr) {
    if (next_ < 0) next_ = step_ + period_at(step_, lr);
    ++step_;
    if (step_ < next_) return false;
    std::size_t n = 0;
    for (const auto& p : params) n += static_cast<std::size_t>(p.numel());
    flat.resize(n);
    std::size_t off = 0;
    for (const auto& p : params) {
      auto c = p.detach().to(at::kFloat).contiguous();
      std::memcpy(flat.data() + off, c.data_ptr<float>(), static_cast<std::size_t>(c.numel()) * sizeof(float));
      off += static_cast<std::size_t>(c.numel());
    }
    {
      py::gil_scoped_release nogil;
      commpact::torch_guard(comm, [&] { dense.reduce(flat); });
    }
    off = 0;
    at::NoGradGuard ng;
    for (const auto& p : params) {
      auto src = at::from_blob(flat.data() + off, p.sizes(), at::TensorOptions().dtype(at::kFloat));
      p.detach().copy_(src);
      off += static_cast<std::size_t>(p.numel());
    }
    ++rounds_;
    next_ = step_ + period_at(step_, lr);
    return true;
  }
  std::int64_t period_at(std::int64_t s, double lr) const {
    const auto plan = std::visit([&](const auto& p) { return p.plan(s, lr); }, policy);
    return std::max<std::int64_t>(1, plan.period);
  }
};

}  // namespace

PYBIND11_MODULE(commpact_hooks, m) {
  m.doc() = "PyTorch DDP communication hooks and a model averager backed by commpact (TorchComm over the group)";
  py::module_::import("torch.distributed");  // registers ProcessGroup and Store with pybind11

  py::class_<GTopKState>(m, "GTopKState")
      .def(py::init<py::object, double, float, py::object, double, std::string>(), py::arg("process_group") = py::none(),
           py::arg("density") = 0.01, py::arg("momentum") = 0.f, py::arg("store") = py::none(),
           py::arg("timeout") = 300.0, py::arg("name") = "commpact_hooks/gtopk")
      .def("bytes_sent", &GTopKState::bytes_sent, "bytes this rank sent through the hook (CountingComm)")
      .def("abort", [](GTopKState& s, const std::string& why) { s.comm.abort(why); }, py::arg("why"),
           "marks the hook's communicator failed: every other rank's hook raises instead of waiting");
  py::class_<TopKState>(m, "TopKState")
      .def(py::init<py::object, double, float, py::object, double, std::string>(), py::arg("process_group") = py::none(),
           py::arg("density") = 0.01, py::arg("momentum") = 0.f, py::arg("store") = py::none(),
           py::arg("timeout") = 300.0, py::arg("name") = "commpact_hooks/topk")
      .def("bytes_sent", &TopKState::bytes_sent)
      .def("abort", [](TopKState& s, const std::string& why) { s.comm.abort(why); }, py::arg("why"));
  py::class_<PowerSGDState>(m, "PowerSGDState")
      .def(py::init<py::object, int, std::int64_t, double, std::int64_t, py::object, double, std::string>(),
           py::arg("process_group") = py::none(), py::arg("matrix_approximation_rank") = 1,
           py::arg("start_powerSGD_iter") = 1000, py::arg("min_compression_rate") = 2.0, py::arg("random_seed") = 0,
           py::arg("store") = py::none(), py::arg("timeout") = 300.0, py::arg("name") = "commpact_hooks/powersgd")
      .def("bytes_sent", &PowerSGDState::bytes_sent)
      .def("abort", [](PowerSGDState& s, const std::string& why) { s.comm.abort(why); }, py::arg("why"))
      .def_readonly("iter", &PowerSGDState::iter);
  py::class_<ModelAverager>(m, "ModelAverager")
      .def(py::init<py::object, std::int64_t, double, std::int64_t, py::object, double, std::string>(),
           py::arg("process_group") = py::none(), py::arg("period") = 4, py::arg("qsr_alpha") = 0.0,
           py::arg("warmup") = 0, py::arg("store") = py::none(), py::arg("timeout") = 300.0,
           py::arg("name") = "commpact_hooks/averager")
      .def("step", &ModelAverager::step, py::arg("params"), py::arg("lr"))
      .def_readonly("rounds", &ModelAverager::rounds_)
      .def("bytes_sent", [](const ModelAverager& a) { return a.comm.stats().bytes_sent; })
      .def("abort", [](ModelAverager& a, const std::string& why) { a.comm.abort(why); }, py::arg("why"));

  m.def("_gtopk_hook", &sparse_hook<GTopKState>);
  m.def("_topk_hook", &sparse_hook<TopKState>);
  m.def("_powersgd_hook", &powersgd_hook);
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
)", m.attr("__dict__"));
}
