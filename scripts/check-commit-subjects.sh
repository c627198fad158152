#!/bin/sh
# Commit subjects of at most 72 characters, the detail in the body, so
# that `git log --oneline` reads as a list.
#   scripts/check-commit-subjects.sh           every commit since the rule
#                                              began (CI runs this)
#   scripts/check-commit-subjects.sh MSG-FILE  one message: as a commit-msg
#                                              hook, `ln -s ../../scripts/
#                                              check-commit-subjects.sh
#                                              .git/hooks/commit-msg`
set -eu
limit=72
# The last commit before the rule: older subjects are left as they are.
since=ae27004

if [ $# -eq 1 ]; then
  subject=$(grep -v '^#' "$1" | head -n 1)
  if [ "${#subject}" -gt $limit ]; then
    echo "commit subject of ${#subject} characters (at most $limit; the detail goes in the body):" >&2
    echo "  $subject" >&2
    exit 1
  fi
  exit 0
fi

cd "$(dirname "$0")/.."
if ! git cat-file -e "$since^{commit}" 2>/dev/null; then
  echo "check-commit-subjects: $since is not in this clone's history (shallow?): not checked" >&2
  exit 0
fi
bad=$(git log --format='%h %s' "$since..HEAD" | awk -v n=$limit '{ s = substr($0, index($0, " ") + 1); if (length(s) > n) printf "  %s (%d)\n", $0, length(s) }')
if [ -n "$bad" ]; then
  echo "check-commit-subjects: subjects over $limit characters:" >&2
  printf '%s\n' "$bad" >&2
  exit 1
fi
echo "check-commit-subjects: $(git rev-list --count "$since..HEAD") subjects of at most $limit characters"
