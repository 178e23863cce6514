// scheduler_bench: the real nvshare-scheduler under a node's worth of clients.
//
// Starts the daemon binary with its sockets in a temporary directory, connects N clients (default
// 1,000) spread over G GPUs (default 8) from one epoll-driven load generator, and runs a realistic
// mix for a fixed time: each client requests the GPU, reports its usage when granted, holds for a
// while, releases, thinks, and requests again; every client also pings periodically. Half of the
// GPUs are "roomy" (all their clients fit together, so a request is granted at once); on the other
// half only a few clients fit at a time, so most grants are handed over by a release (memory waits
// and FIFO hand-offs). As the library does, a client reports its memory moved to the host before a
// release a revoke asked to swap out, and when it is asked to evict the memory it keeps on the GPU
// between turns (without a grant it counts as parked there until then).
//
// Reported (a table on stdout, JSON in --out):
//  - decision latency measured in the daemon (control API `stats`): from a request or release being
//  read
//    off its socket to the grant it caused being written to the next holder's socket;
//    p50/p90/p99/max;
//  - request -> grant round trip seen by clients on the roomy GPUs (includes both kernels' socket
//  hops
//    and the load generator's own loop);
//  - messages per second through the daemon (frames in + out, from its counters), and the CPU time
//  the
//    daemon used;
//  - with --scrape-ms MS: the daemon serves metrics and a thread scrapes GET /metrics every MS
//    during the measured phase; each scrape's time (connect to last byte) and size. Compare the
//    decision latency with and without it.
//  - with --scrape-ms MS --alternate-s W: one daemon, the measured phase cut into windows of W
//    seconds that alternate between scraping every MS and not scraping (the endpoint serves in
//    both); each window's decision latency comes from the daemon (stats, reset at each boundary),
//    and each scraped window's p99 is compared with the mean of its unscraped neighbours, so a
//    drift of the machine or the daemon falls on both arms alike.
//
// This is a benchmark, not a test: it asserts nothing. Usage:
//   scheduler_bench [--clients N] [--gpus G] [--seconds S] [--warmup S] [--hold-ms MS] [--think-ms
//   MS]
//                   [--ping-ms MS] [--scrape-ms MS [--alternate-s W]] [--out FILE]
//                   [--scheduler PATH]
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <queue>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/json.h"
#include "common/protocol.h"
#include "common/unix_socket.h"
#include "control/client.h"

#ifndef NVSHARE_SCHEDULER_BIN
#define NVSHARE_SCHEDULER_BIN "nvshare-scheduler"
#endif

namespace {

using nvshare::Json;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;
namespace protocol = nvshare::protocol;

constexpr std::uint64_t Mi = 1ull << 20;
constexpr std::uint64_t Gi = 1ull << 30;

struct Options {
  int clients = 1000;
  int gpus = 8;
  double seconds = 10;
  double warmup = 2;
  double hold_ms = 2;      // mean hold time (exponential)
  double think_ms = 20;    // mean pause between release and the next request (exponential)
  double ping_ms = 100;    // ping period per client
  double scrape_ms = 0;    // GET /metrics period; 0: no metrics endpoint
  double alternate_s = 0;  // window length when scraped and unscraped windows alternate; 0: off
  std::string out = "scheduler-bench.json";
  std::string scheduler = NVSHARE_SCHEDULER_BIN;
};

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "scheduler_bench: %s\n", message.c_str());
  std::exit(1);
}

Options parse_options(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) die(arg + " needs a value");
      return argv[++i];
    };
    if (arg == "--clients") {
      o.clients = std::stoi(value());
    } else if (arg == "--gpus") {
      o.gpus = std::stoi(value());
    } else if (arg == "--seconds") {
      o.seconds = std::stod(value());
    } else if (arg == "--warmup") {
      o.warmup = std::stod(value());
    } else if (arg == "--hold-ms") {
      o.hold_ms = std::stod(value());
    } else if (arg == "--think-ms") {
      o.think_ms = std::stod(value());
    } else if (arg == "--ping-ms") {
      o.ping_ms = std::stod(value());
    } else if (arg == "--scrape-ms") {
      o.scrape_ms = std::stod(value());
    } else if (arg == "--alternate-s") {
      o.alternate_s = std::stod(value());
    } else if (arg == "--out") {
      o.out = value();
    } else if (arg == "--scheduler") {
      o.scheduler = value();
    } else if (arg == "--help" || arg == "-h") {
      std::printf(
          "scheduler_bench [--clients N] [--gpus G] [--seconds S] [--warmup S] [--hold-ms MS]\n"
          "                [--think-ms MS] [--ping-ms MS] [--scrape-ms MS [--alternate-s W]]\n"
          "                [--out FILE]\n"
          "                [--scheduler PATH]\n");
      std::exit(0);
    } else {
      die("unknown argument " + arg);
    }
  }
  if (o.clients < 1 || o.gpus < 1 || o.seconds <= 0) die("bad options");
  if (o.alternate_s < 0 || (o.alternate_s > 0 && o.scrape_ms <= 0)) {
    die("--alternate-s needs --scrape-ms");
  }
  return o;
}

