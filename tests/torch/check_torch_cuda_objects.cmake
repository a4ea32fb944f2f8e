# Compiles the CUDA variant of commpact_hooks to objects, without a GPU and without a
# CUDA PyTorch (linking needs one): python/commpact_hooks_cuda.cu with nvcc (TorchCudaComm
# and every hook's compressor in the CUDA space), and python/commpact_hooks.cpp with
# COMMPACT_HOOKS_CUDA by the host compiler against LibTorch's headers (c10/cuda, the
# caching allocator, make_torch_group_link over c10d), as setup.py's CUDA variant does.
# Fails when either does not compile, or when the two objects do not fit: the .cpp
# object must call the CUDA side's functions (nm: undefined there) that the .cu object
# defines.
#   cmake -DROOT=<source dir> -DWORK_DIR=<dir> -DNVCC=<nvcc> -DCXX=<c++> -DNM=<nm>
#         -DINCLUDES=<dir|dir|...> -P check_torch_cuda_objects.cmake
# INCLUDES: LibTorch's, Python's, pybind11's and the CUDA toolkit's include folders,
# separated by '|'.
foreach(v ROOT WORK_DIR NVCC CXX NM INCLUDES)
  if(NOT ${v})
    message(FATAL_ERROR "check_torch_cuda_objects: -D${v}= is required")
  endif()
endforeach()
file(REMOVE_RECURSE ${WORK_DIR})
file(MAKE_DIRECTORY ${WORK_DIR})
string(REPLACE "|" ";" dirs "${INCLUDES}")
set(inc -I${ROOT}/include -I${ROOT}/python)
foreach(d IN LISTS dirs)
  list(APPEND inc -I${d})
endforeach()
# Debian's LibTorch is a CPU build: it ships c10/cuda without the generated
# cuda_cmake_macros.h, which only defines an export macro for Windows.
set(defs -DCOMMPACT_HOOKS_CUDA=1 -DC10_CUDA_NO_CMAKE_CONFIGURE_FILE -DTORCH_EXTENSION_NAME=commpact_hooks
    -DTORCH_API_INCLUDE_EXTENSION_H -D_GLIBCXX_USE_CXX11_ABI=1)

set(cu_obj ${WORK_DIR}/commpact_hooks_cuda.o)
set(cpp_obj ${WORK_DIR}/commpact_hooks.o)
# -O0 for the host and ptxas: the point is that it compiles, at half the time.
execute_process(
  COMMAND ${NVCC} -std=c++20 -O0 -Xptxas=-O0 -arch=sm_90 --expt-relaxed-constexpr --extended-lambda
          -diag-suppress=1675 -DCOMMPACT_HAS_CUDA=1 -I${ROOT}/include -c ${ROOT}/python/commpact_hooks_cuda.cu
          -o ${cu_obj}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_torch_cuda_objects: nvcc failed on python/commpact_hooks_cuda.cu (${rc}):\n${out}")
endif()
execute_process(
  COMMAND ${CXX} -std=c++20 -O0 -g0 -fPIC -Wall -Wextra -Wno-unused-parameter -Werror ${defs} ${inc}
          -c ${ROOT}/python/commpact_hooks.cpp -o ${cpp_obj}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "check_torch_cuda_objects: ${CXX} failed on python/commpact_hooks.cpp with "
    "COMMPACT_HOOKS_CUDA (${rc}), include folders ${inc}:\n${out}")
endif()

# The C++ side calls what the CUDA side defines.
function(symbols obj kind out_var)
  execute_process(COMMAND ${NM} -C ${kind} ${obj} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "check_torch_cuda_objects: nm failed on ${obj}: ${err}")
  endif()
  set(${out_var} "${out}" PARENT_SCOPE)
endfunction()
symbols(${cpp_obj} --undefined-only needed)
symbols(${cu_obj} --defined-only defined)
set(missing "")
foreach(f "commpact_hooks_cuda::state::state(" "commpact_hooks_cuda::state::reduce(" "commpact_hooks_cuda::state::reduce_dense("
          "commpact_hooks_cuda::state::power_prepare(" "commpact_hooks_cuda::state::set_q_factor(")
  string(FIND "${needed}" "${f}" n)
  string(FIND "${defined}" "${f}" d)
  if(n EQUAL -1)
    list(APPEND missing "${f} (not called by commpact_hooks.o)")
  endif()
  if(d EQUAL -1)
    list(APPEND missing "${f} (not defined by commpact_hooks_cuda.o)")
  endif()
endforeach()
if(missing)
  string(REPLACE ";" "\n  " missing "${missing}")
  message(FATAL_ERROR "check_torch_cuda_objects: the two objects do not fit:\n  ${missing}")
endif()
message(STATUS "check_torch_cuda_objects: both objects compiled and fit (${cu_obj}, ${cpp_obj})")
