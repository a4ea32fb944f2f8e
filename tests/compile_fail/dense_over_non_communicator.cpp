// expect: this type is not a Communicator: it needs `int rank\(\) const` and `int size\(\) const`
#include <commpact/compress/compressors/dense.hpp>

struct NotAComm {};
int main() { commpact::Dense<NotAComm> d{NotAComm{}}; (void)d; }
