// link_device(): the process-wide engine behind device_link.h.
//
// The engine is built on first use from client_config() and never destroyed: the hooks keep the
// DeviceLinks it hands out in static storage, and static destructors run in an order nobody
// controls. At exit (process_events.h: the link's stage comes first, and the one atexit is
// registered after the hooks' agents were constructed, so it runs before their destructors) the
// engine stops: every gate opens and no agent call starts afterwards, so a
// CUDA call made while the process tears down never waits for a scheduler.
#include <new>

#include "client/config.h"
#include "client/device_link.h"
#include "client/link/link_engine.h"
#include "client/process_events.h"
#include "common/log.h"

namespace nvshare::client {
namespace {

// How long exit waits for the engine's thread to finish an agent call in progress.
constexpr Duration kExitWait = std::chrono::milliseconds(200);

LinkEngine* g_engine = nullptr;

void stop_at_exit() {
  if (g_engine != nullptr) g_engine->stop(kExitWait);
}

LinkEngine& process_engine() {
  static LinkEngine* engine = [] {
    auto* created = new LinkEngine(LinkOptions::from_config(client_config()));
    g_engine = created;
    on_exit(ProcessStage::kLink, &stop_at_exit);
    return created;
  }();
  return *engine;
}

}  // namespace

DeviceLink& link_device(const DeviceIdentity& identity, DeviceAgent& agent) {
  static PassThroughLink pass_through;
  try {
    if (!client_config().enabled) return pass_through;
    return process_engine().device(identity, agent);
  } catch (...) {
    // Out of memory while registering: this GPU runs unscheduled rather than failing the call.
    NVSHARE_WARN("cannot link %s to the scheduler; running unscheduled", identity.gpu_uuid.c_str());
    return pass_through;
  }
}

}  // namespace nvshare::client
