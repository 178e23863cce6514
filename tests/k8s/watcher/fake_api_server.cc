#include "fake_api_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

namespace nvshare::testing {
namespace {

using namespace std::chrono_literals;

using nlohmann::json;

bool send_all(int fd, const std::string& data) {
  std::size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    sent += static_cast<std::size_t>(n);
  }
  return true;
}

std::string url_decode(const std::string& text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size()) {
      out += static_cast<char>(std::stoi(text.substr(i + 1, 2), nullptr, 16));
      i += 2;
    } else if (text[i] == '+') {
      out += ' ';
    } else {
      out += text[i];
    }
  }
  return out;
}

std::string lower(std::string text) {
  for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return text;
}

// Reads one request (headers and a Content-Length body); false on EOF or garbage.
bool read_request(int fd, RecordedRequest* request) {
  std::string data;
  char buffer[4096];
  std::size_t header_end = std::string::npos;
  while ((header_end = data.find("\r\n\r\n")) == std::string::npos) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    data.append(buffer, static_cast<std::size_t>(n));
    if (data.size() > (1u << 20)) return false;
  }
  const std::string head = data.substr(0, header_end);
  std::string body = data.substr(header_end + 4);
  std::size_t line_end = head.find("\r\n");
  const std::string request_line = head.substr(0, line_end);
  const auto first_space = request_line.find(' ');
  const auto second_space = request_line.find(' ', first_space + 1);
  if (first_space == std::string::npos || second_space == std::string::npos) return false;
  request->method = request_line.substr(0, first_space);
  request->target = request_line.substr(first_space + 1, second_space - first_space - 1);
  while (line_end != std::string::npos) {
    const std::size_t start = line_end + 2;
    line_end = head.find("\r\n", start);
    const std::string line =
        head.substr(start, line_end == std::string::npos ? std::string::npos : line_end - start);
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string value = line.substr(colon + 1);
    while (!value.empty() && value.front() == ' ') value.erase(0, 1);
    request->headers[lower(line.substr(0, colon))] = value;
  }
  const auto query_start = request->target.find('?');
  request->path = request->target.substr(0, query_start);
  if (query_start != std::string::npos) {
    std::string query = request->target.substr(query_start + 1);
    std::size_t pos = 0;
    while (pos <= query.size()) {
      std::size_t amp = query.find('&', pos);
      if (amp == std::string::npos) amp = query.size();
      const std::string pair = query.substr(pos, amp - pos);
      const auto eq = pair.find('=');
      if (!pair.empty()) {
        request->query[url_decode(pair.substr(0, eq))] =
            eq == std::string::npos ? "" : url_decode(pair.substr(eq + 1));
      }
      pos = amp + 1;
    }
  }
  std::size_t length = 0;
  if (auto it = request->headers.find("content-length"); it != request->headers.end()) {
    length = std::stoul(it->second);
  }
  while (body.size() < length) {
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    body.append(buffer, static_cast<std::size_t>(n));
  }
  request->body = body.substr(0, length);
  return true;
}

std::string response(int status, const std::string& reason, const std::string& body) {
  return "HTTP/1.1 " + std::to_string(status) + " " + reason +
         "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
         "\r\nConnection: close\r\n\r\n" + body;
}

json status_object(int code, const std::string& reason, const std::string& message) {
  return {{"kind", "Status"},    {"apiVersion", "v1"}, {"metadata", json::object()},
          {"status", "Failure"}, {"message", message}, {"reason", reason},
          {"code", code}};
}

std::string chunk(const std::string& data) {
  char size[32];
  std::snprintf(size, sizeof size, "%zx\r\n", data.size());
  return size + data + "\r\n";
}

std::string node_of(const json& pod) {
  auto spec = pod.find("spec");
  if (spec == pod.end() || !spec->contains("nodeName")) return {};
  return (*spec)["nodeName"].get<std::string>();
}

std::string selected_node(const RecordedRequest& request) {
  auto it = request.query.find("fieldSelector");
  if (it == request.query.end()) return {};
  const std::string prefix = "spec.nodeName=";
  return it->second.rfind(prefix, 0) == 0 ? it->second.substr(prefix.size()) : std::string();
}

}  // namespace

json make_pod(const std::string& uid, const std::string& name, const std::string& node,
              const std::map<std::string, std::string>& annotations, bool requests_resource,
              const std::string& resource, const std::string& namespace_name) {
  json container = {{"name", "main"}, {"image", "busybox"}};
  container["resources"] = json::object();
  if (requests_resource) container["resources"]["limits"] = {{resource, "1"}};
  json metadata = {{"uid", uid}, {"name", name}, {"namespace", namespace_name}};
  if (!annotations.empty()) metadata["annotations"] = annotations;
  return {{"apiVersion", "v1"},
          {"kind", "Pod"},
          {"metadata", metadata},
          {"spec", {{"nodeName", node}, {"containers", json::array({container})}}},
          {"status", {{"phase", "Running"}}}};
}

