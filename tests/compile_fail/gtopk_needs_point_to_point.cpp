// expect: this communicator has no point-to-point exchange: it needs `send\(int peer, std::span<const std::byte>\)`
// gTopK<TreeComm<C>> over a communicator without send/recv stops with one sentence.
#include <commpact/compress/compressors/gtopk.hpp>
#include <span>
#include <string_view>

struct CollectivesOnly {
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T> void allreduce(std::span<T>, commpact::reduce_op) {}
  template <class T> void allgather(std::span<const T>, std::span<T>) {}
  template <class T> void broadcast(std::span<T>, int) {}
  void barrier() {}
  void abort(std::string_view) {}
};

int main() {
  commpact::gTopK<commpact::TreeComm<CollectivesOnly>> g{CollectivesOnly{}};
  (void)g;
}
