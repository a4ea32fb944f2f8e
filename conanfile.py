"""Conan 2 recipe for commpact (header-only C++20).

    conan create . --build=missing -s compiler.cppstd=20   # package this checkout, then run test_package

Consumers use the project's own installed CMake config, not a CMakeDeps-generated one:
`find_package(commpact CONFIG REQUIRED COMPONENTS mpi)` behaves exactly as with a plain
`cmake --install`. The components `eigen`, `mpi`, `cuda` and `nccl` are found when a
consumer asks for them (MPI, the CUDA toolkit and NCCL come from the system, as nvcc does),
so one file describes them for every way of getting commpact.

No commpact header includes Eigen, so the package does not require it. The option
`with_eigen` (default False) adds the eigen requirement for consumers who ask for the
component `eigen` (commpact::eigen = commpact::commpact + Eigen3::Eigen):

    conan create . --build=missing -s compiler.cppstd=20 -o 'commpact/*:with_eigen=True'
"""
import os
import re

from conan import ConanFile
from conan.errors import ConanInvalidConfiguration
from conan.tools.build import check_min_cppstd
from conan.tools.cmake import CMake, CMakeDeps, CMakeToolchain, cmake_layout
from conan.tools.files import copy, load

required_conan_version = ">=2.0"


class CommpactConan(ConanFile):
    name = "commpact"
    description = ("Header-only C++20 templates for communication-efficient distributed "
                   "deep learning: gTop-k, PowerSGD, PowerGossip, Local SGD/QSR")
    license = "Apache-2.0"
    topics = ("distributed-training", "gradient-compression", "mpi", "header-only")
    package_type = "header-library"
    settings = "os", "arch", "compiler", "build_type"
    options = {"with_eigen": [True, False]}
    default_options = {"with_eigen": False}
    exports_sources = "include/*", "cmake/*", "CMakeLists.txt", "LICENSE"
    no_copy_source = True

    def set_version(self):
        # One version for everything: project(commpact VERSION x.y.z) in CMakeLists.txt.
        text = load(self, os.path.join(self.recipe_folder, "CMakeLists.txt"))
        match = re.search(r"project\(\s*commpact\s+VERSION\s+([0-9]+(?:\.[0-9]+)*)", text)
        if not match:
            raise ConanInvalidConfiguration(
                "conanfile.py: no 'project(commpact VERSION x.y.z' in CMakeLists.txt")
        self.version = match.group(1)

    def layout(self):
        cmake_layout(self)

    def requirements(self):
        # No commpact header includes Eigen (commpact's own tests use it; they are not
        # built here). Eigen is only for consumers of the component `eigen`.
        if self.options.with_eigen:
            self.requires("eigen/[>=3.3 <6]", transitive_headers=True)

    def validate(self):
        # header-library: the settings are the consumer's, so check them when given.
        if self.settings.get_safe("compiler.cppstd"):
            check_min_cppstd(self, 20)

    def package_id(self):
        # Header-only: one package for every setting and for both values of with_eigen
        # (the option changes the requirements, not the files).
        self.info.clear()

    def generate(self):
        tc = CMakeToolchain(self)
        tc.cache_variables["COMMPACT_BUILD_TESTS"] = False
        tc.cache_variables["COMMPACT_BUILD_BENCH"] = False
        tc.cache_variables["COMMPACT_BUILD_EXAMPLES"] = False
        tc.generate()
        CMakeDeps(self).generate()

    def build(self):
        # Nothing to compile: configure only, with tests, benchmarks and examples off.
        cmake = CMake(self)
        cmake.configure()

    def package(self):
        copy(self, "LICENSE", self.source_folder, os.path.join(self.package_folder, "licenses"))
        cmake = CMake(self)
        cmake.install()

    def package_info(self):
        self.cpp_info.bindirs = []
        self.cpp_info.libdirs = []
        # CMake consumers load share/cmake/commpact/commpactConfig.cmake (from builddirs,
        # which CMakeToolchain puts on CMAKE_PREFIX_PATH): it defines commpact::commpact
        # and creates commpact::eigen/mpi/cuda/nccl on request. With with_eigen=True,
        # Eigen3::Eigen comes from the CMakeDeps files of the eigen requirement.
        self.cpp_info.set_property("cmake_find_mode", "none")
        self.cpp_info.set_property("cmake_file_name", "commpact")
        self.cpp_info.set_property("cmake_target_name", "commpact::commpact")
        self.cpp_info.builddirs = [os.path.join("share", "cmake", "commpact")]
        # Other generators (PkgConfigDeps, MSBuildDeps, ...) see the include folder and
        # threads (and Eigen with with_eigen=True).
        if self.settings.os in ("Linux", "FreeBSD"):
            self.cpp_info.system_libs = ["pthread"]
