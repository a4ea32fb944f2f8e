// A LeNet-like CNN (two convolutions, two dense layers; torch::nn) trained on
// Fashion-MNIST by P data-parallel ranks, its gradients reduced per bucket, as backward
// makes them ready, by the commpact compressor chosen with --method:
//   dense, topk, gtopk, powersgd, efsign (EF-SignSGD through per_tensor: a scale per row), localsgd, qsr
// Ranks are threads of this process over ThreadComm (--comm thread) or over TorchComm
// on a ProcessGroupGloo (--comm gloo); with --rank/--world/--store, one process per rank
// over TorchComm (start P processes with the same --store file).
//
//   train_cnn --method gtopk --density 0.01 --ranks 2 --epochs 4
//
// The model's parameters live in one flat buffer (each torch parameter is a view into
// it); a hook on every parameter copies its gradient into a flat gradient buffer and
// tells commpact::DataParallel (Bucketed) that the tensor is ready, so buckets are
// reduced on commpact's worker thread while backward goes on; step() then waits and
// applies SGD with momentum to the flat parameters.
#include <torch/torch.h>

#include <CLI/CLI.hpp>

#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/aggregations/allgather.hpp>
#include <commpact/compress/codecs/per_tensor.hpp>
#include <commpact/compress/codecs/quantizers.hpp>
#include <commpact/compress/compressors/bucketed.hpp>
#include <commpact/compress/compressors/codec_compressor.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/compress/compressors/gtopk.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/compress/compressors/topk.hpp>
#include <commpact/sync/lr_schedule.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/torch/gloo.hpp>
#include <commpact/torch/torch_comm.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../fashion_mnist/idx.hpp"
#include "../fashion_mnist/number_check.hpp"
#include "../fashion_mnist/schedule.hpp"

namespace {

struct Options {
  std::string method = "dense";
  std::string comm = "thread";
  int ranks = 2, epochs = 4, batch = 32, local_h = 4, rank = -1, world = 0;
  double lr = 0.05, momentum = 0.9, density = 0.01, qsr_alpha = 0.2, bucket_kb = 64, expect = 0;
  std::size_t limit = 0, test_limit = 0;
  std::uint64_t seed = 42;
  std::string data_dir = "/usr/share/datasets/fashion-mnist", csv, store;
  bool quiet = false;
};

// LeNet-like: conv 5x5 (16) - pool - conv 5x5 (32) - pool - 128 - 10.
struct NetImpl : torch::nn::Module {
  NetImpl()
      : conv1(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 16, 5).padding(2)))),
        conv2(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(16, 32, 5)))),
        fc1(register_module("fc1", torch::nn::Linear(32 * 5 * 5, 128))),
        fc2(register_module("fc2", torch::nn::Linear(128, 10))) {}
  torch::Tensor forward(torch::Tensor x) {
    x = torch::max_pool2d(torch::relu(conv1(x)), 2);
    x = torch::max_pool2d(torch::relu(conv2(x)), 2);
    x = torch::relu(fc1(x.flatten(1)));
    return fc2(x);
  }
  torch::nn::Conv2d conv1, conv2;
  torch::nn::Linear fc1, fc2;
};
TORCH_MODULE(Net);

struct Data {
  demo::Dataset train, test;
};

struct Result {
  double acc = 0, loss = 0, seconds = 0, mb_sent = 0;
  std::int64_t rounds = 0;
};

// The hooks call `ready(t)` from backward; `flat_grad` receives the gradients.
struct Method {
  std::function<void(std::span<float> p, std::span<float> g, double lr)> step;
  std::function<void(std::span<float> g, double lr)> begin;
  std::function<void(std::size_t)> ready;
  std::function<std::int64_t()> rounds;
};

template <class Comp, class Policy>
Method drive(std::vector<std::size_t> layers, std::function<Comp(const commpact::bucket_info&)> make, Policy policy,
             const Options& o, std::size_t n, std::int64_t total) {
  using B = commpact::Bucketed<Comp>;
  auto dp = std::make_shared<commpact::DataParallel<B, Policy>>(
      B{layers, make, {.cap_bytes = std::size_t(o.bucket_kb * 1024)}}, std::move(policy), total);
  auto opt = std::make_shared<commpact::Sgd>(n, commpact::sgd_options{.momentum = o.momentum});
  Method m;
  m.step = [dp, opt](std::span<float> p, std::span<float> g, double lr) { dp->step(p, g, lr, *opt); };
  m.begin = [dp](std::span<float> g, double lr) { dp->begin_backward(g, lr); };
  m.ready = [dp](std::size_t t) { dp->grad_ready(t); };
  m.rounds = [dp] { return dp->rounds(); };
  return m;
}

