// The one way the client library includes cuda.h: with __CUDA_API_VERSION_INTERNAL defined (as the
// driver itself is built), so that every exported name is declared with its exact signature: the
// current forms (cuMemAlloc_v2, cuCtxCreate_v4), the older ones runtimes still ask for by version
// (cuCtxCreate_v2, cuDevicePrimaryCtxRelease) and the per-thread-stream forms (_ptsz, _ptds). Under
// this define the unversioned macro names (cuMemAlloc, cuCtxCreate) are gone, so the library always
// spells out the versioned name it means.
//
// The library only compiles against the header: it links nothing from the CUDA toolkit and finds
// libcuda.so.1 at run time (hook_table.h).
#pragma once

#if defined(CUDA_VERSION) && !defined(__CUDA_API_VERSION_INTERNAL)
#error "cuda.h was included before client/hooks/cuda_api.h: include this header first"
#endif
#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>

#include "client/hooks/nvml_api.h"

#if CUDA_VERSION < 12000
#error "libnvshare.so needs the CUDA 12+ cuda.h: point NVSHARE_CUDA_INCLUDE_DIR at it"
#endif
