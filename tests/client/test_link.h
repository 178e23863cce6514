// The link used by client_unit_test in place of the scheduler-facing half: link_device() hands out
// a TestLink that counts submissions and usage reports and remembers each GPU's agent, so the tests
// can drive the agent the way the link thread would (drain, swap, idle, limits).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "client/device_link.h"

namespace nvshare::client::testing {

struct TestLink final : DeviceLink {
  void before_submit() override { before.fetch_add(1); }
  std::uint64_t after_submit(bool queued) override {
    after.fetch_add(1);
    return queued ? queued_submissions.fetch_add(1) + 1 : 0;
  }
  void usage_changed() override { usage_reports.fetch_add(1); }
  void await_registration() override { registration_waits.fetch_add(1); }

  DeviceIdentity identity;
  DeviceAgent* agent = nullptr;
  std::atomic<std::uint64_t> before{0};
  std::atomic<std::uint64_t> after{0};
  std::atomic<std::uint64_t> queued_submissions{0};
  std::atomic<std::uint64_t> usage_reports{0};
  std::atomic<std::uint64_t> registration_waits{0};
};

// The link of the GPU with this UUID, or null before the library registered it.
TestLink* test_link(const std::string& uuid);

}  // namespace nvshare::client::testing
