#!/usr/bin/env bash
# Puts the npm package kubernetes-models (the Kubernetes OpenAPI schemas, one model per kind) in
# DEST/node_modules, once, for validate_k8s.mjs.
#   tests/k8s/deploy/fetch_k8s_models.sh DEST
set -euo pipefail
dest=${1:?usage: fetch_k8s_models.sh DEST}
mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
package=kubernetes-models@5.1.0
if [ -f "$dest/node_modules/kubernetes-models/package.json" ]; then
  echo "kubernetes-models $(node -p "require('$dest/node_modules/kubernetes-models/package.json').version")"
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "fetch_k8s_models: npm is missing (it fetches $package from the npm registry)" >&2
  exit 1
fi
npm install --prefix "$dest" --silent --no-audit --no-fund --no-save "$package"
echo "kubernetes-models $(node -p "require('$dest/node_modules/kubernetes-models/package.json').version")"
