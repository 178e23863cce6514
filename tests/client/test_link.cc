#include "test_link.h"

#include <map>
#include <memory>
#include <mutex>

namespace nvshare::client {
namespace {

std::mutex g_mu;
std::map<std::string, std::unique_ptr<testing::TestLink>>& links() {
  static auto* map = new std::map<std::string, std::unique_ptr<testing::TestLink>>();
  return *map;
}

}  // namespace

DeviceLink& link_device(const DeviceIdentity& identity, DeviceAgent& agent) {
  std::lock_guard lock(g_mu);
  auto& link = links()[identity.gpu_uuid];
  if (!link) {
    link = std::make_unique<testing::TestLink>();
    link->identity = identity;
  }
  link->agent = &agent;
  return *link;
}

testing::TestLink* testing::test_link(const std::string& uuid) {
  std::lock_guard lock(g_mu);
  auto it = links().find(uuid);
  return it == links().end() ? nullptr : it->second.get();
}

}  // namespace nvshare::client
