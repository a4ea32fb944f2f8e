// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file commpact.hpp
//! Umbrella header of the host-only parts of commpact. MPI (comm/mpi_comm.hpp), NCCL
//! and CUDA headers are included separately, with their CMake components.

#include "concepts.hpp"
#include "config.hpp"
#include "error.hpp"
#include "state.hpp"

#include "comm/agree.hpp"
#include "comm/any_comm.hpp"
#include "comm/checked_comm.hpp"
#include "comm/counting_comm.hpp"
#include "comm/deferred_comm.hpp"
#include "comm/guard.hpp"
#include "comm/hierarchical_comm.hpp"
#include "comm/known_size.hpp"
#include "comm/mean_allreduce.hpp"
#include "comm/ring.hpp"
#include "comm/thread_comm.hpp"
#include "comm/tree_comm.hpp"
#include "comm/wire_model.hpp"

#include "topology/complete.hpp"
#include "topology/exponential.hpp"
#include "topology/graph.hpp"
#include "topology/hypercube.hpp"
#include "topology/ring.hpp"
#include "topology/torus.hpp"

#include "compress/aggregations/allgather.hpp"
#include "compress/codecs/casts.hpp"
#include "compress/codecs/per_tensor.hpp"
#include "compress/codecs/quantizers.hpp"
#include "compress/codecs/randomk.hpp"
#include "compress/codecs/sparse_options.hpp"
#include "compress/codecs/sparsifiers.hpp"
#include "compress/codecs/tensor_layout.hpp"
#include "compress/codecs/topk_sign.hpp"
#include "compress/compressors/bucketed.hpp"
#include "compress/compressors/cast_allreduce.hpp"
#include "compress/compressors/codec_compressor.hpp"
#include "compress/compressors/dense.hpp"
#include "compress/compressors/gtopk.hpp"
#include "compress/compressors/linear.hpp"
#include "compress/compressors/majority.hpp"
#include "compress/compressors/oktopk.hpp"
#include "compress/compressors/power.hpp"
#include "compress/compressors/topk.hpp"
#include "compress/error_feedback.hpp"
#include "nonfinite.hpp"
#include "compress/transaction.hpp"

#include "gossip/gossip_mixer.hpp"

#include "kernels/deferred/ops.hpp"
#include "kernels/host/ops.hpp"
#include "ps/parameter_server.hpp"
#include "space/deferred.hpp"
#include "space/host.hpp"

#include "sync/lr_schedule.hpp"
#include "sync/policies.hpp"
#include "sync/schedule.hpp"

#include "train/cost_fit.hpp"
#include "train/cost_model.hpp"
#include "train/data_parallel.hpp"
#include "train/sgd.hpp"

#include "wire/codec_frame.hpp"
#include "wire/sparse_frame.hpp"
