// Exported: modules, functions and kernel launches.
//
// Any module image loads and any function name resolves (when the image is PTX text, only its
// .entry names do). A kernel's simulated duration when alone on the device, in nanoseconds, is its
// first parameter read as a uint64_t: *(uint64_t*)kernelParams[0], or the first 8 bytes of a
// CU_LAUNCH_PARAM_BUFFER_POINTER buffer. A kernel without parameters takes no time. Launches return
// at once; the context's worker runs the kernel on simulated time (work_queue.h).
#include <cstring>

#include "driver.h"

using fakecuda::current_context;
using fakecuda::Driver;
using fakecuda::guarded;
using fakecuda::require_init;

namespace {

constexpr std::size_t kMaxImageText = 64 << 20;
constexpr unsigned kMaxThreadsPerBlock = 1024;

// PTX text or a binary (cubin ELF, fatbin)? Only text is kept, to answer which kernels take params.
std::string ptx_text(const void* image) {
  const auto* bytes = static_cast<const unsigned char*>(image);
  // Byte by byte with short-circuit, so a short text image is never read past its terminator.
  auto starts_with = [bytes](const unsigned char(&magic)[4]) {
    return bytes[0] == magic[0] && bytes[1] == magic[1] && bytes[2] == magic[2] &&
           bytes[3] == magic[3];
  };
  static constexpr unsigned char kElf[] = {0x7f, 'E', 'L', 'F'};
  static constexpr unsigned char kFatbin[] = {0x50, 0xed, 0x55, 0xba};
  if (starts_with(kElf) || starts_with(kFatbin)) return {};
  const char* text = static_cast<const char*>(image);
  std::string_view view(text, strnlen(text, kMaxImageText));
  if (view.find(".entry") == std::string_view::npos) return {};
  return std::string(view);
}

bool is_identifier_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '$';
}

// Looks up `.entry <name>` in PTX. Returns false when absent; *has_params tells whether its
// parameter list declares anything.
bool find_entry(const std::string& ptx, const std::string& name, bool* has_params) {
  std::size_t at = 0;
  while ((at = ptx.find(".entry", at)) != std::string::npos) {
    at += 6;
    std::size_t p = at;
    while (p < ptx.size() && (ptx[p] == ' ' || ptx[p] == '\t' || ptx[p] == '\n' || ptx[p] == '\r'))
      ++p;
    if (ptx.compare(p, name.size(), name) != 0) continue;
    p += name.size();
    if (p < ptx.size() && is_identifier_char(ptx[p])) continue;  // a longer name with this prefix
    while (p < ptx.size() && (ptx[p] == ' ' || ptx[p] == '\t' || ptx[p] == '\n' || ptx[p] == '\r'))
      ++p;
    *has_params = false;
    if (p < ptx.size() && ptx[p] == '(') {
      std::size_t close = ptx.find(')', p);
      *has_params = ptx.substr(p, close == std::string::npos ? std::string::npos : close - p)
                        .find(".param") != std::string::npos;
    }
    return true;
  }
  return false;
}

CUresult load_module(CUmodule* module, const void* image) {
  std::shared_ptr<CUctx_st> ctx;
  if (CUresult rc = current_context(&ctx); rc != CUDA_SUCCESS) return rc;
  if (module == nullptr || image == nullptr) return CUDA_ERROR_INVALID_VALUE;
  auto mod = std::make_shared<CUmod_st>();
  mod->ctx = ctx;
  mod->ptx = ptx_text(image);
  Driver& driver = Driver::instance();
  std::lock_guard lock(driver.mu);
  driver.modules[mod.get()] = mod;
  *module = mod.get();
  return CUDA_SUCCESS;
}

std::uint64_t kernel_duration_ns(const CUfunc_st& function, void** params, void** extra) {
  if (params != nullptr) {
    if (!function.has_params || params[0] == nullptr) return 0;
    std::uint64_t ns = 0;
    std::memcpy(&ns, params[0], sizeof ns);
    return ns;
  }
  if (extra != nullptr) {
    void* buffer = nullptr;
    std::size_t size = 0;
    for (std::size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER) buffer = extra[i + 1];
      if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1] != nullptr) {
        std::memcpy(&size, extra[i + 1], sizeof size);
      }
    }
    if (buffer == nullptr || size < sizeof(std::uint64_t)) return 0;
    std::uint64_t ns = 0;
    std::memcpy(&ns, buffer, sizeof ns);
    return ns;
  }
  return 0;
}

CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                unsigned bz, CUstream stream, void** params, void** extra) {
  if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
  std::shared_ptr<CUfunc_st> function;
  {
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    auto it = driver.functions.find(f);
    if (it == driver.functions.end()) return CUDA_ERROR_INVALID_HANDLE;
    function = it->second;
  }
  if (gx == 0 || gy == 0 || gz == 0 || bx == 0 || by == 0 || bz == 0)
    return CUDA_ERROR_INVALID_VALUE;
  if (static_cast<std::uint64_t>(bx) * by * bz > kMaxThreadsPerBlock)
    return CUDA_ERROR_INVALID_VALUE;
  if (params != nullptr && extra != nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::shared_ptr<CUctx_st> ctx;
  std::shared_ptr<CUstream_st> resolved;
  if (CUresult rc = fakecuda::resolve_stream(stream, &ctx, &resolved); rc != CUDA_SUCCESS)
    return rc;
  fakecuda::Op op;
  op.kind = fakecuda::Op::Kind::kKernel;
  op.kernel_ns = kernel_duration_ns(*function, params, extra);
  // Managed memory of this context left on the host is demand-faulted in when the kernel starts.
  op.prologue = [ctx] { return fakecuda::fault_in_managed(ctx); };
  return fakecuda::submit_to_stream(stream, std::move(op));
}

}  // namespace

