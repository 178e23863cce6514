// The real nvshare-scheduler binary, driven over its sockets by scripted clients and by nvsharectl.
//
// Each test starts its own daemon with sockets in a temporary directory. Timing bounds are generous
// (tests assert behaviour, not speed): waits are for "at most" a second or so, and the one latency
// the scheduler promises (a disconnect frees the grant for the next client within 50 ms) is
// asserted with that bound and its measured value recorded as a test property.
#include "daemon_process.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "client/ipc_broker_client.h"
#include "common/json.h"
#include "common/unix_socket.h"
#include "control/client.h"
#include "protocol_client.h"

namespace nvshare::testing {
namespace {

using protocol::Grant;
using protocol::Hello;
using protocol::Ping;
using protocol::Pong;
using protocol::Released;
using protocol::Request;
using protocol::Revoke;
using protocol::SetLimits;
using protocol::Usage;
using protocol::Wait;
using protocol::Welcome;

constexpr std::uint64_t Mi = 1ull << 20;
constexpr std::uint64_t Gi = 1ull << 30;
const std::string kGpu = "GPU-00000000-1111-2222-3333-444444444444";

mode_t current_umask() {
  const mode_t mask = ::umask(0);
  ::umask(mask);
  return mask;
}

class DaemonProcessTest : public ::testing::Test {
 protected:
  void start(std::vector<std::string> flags) {
    auto daemon = DaemonProcess::start(flags, NVSHARE_SCHEDULER_BIN);
    ASSERT_TRUE(daemon.ok()) << daemon.error().message;
    daemon_ = std::move(daemon).value();
  }

  void TearDown() override {
    if (HasFailure() && daemon_)
      std::fprintf(stderr, "---- scheduler log ----\n%s\n", daemon_->log().c_str());
  }

  ProtocolClient connect() {
    auto client = ProtocolClient::connect(daemon_->socket());
    EXPECT_TRUE(client.ok()) << client.error().message;
    return std::move(client).value();
  }

  // A registered client: hello, welcome, and the limits in force, which follow the welcome.
  ProtocolClient registered(const std::string& pod_uid = "") {
    ProtocolClient client = connect();
    auto welcome = client.hello(hello_for(kGpu, pod_uid));
    EXPECT_TRUE(welcome.ok()) << welcome.error().message;
    auto limits = client.expect<SetLimits>(2000ms);
    EXPECT_TRUE(limits.ok()) << limits.error().message;
    return client;
  }

  Result<CommandResult> ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {NVSHARE_CTL_BIN, "--control-socket", daemon_->control_socket()});
    return run_command(args);
  }

  Json control(const Json& request) {
    auto response = control::control_call(daemon_->control_socket(), request);
    EXPECT_TRUE(response.ok()) << response.error().message;
    return response.ok() ? response.value() : Json();
  }

  // The status entry of one client.
  Json client_status(std::uint64_t id) {
    Json status = control(Json(Json::Object{{"cmd", "status"}}));
    for (const Json& gpu : *status.find("gpus")->as_array()) {
      for (const Json& c : *gpu.find("clients")->as_array()) {
        if (c.find("id")->as_int64() == static_cast<std::int64_t>(id)) return c;
      }
    }
    return Json();
  }

  std::unique_ptr<DaemonProcess> daemon_;
};

