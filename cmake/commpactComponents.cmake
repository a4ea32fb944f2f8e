# commpact's optional components. Each call creates the imported target
# commpact::<name> (once) and sets commpact_<name>_FOUND.
#   eigen -> links Eigen3::Eigen (3.3 or newer, 5.x accepted). No commpact header
#            includes Eigen and commpact::commpact never links it; the component is
#            for code that wants commpact and Eigen from one target
#   mpi   -> links MPI::MPI_CXX, defines COMMPACT_HAS_MPI=1   (MpiComm)
#   cuda  -> links CUDA::cudart and CUDA::cublas, defines COMMPACT_HAS_CUDA=1
#   nccl  -> cuda + libnccl, defines COMMPACT_HAS_NCCL=1
# A component that is not found leaves its reason in commpact_<name>_REASON.

# Eigen is found unversioned and its version checked here: Eigen 5's version file
# refuses a "3.3" request, and the range "3.3...5" refuses Eigen 3.4.0. Sets
# <out> to TRUE when Eigen3::Eigen exists and is new enough; otherwise FALSE and
# <out>_REASON to a sentence saying what was found and what to do.
function(commpact_find_eigen out)
  set(minimum 3.3)
  if(NOT TARGET Eigen3::Eigen)
    find_package(Eigen3 CONFIG QUIET)
  endif()
  set(version "${Eigen3_VERSION}")
  if(NOT version)
    set(version "${EIGEN3_VERSION_STRING}")
  endif()
  # A second call finds the target made by the first, whose variables are gone.
  if(version)
    set_property(GLOBAL PROPERTY _COMMPACT_EIGEN_VERSION "${version}")
  elseif(TARGET Eigen3::Eigen)
    get_property(version GLOBAL PROPERTY _COMMPACT_EIGEN_VERSION)
  endif()
  if(NOT TARGET Eigen3::Eigen)
    set(${out} FALSE PARENT_SCOPE)
    set(${out}_REASON "Eigen ${minimum} or newer was not found (no Eigen3Config.cmake with the \
target Eigen3::Eigen); install it (Debian: libeigen3-dev; vcpkg: the feature commpact[eigen]; \
Conan: -o 'commpact/*:with_eigen=True') or point Eigen3_DIR at its share/eigen3/cmake folder" PARENT_SCOPE)
  elseif(version AND version VERSION_LESS minimum)
    set(${out} FALSE PARENT_SCOPE)
    set(${out}_REASON "Eigen ${version} was found at '${Eigen3_DIR}', but commpact needs Eigen \
${minimum} or newer (5.x is accepted); install a newer Eigen or point Eigen3_DIR at one" PARENT_SCOPE)
  else()
    set(${out} TRUE PARENT_SCOPE)
    set(${out}_REASON "" PARENT_SCOPE)
  endif()
  set(${out}_VERSION "${version}" PARENT_SCOPE)
endfunction()

