#include "podwatcher/kube_credentials.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

namespace nvshare::podwatcher {
namespace {

Result<std::string> read_file(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(std::string("cannot read ") + what + " " + path);
  std::ostringstream out;
  out << in.rdbuf();
  if (in.bad()) return make_error(std::string("cannot read ") + what + " " + path);
  return out.str();
}

std::string trim(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string_view::npos) return {};
  const auto last = text.find_last_not_of(" \t\r\n");
  return std::string(text.substr(first, last - first + 1));
}

// ---- YAML subset ------------------------------------------------------------------------------

struct YamlLine {
  int number = 0;  // 1-based, for messages
  int indent = 0;
  std::string content;
};

// Removes a comment: '#' at the start or after whitespace, outside quotes.
std::string strip_comment(const std::string& line) {
  char quote = 0;
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quote != 0) {
      if (quote == '"' && c == '\\') {
        ++i;
      } else if (c == quote) {
        quote = 0;
      }
      continue;
    }
    if (c == '"' || c == '\'') {
      if (i == 0 || line[i - 1] == ' ' || line[i - 1] == ':' || line[i - 1] == '-' ||
          line[i - 1] == '[' || line[i - 1] == '{' || line[i - 1] == ',') {
        quote = c;
      }
    } else if (c == '#' && (i == 0 || line[i - 1] == ' ' || line[i - 1] == '\t')) {
      return line.substr(0, i);
    }
  }
  return line;
}

class YamlParser {
 public:
  explicit YamlParser(std::string_view text) {
    std::istringstream in{std::string(text)};
    std::string raw;
    int number = 0;
    while (std::getline(in, raw)) {
      ++number;
      if (!raw.empty() && raw.back() == '\r') raw.pop_back();
      std::string line = strip_comment(raw);
      const auto first = line.find_first_not_of(' ');
      if (first == std::string::npos) continue;
      std::string content = trim(line.substr(first));
      if (content.empty() || content == "---" || content == "...") continue;
      if (content[0] == '%') continue;  // directives
      lines_.push_back(YamlLine{number, static_cast<int>(first), content});
    }
  }

  Result<Json> parse() {
    if (lines_.empty()) return Json(nullptr);
    auto value = node(lines_[0].indent);
    if (!value) return value;
    if (pos_ < lines_.size()) return error(lines_[pos_], "unexpected indentation");
    return value;
  }

 private:
  static Error error(const YamlLine& line, const std::string& what) {
    return make_error("YAML line " + std::to_string(line.number) + ": " + what);
  }

  static bool is_sequence_item(const std::string& content) {
    return content == "-" || content.rfind("- ", 0) == 0;
  }

  // Position of the ':' that ends a mapping key, or npos.
  static std::size_t key_end(const std::string& content) {
    std::size_t i = 0;
    if (content[0] == '"' || content[0] == '\'') {
      const char quote = content[0];
      for (i = 1; i < content.size(); ++i) {
        if (quote == '"' && content[i] == '\\') {
          ++i;
        } else if (content[i] == quote) {
          break;
        }
      }
      ++i;
      if (i < content.size() && content[i] == ':' &&
          (i + 1 == content.size() || content[i + 1] == ' ')) {
        return i;
      }
      return std::string::npos;
    }
    if (content[0] == '{' || content[0] == '[') return std::string::npos;
    for (i = 0; i < content.size(); ++i) {
      if (content[i] == ':' && (i + 1 == content.size() || content[i + 1] == ' ')) return i;
    }
    return std::string::npos;
  }

  Result<Json> node(int indent) {
    const YamlLine& line = lines_[pos_];
    if (line.indent != indent) return error(line, "unexpected indentation");
    if (is_sequence_item(line.content)) return sequence(indent);
    if (key_end(line.content) != std::string::npos) return mapping(indent);
    ++pos_;
    return scalar(line, line.content);
  }

  Result<Json> sequence(int indent) {
    Json out = Json::array();
    while (pos_ < lines_.size() && lines_[pos_].indent == indent &&
           is_sequence_item(lines_[pos_].content)) {
      YamlLine& line = lines_[pos_];
      if (line.content == "-") {
        ++pos_;
        if (pos_ < lines_.size() && lines_[pos_].indent > indent) {
          auto item = node(lines_[pos_].indent);
          if (!item) return item;
          out.push_back(std::move(item.value()));
        } else {
          out.push_back(nullptr);
        }
        continue;
      }
      // "- key: value" continues as a node indented to where its content starts.
      const std::size_t offset = line.content.find_first_not_of(' ', 1);
      line.indent += static_cast<int>(offset);
      line.content = line.content.substr(offset);
      auto item = node(line.indent);
      if (!item) return item;
      out.push_back(std::move(item.value()));
    }
    return out;
  }

