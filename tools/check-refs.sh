#!/usr/bin/env bash
# Fails when a tracked file points outside the repository: at the design documents that
# live beside a contributor's checkout (../shared/ABI.md, PERF.md, ARCHITECTURE.md) or at
# absolute paths of one machine. Users clone the repository alone; what they need is in
# docs/ (the contract: docs/abi.md; the targets: docs/performance.md). Dated records
# under docs/results/ keep the references of their day.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
pattern='\.\./shared|shared/(ABI|PERF|ARCHITECTURE)\.md|(^|[^/[:alnum:]_.-])(ABI|PERF|ARCHITECTURE)\.md|/work/(main|shared|\.library)'
if hits=$(git grep -n -I -E "$pattern" -- . ':!docs/results/' ':!tools/check-refs.sh'); then
  echo "check-refs: tracked files point outside the repository (users do not have these):" >&2
  echo "$hits" >&2
  exit 1
fi
echo "check-refs: no tracked file points outside the repository"
