// expect: this communicator's data plane runs in another space
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/power.hpp>

// PowerCompressor<Rank, deferred_space> bound to a host communicator: its allreduces would
// not be queued on the space's executor, so this does not compile (pass DeferredComm{comm}).
int main() {
  commpact::run_threads(1, [](commpact::ThreadComm& comm) {
    commpact::PowerCompressor<2, commpact::deferred_space> p{comm, commpact::tensor_layout{{4, 4}}};
    (void)p;
  });
}
