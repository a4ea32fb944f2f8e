// expect: this type is not a Topology: it needs `double weight\(int i, int j\) const`
#include <commpact/concepts.hpp>
#include <vector>

struct NoWeights {
  int size() const { return 2; }
  std::vector<int> neighbors(int) const { return {}; }
};
static_assert(commpact::diagnose_topology<NoWeights>());
int main() {}
