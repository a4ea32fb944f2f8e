// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file concepts.hpp
//! The concepts of commpact, one file each under concepts/: the design card's four
//! (Communicator, Topology, Compressor, SyncPolicy), the Codec and Aggregation a
//! compressor is made of, the TreeSchedule of gTop-k's merge, and the Space where data
//! lives and work runs (v3).
//!
//! Each concept is built from small named requirements. Each has a `diagnose_*`
//! helper whose static_assert chain says, in one sentence, which requirement a type
//! misses; class templates call it so that a bad type fails with that sentence rather
//! than a page of template errors:
//!
//! <!-- snippet: namespace -->
//! \code
//! template <class C> class MyAlgorithm {
//!   static_assert(commpact::diagnose_point_to_point<C>());
//! };
//! \endcode

#include "concepts/aggregation.hpp"
#include "concepts/codec.hpp"
#include "concepts/communicator.hpp"
#include "concepts/compressor.hpp"
#include "concepts/space.hpp"
#include "concepts/sync_policy.hpp"
#include "concepts/topology.hpp"
#include "concepts/tree_schedule.hpp"
