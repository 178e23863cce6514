// Exported: cuGetProcAddress (CUDA 11.3) and cuGetProcAddress_v2 (CUDA 12). Both answer from
// procaddress_table.def: the newest form of the base name whose version is at most the requested
// one, the per-thread-stream form when CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM is set and one
// exists. Both work before cuInit, as in the real driver (the runtime resolves cuInit itself
// through them).
#include <cstring>

#include "cuda_api.h"

namespace {

struct ProcEntry {
  const char* base;
  int version;
  bool per_thread;
  void* function;
};

#define FAKECUDA_SYMBOL(base, version, per_thread, symbol) \
  {#base, version, per_thread != 0, reinterpret_cast<void*>(&symbol)},
const ProcEntry kEntries[] = {
#include "procaddress_table.def"
};
#undef FAKECUDA_SYMBOL

CUresult lookup(const char* symbol, void** pfn, int cuda_version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  if (pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  auto report = [status](CUdriverProcAddressQueryResult value) {
    if (status != nullptr) *status = value;
  };
  if (symbol == nullptr) {
    report(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_ERROR_INVALID_VALUE;
  }
  const bool want_per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  const ProcEntry* best = nullptr;
  const ProcEntry* best_per_thread = nullptr;
  bool known = false;
  for (const ProcEntry& e : kEntries) {
    if (std::strcmp(e.base, symbol) != 0) continue;
    known = true;
    if (e.version > cuda_version) continue;
    const ProcEntry*& slot = e.per_thread ? best_per_thread : best;
    if (slot == nullptr || e.version > slot->version) slot = &e;
  }
  // Calls without a stream have no per-thread form: the default one serves both modes.
  const ProcEntry* chosen = want_per_thread && best_per_thread != nullptr ? best_per_thread : best;
  if (chosen == nullptr) {
    report(known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT
                 : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = chosen->function;
  report(CU_GET_PROC_ADDRESS_SUCCESS);
  return CUDA_SUCCESS;
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int cudaVersion,
                                     cuuint64_t flags,
                                     CUdriverProcAddressQueryResult* symbolStatus) {
  return lookup(symbol, pfn, cudaVersion, flags, symbolStatus);
}

CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int cudaVersion,
                                  cuuint64_t flags) {
  return lookup(symbol, pfn, cudaVersion, flags, nullptr);
}

}  // extern "C"
