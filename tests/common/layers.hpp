// The layers of the small models of the overlap tests: their sizes, the total, and the
// PowerSGD layout of a bucket's layers.
#pragma once

#include <commpact/compress/codecs/tensor_layout.hpp>
#include <commpact/compress/compressors/bucketed.hpp>

#include <cstddef>
#include <numeric>
#include <vector>

namespace commpact_test {

//! The element count of each layer.
inline std::vector<std::size_t> layer_sizes(const std::vector<commpact::tensor_shape>& shapes) {
  std::vector<std::size_t> v;
  for (auto s : shapes) v.push_back(static_cast<std::size_t>(s.numel()));
  return v;
}
//! The element count of the whole model.
inline std::size_t model_size(const std::vector<commpact::tensor_shape>& shapes) {
  const auto v = layer_sizes(shapes);
  return std::accumulate(v.begin(), v.end(), std::size_t{0});
}
//! The PowerSGD layout of the layers in bucket b.
inline commpact::tensor_layout layout_of(const std::vector<commpact::tensor_shape>& shapes,
                                         const commpact::bucket_info& b) {
  return commpact::tensor_layout(shapes.begin() + static_cast<std::ptrdiff_t>(b.first_layer),
                                 shapes.begin() + static_cast<std::ptrdiff_t>(b.end_layer));
}

}  // namespace commpact_test
