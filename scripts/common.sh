# Shared by scripts/demo.sh and scripts/test.sh: install the Debian packages the build needs
# (when missing), then configure and build into build/. Source it; do not run it.

MOEPEAK_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MOEPEAK_BUILD_DIR="${MOEPEAK_BUILD_DIR:-$MOEPEAK_ROOT/build}"

# Everything the build, the tests and the demo use, by Debian 12 package name.
MOEPEAK_PACKAGES=(
  cmake ninja-build g++ pkg-config git
  libhwloc-dev libnuma-dev libopenmpi-dev openmpi-bin
  libcli11-dev libtomlplusplus-dev libspdlog-dev libfmt-dev
  libgtest-dev libopenblas-dev nlohmann-json3-dev libxxhash-dev
  # `moepeak data prepare` (the library) and its tests (spm_train, spm_encode)
  libsentencepiece-dev sentencepiece
  python3-numpy
  # scripts/format.sh --check (the tree's formatting is clang-format 14's)
  clang-format-14
  # a private single-node Slurm for the srun tests (srun's mpi_pmix plugin dlopens libpmix.so)
  munge slurmctld slurmd slurm-client slurm-wlm-basic-plugins libpmix-dev
)

log() { printf '\033[1m[moepeak]\033[0m %s\n' "$*"; }

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

# configure_and_build [extra cmake args...]; builds the targets in $MOEPEAK_TARGETS (default all).
configure_and_build() {
  log "configuring $MOEPEAK_BUILD_DIR"
  cmake -S "$MOEPEAK_ROOT" -B "$MOEPEAK_BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
  log "building (${MOEPEAK_TARGETS:-all})"
  # shellcheck disable=SC2086
  cmake --build "$MOEPEAK_BUILD_DIR" -j "$(nproc)" ${MOEPEAK_TARGETS:+--target $MOEPEAK_TARGETS}
}

# Four MPI ranks on a 2-core machine, as root, quietly over shared memory.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl="${OMPI_MCA_btl:-self,vader}"
export OMPI_MCA_btl_vader_single_copy_mechanism=none
