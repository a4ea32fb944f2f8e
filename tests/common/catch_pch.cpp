// SPDX-License-Identifier: Apache-2.0
// The translation unit that builds the precompiled <catch2/catch.hpp> the Catch2 tests
// reuse (COMMPACT_TEST_PCH, cmake/commpactTesting.cmake). It defines nothing.
