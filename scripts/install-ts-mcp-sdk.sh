#!/usr/bin/env bash
# Installs the TypeScript MCP SDK from the npm registry into a project-local prefix
# (.tools/ts-mcp-sdk, gitignored) for the tasks tests that drive the gateway with its
# experimental tasks client (tests/clients/ts_tasks_client.mjs). Idempotent: when the pinned
# version is there it only checks and exits. The SDK needs node >= 18 (its `engines`).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PREFIX="${TS_MCP_SDK_PREFIX:-$ROOT/.tools/ts-mcp-sdk}"
PACKAGE="@modelcontextprotocol/sdk"
VERSION="1.32.2"

manifest="$PREFIX/node_modules/$PACKAGE/package.json"
if [[ -f "$manifest" ]] && [[ "$(node -e 'console.log(require(process.argv[1]).version)' "$manifest")" == "$VERSION" ]]; then
  echo "$PACKAGE $VERSION already installed in $PREFIX"
  exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
  echo "npm is not installed: apt-get install -y nodejs npm (node >= 18)" >&2
  exit 1
fi
mkdir -p "$PREFIX"
echo "installing $PACKAGE@$VERSION into $PREFIX"
for attempt in 1 2; do
  if npm install --prefix "$PREFIX" --cache "$ROOT/.tools/npm-cache" --no-audit --no-fund \
      --no-save --loglevel=error "$PACKAGE@$VERSION"; then
    exit 0
  fi
  [[ $attempt -eq 2 ]] && { echo "npm install failed twice" >&2; exit 1; }
  echo "npm install failed; retrying once" >&2
done