Result<std::unique_ptr<FakeApiServer>> FakeApiServer::start() {
  std::unique_ptr<FakeApiServer> server(new FakeApiServer());
  server->listen_fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (server->listen_fd_ < 0) return make_error(std::string("socket: ") + std::strerror(errno));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  if (::bind(server->listen_fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(server->listen_fd_, 64) != 0) {
    return make_error(std::string("bind/listen: ") + std::strerror(errno));
  }
  socklen_t length = sizeof address;
  ::getsockname(server->listen_fd_, reinterpret_cast<sockaddr*>(&address), &length);
  server->port_ = ntohs(address.sin_port);
  if (::pipe2(server->wake_pipe_, O_CLOEXEC) != 0) {
    return make_error(std::string("pipe: ") + std::strerror(errno));
  }
  server->accept_thread_ = std::thread([s = server.get()] { s->accept_loop(); });
  return server;
}

FakeApiServer::~FakeApiServer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (wake_pipe_[1] >= 0) (void)!::write(wake_pipe_[1], "x", 1);
  if (accept_thread_.joinable()) accept_thread_.join();
  std::vector<std::thread> connections;
  {
    std::lock_guard lock(mu_);
    connections.swap(connections_);
  }
  for (auto& thread : connections) thread.join();
  for (int fd : {listen_fd_, wake_pipe_[0], wake_pipe_[1]}) {
    if (fd >= 0) ::close(fd);
  }
}

void FakeApiServer::accept_loop() {
  while (true) {
    pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    connections_.emplace_back([this, fd] { serve(fd); });
  }
}

void FakeApiServer::serve(int fd) {
  RecordedRequest request;
  if (!read_request(fd, &request)) {
    ::close(fd);
    return;
  }
  {
    std::lock_guard lock(mu_);
    requests_.push_back(request);
  }
  if (request.method == "GET" && request.path == "/api/v1/pods") {
    if (request.query.contains("watch") && request.query["watch"] != "0" &&
        request.query["watch"] != "false") {
      serve_watch(fd, request);
      ::close(fd);
      return;
    }
    const std::string node = selected_node(request);
    json list = {{"apiVersion", "v1"}, {"kind", "PodList"}, {"items", json::array()}};
    {
      std::lock_guard lock(mu_);
      list["metadata"] = {{"resourceVersion", std::to_string(version_)}};
      for (const auto& [uid, pod] : pods_) {
        if (node.empty() || node_of(pod) == node) list["items"].push_back(pod);
      }
    }
    send_all(fd, response(200, "OK", list.dump()));
  } else if (request.method == "POST" && request.path.rfind("/api/v1/namespaces/", 0) == 0 &&
             request.path.size() > 7 && request.path.substr(request.path.size() - 7) == "/events") {
    json event = json::parse(request.body, nullptr, false);
    if (event.is_discarded()) {
      send_all(fd, response(400, "Bad Request",
                            status_object(400, "BadRequest", "invalid JSON").dump()));
    } else {
      {
        std::lock_guard lock(mu_);
        events_.push_back(event);
      }
      send_all(fd, response(201, "Created", event.dump()));
    }
  } else {
    send_all(fd, response(404, "Not Found",
                          status_object(404, "NotFound", "no route " + request.path).dump()));
  }
  ::close(fd);
}

