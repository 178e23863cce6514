// Declarations of the hand-written hook behaviours: hooks::impl::<name> for every NVSHARE_HOOK and
// NVSHARE_NVML row of hook_list.def, with the row's exact parameters. The exported wrappers
// (exports.cc) call them inside guarded(); they are defined by family in src/client/cuda/*_hooks.cc
// and src/client/entry/procaddress.cc.
#pragma once

#include "client/hooks/cuda_api.h"

namespace nvshare::client::hooks::impl {

#define NVSHARE_HOOK(family, name, base, version, per_thread, params, args) CUresult name params;
#define NVSHARE_SUBMIT(...)
#define NVSHARE_NVML(name, params, args) nvmlReturn_t name params;
#include "client/hooks/hook_list.def"
#undef NVSHARE_HOOK
#undef NVSHARE_SUBMIT
#undef NVSHARE_NVML

}  // namespace nvshare::client::hooks::impl
