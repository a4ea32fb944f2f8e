// expect: there is no kernel table ops<Space> for this space
#include <commpact/kernels/ops.hpp>

// A space with no kernel table: an algorithm's first call names what is missing.
struct MySpace {
  struct exec {};
};

int main() { commpact::ops<MySpace>::fill(MySpace::exec{}, 0, 0.0f); }
