#include "common/unix_socket.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <thread>

namespace nvshare {
namespace {

class UnixSocket : public testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/nvshare-sock-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }
  std::string dir_;
};

TEST_F(UnixSocket, ListenConnectAndExchangeBytes) {
  const std::string path = dir_ + "/nested/dir/s.sock";
  auto listener = listen_unix(path, 0666);
  ASSERT_TRUE(listener.ok()) << listener.error().message;
  struct stat st{};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0666u);

  auto client = connect_unix(path);
  ASSERT_TRUE(client.ok()) << client.error().message;
  UniqueFd server(::accept4(listener.value().get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(server.valid());

  auto creds = peer_credentials(server.get());
  ASSERT_TRUE(creds.ok());
  EXPECT_EQ(creds.value().pid, ::getpid());
  EXPECT_EQ(creds.value().uid, ::getuid());

  const std::vector<std::uint8_t> msg{1, 2, 3, 4, 5};
  ASSERT_TRUE(write_all(client.value().get(), msg).ok());
  std::vector<std::uint8_t> buf(16);
  auto n = read_some(server.get(), buf);
  ASSERT_TRUE(n.ok());
  buf.resize(n.value());
  EXPECT_EQ(buf, msg);
}

TEST_F(UnixSocket, OwnerOnlyMode) {
  const std::string path = dir_ + "/control.sock";
  auto listener = listen_unix(path, 0600);
  ASSERT_TRUE(listener.ok());
  struct stat st{};
  ASSERT_EQ(::stat(path.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
}

TEST_F(UnixSocket, StaleSocketIsReplacedButARegularFileIsNot) {
  const std::string path = dir_ + "/s.sock";
  { auto first = listen_unix(path, 0600); ASSERT_TRUE(first.ok()); }
  auto second = listen_unix(path, 0600);
  EXPECT_TRUE(second.ok());

  const std::string file = dir_ + "/regular";
  std::ofstream(file) << "data";
  auto refused = listen_unix(file, 0600);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.error().message.find("not a socket"), std::string::npos);
}

TEST_F(UnixSocket, ConnectToMissingPathFails) {
  auto client = connect_unix(dir_ + "/absent.sock");
  ASSERT_FALSE(client.ok());
  EXPECT_NE(client.error().message.find("connect"), std::string::npos);
}

TEST_F(UnixSocket, TooLongPathIsAnError) {
  EXPECT_FALSE(listen_unix("/" + std::string(200, 'a'), 0600).ok());
}

TEST(UnixSocketPair, NonBlockingReadWouldBlockAndEndOfStreamIsZero) {
  auto pair = unix_socketpair();
  ASSERT_TRUE(pair.ok());
  auto& [a, b] = pair.value();
  ASSERT_TRUE(set_nonblocking(a.get()).ok());
  std::vector<std::uint8_t> buf(8);
  auto empty = read_some(a.get(), buf);
  ASSERT_FALSE(empty.ok());
  EXPECT_TRUE(would_block(empty.error()));
  b.reset();
  auto eof = read_some(a.get(), buf);
  ASSERT_TRUE(eof.ok());
  EXPECT_EQ(eof.value(), 0u);
}

TEST(UnixSocketPair, WriteToClosedPeerIsAnErrorNotASignal) {
  auto pair = unix_socketpair();
  ASSERT_TRUE(pair.ok());
  pair.value().second.reset();
  const std::vector<std::uint8_t> msg(16, 7);
  EXPECT_FALSE(write_all(pair.value().first.get(), msg).ok());
}

TEST(UnixSocketPair, WriteAllWaitsForRoomOnANonBlockingSocket) {
  auto pair = unix_socketpair();
  ASSERT_TRUE(pair.ok());
  auto& [a, b] = pair.value();
  ASSERT_TRUE(set_nonblocking(a.get()).ok());
  const std::vector<std::uint8_t> big(4 << 20, 9);
  std::size_t received = 0;
  std::thread reader([&, fd = b.get()] {
    std::vector<std::uint8_t> buf(65536);
    while (received < big.size()) {
      auto n = read_some(fd, buf);
      if (!n.ok() || n.value() == 0) break;
      received += n.value();
    }
  });
  EXPECT_TRUE(write_all(a.get(), big, 10'000).ok());
  reader.join();
  EXPECT_EQ(received, big.size());
}

}  // namespace
}  // namespace nvshare
