// expect: commpact::gTopK needs a tree communicator: write gTopK<commpact::TreeComm<YourComm>>
// gTopK over a plain communicator (not seen through a TreeComm) stops with one sentence.
#include <commpact/comm/thread_comm.hpp>
#include <commpact/compress/gtopk.hpp>

int main() {
  auto comms = commpact::ThreadComm::make_world(1);
  commpact::gTopK<commpact::ThreadComm> g{comms[0]};
  (void)g;
}
