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
//! | `frame_gate(e, blocks, block_floats, sum, status)` | unless the codec frame headers at the start of the blocks are clean (wire/codec_frame.hpp's headers_clean: well formed, no flag, one n, agreement value, step and capacity): status \|= wire and sum[0] = NaN, so that a mean_into after it leaves its output untouched (CodecCompressor decodes before the host reads the headers) |
//! | `ef_accumulate(e, acc, u_next, u, r, g, m, scale, status)` | error feedback's accumulate: g' = scale[0] g (g when scale is empty); with momentum m > 0, u_next = (m u) + g' and acc = r + u_next, else acc = r + g'; status \|= nonfinite when an acc value is not finite |
//! | `sub(e, y, x)` | y[i] -= x[i] |
//! | `clip_scale(e, g, clip_norm, P, scale)` | scale[0] = DGC's clipping factor of g (1 when no clipping applies); ||g||^2 summed in double in kernels/fixed_sum.hpp's shape (kernels/clip.hpp) |
//! | `topk_abs(e, v, k, idx, val, ws)` | the k largest \|v\|, index-sorted, ties to the smaller index (host::topk_abs) |
//! | `scatter_mean(e, out, idx, val, P)` | out = 0, then out[idx[j]] = mean_of(val[j], P) |
//! | `zero_delivered(e, r, u, idx, alive)` | r[idx[j]] = 0 (and u[idx[j]]) where alive[j] |
//! | `tree_local / tree_payload / tree_absorb / tree_scatter / tree_zero_delivered` | gTop-k's data plane (kernels/host/sparse_tree.hpp) |
//! | `add(e, y, x)` | y[i] += x[i] (DataParallel's parameter average) |
//! | `sgd_step(e, x, v, g, lr, mu, wd)` | Sgd's update (kernels/host/sgd.hpp): d = g + wd x; v = mu v + d; x -= lr v (v empty: x -= lr d), float, no FMA |
//! | `check_finite(e, v, status)` | status \|= nonfinite when some v[i] is not finite (PowerCompressor) |
//! | `copy_if_clear(e, src, dst, status)` | dst[i] = src[i] when every status word is 0, else nothing (PowerCompressor) |
//! | `lowrank_prepare(e, n, m, r, products)` | makes the three products of an n x m matrix at rank r ready to run without allocating (cuda_space: with blas the executor's cuBLAS handle and scratch, exact the scratch of back_project's tree; elsewhere nothing); called off the hot path (PowerCompressor::set_layout) |
//! | `lowrank_project(e, g, res, M, n, m, Q, r, P, products = exact)` | M = g + res (M = g when res is empty), then P = M Q; M, g, res row-major n x m, Q (m x r) and P (n x r) column-major, in lowrank.hpp's order (products = exact; blas: power_products.hpp) (PowerCompressor) |
//! | `lowrank_back_project(e, M, n, m, P, r, Q, products = exact)` | Q = M^T P, in lowrank.hpp's order (exact; blas: power_products.hpp) (PowerCompressor) |
//! | `lowrank_approx_residual(e, g, M, n, m, P, Q, r, status, products = exact)` | when every status word is 0: A = P Q^T, M = M - A (the residual, in place), g = A; else nothing; A in lowrank.hpp's order (exact; blas: power_products.hpp), M - A one float subtraction either way (PowerCompressor) |
//! | `orthonormalize(e, a, rows, cols)` | the columns of column-major a, orthonormalised in host::orthonormalize_columns' fixed order (PowerCompressor) |
//! | `gaussian(e, v, seed)` | v = host::fill_gaussian(seed): Box-Muller over splitmix64, in double (PowerCompressor) |
//! | `redraw_zero_columns(e, q, rows, cols, seed, t, step)` | every column j of column-major q that is exactly zero = gaussian(mix_seed(seed, t, step, j + 1)) (PowerCompressor) |
//! | `gossip_check(e, x, on, words)` | GossipMixer: words = {1 when on and x holds a NaN/Inf else 0, x's first non-finite index (n when none), 0} (kernels/host/gossip.hpp) |
//! | `gossip_agree_begin(e, round, words)`, `gossip_agree_end(e, words)` | GossipMixer's agreement (6 words): words[3..5] = {words[0], round, -round} before the allreduce (max) of words[3..5]; after it words[0] = 4 (flag_rounds) when words[4] + words[5] != 0, else words[3] |
//! | `gossip_pack(e, x, msg)` | GossipMixer: msg = the 4n bytes of x |
//! | `gossip_mix(e, x, recv, w, w_self, acc, words)` | GossipMixer (D-PSGD): when words[0] = words[2] = 0, x = float(w_self x + sum_k w[k] x_k) in double (acc), x_k the k-th 4n bytes of recv, k ascending |
//! | `choco_update(e, x, hat, q, hat_nb, q_nb, w, gamma, acc, words)` | GossipMixer (CHOCO): when words[0] = words[2] = 0, hat += q, hat_nb += q_nb, then x = float(x + gamma sum_k w[k] (hat_nb[k] - hat)) in double |
//! | `cast_encode<Cast>(e, g, r, codes, cand)` | CastAllreduce: a = g + r (g when r is empty); codes[i] = Cast::to_code(a), cand[i] = a - from_code(codes[i]) (cand may be empty); a non-finite a sends the NaN code 0x7FFF and keeps r[i] (kernels/host/cast.hpp) |
//! | `cast_add<Cast>(e, in, mine)` | CastAllreduce's ring combine of a chunk: mine[i] = Cast::add(in[i], mine[i]) |
//! | `cast_decode_mean<Cast>(e, sums, out, P, status)` | when every sums[i] is a finite code: out[i] = mean_of(from_code(sums[i]), P); else status \|= nonfinite and out is untouched |
//! | `oktopk_local(e, acc, k, status, idx, val, ws)` | OkTopK: topk_abs(acc, k, idx, val) unless status shows a non-finite acc (kernels/host/oktopk.hpp, like every oktopk_ row) |
//! | `oktopk_begin(e, block, n, k, idx, val, status)` | SparseReduceScatter's block path: idx/val = the entries of the sparse_wire frame in block (n and k single values, no mask), the other slots index INT32_MAX and value 0; a flagged frame sets status_nonfinite (flag_nonfinite) or status_rejected, a malformed one status_rejected, idx/val untouched |
//! | `oktopk_frames(e, idx, val, bounds, status, flags, n, k, step, hdr, pay)` | OkTopK: the reduce-scatter frame of every region: 40-byte header (magic, flags \| 1 when status holds nonfinite \| 2 when it holds rejected, count, n, k, step) and count indices then values; frames flagged by bit 0 or 1 are empty (bit 2, an estimation step, is only carried) |
//! | `oktopk_region_sum(e, hdr_out, pay_out, hdr_in, pay_in, me, lo, hi, reg, touched, status)` | OkTopK: checks the peers' entries (else status \|= wire), then reg = the region's sums in rank order, touched where sent |
//! | `oktopk_mags(e, reg, touched, mags, ws)` | OkTopK: the mags.size() largest \|sum\| of the region, descending, zero-padded |
//! | `oktopk_theta(e, all, k, me, theta, limit)` | OkTopK: from P descending blocks of k (every region's k largest \|sum\|): theta[0] = T, the k-th largest of all; limit[0] = region me's count of the global top-k: its values > T and its share of the ties at T (regions in order) |
//! | `oktopk_select(e, reg, touched, theta, limit, lo, me, block, ws)` | OkTopK: this region's allgather block: nonzero sums with \|sum\| >= theta, at most min(cap, limit[0]) (the largest, ties to the smaller index), ascending |
//! | `oktopk_output(e, blocks, bounds, me, grad, status)` | OkTopK: checks the other blocks' indices (else status \|= wire, grad untouched); a non-finite sum in any block, its own included: status \|= nonfinite, grad untouched; else grad = 0 except mean_of(sum, P) at every selected index |
//! | `oktopk_clear_selected(e, acc, idx, blocks, bounds, status, next)` | OkTopK: acc[idx[e]] = 0 where idx[e] was selected; next = the regions rebalanced by the selection |
//! | `linear_encode(e, codec, acc, block, status)` | LinearCompressor: block[0, m) = A acc (the LinearCodec's compress) and block[m] = 0; when status holds nonfinite, block = 0 and block[m] = 1 |
//! | `linear_decode(e, codec, block, out, P, status)` | Allreduce<C>: when block[m] = 0, block[j] = mean_of(block[j], P) for j < m, and when every such mean is finite, out = B block[0, m) (zeroed first); else status \|= nonfinite, out untouched |
//! | `linear_feedback(e, codec, acc, approx, dense)` | LinearCompressor: acc -= B A acc (the delivered indices zeroed, or through approx (m) and dense (n)) |
//! | `signum_update(e, next, m, g, beta, status)` | MajorityVote: next = beta m + (1 - beta) g (g when m is empty); status \|= nonfinite when a value is not finite |
//! | `sign_vote(e, blocks, block_floats, scaled, out, status)` | Vote<C>: every block's sign payload checked (else status \|= wire, out untouched), then out[i] = s sign(sum_r sign_r[i]), s the mean scale or 1 (kernels/host/linear_vote.hpp) |
//! | `power_gossip_orthonormalize(e, s, len, r, seed, t, step)` | PowerGossip: orthonormalize(s, len, r); while a column stays zero (at most twice, attempt a = 0, 1), every zero column c = gaussian(mix_seed(seed, t, step, c + 1 + a r)) and orthonormalize again (kernels/host/power_gossip.hpp) |
//! | `power_gossip_update(e, X, n, m, S, mine, theirs, d, r, phase, lower, coef, upd, words)` | PowerGossip: when words[0] = words[2] = 0, d = q_high - q_low (mine is q_low when lower; theirs: bytes of floats), upd = S d^T (phase 0) or d S^T (phase 1) in lowrank.hpp's order, X += coef upd in float |
//! | `power_gossip_vectors(e, x, recv, stride, offset, w, w_self, acc, words)` | PowerGossip: when words[0] = words[2] = 0, x = float(w_self x + sum_k w[k] x_k) in double (acc), x_k the floats at byte offset of recv's k-th block of stride bytes, k ascending |
//! | `tree_begin(e, m, block, self, b)` | TreeMerge: starts the tree merge from this rank's block (a sparse_wire frame): the state tree_local leaves; a malformed block sets status_wire with wire_peer = self (kernels/host/tree_block.hpp) |
//! | `tree_status(e, m, status)` | TreeMerge: status \|= wire (malformed frame), nonfinite (flagged or non-finite sum), rejected (a rank rejected its input, or n or k differ): 0 exactly when tree_scatter wrote |
//! | `codec_encode_frame<Codec>(e, ws, codec, acc, block, h, approx, status)` | CodecCompressor, MajorityVote: h.payload = 0, h.flags \|= nonfinite_input when status holds nonfinite; when h.flags is 0, the codec encodes acc into block's payload (after the 48-byte header, wire/codec_frame.hpp; approx as the codec's encode) and h.payload = its length (above the block: an error); the rest of the payload is zeroed and h written as block's header. The length stays in the space |
//! | `codec_decode_sum<Codec>(e, codec, blocks, block_floats, sum, status = {})` | Allgather<C>: sum = 0, then decode_add of each block's payload in rank order (the headers were checked by the caller); a malformed payload sets status_wire and a NaN in sum[0] (a call without a status word gets the decoder's wire_error) |
//! | `codec_clear_delivered<Codec>(e, ws, codec, r, u)` | CodecCompressor: a sparse codec's delivered indices (those of the last codec_encode_frame with ws) leave the residual r (and velocity u) |
//! | `choco_encode<Codec>(e, ws, codec, x, hat, diff, msg, q, words, framed)` | GossipMixer (CHOCO): when words[0] is 0: diff = x - hat; the codec encodes diff into msg (after a u32 length when framed) and writes q (what the receivers decode); unframed, a length other than msg.size() sets words[0] = flag_short (2). The rest of msg is zeroed (all of it when words[0] is not 0) (kernels/host/choco.hpp) |
//! | `choco_decode<Codec>(e, ws, codec, recv, msg_bytes, framed, q_nb, words, why)` | GossipMixer (CHOCO): when words[0] = words[2] = 0: q_nb[k] = 0, then decode_add of neighbour k's message (the k-th msg_bytes of recv), k ascending; a malformed one sets words[2] = 1 + k and why = a sentence naming the codec (host memory, read after the fence) |
//!
//! The codec rows take the codec as a template argument, as linear_encode takes a
//! LinearCodec and cast_encode a Cast. Their state is the caller's: ws is a
//! `typename ops<Space>::template codec_workspace<Codec>` (codec rows) or
//! `choco_workspace<Codec>` (CHOCO's rows), owned by the compressor or mixer: empty on
//! the host spaces; on cuda_space the codec's device_codec<Codec> (kernels/device_codec.hpp,
//! the customisation point a codec's device kernels specialise), plus CHOCO's staging
//! blocks in choco_workspace.
//!
//! Models: ops<host_space> (kernels/host/ops.hpp) runs the host kernels at once;
//! ops<deferred_space> (kernels/deferred/ops.hpp) queues the same host kernels until the
//! fence (each row one deferred_row call); ops<cuda_space> (kernels/cuda/ops.cuh)
//! implements each row with CUB/cuBLAS and the codecs' device_codec.

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