template <class Comm>
Method make_method(const Options& o, Comm comm, const std::vector<std::vector<std::int64_t>>& shapes, std::size_t n,
                   std::int64_t total) {
  using namespace commpact;
  std::vector<std::size_t> layers;
  tensor_layout all;
  for (auto& s : shapes) {
    std::int64_t numel = 1;
    for (auto d : s) numel *= d;
    layers.push_back(std::size_t(numel));
    // PyTorch's view: rows = the first dimension, cols = the rest (a bias is a vector).
    if (s.size() == 1) all.push_back({s[0], 1});
    else all.push_back({s[0], numel / s[0]});
  }
  auto bucket_layout = [all](const bucket_info& b) {
    return tensor_layout(all.begin() + std::ptrdiff_t(b.first_layer), all.begin() + std::ptrdiff_t(b.end_layer));
  };
  const std::int64_t warmup = demo::warmup_steps(total);
  const auto& name = o.method;
  if (name == "dense" || name == "localsgd" || name == "qsr") {
    std::function<Dense<Comm>(const bucket_info&)> make = [comm](const bucket_info&) { return Dense<Comm>{comm}; };
    if (name == "dense") return drive(layers, make, EveryStep{}, o, n, total);
    if (name == "localsgd") return drive(layers, make, LocalSgd{o.local_h}, o, n, total);
    return drive(layers, make, QSRPolicy{o.qsr_alpha, o.local_h, warmup}, o, n, total);
  }
  if (name == "topk") {
    std::function<TopK<Comm>(const bucket_info&)> make = [comm, &o](const bucket_info&) {
      return TopK<Comm>{comm, {.density = o.density}};
    };
    return drive(layers, make, EveryStep{}, o, n, total);
  }
  if (name == "gtopk") {
    std::function<gTopK<TreeComm<Comm>>(const bucket_info&)> make = [comm, &o](const bucket_info&) {
      return gTopK<TreeComm<Comm>>{comm, {.density = o.density}};
    };
    return drive(layers, make, EveryStep{}, o, n, total);
  }
  if (name == "powersgd") {
    std::function<PowerCompressor<2>(const bucket_info&)> make = [comm, bucket_layout, warmup](const bucket_info& b) {
      return PowerCompressor<2>{comm, bucket_layout(b), {.start_step = warmup}};
    };
    return drive(layers, make, EveryStep{}, o, n, total);
  }
  if (name == "efsign") {
    using K = per_tensor<sign_codec>;
    using C = CodecCompressor<K, Allgather<Comm>>;
    std::function<C(const bucket_info&)> make = [comm, bucket_layout](const bucket_info& b) {
      // A scale per row of each weight matrix and per bias (split_rows), as the MLP demo:
      // one scale per tensor diverged here under momentum 0.9 (10% accuracy).
      return C{comm, K{split_rows(bucket_layout(b)), sign_codec{}}};
    };
    return drive(layers, make, EveryStep{}, o, n, total);
  }
  throw commpact::invalid_argument("train_cnn: unknown --method '" + name +
                                   "'; use dense, topk, gtopk, powersgd, efsign, localsgd or qsr.");
}

double evaluate(Net& net, const demo::Dataset& test) {
  torch::NoGradGuard g;
  net->eval();
  std::int64_t correct = 0;
  const std::int64_t N = std::int64_t(test.count), B = 1000;
  for (std::int64_t i = 0; i < N; i += B) {
    const std::int64_t b = std::min(B, N - i);
    auto x = torch::from_blob(const_cast<float*>(test.images.data()) + i * 784, {b, 1, 28, 28});
    auto y = torch::from_blob(const_cast<std::uint8_t*>(test.labels.data()) + i, {b}, torch::kUInt8).to(torch::kLong);
    correct += net->forward(x).argmax(1).eq(y).sum().item<std::int64_t>();
  }
  net->train();
  return double(correct) / double(N);
}

