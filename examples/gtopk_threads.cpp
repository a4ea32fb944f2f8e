// gTop-k S-SGD on 4 in-process ranks (ThreadComm): the ranks fit one linear model
// y = <w, x> on their own data; each step the gradients are reduced by gTopK (density
// 0.05, error feedback) and CountingComm reports the bytes each rank sent. Used by
// docs/gtopk.md.
#include <commpact/comm/counting_comm.hpp>
#include <commpact/comm/thread_comm.hpp>
#include <commpact/comm/tree_comm.hpp>
#include <commpact/compress/compressors/gtopk.hpp>

#include <cstdio>
#include <random>
#include <span>
#include <vector>

int main() {
  constexpr int P = 4, steps = 600, batch = 64;
  constexpr std::size_t n = 500;
  constexpr float lr = 0.02f;

  std::vector<float> w_true(n);  // the model to recover (the same on every rank)
  std::mt19937 gen(7);
  std::normal_distribution<float> normal(0.f, 1.f);
  for (auto& v : w_true) v = normal(gen);

  commpact::run_threads(P, [&](commpact::ThreadComm& comm) {
    using Counted = commpact::CountingComm<commpact::ThreadComm>;
    commpact::gTopK<commpact::TreeComm<Counted>> reducer{Counted{comm}, {.density = 0.05}};

    std::mt19937 data(100 + comm.rank());  // each rank sees its own samples
    std::normal_distribution<float> sample(0.f, 1.f);  // one per rank thread: a shared one is a data race
    std::vector<float> w(n, 0.f), grad(n), x(n);
    auto dist2 = [&] {
      double d = 0;
      for (std::size_t i = 0; i < n; ++i) d += double(w[i] - w_true[i]) * (w[i] - w_true[i]);
      return d;
    };
    const double start = dist2();
    for (int step = 0; step < steps; ++step) {
      std::fill(grad.begin(), grad.end(), 0.f);  // mean squared error over the local batch
      for (int b = 0; b < batch; ++b) {
        float err = 0;
        for (std::size_t i = 0; i < n; ++i) {
          x[i] = sample(data);
          err += (w[i] - w_true[i]) * x[i];
        }
        for (std::size_t i = 0; i < n; ++i) grad[i] += err * x[i] / batch;
      }
      reducer.reduce(std::span<float>(grad));  // grad = global top-k sum / P: the same bits on every rank
      for (std::size_t i = 0; i < n; ++i) w[i] -= lr * grad[i];
    }
    const auto st = reducer.comm().inner().stats();
    if (comm.rank() == 0)
      std::printf("P = %d, n = %zu, k = %lld: |w - w*|^2 went from %.1f to %.2e in %d steps\n"
                  "rank 0 sent %.0f bytes per step in %.0f messages (a dense ring allreduce: %.0f bytes)\n",
                  P, n, (long long)reducer.k(), start, dist2(), steps, double(st.bytes_sent) / steps,
                  double(st.messages_sent) / steps, 2.0 * (P - 1) / P * 4.0 * n);
  });
}
