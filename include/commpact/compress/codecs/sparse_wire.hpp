// SPDX-License-Identifier: Apache-2.0
#pragma once
//! \file sparse_wire.hpp
//! The include path docs/gtopk.md names for the sparse wire format; the format itself is
//! wire/sparse_frame.hpp (below the kernels, which read and write it).

#include "../../wire/sparse_frame.hpp"
