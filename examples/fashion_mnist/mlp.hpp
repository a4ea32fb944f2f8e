#pragma once
// A two-layer perceptron (784 -> hidden -> 10, ReLU, softmax cross-entropy) on Eigen,
// with all parameters and gradients in one flat float buffer, the form in which
// commpact's compressors take them.
#include <Eigen/Dense>

#include <cmath>
#include <array>
#include <cstdint>
#include <functional>
#include <random>
#include <span>
#include <vector>

namespace demo {

class Mlp {
 public:
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  using MapM = Eigen::Map<Mat>;
  using CMapM = Eigen::Map<const Mat>;

  static constexpr int in = 784, out = 10;

  explicit Mlp(int hidden) : h_(hidden) {}

  int hidden() const { return h_; }
  std::size_t size() const { return std::size_t(h_) * in + h_ + std::size_t(out) * h_ + out; }
  // (rows, cols) of each tensor in the flat buffer: W1, b1, W2, b2.
  std::vector<std::pair<int, int>> shapes() const { return {{h_, in}, {1, h_}, {out, h_}, {1, out}}; }

  // He initialisation from a seed every rank shares.
  void init(std::span<float> p, std::uint64_t seed) const {
    std::mt19937_64 g(seed);
    std::normal_distribution<float> n1(0.f, std::sqrt(2.f / in)), n2(0.f, std::sqrt(2.f / h_));
    auto [w1, b1, w2, b2] = split(p);
    for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = n1(g);
    for (auto& x : b1) x = 0;
    for (std::size_t i = 0; i < w2.size(); ++i) w2[i] = n2(g);
    for (auto& x : b2) x = 0;
  }

  // Forward and backward on a batch of rows of x; writes the mean-loss gradient into
  // grad and returns the summed loss. `ready(t)`, when given, is called as soon as the
  // gradient of tensor t (0 W1, 1 b1, 2 W2, 3 b2) is final: backward goes last layer
  // first, so a Bucketed reducer can start sending layer 2 while layer 1 is computed.
  double loss_and_grad(std::span<const float> p, const float* x, const std::uint8_t* y, int batch,
                       std::span<float> grad, const std::function<void(std::size_t)>& ready = {}) {
    auto [w1, b1, w2, b2] = split_c(p);
    CMapM X(x, batch, in);
    CMapM W1(w1.data(), h_, in), W2(w2.data(), out, h_);
    z1_.noalias() = X * W1.transpose();
    z1_.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(b1.data(), h_);
    a1_ = z1_.cwiseMax(0.f);
    z2_.noalias() = a1_ * W2.transpose();
    z2_.rowwise() += Eigen::Map<const Eigen::RowVectorXf>(b2.data(), out);
    double loss = 0;
    for (int i = 0; i < batch; ++i) {
      const float m = z2_.row(i).maxCoeff();
      z2_.row(i) = (z2_.row(i).array() - m).exp();
      const float s = z2_.row(i).sum();
      z2_.row(i) /= s;
      loss -= std::log(std::max(z2_(i, y[i]), 1e-30f));
      z2_(i, y[i]) -= 1.f;  // dL/dz2 = softmax - onehot
    }
    z2_ /= float(batch);
    auto [g1, gb1, g2, gb2] = split(grad);
    MapM G2(g2.data(), out, h_), G1(g1.data(), h_, in);
    G2.noalias() = z2_.transpose() * a1_;
    Eigen::Map<Eigen::RowVectorXf>(gb2.data(), out) = z2_.colwise().sum();
    if (ready) ready(3), ready(2);
    da1_.noalias() = z2_ * W2;
    da1_ = (z1_.array() > 0.f).select(da1_, 0.f);
    G1.noalias() = da1_.transpose() * X;
    Eigen::Map<Eigen::RowVectorXf>(gb1.data(), h_) = da1_.colwise().sum();
    if (ready) ready(1), ready(0);
    return loss;
  }

  // Number of correct predictions on n rows.
  std::size_t correct(std::span<const float> p, const float* x, const std::uint8_t* y, std::size_t n) const {
    auto [w1, b1, w2, b2] = split_c(p);
    CMapM W1(w1.data(), h_, in), W2(w2.data(), out, h_);
    std::size_t ok = 0;
    const std::size_t chunk = 1000;
    for (std::size_t s = 0; s < n; s += chunk) {
      const int b = int(std::min(chunk, n - s));
      CMapM X(x + s * in, b, in);
      Mat a = (X * W1.transpose()).rowwise() + Eigen::Map<const Eigen::RowVectorXf>(b1.data(), h_);
      a = a.cwiseMax(0.f);
      Mat z = (a * W2.transpose()).rowwise() + Eigen::Map<const Eigen::RowVectorXf>(b2.data(), out);
      for (int i = 0; i < b; ++i) {
        Eigen::Index k;
        z.row(i).maxCoeff(&k);
        ok += (k == y[s + i]);
      }
    }
    return ok;
  }

 private:
  template <class T>
  std::array<std::span<T>, 4> split_impl(std::span<T> p) const {
    const std::size_t a = std::size_t(h_) * in, b = h_, c = std::size_t(out) * h_;
    return std::array<std::span<T>, 4>{p.subspan(0, a), p.subspan(a, b), p.subspan(a + b, c),
                                       p.subspan(a + b + c, out)};
  }
  std::array<std::span<float>, 4> split(std::span<float> p) const { return split_impl(p); }
  std::array<std::span<const float>, 4> split_c(std::span<const float> p) const { return split_impl(p); }

  int h_;
  Mat z1_, a1_, z2_, da1_;
};

}  // namespace demo
