// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file ops.hpp
//! ops<Space>: the leaf kernels of commpact, one specification each, as a table per
//! execution space. Algorithms (compressors, aggregations) call the table; a space adds
//! kernels, not a second copy of any algorithm. Every operation takes the space's
//! executor first and the space's spans; it is queued on the executor (it has run by
//! the next fence), never throws on data (it sets bits in a status in the space's
//! memory, kernels/status.hpp) and allocates nothing once its workspace has grown.
//!
//! | operation | specification (host_space is the reference) |
//! |---|---|
//! | `fill(e, v, x)` | v[i] = x |
//! | `copy(e, src, dst)` | dst[i] = src[i] (equal lengths) |
//! | `to_host(e, src, host)` / `from_host(e, host, dst)` | copies between the space and host memory; the host side is read or written when the work runs (after the fence) |
//! | `mean(e, v, P, status)` | v[i] = mean_of(v[i], P) (kernels/mean.hpp); status \|= nonfinite when a result is not finite |
//! | `mean_into(e, src, dst, P, status)` | when every src[i] is finite: dst[i] = mean_of(src[i], P); else status \|= nonfinite and dst is untouched |
//! | `ef_accumulate(e, acc, u_next, u, r, g, m, scale, status)` | error feedback's accumulate: g' = scale[0] g (g when scale is empty); with momentum m > 0, u_next = (m u) + g' and acc = r + u_next, else acc = r + g'; status \|= nonfinite when an acc value is not finite |
//! | `sub(e, y, x)` | y[i] -= x[i] |
//! | `clip_scale(e, g, clip_norm, P, scale)` | scale[0] = DGC's clipping factor of g (1 when no clipping applies) |
//! | `topk_abs(e, v, k, idx, val, ws)` | the k largest \|v\|, index-sorted, ties to the smaller index (host::topk_abs) |
//! | `scatter_mean(e, out, idx, val, P)` | out = 0, then out[idx[j]] = mean_of(val[j], P) |
//! | `zero_delivered(e, r, u, idx, alive)` | r[idx[j]] = 0 (and u[idx[j]]) where alive[j] |
//! | `tree_local / tree_payload / tree_absorb / tree_scatter / tree_zero_delivered` | gTop-k's data plane (kernels/host/sparse_tree.hpp) |
//! | `linear_encode(e, codec, acc, block, status)` | LinearCompressor: block[0, m) = A acc (the LinearCodec's compress) and block[m] = 0; when status holds nonfinite, block = 0 and block[m] = 1 |
//! | `linear_decode(e, codec, block, out, P, status)` | Allreduce<C>: when block[m] = 0, block[j] = mean_of(block[j], P) for j < m and out = B block[0, m) (zeroed first); else status \|= nonfinite, out untouched |
//! | `linear_feedback(e, codec, acc, approx, dense)` | LinearCompressor: acc -= B A acc (the delivered indices zeroed, or through approx (m) and dense (n)) |
//! | `signum_update(e, next, m, g, beta, status)` | MajorityVote: next = beta m + (1 - beta) g (g when m is empty); status \|= nonfinite when a value is not finite |
//! | `sign_vote(e, blocks, block_floats, scaled, out, status)` | Vote<C>: every block's sign payload checked (else status \|= wire, out untouched), then out[i] = s sign(sum_r sign_r[i]), s the mean scale or 1 (kernels/host/linear_vote.hpp) |
//!
//! Models: ops<host_space> (kernels/host/ops.hpp) runs the host kernels at once;
//! ops<deferred_space> (kernels/deferred/ops.hpp) queues the same host kernels until the
//! fence; ops<cuda_space> (the CUDA-space issue) implements each row with CUB/cuBLAS.

namespace commpact {

//! The kernel table of execution space S. A space without one fails to compile where
//! an algorithm first calls it.
template <class S>
struct ops {
  static_assert(sizeof(S) == 0,
                "commpact: there is no kernel table ops<Space> for this space: include kernels/host/ops.hpp for "
                "host_space, kernels/deferred/ops.hpp for deferred_space, or specialise commpact::ops for yours.");
};

}  // namespace commpact
