// expect: a deferred_span is device memory: host code cannot index it
#include <commpact/space/deferred.hpp>

// Host code reading device memory of the deferred space (as it would a CUDA buffer):
// the deferred span has no host element access, so this does not compile.
int main() {
  commpact::deferred_space::buffer<float> b;
  b.resize(4);
  auto s = b.view();
  return static_cast<int>(s[0]);
}
