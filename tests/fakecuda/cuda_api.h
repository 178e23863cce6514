// The one way the fake driver includes cuda.h: with __CUDA_API_VERSION_INTERNAL defined, as the
// real driver is built, so that every exported name is declared with its exact signature: the
// current ones (cuMemAlloc_v2, cuCtxCreate_v4), the older ones the runtime still asks for by
// version (cuCtxCreate_v2, cuMemPrefetchAsync with a CUdevice) and the per-thread-stream forms
// (_ptsz, _ptds).
//
// Under this define the unversioned macro names (cuMemAlloc, cuCtxCreate) mean the oldest forms, so
// the fake's sources always spell out the versioned name they implement.
#pragma once

#ifndef __CUDA_API_VERSION_INTERNAL
#define __CUDA_API_VERSION_INTERNAL 1
#endif
#include <cuda.h>

#if CUDA_VERSION < 12000
#error "fakecuda implements the CUDA 12+ driver API: point NVSHARE_CUDA_INCLUDE_DIR at it"
#endif