// ---- the daemon ---------------------------------------------------------------------------------

struct Daemon {
  pid_t pid = -1;
  std::string dir;
  std::string socket;
  std::string control;
  int metrics_port = 0;
};

// A port that was free a moment ago on 127.0.0.1.
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = 0;
  if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  if (fd >= 0) ::close(fd);
  return port;
}

// One GET /metrics: the reply, or empty on failure.
std::string scrape_once(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  std::string got;
  const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      ::write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
    char buffer[1 << 16];
    ssize_t n = 0;
    while ((n = ::read(fd, buffer, sizeof buffer)) > 0)
      got.append(buffer, static_cast<std::size_t>(n));
  }
  ::close(fd);
  return got;
}

Daemon start_daemon(const Options& o) {
  Daemon d;
  char tmpl[] = "/tmp/nvshare-bench-XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) die("mkdtemp failed");
  d.dir = tmpl;
  d.socket = d.dir + "/scheduler.sock";
  d.control = d.dir + "/control.sock";
  // Half of the GPUs are small: 8 GiB, where the 2 GiB clients take turns four at a time.
  std::string capacity = "80Gi";
  std::string gpus;
  for (int g = 0; g < o.gpus; ++g) {
    if (g % 2 == 1) capacity += ",GPU-bench-" + std::to_string(g) + "=8Gi";
    gpus += (g == 0 ? "" : ",") + std::string("GPU-bench-") + std::to_string(g) + "=80Gi";
  }
  std::vector<std::string> args = {o.scheduler,
                                   "--socket",
                                   d.socket,
                                   "--control-socket",
                                   d.control,
                                   "--state-file",
                                   d.dir + "/state.json",
                                   "--gpus",
                                   gpus,
                                   "--capacity",
                                   capacity,
                                   "--reserve",
                                   "0",
                                   "--quantum",
                                   "3600",
                                   "--log-level",
                                   "warn"};
  if (o.scrape_ms > 0) {
    d.metrics_port = free_port();
    args.push_back("--metrics-address");
    args.push_back("127.0.0.1:" + std::to_string(d.metrics_port));
  }
  d.pid = ::fork();
  if (d.pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    const int log = ::open((d.dir + "/scheduler.log").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (log >= 0) ::dup2(log, STDERR_FILENO);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  for (int i = 0; i < 1000; ++i) {
    if (nvshare::connect_unix(d.control).ok()) return d;
    std::this_thread::sleep_for(5ms);
  }
  die("the scheduler did not start (see " + d.dir + "/scheduler.log)");
}

double daemon_cpu_seconds(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream fields(text.substr(close + 2));
  std::string field;
  std::vector<std::string> all;
  while (fields >> field) all.push_back(field);
  if (all.size() < 13) return 0;
  const double ticks = static_cast<double>(::sysconf(_SC_CLK_TCK));
  return (std::stod(all[11]) + std::stod(all[12])) / ticks;  // utime + stime
}

template <typename R>
nvshare::control::AnswerOf<R> control(const Daemon& d, const R& request) {
  auto reply = nvshare::control::ask(d.control, request, 10000);
  if (!reply) die(reply.error().message);
  if (reply.value().refused()) die("the scheduler refused: " + reply.value().refusal());
  return reply.value().answer();
}

// ---- the load generator -------------------------------------------------------------------------

enum class Phase { kConnecting, kIdle, kRequested, kHolding, kReleasing };

struct Client {
  nvshare::UniqueFd fd;
  protocol::FrameDecoder decoder;
  std::vector<std::uint8_t> out;
  int gpu = 0;
  bool roomy = true;
  std::uint64_t allocated = 0;
  Phase phase = Phase::kConnecting;
  std::uint64_t epoch = 0;
  Clock::time_point requested_at;
  Clock::time_point granted_at;
  bool want_writable = false;
};

struct Timer {
  Clock::time_point at;
  int client;
  int kind;  // 0: request, 1: release, 2: ping
  bool operator>(const Timer& o) const { return at > o.at; }
};

class LoadGenerator {
 public:
  LoadGenerator(const Options& o, const Daemon& d) : o_(o), d_(d), rng_(12345) {
    epoll_ = ::epoll_create1(EPOLL_CLOEXEC);
    clients_.resize(static_cast<std::size_t>(o.clients));
  }

  void connect_all() {
    for (int i = 0; i < o_.clients; ++i) {
      Client& c = clients_[static_cast<std::size_t>(i)];
      auto fd = nvshare::connect_unix(d_.socket);
      if (!fd) die("connect: " + fd.error().message);
      c.fd = std::move(fd).value();
      (void)nvshare::set_nonblocking(c.fd.get());
      c.gpu = i % o_.gpus;
      c.roomy = c.gpu % 2 == 0;
      c.allocated = c.roomy ? 256 * Mi : 2 * Gi;
      epoll_event ev{};
      ev.events = EPOLLIN;
      ev.data.u32 = static_cast<std::uint32_t>(i);
      ::epoll_ctl(epoll_, EPOLL_CTL_ADD, c.fd.get(), &ev);
      protocol::Hello hello;
      hello.pid = static_cast<std::uint32_t>(::getpid());
      hello.gpu_uuid = "GPU-bench-" + std::to_string(c.gpu);
      hello.gpu_memory_bytes = 80 * Gi;
      hello.capabilities = protocol::capability::kSwap | protocol::capability::kIdleRelease |
                           protocol::capability::kUsageReports;
      hello.process_name = "bench";
      send(i, hello);
    }
  }

  // Runs until `until`; counts what it saw while `measuring`.
  void run(Clock::time_point until, bool measuring) {
    measuring_ = measuring;
    epoll_event events[256];
    now_ = Clock::now();
    while (now_ < until) {
      int timeout_ms = 1;
      const auto now = now_;
      while (!timers_.empty() && timers_.top().at <= now) {
        const Timer t = timers_.top();
        timers_.pop();
        fire(t);
      }
      if (!timers_.empty()) {
        const auto wait =
            std::chrono::duration_cast<std::chrono::milliseconds>(timers_.top().at - now);
        timeout_ms = static_cast<int>(std::clamp<long long>(wait.count(), 0, 5));
      }
      const int n = ::epoll_wait(epoll_, events, 256, timeout_ms);
      now_ = Clock::now();
      for (int i = 0; i < n; ++i) {
        const int idx = static_cast<int>(events[i].data.u32);
        if (events[i].events & EPOLLOUT) flush(idx);
        if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read(idx);
      }
    }
  }

  void close_all() {
    for (Client& c : clients_) c.fd.reset();
  }

  std::vector<double> roomy_rtt_us;
  std::uint64_t grants = 0;
  std::uint64_t sent_frames = 0;
  std::uint64_t received_frames = 0;
  std::uint64_t waits = 0;
  std::uint64_t evictions = 0;
  std::uint64_t registered = 0;

 private:
  double exponential(double mean_ms) {
    std::exponential_distribution<double> dist(1.0 / mean_ms);
    return dist(rng_);
  }
  // Relative to the loop iteration's clock reading (one clock read per iteration keeps the
  // generator cheap enough that it, not the daemon, is never the thing measured).
  void schedule(int client, int kind, double in_ms) {
    timers_.push(Timer{now_ + std::chrono::microseconds(static_cast<long long>(in_ms * 1000)),
                       client, kind});
  }

  void send(int idx, const protocol::Message& message) {
    Client& c = clients_[static_cast<std::size_t>(idx)];
    (void)protocol::encode_to(message, c.out);
    if (measuring_) ++sent_frames;
    flush(idx);
  }

  void flush(int idx) {
    Client& c = clients_[static_cast<std::size_t>(idx)];
    while (!c.out.empty()) {
      const ssize_t n = ::send(c.fd.get(), c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        c.out.erase(c.out.begin(), c.out.begin() + n);
        continue;
      }
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      die(std::string("send: ") + std::strerror(errno));
    }
    const bool want = !c.out.empty();
    if (want != c.want_writable) {
      c.want_writable = want;
      epoll_event ev{};
      ev.events = EPOLLIN | (want ? EPOLLOUT : 0u);
      ev.data.u32 = static_cast<std::uint32_t>(idx);
      ::epoll_ctl(epoll_, EPOLL_CTL_MOD, c.fd.get(), &ev);
    }
  }

  void fire(const Timer& t) {
    Client& c = clients_[static_cast<std::size_t>(t.client)];
    switch (t.kind) {
      case 0:  // request
        if (c.phase != Phase::kIdle) return;
        c.phase = Phase::kRequested;
        c.requested_at = Clock::now();  // exact: this is what the round trip is measured from
        send(t.client, protocol::Request{});
        return;
      case 1:  // release after holding
        if (c.phase != Phase::kHolding) return;
        c.phase = Phase::kIdle;
        send(t.client,
             protocol::Released{
                 c.epoch,
                 static_cast<std::uint64_t>(
                     std::chrono::duration_cast<std::chrono::microseconds>(now_ - c.granted_at)
                         .count()),
                 0});
        schedule(t.client, 0, exponential(o_.think_ms));
        return;
      case 2:  // ping
        send(t.client, protocol::Ping{static_cast<std::uint64_t>(t.client)});
        schedule(t.client, 2, o_.ping_ms);
        return;
    }
  }

  void read(int idx) {
    Client& c = clients_[static_cast<std::size_t>(idx)];
    std::uint8_t buffer[16384];
    for (;;) {
      const ssize_t n = ::recv(c.fd.get(), buffer, sizeof buffer, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
      if (n <= 0) die("the scheduler closed client " + std::to_string(idx));
      c.decoder.feed(std::span<const std::uint8_t>(buffer, static_cast<std::size_t>(n)));
      if (static_cast<std::size_t>(n) < sizeof buffer) break;
    }
    for (;;) {
      auto frame = c.decoder.next();
      if (!frame) die("malformed frame from the scheduler: " + frame.error().message);
      if (!frame.value()) break;
      if (measuring_) ++received_frames;
      handle(idx, frame.value()->message);
    }
  }

  void handle(int idx, const protocol::Message& message) {
    Client& c = clients_[static_cast<std::size_t>(idx)];
    if (std::holds_alternative<protocol::Welcome>(message)) {
      ++registered;
      c.phase = Phase::kIdle;
      send(idx, protocol::Usage{c.allocated, 0, 0});
      schedule(idx, 0, exponential(o_.think_ms));
      schedule(idx, 2, o_.ping_ms * (static_cast<double>(idx % 100) / 100.0));
    } else if (const auto* grant = std::get_if<protocol::Grant>(&message)) {
      if (c.phase != Phase::kRequested) return;
      c.phase = Phase::kHolding;
      c.epoch = grant->epoch;
      c.granted_at = Clock::now();
      if (measuring_) {
        ++grants;
        if (c.roomy) {
          roomy_rtt_us.push_back(
              std::chrono::duration<double, std::micro>(c.granted_at - c.requested_at).count());
        }
      }
      send(idx, protocol::Usage{c.allocated, c.allocated, 0});
      schedule(idx, 1, exponential(o_.hold_ms));
    } else if (const auto* revoke = std::get_if<protocol::Revoke>(&message)) {
      if (c.phase == Phase::kHolding && revoke->epoch == c.epoch) {
        c.phase = Phase::kIdle;
        // As the library does: a swap-out is reported before the release that follows it.
        if (revoke->swap_out) send(idx, protocol::Usage{c.allocated, 0, 0});
        send(idx, protocol::Released{c.epoch, 0, 0});
        schedule(idx, 0, exponential(o_.think_ms));
      }
    } else if (std::holds_alternative<protocol::Evict>(message)) {
      // Memory kept on the device without a grant, moved out when asked.
      if (c.phase != Phase::kHolding) send(idx, protocol::Usage{c.allocated, 0, 0});
      if (measuring_) ++evictions;
    } else if (std::holds_alternative<protocol::Wait>(message)) {
      if (measuring_) ++waits;
    }
  }

  const Options& o_;
  const Daemon& d_;
  std::mt19937_64 rng_;
  int epoll_ = -1;
  std::vector<Client> clients_;
  std::priority_queue<Timer, std::vector<Timer>, std::greater<Timer>> timers_;
  bool measuring_ = false;
  Clock::time_point now_;
};

double percentile(std::vector<double>& values, double q) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const auto rank = static_cast<std::size_t>(std::ceil(q * static_cast<double>(values.size())));
  return values[std::min(values.size() - 1, rank == 0 ? 0 : rank - 1)];
}

std::string machine_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::string model = "unknown CPU";
  while (std::getline(in, line)) {
    if (line.rfind("model name", 0) == 0) {
      model = line.substr(line.find(':') + 2);
      break;
    }
  }
  return model + ", " + std::to_string(std::thread::hardware_concurrency()) + " logical CPUs";
}

struct Window {
  bool scraped = false;
  nvshare::control::LatencySummary latency;
  std::uint64_t frames = 0;  // in + out
};

// Each scraped window's p99 minus the mean p99 of its unscraped neighbours (µs).
std::vector<double> scraped_minus_neighbours(const std::vector<Window>& windows) {
  std::vector<double> differences;
  for (std::size_t i = 0; i < windows.size(); ++i) {
    if (!windows[i].scraped) continue;
    double sum = 0;
    int n = 0;
    for (std::size_t j : {i - 1, i + 1}) {
      if (j < windows.size() && !windows[j].scraped) {
        sum += windows[j].latency.p99;
        ++n;
      }
    }
    if (n > 0) differences.push_back(windows[i].latency.p99 - sum / n);
  }
  return differences;
}

Json windows_json(const std::vector<Window>& windows) {
  std::vector<double> on;
  std::vector<double> off;
  Json list = Json::array();
  for (const Window& w : windows) {
    (w.scraped ? on : off).push_back(w.latency.p99);
    Json row = Json::object();
    row.set("scraped", w.scraped);
    row.set("decisions", w.latency.count);
    row.set("p50_us", w.latency.p50);
    row.set("p99_us", w.latency.p99);
    row.set("max_us", w.latency.max);
    list.push_back(std::move(row));
  }
  std::vector<double> differences = scraped_minus_neighbours(windows);
  Json summary = Json::object();
  summary.set("windows", std::move(list));
  summary.set("scraped_p99_median_us", percentile(on, 0.5));
  summary.set("unscraped_p99_median_us", percentile(off, 0.5));
  summary.set("pairs", differences.size());
  summary.set("p99_difference_median_us", percentile(differences, 0.5));
  summary.set("p99_difference_p25_us", percentile(differences, 0.25));
  summary.set("p99_difference_p75_us", percentile(differences, 0.75));
  std::printf("\n  alternating windows of scraped and unscraped decisions:\n");
  std::printf("  %-58s %12.1f\n", "p99 median, scraped windows (us)", percentile(on, 0.5));
  std::printf("  %-58s %12.1f\n", "p99 median, unscraped windows (us)", percentile(off, 0.5));
  std::printf("  %-58s %12.1f\n", "p99 scraped - unscraped neighbours, median (us)",
              percentile(differences, 0.5));
  std::printf("  %-58s %5.1f %6.1f\n", "  quartiles (us)", percentile(differences, 0.25),
              percentile(differences, 0.75));
  std::printf("  %-58s %12zu\n", "  pairs", differences.size());
  return summary;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_options(argc, argv);
  ::signal(SIGPIPE, SIG_IGN);
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) == 0) {
    limit.rlim_cur = limit.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &limit);
  }

  Daemon daemon = start_daemon(o);
  LoadGenerator load(o, daemon);
  load.connect_all();
  load.run(Clock::now() +
               std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.warmup)),
           false);
  if (load.registered != static_cast<std::uint64_t>(o.clients)) {
    die("only " + std::to_string(load.registered) + " of " + std::to_string(o.clients) +
        " registered");
  }

  (void)control(daemon, nvshare::control::StatsRequest{true});
  const double cpu_before = daemon_cpu_seconds(daemon.pid);
  const auto started = Clock::now();
  // The scraper: GET /metrics every scrape_ms while the load runs.
  std::atomic<bool> scraping{o.scrape_ms > 0};
  // Whether the current window scrapes (always, unless windows alternate; they start unscraped).
  std::atomic<bool> scrape_window{o.alternate_s <= 0};
  std::vector<double> scrape_ms;
  std::size_t scrape_bytes = 0;
  std::vector<double> snapshot_ms;  // the loop's time to take each snapshot, as the daemon says
  std::thread scraper([&] {
    auto next = Clock::now();
    while (scraping.load()) {
      if (!scrape_window.load()) {
        std::this_thread::sleep_for(1ms);
        next = Clock::now();
        continue;
      }
      const auto t0 = Clock::now();
      const std::string reply = scrape_once(daemon.metrics_port);
      scrape_bytes = reply.size();
      const std::string key = "\nnvshare_metrics_snapshot_seconds ";
      if (const std::size_t at = reply.find(key); at != std::string::npos && scrape_ms.size() > 0) {
        snapshot_ms.push_back(1e3 * std::strtod(reply.c_str() + at + key.size(), nullptr));
      }
      scrape_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
      next += std::chrono::duration_cast<Clock::duration>(
          std::chrono::duration<double, std::milli>(o.scrape_ms));
      while (scraping.load() && Clock::now() < next) std::this_thread::sleep_for(1ms);
    }
  });
  // With --alternate-s: windows alternate; each one's decision latency, the daemon's stats reset
  // at every boundary.
  std::vector<Window> windows;
  std::atomic<bool> windowing{o.alternate_s > 0};
  std::thread windower([&] {
    const auto length =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(o.alternate_s));
    auto boundary = started;
    while (windowing.load()) {
      boundary += length;
      while (windowing.load() && Clock::now() < boundary) std::this_thread::sleep_for(1ms);
      if (!windowing.load()) break;
      const bool scraped = scrape_window.load();
      scrape_window = !scraped;
      const auto window = control(daemon, nvshare::control::StatsRequest{true});
      windows.push_back(
          {scraped, window.decision_latency_us, window.frames_in_total + window.frames_out_total});
    }
  });
  load.run(started + std::chrono::duration_cast<Clock::duration>(
                         std::chrono::duration<double>(o.seconds)),
           true);
  windowing = false;
  windower.join();
  scraping = false;
  scraper.join();
  std::sort(scrape_ms.begin(), scrape_ms.end());
  const double elapsed = std::chrono::duration<double>(Clock::now() - started).count();
  const double cpu = daemon_cpu_seconds(daemon.pid) - cpu_before;
  const auto stats = control(daemon, nvshare::control::StatsRequest{});
  const auto status = control(daemon, nvshare::control::StatusRequest{});

  const nvshare::control::LatencySummary& latency = stats.decision_latency_us;
  const auto frames_in = static_cast<double>(stats.frames_in_total);
  const auto frames_out = static_cast<double>(stats.frames_out_total);
  // Alternating windows reset the daemon's counters: add up what each window saw.
  double frames_all = frames_in + frames_out;
  for (const Window& w : windows) frames_all += static_cast<double>(w.frames);
  const double msgs_per_s = frames_all / elapsed;
  std::vector<double> rtt = load.roomy_rtt_us;
  const double rtt_p50 = percentile(rtt, 0.50);
  const double rtt_p99 = percentile(rtt, 0.99);
  const double rtt_max = rtt.empty() ? 0 : rtt.back();
  const std::size_t sessions = status.scheduler.client_sessions;

  std::printf(
      "\nnvshare-scheduler benchmark: %d clients over %d GPUs, %.1f s measured (after %.1f s "
      "warm-up)\n",
      o.clients, o.gpus, elapsed, o.warmup);
  std::printf("machine: %s\n\n", machine_description().c_str());
  std::printf("  %-58s %12s\n", "metric", "value");
  if (o.alternate_s > 0) {
    std::printf("  (decision latency and frames in/out: the last window only; windows below)\n");
  }
  std::printf("  %-58s %12.1f\n", "decision latency p50 (us, in daemon: read -> grant written)",
              latency.p50);
  std::printf("  %-58s %12.1f\n", "decision latency p90 (us)", latency.p90);
  std::printf("  %-58s %12.1f\n", "decision latency p99 (us)", latency.p99);
  std::printf("  %-58s %12.1f\n", "decision latency max (us)", latency.max);
  std::printf("  %-58s %12.0f\n", "decisions measured", static_cast<double>(latency.count));
  std::printf("  %-58s %12.1f\n", "request -> grant round trip p50 (us, clients, roomy GPUs)",
              rtt_p50);
  std::printf("  %-58s %12.1f\n", "request -> grant round trip p99 (us)", rtt_p99);
  std::printf("  %-58s %12.0f\n", "messages/s through the daemon (in + out)", msgs_per_s);
  std::printf("  %-58s %12.0f\n", "  frames in/s", frames_in / elapsed);
  std::printf("  %-58s %12.0f\n", "  frames out/s", frames_out / elapsed);
  std::printf("  %-58s %12.0f\n", "grants/s", static_cast<double>(load.grants) / elapsed);
  std::printf("  %-58s %12.0f\n", "memory waits/s", static_cast<double>(load.waits) / elapsed);
  std::printf("  %-58s %12.0f\n", "evictions/s", static_cast<double>(load.evictions) / elapsed);
  std::printf("  %-58s %12.1f\n", "daemon CPU (% of one core)", 100 * cpu / elapsed);
  std::printf("  %-58s %12zu\n", "client sessions at the end", sessions);
  if (o.scrape_ms > 0) {
    std::printf("  %-58s %12zu\n", "metrics scrapes (GET /metrics)", scrape_ms.size());
    std::printf("  %-58s %12.1f\n", "scrape time p50 (ms, connect -> last byte)",
                percentile(scrape_ms, 0.50));
    std::printf("  %-58s %12.1f\n", "scrape time p99 (ms)", percentile(scrape_ms, 0.99));
    std::printf("  %-58s %12.1f\n", "scrape time max (ms)",
                scrape_ms.empty() ? 0 : scrape_ms.back());
    std::printf("  %-58s %12zu\n", "scrape size (bytes)", scrape_bytes);
    std::printf("  %-58s %12.2f\n", "snapshot time in the daemon's loop p50 (ms)",
                percentile(snapshot_ms, 0.50));
    std::printf(
        "  %-58s %12.2f\n", "snapshot time max (ms)",
        snapshot_ms.empty() ? 0 : *std::max_element(snapshot_ms.begin(), snapshot_ms.end()));
  }

  Json out = Json::object();
  out.set("benchmark", "scheduler");
  out.set("machine", machine_description());
  out.set("clients", o.clients);
  out.set("gpus", o.gpus);
  out.set("seconds", elapsed);
  out.set("warmup_seconds", o.warmup);
  out.set("hold_ms_mean", o.hold_ms);
  out.set("think_ms_mean", o.think_ms);
  out.set("ping_ms", o.ping_ms);
  const Json stats_json = nvshare::control::encode(stats);
  out.set("decision_latency_us", *stats_json.find("decision_latency_us"));
  Json rtt_json = Json::object();
  rtt_json.set("count", rtt.size());
  rtt_json.set("p50", rtt_p50);
  rtt_json.set("p99", rtt_p99);
  rtt_json.set("max", rtt_max);
  out.set("request_grant_rtt_us_roomy", std::move(rtt_json));
  out.set("messages_per_s", msgs_per_s);
  out.set("frames_in_per_s", frames_in / elapsed);
  out.set("frames_out_per_s", frames_out / elapsed);
  out.set("grants_per_s", static_cast<double>(load.grants) / elapsed);
  out.set("waits_per_s", static_cast<double>(load.waits) / elapsed);
  out.set("evictions_per_s", static_cast<double>(load.evictions) / elapsed);
  out.set("daemon_cpu_percent", 100 * cpu / elapsed);
  out.set("daemon_stats", stats_json);
  if (o.scrape_ms > 0) {
    Json scrape = Json::object();
    scrape.set("period_ms", o.scrape_ms);
    scrape.set("count", scrape_ms.size());
    scrape.set("p50_ms", percentile(scrape_ms, 0.50));
    scrape.set("p99_ms", percentile(scrape_ms, 0.99));
    scrape.set("max_ms", scrape_ms.empty() ? 0 : scrape_ms.back());
    scrape.set("bytes", scrape_bytes);
    scrape.set("snapshot_p50_ms", percentile(snapshot_ms, 0.50));
    scrape.set("snapshot_max_ms",
               snapshot_ms.empty() ? 0 : *std::max_element(snapshot_ms.begin(), snapshot_ms.end()));
    out.set("metrics_scrape", std::move(scrape));
  }
  if (o.alternate_s > 0) out.set("alternating", windows_json(windows));
  std::ofstream(o.out) << out.dump_pretty() << "\n";
  std::printf("\nwrote %s\n", o.out.c_str());

  load.close_all();
  ::kill(daemon.pid, SIGTERM);
  int status_code = 0;
  ::waitpid(daemon.pid, &status_code, 0);
  (void)std::system(("rm -rf '" + daemon.dir + "'").c_str());
  return 0;
}