// A frame with a valid header and `payload` as its payload, whatever the type expects.
std::vector<std::uint8_t> raw_frame(protocol::MessageType type, std::vector<std::uint8_t> payload,
                                    std::uint32_t declared_length) {
  std::vector<std::uint8_t> out;
  const auto put = [&out](std::uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
  };
  put(protocol::kMagic, 4);
  put(1, 2);
  put(static_cast<std::uint16_t>(type), 2);
  put(declared_length, 4);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

// ---- registration -------------------------------------------------------------------------------

TEST_F(DaemonProcessTest, HelloGetsWelcomeWithNegotiatedVersionAndDistinctIds) {
  start({});
  ProtocolClient a = connect();
  Hello hello = hello_for(kGpu);
  hello.min_version = 1;
  hello.max_version = protocol::kMaxVersion + 1;  // a newer client: the highest both speak
  auto welcome_a = a.hello(hello);
  ASSERT_TRUE(welcome_a.ok()) << welcome_a.error().message;
  EXPECT_EQ(welcome_a.value().version, protocol::kMaxVersion);
  EXPECT_GT(welcome_a.value().client_id, 0u);

  ProtocolClient b = connect();
  auto welcome_b = b.hello(hello_for(kGpu));
  ASSERT_TRUE(welcome_b.ok()) << welcome_b.error().message;
  EXPECT_NE(welcome_b.value().client_id, welcome_a.value().client_id);

  ASSERT_TRUE(a.send(Ping{0xfeed}).ok());
  auto pong = a.wait_for<Pong>(2000ms);  // after the limits that follow the welcome
  ASSERT_TRUE(pong.ok()) << pong.error().message;
  EXPECT_EQ(pong.value().nonce, 0xfeedu);
}

TEST_F(DaemonProcessTest, HelloWithoutACommonVersionIsClosed) {
  start({});
  ProtocolClient client = connect();
  Hello hello = hello_for(kGpu);
  hello.min_version = protocol::kMaxVersion + 1;
  hello.max_version = protocol::kMaxVersion + 5;
  ASSERT_TRUE(client.send(hello).ok());
  auto reply = client.next(2000ms);
  ASSERT_FALSE(reply.ok()) << "got " << describe(reply.value());
  EXPECT_EQ(reply.error().message.rfind("connection closed", 0), 0u) << reply.error().message;

  // The scheduler still serves others.
  ProtocolClient other = connect();
  EXPECT_TRUE(other.hello(hello_for(kGpu)).ok());
}

TEST_F(DaemonProcessTest, FramesBeforeHelloOrFromTheWrongDirectionAreClosed) {
  start({});
  ProtocolClient early = connect();
  ASSERT_TRUE(early.send(Request{}).ok());
  EXPECT_TRUE(early.closed_within(2000ms));

  ProtocolClient impostor = registered();
  ASSERT_TRUE(impostor.send(Grant{1}).ok());  // only the scheduler grants
  EXPECT_TRUE(impostor.closed_within(2000ms));

  ProtocolClient twice = registered();
  ASSERT_TRUE(twice.send(hello_for(kGpu)).ok());
  EXPECT_TRUE(twice.closed_within(2000ms));
}

// ---- grant, wait, revoke, release ---------------------------------------------------------------

TEST_F(DaemonProcessTest, ClientsThatDoNotFitTakeTurnsAndStaleReleasesAreIgnored) {
  start({"--capacity", "1Gi", "--reserve", "0", "--quantum", "0.3"});
  ProtocolClient a = registered();
  ProtocolClient b = registered();
  ASSERT_TRUE(a.send(Usage{700 * Mi, 700 * Mi, 0}).ok());
  ASSERT_TRUE(b.send(Usage{700 * Mi, 0, 0}).ok());

  ASSERT_TRUE(a.send(Request{}).ok());
  auto first = a.expect<Grant>(2000ms);
  ASSERT_TRUE(first.ok()) << first.error().message;

  ASSERT_TRUE(b.send(Request{}).ok());
  auto wait = b.expect<Wait>(2000ms);
  ASSERT_TRUE(wait.ok()) << wait.error().message;
  EXPECT_EQ(wait.value().reason, protocol::WaitReason::kMemory);

  // A's quantum (0.3 s) ends while B waits: revoked for B's turn, swapping out since B cannot fit
  // beside.
  auto revoke = a.wait_for<Revoke>(3000ms);
  ASSERT_TRUE(revoke.ok()) << revoke.error().message;
  EXPECT_EQ(revoke.value().epoch, first.value().epoch);
  EXPECT_EQ(revoke.value().reason, protocol::RevokeReason::kTurn);
  EXPECT_TRUE(revoke.value().swap_out);

  // A release with a wrong epoch changes nothing: B gets no grant.
  ASSERT_TRUE(a.send(Released{first.value().epoch + 100, 300'000, 1'000}).ok());
  std::vector<protocol::Message> seen;
  auto early = b.wait_for<Grant>(300ms, &seen);
  EXPECT_FALSE(early.ok()) << "B was granted epoch " << early.value().epoch
                           << " on a stale release";

  // As the library does after a swap-out: the usage that shows it, then the release.
  ASSERT_TRUE(a.send(Usage{700 * Mi, 0, 0}).ok());
  ASSERT_TRUE(a.send(Released{first.value().epoch, 300'000, 1'000}).ok());
  auto second = b.wait_for<Grant>(2000ms);
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_GT(second.value().epoch, first.value().epoch);

  // A was preempted, so it is queued again behind B and waits for memory.
  auto a_waits = a.wait_for<Wait>(2000ms);
  ASSERT_TRUE(a_waits.ok()) << a_waits.error().message;
  EXPECT_EQ(client_status(a.client_id()).find("state")->as_string()->c_str(),
            std::string("waiting"));
}

TEST_F(DaemonProcessTest, DisconnectFreesTheGrantForTheNextClientAtOnce) {
  start({"--capacity", "1Gi", "--reserve", "0", "--quantum", "600"});
  ProtocolClient holder = registered();
  ProtocolClient next = registered();
  ASSERT_TRUE(holder.send(Usage{700 * Mi, 700 * Mi, 0}).ok());
  ASSERT_TRUE(next.send(Usage{700 * Mi, 0, 0}).ok());
  ASSERT_TRUE(holder.send(Request{}).ok());
  ASSERT_TRUE(holder.expect<Grant>(2000ms).ok());
  ASSERT_TRUE(next.send(Request{}).ok());
  auto wait = next.expect<Wait>(2000ms);
  ASSERT_TRUE(wait.ok()) << wait.error().message;
  // Nothing but the disconnect can free the GPU (the quantum is 10 minutes).
  ASSERT_TRUE(next.quiet_for(200ms));

  const auto closed_at = std::chrono::steady_clock::now();
  holder.close();
  auto grant = next.wait_for<Grant>(2000ms);
  const auto elapsed = std::chrono::steady_clock::now() - closed_at;
  ASSERT_TRUE(grant.ok()) << grant.error().message;
  const double ms = std::chrono::duration<double, std::milli>(elapsed).count();
  RecordProperty("disconnect_to_grant_us", static_cast<int>(ms * 1000));
  std::printf("disconnect -> next grant: %.3f ms\n", ms);
  EXPECT_LT(ms, 50.0);
}

// ---- malformed input ----------------------------------------------------------------------------

TEST_F(DaemonProcessTest, GarbageAndTruncatedFramesCloseOnlyTheOffendingConnection) {
  start({});
  ProtocolClient good = registered();
  ASSERT_TRUE(good.send(Request{}).ok());
  auto grant = good.expect<Grant>(2000ms);
  ASSERT_TRUE(grant.ok()) << grant.error().message;

  // Bytes that are not a frame at all.
  ProtocolClient garbage = registered();
  const std::string junk = "GET / HTTP/1.1\r\nHost: nvshare\r\n\r\n";
  ASSERT_TRUE(
      garbage.send_raw({reinterpret_cast<const std::uint8_t*>(junk.data()), junk.size()}).ok());
  EXPECT_TRUE(garbage.closed_within(2000ms));

  // A header announcing more than the maximum payload: rejected before any payload is awaited.
  ProtocolClient oversized = registered();
  ASSERT_TRUE(oversized.send_raw(raw_frame(protocol::MessageType::kUsage, {}, 1 << 20)).ok());
  EXPECT_TRUE(oversized.closed_within(2000ms));

  // A usage frame whose payload stops after 10 of its 24 bytes.
  ProtocolClient truncated = registered();
  ASSERT_TRUE(
      truncated
          .send_raw(raw_frame(protocol::MessageType::kUsage, std::vector<std::uint8_t>(10, 0), 10))
          .ok());
  EXPECT_TRUE(truncated.closed_within(2000ms));

  // Half a frame, then the peer goes away: its session ends, nothing else does.
  ProtocolClient half = registered();
  auto frame = protocol::encode(Usage{1, 2, 3}).value();
  ASSERT_TRUE(half.send_raw(std::span<const std::uint8_t>(frame).first(17)).ok());
  half.close();

  // The first client still holds its grant and is served; newcomers register.
  ASSERT_TRUE(good.send(Ping{42}).ok());
  auto pong = good.expect<Pong>(2000ms);
  ASSERT_TRUE(pong.ok()) << pong.error().message;
  EXPECT_EQ(pong.value().nonce, 42u);
  EXPECT_EQ(*client_status(good.client_id()).find("state")->as_string(), "running");
  ProtocolClient late = registered();
  EXPECT_GT(late.client_id(), 0u);

  Json stats = control(Json(Json::Object{{"cmd", "stats"}}));
  EXPECT_GE(stats.find("sessions")->find("closed_malformed")->as_int64(), 3);
}

TEST_F(DaemonProcessTest, AClientThatDoesNotReadIsDroppedWithoutStallingOthers) {
  start({"--client-buffer-limit", "64Ki"});
  ProtocolClient lazy = registered();
  ProtocolClient busy = registered();
  // 60,000 pings (1.2 MB) and never a read: their pongs overflow the socket and then the 64 KiB
  // cap.
  std::vector<std::uint8_t> pings;
  for (int i = 0; i < 60'000; ++i)
    (void)protocol::encode_to(Ping{static_cast<std::uint64_t>(i)}, pings);
  std::thread writer([&] { (void)lazy.send_raw(pings); });
  struct Joiner {
    std::thread& thread;
    ~Joiner() { thread.join(); }
  } joiner{writer};
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(busy.send(Ping{static_cast<std::uint64_t>(i)}).ok());
    auto pong = busy.expect<Pong>(2000ms);
    ASSERT_TRUE(pong.ok()) << pong.error().message;
  }
  // The lazy client was dropped (its pending output passed the limit); the other one is fine.
  Json stats;
  for (int i = 0; i < 100; ++i) {
    stats = control(Json(Json::Object{{"cmd", "stats"}}));
    if (stats.find("sessions")->find("closed_slow")->as_int64() == 1) break;
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_EQ(stats.find("sessions")->find("closed_slow")->as_int64(), 1);
  ASSERT_TRUE(busy.send(Ping{7}).ok());
  EXPECT_TRUE(busy.expect<Pong>(2000ms).ok());
}

// ---- control socket -----------------------------------------------------------------------------

TEST_F(DaemonProcessTest, ControlSocketIsOwnerOnlyAndRefusesOtherUids) {
  start({});
  struct stat st {};
  ASSERT_EQ(::stat(daemon_->control_socket().c_str(), &st), 0);
  EXPECT_TRUE(S_ISSOCK(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  ASSERT_EQ(::stat(daemon_->socket().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0666u);  // the client socket is for everyone

  if (::geteuid() != 0) {
    GTEST_SKIP() << "the refusal of other uids needs root to run a client as another uid "
                    "(the socket mode was checked)";
  }
  ASSERT_EQ(::chmod(daemon_->dir().c_str(), 0755), 0);  // let uid 65534 reach the socket files

  // Runs `body` as uid/gid 65534 in a child; returns its exit code.
  const auto as_nobody = [](const std::function<int()>& body) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(100);
      ::_exit(body());
    }
    int status = 0;
    ::waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  const std::string path = daemon_->control_socket();

  // The file mode keeps another uid out.
  EXPECT_EQ(as_nobody([&] {
              auto fd = connect_unix(path);
              if (fd.ok()) return 1;
              return fd.error().message.find("Permission denied") != std::string::npos ? 0 : 2;
            }),
            0);

  // With the mode loosened (by an admin's mistake), the credential check still refuses: the peer
  // gets an error line and the connection closes; its request is never served.
  ASSERT_EQ(::chmod(path.c_str(), 0666), 0);
  EXPECT_EQ(
      as_nobody([&] {
        auto response = control::control_call(path, Json(Json::Object{{"cmd", "status"}}), 2000);
        if (!response.ok()) return 3;
        const Json* ok = response.value().find("ok");
        const Json* error = response.value().find("error");
        if (ok == nullptr || ok->as_bool() != false || error == nullptr) return 4;
        return error->as_string()->find("permission denied: uid 65534") != std::string::npos ? 0
                                                                                             : 5;
      }),
      0);
  Json stats = control(Json(Json::Object{{"cmd", "stats"}}));
  EXPECT_EQ(stats.find("control_refused")->as_int64(), 1);
}

TEST_F(DaemonProcessTest, ControlSocketAnswersBadJsonAndClosesOversizedLines) {
  start({});
  auto connection = connect_unix(daemon_->control_socket());
  ASSERT_TRUE(connection.ok());
  const int fd = connection.value().get();
  const auto send_line = [fd](const std::string& text) {
    return write_all(fd, {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()}, 2000);
  };
  std::string buffer;
  const auto read_line = [fd, &buffer]() -> std::string {
    for (int i = 0; i < 200; ++i) {
      if (auto nl = buffer.find('\n'); nl != std::string::npos) {
        std::string line = buffer.substr(0, nl);
        buffer.erase(0, nl + 1);
        return line;
      }
      char chunk[4096];
      const ssize_t n = ::recv(fd, chunk, sizeof chunk, 0);
      if (n <= 0) return "<closed>";
      buffer.append(chunk, static_cast<std::size_t>(n));
    }
    return "<no line>";
  };

  ASSERT_TRUE(send_line("{\"cmd\": \"status\",}\n").ok());
  auto bad = parse_json(read_line());
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad.value().find("ok")->as_bool(), false);
  EXPECT_NE(bad.value().find("error")->as_string()->find("invalid JSON at line 1 column 18"),
            std::string::npos)
      << bad.value().dump();

  // The connection survives a bad request.
  ASSERT_TRUE(send_line("{\"cmd\":\"version\"}\n{\"cmd\":\"dance\"}\n").ok());
  auto version = parse_json(read_line());
  ASSERT_TRUE(version.ok());
  EXPECT_EQ(version.value().find("ok")->as_bool(), true);
  auto unknown = parse_json(read_line());
  ASSERT_TRUE(unknown.ok());
  EXPECT_NE(unknown.value().find("error")->as_string()->find("unknown cmd \"dance\""),
            std::string::npos);

  // A line longer than 64 KiB: an error, then the connection closes.
  ASSERT_TRUE(send_line(std::string(70 * 1024, 'x')).ok());
  auto oversized = parse_json(read_line());
  ASSERT_TRUE(oversized.ok());
  EXPECT_NE(oversized.value().find("error")->as_string()->find("longer than"), std::string::npos);
  EXPECT_EQ(read_line(), "<closed>");
}

// ---- nvsharectl ---------------------------------------------------------------------------------

TEST_F(DaemonProcessTest, NvsharectlStatusJsonReflectsClientsStatesAndLimits) {
  start({"--capacity", "1Gi", "--reserve", "0", "--quantum", "600", "--trust-client-limits"});
  const std::string pod = "7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d";
  ProtocolClient a = registered(pod);
  ProtocolClient b = registered();
  ASSERT_TRUE(a.send(Usage{700 * Mi, 600 * Mi, 0}).ok());
  ASSERT_TRUE(b.send(Usage{700 * Mi, 0, 0}).ok());
  ASSERT_TRUE(a.send(Request{}).ok());
  ASSERT_TRUE(a.expect<Grant>(2000ms).ok());
  ASSERT_TRUE(b.send(Request{}).ok());
  ASSERT_TRUE(b.expect<Wait>(2000ms).ok());

  auto set = ctl({"set-limits", "--pod-uid", pod, "--pod", "team-a/trainer-0", "--memory", "2Gi",
                  "--core", "50"});
  ASSERT_TRUE(set.ok()) << set.error().message;
  ASSERT_EQ(set.value().exit_code, 0) << set.value().err;
  ASSERT_TRUE(a.wait_for<SetLimits>(1000ms).ok());

  auto status = ctl({"status", "--json"});
  ASSERT_TRUE(status.ok()) << status.error().message;
  ASSERT_EQ(status.value().exit_code, 0) << status.value().err;
  auto parsed = parse_json(status.value().out);
  ASSERT_TRUE(parsed.ok()) << parsed.error().message << "\n" << status.value().out;
  const Json& s = parsed.value();
  ASSERT_EQ(s.find("gpus")->as_array()->size(), 1u);
  const Json& gpu = s.find("gpus")->as_array()->at(0);
  EXPECT_EQ(*gpu.find("uuid")->as_string(), kGpu);
  EXPECT_EQ(gpu.find("capacity_bytes")->as_int64(), static_cast<std::int64_t>(Gi));
  const auto& clients = *gpu.find("clients")->as_array();
  ASSERT_EQ(clients.size(), 2u);

  const Json& ca = clients[0];
  EXPECT_EQ(ca.find("id")->as_int64(), static_cast<std::int64_t>(a.client_id()));
  EXPECT_EQ(ca.find("pid")->as_int64(), ::getpid());  // from SO_PEERCRED
  EXPECT_EQ(*ca.find("state")->as_string(), "running");
  EXPECT_TRUE(ca.find("waiting_for")->is_null());
  EXPECT_EQ(*ca.find("pod_uid")->as_string(), pod);
  EXPECT_EQ(*ca.find("namespace")->as_string(), "team-a");
  EXPECT_EQ(*ca.find("pod")->as_string(), "trainer-0");
  EXPECT_EQ(ca.find("allocated_bytes")->as_int64(), static_cast<std::int64_t>(700 * Mi));
  EXPECT_EQ(ca.find("memory_limit_bytes")->as_int64(), static_cast<std::int64_t>(2 * Gi));
  EXPECT_EQ(ca.find("core_limit_percent")->as_int64(), 50);
  EXPECT_EQ(*ca.find("limits_source")->as_string(), "pod");

  const Json& cb = clients[1];
  EXPECT_EQ(cb.find("id")->as_int64(), static_cast<std::int64_t>(b.client_id()));
  EXPECT_EQ(*cb.find("state")->as_string(), "waiting");
  EXPECT_EQ(*cb.find("waiting_for")->as_string(), "memory");
  EXPECT_TRUE(cb.find("memory_limit_bytes")->is_null());
  EXPECT_EQ(cb.find("core_limit_percent")->as_int64(), 100);

  const auto& pods = *s.find("pods")->as_array();
  ASSERT_EQ(pods.size(), 1u);
  EXPECT_EQ(pods[0].find("clients")->as_int64(), 1);

  // The table shows the same.
  auto table = ctl({"status"});
  ASSERT_TRUE(table.ok());
  EXPECT_EQ(table.value().exit_code, 0);
  EXPECT_NE(table.value().out.find("team-a/trainer-0"), std::string::npos) << table.value().out;
  EXPECT_NE(table.value().out.find("700Mi / 2Gi"), std::string::npos) << table.value().out;
  EXPECT_NE(table.value().out.find("memory"), std::string::npos) << table.value().out;

  auto top = ctl({"top", "--interval", "0.05", "--iterations", "2"});
  ASSERT_TRUE(top.ok());
  EXPECT_EQ(top.value().exit_code, 0);
  std::size_t headers = 0;
  for (std::size_t at = 0; (at = top.value().out.find("nvsharectl top", at)) != std::string::npos;
       ++at) {
    ++headers;
  }
  EXPECT_EQ(headers, 2u) << top.value().out;

  auto explain = ctl({"explain", std::to_string(b.client_id())});
  ASSERT_TRUE(explain.ok());
  EXPECT_EQ(explain.value().exit_code, 0) << explain.value().err;
  EXPECT_NE(explain.value().out.find("waiting"), std::string::npos) << explain.value().out;
}

TEST_F(DaemonProcessTest, SetLimitsReachesTheClientAsALimitsFrame) {
  start({});
  ProtocolClient client = registered();
  const auto sent = std::chrono::steady_clock::now();
  auto result = ctl({"set-limits", "--client", std::to_string(client.client_id()), "--memory",
                     "2Gi", "--core", "30"});
  ASSERT_TRUE(result.ok()) << result.error().message;
  ASSERT_EQ(result.value().exit_code, 0) << result.value().err;
  auto limits = client.wait_for<SetLimits>(1000ms);
  ASSERT_TRUE(limits.ok()) << limits.error().message;
  std::printf(
      "set-limits -> limits frame: %.3f ms (including nvsharectl's start)\n",
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - sent).count());
  EXPECT_EQ(limits.value().limits.memory_bytes, 2 * Gi);
  EXPECT_EQ(limits.value().limits.core_percent, 30);

  // Removing the memory limit sends the new limits too.
  result = ctl({"set-limits", "--pid", std::to_string(::getpid()), "--memory", "none"});
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result.value().exit_code, 0) << result.value().err;
  limits = client.wait_for<SetLimits>(1000ms);
  ASSERT_TRUE(limits.ok()) << limits.error().message;
  EXPECT_EQ(limits.value().limits.memory_bytes, 0u);
  EXPECT_EQ(limits.value().limits.core_percent, 30);

  // Errors are reported, with a non-zero exit.
  result = ctl({"set-limits", "--client", "999999", "--core", "20"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.value().exit_code, 1);
  EXPECT_NE(result.value().err.find("no client with id 999999"), std::string::npos)
      << result.value().err;
  // A malformed flag value is a usage error (exit 2, as in every other command), in the flags'
  // words: no JSON null.
  result = ctl({"set-limits", "--client", std::to_string(client.client_id()), "--memory", "4GB"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.value().exit_code, 2);
  EXPECT_NE(result.value().err.find("unknown suffix"), std::string::npos) << result.value().err;
  result = ctl({"set-limits", "--client", std::to_string(client.client_id()), "--core", "150"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.value().exit_code, 2);
  EXPECT_NE(result.value().err.find("--core must be a percent 1..100, none or inherit"),
            std::string::npos)
      << result.value().err;
  EXPECT_EQ(result.value().err.find("null"), std::string::npos) << result.value().err;
  result =
      ctl({"set-limits", "--client", std::to_string(client.client_id()), "--memory-mode", "fast"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.value().exit_code, 2);
  EXPECT_NE(result.value().err.find("--memory-mode must be one of"), std::string::npos)
      << result.value().err;
}

TEST_F(DaemonProcessTest, PodLimitsSetBeforeTheProcessStartsApplyWhenItRegisters) {
  start({"--trust-client-limits"});
  const std::string pod = "0b9c4d2e-5f6a-4b7c-8d9e-0f1a2b3c4d5e";
  auto result = ctl({"set-limits", "--pod-uid", pod, "--memory", "1Gi"});
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result.value().exit_code, 0) << result.value().err;

  ProtocolClient client = connect();
  ASSERT_TRUE(client.hello(hello_for(kGpu, pod)).ok());
  auto limits = client.expect<SetLimits>(1000ms);  // right after the welcome: the pod's limits
  ASSERT_TRUE(limits.ok()) << limits.error().message;
  EXPECT_EQ(limits.value().limits.memory_bytes, 1 * Gi);
  EXPECT_EQ(limits.value().limits.core_percent, 100);

  // A namespace/name selector reaches the pod once its name is known.
  result = ctl({"set-limits", "--pod-uid", pod, "--pod", "ml/notebook", "--core", "40"});
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result.value().exit_code, 0) << result.value().err;
  ASSERT_TRUE(client.wait_for<SetLimits>(1000ms).ok());
  result = ctl({"set-limits", "--pod", "ml/notebook", "--memory", "3Gi"});
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result.value().exit_code, 0) << result.value().err;
  limits = client.wait_for<SetLimits>(1000ms);
  ASSERT_TRUE(limits.ok()) << limits.error().message;
  EXPECT_EQ(limits.value().limits.memory_bytes, 3 * Gi);
  EXPECT_EQ(limits.value().limits.core_percent, 40);
}

TEST_F(DaemonProcessTest, DeclaredPodAndLimitsAreIgnoredUnlessTrusted) {
  start({});
  const std::string pod = "0b9c4d2e-5f6a-4b7c-8d9e-0f1a2b3c4d5e";
  auto result = ctl({"set-limits", "--pod-uid", pod, "--memory", "1Gi"});
  ASSERT_TRUE(result.ok());
  ProtocolClient client = connect();
  Hello hello = hello_for(kGpu, pod);
  hello.declared = protocol::Limits{8 * Gi, 20};
  ASSERT_TRUE(client.hello(hello).ok());
  // The limits in force are neither the claimed pod's nor the declared ones.
  auto limits = client.expect<SetLimits>(2000ms);
  ASSERT_TRUE(limits.ok()) << limits.error().message;
  EXPECT_EQ(limits.value().limits, (protocol::Limits{0, 100}));
  const Json status = client_status(client.client_id());
  EXPECT_TRUE(status.find("pod_uid")->is_null());
  EXPECT_TRUE(status.find("memory_limit_bytes")->is_null());
  EXPECT_EQ(status.find("core_limit_percent")->as_int64(), 100);
}

TEST_F(DaemonProcessTest, SetPolicyCapacityLetsAWaitingClientRun) {
  start({"--capacity", "1Gi", "--reserve", "0", "--quantum", "600"});
  ProtocolClient a = registered();
  ProtocolClient b = registered();
  ASSERT_TRUE(a.send(Usage{700 * Mi, 700 * Mi, 0}).ok());
  ASSERT_TRUE(b.send(Usage{700 * Mi, 0, 0}).ok());
  ASSERT_TRUE(a.send(Request{}).ok());
  ASSERT_TRUE(a.expect<Grant>(2000ms).ok());
  ASSERT_TRUE(b.send(Request{}).ok());
  ASSERT_TRUE(b.expect<Wait>(2000ms).ok());

  auto bad = ctl({"set-policy", "--gpu", kGpu, "--quantum", "-3"});
  ASSERT_TRUE(bad.ok());
  EXPECT_EQ(bad.value().exit_code, 1);  // in range is the scheduler's to say: refused
  EXPECT_NE(bad.value().err.find("quantum"), std::string::npos) << bad.value().err;

  auto result = ctl({"set-policy", "--gpu", kGpu, "--capacity", "2Gi"});
  ASSERT_TRUE(result.ok());
  ASSERT_EQ(result.value().exit_code, 0) << result.value().err;
  auto grant = b.wait_for<Grant>(1000ms);
  ASSERT_TRUE(grant.ok()) << grant.error().message;
  Json status = control(Json(Json::Object{{"cmd", "status"}}));
  EXPECT_EQ(status.find("gpus")->as_array()->at(0).find("capacity_bytes")->as_int64(),
            static_cast<std::int64_t>(2 * Gi));
}

TEST_F(DaemonProcessTest, NvsharectlExplainsWhenTheSchedulerIsNotRunning) {
  auto result = run_command(
      {NVSHARE_CTL_BIN, "--control-socket", "/nonexistent/nvshare/control.sock", "status"});
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result.value().exit_code, 3);
  EXPECT_NE(result.value().err.find("is nvshare-scheduler running?"), std::string::npos)
      << result.value().err;
  EXPECT_NE(result.value().err.find("/nonexistent/nvshare/control.sock"), std::string::npos);
}

// nvsharectl checks its control socket as the scheduler's knob does, from the flag or the
// environment, and says which one is wrong (exit 2) instead of trying to connect.
TEST_F(DaemonProcessTest, NvsharectlRefusesAControlSocketTheSchedulerWouldRefuse) {
  auto flag = run_command({NVSHARE_CTL_BIN, "--control-socket", "relative/control.sock", "status"});
  ASSERT_TRUE(flag.ok()) << flag.error().message;
  EXPECT_EQ(flag.value().exit_code, 2);
  EXPECT_NE(
      flag.value().err.find("--control-socket: \"relative/control.sock\" is not an absolute path"),
      std::string::npos)
      << flag.value().err;
  auto env = run_command({"/usr/bin/env", "NVSHARE_CONTROL_SOCKET=/" + std::string(200, 'c'),
                          NVSHARE_CTL_BIN, "status"});
  ASSERT_TRUE(env.ok()) << env.error().message;
  EXPECT_EQ(env.value().exit_code, 2);
  EXPECT_NE(env.value().err.find("NVSHARE_CONTROL_SOCKET: "), std::string::npos) << env.value().err;
  EXPECT_NE(env.value().err.find("longer than 107 bytes"), std::string::npos) << env.value().err;
}

// ---- lifecycle ----------------------------------------------------------------------------------

// The default control socket has a directory of its own, which nothing else creates outside
// Kubernetes: the scheduler makes it, private to its uid, and its missing parents 0755. A directory
// that exists is left as it is (it may also hold the client socket).
TEST_F(DaemonProcessTest, CreatesAMissingControlSocketDirectoryMode0700) {
  char pattern[] = "/tmp/nvshare-control-dir-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string root = pattern;
  const std::string control = root + "/run/nvshare-control/control.sock";
  start({"--control-socket", control});
  struct stat st {};
  ASSERT_EQ(::stat((root + "/run/nvshare-control").c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 0777, 0700u);
  EXPECT_EQ(st.st_uid, ::geteuid());
  ASSERT_EQ(::stat((root + "/run").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0755u & ~current_umask());
  ASSERT_EQ(::stat(control.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(daemon_->log().find("created " + root + "/run/nvshare-control (mode 0700)"),
            std::string::npos)
      << daemon_->log();
  auto response = control::control_call(control, Json(Json::Object{{"cmd", "version"}}));
  EXPECT_TRUE(response.ok()) << response.error().message;

  // Restarted, it finds the directory and leaves it (and its mode) alone.
  ASSERT_TRUE(daemon_->stop(SIGTERM, 5000ms).ok());
  ASSERT_EQ(::chmod((root + "/run/nvshare-control").c_str(), 0750), 0);
  daemon_.reset();
  start({"--control-socket", control});
  ASSERT_EQ(::stat((root + "/run/nvshare-control").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0750u);
  EXPECT_EQ(daemon_->log().find("for the control socket"), std::string::npos) << daemon_->log();
  daemon_.reset();
  std::filesystem::remove_all(root);
}

TEST_F(DaemonProcessTest, AControlSocketDirectoryThatIsAFileIsAClearError) {
  char pattern[] = "/tmp/nvshare-control-dir-XXXXXX";
  ASSERT_NE(::mkdtemp(pattern), nullptr);
  const std::string root = pattern;
  const std::string file = root + "/not-a-directory";
  { std::ofstream(file) << "x"; }
  auto result = run_command({NVSHARE_SCHEDULER_BIN, "--socket", root + "/scheduler.sock",
                             "--control-socket", file + "/control.sock"});
  ASSERT_TRUE(result.ok()) << result.error().message;
  EXPECT_EQ(result.value().exit_code, 1);
  EXPECT_NE(result.value().err.find(file + " exists and is not a directory"), std::string::npos)
      << result.value().err;
  std::filesystem::remove_all(root);
}

TEST_F(DaemonProcessTest, SigtermExitsZeroAndRemovesTheSockets) {
  start({});
  ProtocolClient client = registered();
  ASSERT_TRUE(client.send(Request{}).ok());
  ASSERT_TRUE(client.expect<Grant>(2000ms).ok());
  auto code = daemon_->stop(SIGTERM, 5000ms);
  ASSERT_TRUE(code.ok()) << code.error().message;
  EXPECT_EQ(code.value(), 0);
  struct stat st {};
  EXPECT_NE(::stat(daemon_->socket().c_str(), &st), 0);
  EXPECT_NE(::stat(daemon_->control_socket().c_str(), &st), 0);
  EXPECT_TRUE(client.closed_within(1000ms));
  EXPECT_NE(daemon_->log().find("received SIGTERM, shutting down"), std::string::npos)
      << daemon_->log();
}

TEST_F(DaemonProcessTest, SigintAlsoShutsDownCleanly) {
  start({});
  auto code = daemon_->stop(SIGINT, 5000ms);
  ASSERT_TRUE(code.ok()) << code.error().message;
  EXPECT_EQ(code.value(), 0);
  struct stat st {};
  EXPECT_NE(::stat(daemon_->socket().c_str(), &st), 0);
}

// A signal sent the moment the client socket appears (a supervisor stopping a daemon it has just
// seen start) is still a clean shutdown, not the default action of an unwatched signal.
TEST_F(DaemonProcessTest, ASignalAsSoonAsTheSocketAppearsIsACleanShutdown) {
  for (int round = 0; round < 20; ++round) {
    auto daemon = DaemonProcess::start({}, NVSHARE_SCHEDULER_BIN, Readiness::kClientSocketExists);
    ASSERT_TRUE(daemon.ok()) << daemon.error().message;
    auto code = daemon.value()->stop(round % 2 == 0 ? SIGTERM : SIGINT, 5000ms);
    ASSERT_TRUE(code.ok()) << code.error().message;
    EXPECT_EQ(code.value(), 0) << "round " << round << ":\n" << daemon.value()->log();
  }
}

TEST_F(DaemonProcessTest, ASecondSchedulerOnTheSameSocketRefusesToStart) {
  start({});
  auto second = run_command({NVSHARE_SCHEDULER_BIN, "--socket", daemon_->socket(),
                             "--control-socket", daemon_->dir() + "/other-control.sock"});
  ASSERT_TRUE(second.ok()) << second.error().message;
  EXPECT_EQ(second.value().exit_code, 1);
  EXPECT_NE(second.value().err.find("already listening"), std::string::npos) << second.value().err;
  // The first one still serves.
  ProtocolClient client = registered();
  EXPECT_GT(client.client_id(), 0u);
}

TEST_F(DaemonProcessTest, ConfigurationErrorsExitTwoWithTheReason) {
  auto result = run_command({NVSHARE_SCHEDULER_BIN, "--reserve", "95"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.value().exit_code, 2);
  EXPECT_NE(result.value().err.find("--reserve"), std::string::npos) << result.value().err;
  EXPECT_NE(result.value().err.find("outside 0..90"), std::string::npos) << result.value().err;
}

// One file cannot be both sockets: every client would fail open, or root's control socket would be
// the one given to containers.
TEST_F(DaemonProcessTest, TheTwoSocketsMustDiffer) {
  auto result = run_command({NVSHARE_SCHEDULER_BIN, "--socket", "/tmp/nvshare-same/s.sock",
                             "--control-socket", "/tmp/nvshare-same/../nvshare-same/s.sock"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result.value().exit_code, 2);
  EXPECT_NE(result.value().err.find("must differ"), std::string::npos) << result.value().err;
}

// Pod UIDs are compared in the form cgroups give them; another spelling is stored in that form, and
// what is not a pod UID, or a memory limit of 0, is refused.
TEST_F(DaemonProcessTest, PodUidsAreCanonicalAndMemoryZeroIsRefused) {
  start({});
  auto upper =
      ctl({"set-limits", "--pod-uid", "7D3F9A2E-1C4B-4E8F-9A6D-2B5C8E1F0A3D", "--memory", "1Gi"});
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(upper.value().exit_code, 0) << upper.value().err;
  const Json status = control(Json(Json::Object{{"cmd", "status"}}));
  ASSERT_EQ(status.find("pods")->as_array()->size(), 1u);
  EXPECT_EQ(*status.find("pods")->as_array()->at(0).find("pod_uid")->as_string(),
            "7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d");
  auto zero =
      ctl({"set-limits", "--pod-uid", "7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d", "--memory", "0"});
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero.value().exit_code, 2);
  EXPECT_NE(zero.value().err.find("memory 0 is not a limit"), std::string::npos)
      << zero.value().err;
  auto not_uid = ctl({"set-limits", "--pod-uid", "trainer", "--memory", "1Gi"});
  ASSERT_TRUE(not_uid.ok());
  EXPECT_EQ(not_uid.value().exit_code, 1);
}

// A restarted scheduler finds the pod limits of the last one in its state file, before anyone
// registers: a client of the pod gets them with its welcome, authoritative.
TEST_F(DaemonProcessTest, PodLimitsSurviveARestart) {
  start({});
  auto set = ctl({"set-limits", "--pod-uid", "7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d", "--memory",
                  "2Gi", "--core", "40"});
  ASSERT_TRUE(set.ok());
  ASSERT_EQ(set.value().exit_code, 0) << set.value().err;
  // Written by the scheduler's state thread just after the change.
  const std::string state = daemon_->dir() + "/state.json";
  const auto written = [&] {
    std::ifstream in(state);
    std::stringstream text;
    text << in.rdbuf();
    return text.str().find("7d3f9a2e-1c4b-4e8f-9a6d-2b5c8e1f0a3d") != std::string::npos;
  };
  for (int i = 0; i < 200 && !written(); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(written());
  auto code = daemon_->stop(SIGKILL, 5000ms);
  ASSERT_TRUE(code.ok());
  auto again = DaemonProcess::start({"--state-file", state}, NVSHARE_SCHEDULER_BIN);
  ASSERT_TRUE(again.ok()) << again.error().message;
  auto response =
      control::control_call(again.value()->control_socket(), Json(Json::Object{{"cmd", "status"}}));
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response.value().find("scheduler")->find("limits_synced")->as_bool(), true);
  const Json& pod = response.value().find("pods")->as_array()->at(0);
  EXPECT_EQ(pod.find("memory_limit_bytes")->as_int64(), static_cast<std::int64_t>(2 * Gi));
  EXPECT_EQ(pod.find("core_limit_percent")->as_int64(), 40);
}

// CUDA IPC brokering over the client socket: an export is accepted only from a process with a
// session, its descriptor handed (duplicated) to importers allowed to map it, and dropped when
// withdrawn or when the exporter's last session ends.
TEST_F(DaemonProcessTest, IpcExportsLiveWithTheExportersSessionAndReachItsPeers) {
  start({});
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  UniqueFd read_end(pipe_fds[0]);
  UniqueFd write_end(pipe_fds[1]);
  auto no_session = client::ipc_export(daemon_->socket(), read_end.get(), 2 * Mi);
  ASSERT_FALSE(no_session.ok());
  EXPECT_NE(no_session.error().message.find("no session"), std::string::npos)
      << no_session.error().message;

  ProtocolClient session = registered();
  auto token = client::ipc_export(daemon_->socket(), read_end.get(), 2 * Mi);
  ASSERT_TRUE(token.ok()) << token.error().message;
  auto imported = client::ipc_import(daemon_->socket(), token.value());
  ASSERT_TRUE(imported.ok()) << imported.error().message;
  EXPECT_EQ(imported.value().bytes, 2 * Mi);
  // The same open file: what goes into the pipe comes out of the imported descriptor.
  ASSERT_EQ(::write(write_end.get(), "x", 1), 1);
  char byte = 0;
  ASSERT_EQ(::read(imported.value().fd.get(), &byte, 1), 1);
  EXPECT_EQ(byte, 'x');

  EXPECT_FALSE(client::ipc_import(daemon_->socket(), token.value() + 1).ok());
  ASSERT_TRUE(client::ipc_withdraw(daemon_->socket(), token.value()).ok());
  EXPECT_FALSE(client::ipc_import(daemon_->socket(), token.value()).ok());

  auto second = client::ipc_export(daemon_->socket(), read_end.get(), 4 * Mi);
  ASSERT_TRUE(second.ok()) << second.error().message;
  session.close();
  bool dropped = false;
  for (int i = 0; i < 100 && !dropped; ++i) {
    dropped = !client::ipc_import(daemon_->socket(), second.value()).ok();
    if (!dropped) std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(dropped) << "an export outlived its exporter's session";
}

// Descriptors sent with anything but an export close the connection that sent them.
TEST_F(DaemonProcessTest, DescriptorsSentWithAHelloCloseTheSession) {
  start({});
  ProtocolClient client = connect();
  auto hello = protocol::encode(hello_for(kGpu));
  ASSERT_TRUE(hello.ok());
  ASSERT_TRUE(send_with_fd(client.fd(), hello.value(), 0, 1000).ok());
  char byte = 0;
  ::timeval wait{2, 0};
  ::setsockopt(client.fd(), SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  EXPECT_EQ(::recv(client.fd(), &byte, 1, 0), 0) << "the session was not closed";
}

// Hellos the scheduler refuses cost a log line a second at most, with the count: 300 of them for a
// GPU it does not know wrote 300 lines before.
TEST_F(DaemonProcessTest, RefusedHellosAreLoggedOnceASecond) {
  start({});
  // The lines an operator sees at the default level (the test's daemon also logs at debug).
  const auto warnings = [](const std::string& log) {
    std::size_t n = 0;
    for (std::size_t at = log.find(" WARN "); at != std::string::npos;
         at = log.find(" WARN ", at + 1)) {
      ++n;
    }
    return n;
  };
  const std::size_t before = warnings(daemon_->log());
  const auto started = std::chrono::steady_clock::now();
  for (int i = 0; i < 300; ++i) {
    ProtocolClient client = connect();
    auto welcome = client.hello(hello_for("GPU-ffffffff-0000-0000-0000-" + std::to_string(i)));
    EXPECT_FALSE(welcome.ok());
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::this_thread::sleep_for(200ms);
  const std::string log = daemon_->log();
  EXPECT_LE(static_cast<double>(warnings(log) - before), seconds + 2) << log;
  EXPECT_NE(log.find("refused since the last report"), std::string::npos) << log;
  EXPECT_NE(log.find("is not one of this node's GPUs"), std::string::npos) << log;
}

std::size_t open_descriptors(pid_t pid) {
  std::size_t n = 0;
  std::error_code ec;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/fd", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

// Descriptors passed (SCM_RIGHTS) with the first bytes of a frame that never completes: on a
// registered session, or more than one before any frame completes, the session is closed at once
// with them. Fifty sessions doing it leave the scheduler holding what it held.
TEST_F(DaemonProcessTest, DescriptorsPassedByteByByteAreNotHeld) {
  start({});
  const int passed = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(passed, 0);
  const std::uint8_t first_byte[1] = {0};
  std::vector<ProtocolClient> sessions;
  sessions.push_back(registered());  // settles the scheduler's own descriptors
  const std::size_t before = open_descriptors(daemon_->pid());
  for (int i = 0; i < 50; ++i) {
    sessions.push_back(registered());
    ASSERT_TRUE(send_with_fd(sessions.back().fd(), first_byte, passed, 1000).ok());
  }
  for (std::size_t i = 1; i < sessions.size(); ++i) {
    char byte = 0;
    ::timeval wait{2, 0};
    ::setsockopt(sessions[i].fd(), SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
    ssize_t n;
    while ((n = ::recv(sessions[i].fd(), &byte, 1, 0)) > 0) {
    }
    EXPECT_EQ(n, 0) << "session " << i << " was not closed";
  }
  // Unregistered: two descriptors before a frame completes close the connection too.
  ProtocolClient raw = connect();
  ASSERT_TRUE(send_with_fd(raw.fd(), first_byte, passed, 1000).ok());
  ASSERT_TRUE(send_with_fd(raw.fd(), first_byte, passed, 1000).ok());
  char byte = 0;
  ::timeval wait{2, 0};
  ::setsockopt(raw.fd(), SOL_SOCKET, SO_RCVTIMEO, &wait, sizeof wait);
  EXPECT_EQ(::recv(raw.fd(), &byte, 1, 0), 0) << "the connection was not closed";
  ::close(passed);
  EXPECT_LE(open_descriptors(daemon_->pid()), before + 1) << "descriptors were kept";
  // The first session is still served.
  EXPECT_TRUE(sessions[0].send(protocol::Request{}).ok());
  EXPECT_TRUE(sessions[0].expect<protocol::Grant>(2000ms).ok());
}

}  // namespace
}  // namespace nvshare::testing
