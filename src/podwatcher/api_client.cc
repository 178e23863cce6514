#include "podwatcher/api_client.h"

#include <curl/curl.h>

#include <mutex>

namespace nvshare::podwatcher {
namespace {

constexpr std::size_t kMaxBodyBytes = 256u << 20;

void global_init() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct HeaderList {
  curl_slist* list = nullptr;
  ~HeaderList() { curl_slist_free_all(list); }
  void add(const std::string& header) { list = curl_slist_append(list, header.c_str()); }
};

void set_blob(CURL* easy, CURLoption option, const std::string& data) {
  curl_blob blob{const_cast<char*>(data.data()), data.size(), CURL_BLOB_COPY};
  curl_easy_setopt(easy, option, &blob);
}

}  // namespace

struct ApiClient::Transfer {
  CURL* easy = nullptr;
  HeaderList headers;
  std::string request_body;
  HttpResponse* response = nullptr;
  const std::function<bool(std::string_view)>* on_data = nullptr;
  bool stopped_by_consumer = false;
  bool body_too_large = false;

  ~Transfer() {
    if (easy != nullptr) curl_easy_cleanup(easy);
  }

  static size_t on_body(char* data, size_t size, size_t count, void* self_ptr) {
    auto* self = static_cast<Transfer*>(self_ptr);
    const size_t bytes = size * count;
    long status = 0;
    curl_easy_getinfo(self->easy, CURLINFO_RESPONSE_CODE, &status);
    self->response->status = status;
    if (self->on_data != nullptr && status == 200) {
      if (!(*self->on_data)(std::string_view(data, bytes))) {
        self->stopped_by_consumer = true;
        return 0;  // aborts the transfer
      }
      return bytes;
    }
    if (self->response->body.size() + bytes > kMaxBodyBytes) {
      self->body_too_large = true;
      return 0;
    }
    self->response->body.append(data, bytes);
    return bytes;
  }
};

ApiClient::ApiClient(ApiCredentials credentials, std::chrono::milliseconds request_timeout,
                     std::string user_agent)
    : credentials_(std::move(credentials)),
      request_timeout_(request_timeout),
      user_agent_(std::move(user_agent)) {
  global_init();
  multi_ = curl_multi_init();
}

ApiClient::~ApiClient() {
  if (multi_ != nullptr) curl_multi_cleanup(static_cast<CURLM*>(multi_));
}

void ApiClient::interrupt() {
  interrupted_ = true;
  if (multi_ != nullptr) curl_multi_wakeup(static_cast<CURLM*>(multi_));
}

bool ApiClient::request(const std::string& method, const std::string& path, const std::string& body,
                        HttpResponse* response, HttpFailure* failure) {
  Transfer transfer;
  transfer.response = response;
  transfer.request_body = body;
  transfer.easy = curl_easy_init();
  if (transfer.easy == nullptr) {
    *failure = HttpFailure{"cannot create a libcurl handle", false};
    return false;
  }
  curl_easy_setopt(transfer.easy, CURLOPT_TIMEOUT_MS, static_cast<long>(request_timeout_.count()));
  if (method == "POST") {
    curl_easy_setopt(transfer.easy, CURLOPT_POST, 1L);
    curl_easy_setopt(transfer.easy, CURLOPT_POSTFIELDS, transfer.request_body.c_str());
    curl_easy_setopt(transfer.easy, CURLOPT_POSTFIELDSIZE,
                     static_cast<long>(transfer.request_body.size()));
    transfer.headers.add("Content-Type: application/json");
  } else if (method != "GET") {
    curl_easy_setopt(transfer.easy, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
  curl_easy_setopt(transfer.easy, CURLOPT_URL, (credentials_.server + path).c_str());
  return perform(transfer, failure);
}

bool ApiClient::stream(const std::string& path, std::chrono::milliseconds stream_timeout,
                       const std::function<bool(std::string_view)>& on_data, HttpResponse* response,
                       HttpFailure* failure) {
  Transfer transfer;
  transfer.response = response;
  transfer.on_data = &on_data;
  transfer.easy = curl_easy_init();
  if (transfer.easy == nullptr) {
    *failure = HttpFailure{"cannot create a libcurl handle", false};
    return false;
  }
  curl_easy_setopt(transfer.easy, CURLOPT_TIMEOUT_MS, static_cast<long>(stream_timeout.count()));
  curl_easy_setopt(transfer.easy, CURLOPT_TCP_KEEPALIVE, 1L);
  curl_easy_setopt(transfer.easy, CURLOPT_TCP_KEEPIDLE, 30L);
  curl_easy_setopt(transfer.easy, CURLOPT_TCP_KEEPINTVL, 10L);
  curl_easy_setopt(transfer.easy, CURLOPT_URL, (credentials_.server + path).c_str());
  return perform(transfer, failure);
}

bool ApiClient::perform(Transfer& transfer, HttpFailure* failure) {
  CURL* easy = transfer.easy;
  if (interrupted_) {
    *failure = HttpFailure{"interrupted", true};
    return false;
  }
  auto token = credentials_.current_token();
  if (!token) {
    *failure = HttpFailure{token.error().message, false};
    return false;
  }
  if (!token.value().empty()) transfer.headers.add("Authorization: Bearer " + token.value());
  transfer.headers.add("Accept: application/json");
  curl_easy_setopt(easy, CURLOPT_HTTPHEADER, transfer.headers.list);
  curl_easy_setopt(easy, CURLOPT_USERAGENT, user_agent_.c_str());
  curl_easy_setopt(easy, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(easy, CURLOPT_CONNECTTIMEOUT_MS, static_cast<long>(request_timeout_.count()));
  curl_easy_setopt(easy, CURLOPT_WRITEFUNCTION, &Transfer::on_body);
  curl_easy_setopt(easy, CURLOPT_WRITEDATA, &transfer);
  curl_easy_setopt(easy, CURLOPT_PROTOCOLS_STR, "http,https");
  if (credentials_.insecure_skip_tls_verify) {
    curl_easy_setopt(easy, CURLOPT_SSL_VERIFYPEER, 0L);
    curl_easy_setopt(easy, CURLOPT_SSL_VERIFYHOST, 0L);
  }
  if (!credentials_.ca_pem.empty()) set_blob(easy, CURLOPT_CAINFO_BLOB, credentials_.ca_pem);
  if (!credentials_.ca_file.empty())
    curl_easy_setopt(easy, CURLOPT_CAINFO, credentials_.ca_file.c_str());
  if (!credentials_.client_cert_pem.empty()) {
    set_blob(easy, CURLOPT_SSLCERT_BLOB, credentials_.client_cert_pem);
    curl_easy_setopt(easy, CURLOPT_SSLCERTTYPE, "PEM");
  } else if (!credentials_.client_cert_file.empty()) {
    curl_easy_setopt(easy, CURLOPT_SSLCERT, credentials_.client_cert_file.c_str());
  }
  if (!credentials_.client_key_pem.empty()) {
    set_blob(easy, CURLOPT_SSLKEY_BLOB, credentials_.client_key_pem);
    curl_easy_setopt(easy, CURLOPT_SSLKEYTYPE, "PEM");
  } else if (!credentials_.client_key_file.empty()) {
    curl_easy_setopt(easy, CURLOPT_SSLKEY, credentials_.client_key_file.c_str());
  }

  auto* multi = static_cast<CURLM*>(multi_);
  if (multi == nullptr) {
    *failure = HttpFailure{"cannot create a libcurl multi handle", false};
    return false;
  }
  curl_multi_add_handle(multi, easy);
  CURLcode result = CURLE_OK;
  bool done = false;
  while (!done) {
    if (interrupted_) break;
    int running = 0;
    const CURLMcode code = curl_multi_perform(multi, &running);
    if (code != CURLM_OK) {
      curl_multi_remove_handle(multi, easy);
      *failure = HttpFailure{std::string("libcurl: ") + curl_multi_strerror(code), false};
      return false;
    }
    int queued = 0;
    while (CURLMsg* message = curl_multi_info_read(multi, &queued)) {
      if (message->msg == CURLMSG_DONE && message->easy_handle == easy) {
        result = message->data.result;
        done = true;
      }
    }
    if (done) break;
    curl_multi_poll(multi, nullptr, 0, 1000, nullptr);
  }
  curl_multi_remove_handle(multi, easy);
  if (!done) {
    *failure = HttpFailure{"interrupted", true};
    return false;
  }
  long status = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  transfer.response->status = status;
  if (result == CURLE_WRITE_ERROR && transfer.stopped_by_consumer) return true;
  if (result != CURLE_OK) {
    std::string message = curl_easy_strerror(result);
    if (transfer.body_too_large) message = "response body over 256 MiB";
    *failure = HttpFailure{credentials_.server + ": " + message, false};
    return false;
  }
  return true;
}

}  // namespace nvshare::podwatcher
