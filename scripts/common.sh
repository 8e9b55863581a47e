# Shared by scripts/demo.sh and scripts/test.sh: install the Debian packages the build needs
# (when missing), then configure and build into build/. Source it; do not run it.

MOEPEAK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOEPEAK_BUILD_DIR="${MOEPEAK_BUILD_DIR:-$MOEPEAK_ROOT/build}"

# Everything the build, the tests and the demo use, by Debian 12 package name.
MOEPEAK_PACKAGES=(
  cmake ninja-build g++ pkg-config git
  # the compiler cache every tree builds through (MOEPEAK_CCACHE=0 turns it off)
  ccache
  libhwloc-dev libnuma-dev libopenmpi-dev openmpi-bin
  libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
  libgtest-dev libopenblas-dev nlohmann-json3-dev libxxhash-dev
  # `moepeak data prepare` (the library) and its tests (spm_train, spm_encode)
  libsentencepiece-dev sentencepiece
  # tokenizer.json: regular expressions with Unicode properties, NFC/NFKC normalization
  libpcre2-dev libutf8proc-dev
  python3-numpy
  # protoc: the tests check metrics.tensorboard's hand-encoded events against its .proto
  protobuf-compiler
  # scripts/format.sh --check (the tree's formatting is clang-format 14's)
  clang-format-14
  # a private single-node Slurm for the srun tests (srun's mpi_pmix plugin dlopens libpmix.so)
  munge slurmctld slurmd slurm-client slurm-wlm-basic-plugins libpmix-dev
  # the two-node Slurm in network namespaces (ip netns, veth, bridge; nsenter, unshare)
  iproute2 util-linux
)

# Each line carries the time since the script started, so a CI log shows where its time went.
log() { printf '\033[1m[moepeak +%dm%02ds]\033[0m %s\n' $((SECONDS / 60)) $((SECONDS % 60)) "$*"; }

install_packages() {
  local missing=()
  for pkg in "${MOEPEAK_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ ${#missing[@]} -eq 0 ]; then
    log "all ${#MOEPEAK_PACKAGES[@]} packages present"
    return
  fi
  local sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "moepeak: missing packages (${missing[*]}) and not root: install them and rerun" >&2
      exit 1
    fi
  fi
  log "installing: ${missing[*]}"
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# ---- The compiler cache (docs/building.md) ------------------------------------------------------
# Every tree (build/, build-emulated/, build-asan/, build-tsan/; nvcc too when CUDA is on) compiles
# through ccache, whose settings travel in the launcher (`env CCACHE_...=... ccache`), so a later
# `ninja -C build` by hand keeps them. The cache is shared by every checkout on the machine:
# CCACHE_BASEDIR hands the compiler paths relative to the build folder, and with NOHASHDIR the
# folder is not hashed, so a fresh clone in another folder compiles nothing that an earlier build
# already compiled (the debug information then names the folder that compiled it first). The
# sloppiness lets precompiled headers be cached (CMakeLists.txt).
#   MOEPEAK_CCACHE=0          compile without it (the launchers are cleared in a configured tree)
#   MOEPEAK_CCACHE_SIZE=10G   the cache's bound; ccache evicts the oldest entries past it
#   CCACHE_DIR                where it lives (ccache's default: ~/.cache/ccache)
moepeak_ccache_enabled() { [[ "${MOEPEAK_CCACHE:-1}" != 0 ]] && command -v ccache >/dev/null 2>&1; }

# moepeak_ccache_settings: the settings as VAR=value words, for the launcher and the report.
moepeak_ccache_settings() {
  echo "CCACHE_BASEDIR=$MOEPEAK_ROOT" CCACHE_NOHASHDIR=1 \
    CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime \
    "CCACHE_MAXSIZE=${MOEPEAK_CCACHE_SIZE:-10G}"
}

# moepeak_launcher_args: the cmake arguments that put ccache in front of every compiler, or take it
# away.
moepeak_launcher_args() {
  local launcher=""
  if moepeak_ccache_enabled; then
    local settings
    settings="$(moepeak_ccache_settings)"
    launcher="env;${settings// /;};$(command -v ccache)"
  fi
  local lang
  for lang in C CXX CUDA; do printf -- '-DCMAKE_%s_COMPILER_LAUNCHER=%s\n' "$lang" "$launcher"; done
}

# ccache_zero, then ccache_report at the end: the cache's statistics of this run, for the CI log.
ccache_zero() { if moepeak_ccache_enabled; then ccache --zero-stats >/dev/null; fi; }
ccache_report() {
  if moepeak_ccache_enabled; then
    log "compiler cache (ccache --show-stats, this run)"
    # shellcheck disable=SC2046
    env $(moepeak_ccache_settings) ccache --show-stats
  fi
}

# configure_and_build [extra cmake args...]; builds the targets in $MOEPEAK_TARGETS (default all).
configure_and_build() {
  log "configuring $MOEPEAK_BUILD_DIR"
  local launchers
  mapfile -t launchers < <(moepeak_launcher_args)
  cmake -S "$MOEPEAK_ROOT" -B "$MOEPEAK_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    --no-warn-unused-cli "${launchers[@]}" "$@"
  log "building (${MOEPEAK_TARGETS:-all})"
  # shellcheck disable=SC2086
  cmake --build "$MOEPEAK_BUILD_DIR" -j "$(nproc)" ${MOEPEAK_TARGETS:+--target $MOEPEAK_TARGETS}
}

# Four MPI ranks on a 2-core machine, as root, quietly over shared memory.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_btl_vader_single_copy_mechanism=none

# ---- Sanitizers: scripts/test.sh --sanitize LIST (docs/reliability.md#sanitizers) ---------------
# sanitize_build_dir LIST: the tree of a sanitizer list (address,undefined -> build-asan/,
# thread -> build-tsan/, any other -> build-sanitize-LIST/ with commas as dashes).
sanitize_build_dir() {
  case "$1" in
    address,undefined | undefined,address) echo "$MOEPEAK_ROOT/build-asan" ;;
    thread) echo "$MOEPEAK_ROOT/build-tsan" ;;
    *) echo "$MOEPEAK_ROOT/build-sanitize-${1//,/-}" ;;
  esac
}

