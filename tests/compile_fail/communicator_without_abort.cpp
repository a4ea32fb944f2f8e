// expect: this type is not a Communicator: it needs `abort\(std::string_view why\)`
#include <commpact/comm/counting_comm.hpp>
#include <span>

struct NoAbort {
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T> void allreduce(std::span<T>, commpact::reduce_op) {}
  template <class T> void allgather(std::span<const T>, std::span<T>) {}
  template <class T> void broadcast(std::span<T>, int) {}
  void barrier() {}
};

int main() { commpact::CountingComm<NoAbort> c{NoAbort{}}; (void)c; }
