// PowerSGD and PowerGossip on 4 in-process ranks (ThreadComm), no launcher needed.
//
// Every rank fits the same linear model y = W x + b (W: 32 x 64, b: 32) by SGD on its
// own stream of samples from a common teacher. Part 1 averages gradients with
// PowerCompressor<2> (error feedback, warm start); part 2 trains decentralised on a
// ring, gossiping the models with PowerGossip (rank 1). Both print the loss and the
// bytes each rank sent, against what dense communication would have sent.
//
//   build-power/examples/powersgd_threads
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/power.hpp>
#include <commpact/gossip/gossip_mixer.hpp>
#include <commpact/topology/ring.hpp>

#include <cmath>
#include <cstdio>
#include <random>
#include <span>
#include <vector>

namespace {

constexpr int kOut = 32, kIn = 64, kRanks = 4, kSteps = 300, kBatch = 8;
constexpr float kLr = 0.05f;
const commpact::tensor_layout kLayout = {{kOut, kIn}, {kOut}};  // W row-major, then b
constexpr std::size_t kParams = kOut * kIn + kOut;

// The teacher: a fixed W*, b* (the same on every rank).
std::vector<float> teacher() {
  std::mt19937_64 g(2024);
  std::normal_distribution<float> d(0.f, 1.f / std::sqrt(float(kIn)));
  std::vector<float> t(kParams);
  for (auto& v : t) v = d(g);
  return t;
}

// Gradient of the mean squared error over a batch of this rank's samples; returns the loss.
float gradient(const std::vector<float>& p, const std::vector<float>& t, std::mt19937_64& gen, std::vector<float>& g) {
  std::normal_distribution<float> d(0.f, 1.f);
  std::fill(g.begin(), g.end(), 0.0f);
  float loss = 0;
  std::vector<float> x(kIn), err(kOut);
  for (int s = 0; s < kBatch; ++s) {
    for (auto& v : x) v = d(gen);
    for (int o = 0; o < kOut; ++o) {
      float y = t[kOut * kIn + o], yt = p[kOut * kIn + o];
      for (int i = 0; i < kIn; ++i) {
        y += t[o * kIn + i] * x[i];
        yt += p[o * kIn + i] * x[i];
      }
      err[o] = yt - y + 0.01f * d(gen);  // a little label noise
      loss += 0.5f * err[o] * err[o] / kBatch;
    }
    for (int o = 0; o < kOut; ++o) {
      for (int i = 0; i < kIn; ++i) g[o * kIn + i] += err[o] * x[i] / kBatch;
      g[kOut * kIn + o] += err[o] / kBatch;
    }
  }
  return loss;
}

}  // namespace

int main() {
  const auto t = teacher();

  std::printf("PowerSGD (rank 2) on %d ranks, %zu parameters\n", kRanks, kParams);
  commpact::run_threads(kRanks, [&](commpact::ThreadComm& comm) {
    using Counted = commpact::CountingComm<commpact::ThreadComm>;
    commpact::PowerCompressor<2> psgd{Counted{comm}, kLayout};
    std::mt19937_64 gen(100 + comm.rank());
    std::vector<float> params(kParams, 0.0f), grad(kParams);
    for (int step = 0; step < kSteps; ++step) {
      const float loss = gradient(params, t, gen, grad);
      psgd.reduce(std::span<float>(grad));  // the same rank-2 mean estimate on every rank
      for (std::size_t i = 0; i < kParams; ++i) params[i] -= kLr * grad[i];
      if (comm.rank() == 0 && (step % 50 == 0 || step == kSteps - 1))
        std::printf("  step %3d  loss on rank 0's batch %.5f\n", step, loss);
    }
    if (comm.rank() == 0) {
      const auto sent = psgd.comm().target<Counted>()->stats().bytes_sent;
      const auto dense = kSteps * commpact::wire::ring_allreduce(0, kRanks, kParams, 4).bytes_sent;
      std::printf("  rank 0 sent %llu bytes (%zu floats allreduced per step); dense allreduce would send %llu (%.1fx)\n",
                  static_cast<unsigned long long>(sent), psgd.floats_per_step(),
                  static_cast<unsigned long long>(dense), double(dense) / double(sent));
    }
  });

  std::printf("PowerGossip (rank 1) decentralised SGD on a ring of %d ranks\n", kRanks);
  commpact::run_threads(kRanks, [&](commpact::ThreadComm& comm) {
    commpact::GossipMixer mixer{comm, commpact::Ring(comm.size()), kLayout, commpact::power_gossip<1>{}};
    std::mt19937_64 gen(200 + comm.rank());
    std::vector<float> params(kParams, 0.0f), grad(kParams);
    for (int step = 0; step < kSteps; ++step) {
      const float loss = gradient(params, t, gen, grad);
      for (std::size_t i = 0; i < kParams; ++i) params[i] -= kLr * grad[i];
      mixer.mix(std::span<float>(params));  // gossip with the two ring neighbours
      const double cd = commpact::consensus_distance(comm, std::span<const float>(params));
      if (comm.rank() == 0 && (step % 50 == 0 || step == kSteps - 1))
        std::printf("  step %3d  loss on rank 0's batch %.5f  consensus distance %.3g\n", step, loss, cd);
    }
    if (comm.rank() == 0)
      std::printf("  rank 0 sent %llu bytes; exact D-PSGD would send %llu (%.1fx)\n",
                  static_cast<unsigned long long>(mixer.stats().bytes_sent),
                  static_cast<unsigned long long>(2ull * kSteps * 4 * kParams),
                  double(2ull * kSteps * 4 * kParams) / double(mixer.stats().bytes_sent));
  });
  return 0;
}