# sanitized_build LIST: configure and build LIST's tree, CPU only, warnings as errors (the targets
# in $MOEPEAK_TARGETS, default all).
sanitized_build() {
  MOEPEAK_BUILD_DIR="$(sanitize_build_dir "$1")" configure_and_build \
    -DMOEPEAK_SANITIZE="$1" -DMOEPEAK_CUDA=OFF -DMOEPEAK_WERROR=ON
}

# NOTES: ThreadSanitizer slows threaded code 5-15x, so the whole suite does not fit the tests'
# timeouts on 2 cores; it runs what has threads that can race: streams and events, the arena and
# pinned pool (freed from stream threads), comm (MPI operations on stream threads, 2-4 ranks) and
# the collective watchdog, every schedule's race test (slowed streams) and the overlapped parallel
# steps. Each is a ctest test; sanitize_default_targets names the targets that build them. What
# cannot run and why: docs/reliability.md#sanitizers.
MOEPEAK_TSAN_TESTS=(test_streams test_stream_profile test_arena test_pinned_pool test_tensor_ops
  test_comm_single test_comm_mpi test_comm_link test_watchdog test_sco test_adamw_offload
  test_adamw_offload_parallel_np2 test_adamw_kernels test_gemm_bf16 test_ring_dtp
  test_ring_dtp_np2 test_llep_np2 test_zero_traffic test_ulysses_np2 test_expert_parallel_2
  test_zero_params_np2)

# sanitize_default_tests LIST: the ctest arguments of what runs under LIST when none are given.
sanitize_default_tests() {
  case "$1" in
    thread)
      local names="${MOEPEAK_TSAN_TESTS[*]}"
      echo "-LE sanitize-ci -R ^(${names// /|})$"
      ;;
    *)
      # Everything (the CI subset's ci_ copies aside): the tests' processes are all sanitized,
      # those started by mpirun, srun or a shell script included.
      echo "-LE sanitize-ci"
      ;;
  esac
}

# sanitize_default_targets LIST: the build targets those tests need ("" = all). A test NAME_npN
# (or NAME_2) runs NAME's executable on another number of ranks (tests/CMakeLists.txt).
sanitize_default_targets() {
  case "$1" in
    thread) printf '%s\n' "${MOEPEAK_TSAN_TESTS[@]}" | sed -E 's/_(np[0-9]+|2)$//' | sort -u | xargs ;;
    *) echo "" ;;
  esac
}

# sanitized_ctest LIST [ctest args]: runs LIST's tree's tests with the sanitizers' runtime options
# (sanitize_default_tests without ctest args).
sanitized_ctest() {
  local list="$1"
  shift
  local dir supp args
  dir="$(sanitize_build_dir "$list")"
  supp="$MOEPEAK_ROOT/tests/sanitize"
  if [[ $# -gt 0 ]]; then args=("$@"); else read -r -a args <<<"$(sanitize_default_tests "$list")"; fi
  log "running the tests under -fsanitize=$list in $dir (${args[*]})"
  # NOTES: a report ends the process with an error (halt_on_error), so the test fails. The options
  # are in the environment, which mpirun hands on to the ranks it starts on this node (and srun,
  # with its default --export=ALL, to its tasks). LeakSanitizer and ThreadSanitizer read their
  # suppressions of third-party frames from tests/sanitize/ (each entry says why it is not ours).
  env ASAN_OPTIONS="halt_on_error=1:detect_leaks=1:check_initialization_order=1:strict_string_checks=1:fast_unwind_on_malloc=0" \
    LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1" \
    TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1:suppressions=$supp/tsan.supp" \
    ctest --test-dir "$dir" --output-on-failure -j "$(nproc)" "${args[@]}"
}
