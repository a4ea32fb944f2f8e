// MpiComm's fold (comm/mpi/combine.hpp): the vector-extension kernel gives the bits of
// the plain scalar loop for every element type, operation, length (every tail) and
// aliasing MpiComm uses, including NaN, infinities and signed zeros; integer sums wrap.
// The only freedom left is which payload a sum of two NaNs carries (compilers may
// commute an addition, scalar or vector); every rank folds through this one function,
// so ranks still agree. One process: the kernel involves no communication.
// commpact-mpi-ranks: 1
#include <commpact/comm/mpi/combine.hpp>

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <type_traits>
#include <vector>

using commpact::reduce_op;

namespace {

template <class T>
T pick(std::mt19937_64& g) {
  if constexpr (std::is_floating_point_v<T>) {
    switch (g() % 8) {
      case 0: return std::numeric_limits<T>::quiet_NaN();
      case 1: {  // another NaN payload
        T x = std::numeric_limits<T>::quiet_NaN();
        unsigned char b[sizeof(T)];
        std::memcpy(b, &x, sizeof(T));
        b[0] ^= static_cast<unsigned char>(g() | 1);
        std::memcpy(&x, b, sizeof(T));
        return x;
      }
      case 2: return T(0);
      case 3: return -T(0);
      case 4: return (g() & 1) ? std::numeric_limits<T>::infinity() : -std::numeric_limits<T>::infinity();
      default: return static_cast<T>(std::uniform_real_distribution<double>(-1e3, 1e3)(g));
    }
  } else {
    return static_cast<T>(g());  // wraps: sums overflow often
  }
}

template <class T>
T scalar(T a, T b, reduce_op op) {
  switch (op) {
    case reduce_op::sum:
      if constexpr (std::is_integral_v<T>) {
        using U = std::make_unsigned_t<T>;
        return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
      } else {
        return a + b;
      }
    case reduce_op::min: return std::min(a, b);
    default: return std::max(a, b);
  }
}

template <class T>
bool same(T got, T want, T a, T b, reduce_op op) {
  if (std::memcmp(&got, &want, sizeof(T)) == 0) return true;
  if constexpr (std::is_floating_point_v<T>)  // a sum of two NaNs: any NaN
    return op == reduce_op::sum && std::isnan(a) && std::isnan(b) && std::isnan(got);
  return false;
}

}  // namespace

TEMPLATE_TEST_CASE("MpiComm's vectorised fold gives the scalar loop's bits", "[comm][mpi][combine]", float, double,
                   std::int32_t, std::uint32_t, std::int64_t, std::uint64_t) {
  using T = TestType;
  std::mt19937_64 g(20);
  const auto op = GENERATE(reduce_op::sum, reduce_op::min, reduce_op::max);
  for (std::size_t n = 0; n < 70; ++n) {
    for (int round = 0; round < 4; ++round) {
      const std::size_t off = static_cast<std::size_t>(round);  // unaligned starts too
      std::vector<T> a(n + off), b(n + off);
      for (auto& x : a) x = pick<T>(g);
      for (auto& x : b) x = pick<T>(g);
      std::vector<T> out(n + off), in_a = a, in_b = b;
      commpact::detail::mpi_combine(out.data() + off, a.data() + off, b.data() + off, n, op);
      commpact::detail::mpi_combine(in_a.data() + off, in_a.data() + off, b.data() + off, n, op);  // out == a
      commpact::detail::mpi_combine(in_b.data() + off, a.data() + off, in_b.data() + off, n, op);  // out == b
      for (std::size_t i = off; i < n + off; ++i) {
        const T want = scalar(a[i], b[i], op);
        INFO("n " << n << " i " << i << " op " << static_cast<int>(op));
        REQUIRE(same(out[i], want, a[i], b[i], op));
        REQUIRE(same(in_a[i], want, a[i], b[i], op));
        REQUIRE(same(in_b[i], want, a[i], b[i], op));
      }
    }
  }
}

TEST_CASE("MpiComm's fold: min and max keep the operand order on signed zeros and NaN", "[comm][mpi][combine]") {
  // std::min(a, b) returns a unless b < a: min(+0, -0) = +0, min(-0, +0) = -0;
  // min(NaN, 1) = NaN, min(1, NaN) = 1. 33 elements: vector body and scalar tail.
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> a(33), b(33), out(33);
  for (std::size_t i = 0; i < a.size(); ++i) {
    a[i] = i % 4 == 0 ? 0.f : i % 4 == 1 ? -0.f : i % 4 == 2 ? nan : 1.f;
    b[i] = i % 4 == 0 ? -0.f : i % 4 == 1 ? 0.f : i % 4 == 2 ? 1.f : nan;
  }
  for (auto op : {reduce_op::min, reduce_op::max}) {
    commpact::detail::mpi_combine(out.data(), a.data(), b.data(), a.size(), op);
    for (std::size_t i = 0; i < a.size(); ++i) {
      const float want = op == reduce_op::min ? std::min(a[i], b[i]) : std::max(a[i], b[i]);
      REQUIRE(std::signbit(out[i]) == std::signbit(want));
      REQUIRE(std::isnan(out[i]) == std::isnan(want));
      if (!std::isnan(want)) REQUIRE(out[i] == want);
    }
  }
}
