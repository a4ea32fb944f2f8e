// expect: this codec has no kernels in this execution space
#include <commpact/compress/codec_kernels.hpp>
#include <commpact/compress/codecs/topk_sign.hpp>

// A codec in a space that has no kernels for it (as a codec without device kernels on the
// CUDA space): CodecCompressor's first use of codec_kernels names what is missing.
struct MySpace {
  struct exec {};
};

int main() { commpact::codec_kernels<commpact::sign_codec, MySpace>::clear_delivered(MySpace::exec{}); }
