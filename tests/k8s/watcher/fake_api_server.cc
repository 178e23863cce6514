#include "fake_api_server.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

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

// ---- TLS: a CA and a certificate for 127.0.0.1, made at start ---------------------------------

struct X509Deleter {
  void operator()(X509* x) const { X509_free(x); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
using X509Ptr = std::unique_ptr<X509, X509Deleter>;
using KeyPtr = std::unique_ptr<EVP_PKEY, KeyDeleter>;

bool add_extension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX context;
  X509V3_set_ctx_nodb(&context);
  X509V3_set_ctx(&context, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* extension = X509V3_EXT_conf_nid(nullptr, &context, nid, value);
  if (extension == nullptr) return false;
  const bool ok = X509_add_ext(cert, extension, -1) == 1;
  X509_EXTENSION_free(extension);
  return ok;
}

// A certificate for `key`, signed by the issuer (itself when `issuer` is null).
X509Ptr make_certificate(const char* common_name, EVP_PKEY* key, X509* issuer, EVP_PKEY* issuer_key,
                         long serial, bool ca) {
  X509Ptr cert(X509_new());
  X509_set_version(cert.get(), 2);
  ASN1_INTEGER_set(X509_get_serialNumber(cert.get()), serial);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600);
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 7 * 24 * 3600);
  X509_set_pubkey(cert.get(), key);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                             reinterpret_cast<const unsigned char*>(common_name), -1, -1, 0);
  X509_set_issuer_name(cert.get(), issuer != nullptr ? X509_get_subject_name(issuer) : name);
  X509* signer = issuer != nullptr ? issuer : cert.get();
  bool ok = true;
  if (ca) {
    ok &= add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:TRUE");
    ok &= add_extension(cert.get(), signer, NID_key_usage, "critical,keyCertSign,cRLSign");
    ok &= add_extension(cert.get(), signer, NID_subject_key_identifier, "hash");
  } else {
    ok &= add_extension(cert.get(), signer, NID_basic_constraints, "critical,CA:FALSE");
    ok &= add_extension(cert.get(), signer, NID_key_usage, "critical,digitalSignature");
    ok &= add_extension(cert.get(), signer, NID_ext_key_usage, "serverAuth");
    ok &= add_extension(cert.get(), signer, NID_subject_alt_name, "IP:127.0.0.1");
    ok &= add_extension(cert.get(), signer, NID_authority_key_identifier, "keyid:always");
  }
  if (!ok || X509_sign(cert.get(), issuer_key != nullptr ? issuer_key : key, EVP_sha256()) == 0) {
    return nullptr;
  }
  return cert;
}

std::string pem_of(X509* cert) {
  BIO* bio = BIO_new(BIO_s_mem());
  PEM_write_bio_X509(bio, cert);
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio, &data);
  std::string pem(data, static_cast<std::size_t>(size));
  BIO_free(bio);
  return pem;
}

// A server context with a fresh CA and a certificate for 127.0.0.1; the CA's PEM in `ca_pem`.
SSL_CTX* make_tls_context(std::string* ca_pem) {
  KeyPtr ca_key(EVP_EC_gen("P-256"));
  KeyPtr server_key(EVP_EC_gen("P-256"));
  if (!ca_key || !server_key) return nullptr;
  X509Ptr ca = make_certificate("nvshare test CA", ca_key.get(), nullptr, nullptr, 1, true);
  if (!ca) return nullptr;
  X509Ptr server =
      make_certificate("127.0.0.1", server_key.get(), ca.get(), ca_key.get(), 2, false);
  if (!server) return nullptr;
  SSL_CTX* context = SSL_CTX_new(TLS_server_method());
  if (context == nullptr || SSL_CTX_use_certificate(context, server.get()) != 1 ||
      SSL_CTX_use_PrivateKey(context, server_key.get()) != 1) {
    SSL_CTX_free(context);
    return nullptr;
  }
  SSL_CTX_set_min_proto_version(context, TLS1_2_VERSION);
  *ca_pem = pem_of(ca.get());
  return context;
}

int listen_loopback(int* port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
      ::listen(fd, 64) != 0) {
    ::close(fd);
    return -1;
  }
  socklen_t length = sizeof address;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length);
  *port = ntohs(address.sin_port);
  return fd;
}

int connect_loopback(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<std::uint16_t>(port));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

