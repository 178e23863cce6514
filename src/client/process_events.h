// The one owner of what the library does when the process forks or exits: every part that keeps
// process state (the device registry and allocation table in cuda/, the link's sessions and
// threads in link/) registers its handlers here, by stage, and this file registers the single
// pthread_atfork and the single atexit, so the order is written down once instead of following
// whichever part happened to register first.
//
// Order
//  - fork, prepare: kLink (takes the link's locks, so the child gets consistent grant states),
//    then kDevices; parent: the reverse; child: kDevices first (a fresh registry, allocation table
//    and hook state, which the link's child handler may rely on), then kLink (sessions dropped,
//    threads gone; the child registers anew on first use).
//  - exit: kLink (stop the link: every gate opens, no agent call starts), then kDevices.
//
// Contract: registering is thread-safe and idempotent per (stage, handlers); handlers run with no
// lock of this file held in the child (the registry of handlers is fixed before any fork it
// serves). Nothing here allocates after the first registration of each stage.
#pragma once

namespace nvshare::client {

enum class ProcessStage : int {
  kLink = 0,
  kDevices = 1,
};

struct ForkHandlers {
  void (*prepare)() = nullptr;
  void (*parent)() = nullptr;
  void (*child)() = nullptr;
};

// Registers the fork handlers of a stage (the first registration of a stage wins).
void on_fork(ProcessStage stage, ForkHandlers handlers);
// Registers the exit handler of a stage (the first registration of a stage wins).
void on_exit(ProcessStage stage, void (*handler)());

}  // namespace nvshare::client