function(commpact_add_component comp)
  if(TARGET commpact::${comp})
    set(commpact_${comp}_FOUND TRUE PARENT_SCOPE)
    return()
  endif()
  set(found FALSE)
  set(reason "")
  if(comp STREQUAL "eigen")
    commpact_find_eigen(eigen_ok)
    if(eigen_ok)
      add_library(commpact::eigen INTERFACE IMPORTED GLOBAL)
      set_target_properties(commpact::eigen PROPERTIES
        INTERFACE_LINK_LIBRARIES "commpact::commpact;Eigen3::Eigen")
      set(found TRUE)
    else()
      set(reason "${eigen_ok_REASON}")
    endif()
  elseif(comp STREQUAL "mpi")
    find_package(MPI QUIET COMPONENTS CXX)
    if(MPI_CXX_FOUND)
      add_library(commpact::mpi INTERFACE IMPORTED GLOBAL)
      set_target_properties(commpact::mpi PROPERTIES
        INTERFACE_LINK_LIBRARIES "commpact::commpact;MPI::MPI_CXX"
        INTERFACE_COMPILE_DEFINITIONS "COMMPACT_HAS_MPI=1")
      set(found TRUE)
    endif()
  elseif(comp STREQUAL "cuda" OR comp STREQUAL "nccl")
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND)
      if(NOT TARGET commpact::cuda)
        add_library(commpact::cuda INTERFACE IMPORTED GLOBAL)
        set_target_properties(commpact::cuda PROPERTIES
          INTERFACE_LINK_LIBRARIES "commpact::commpact;CUDA::cudart;CUDA::cublas"
          INTERFACE_COMPILE_DEFINITIONS "COMMPACT_HAS_CUDA=1")
        # The headers use C++20 (std::span, concepts) in device code too.
        # (CMake 3.25 does not know nvcc 13's cuda_std_20 feature, so the flag is given.)
        set_property(TARGET commpact::cuda APPEND PROPERTY INTERFACE_COMPILE_OPTIONS
          "$<$<COMPILE_LANGUAGE:CUDA>:-std=c++20>")
      endif()
      if(comp STREQUAL "cuda")
        set(found TRUE)
      else()
        # NCCL next to the toolkit, under NCCL_ROOT (variable or environment), or in a
        # Python environment's nvidia/nccl package (pip's nvidia-nccl-cu*).
        # Python is asked first, so that pip's folder is a hint like the others, searched
        # before the system's default paths.
        set(_nccl_roots ${NCCL_ROOT} $ENV{NCCL_ROOT} $ENV{NCCL_HOME})
        find_package(Python3 QUIET COMPONENTS Interpreter)
        if(Python3_Interpreter_FOUND)
          execute_process(COMMAND ${Python3_EXECUTABLE} -c
            "import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])"
            OUTPUT_VARIABLE _nccl_py OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
          if(_nccl_py)
            list(APPEND _nccl_roots ${_nccl_py})
          endif()
        endif()
        find_library(COMMPACT_NCCL_LIBRARY NAMES nccl libnccl.so.2
          HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib ${_nccl_roots} PATH_SUFFIXES lib lib64)
        find_path(COMMPACT_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${_nccl_roots} PATH_SUFFIXES include)
        if(COMMPACT_NCCL_LIBRARY AND COMMPACT_NCCL_INCLUDE)
          add_library(commpact::nccl INTERFACE IMPORTED GLOBAL)
          set_target_properties(commpact::nccl PROPERTIES
            INTERFACE_LINK_LIBRARIES "commpact::cuda;${COMMPACT_NCCL_LIBRARY}"
            INTERFACE_INCLUDE_DIRECTORIES "${COMMPACT_NCCL_INCLUDE}"
            INTERFACE_COMPILE_DEFINITIONS "COMMPACT_HAS_NCCL=1")
          set(found TRUE)
        endif()
      endif()
    endif()
  else()
    set(reason "commpact has no component '${comp}' (known: eigen, mpi, cuda, nccl)")
    message(WARNING "commpact: ${reason}")
  endif()
  if(NOT found AND NOT reason)
    if(comp STREQUAL "mpi")
      set(reason "MPI for C++ was not found; install one (Debian: libopenmpi-dev) or set MPI_HOME")
    elseif(NOT CUDAToolkit_FOUND)
      set(reason "the CUDA toolkit was not found; install it or set CUDAToolkit_ROOT")
    else()
      set(reason "libnccl and nccl.h were not found (looked next to the CUDA toolkit, under NCCL_ROOT \
and NCCL_HOME, and in the nvidia.nccl package of pip's nvidia-nccl-cu* where a Python is found); install NCCL, set NCCL_ROOT, \
or set COMMPACT_NCCL_LIBRARY and COMMPACT_NCCL_INCLUDE")
    endif()
  endif()
  set(commpact_${comp}_FOUND ${found} PARENT_SCOPE)
  set(commpact_${comp}_REASON "${reason}" PARENT_SCOPE)
endfunction()
