#!/usr/bin/env bash
# Installs the real claude, codex and gemini CLIs from the npm registry into a project-local
# prefix (.tools/npm, gitignored) for the `realcli` tests. Idempotent: when the pinned
# versions are already there it only checks and exits in well under a second.
#
# Pinned to the versions of ../shared/reference/cli-help-snapshots (claude, codex) so the
# real argument parsers match the snapshots our adapters are checked against.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${REAL_CLI_PREFIX:-$ROOT/.tools/npm}"
PACKAGES=(
  "@anthropic-ai/claude-code@2.1.229"
  "@openai/codex@0.147.0"
  "@google/gemini-cli@0.61.0"
)

installed_version() {  # <package name> -> version in the prefix, or nothing
  local manifest="$PREFIX/lib/node_modules/$1/package.json"
  [[ -f "$manifest" ]] && node -e 'console.log(require(process.argv[1]).version)' "$manifest"
}

missing=()
for spec in "${PACKAGES[@]}"; do
  name="${spec%@*}"
  want="${spec##*@}"
  if [[ "$(installed_version "$name" || true)" != "$want" ]]; then
    missing+=("$spec")
  fi
done
for bin in claude codex gemini; do
  [[ -x "$PREFIX/bin/$bin" ]] || missing+=("bin:$bin")
done

if [[ ${#missing[@]} -eq 0 ]]; then
  echo "real CLIs already installed in $PREFIX"
  exit 0
fi

if ! command -v npm >/dev/null 2>&1; then
  echo "npm is not installed: apt-get install -y nodejs npm (node >= 20)" >&2
  exit 1
fi

mkdir -p "$PREFIX"
echo "installing ${PACKAGES[*]} into $PREFIX"
# --prefix keeps everything inside the project; a private cache so neither the user's npm
# cache nor HOME is touched; one retry for a registry hiccup.
for attempt in 1 2; do
  if npm install --global --prefix "$PREFIX" --cache "$ROOT/.tools/npm-cache" \
      --no-audit --no-fund --loglevel=error "${PACKAGES[@]}"; then
    break
  fi
  if [[ $attempt -eq 2 ]]; then
    echo "npm install failed twice" >&2
    exit 1
  fi
  echo "npm install failed; retrying once" >&2
done

for bin in claude codex gemini; do
  if [[ ! -x "$PREFIX/bin/$bin" ]]; then
    echo "install finished but $PREFIX/bin/$bin is missing" >&2
    exit 1
  fi
done
echo "real CLIs installed in $PREFIX/bin"
