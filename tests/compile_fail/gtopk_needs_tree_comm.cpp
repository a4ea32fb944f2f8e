// expect: this type is not a TreeSchedule: it needs `reduce\(reducer, std::vector<std::byte>& buffer\)`
// gTopK over a plain communicator (not seen through a tree schedule such as TreeComm)
// stops with one sentence.
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/compressors/gtopk.hpp>

int main() {
  auto comms = commpact::ThreadComm::make_world(1);
  commpact::gTopK<commpact::ThreadComm> g{comms[0]};
  (void)g;
}
