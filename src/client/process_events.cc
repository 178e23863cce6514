#include "client/process_events.h"

#include <pthread.h>

#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>

namespace nvshare::client {
namespace {

constexpr std::size_t kStages = 2;

// Plain function pointers in static storage: readable in a forked child whatever the parent did.
std::array<std::atomic<void (*)()>, kStages> g_prepare{};
std::array<std::atomic<void (*)()>, kStages> g_parent{};
std::array<std::atomic<void (*)()>, kStages> g_child{};
std::array<std::atomic<void (*)()>, kStages> g_exit{};

void run(std::array<std::atomic<void (*)()>, kStages>& handlers, bool forward) {
  for (std::size_t i = 0; i < kStages; ++i) {
    void (*handler)() = handlers[forward ? i : kStages - 1 - i].load(std::memory_order_acquire);
    if (handler != nullptr) handler();
  }
}

void prepare() { run(g_prepare, /*forward=*/true); }
void parent() { run(g_parent, /*forward=*/false); }
// The child's order is the devices' first: see process_events.h.
void child() { run(g_child, /*forward=*/false); }
void at_exit() { run(g_exit, /*forward=*/true); }

void set_once(std::atomic<void (*)()>& slot, void (*handler)()) {
  void (*expected)() = nullptr;
  if (handler != nullptr)
    slot.compare_exchange_strong(expected, handler, std::memory_order_acq_rel);
}

}  // namespace

void on_fork(ProcessStage stage, ForkHandlers handlers) {
  static std::once_flag registered;
  const auto i = static_cast<std::size_t>(stage);
  set_once(g_prepare[i], handlers.prepare);
  set_once(g_parent[i], handlers.parent);
  set_once(g_child[i], handlers.child);
  std::call_once(registered, [] { ::pthread_atfork(&prepare, &parent, &child); });
}

void on_exit(ProcessStage stage, void (*handler)()) {
  static std::once_flag registered;
  set_once(g_exit[static_cast<std::size_t>(stage)], handler);
  std::call_once(registered, [] { std::atexit(&at_exit); });
}

}  // namespace nvshare::client
