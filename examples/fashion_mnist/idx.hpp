#pragma once
// Reader for the IDX files of MNIST and Fashion-MNIST (gzip-compressed or plain).
// Validates the magic number, the dimensions and the length, and says what to do
// when the files are missing.
#include <zlib.h>

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include <commpact/error.hpp>

namespace demo {

struct Dataset {
  std::vector<float> images;  // count x 784, scaled to [0, 1]
  std::vector<std::uint8_t> labels;
  std::size_t count = 0;
  static constexpr std::size_t pixels = 28 * 28;
};

namespace detail {
inline std::vector<std::uint8_t> read_gz(const std::filesystem::path& p) {
  gzFile f = gzopen(p.c_str(), "rb");
  if (!f)
    throw commpact::invalid_argument("demo: cannot open " + p.string() +
                                     ". Install the data with `apt-get install dataset-fashion-mnist` (scripts/demo "
                                     "does) or pass --data-dir.");
  std::vector<std::uint8_t> out;
  std::array<std::uint8_t, 1 << 16> buf;
  int n;
  while ((n = gzread(f, buf.data(), buf.size())) > 0) out.insert(out.end(), buf.begin(), buf.begin() + n);
  const bool bad = n < 0;
  gzclose(f);
  if (bad) throw commpact::invalid_argument("demo: " + p.string() + " is not a readable gzip/IDX file.");
  return out;
}
inline std::uint32_t be32(const std::vector<std::uint8_t>& b, std::size_t at) {
  if (at + 4 > b.size()) throw commpact::invalid_argument("demo: IDX file truncated in its header.");
  return (std::uint32_t(b[at]) << 24) | (std::uint32_t(b[at + 1]) << 16) | (std::uint32_t(b[at + 2]) << 8) |
         std::uint32_t(b[at + 3]);
}
}  // namespace detail

// Loads `<dir>/<prefix>-images-idx3-ubyte.gz` and `<dir>/<prefix>-labels-idx1-ubyte.gz`.
inline Dataset load_idx(const std::filesystem::path& dir, const std::string& prefix, std::size_t limit = 0) {
  const auto img = detail::read_gz(dir / (prefix + "-images-idx3-ubyte.gz"));
  const auto lab = detail::read_gz(dir / (prefix + "-labels-idx1-ubyte.gz"));
  if (detail::be32(img, 0) != 0x803 || detail::be32(lab, 0) != 0x801)
    throw commpact::invalid_argument("demo: bad IDX magic number in " + (dir / prefix).string() + "-*.");
  const std::size_t n = detail::be32(img, 4), rows = detail::be32(img, 8), cols = detail::be32(img, 12);
  if (rows != 28 || cols != 28 || detail::be32(lab, 4) != n || img.size() != 16 + n * 784 || lab.size() != 8 + n)
    throw commpact::invalid_argument("demo: IDX files in " + dir.string() + " have inconsistent sizes.");
  Dataset d;
  d.count = limit ? std::min(limit, n) : n;
  d.images.resize(d.count * 784);
  d.labels.assign(lab.begin() + 8, lab.begin() + 8 + d.count);
  for (std::size_t i = 0; i < d.count * 784; ++i) d.images[i] = img[16 + i] / 255.0f;
  for (auto l : d.labels)
    if (l > 9) throw commpact::invalid_argument("demo: label above 9 in " + dir.string() + ".");
  return d;
}

}  // namespace demo
