#pragma once
// The demo's training loop, written once over any commpact Communicator: each rank
// trains the same MLP on its shard of Fashion-MNIST and the chosen method decides
// what crosses the network. Used by train_fashion_mnist.cpp (ThreadComm, in process)
// and train_fashion_mnist_mpi.cpp (MpiComm under mpiexec).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <commpact/commpact.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/linear.hpp>
#include <commpact/compress/compressors/bucketed.hpp>
#include <commpact/compress/compressors/cast_allreduce.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/majority.hpp>
#include <commpact/compress/compressors/oktopk.hpp>
#include <commpact/compress/codecs/per_tensor.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/codecs/sparsifiers.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/ps/parameter_server.hpp>
#include <commpact/sync/lr_schedule.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include "idx.hpp"
#include "mlp.hpp"
#include "schedule.hpp"

namespace demo {

struct Options {
  int ranks = 4;
  int epochs = 3;
  int hidden = 128;
  int batch = 32;  // per rank
  double lr = 0.05;
  double momentum = 0.9;
  double density = 0.01;
  int local_h = 4;
  int staleness = 2;  // SSP's bound s (method ssp)
  double qsr_alpha = 0.2;
  int qsgd_levels = 16;
  bool overlap = false;   // Bucketed reduction during backward (issue 9)
  double bucket_kb = 4;   // bucket cap: 4 KB puts W2 and b2 in one bucket, W1 and b1 in another
  std::size_t limit = 0;  // 0: the whole training set
  std::uint64_t seed = 42;
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::vector<std::string> methods = {"dense", "topk", "gtopk", "powersgd", "localsgd", "qsr"};
};

struct EpochRow {
  std::string method;
  int epoch = 0;
  double train_loss = 0, test_acc = 0, mb_sent = 0, seconds = 0;
  std::uint64_t bytes_sent = 0;  // rank 0's, exact (mb_sent = bytes_sent / 1e6)
  std::int64_t sync_rounds = 0;
};

struct Data {
  Dataset train, test;
};

// Learning rate at a step: the examples' schedule (schedule.hpp).
inline double lr_at(const Options& o, std::int64_t step, std::int64_t total) {
  return lr_schedule(o.lr, total)(step);
}

// A method: called after backward with the rank's gradient; it must leave identical
// parameters on every rank whenever it reports a synchronisation.
using StepFn = std::function<void(std::span<float> params, std::span<float> grad, double lr, std::int64_t step)>;
// With --overlap, `begin` runs before backward and `ready(tensor)` as each tensor's
// gradient is final (DataParallel::begin_backward / grad_ready); both empty otherwise.
struct Method {
  StepFn step;
  std::function<void(std::span<float> grad, double lr)> begin;
  std::function<void(std::size_t)> ready;
};

template <class Comm>
Method make_method(const std::string& name, Comm comm, const Options& o, const Mlp& model,
                   std::int64_t total_steps, std::int64_t& rounds);

// Trains one method on one rank. `comm` is this rank's CountingComm; the returned rows
// are meaningful on rank 0.
template <class Comm>
std::vector<EpochRow> train(const std::string& method, Comm comm, const Data& data, const Options& o, bool verbose) {
  const int P = comm.size(), r = comm.rank();
  Mlp model(o.hidden);
  const std::size_t n = model.size();
  std::vector<float> params(n), grad(n);
  model.init(params, o.seed);

  const std::size_t per_rank = data.train.count / P;
  const std::int64_t steps_per_epoch = static_cast<std::int64_t>(per_rank / o.batch);
  commpact::require(steps_per_epoch > 0, "demo: ", data.train.count, " training images are too few for ", P,
                    " ranks with batch ", o.batch, " each; lower --ranks or --batch.");
  const std::int64_t total = steps_per_epoch * o.epochs;
  std::int64_t rounds = 0;
  Method m = make_method(method, comm, o, model, total, rounds);

  std::vector<std::uint32_t> shard(per_rank);
  for (std::size_t i = 0; i < per_rank; ++i) shard[i] = static_cast<std::uint32_t>(i * P + r);
  std::vector<float> xb(std::size_t(o.batch) * Mlp::in);
  std::vector<std::uint8_t> yb(o.batch);
  std::vector<EpochRow> rows;
  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t step = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    std::mt19937_64 g(o.seed * 7919 + epoch * 131 + r);
    std::shuffle(shard.begin(), shard.end(), g);
    double loss = 0;
    for (std::int64_t s = 0; s < steps_per_epoch; ++s, ++step) {
      for (int b = 0; b < o.batch; ++b) {
        const std::size_t idx = shard[std::size_t(s) * o.batch + b];
        std::copy_n(data.train.images.data() + idx * Mlp::in, Mlp::in, xb.data() + std::size_t(b) * Mlp::in);
        yb[b] = data.train.labels[idx];
      }
      const double lr = lr_at(o, step, total);
      if (m.begin) m.begin(grad, lr);
      loss += model.loss_and_grad(params, xb.data(), yb.data(), o.batch, grad, m.ready);
      m.step(params, grad, lr, step);
      if (verbose && r == 0 && (s + 1) % std::max<std::int64_t>(1, steps_per_epoch / 4) == 0 && s + 1 < steps_per_epoch)
        std::printf("  [%s] epoch %d: %3d%%\r", method.c_str(), epoch, int(100 * (s + 1) / steps_per_epoch)),
            std::fflush(stdout);
    }
    // Rank 0's bytes (CountingComm), the mean training loss over ranks, test accuracy.
    const double mb = double(comm.stats().bytes_sent) / 1e6;
    double l[1] = {loss / double(steps_per_epoch * o.batch)};
    comm.inner().allreduce(std::span<double>(l, 1), commpact::reduce_op::sum);  // not counted
    EpochRow row;
    row.method = method;
    row.epoch = epoch;
    row.train_loss = l[0] / P;
    row.test_acc = double(model.correct(params, data.test.images.data(), data.test.labels.data(), data.test.count)) /
                   double(data.test.count);
    row.mb_sent = mb;
    row.bytes_sent = comm.stats().bytes_sent;
    row.sync_rounds = rounds;
    row.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (verbose && r == 0)
      std::printf("  [%s] epoch %d/%d  loss %.4f  test acc %.2f%%  sent %.2f MB/rank  %lld rounds  %.1f s\n",
                  method.c_str(), epoch, o.epochs, row.train_loss, 100 * row.test_acc, row.mb_sent,
                  static_cast<long long>(rounds), row.seconds),
          std::fflush(stdout);
    rows.push_back(row);
  }
  return rows;
}