void FakeApiServer::serve_watch(int fd, const RecordedRequest& request) {
  const std::string node = selected_node(request);
  std::uint64_t from = 0;
  if (auto it = request.query.find("resourceVersion");
      it != request.query.end() && !it->second.empty()) {
    from = std::stoull(it->second);
  }
  int timeout_seconds = 1800;
  if (auto it = request.query.find("timeoutSeconds"); it != request.query.end()) {
    timeout_seconds = std::stoi(it->second);
  }
  const bool bookmarks = request.query.contains("allowWatchBookmarks") &&
                         request.query.at("allowWatchBookmarks") == "true";
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_seconds);
  const std::string too_old = "too old resource version: " + std::to_string(from);

  std::unique_lock lock(mu_);
  if (from < expired_before_) {
    const json status = status_object(410, "Expired", too_old);
    const GoneStyle style = gone_style_;
    lock.unlock();
    if (style == GoneStyle::kHttpStatus) {
      send_all(fd, response(410, "Gone", status.dump()));
    } else {
      const json event = {{"type", "ERROR"}, {"object", status}};
      send_all(fd,
               "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: "
               "chunked\r\nConnection: close\r\n\r\n" +
                   chunk(event.dump() + "\n") + chunk(""));
    }
    return;
  }
  ++open_watches_;
  const std::uint64_t end_generation = end_generation_;
  const std::uint64_t drop_generation = drop_generation_;
  lock.unlock();
  bool alive = send_all(fd,
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: "
                        "chunked\r\nConnection: close\r\n\r\n");
  lock.lock();
  std::size_t next = 0;
  bool dropped = false;
  while (alive) {
    std::string out;
    for (; next < history_.size(); ++next) {
      const Change& change = history_[next];
      if (change.version <= from) continue;
      if (change.bookmark) {
        if (!bookmarks) continue;
      } else if (!node.empty() && node_of(change.object) != node) {
        continue;
      }
      out += chunk(json{{"type", change.type}, {"object", change.object}}.dump() + "\n");
    }
    if (!out.empty()) {
      lock.unlock();
      alive = send_all(fd, out);
      lock.lock();
      continue;
    }
    if (stopping_ || end_generation_ != end_generation ||
        std::chrono::steady_clock::now() >= deadline) {
      break;
    }
    if (drop_generation_ != drop_generation) {
      dropped = true;
      break;
    }
    // Wake now and then to notice a client that went away (the watcher stopped or reconnected).
    changed_.wait_until(lock, std::min(deadline, std::chrono::steady_clock::now() + 20ms));
    pollfd peer{fd, POLLIN | POLLRDHUP, 0};
    if (::poll(&peer, 1, 0) > 0 && (peer.revents & (POLLIN | POLLRDHUP | POLLHUP | POLLERR))) {
      alive = false;
    }
  }
  --open_watches_;
  lock.unlock();
  if (alive && !dropped) {
    send_all(fd, chunk(""));
  } else if (dropped) {
    // Cut the connection mid-stream: no terminating chunk, and a reset rather than a FIN.
    linger option{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &option, sizeof option);
  }
}

std::string FakeApiServer::record_change(const std::string& type, json object, bool bookmark) {
  std::string version;
  {
    std::lock_guard lock(mu_);
    ++version_;
    version = std::to_string(version_);
    object["metadata"]["resourceVersion"] = version;
    if (!bookmark) {
      const std::string uid = object["metadata"]["uid"].get<std::string>();
      if (type == "DELETED") {
        pods_.erase(uid);
      } else {
        pods_[uid] = object;
      }
    }
    history_.push_back(Change{version_, type, std::move(object), bookmark});
  }
  changed_.notify_all();
  return version;
}

std::string FakeApiServer::add_pod(json pod) {
  return record_change("ADDED", std::move(pod), false);
}

std::string FakeApiServer::modify_pod(json pod) {
  return record_change("MODIFIED", std::move(pod), false);
}

std::string FakeApiServer::delete_pod(const std::string& uid) {
  json pod;
  {
    std::lock_guard lock(mu_);
    auto it = pods_.find(uid);
    if (it == pods_.end()) return {};
    pod = it->second;
  }
  return record_change("DELETED", std::move(pod), false);
}

void FakeApiServer::replace_pod_unseen(json pod) {
  std::lock_guard lock(mu_);
  ++version_;
  pod["metadata"]["resourceVersion"] = std::to_string(version_);
  const std::string uid = pod["metadata"]["uid"].get<std::string>();
  pods_[uid] = std::move(pod);
}

void FakeApiServer::delete_pod_unseen(const std::string& uid) {
  std::lock_guard lock(mu_);
  ++version_;
  pods_.erase(uid);
}

std::string FakeApiServer::bookmark() {
  return record_change(
      "BOOKMARK", json{{"kind", "Pod"}, {"apiVersion", "v1"}, {"metadata", json::object()}}, true);
}

void FakeApiServer::expire_history() {
  std::lock_guard lock(mu_);
  // The cluster's version moves on (other objects change) and older versions are compacted away.
  ++version_;
  expired_before_ = version_;
}

void FakeApiServer::set_gone_style(GoneStyle style) {
  std::lock_guard lock(mu_);
  gone_style_ = style;
}

void FakeApiServer::end_watches() {
  {
    std::lock_guard lock(mu_);
    ++end_generation_;
  }
  changed_.notify_all();
}

void FakeApiServer::drop_watches() {
  {
    std::lock_guard lock(mu_);
    ++drop_generation_;
  }
  changed_.notify_all();
}

std::vector<RecordedRequest> FakeApiServer::requests() const {
  std::lock_guard lock(mu_);
  return requests_;
}

std::vector<RecordedRequest> FakeApiServer::watch_requests() const {
  std::vector<RecordedRequest> out;
  for (auto& request : requests()) {
    if (request.path == "/api/v1/pods" && request.query.contains("watch")) out.push_back(request);
  }
  return out;
}

std::vector<json> FakeApiServer::posted_events() const {
  std::lock_guard lock(mu_);
  return events_;
}

int FakeApiServer::open_watches() const {
  std::lock_guard lock(mu_);
  return open_watches_;
}

std::uint64_t FakeApiServer::resource_version() const {
  std::lock_guard lock(mu_);
  return version_;
}

}  // namespace nvshare::testing