  Result<Json> mapping(int indent) {
    Json out = Json::object();
    while (pos_ < lines_.size() && lines_[pos_].indent == indent &&
           !is_sequence_item(lines_[pos_].content)) {
      const YamlLine line = lines_[pos_];
      const std::size_t colon = key_end(line.content);
      if (colon == std::string::npos) return error(line, "expected \"key: value\"");
      auto key = scalar(line, trim(line.content.substr(0, colon)));
      if (!key) return key;
      const std::string key_text =
          key.value().is_string() ? *key.value().as_string() : key.value().dump();
      if (out.find(key_text) != nullptr) {
        return error(line, "duplicate key \"" + key_text + "\"");
      }
      const std::string rest = trim(line.content.substr(colon + 1));
      ++pos_;
      if (!rest.empty()) {
        auto value = scalar(line, rest);
        if (!value) return value;
        out.set(key_text, std::move(value.value()));
        continue;
      }
      if (pos_ < lines_.size() &&
          (lines_[pos_].indent > indent ||
           (lines_[pos_].indent == indent && is_sequence_item(lines_[pos_].content)))) {
        auto value = node(lines_[pos_].indent);
        if (!value) return value;
        out.set(key_text, std::move(value.value()));
      } else {
        out.set(key_text, nullptr);
      }
    }
    return out;
  }

  Result<Json> scalar(const YamlLine& line, const std::string& text) {
    if (text.empty() || text == "~" || text == "null" || text == "Null" || text == "NULL") {
      return Json(nullptr);
    }
    if (text[0] == '|' || text[0] == '>') return error(line, "block scalars are not supported");
    if (text[0] == '&' || text[0] == '*' || text[0] == '!') {
      return error(line, "anchors, aliases and tags are not supported");
    }
    if (text[0] == '{' || text[0] == '[') {
      auto value = parse_json(text);
      if (!value) return error(line, "flow collections are supported in JSON form only");
      return value;
    }
    if (text[0] == '\'') {
      std::string out;
      std::size_t i = 1;
      for (; i < text.size(); ++i) {
        if (text[i] == '\'') {
          if (i + 1 < text.size() && text[i + 1] == '\'') {
            out += '\'';
            ++i;
            continue;
          }
          break;
        }
        out += text[i];
      }
      if (i + 1 != text.size()) return error(line, "malformed single-quoted string");
      return Json(out);
    }
    if (text[0] == '"') {
      // YAML double-quoted strings escape like JSON for everything kubeconfigs contain.
      auto value = parse_json(text);
      if (!value || !value.value().is_string()) {
        return error(line, "malformed double-quoted string");
      }
      return value;
    }
    return Json(text);
  }

  std::vector<YamlLine> lines_;
  std::size_t pos_ = 0;
};

// ---- kubeconfig ---------------------------------------------------------------------------------

std::string string_field(const Json& object, std::string_view key) {
  const Json* value = object.find(key);
  const std::string* text = value != nullptr ? value->as_string() : nullptr;
  return text != nullptr ? *text : std::string();
}

const Json* named_entry(const Json& config, const char* list, const char* inner,
                        const std::string& name) {
  const Json* entries = config.find(list);
  if (entries == nullptr || !entries->is_array()) return nullptr;
  for (const Json& entry : *entries->as_array()) {
    const Json* entry_name = entry.find("name");
    if (entry_name == nullptr || !entry_name->is_string() || *entry_name->as_string() != name) {
      continue;
    }
    const Json* body = entry.find(inner);
    return body != nullptr && body->is_object() ? body : nullptr;
  }
  return nullptr;
}

bool bool_field(const Json& object, const char* key) {
  const Json* value = object.find(key);
  if (value == nullptr) return false;
  if (auto flag = value->as_bool()) return *flag;
  const std::string text = string_field(object, key);
  return text == "true" || text == "True" || text == "TRUE";
}

std::string resolve(const std::string& path, const std::string& base_dir) {
  if (path.empty() || path[0] == '/' || base_dir.empty()) return path;
  return base_dir + "/" + path;
}

}  // namespace

Result<std::string> decode_base64(std::string_view text) {
  auto value_of = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  std::string out;
  std::uint32_t bits = 0;
  int count = 0;
  bool padding = false;
  for (char c : text) {
    if (c == ' ' || c == '\n' || c == '\r' || c == '\t') continue;
    if (c == '=') {
      padding = true;
      continue;
    }
    const int value = value_of(c);
    if (value < 0 || padding) return make_error("invalid base64 data");
    bits = (bits << 6) | static_cast<std::uint32_t>(value);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<char>((bits >> count) & 0xff));
    }
  }
  if (count >= 6) return make_error("invalid base64 data (truncated)");
  return out;
}

Result<Json> parse_kubeconfig_text(std::string_view text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first != std::string_view::npos && text[first] == '{') {
    auto value = parse_json(text);
    if (!value) return make_error("invalid JSON: " + value.error().message);
    return value;
  }
  return YamlParser(text).parse();
}

Result<std::string> ApiCredentials::current_token() const {
  if (token_file.empty()) return token;
  auto text = read_file(token_file, "token file");
  if (!text) return text.error();
  return trim(text.value());
}

