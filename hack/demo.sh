#!/usr/bin/env bash
# Runs inside `go run ./hack/cluster -- hack/demo.sh` (KUBECONFIG,
# CONTROLLER_KUBECONFIG and PATH set by it): starts the controller, applies the example, shows `kubectl get id`,
# then keeps running until Ctrl-C (or exits at once with DEMO_ONCE=1).
set -euo pipefail
cd "$(dirname "$0")/.."
# make build stamps the version (git describe), which the start-up line logs.
make --no-print-directory build
# As its ServiceAccount, not admin: the demo runs on deploy/rbac.yaml's grants.
bin/uuid-controller --kubeconfig "${CONTROLLER_KUBECONFIG:-$KUBECONFIG}" --health-addr 127.0.0.1:0 --metrics-addr 127.0.0.1:0 &
ctrl=$!
stop() {
	trap '' INT TERM # a second signal must not cut the stop short
	kill -TERM $ctrl 2>/dev/null || true
	wait $ctrl || true
	echo "demo: the controller stopped"
}
trap stop EXIT
# Ctrl-C (SIGINT from the terminal, SIGTERM from hack/cluster) is how the
# demo ends: a clean stop, exit 0.
trap 'exit 0' INT TERM
kubectl apply -f examples/uuid.yaml
id=""
for _ in $(seq 100); do
	id=$(kubectl get id example -o jsonpath='{.status.uuid}' 2>/dev/null || true)
	[ -n "$id" ] && break
	sleep 0.1
done
kubectl get id
if [ -z "$id" ]; then
	echo "demo: example got no UUID within 10 s" >&2
	exit 1
fi
[ "${DEMO_ONCE:-}" = 1 ] && exit 0
echo "controller running; Ctrl-C stops it and the cluster"
wait $ctrl
