// expect: this type is not a Compressor: it needs `save_state
#include <commpact/concepts.hpp>
#include <span>

struct NoState {
  void reduce(std::span<float>) {}
};
static_assert(commpact::diagnose_compressor<NoState>());
int main() {}
