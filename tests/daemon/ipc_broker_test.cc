// IpcBroker: who may map whose memory, and how long an export lives.
#include "scheduler/ipc_broker.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

namespace nvshare::scheduler {
namespace {

ClientIdentity process(pid_t pid, uid_t uid, std::optional<std::string> pod) {
  ClientIdentity id;
  id.pid = pid;
  id.uid = uid;
  id.start_time = 1000 + static_cast<std::uint64_t>(pid);
  id.pod_uid = std::move(pod);
  return id;
}

UniqueFd some_descriptor() { return UniqueFd(::dup(STDERR_FILENO)); }

ino_t inode_of(int fd) {
  struct stat st {};
  ::fstat(fd, &st);
  return st.st_ino;
}

TEST(IpcSharing, SamePodOrSameUidOutsidePods) {
  EXPECT_TRUE(may_share_memory(process(1, 1000, "pod-a"), process(2, 2000, "pod-a")));
  EXPECT_FALSE(may_share_memory(process(1, 1000, "pod-a"), process(2, 1000, "pod-b")));
  EXPECT_FALSE(may_share_memory(process(1, 1000, "pod-a"), process(2, 1000, std::nullopt)));
  EXPECT_FALSE(may_share_memory(process(1, 1000, std::nullopt), process(2, 1000, "pod-a")));
  EXPECT_TRUE(may_share_memory(process(1, 1000, std::nullopt), process(2, 1000, std::nullopt)));
  EXPECT_FALSE(may_share_memory(process(1, 1000, std::nullopt), process(2, 0, std::nullopt)));
}

TEST(IpcBroker, AClaimGetsADuplicateOfTheExportersDescriptor) {
  IpcBroker broker(4, 16);
  UniqueFd fd = some_descriptor();
  const ino_t inode = inode_of(fd.get());
  auto token = broker.offer(process(1, 1000, "pod-a"), std::move(fd), 64 << 20);
  ASSERT_TRUE(token.ok());
  EXPECT_NE(token.value(), 0u);
  auto claimed = broker.claim(process(2, 1000, "pod-a"), token.value());
  ASSERT_TRUE(claimed.ok()) << claimed.error().message;
  EXPECT_EQ(claimed.value().bytes, std::uint64_t{64} << 20);
  EXPECT_EQ(inode_of(claimed.value().fd.get()), inode);
  // A claim leaves the export in place for the next importer.
  EXPECT_TRUE(broker.claim(process(3, 1000, "pod-a"), token.value()).ok());
  EXPECT_EQ(broker.size(), 1u);
}

TEST(IpcBroker, AnotherPodGetsTheSameAnswerAsAnUnknownToken) {
  IpcBroker broker(4, 16);
  auto token = broker.offer(process(1, 1000, "pod-a"), some_descriptor(), 2 << 20);
  ASSERT_TRUE(token.ok());
  auto other_pod = broker.claim(process(2, 1000, "pod-b"), token.value());
  auto unknown = broker.claim(process(2, 1000, "pod-a"), token.value() ^ 1);
  ASSERT_FALSE(other_pod.ok());
  ASSERT_FALSE(unknown.ok());
  EXPECT_EQ(other_pod.error().message, unknown.error().message);
}

TEST(IpcBroker, OnlyTheExporterWithdrawsAndItsExitDropsTheRest) {
  IpcBroker broker(4, 16);
  const ClientIdentity exporter = process(1, 1000, "pod-a");
  auto first = broker.offer(exporter, some_descriptor(), 2 << 20);
  auto second = broker.offer(exporter, some_descriptor(), 2 << 20);
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_FALSE(broker.withdraw(process(2, 1000, "pod-a"), first.value()));
  EXPECT_TRUE(broker.withdraw(exporter, first.value()));
  EXPECT_FALSE(broker.claim(process(2, 1000, "pod-a"), first.value()).ok());
  EXPECT_EQ(broker.drop_process(exporter.pid, exporter.start_time), 1u);
  EXPECT_EQ(broker.size(), 0u);
}

TEST(IpcBroker, ExportsAreBoundedPerProcessAndInAll) {
  IpcBroker broker(2, 3);
  const ClientIdentity a = process(1, 1000, std::nullopt);
  const ClientIdentity b = process(2, 1000, std::nullopt);
  EXPECT_TRUE(broker.offer(a, some_descriptor(), 1).ok());
  EXPECT_TRUE(broker.offer(a, some_descriptor(), 1).ok());
  EXPECT_FALSE(broker.offer(a, some_descriptor(), 1).ok());  // a's two
  EXPECT_TRUE(broker.offer(b, some_descriptor(), 1).ok());
  EXPECT_FALSE(broker.offer(b, some_descriptor(), 1).ok());  // three in all
  EXPECT_FALSE(broker.offer(b, UniqueFd(), 1).ok());         // nothing to keep
  EXPECT_EQ(broker.size(), 3u);
}

}  // namespace
}  // namespace nvshare::scheduler
