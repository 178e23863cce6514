#include "common/metrics_endpoint.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "common/clock.h"
#include "common/log.h"

namespace nvshare {
namespace {

constexpr int kPollMs = 200;

Error sys_error(const std::string& what) { return make_error(what + ": " + std::strerror(errno)); }

std::string bound_address(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "?";
  char host[NI_MAXHOST] = {};
  char port[NI_MAXSERV] = {};
  if (getnameinfo(reinterpret_cast<sockaddr*>(&ss), len, host, sizeof host, port, sizeof port,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return "?";
  }
  const bool v6 = ss.ss_family == AF_INET6;
  return (v6 ? "[" + std::string(host) + "]" : std::string(host)) + ":" + port;
}

Result<UniqueFd> listen_on(const std::string& host, const std::string& port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), port.c_str(), &hints, &found);
  if (rc != 0) return make_error("metrics address " + host + ": " + gai_strerror(rc));
  std::string last = "no address";
  for (addrinfo* ai = found; ai != nullptr; ai = ai->ai_next) {
    UniqueFd fd(socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) {
      last = std::strerror(errno);
      continue;
    }
    const int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd.get(), ai->ai_addr, ai->ai_addrlen) == 0 && listen(fd.get(), 64) == 0) {
      freeaddrinfo(found);
      return fd;
    }
    last = std::strerror(errno);
  }
  freeaddrinfo(found);
  return make_error("metrics: cannot listen on " + host + ":" + port + ": " + last);
}

void set_timeouts(int fd, Duration timeout) {
  // Blocking from here on (the answer is written whole), each call bounded by what is left.
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(timeout).count();
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(us / 1000000);
  tv.tv_usec = static_cast<suseconds_t>(us % 1000000);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

// Writes all of `data` (blocking, with the socket's send timeout); false on error or timeout.
bool write_all(int fd, std::string_view data) {
  while (!data.empty()) {
    const ssize_t n = send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.remove_prefix(static_cast<std::size_t>(n));
  }
  return true;
}

void respond(int fd, std::string_view status, std::string_view content_type,
             std::string_view body) {
  std::string head = "HTTP/1.1 ";
  head += status;
  head += "\r\nContent-Type: ";
  head += content_type;
  head += "\r\nContent-Length: " + std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n";
  if (write_all(fd, head)) write_all(fd, body);
}

// The request line of a complete request head in `in`; nullopt while the head is incomplete, and
// an empty line when it will never parse (too long, or no request line).
std::optional<std::string> request_line(const std::string& in) {
  if (in.find("\r\n\r\n") == std::string::npos && in.find("\n\n") == std::string::npos) {
    if (in.size() >= MetricsEndpoint::kMaxRequestBytes) return std::string();
    return std::nullopt;
  }
  const std::size_t eol = in.find_first_of("\r\n");
  return eol == std::string::npos ? std::string() : in.substr(0, eol);
}

MonoTime steady_now() { return SteadyClock::instance().now(); }

}  // namespace

Result<std::pair<std::string, std::string>> split_host_port(std::string_view address) {
  const std::size_t colon = address.rfind(':');
  const std::string_view port = colon == std::string_view::npos ? "" : address.substr(colon + 1);
  if (port.empty() || port.size() > 5 ||
      port.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(std::string(port)) > 65535) {
    return make_error("metrics address \"" + std::string(address) +
                      "\" is not host:port with a port of 0..65535");
  }
  std::string_view host = address.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(std::string(host), std::string(port));
}

Status store_metrics_address(std::string_view value, std::string& out) {
  if (!value.empty()) {
    auto parts = split_host_port(value);
    if (!parts.ok()) return parts.error();
  }
  out = std::string(value);
  return Status::Ok();
}

Result<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::start(const std::string& address,
                                                                std::string component,
                                                                Render render) {
  auto parts = split_host_port(address);
  if (!parts.ok()) return parts.error();
  auto listener = listen_on(parts.value().first, parts.value().second);
  if (!listener.ok()) return listener.error();
  std::unique_ptr<MetricsEndpoint> endpoint(
      new MetricsEndpoint(std::move(component), std::move(render)));
  endpoint->listener_ = std::move(listener).value();
  endpoint->address_ = bound_address(endpoint->listener_.get());
  endpoint->stop_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!endpoint->stop_.valid()) return sys_error("metrics: eventfd");
  MetricsEndpoint* self = endpoint.get();
  endpoint->thread_ = std::thread([self] { self->serve(); });
  return endpoint;
}