std::string base64(const std::string& data) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  std::size_t i = 0;
  for (; i + 2 < data.size(); i += 3) {
    const unsigned v = (static_cast<unsigned char>(data[i]) << 16) |
                       (static_cast<unsigned char>(data[i + 1]) << 8) |
                       static_cast<unsigned char>(data[i + 2]);
    for (int shift : {18, 12, 6, 0}) out += kAlphabet[(v >> shift) & 63];
  }
  if (i < data.size()) {
    unsigned v = static_cast<unsigned char>(data[i]) << 16;
    if (i + 1 < data.size()) v |= static_cast<unsigned char>(data[i + 1]) << 8;
    out += kAlphabet[(v >> 18) & 63];
    out += kAlphabet[(v >> 12) & 63];
    out += i + 1 < data.size() ? kAlphabet[(v >> 6) & 63] : '=';
    out += '=';
  }
  return out;
}

// ---- what the API server's validation says of an Event ----------------------------------------

bool dns1123_subdomain(const std::string& name) {
  if (name.empty() || name.size() > 253) return false;
  const auto alnum = [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); };
  if (!alnum(name.front()) || !alnum(name.back())) return false;
  return std::all_of(name.begin(), name.end(),
                     [&](char c) { return alnum(c) || c == '-' || c == '.'; });
}

std::string string_at(const json& object, const char* key) {
  auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : std::string();
}

std::optional<std::string> unknown_field(const json& object,
                                         std::initializer_list<const char*> known,
                                         const std::string& where) {
  for (auto it = object.begin(); it != object.end(); ++it) {
    if (std::none_of(known.begin(), known.end(), [&](const char* k) { return it.key() == k; })) {
      return "strict decoding error: unknown field \"" + where + it.key() + "\"";
    }
  }
  return std::nullopt;
}

std::string selected_node(const RecordedRequest& request) {
  auto it = request.query.find("fieldSelector");
  if (it == request.query.end()) return {};
  const std::string prefix = "spec.nodeName=";
  return it->second.rfind(prefix, 0) == 0 ? it->second.substr(prefix.size()) : std::string();
}

}  // namespace

std::optional<std::pair<int, std::string>> check_event(const json& event,
                                                       const std::string& path_namespace) {
  if (!event.is_object()) return std::make_pair(400, std::string("the body is not an object"));
  if (auto unknown =
          unknown_field(event,
                        {"apiVersion", "kind", "metadata", "involvedObject", "reason", "message",
                         "source", "firstTimestamp", "lastTimestamp", "count", "type", "eventTime",
                         "series", "action", "related", "reportingComponent", "reportingInstance"},
                        "")) {
    return std::make_pair(400, *unknown);
  }
  if (string_at(event, "kind") != "Event" || string_at(event, "apiVersion") != "v1") {
    return std::make_pair(400, std::string("the object is not a v1 Event"));
  }
  const json metadata = event.value("metadata", json::object());
  if (auto unknown = unknown_field(
          metadata, {"name", "generateName", "namespace", "labels", "annotations"}, "metadata.")) {
    return std::make_pair(400, *unknown);
  }
  const std::string event_namespace = string_at(metadata, "namespace");
  if (!event_namespace.empty() && event_namespace != path_namespace) {
    return std::make_pair(400, std::string("the namespace of the provided object does not match "
                                           "the namespace sent on the request"));
  }
  std::string name = string_at(metadata, "name");
  if (name.empty()) {
    const std::string base = string_at(metadata, "generateName");
    if (base.empty()) return std::make_pair(400, std::string("name or generateName is required"));
    name = base.substr(0, 58) + "abcde";
  }
  std::vector<std::string> errors;
  if (!dns1123_subdomain(name)) errors.push_back("metadata.name: Invalid value: \"" + name + "\"");
  const json involved = event.value("involvedObject", json::object());
  const std::string involved_namespace = string_at(involved, "namespace");
  const bool new_style = !string_at(event, "eventTime").empty();
  const bool namespace_ok =
      involved_namespace.empty()
          ? (new_style ? (path_namespace == "default" || path_namespace == "kube-system")
                       : (path_namespace.empty() || path_namespace == "default"))
          : (new_style || involved_namespace == path_namespace);
  if (!namespace_ok) {
    errors.push_back("involvedObject.namespace: Invalid value: \"" + involved_namespace +
                     "\": does not match event.namespace");
  }
  if (new_style) {
    const auto limited = [&](const char* field, std::size_t limit, bool required) {
      const std::string value = string_at(event, field);
      if (required && value.empty()) errors.push_back(std::string(field) + ": Required value");
      if (value.size() > limit) {
        errors.push_back(std::string(field) + ": can have at most " + std::to_string(limit) +
                         " characters");
      }
    };
    limited("reportingComponent", 253, true);
    limited("reportingInstance", 128, true);
    limited("action", 128, true);
    limited("reason", 128, true);
    limited("message", 1024, false);
  }
  if (!dns1123_subdomain(path_namespace)) {
    errors.push_back("namespace: Invalid value: \"" + path_namespace + "\"");
  }
  if (errors.empty()) return std::nullopt;
  std::string message = "Event \"" + name + "\" is invalid: ";
  for (std::size_t i = 0; i < errors.size(); ++i) message += (i ? ", " : "") + errors[i];
  return std::make_pair(422, message);
}

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

