// FakeApiServer: a small HTTPS server on 127.0.0.1 (ephemeral port) that speaks the shapes of
// the Kubernetes API the pod watcher uses, so the watcher runs against real sockets in tests. As
// strict as a real API server on what the watcher sends:
//  - TLS only, with a certificate for 127.0.0.1 issued by a CA made at start (kubeconfig() embeds
//    it); a client that does not trust it gets no answer.
//  - A bearer token: a request without `Authorization: Bearer <token>` gets 401 Unauthorized.
//  - Namespaces: those of the pods added, default, kube-system and add_namespace(); a POST into
//    another gets 404, and one whose object names another namespace than its path gets 400.
//  - Events are checked as the API server's core/v1 validation does (check_event below): unknown
//    fields (as with fieldValidation=Strict), a name or generateName, the involved object's
//    namespace, DNS-1123 names, and the eventTime-dependent rules (reportingComponent,
//    reportingInstance, action, reason and their lengths). A refused Event gets the API's Status
//    (400 or 422) and is kept in refused_events(), not in posted_events().
//
//  - GET /api/v1/pods?fieldSelector=spec.nodeName=N: a PodList of the pods on node N, with
//    metadata.resourceVersion (the current version).
//  - the same with watch=1&resourceVersion=R: a chunked stream of {"type":..,"object":..} lines:
//  the
//    recorded changes after R, then live ones, until timeoutSeconds, end_watches() (a clean end) or
//    drop_watches() (the connection is cut without the terminating chunk). R older than the last
//    expire_history() gets 410 Gone, as an HTTP status or as an ERROR event (gone_style).
//  - POST /api/v1/namespaces/NS/events: recorded (posted_events()), answered 201.
// Every request is recorded (requests()). Each response closes its connection. Thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/result.h"

namespace nvshare::testing {

struct RecordedRequest {
  std::string method;
  std::string target;  // path and query as sent
  std::string path;
  std::map<std::string, std::string> query;    // decoded
  std::map<std::string, std::string> headers;  // lower-case names
  std::string body;
};

class FakeApiServer {
 public:
  enum class GoneStyle { kHttpStatus, kErrorEvent };

  struct Options {
    std::string token = "test-token";  // the bearer token every request must carry
  };

  static Result<std::unique_ptr<FakeApiServer>> start(Options options);
  static Result<std::unique_ptr<FakeApiServer>> start() { return start(Options{}); }
  ~FakeApiServer();

  std::string url() const { return "https://127.0.0.1:" + std::to_string(tls_port_); }
  const std::string& ca_pem() const { return ca_pem_; }
  // A kubeconfig for this server: its URL, its CA (certificate-authority-data) and `token`.
  std::string kubeconfig(const std::string& token) const;
  void add_namespace(const std::string& name);

  // Changes to the stored pods; each bumps the resourceVersion (returned) and reaches open watches.
  std::string add_pod(nlohmann::json pod);
  std::string modify_pod(nlohmann::json pod);
  std::string delete_pod(const std::string& uid);
  // Changes the stored pods without an event, as if the event had been compacted away: only a
  // relist sees these (use with expire_history()).
  void replace_pod_unseen(nlohmann::json pod);
  void delete_pod_unseen(const std::string& uid);
  // Sends a BOOKMARK with a new resourceVersion to open watches (not kept in the history).
  std::string bookmark();
  // Forgets the history: watches from any version before the current one get 410 Gone.
  void expire_history();
  void set_gone_style(GoneStyle style);
  void end_watches();
  void drop_watches();

  std::vector<RecordedRequest> requests() const;
  std::vector<RecordedRequest> watch_requests() const;
  std::vector<nlohmann::json> posted_events() const;
  std::vector<nlohmann::json> refused_events() const;
  int open_watches() const;
  std::uint64_t resource_version() const;

 private:
  struct Change {
    std::uint64_t version;
    std::string type;
    nlohmann::json object;
    bool bookmark;
  };

  FakeApiServer() = default;
  void accept_loop(int listen_fd, void (FakeApiServer::*handle)(int));
  void relay(int client_fd);
  void post_event(int fd, const RecordedRequest& request);
  void serve(int fd);
  void serve_watch(int fd, const RecordedRequest& request);
  std::string record_change(const std::string& type, nlohmann::json object, bool bookmark);

  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  int port_ = 0;  // plain HTTP, reached only through the TLS relay
  std::thread accept_thread_;
  Options options_;
  void* tls_context_ = nullptr;  // SSL_CTX
  std::string ca_pem_;
  int tls_listen_fd_ = -1;
  int tls_port_ = 0;
  std::thread tls_accept_thread_;

  mutable std::mutex mu_;
  std::condition_variable changed_;
  bool stopping_ = false;
  std::vector<std::thread> connections_;
  std::uint64_t version_ = 100;
  std::uint64_t expired_before_ = 0;  // watches from a version below this get 410
  GoneStyle gone_style_ = GoneStyle::kErrorEvent;
  std::uint64_t end_generation_ = 0;
  std::uint64_t drop_generation_ = 0;
  int open_watches_ = 0;
  std::map<std::string, nlohmann::json> pods_;  // by uid
  std::vector<Change> history_;
  std::vector<RecordedRequest> requests_;
  std::vector<nlohmann::json> events_;
  std::vector<nlohmann::json> refused_events_;
  std::set<std::string> namespaces_ = {"default", "kube-system"};
  std::uint64_t generated_names_ = 0;
};

// The API server's verdict on an Event POSTed to namespace `path_namespace`: nullopt when it is
// valid, else the HTTP status and the Status object's message.
std::optional<std::pair<int, std::string>> check_event(const nlohmann::json& event,
                                                       const std::string& path_namespace);

// A Pod object. `requests_resource` puts `resource` (1) in the first container's limits.
nlohmann::json make_pod(const std::string& uid, const std::string& name, const std::string& node,
                        const std::map<std::string, std::string>& annotations,
                        bool requests_resource = true,
                        const std::string& resource = "nvshare.com/gpu",
                        const std::string& namespace_name = "ml");

}  // namespace nvshare::testing
