#!/bin/bash
# `make gameday-k8s`: the Kubernetes game days (experiments/k8s/) against the running
# loopback cluster (`make k8s-up` first), from this machine, producing the same run folder
# and report as the local game days (reports/<run-id>/, reports/latest).
#
#   deploy/loopback/gameday-k8s.sh [gameday run options...]
#
# Default: all five experiments of experiments/k8s/ (the control, the router, broker and
# rollback-executor pod kills, the faulty canary as a real rollout of a bad build);
# GAMEDAY_K8S_EXPERIMENTS picks others, e.g. CI's three (deploy/loopback/ci.sh):
#   GAMEDAY_K8S_EXPERIMENTS="experiments/k8s/control.yaml experiments/k8s/rollback-pod-kill.yaml experiments/k8s/faulty-canary-rollout.yaml" The target is deploy/loopback/target.yaml (the cluster's kubeconfig and
# the overlay's credential files); the chaosk8s probes use the cluster's namespace.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO"

[ -s "$KUBECONFIG_FILE" ] || die "no cluster: $KUBECONFIG_FILE is missing; run 'make k8s-up' first"
[ -n "$(pid_of kube-apiserver)" ] || die "the loopback cluster is not running (no live kube-apiserver PID in $PIDS); run 'make k8s-up' first"
[ -d deploy/k8s/overlays/loopback/credentials ] || die "no credentials in deploy/k8s/overlays/loopback/credentials: run deploy/loopback/deploy-stack.sh (make k8s-up does)"

experiments=${GAMEDAY_K8S_EXPERIMENTS:-experiments/k8s/*.yaml}
export KUBECONFIG=$KUBECONFIG_FILE
export GAMEDAY_K8S_NAMESPACE=canarystack-loopback
# shellcheck disable=SC2086  # the experiment list is split (and globbed) on purpose
exec "$REPO/.venv/bin/gameday" run $experiments --target deploy/loopback/target.yaml "$@"
