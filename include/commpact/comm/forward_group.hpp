// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file forward_group.hpp
//! The group of point-to-point calls (known_size.hpp: group_begin / group_end, NcclComm's
//! ncclGroupStart / ncclGroupEnd) passed through a decorator to the communicator it wraps,
//! when that one has groups. CheckedComm, CountingComm and TreeComm derive from
//! forwards_p2p_group<Self, C> (CRTP; Self::inner() is the wrapped C).

#include "../concepts.hpp"

namespace commpact::detail {

template <class Self, class C>
class forwards_p2p_group {
 public:
  void group_begin()
    requires req::has_p2p_group<C>
  {
    static_cast<Self&>(*this).inner().group_begin();
  }
  void group_end()
    requires req::has_p2p_group<C>
  {
    static_cast<Self&>(*this).inner().group_end();
  }
};

}  // namespace commpact::detail