// One rank's training; the result is meaningful on rank 0.
template <class Comm>
Result train_rank(const Options& o, Comm comm, const Data& data) {
  using namespace commpact;
  const int P = comm.size(), r = comm.rank();
  // The same initial parameters on every rank and in every run: rank threads share
  // LibTorch's global generator, so each seeds it and draws its parameters alone (drawn
  // side by side, the ranks' draws interleaved differently from run to run).
  Net net{nullptr};
  {
    static std::mutex init;
    std::lock_guard lock(init);
    torch::manual_seed(o.seed);
    net = Net{};
  }
  // One flat buffer for all parameters, in registration (forward) order.
  auto params = net->parameters();
  std::vector<std::vector<std::int64_t>> shapes;
  std::vector<std::size_t> offset;
  std::size_t n = 0;
  for (auto& p : params) {
    shapes.push_back(p.sizes().vec());
    offset.push_back(n);
    n += std::size_t(p.numel());
  }
  auto flat = torch::empty({std::int64_t(n)});
  std::vector<float> grad(n, 0.f);
  {
    torch::NoGradGuard g;
    for (std::size_t t = 0; t < params.size(); ++t) {
      auto view = flat.narrow(0, std::int64_t(offset[t]), params[t].numel()).view(params[t].sizes());
      view.copy_(params[t]);
      params[t].set_data(view);
    }
  }
  std::span<float> pflat(flat.data_ptr<float>(), n);
  // Broadcast rank 0's parameters (they are equal already; this is what a program does).
  comm.inner().broadcast(pflat, 0);

  const std::size_t per_rank = data.train.count / std::size_t(P);
  const std::int64_t steps_per_epoch = std::int64_t(per_rank) / o.batch;
  require(steps_per_epoch > 0, data.train.count, " training images are too few for ", P,
          " ranks with --batch ", o.batch, " each; raise --limit or lower --ranks or --batch.");
  const std::int64_t total = steps_per_epoch * o.epochs;
  Method m = make_method(o, comm, shapes, n, total);
  const auto lr_at = demo::lr_schedule(o.lr, total);  // the demo's schedule

  // Hooks: copy each gradient into the flat buffer, then mark its tensor ready.
  for (std::size_t t = 0; t < params.size(); ++t) {
    float* dst = grad.data() + offset[t];
    params[t].register_hook([dst, t, &m](torch::Tensor g) {
      auto c = g.contiguous();
      std::memcpy(dst, c.data_ptr<float>(), std::size_t(c.numel()) * sizeof(float));
      m.ready(t);
      return torch::Tensor();  // keep the gradient as it is (.grad is not used)
    });
  }

  std::vector<std::uint32_t> shard(per_rank);
  for (std::size_t i = 0; i < per_rank; ++i) shard[i] = std::uint32_t(i * std::size_t(P) + std::size_t(r));
  std::vector<float> xb(std::size_t(o.batch) * 784);
  std::vector<std::int64_t> yb(std::size_t(o.batch));
  Result res;
  const auto t0 = std::chrono::steady_clock::now();
  std::int64_t step = 0;
  for (int epoch = 1; epoch <= o.epochs; ++epoch) {
    std::mt19937_64 g(o.seed * 7919 + std::uint64_t(epoch) * 131 + std::uint64_t(r));
    std::shuffle(shard.begin(), shard.end(), g);
    double loss_sum = 0;
    for (std::int64_t s = 0; s < steps_per_epoch; ++s, ++step) {
      for (int b = 0; b < o.batch; ++b) {
        const std::size_t idx = shard[std::size_t(s) * std::size_t(o.batch) + std::size_t(b)];
        std::copy_n(data.train.images.data() + idx * 784, 784, xb.data() + std::size_t(b) * 784);
        yb[std::size_t(b)] = data.train.labels[idx];
      }
      const double lr = lr_at(step);
      auto x = torch::from_blob(xb.data(), {o.batch, 1, 28, 28});
      auto y = torch::from_blob(yb.data(), {o.batch}, torch::kLong);
      m.begin(grad, lr);
      auto loss = torch::nn::functional::cross_entropy(net->forward(x), y);
      loss.backward();
      for (auto& p : params) p.mutable_grad() = torch::Tensor();  // unused: the flat buffer holds it
      m.step(pflat, grad, lr);
      loss_sum += loss.item<double>();
      if (!o.quiet && r == 0 && (s + 1) % std::max<std::int64_t>(1, steps_per_epoch / 4) == 0 &&
          s + 1 < steps_per_epoch)
        std::printf("  [%s] epoch %d: %3d%%  loss %.4f\r", o.method.c_str(), epoch, int(100 * (s + 1) / steps_per_epoch),
                    loss_sum / double(s + 1)),
            std::fflush(stdout);
    }
    double l[1] = {loss_sum / double(steps_per_epoch)};
    comm.inner().allreduce(std::span<double>(l, 1), reduce_op::sum);  // not counted
    res.loss = l[0] / P;
    res.acc = r == 0 ? evaluate(net, data.test) : 0;
    res.mb_sent = double(comm.stats().bytes_sent) / 1e6;
    res.rounds = m.rounds();
    res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (!o.quiet && r == 0)
      std::printf("  [%s] epoch %d/%d  loss %.4f  test acc %.2f%%  sent %.2f MB/rank  %lld rounds  %.1f s\n",
                  o.method.c_str(), epoch, o.epochs, res.loss, 100 * res.acc, res.mb_sent,
                  static_cast<long long>(res.rounds), res.seconds),
          std::fflush(stdout);
  }
  return res;
}

