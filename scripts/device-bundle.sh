#!/usr/bin/env bash
# scripts/device-bundle.sh: packs a CUDA build made on this machine for a GPU machine that has the
# CUDA toolkit and NCCL but none of the Debian libraries moepeak links (spdlog, fmt, toml++, hwloc,
# numa, OpenBLAS, ...): the stripped binaries scripts/gpu-check.sh runs, in the layout of
# a build folder, and the shared libraries they need that the GPU machine lacks.
#
#   scripts/device-bundle.sh [--build DIR] [--out DIR] [--pack] [--max-mib 64]
#       --build   the CUDA build (configured with -DMOEPEAK_CUDA=ON); default build/
#       --out     where the bundle goes; default .device/ (git-ignored)
#       --pack    also pack it into DIR.tar.gz (the test binaries and OpenBLAS make the folder
#                 larger than a 64 MiB transfer; packed it is under 30 MiB); --max-mib then
#                 limits the packed file. Unpack there with `mkdir -p .device &&
#                 tar xzf .device.tar.gz -C .device`
#       --max-mib fail when the bundle is larger (a transfer limit); default 64
#
# Then, on the GPU machine, from the repository root:
#   LD_LIBRARY_PATH=.device/lib:/usr/local/cuda/targets/x86_64-linux/lib:/usr/lib/x86_64-linux-gnu \
#     MOEPEAK_BUILD_DIR=.device/build scripts/gpu-check.sh --no-build --out /tmp/gc \
#     --archive <a folder that comes back>/gpu-check.tar.gz
# (the CUDA runtime, cuBLAS and NCCL come from the GPU machine, and Open MPI where it has it: the
# bundle's fallback-lib/ copy is used only where it does not; glibc, libstdc++ and the dynamic
# loader come from the GPU machine too, so they must be at least as new as this machine's.)
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
build="$root/build"
out="$root/.device"
max_mib=64
pack=no
while [ $# -gt 0 ]; do
  case "$1" in
    --build) build="$2"; shift ;;
    --out) out="$2"; shift ;;
    --max-mib) max_mib="$2"; shift ;;
    --pack) pack=yes ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "device-bundle: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

# What gpu-check.sh runs without ctest: the binary and the three test binaries labelled `cuda`.
binaries=(moepeak tests/runtime/test_cuda_backend tests/comm/test_comm_nccl
          tests/ops/test_backend_ops)
for b in "${binaries[@]}"; do
  if [ ! -x "$build/$b" ]; then
    echo "device-bundle: $build/$b not found (build with -DMOEPEAK_CUDA=ON first)" >&2
    exit 1
  fi
done
if ! ldd "$build/moepeak" | grep -q 'libcudart'; then
  echo "device-bundle: $build/moepeak has no CUDA backend (configure with -DMOEPEAK_CUDA=ON)" >&2
  exit 1
fi

rm -rf "$out"
mkdir -p "$out/lib"
for b in "${binaries[@]}"; do
  mkdir -p "$out/build/$(dirname "$b")"
  strip -o "$out/build/$b" "$build/$b"
done

# copy_libs PATTERN DIR: copies the shared libraries the binaries load whose file names match the
# regular expression PATTERN into DIR.
copy_libs() {
  local pattern="$1" dir="$2" lib name
  mkdir -p "$dir"
  for b in "${binaries[@]}"; do ldd "$build/$b"; done | awk '$2 == "=>" && $3 ~ /^\// { print $3 }' |
    sort -u | while read -r lib; do
      name="$(basename "$lib")"
      [[ "$name" =~ $pattern ]] || continue
      cp -L "$lib" "$dir/$name"
    done
}

# Shared libraries: the Debian ones a GPU machine with only the CUDA toolkit lacks (found by
# trying on one: spdlog, fmt, toml++, hwloc, numa, OpenBLAS with its Fortran runtime, udev;
# xxhash for the checkpoint checksums). The
# rest ldd resolves — CUDA, cuBLAS, NCCL, the C and C++ runtimes — come from the GPU machine.
copy_libs '^(libspdlog|libfmt|libtomlplusplus|libhwloc|libnuma|libopenblas|libgfortran|libquadmath|libudev|libxxhash|libsentencepiece|libpcre2-8|libutf8proc)[.-]' \
  "$out/lib"
# Open MPI and its libevent: the GPU machine is expected to have them (a process initialises MPI
# only when launched under mpirun, but the binary links it), yet a binary that cannot load costs
# a whole lease call, so they travel too, in fallback-lib/, which gpu-check.sh puts last on
# LD_LIBRARY_PATH (the machine's own copies win where it has them).
copy_libs '^(libmpi|libopen-rte|libopen-pal|libevent_core|libevent_pthreads|libz)[.-]' \
  "$out/fallback-lib"

bytes=$(du -sb "$out" | cut -f1)
mib=$(( (bytes + 1048575) / 1048576 ))
echo "device-bundle: $out: ${mib} MiB ($(ls "$out/lib" | wc -l) libraries, $(ls "$out/fallback-lib" | wc -l) fallback libraries, ${#binaries[@]} binaries)"
if [ "$pack" = yes ]; then
  tar czf "$out.tar.gz" -C "$out" .
  bytes=$(stat -c %s "$out.tar.gz")
  mib=$(( (bytes + 1048575) / 1048576 ))
  echo "device-bundle: packed into $out.tar.gz: ${mib} MiB"
fi
if [ "$mib" -gt "$max_mib" ]; then
  echo "device-bundle: larger than --max-mib $max_mib" >&2
  exit 1
fi
