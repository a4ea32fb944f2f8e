// expect: this type is not a Space: it needs `static void fence\(exec, commpact::deadline\)`
#include <commpact/concepts/space.hpp>

#include <span>
#include <vector>

// A space whose work cannot be waited for.
struct NoFence {
  static constexpr bool host_accessible = true;
  template <class T> using span = std::span<T>;
  template <class T> using buffer = commpact::host_buffer<T>;
  struct exec {};
};

int main() { static_assert(commpact::diagnose_space<NoFence>()); }