MetricsEndpoint::MetricsEndpoint(std::string component, Render render)
    : component_(std::move(component)), render_(std::move(render)) {}

MetricsEndpoint::~MetricsEndpoint() {
  if (!thread_.joinable()) return;
  const std::uint64_t one = 1;
  if (write(stop_.get(), &one, sizeof one) < 0)
    NVSHARE_WARN("metrics: stop: %s", std::strerror(errno));
  thread_.join();
}

// One thread, several connections at once (kMaxConnections), each with a deadline for its whole
// request and answer (kIoTimeout): a scraper that sends its request a byte at a time, or says
// nothing, holds one place for that long at most, and when every place is taken the connection
// that has waited longest gives its place up. The stop signal is seen between any two steps.
void MetricsEndpoint::serve() {
  struct Connection {
    UniqueFd fd;
    MonoTime deadline;
    std::string in;
  };
  std::vector<Connection> open;
  std::vector<pollfd> fds;
  while (true) {
    fds.assign({{listener_.get(), POLLIN, 0}, {stop_.get(), POLLIN, 0}});
    for (const Connection& c : open) fds.push_back({c.fd.get(), POLLIN, 0});
    const int n = poll(fds.data(), fds.size(), kPollMs);
    if (n < 0 && errno != EINTR) {
      NVSHARE_WARN("metrics: poll: %s; the metrics endpoint stops", std::strerror(errno));
      return;
    }
    if (fds[1].revents != 0) return;
    const MonoTime now = steady_now();
    for (std::size_t i = 0; i < open.size(); ++i) {
      Connection& c = open[i];
      if ((fds[i + 2].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[2048];
      const ssize_t got = recv(c.fd.get(), buffer, sizeof buffer, MSG_DONTWAIT);
      if (got < 0 && (errno == EAGAIN || errno == EINTR)) continue;
      if (got <= 0) {
        c.fd.reset();
        continue;
      }
      c.in.append(buffer, static_cast<std::size_t>(got));
      if (const std::optional<std::string> line = request_line(c.in)) {
        set_timeouts(c.fd.get(),
                     std::max(c.deadline - now, Duration(std::chrono::milliseconds(1))));
        answer(c.fd.get(), *line);
        c.fd.reset();
      }
    }
    std::erase_if(open, [&](const Connection& c) { return !c.fd.valid() || c.deadline <= now; });
    if ((fds[0].revents & POLLIN) == 0) continue;
    UniqueFd conn(accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!conn.valid()) continue;  // gone already, or out of descriptors: the scraper retries
    if (open.size() >= kMaxConnections) open.erase(open.begin());  // the longest waiting
    open.push_back({std::move(conn), now + kIoTimeout, {}});
  }
}

// The exposition, rendered at most once per kRenderCache: scrapers that come together share one
// rendering (and one snapshot of the scheduler's state).
Result<std::string> MetricsEndpoint::rendered() {
  const MonoTime now = steady_now();
  if (cached_ && now - cached_at_ < kRenderCache) return *cached_;
  Result<std::string> body = render_();
  if (!body.ok()) return body;
  cached_ = body.value();
  cached_at_ = now;
  return body;
}

void MetricsEndpoint::answer(int fd, const std::string& line) {
  constexpr std::string_view kText = "text/plain; charset=utf-8";
  const std::size_t sp1 = line.find(' ');
  const std::size_t sp2 = sp1 == std::string::npos ? sp1 : line.find(' ', sp1 + 1);
  if (sp1 == std::string::npos || sp2 == std::string::npos) {
    respond(fd, "400 Bad Request", kText, "bad request\n");
    return;
  }
  const std::string method = line.substr(0, sp1);
  std::string path = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (const std::size_t q = path.find('?'); q != std::string::npos) path.resize(q);
  if (method != "GET") {
    respond(fd, "405 Method Not Allowed", kText, "only GET\n");
    return;
  }
  if (path == "/") {
    respond(fd, "200 OK", kText, component_ + ": metrics at /metrics\n");
    return;
  }
  if (path != "/metrics") {
    respond(fd, "404 Not Found", kText, "not found\n");
    return;
  }
  Result<std::string> body = rendered();
  if (!body.ok()) {
    respond(fd, "503 Service Unavailable", kText, body.error().message + "\n");
    return;
  }
  respond(fd, "200 OK", "text/plain; version=0.0.4; charset=utf-8", body.value());
}

}  // namespace nvshare
