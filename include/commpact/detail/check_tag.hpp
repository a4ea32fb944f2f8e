// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file check_tag.hpp
//! The value a compressor's per-step check carries for its step (the step check's
//! allreduce, the frame headers): its step count, plus its check tag in bits 40 and up.
//! A compressor alone has tag 0 (the value is its step count); Bucketed gives bucket b's
//! compressor the tag b + 1 (set_check_tag), so that two buckets' steps never carry the
//! same value: a rank that cancelled a step after some buckets had started and retried it
//! while the others went on meets their next bucket with its bucket 0, and that bucket's
//! check raises mismatch_error on every rank in that step (the buckets of equal size,
//! whose messages match; other sizes differ already). gTopK's frames carry only the low
//! bits of a step, so it adds the tag itself (step + tag): a bucket difference that is a
//! multiple of 16 may go unseen there. Tags are below 2^20 (checked_tag), so the tagged
//! step stays below 2^63 for every step count a state holds (below 2^62).

#include <cstdint>
#include <string>
#include <string_view>

#include "../error.hpp"

namespace commpact::detail {

inline constexpr int check_tag_shift = 40;
inline constexpr std::uint32_t check_tag_limit = std::uint32_t{1} << 20;

//! A tag a compressor accepts (set_check_tag): invalid_argument from 2^20 on.
inline std::uint32_t checked_tag(std::uint32_t tag) {
  require(tag < check_tag_limit, "commpact: a check tag must be below 2^20 (", check_tag_limit, "); got ", tag,
          ". Bucketed gives bucket b the tag b + 1.");
  return tag;
}

//! The step as a per-step check carries it: step + tag * 2^40 (steps below 2^40).
constexpr std::int64_t tagged_step(std::int64_t step, std::uint32_t tag) {
  return step + (static_cast<std::int64_t>(tag) << check_tag_shift);
}

//! A tagged step in words: "step 7" for tag 0, "step 7 of bucket 2" for tag 3 (a step of
//! 2^40 or more without a tag reads as a bucket's: only the text is off).
inline std::string tagged_step_text(std::int64_t v) {
  if (v < 0) return cat("step ", v);
  const auto tag = v >> check_tag_shift;
  const auto step = v & ((std::int64_t{1} << check_tag_shift) - 1);
  if (tag == 0) return cat("step ", step);
  return cat("step ", step, " of bucket ", tag - 1);
}

//! What a step mismatch means under Bucketed (a tagged check), for the errors' text.
inline const char* bucket_hint(bool bucketed) {
  return !bucketed ? ""
                   : " Under Bucketed this is also how a rank shows that it cancelled a step after some buckets had "
                     "started and retried it while the others went on (its retried bucket met another bucket): every "
                     "rank must cancel at the same point.";
}

//! The error of ranks out of step (or, under Bucketed, in other buckets), one text for
//! every check: `where` says which rank is at which step (tagged_step_text).
inline mismatch_error out_of_step(std::string_view who, bool bucketed, const std::string& where) {
  return mismatch_error(cat("commpact::", who, "::reduce: ranks disagree on the step count",
                            bucketed ? " or the bucket" : "", ": ", where,
                            "; a rank kept (commit) a step that another dropped (cancel), or retried a step the others "
                            "kept. Every rank must commit or cancel each step alike; restore every rank from one "
                            "checkpoint to go on.",
                            bucket_hint(bucketed)));
}
//! The same, from a check that tells only that another rank differs (this rank's step and tag).
inline mismatch_error out_of_step(std::string_view who, int rank, std::int64_t step, std::uint32_t tag) {
  return out_of_step(who, tag != 0,
                     cat("rank ", rank, " is at ", tagged_step_text(tagged_step(step, tag)),
                         " and another rank at another step", tag != 0 ? " or bucket" : ""));
}

}  // namespace commpact::detail
