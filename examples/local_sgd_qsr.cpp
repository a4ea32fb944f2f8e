// Local SGD with the Quadratic Synchronization Rule against data-parallel SGD, on four
// in-process ranks. Each rank fits a linear model to its own shard of a synthetic
// regression problem with mini-batch SGD (momentum 0.9) under a warm-up + cosine
// schedule; DataParallel decides when to synchronise, CountingComm counts the bytes.
//
//   ./build-sync/examples/local_sgd_qsr
//
// Prints, for EveryStep, LocalSgd{4} and QSR: the rounds, the bytes rank 0 sent and
// the final mean squared error over all shards.
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/dense.hpp>
#include <commpact/sync/lr_schedule.hpp>
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>
#include <commpact/train/sgd.hpp>

#include <cstdint>
#include <cstdio>
#include <random>
#include <span>
#include <vector>

namespace {

constexpr int kRanks = 4;
constexpr std::size_t kFeatures = 64, kSamples = 512, kBatch = 16;
constexpr std::int64_t kSteps = 2000, kWarmup = 100;

struct shard {
  std::vector<float> a;  // kSamples x kFeatures, row-major
  std::vector<float> y;
};

// Rank r's data: y = a w* + noise, with a shared w* and a rank-specific input shift.
shard make_shard(int rank) {
  std::mt19937 gen(1234u + static_cast<unsigned>(rank));
  std::normal_distribution<float> normal(0.f, 1.f);
  std::vector<float> w_star(kFeatures);
  std::mt19937 shared(42u);
  for (auto& w : w_star) w = normal(shared);
  shard s{std::vector<float>(kSamples * kFeatures), std::vector<float>(kSamples)};
  for (std::size_t i = 0; i < kSamples; ++i) {
    float dot = 0.f;
    for (std::size_t j = 0; j < kFeatures; ++j) {
      const float v = normal(gen) + 0.3f * static_cast<float>(rank);
      s.a[i * kFeatures + j] = v;
      dot += v * w_star[j];
    }
    s.y[i] = dot + 0.1f * normal(gen);
  }
  return s;
}

// Mini-batch gradient of the mean squared error 0.5 (a w - y)^2 / kBatch.
void gradient(const shard& s, std::span<const float> w, std::span<float> g, std::int64_t step, int rank) {
  std::fill(g.begin(), g.end(), 0.f);
  std::mt19937 gen(static_cast<unsigned>(step * 7919 + rank));
  std::uniform_int_distribution<std::size_t> pick(0, kSamples - 1);
  for (std::size_t b = 0; b < kBatch; ++b) {
    const std::size_t i = pick(gen);
    float err = -s.y[i];
    for (std::size_t j = 0; j < kFeatures; ++j) err += s.a[i * kFeatures + j] * w[j];
    for (std::size_t j = 0; j < kFeatures; ++j) g[j] += err * s.a[i * kFeatures + j] / kBatch;
  }
}

double mse(const shard& s, std::span<const float> w) {
  double total = 0;
  for (std::size_t i = 0; i < kSamples; ++i) {
    double err = -s.y[i];
    for (std::size_t j = 0; j < kFeatures; ++j) err += s.a[i * kFeatures + j] * w[j];
    total += err * err;
  }
  return total / kSamples;
}

template <class Policy>
void train(const char* name, const Policy& policy) {
  using Counted = commpact::CountingComm<commpact::ThreadComm>;
  std::int64_t rounds = 0;
  std::uint64_t bytes = 0;
  double loss = 0;
  commpact::run_threads(kRanks, [&](commpact::ThreadComm& comm) {
    const shard data = make_shard(comm.rank());
    const commpact::WarmupCosineLr lr{0.01, kWarmup, kSteps, 1e-4};
    commpact::DataParallel dp{commpact::Dense<Counted>{Counted{comm}}, policy, kSteps};
    commpact::Sgd opt{kFeatures, {.momentum = 0.9}};
    std::vector<float> w(kFeatures, 0.f), g(kFeatures);
    for (std::int64_t t = 0; t < kSteps; ++t) {
      gradient(data, w, g, t, comm.rank());
      dp.step(w, g, lr(t), opt);  // the last step always synchronises: w is the same on every rank
    }
    double l = mse(data, w);
    comm.allreduce(std::span<double>(&l, 1), commpact::reduce_op::sum);
    if (comm.rank() == 0) {
      rounds = dp.rounds();
      bytes = dp.comm().stats().bytes_sent;
      loss = l / kRanks;
    }
  });
  std::printf("| %-16s | %6lld | %10llu | %.5f |\n", name, static_cast<long long>(rounds),
              static_cast<unsigned long long>(bytes), loss);
}

}  // namespace

int main() {
  std::printf("| policy           | rounds | bytes sent | final MSE |\n|---|---:|---:|---:|\n");
  train("EveryStep", commpact::EveryStep{});
  train("LocalSgd{4}", commpact::LocalSgd{4});
  train("QSR{0.02, 4}", commpact::QSRPolicy{0.02, 4, kWarmup});
  return 0;
}
