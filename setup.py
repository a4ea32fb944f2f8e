# SPDX-License-Identifier: Apache-2.0
"""pip install --no-build-isolation .

Builds and installs commpact_hooks (python/commpact_hooks.cpp: commpact's DDP
communication hooks and model averager) the way PyTorch extensions are built, with
torch.utils.cpp_extension, against the torch that runs pip (hence no build isolation:
the extension must match that torch exactly, and pip stays offline).

- CPU variant: always (Gloo, CPU buckets).
- CUDA variant (python/commpact_hooks_cuda.cu, nvcc): added when that torch was built
  with CUDA (torch.version.cuda) and a CUDA toolkit is found (CUDA_HOME); then a CUDA
  bucket runs through commpact's CUDA space on PyTorch's current stream.
  COMMPACT_HOOKS_CUDA=0 builds the CPU variant only, =1 requires the CUDA one.
- COMMPACT_HOOKS_ARCH (e.g. "9.0"): the GPU architectures of the CUDA variant
  (TORCH_CUDA_ARCH_LIST, which PyTorch's tooling reads, when that is unset).
- COMMPACT_HOOKS_BUILD_DIR: where the intermediate files go (default build-pip/ here).
"""
import os
import sys

def sees_system_site_packages():
    """Whether this virtual environment's pyvenv.cfg includes the system's site packages
    (read as site.py reads it)."""
    try:
        with open(os.path.join(sys.prefix, "pyvenv.cfg")) as f:
            for line in f:
                key, _, value = line.partition("=")
                if key.strip().lower() == "include-system-site-packages":
                    return value.strip().lower() == "true"
    except OSError:
        pass
    return False


try:
    import torch
except ImportError as e:
    if not (isinstance(e, ModuleNotFoundError) and e.name == "torch"):  # torch is there but broken
        sys.exit(f"commpact_hooks: torch is installed but importing it failed: {e}")
    advice = "install PyTorch first (Debian: python3-torch) and run pip with --no-build-isolation, so that the build sees it."
    if sys.prefix != sys.base_prefix and not sees_system_site_packages():
        advice = ("this is a virtual environment (" + sys.prefix + ") without the system's site packages, so "
                  "it cannot see a torch installed outside it (Debian's python3-torch): install torch into "
                  "it, or make it with `python3 -m venv --system-site-packages`; then run pip with "
                  "--no-build-isolation.")
    sys.exit("commpact_hooks: torch is not importable by " + sys.executable + "; " + advice)
try:
    from torch.utils import cpp_extension  # imports setuptools too
except ImportError as e:
    sys.exit(f"commpact_hooks: torch.utils.cpp_extension cannot be imported ({e}); it needs setuptools "
             "(Debian: python3-setuptools), and pip needs --no-build-isolation to see it.")

from setuptools import setup

here = os.path.dirname(os.path.abspath(__file__))
os.chdir(here)  # setuptools wants the source paths relative to this file

want_cuda = os.environ.get("COMMPACT_HOOKS_CUDA", "auto")
has_cuda = bool(torch.version.cuda) and cpp_extension.CUDA_HOME is not None
if want_cuda == "1" and not has_cuda:
    sys.exit(f"commpact_hooks: COMMPACT_HOOKS_CUDA=1 but torch {torch.__version__} has no CUDA "
             f"(torch.version.cuda={torch.version.cuda}) or no CUDA toolkit was found (CUDA_HOME).")
cuda = has_cuda and want_cuda != "0"
if cuda and os.environ.get("COMMPACT_HOOKS_ARCH") and not os.environ.get("TORCH_CUDA_ARCH_LIST"):
    os.environ["TORCH_CUDA_ARCH_LIST"] = os.environ["COMMPACT_HOOKS_ARCH"]

# -g0: Python's own CFLAGS carry -g, which triples the object and slows the build.
cxx = ["-std=c++20", "-O2", "-g0", "-Wno-unused-parameter"]
defines = []
sources = ["python/commpact_hooks.cpp"]
try:  # PyTorch 2.x: library_paths(device_type=...); 1.13: library_paths(cuda=...)
    libdirs = cpp_extension.library_paths(device_type="cuda" if cuda else "cpu")
except TypeError:
    libdirs = cpp_extension.library_paths(cuda=cuda)
# The torch libraries are found at run time without `import torch` first (a pip torch
# keeps them in site-packages/torch/lib, outside the loader's path).
link = [f"-Wl,-rpath,{d}" for d in libdirs]
# Whatever a static archive brings into the module stays private to it: where the
# toolchain links a static libstdc++ (seen as libstdc++ symbols exported by the CUDA
# variant's module on the GPU machine, whose error formatting then crashed), exported
# copies would be interposed by the process's shared libstdc++ and mix the two.
link.append("-Wl,--exclude-libs,ALL")
if cuda:
    defines.append(("COMMPACT_HOOKS_CUDA", "1"))
    sources.append("python/commpact_hooks_cuda.cu")
    nvcc = ["-std=c++20", "-O3", "--expt-relaxed-constexpr", "--extended-lambda", "-diag-suppress=1675",
            "-DCOMMPACT_HAS_CUDA=1"]
    ext = cpp_extension.CUDAExtension("commpact_hooks", sources, include_dirs=[os.path.join(here, "include")],
                                      define_macros=defines, extra_compile_args={"cxx": cxx, "nvcc": nvcc},
                                      extra_link_args=link, libraries=["cublas"])
else:
    ext = cpp_extension.CppExtension("commpact_hooks", sources, include_dirs=[os.path.join(here, "include")],
                                     define_macros=defines, extra_compile_args={"cxx": cxx}, extra_link_args=link)

build_dir = os.environ.get("COMMPACT_HOOKS_BUILD_DIR", os.path.join(here, "build-pip"))
os.makedirs(build_dir, exist_ok=True)

setup(
    name="commpact-hooks",
    version="0.1.0",
    description="PyTorch DDP communication hooks (gTop-k, Top-k, PowerSGD) and Local SGD / QSR "
                "model averaging backed by commpact",
    license="Apache-2.0",
    python_requires=">=3.8",
    packages=[],
    ext_modules=[ext],
    cmdclass={"build_ext": cpp_extension.BuildExtension},
    options={"build": {"build_base": build_dir}, "egg_info": {"egg_base": build_dir}},
    zip_safe=False,
)
