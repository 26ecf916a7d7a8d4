#!/usr/bin/env bash
# Structured-logging rules golangci-lint's loggercheck does not know (it
# checks that keys pair with values): an error goes under the one key "err"
# as the error itself (logr's Error gives it its own), never as "error" or
# as a string, and messages start in lower case (an acronym or identifier
# may stay as it is). Test files are left out.
set -euo pipefail
cd "$(dirname "$0")/.."
files=$(git ls-files '*.go' | grep -v '_test\.go$' | grep -v -e '^proto/' -e '/applyconfiguration/' -e 'zz_generated')
call='\.(Info|Warn|Debug|Error)\('
bad=0
if out=$(grep -nE "${call}.*(\"error\", |\"err\", [A-Za-z_.]+\.Error\(\))" $files); then
  echo "$out"; echo 'log an error as "err", err (not "error", nor err.Error())' >&2; bad=1
fi
if out=$(grep -nE "${call}(ctx, |err, |[a-zA-Z_.]+, )?\"[A-Z][a-z]+[ ,;:.!]" $files | grep -vE '\bt\.(Error|Fatal)'); then
  echo "$out"; echo 'log messages start in lower case' >&2; bad=1
fi
exit $bad
