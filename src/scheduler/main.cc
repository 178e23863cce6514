// nvshare-scheduler: the node's GPU scheduler daemon. See daemon.h for what it does and knobs.h (or
// --help, or docs/configuration.md) for how it is configured.
//
// Exit status: 0 after a clean shutdown (SIGTERM/SIGINT) or --help/--version; 2 for a configuration
// error; 1 when it cannot start or the loop fails.
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>

#include "common/log.h"
#include "scheduler/daemon.h"
#include "scheduler/knobs.h"

#ifndef NVSHARE_VERSION
#define NVSHARE_VERSION "0.0.0"
#endif

namespace {

// Every client session is a descriptor; the default soft limit (often 1024) is too low for a busy
// node, and raising the soft limit up to the hard one needs no privilege.
void raise_descriptor_limit() {
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
    limit.rlim_cur = limit.rlim_max;
    (void)::setrlimit(RLIMIT_NOFILE, &limit);
  }
}

}  // namespace

int main(int argc, char** argv) {
  using namespace nvshare;
  using namespace nvshare::scheduler;

  auto command_line =
      parse_command_line(argc, argv, [](const char* name) { return std::getenv(name); });
  if (!command_line) {
    std::fprintf(stderr, "nvshare-scheduler: %s\n", command_line.error().message.c_str());
    return 2;
  }
  const CommandLine& cl = command_line.value();
  if (cl.help) {
    std::fputs(help_text("nvshare-scheduler").c_str(), stdout);
    return 0;
  }
  if (cl.version) {
    std::printf("nvshare-scheduler %s (protocol %u..%u)\n", NVSHARE_VERSION, protocol::kMinVersion,
                protocol::kMaxVersion);
    return 0;
  }
  if (cl.print_config_doc) {
    std::fputs(config_doc_table().c_str(), stdout);
    return 0;
  }
  if (cl.print_knobs) {
    std::fputs(knobs_json().c_str(), stdout);
    return 0;
  }

  log_init("nvshare-scheduler");
  log_set_level(cl.config.log_level);
  ::signal(SIGPIPE, SIG_IGN);
  raise_descriptor_limit();

  auto daemon = Daemon::create(cl.config, Daemon::Options{});
  if (!daemon) {
    NVSHARE_ERROR("cannot start: %s", daemon.error().message.c_str());
    return 1;
  }
  NVSHARE_INFO("nvshare-scheduler %s started (mode %s, capacity %s, trust client limits %s)",
               NVSHARE_VERSION, std::string(policy::to_string(cl.config.policy.mode)).c_str(),
               cl.config.capacity.to_string().empty() ? "the device's"
                                                      : cl.config.capacity.to_string().c_str(),
               cl.config.trust_client_limits ? "yes" : "no");
  Status ran = daemon.value()->run();
  daemon.value().reset();  // closes connections, removes the socket files
  if (!ran) {
    NVSHARE_ERROR("event loop failed: %s", ran.error().message.c_str());
    return 1;
  }
  NVSHARE_INFO("stopped");
  return 0;
}
