# shellcheck shell=bash
# The common start of the tests that run a private Slurm (tests/slurm/test_*.sh): source it after
# setting `here` (this folder). It sources local_slurm.sh, makes the short temporary directory
# $tmp (the private Slurm's UNIX sockets live under it; 0755 because munged wants every directory
# above its socket searchable by all), stops the cluster and removes $tmp on exit, and sources
# tests/shell_checks.sh (check, contains, report).
# shellcheck source=tests/slurm/local_slurm.sh
source "$here/local_slurm.sh"
tmp=$(mktemp -d)
chmod 755 "$tmp"
trap 'local_slurm_stop; rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
# shellcheck source=tests/shell_checks.sh
source "$here/../shell_checks.sh"