// Refuses, before any data is read, what would otherwise fail after training or wait:
// --rank not below --world, a --csv that cannot be appended to, and a --store in a folder
// that does not exist (c10d's FileStore retries opening it until its timeout).
void check_paths(const Options& o) {
  using commpact::invalid_argument;
  if (o.rank >= 0 && o.rank >= o.world)
    throw invalid_argument(commpact::detail::cat("--rank ", o.rank, " must be below --world ", o.world,
                                                 "; ranks count from 0."));
  if (!o.csv.empty()) {
    // It must open to append; a file this check creates is removed again, so that a run
    // that fails later leaves no empty file behind.
    std::error_code ec;
    const bool existed = std::filesystem::exists(o.csv, ec);
    const bool ok = static_cast<bool>(std::ofstream(o.csv, std::ios::app));
    if (ok && !existed) std::filesystem::remove(o.csv, ec);
    if (!ok)
      throw invalid_argument("--csv '" + o.csv + "' cannot be opened to append; pass a file in a folder that exists.");
  }
  if (o.rank >= 0) {
    const auto dir = std::filesystem::path(o.store).parent_path();
    std::error_code ec;
    if (!dir.empty() && !std::filesystem::is_directory(dir, ec))
      throw invalid_argument("--store '" + o.store + "': the folder " + dir.string() +
                             " does not exist; every process must name one file in a folder they share.");
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app{"LibTorch CNN on Fashion-MNIST, gradients reduced per bucket by a commpact compressor"};
  app.add_option("--method", o.method, "dense, topk, gtopk, powersgd, efsign, localsgd or qsr")
      ->check(CLI::IsMember({"dense", "topk", "gtopk", "powersgd", "efsign", "localsgd", "qsr"}))
      ->capture_default_str();
  app.add_option("--comm", o.comm, "thread (ThreadComm) or gloo (TorchComm over ProcessGroupGloo)")
      ->check(CLI::IsMember({"thread", "gloo"}))
      ->capture_default_str();
  app.add_option("--ranks", o.ranks, "data-parallel ranks (threads of this process)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  auto* rank = app.add_option("--rank", o.rank,
                              "this process's rank (one process per rank, over TorchComm; needs --world, --store)")
                   ->check(CLI::Range(0, 1023));
  auto* world = app.add_option("--world", o.world, "ranks in all (with --rank)")->check(CLI::Range(1, 1024));
  auto* store = app.add_option("--store", o.store, "a FileStore path every process shares (with --rank)");
  rank->needs(world, store);
  world->needs(rank);
  store->needs(rank);
  app.add_option("--epochs", o.epochs)->check(CLI::Range(1, 1000))->capture_default_str();
  app.add_option("--batch", o.batch, "per rank")->check(CLI::Range(1, 4096))->capture_default_str();
  app.add_option("--lr", o.lr, "peak learning rate (warm-up, cosine decay)")
      ->check(demo::positive_number())
      ->capture_default_str();
  app.add_option("--momentum", o.momentum)->check(demo::number_in(0, 0.999))->capture_default_str();
  app.add_option("--density", o.density, "top-k and gTop-k density")->check(demo::number_in(1e-6, 1))->capture_default_str();
  app.add_option("--local-h", o.local_h, "Local SGD period, QSR's base period")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--qsr-alpha", o.qsr_alpha)->check(demo::positive_number())->capture_default_str();
  app.add_option("--bucket-kb", o.bucket_kb, "bucket cap")->check(demo::number_in(0, 1e9))->capture_default_str();
  app.add_option("--limit", o.limit, "use only this many training images (0: all)")->check(demo::number_in(0));
  app.add_option("--test-limit", o.test_limit, "use only this many test images (0: all)")->check(demo::number_in(0));
  app.add_option("--seed", o.seed)->capture_default_str();
  app.add_option("--data-dir", o.data_dir)->capture_default_str();
  app.add_option("--csv", o.csv, "append a result row (method,ranks,epochs,acc,loss,mb_sent,rounds,seconds) here");
  app.add_option("--expect-accuracy", o.expect, "exit 1 below this test accuracy (smoke tests)")
      ->check(demo::number_in(0, 1));
  app.add_flag("--quiet", o.quiet);
  CLI11_PARSE(app, argc, argv);

  try {
    check_paths(o);
    torch::set_num_threads(1);  // one core per rank
    Data data;
    data.train = demo::load_idx(o.data_dir, "train", o.limit);
    data.test = demo::load_idx(o.data_dir, "t10k", o.test_limit);
    Result res;
    std::mutex m;
    if (o.rank >= 0) {
      auto store = c10::make_intrusive<c10d::FileStore>(o.store, o.world);
      auto pg = commpact::torch_gloo_group(store, o.rank, o.world);
      commpact::TorchComm tc{pg, store, {.timeout = std::chrono::seconds(300)}};
      res = commpact::torch_guard(tc, [&] { return train_rank(o, commpact::CountingComm<commpact::TorchComm>{tc}, data); });
      tc.barrier();  // leave together: no rank closes its connections while a peer still receives
      if (o.rank != 0) return 0;
    } else if (o.comm == "thread") {
      commpact::run_threads(o.ranks, [&](commpact::ThreadComm& c) {
        auto r = train_rank(o, commpact::CountingComm<commpact::ThreadComm>{c}, data);
        if (c.rank() == 0) res = r;
      }, {.timeout = std::chrono::seconds(300)});
    } else {
      const std::string path = std::filesystem::temp_directory_path() /
                               ("train_cnn-store-" + std::to_string(::getpid()));
      std::vector<std::thread> th;
      std::vector<std::exception_ptr> err(std::size_t(o.ranks));
      for (int r = 0; r < o.ranks; ++r)
        th.emplace_back([&, r] {
          try {
            auto store = c10::make_intrusive<c10d::FileStore>(path, o.ranks);
            auto pg = commpact::torch_gloo_group(store, r, o.ranks);
            commpact::TorchComm tc{pg, store, {.timeout = std::chrono::seconds(300)}};
            auto res_r = commpact::torch_guard(
                tc, [&] { return train_rank(o, commpact::CountingComm<commpact::TorchComm>{tc}, data); });
            tc.barrier();  // leave together
            if (r == 0) {
              std::lock_guard<std::mutex> g(m);
              res = res_r;
            }
          } catch (...) {
            err[std::size_t(r)] = std::current_exception();
          }
        });
      for (auto& t : th) t.join();
      std::filesystem::remove(path);
      for (auto& e : err)
        if (e) std::rethrow_exception(e);
    }
    std::printf("%s: test accuracy %.2f%%, loss %.4f, %.2f MB sent per rank, %lld rounds, %.1f s\n", o.method.c_str(),
                100 * res.acc, res.loss, res.mb_sent, static_cast<long long>(res.rounds), res.seconds);
    if (!o.csv.empty()) {
      std::ofstream f(o.csv, std::ios::app);
      f << o.method << ',' << (o.rank >= 0 ? o.world : o.ranks) << ',' << o.epochs << ',' << res.acc << ','
        << res.loss << ',' << res.mb_sent << ',' << res.rounds << ',' << res.seconds << '\n';
      f.close();
      if (!f) {
        std::fprintf(stderr, "train_cnn: could not write %s (the line above is the run's result)\n", o.csv.c_str());
        return 1;
      }
    }
    if (res.acc < o.expect) {
      std::fprintf(stderr, "train_cnn: test accuracy %.4f is below --expect-accuracy %.4f\n", res.acc, o.expect);
      return 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_cnn: %s\n", e.what());
    return 2;
  }
  return 0;
}
