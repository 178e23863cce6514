// FakeApiServer: a small HTTP/1.1 server on 127.0.0.1 (ephemeral port) that speaks the shapes of
// the Kubernetes API the pod watcher uses, so the watcher runs against real sockets in tests.
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

  static Result<std::unique_ptr<FakeApiServer>> start();
  ~FakeApiServer();

  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }

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
  void accept_loop();
  void serve(int fd);
  void serve_watch(int fd, const RecordedRequest& request);
  std::string record_change(const std::string& type, nlohmann::json object, bool bookmark);

  int listen_fd_ = -1;
  int wake_pipe_[2] = {-1, -1};
  int port_ = 0;
  std::thread accept_thread_;

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
};

// A Pod object. `requests_resource` puts `resource` (1) in the first container's limits.
nlohmann::json make_pod(const std::string& uid, const std::string& name, const std::string& node,
                        const std::map<std::string, std::string>& annotations,
                        bool requests_resource = true,
                        const std::string& resource = "nvshare.com/gpu",
                        const std::string& namespace_name = "ml");

}  // namespace nvshare::testing
