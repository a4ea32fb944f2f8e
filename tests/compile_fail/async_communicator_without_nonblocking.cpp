// expect: this communicator has no nonblocking collectives: it needs `iallreduce\(std::span<T>, reduce_op\)`
#include <commpact/comm/checked_comm.hpp>
#include <span>
#include <string_view>

// A synchronous communicator where an AsyncCommunicator is required.
struct SyncOnly {
  int rank() const { return 0; }
  int size() const { return 1; }
  template <class T> void allreduce(std::span<T>, commpact::reduce_op) {}
  template <class T> void allgather(std::span<const T>, std::span<T>) {}
  template <class T> void broadcast(std::span<T>, int) {}
  void barrier() {}
  void abort(std::string_view) {}
};

template <class C> struct Overlapper {
  static_assert(commpact::diagnose_async_communicator<C>());
};

int main() { Overlapper<commpact::CheckedComm<SyncOnly>> o; (void)o; }