Result<std::unique_ptr<FakeApiServer>> FakeApiServer::start(Options options) {
  std::unique_ptr<FakeApiServer> server(new FakeApiServer());
  server->options_ = std::move(options);
  server->listen_fd_ = listen_loopback(&server->port_);
  server->tls_listen_fd_ = listen_loopback(&server->tls_port_);
  if (server->listen_fd_ < 0 || server->tls_listen_fd_ < 0) {
    return make_error(std::string("bind/listen: ") + std::strerror(errno));
  }
  server->tls_context_ = make_tls_context(&server->ca_pem_);
  if (server->tls_context_ == nullptr) return make_error("cannot make the test CA and certificate");
  if (::pipe2(server->wake_pipe_, O_CLOEXEC) != 0) {
    return make_error(std::string("pipe: ") + std::strerror(errno));
  }
  server->accept_thread_ =
      std::thread([s = server.get()] { s->accept_loop(s->listen_fd_, &FakeApiServer::serve); });
  server->tls_accept_thread_ =
      std::thread([s = server.get()] { s->accept_loop(s->tls_listen_fd_, &FakeApiServer::relay); });
  return server;
}

std::string FakeApiServer::kubeconfig(const std::string& token) const {
  return "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster:\n    server: " + url() +
         "\n    certificate-authority-data: " + base64(ca_pem_) +
         "\ncontexts:\n- name: fake\n  context:\n    cluster: fake\n    user: watcher\n"
         "current-context: fake\nusers:\n- name: watcher\n  user:\n    token: " +
         token + "\n";
}

void FakeApiServer::add_namespace(const std::string& name) {
  std::lock_guard lock(mu_);
  namespaces_.insert(name);
}

// One TLS connection: the handshake, then bytes both ways between it and the plain server. A
// reset of the plain side (a dropped watch) resets the client's connection too.
void FakeApiServer::relay(int client_fd) {
  // SSL_write to a client that went away raises SIGPIPE on this thread (OpenSSL writes with
  // write(2)): blocked here, it stays pending on the thread and ends with it, never killing the
  // test.
  sigset_t pipe;
  sigemptyset(&pipe);
  sigaddset(&pipe, SIGPIPE);
  ::pthread_sigmask(SIG_BLOCK, &pipe, nullptr);
  SSL* ssl = SSL_new(static_cast<SSL_CTX*>(tls_context_));
  SSL_set_fd(ssl, client_fd);
  const int plain = SSL_accept(ssl) == 1 ? connect_loopback(port_) : -1;
  bool reset = false;
  char buffer[16384];
  while (plain >= 0) {
    pollfd fds[3] = {{client_fd, POLLIN, 0}, {plain, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (SSL_pending(ssl) == 0 && ::poll(fds, 3, -1) < 0 && errno != EINTR) break;
    if (fds[2].revents != 0) break;
    if (SSL_pending(ssl) > 0 || fds[0].revents != 0) {
      const int n = SSL_read(ssl, buffer, sizeof buffer);
      if (n <= 0 || !send_all(plain, std::string(buffer, static_cast<std::size_t>(n)))) break;
    }
    if (fds[1].revents != 0) {
      const ssize_t n = ::recv(plain, buffer, sizeof buffer, 0);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        reset = n < 0;
        break;
      }
      if (SSL_write(ssl, buffer, static_cast<int>(n)) <= 0) break;
    }
  }
  if (reset) {
    linger option{1, 0};
    ::setsockopt(client_fd, SOL_SOCKET, SO_LINGER, &option, sizeof option);
  } else if (plain >= 0) {
    SSL_shutdown(ssl);
  }
  SSL_free(ssl);
  if (plain >= 0) ::close(plain);
  ::close(client_fd);
}

FakeApiServer::~FakeApiServer() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  if (wake_pipe_[1] >= 0) (void)!::write(wake_pipe_[1], "x", 1);
  if (accept_thread_.joinable()) accept_thread_.join();
  if (tls_accept_thread_.joinable()) tls_accept_thread_.join();
  std::vector<std::thread> connections;
  {
    std::lock_guard lock(mu_);
    connections.swap(connections_);
  }
  for (auto& thread : connections) thread.join();
  for (int fd : {listen_fd_, tls_listen_fd_, wake_pipe_[0], wake_pipe_[1]}) {
    if (fd >= 0) ::close(fd);
  }
  SSL_CTX_free(static_cast<SSL_CTX*>(tls_context_));
}

