# Locates cuda.h from the CUDA toolkit. nvshare compiles against the driver API header and links nothing
# from the toolkit: the simulated driver and the client library provide or find libcuda at run time.
#
# Sets NVSHARE_CUDA_INCLUDE_DIR (empty when no toolkit header is found; the CUDA-facing targets are then
# skipped with a message).
set(NVSHARE_CUDA_INCLUDE_DIR "" CACHE PATH "Directory holding cuda.h (auto-detected when empty)")
if(NOT NVSHARE_CUDA_INCLUDE_DIR)
  find_path(_nvshare_cuda_h cuda.h
            HINTS ENV CUDA_HOME ENV CUDA_PATH
            PATH_SUFFIXES include
            PATHS /usr/local/cuda /usr/local/cuda-13.0 /usr/local/cuda-12 /opt/cuda /usr)
  if(_nvshare_cuda_h)
    set(NVSHARE_CUDA_INCLUDE_DIR "${_nvshare_cuda_h}" CACHE PATH "Directory holding cuda.h" FORCE)
  endif()
endif()
if(NVSHARE_CUDA_INCLUDE_DIR)
  file(STRINGS "${NVSHARE_CUDA_INCLUDE_DIR}/cuda.h" _nvshare_cuda_version_line
       REGEX "^#define CUDA_VERSION [0-9]+")
  string(REGEX REPLACE "^#define CUDA_VERSION ([0-9]+).*" "\\1" NVSHARE_CUDA_HEADER_VERSION
                       "${_nvshare_cuda_version_line}")
  message(STATUS "nvshare: cuda.h ${NVSHARE_CUDA_HEADER_VERSION} in ${NVSHARE_CUDA_INCLUDE_DIR}")
  add_library(nvshare_cuda_headers INTERFACE)
  target_include_directories(nvshare_cuda_headers SYSTEM INTERFACE "${NVSHARE_CUDA_INCLUDE_DIR}")
else()
  message(WARNING "nvshare: cuda.h not found (set NVSHARE_CUDA_INCLUDE_DIR or CUDA_HOME); "
                  "the simulated GPU and the client library are not built")
endif()
