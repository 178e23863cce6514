// How the pod watcher reaches the Kubernetes API server and proves who it is.
//
// Two sources:
//  - in-cluster: https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the service account's
//    ca.crt and token (the token file is re-read on every connection, since projected tokens
//    rotate);
//  - a kubeconfig file (development): the current context's cluster (server,
//    certificate-authority or certificate-authority-data, insecure-skip-tls-verify) and user
//    (token, tokenFile, client-certificate(-data) with client-key(-data)). Relative file names are
//    resolved against the kubeconfig's directory, as kubectl does. exec and auth-provider users are
//    not supported and are reported as such. http:// servers are accepted (tests use them).
// Kubeconfig files are YAML; parse_kubeconfig_text reads JSON and the block-style YAML subset that
// kubectl writes (mappings, sequences, plain and quoted scalars, comments, flow {} / [] in JSON
// form). Errors name the file and what is missing. No network I/O here.
#pragma once

#include <string>
#include <string_view>

#include "common/json.h"
#include "common/result.h"

namespace nvshare::podwatcher {

struct ApiCredentials {
  std::string server;  // scheme://host[:port], no trailing slash
  std::string ca_file;
  std::string ca_pem;  // decoded certificate-authority-data
  bool insecure_skip_tls_verify = false;
  std::string token;       // a fixed bearer token
  std::string token_file;  // re-read on each connection (wins over `token` when set)
  std::string client_cert_file;
  std::string client_cert_pem;
  std::string client_key_file;
  std::string client_key_pem;

  // The bearer token to send now ("" for none): token_file's current content, else token.
  Result<std::string> current_token() const;
};

Result<ApiCredentials> load_kubeconfig(const std::string& path);
Result<ApiCredentials> kubeconfig_credentials(const Json& kubeconfig, const std::string& base_dir);
// host/port empty: taken from KUBERNETES_SERVICE_HOST / KUBERNETES_SERVICE_PORT.
Result<ApiCredentials> in_cluster_credentials(std::string host, std::string port,
                                              const std::string& service_account_dir);

// YAML (kubectl's subset) or JSON text to a JSON value; YAML scalars become strings ("null"/"~"/
// empty become null).
Result<Json> parse_kubeconfig_text(std::string_view text);
Result<std::string> decode_base64(std::string_view text);

}  // namespace nvshare::podwatcher
