// SPDX-License-Identifier: Apache-2.0
#pragma once
// ResNet-18's 62 parameter tensors in module order (as torchvision builds them), each as
// (rows, cols): conv weights flattened to out x in*kh*kw, the BatchNorm weight and bias
// and the fc bias as columns (cols = 1); 11,689,512 floats. PyTorch's powerSGD_hook views
// each gradient the same way (out x the rest). Shared by bench/bench_vs_torch/driver.cpp
// and bench/cuda/bench_power.cu; the Python side (bench/bench_vs_torch/run.py's
// resnet18_shapes, imported by bench/cuda/bench_power_torch.py) lists the same tensors.

#include <cstddef>
#include <utility>
#include <vector>

namespace commpact_bench {

inline std::vector<std::pair<std::size_t, std::size_t>> resnet18() {
  std::vector<std::pair<std::size_t, std::size_t>> s;
  auto conv = [&](std::size_t out, std::size_t in, std::size_t k) {
    s.push_back({out, in * k * k});
    s.push_back({out, 1});  // BN weight
    s.push_back({out, 1});  // BN bias
  };
  conv(64, 3, 7);
  std::size_t in = 64;
  for (std::size_t width : {64, 128, 256, 512}) {
    for (int block = 0; block < 2; ++block) {
      conv(width, block == 0 ? in : width, 3);
      conv(width, width, 3);
      if (block == 0 && width != in) conv(width, in, 1);
    }
    in = width;
  }
  s.push_back({1000, 512});
  s.push_back({1000, 1});
  return s;
}

}  // namespace commpact_bench
