#!/bin/bash
# Deploy the canarystack stack onto the loopback cluster with kustomize
# (deploy/k8s/overlays/loopback) and wait until its servers are Ready.
# Needs deploy/loopback/k8s-up.sh first. Writes the overlay's admin token (git-ignored) on
# first use, and the per-credential files under credentials/. Usage: deploy/loopback/deploy-stack.sh [--timeout-s 300]
set -euo pipefail
source "$(dirname "$0")/common.sh"
timeout_s=300
# vLLM model pods start in 1-2 min each on 2 cores (writing the model, then vLLM).
[ "$K8S_ENGINE" = vllm ] && timeout_s=900
while [ $# -gt 0 ]; do
    case "$1" in
    --timeout-s)
        [[ ${2:-} =~ ^[0-9]+$ ]] || die "--timeout-s needs a whole number of seconds, got '${2:-}'"
        timeout_s=$2
        shift 2
        ;;
    *) die "unknown argument '$1': the only option is --timeout-s SECONDS" ;;
    esac
done
# The overlay holding the credentials (its secretGenerator), and the one applied: the
# same, or with K8S_ENGINE=vllm, loopback-vllm (loopback with vLLM model pods).
OVERLAY=$REPO/deploy/k8s/overlays/loopback
APPLY=$OVERLAY
[ "$K8S_ENGINE" = vllm ] && APPLY=$REPO/deploy/k8s/overlays/loopback-vllm
NS=canarystack-loopback
pid_of kube-apiserver >/dev/null && pid_of kubelet >/dev/null ||
    die "the loopback cluster is not running: start it with deploy/loopback/k8s-up.sh (make k8s-up)"
# The credentials the overlay's secretGenerator reads (git-ignored files): the harness's
# admin token and one per capability (docs/ARCHITECTURE.md), created once, random.
[ -s "$OVERLAY/admin-token" ] || (umask 077 && openssl rand -hex 32 >"$OVERLAY/admin-token")
mkdir -p "$OVERLAY/credentials"
for name in $(sed -n 's|^ *- token=credentials/\([a-z0-9-]*\)$|\1|p' "$OVERLAY/kustomization.yaml"); do
    [ -s "$OVERLAY/credentials/$name" ] || (umask 077 && openssl rand -hex 32 >"$OVERLAY/credentials/$name")
done
start=$(date +%s)
kubectl_ apply -k "$APPLY" >"$LOGS/deploy-stack.log" 2>&1 ||
    { tail -20 "$LOGS/deploy-stack.log" >&2; die "kubectl apply -k $APPLY failed; log: $LOGS/deploy-stack.log"; }
for w in statefulset/broker deployment/model-baseline deployment/model-canary deployment/gate \
    deployment/rollback deployment/router deployment/router-b deployment/redis; do
    left=$((timeout_s - ($(date +%s) - start)))
    [ "$left" -gt 0 ] || left=1
    kubectl_ -n "$NS" rollout status "$w" --timeout="${left}s" >/dev/null 2>&1 || {
        kubectl_ -n "$NS" get pods -o wide >&2 || true
        kubectl_ -n "$NS" logs "$w" --tail=15 >&2 || true
        kubectl_ -n "$NS" logs "$w" --previous --tail=15 >&2 || true
        die "$w not Ready after ${timeout_s}s: see kubectl --kubeconfig $KUBECONFIG_FILE -n $NS describe $w, and $LOGS/kubelet.log"
    }
done
left=$((timeout_s - ($(date +%s) - start)))
[ "$left" -gt 0 ] || left=1
kubectl_ -n "$NS" wait --for=condition=complete job/release-init --timeout="${left}s" >/dev/null ||
    die "job/release-init did not complete: kubectl --kubeconfig $KUBECONFIG_FILE -n $NS logs job/release-init"
log "stack Ready in $(($(date +%s) - start))s (namespace $NS, model engine $K8S_ENGINE; router at http://127.0.0.1:18000)"
