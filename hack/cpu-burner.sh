#!/usr/bin/env bash
# Keeps every core busy, as a second `make test` on a shared CI machine
# would, while a command runs beside it; the burners stop when the command
# ends (or on Ctrl-C), and the command's exit code is the script's.
#
#   hack/cpu-burner.sh [-n BURNERS] -- COMMAND [ARGS...]
#
# BURNERS defaults to the number of cores (nproc). Each burner is a busy
# shell loop at normal priority; they are stopped by PID.
set -o errexit -o nounset -o pipefail

burner::usage() {
  echo "usage: $0 [-n BURNERS] -- COMMAND [ARGS...]" >&2
  exit 2
}

burner::start() {
  local n=$1 i
  BURNER_PIDS=()
  for ((i = 0; i < n; i++)); do
    ( while :; do :; done ) &
    BURNER_PIDS+=("$!")
  done
  echo "cpu-burner: ${n} busy loops (PIDs ${BURNER_PIDS[*]}) on $(nproc) cores" >&2
}

burner::stop() {
  local pid
  for pid in "${BURNER_PIDS[@]:-}"; do
    [[ -n ${pid} ]] && kill "${pid}" 2>/dev/null || true
  done
  for pid in "${BURNER_PIDS[@]:-}"; do
    [[ -n ${pid} ]] && wait "${pid}" 2>/dev/null || true
  done
}

burner::main() {
  local n
  n=$(nproc)
  while [[ $# -gt 0 ]]; do
    case $1 in
      -n) [[ $# -ge 2 ]] || burner::usage; n=$2; shift 2 ;;
      --) shift; break ;;
      *) burner::usage ;;
    esac
  done
  [[ $# -gt 0 ]] || burner::usage
  [[ ${n} =~ ^[0-9]+$ ]] || burner::usage
  burner::start "${n}"
  trap burner::stop EXIT
  local rc=0
  "$@" || rc=$?
  return "${rc}"
}

burner::main "$@"
