#!/usr/bin/env bash
# Installs the system packages the build and the tests need, when missing (Debian/Ubuntu), and
# cargo-auditable. Sourced by scripts/run, scripts/test, scripts/package and scripts/image; safe
# to run again.
set -euo pipefail

need=()
command -v cc >/dev/null 2>&1 || need+=(build-essential)
command -v cmake >/dev/null 2>&1 || need+=(cmake)          # Pingora's zlib-ng
command -v pkg-config >/dev/null 2>&1 || need+=(pkg-config)
command -v mold >/dev/null 2>&1 || need+=(mold)            # the linker (scripts/linker)
[ -e /usr/include/openssl/ssl.h ] || need+=(libssl-dev)    # TLS to the upstream
for extra in "${DEPS_EXTRA[@]:-}"; do
  [ -n "$extra" ] || continue
  command -v "${extra%%:*}" >/dev/null 2>&1 || need+=("${extra#*:}")
done

if [ ${#need[@]} -gt 0 ]; then
  echo "installing: ${need[*]}" >&2
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq "${need[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "cargo is missing: install Rust (rustup) first" >&2; exit 1; }
# cargo-auditable, pinned: every build of the binary the scripts make (scripts/run, scripts/test,
# scripts/package, scripts/image) goes through `cargo auditable`, which links the binary's
# dependency list into it for `cargo audit bin` and image scanners (docs/deploy.md "Supply chain").
CARGO_AUDITABLE_VERSION=0.7.7
if ! cargo install --list 2>/dev/null | grep -qx "cargo-auditable v$CARGO_AUDITABLE_VERSION:"; then
  cargo install --locked --quiet cargo-auditable --version "$CARGO_AUDITABLE_VERSION"
fi
