#!/bin/bash
# Stop the loopback cluster that k8s-up.sh started (make k8s-down), leaving nothing behind:
#  1. delete every workload and pod through the API, so that the kubelet itself stops the
#     containers and unmounts their volumes (killing the kubelet first leaves mounts behind);
#  2. wait (bounded) until containerd runs no task;
#  3. stop every process by the PID recorded in $K8S_STATE/pids (TERM, then KILL after 10 s),
#     and any containerd shim by the PID containerd recorded in its own state folder;
#  4. unmount whatever is still mounted under the state folder.
# Images (containerd's content store), certificates and logs stay for the next k8s-up; remove
# the state folder to start from nothing. Exits non-zero if anything is left.
set -uo pipefail
source "$(dirname "$0")/common.sh"

if [ ! -d "$STATE" ]; then
    log "nothing to stop ($STATE does not exist)"
    exit 0
fi

# 1. Workloads and pods, through the API (only while the kubelet can still act on it).
if pid_of kube-apiserver >/dev/null && pid_of kubelet >/dev/null; then
    log "deleting workloads and pods through the API"
    kubectl_ delete cronjobs.batch,deployments.apps,statefulsets.apps,daemonsets.apps,replicasets.apps,jobs.batch \
        --all --all-namespaces --wait=false --request-timeout=10s >/dev/null 2>&1
    kubectl_ delete pods --all --all-namespaces --grace-period=1 --wait=false --request-timeout=10s >/dev/null 2>&1
    # 2. Bounded waits: containers gone, then the pod sandboxes.
    if pid_of containerd >/dev/null; then
        wait_for 60 "containers" sh -c "[ -z \"\$(ctr -a '$CTD/containerd.sock' -n k8s.io tasks ls -q 2>/dev/null)\" ]" ||
            log "containerd still runs tasks after 60 s: stopping anyway"
        wait_for 20 "sandboxes" sh -c "[ -z \"\$(ls '$CTD/state/io.containerd.grpc.v1.cri/sandboxes' 2>/dev/null)\" ]" || true
    fi
    # Pods the kubelet can no longer see are removed with it; persistent volumes' data stays
    # under the kubelet folder until the state folder is removed.
fi

# 3. Processes, in reverse start order, each by its recorded PID.
stop_pid() { # stop_pid NAME PID
    local name=$1 pid=$2
    kill -TERM "$pid" 2>/dev/null || return 0
    if ! wait_for 10 "$name" sh -c "! kill -0 $pid"; then
        log "$name (PID $pid) ignored SIGTERM for 10 s: SIGKILL"
        kill -KILL "$pid" 2>/dev/null
        wait_for 5 "$name" sh -c "! kill -0 $pid" || log "$name (PID $pid) is still alive"
    fi
}
for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
    c=${COMPONENTS[$i]}
    if pid=$(pid_of "$c"); then
        stop_pid "$c" "$pid"
    fi
    [ -n "$(pid_of "$c")" ] || rm -f "$PIDS/$c.pid"
    if [ "$c" = containerd ]; then
        # Shims outlive containerd; each one's PID is in containerd's state folder.
        for f in "$CTD"/state/io.containerd.runtime.v2.task/*/*/shim.pid; do
            [ -f "$f" ] || continue
            spid=$(cat "$f")
            [[ $spid =~ ^[0-9]+$ ]] && stop_pid "containerd-shim" "$spid"
        done
    fi
done

# 4. Mounts left under the state folder (volumes, rootfs overlays, /dev/shm of sandboxes).
for m in $(mounts_under "$STATE"); do
    umount "$m" 2>/dev/null || umount -l "$m" 2>/dev/null || log "cannot unmount $m"
done
# Only with nothing mounted any more (a bind mount left under it would be followed).
[ -n "$(mounts_under "$STATE")" ] || rm -rf "$STATE/etcd" "$CTD/state" "$KUBELET_DIR/root" "$STATE/volumes"

# What is left, if anything, is an error.
left=()
for f in "$PIDS"/*.pid; do
    [ -f "$f" ] || continue
    pid=$(cat "$f")
    if kill -0 "$pid" 2>/dev/null; then left+=("$(basename "$f" .pid) (PID $pid)"); else rm -f "$f"; fi
done
mounts=$(mounts_under "$STATE" | tr '\n' ' ')
if [ ${#left[@]} -gt 0 ] || [ -n "$mounts" ]; then
    die "left behind: processes: ${left[*]:-none}; mounts: ${mounts:-none}"
fi
log "down: no process and no mount left under $STATE"
