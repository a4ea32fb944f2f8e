# commpact's optional components. Each call creates the imported target
# commpact::<name> (once) and sets commpact_<name>_FOUND.
#   mpi  -> links MPI::MPI_CXX, defines COMMPACT_HAS_MPI=1   (MpiComm)
#   cuda -> links CUDA::cudart and CUDA::cublas, defines COMMPACT_HAS_CUDA=1
#   nccl -> cuda + libnccl, defines COMMPACT_HAS_NCCL=1
function(commpact_add_component comp)
  if(TARGET commpact::${comp})
    set(commpact_${comp}_FOUND TRUE PARENT_SCOPE)
    return()
  endif()
  set(found FALSE)
  if(comp STREQUAL "mpi")
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
        find_library(COMMPACT_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib)
        find_path(COMMPACT_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
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
    message(WARNING "commpact: unknown component '${comp}' (known: mpi, cuda, nccl)")
  endif()
  set(commpact_${comp}_FOUND ${found} PARENT_SCOPE)
endfunction()
