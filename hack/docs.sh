#!/usr/bin/env bash
# Builds the documentation site (mkdocs.yml, docs/) into $1 (default
# bin/site) with mkdocs --strict: a broken link or a nav entry naming a
# missing page fails it. mkdocs 1.4 (Debian's) only mentions a page that is
# missing from the nav at INFO level, so that is failed here too.
set -euo pipefail
cd "$(dirname "$0")/.."
site=${1:-bin/site}
if ! command -v mkdocs >/dev/null; then
  echo "mkdocs is not installed: run hack/install-deps.sh (Debian's mkdocs package)" >&2
  exit 1
fi
out=$(mkdocs build --strict --clean --site-dir "$site" 2>&1) || { echo "$out" >&2; exit 1; }
echo "$out"
if grep -q 'are not included in the "nav" configuration' <<<"$out"; then
  echo "docs: every page under docs/ must be listed in mkdocs.yml's nav" >&2
  exit 1
fi
if grep -q 'WARNING' <<<"$out"; then
  echo "docs: mkdocs warned" >&2
  exit 1
fi
