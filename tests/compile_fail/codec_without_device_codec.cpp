// expect: this codec has no kernels in this execution space
#include <commpact/kernels/device_codec.hpp>

// A codec without device kernels (on the CUDA space, ops<cuda_space>'s codec rows use
// device_codec<Codec> as the workspace and call its members): CodecCompressor's first
// use of the codec rows names what is missing.
struct my_codec {};

int main() {
  commpact::device_codec<my_codec> ws;
  (void)ws;
}
