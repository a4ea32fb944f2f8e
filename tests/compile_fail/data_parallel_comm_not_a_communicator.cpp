// expect: this type is not a Communicator: it needs `abort\(std::string_view why\)`
// A compressor whose comm() returns a type that is almost a Communicator: DataParallel
// names what that type lacks (not "the compressor must expose comm()", which it does).
#include <commpact/sync/policies.hpp>
#include <commpact/train/data_parallel.hpp>

#include <cstddef>
#include <span>
#include <vector>

struct NoAbort {
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T> void allreduce(std::span<T>, commpact::reduce_op) {}
  template <class T> void allgather(std::span<const T>, std::span<T>) {}
  template <class T> void broadcast(std::span<T>, int) {}
  void barrier() {}
};

struct Mine {
  NoAbort c;
  bool reduce(std::span<float>) { return true; }
  void save_state(std::vector<std::byte>&) const {}
  void load_state(std::span<const std::byte>) {}
  NoAbort& comm() { return c; }
};

int main() {
  commpact::DataParallel dp{Mine{}, commpact::EveryStep{}, 10};
  (void)dp;
}
