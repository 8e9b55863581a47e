#!/usr/bin/env bash
# scripts/format.sh: format every tracked C++ and CUDA source with the tree's .clang-format.
#
#   scripts/format.sh            # rewrite the files in place
#   scripts/format.sh --check    # change nothing; list the files that are not formatted, exit 1
#
# Uses Debian's clang-format 14 (scripts/test.sh installs it); another major version formats some
# constructs differently, so the check insists on 14.
set -euo pipefail
cd "$(dirname "$0")/.."

CLANG_FORMAT="${CLANG_FORMAT:-$(command -v clang-format-14 || command -v clang-format || true)}"
if [ -z "$CLANG_FORMAT" ]; then
  echo "format.sh: clang-format not found (apt-get install clang-format)" >&2
  exit 2
fi
if ! "$CLANG_FORMAT" --version | grep -q 'version 14\.'; then
  echo "format.sh: $CLANG_FORMAT is not clang-format 14: $("$CLANG_FORMAT" --version)" >&2
  exit 2
fi

if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  mapfile -t files < <(git ls-files '*.h' '*.cpp' '*.cu' '*.cuh')
else  # an unpacked archive: every source below the top-level folders
  mapfile -t files < <(find cli core ops topology slurm tests -name '*.h' -o -name '*.cpp' \
    -o -name '*.cu' -o -name '*.cuh' | sort)
fi
if [ "${1:-}" = "--check" ]; then
  bad=()
  for f in "${files[@]}"; do
    if ! "$CLANG_FORMAT" --style=file "$f" | cmp -s - "$f"; then bad+=("$f"); fi
  done
  if [ ${#bad[@]} -gt 0 ]; then
    echo "format.sh: ${#bad[@]} of ${#files[@]} files are not formatted (run scripts/format.sh):" >&2
    printf '  %s\n' "${bad[@]}" >&2
    exit 1
  fi
  echo "format.sh: ${#files[@]} files formatted"
else
  "$CLANG_FORMAT" --style=file -i "${files[@]}"
fi