// ---- the methods ---------------------------------------------------------------
// Every method is a DataParallel driver: a Compressor (what crosses) and a SyncPolicy
// (when), with SGD + momentum as the update.
template <class Compressor, class Policy>
Method drive(Compressor c, Policy policy, const Options& o, std::size_t n, std::int64_t total, std::int64_t& rounds) {
  auto dp = std::make_shared<commpact::DataParallel<Compressor, Policy>>(std::move(c), std::move(policy), total);
  auto opt = std::make_shared<commpact::Sgd>(n, commpact::sgd_options{.momentum = o.momentum});
  Method m;
  m.step = [dp, opt, &rounds](std::span<float> p, std::span<float> g, double lr, std::int64_t) {
    dp->step(p, g, lr, *opt);
    rounds = dp->rounds();
  };
  if constexpr (commpact::req::overlappable<Compressor>) {
    m.begin = [dp](std::span<float> g, double lr) { dp->begin_backward(g, lr); };
    m.ready = [dp](std::size_t t) { dp->grad_ready(t); };
  }
  return m;
}

// With --overlap: one compressor per bucket of the MLP's tensors (commpact::Bucketed),
// `make(bucket_info)` building each; without, `whole()` for the whole gradient.
template <class Policy, class Make, class Whole>
Method drive_buckets(Make make, Whole whole, Policy policy, const Options& o, const Mlp& model, std::int64_t total,
                     std::int64_t& rounds) {
  if (!o.overlap) return drive(whole(), std::move(policy), o, model.size(), total, rounds);
  std::vector<std::size_t> layers;
  for (auto [r, c] : model.shapes()) layers.push_back(std::size_t(r) * std::size_t(c));
  using C = decltype(make(commpact::bucket_info{}));
  return drive(commpact::Bucketed<C>{layers, make, {.cap_bytes = std::size_t(o.bucket_kb * 1024)}},
               std::move(policy), o, model.size(), total, rounds);
}