// Accepts on `listen_fd` until the server stops, each connection handled on its own thread.
void FakeApiServer::accept_loop(int listen_fd, void (FakeApiServer::*handle)(int)) {
  while (true) {
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_pipe_[0], POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0 && errno != EINTR) return;
    if (fds[1].revents != 0) return;
    if ((fds[0].revents & POLLIN) == 0) continue;
    const int fd = ::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    std::lock_guard lock(mu_);
    if (stopping_) {
      ::close(fd);
      return;
    }
    connections_.emplace_back([this, fd, handle] { (this->*handle)(fd); });
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
  const auto authorization = request.headers.find("authorization");
  if (!options_.token.empty() && (authorization == request.headers.end() ||
                                  authorization->second != "Bearer " + options_.token)) {
    send_all(fd, response(401, "Unauthorized",
                          status_object(401, "Unauthorized", "Unauthorized").dump()));
    ::close(fd);
    return;
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
    post_event(fd, request);
  } else {
    send_all(fd, response(404, "Not Found",
                          status_object(404, "NotFound", "no route " + request.path).dump()));
  }
  ::close(fd);
}

void FakeApiServer::post_event(int fd, const RecordedRequest& request) {
  const std::string prefix = "/api/v1/namespaces/";
  const std::string path_namespace =
      request.path.substr(prefix.size(), request.path.size() - prefix.size() - 7);
  json event = json::parse(request.body, nullptr, false);
  std::unique_lock lock(mu_);
  if (!namespaces_.contains(path_namespace)) {
    lock.unlock();
    send_all(fd, response(404, "Not Found",
                          status_object(404, "NotFound",
                                        "namespaces \"" + path_namespace + "\" not found")
                              .dump()));
    return;
  }
  const auto refused = event.is_discarded()
                           ? std::make_optional(std::make_pair(400, std::string("invalid JSON")))
                           : check_event(event, path_namespace);
  if (refused) {
    refused_events_.push_back(event.is_discarded() ? json(request.body) : event);
    lock.unlock();
    const bool invalid = refused->first == 422;
    send_all(fd, response(refused->first, invalid ? "Unprocessable Entity" : "Bad Request",
                          status_object(refused->first, invalid ? "Invalid" : "BadRequest",
                                        refused->second)
                              .dump()));
    return;
  }
  json& metadata = event["metadata"];
  if (!metadata.contains("name")) {
    char suffix[8];
    std::snprintf(suffix, sizeof suffix, "%05llx",
                  static_cast<unsigned long long>(++generated_names_ & 0xfffff));
    metadata["name"] = metadata["generateName"].get<std::string>().substr(0, 58) + suffix;
  }
  metadata["namespace"] = path_namespace;
  metadata["resourceVersion"] = std::to_string(++version_);
  events_.push_back(event);
  lock.unlock();
  send_all(fd, response(201, "Created", event.dump()));
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
      namespaces_.insert(object["metadata"].value("namespace", std::string()));
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

std::vector<json> FakeApiServer::refused_events() const {
  std::lock_guard lock(mu_);
  return refused_events_;
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
