#!/usr/bin/env bash
# Install the Debian packages streamnet needs, or say exactly what to run.
# usage: deploy/ensure-packages.sh PACKAGE...   (e.g. python3-venv dataset-fashion-mnist zookeeper)
set -euo pipefail
missing=()
for pkg in "$@"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "streamnet needs these Debian packages: ${missing[*]}" >&2
  echo "install them with:  sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "installing ${missing[*]} with apt-get" >&2
export DEBIAN_FRONTEND=noninteractive
# update only when apt does not know a package yet (a fresh machine has empty lists)
for pkg in "${missing[@]}"; do
  if ! apt-cache show "$pkg" >/dev/null 2>&1; then apt-get update -q; break; fi
done
apt-get install -y -q "${missing[@]}"