extern "C" {

CUresult CUDAAPI cuModuleLoadData(CUmodule* module, const void* image) {
  return guarded([&] { return load_module(module, image); });
}

CUresult CUDAAPI cuModuleLoadDataEx(CUmodule* module, const void* image,
                                    unsigned int /*numOptions*/, CUjit_option* /*options*/,
                                    void** /*optionValues*/) {
  return guarded([&] { return load_module(module, image); });
}

CUresult CUDAAPI cuModuleUnload(CUmodule hmod) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    auto it = driver.modules.find(hmod);
    if (it == driver.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    for (auto& [name, function] : it->second->functions) driver.functions.erase(function.get());
    driver.modules.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuModuleGetFunction(CUfunction* hfunc, CUmodule hmod, const char* name) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (hfunc == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    auto it = driver.modules.find(hmod);
    if (it == driver.modules.end()) return CUDA_ERROR_INVALID_HANDLE;
    CUmod_st& mod = *it->second;
    auto& function = mod.functions[name];
    if (!function) {
      bool has_params = true;
      if (!mod.ptx.empty() && !find_entry(mod.ptx, name, &has_params)) {
        mod.functions.erase(name);
        return CUDA_ERROR_NOT_FOUND;
      }
      function = std::make_shared<CUfunc_st>();
      function->module = &mod;
      function->name = name;
      function->has_params = has_params;
      driver.functions[function.get()] = function;
    }
    *hfunc = function.get();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuFuncGetAttribute(int* pi, CUfunction_attribute attrib, CUfunction hfunc) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (pi == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    if (driver.functions.count(hfunc) == 0) return CUDA_ERROR_INVALID_HANDLE;
    switch (attrib) {
      case CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK:
        *pi = kMaxThreadsPerBlock;
        break;
      case CU_FUNC_ATTRIBUTE_NUM_REGS:
        *pi = 16;
        break;
      case CU_FUNC_ATTRIBUTE_PTX_VERSION:
        *pi = 78;
        break;
      case CU_FUNC_ATTRIBUTE_BINARY_VERSION:
        *pi = 90;
        break;
      case CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES:
        *pi = 49152;
        break;
      case CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT:
        *pi = -1;
        break;
      default:
        *pi = 0;
        break;
    }
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuFuncSetAttribute(CUfunction hfunc, CUfunction_attribute /*attrib*/,
                                    int /*value*/) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    return driver.functions.count(hfunc) == 0 ? CUDA_ERROR_INVALID_HANDLE : CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction hfunc) {
  return guarded([&] {
    if (CUresult rc = require_init(); rc != CUDA_SUCCESS) return rc;
    if (name == nullptr) return CUDA_ERROR_INVALID_VALUE;
    Driver& driver = Driver::instance();
    std::lock_guard lock(driver.mu);
    auto it = driver.functions.find(hfunc);
    if (it == driver.functions.end()) return CUDA_ERROR_INVALID_HANDLE;
    *name = it->second->name.c_str();
    return CUDA_SUCCESS;
  });
}

CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                unsigned int gridDimZ, unsigned int blockDimX,
                                unsigned int blockDimY, unsigned int blockDimZ,
                                unsigned int /*sharedMemBytes*/, CUstream hStream,
                                void** kernelParams, void** extra) {
  return guarded([&] {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, extra);
  });
}

CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned int gridDimX, unsigned int gridDimY,
                                     unsigned int gridDimZ, unsigned int blockDimX,
                                     unsigned int blockDimY, unsigned int blockDimZ,
                                     unsigned int /*sharedMemBytes*/, CUstream hStream,
                                     void** kernelParams, void** extra) {
  return guarded([&] {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, extra);
  });
}

CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f, void** kernelParams,
                                  void** extra) {
  return guarded([&] {
    if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                  config->blockDimY, config->blockDimZ, config->hStream, kernelParams, extra);
  });
}

CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                       void** kernelParams, void** extra) {
  return guarded([&] {
    if (config == nullptr) return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                  config->blockDimY, config->blockDimZ, config->hStream, kernelParams, extra);
  });
}

CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned int gridDimX,
                                           unsigned int gridDimY, unsigned int gridDimZ,
                                           unsigned int blockDimX, unsigned int blockDimY,
                                           unsigned int blockDimZ, unsigned int /*sharedMemBytes*/,
                                           CUstream hStream, void** kernelParams) {
  return guarded([&] {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, nullptr);
  });
}

CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned int gridDimX,
                                                unsigned int gridDimY, unsigned int gridDimZ,
                                                unsigned int blockDimX, unsigned int blockDimY,
                                                unsigned int blockDimZ,
                                                unsigned int /*sharedMemBytes*/, CUstream hStream,
                                                void** kernelParams) {
  return guarded([&] {
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, nullptr);
  });
}

}  // extern "C"