// The parameter-server methods (issue 22): every rank is a worker and serves one shard
// (ps::roles::colocated), the servers run SGD + momentum; the codec is dense. Each step
// pushes the gradient and pulls the parameters the consistency model allows; at each
// epoch's end ps::barrier() makes the trainer's loss allreduce safe; the last step
// finishes and takes the servers' parameters (rank 0 evaluates them).
template <class Model, class Comm>
Method drive_ps(Comm comm, Model model, const Options& o, std::int64_t total, std::int64_t& rounds) {
  using Server = commpact::ps::ParameterServer<Comm, commpact::ps::dense_codec, Model>;
  auto server = std::make_shared<std::unique_ptr<Server>>();
  const std::int64_t per_epoch = total / o.epochs;
  Method m;
  m.step = [server, comm, model, &o, total, per_epoch, &rounds](std::span<float> p, std::span<float> g, double lr,
                                                                std::int64_t step) {
    auto& ps = *server;
    if (!ps)  // collective, at the first step: every rank's p holds the same initial model
      ps = std::make_unique<Server>(comm, commpact::ps::roles::colocated(comm.size()), p, model,
                                    commpact::ps::ps_options{.momentum = o.momentum});
    ps->push(g, lr);
    ps->pull(p);
    rounds = ps->clock();
    if (step + 1 == total) {
      ps->finish();
      ps->final_params(p);
    } else if ((step + 1) % per_epoch == 0) {
      ps->barrier();
    }
  };
  return m;
}

inline const std::vector<std::string>& method_names() {
  static const std::vector<std::string> names = {"dense",    "topk",   "gtopk",    "powersgd", "localsgd",
                                                 "qsr",      "qsgd",   "terngrad", "onebit",   "natural",
                                                 "fp16",     "bf16",   "efsign",   "signum",   "randomk",
                                                 "gaussiank", "dgc",      "oktopk",   "ps-bsp",
                                                 "ssp",      "asp"};
  return names;
}