Result<ApiCredentials> kubeconfig_credentials(const Json& config, const std::string& base_dir) {
  if (!config.is_object()) return make_error("not a kubeconfig (no top-level mapping)");
  const std::string context_name = string_field(config, "current-context");
  if (context_name.empty()) return make_error("no current-context");
  const Json* context = named_entry(config, "contexts", "context", context_name);
  if (context == nullptr) return make_error("context \"" + context_name + "\" not found");
  const std::string cluster_name = string_field(*context, "cluster");
  const Json* cluster = named_entry(config, "clusters", "cluster", cluster_name);
  if (cluster == nullptr) return make_error("cluster \"" + cluster_name + "\" not found");

  ApiCredentials credentials;
  credentials.server = string_field(*cluster, "server");
  if (credentials.server.rfind("https://", 0) != 0 && credentials.server.rfind("http://", 0) != 0) {
    return make_error("cluster \"" + cluster_name + "\" has no http(s) server (\"" +
                      credentials.server + "\")");
  }
  while (!credentials.server.empty() && credentials.server.back() == '/') {
    credentials.server.pop_back();
  }
  credentials.insecure_skip_tls_verify = bool_field(*cluster, "insecure-skip-tls-verify");
  credentials.ca_file = resolve(string_field(*cluster, "certificate-authority"), base_dir);
  if (auto data = string_field(*cluster, "certificate-authority-data"); !data.empty()) {
    auto pem = decode_base64(data);
    if (!pem) return make_error("certificate-authority-data: " + pem.error().message);
    credentials.ca_pem = std::move(pem.value());
  }

  const std::string user_name = string_field(*context, "user");
  if (user_name.empty()) return credentials;  // anonymous
  const Json* user = named_entry(config, "users", "user", user_name);
  if (user == nullptr) return make_error("user \"" + user_name + "\" not found");
  if (user->find("exec") != nullptr || user->find("auth-provider") != nullptr) {
    return make_error("user \"" + user_name +
                      "\" uses an exec or auth-provider plugin, which is not supported: use a "
                      "token or a client certificate");
  }
  credentials.token = string_field(*user, "token");
  credentials.token_file = resolve(string_field(*user, "tokenFile"), base_dir);
  credentials.client_cert_file = resolve(string_field(*user, "client-certificate"), base_dir);
  credentials.client_key_file = resolve(string_field(*user, "client-key"), base_dir);
  for (auto [key, target] : {std::pair{"client-certificate-data", &credentials.client_cert_pem},
                             std::pair{"client-key-data", &credentials.client_key_pem}}) {
    if (auto data = string_field(*user, key); !data.empty()) {
      auto pem = decode_base64(data);
      if (!pem) return make_error(std::string(key) + ": " + pem.error().message);
      *target = std::move(pem.value());
    }
  }
  const bool has_cert =
      !credentials.client_cert_file.empty() || !credentials.client_cert_pem.empty();
  const bool has_key = !credentials.client_key_file.empty() || !credentials.client_key_pem.empty();
  if (has_cert != has_key) {
    return make_error("user \"" + user_name +
                      "\" has a client certificate without a key, or a key without a certificate");
  }
  return credentials;
}

Result<ApiCredentials> load_kubeconfig(const std::string& path) {
  auto text = read_file(path, "kubeconfig");
  if (!text) return text.error();
  auto parsed = parse_kubeconfig_text(text.value());
  if (!parsed) return make_error("kubeconfig " + path + ": " + parsed.error().message);
  const auto slash = path.rfind('/');
  const std::string base_dir = slash == std::string::npos ? "." : path.substr(0, slash);
  auto credentials = kubeconfig_credentials(parsed.value(), base_dir);
  if (!credentials) return make_error("kubeconfig " + path + ": " + credentials.error().message);
  if (!credentials.value().token_file.empty()) {
    auto token = credentials.value().current_token();
    if (!token) return make_error("kubeconfig " + path + ": " + token.error().message);
  }
  return credentials;
}

Result<ApiCredentials> in_cluster_credentials(std::string host, std::string port,
                                              const std::string& service_account_dir) {
  if (host.empty()) {
    // Not knobs: where the API server is, as the kubelet tells every pod.
    if (const char* env = std::getenv("KUBERNETES_SERVICE_HOST")) host = env;
  }
  if (port.empty()) {
    if (const char* env = std::getenv("KUBERNETES_SERVICE_PORT")) port = env;
  }
  if (host.empty() || port.empty()) {
    return make_error(
        "not running in a cluster (KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT are not "
        "set); give a kubeconfig file");
  }
  ApiCredentials credentials;
  // An IPv6 service address needs brackets in a URL.
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  credentials.server = "https://" + (ipv6 ? "[" + host + "]" : host) + ":" + port;
  credentials.ca_file = service_account_dir + "/ca.crt";
  credentials.token_file = service_account_dir + "/token";
  auto token = credentials.current_token();
  if (!token) return make_error("in-cluster credentials: " + token.error().message);
  return credentials;
}

}  // namespace nvshare::podwatcher
