#!/usr/bin/env bash
# Checks the total line coverage of an lcov report against a threshold (percent).
#
#   hack/coverage-gate.sh LCOV_FILE THRESHOLD
#
# Prints the total; appends a summary to $GITHUB_STEP_SUMMARY when set; exits 1 below the
# threshold.
set -euo pipefail
report=${1:-}
threshold=${2:-40}
[[ -f $report ]] || { echo "coverage-gate: no lcov report at '$report': run make coverage first" >&2; exit 2; }
[[ $threshold =~ ^[0-9]+([.][0-9]+)?$ ]] || { echo "coverage-gate: threshold '$threshold' is not a number" >&2; exit 2; }

read -r found hit < <(awk -F: '/^LF:/ {f += $2} /^LH:/ {h += $2} END {print f + 0, h + 0}' "$report")
if ((found == 0)); then
  echo "coverage-gate: $report lists no lines" >&2
  exit 2
fi
total=$(awk -v h="$hit" -v f="$found" 'BEGIN {printf "%.1f", 100 * h / f}')
pass=$(awk -v t="$total" -v min="$threshold" 'BEGIN {print (t + 0 >= min + 0) ? 1 : 0}')
verdict=$([[ $pass == 1 ]] && echo "passes" || echo "is below")
line="Total line coverage: ${total}% (${hit} of ${found} lines) ${verdict} the ${threshold}% threshold."
echo "$line"
if [[ -n ${GITHUB_STEP_SUMMARY:-} ]]; then
  printf '## Coverage\n\n%s\n' "$line" >>"$GITHUB_STEP_SUMMARY"
fi
[[ $pass == 1 ]]