template <class Comm>
Method make_method(const std::string& name, Comm comm, const Options& o, const Mlp& model, std::int64_t total,
                   std::int64_t& rounds) {
  const std::size_t n = model.size();
  const std::int64_t warmup = warmup_steps(total);
  using commpact::bucket_info;
  auto dense = [comm](const bucket_info& = {}) { return commpact::Dense<Comm>{comm}; };
  if (name == "dense") return drive_buckets(dense, dense, commpact::EveryStep{}, o, model, total, rounds);
  if (name == "topk") {
    auto make = [comm, &o](const bucket_info& = {}) { return commpact::TopK<Comm>{comm, {.density = o.density}}; };
    return drive_buckets(make, make, commpact::EveryStep{}, o, model, total, rounds);
  }
  if (name == "gtopk") {
    auto make = [comm, &o](const bucket_info& = {}) {
      return commpact::gTopK<commpact::TreeComm<Comm>>{comm, {.density = o.density}};
    };
    return drive_buckets(make, make, commpact::EveryStep{}, o, model, total, rounds);
  }
  if (name == "powersgd") {
    const auto shapes = model.shapes();
    auto make = [comm, shapes, warmup](const bucket_info& b) {
      commpact::tensor_layout layout;
      for (std::size_t t = b.first_layer; t < b.end_layer; ++t) layout.push_back({shapes[t].first, shapes[t].second});
      return commpact::PowerCompressor<2>{comm, layout, {.start_step = warmup}};
    };
    auto whole = [make, &shapes] { return make({0, 0, shapes.size(), 0, 0}); };
    return drive_buckets(make, whole, commpact::EveryStep{}, o, model, total, rounds);
  }
  if (name == "localsgd") return drive_buckets(dense, dense, commpact::LocalSgd{o.local_h}, o, model, total, rounds);
  if (name == "qsr")
    return drive_buckets(dense, dense, commpact::QSRPolicy{o.qsr_alpha, o.local_h, warmup}, o, model, total, rounds);
  // The survey's other compressors (quantizers.hpp, sparsifiers.hpp, allreduce.hpp, majority.hpp).
  auto codec = [&](auto k) {
    using K = decltype(k);
    return drive(commpact::CodecCompressor<K, commpact::Allgather<Comm>>{comm, std::move(k)}, commpact::EveryStep{}, o,
                 n, total, rounds);
  };
  if (name == "qsgd") return codec(commpact::qsgd_codec{static_cast<std::uint32_t>(o.qsgd_levels), o.seed});
  // TernGrad, 1-bit and EF-SignSGD take a scale per row of each weight matrix and per bias
  // (per_tensor.hpp): one scale over the flat vector mixes W1's and b2's magnitudes
  // (EF-SignSGD: 69%), and one per layer, under momentum 0.9, did worse (56%).
  auto rows = [&model] {
    commpact::tensor_layout l;
    for (auto [r, c] : model.shapes()) l.push_back({r, c});
    return commpact::split_rows(l);
  };
  if (name == "terngrad") return codec(commpact::per_tensor{rows(), commpact::terngrad_codec{o.seed}});
  if (name == "onebit") return codec(commpact::per_tensor{rows(), commpact::onebit_codec{}});
  if (name == "natural") return codec(commpact::natural_codec{o.seed});
  // fp16 and bf16 sum in the 16-bit type by a ring allreduce, as PyTorch's compress hooks
  // (cast_allreduce.hpp): half of dense's bytes, where the allgather form sends (P - 1) times more.
  if (name == "fp16")
    return drive(commpact::Fp16Allreduce<Comm>{comm}, commpact::EveryStep{}, o, n, total, rounds);
  if (name == "bf16")
    return drive(commpact::Bf16Allreduce<Comm>{comm}, commpact::EveryStep{}, o, n, total, rounds);
  if (name == "efsign") return codec(commpact::per_tensor{rows(), commpact::sign_codec{}});
  if (name == "gaussiank") return codec(commpact::gaussiank_codec{o.density});
  if (name == "dgc") return codec(commpact::dgc_codec{o.density, 0.01, o.seed});
  if (name == "ps-bsp") return drive_ps(comm, commpact::ps::Bsp{}, o, total, rounds);
  if (name == "ssp") return drive_ps(comm, commpact::ps::Ssp{o.staleness}, o, total, rounds);
  if (name == "asp") return drive_ps(comm, commpact::ps::Asp{}, o, total, rounds);
  if (name == "oktopk")
    return drive(commpact::OkTopK<Comm>{comm, {.density = o.density}}, commpact::EveryStep{}, o, n, total, rounds);
  if (name == "signum")
    return drive(commpact::MajorityVote<Comm>{comm, {.momentum = 0.9f}}, commpact::EveryStep{}, o, n, total, rounds);
  if (name == "randomk") {
    // Random-k's residual holds about 1/density steps of gradient per entry; SGD momentum
    // 0.9 on top of that delay diverged (10% accuracy), so random-k runs with momentum 0.
    Options plain = o;
    plain.momentum = 0.0;
    return drive(commpact::LinearCompressor<commpact::randomk_codec, Comm>{comm, commpact::randomk_codec{o.density, o.seed}},
                 commpact::EveryStep{}, plain, n, total, rounds);
  }
  std::string known;
  for (auto& m : method_names()) known += (known.empty() ? "" : ", ") + m;
  throw commpact::invalid_argument("demo: unknown method '" + name + "'; use one of: " + known + ".");
}

}  // namespace demo
