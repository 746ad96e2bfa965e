#!/bin/bash
# CI's live Kubernetes game day (issue #15, "Done when"): on a disposable root machine,
# build the Kubernetes binaries into the cache if they are missing (build-k8s.sh, ~9-10 min
# cold on 2 cores, then seconds), start the loopback cluster (k8s-up.sh), deploy the stack
# (deploy-stack.sh), run the control, one pod kill and the faulty-canary rollout
# (gameday-k8s.sh: the same run folder and report as the local game days), and ALWAYS tear
# the cluster down (k8s-down.sh, from a trap: on success, failure, Ctrl-C or SIGTERM).
#
#   deploy/loopback/ci.sh [gameday run options...]
#
# Exit status: gameday run's when the cluster came up and went down cleanly (0 all passed,
# non-zero otherwise); 1 when a step before it failed; non-zero when k8s-down.sh leaves a
# process or a mount behind, even if the game days passed. GAMEDAY_K8S_EXPERIMENTS picks
# other experiments (default here: those three). It refuses to run beside a cluster that is already
# up in the same state folder: it starts and stops its own.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
cd "$REPO"

for c in "${COMPONENTS[@]}"; do
    if pid_of "$c" >/dev/null; then
        die "a loopback cluster is already running in $STATE ($c is up): ci.sh starts and stops its own; stop that one with deploy/loopback/k8s-down.sh, or set K8S_STATE and the K8S_*_PORT variables for another"
    fi
done

t0=$(date +%s)
GAMEDAY_LOG=$(mktemp /tmp/ci-k8s-gameday.XXXXXX)
WHY_FILE=$(mktemp /tmp/ci-k8s-why.XXXXXX)
phase_start=$t0
phases=()
phase() { # phase NAME: records how long the previous phase took
    local now
    now=$(date +%s)
    phases+=("$1 $((now - phase_start))s")
    phase_start=$now
}

teardown() {
    local rc=$? down=0
    trap - EXIT INT TERM
    log "tearing the cluster down (k8s-down.sh)"
    "$HERE/k8s-down.sh" || down=$?
    phase k8s-down
    log "times: ${phases[*]}; total $(($(date +%s) - t0))s"
    if [ -s "$WHY_FILE" ]; then
        log "why the game days failed (repeated from above):"
        cat "$WHY_FILE"
    fi
    rm -f "$GAMEDAY_LOG" "$WHY_FILE"
    if [ "$down" -ne 0 ]; then
        log "k8s-down.sh failed ($down): something may be left running or mounted under $STATE"
        [ "$rc" -ne 0 ] || rc=$down
    fi
    exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# CI's three: the control, one pod kill (the rollback executor's, mid-rollback) and the
# faulty-canary rollout; gameday-k8s.sh alone runs all five.
export GAMEDAY_K8S_EXPERIMENTS=${GAMEDAY_K8S_EXPERIMENTS:-experiments/k8s/control.yaml experiments/k8s/rollback-pod-kill.yaml experiments/k8s/faulty-canary-rollout.yaml}

"$HERE/build-k8s.sh"
phase build-k8s
"$HERE/k8s-up.sh"
phase k8s-up
"$HERE/deploy-stack.sh"
phase deploy-stack
rc=0
"$HERE/gameday-k8s.sh" "$@" 2>&1 | tee "$GAMEDAY_LOG" || rc=$?
phase gameday-k8s
if [ "$rc" -ne 0 ]; then
    log "the game days failed (gameday run exited $rc); the report is under the run folder (reports/latest, or --out's)"
    # A CI log keeps only its tail and the cluster goes down below, so teardown prints
    # this last: why each experiment did not pass (gameday run's lines under its table),
    # and what each pod said that was not routine (errors, refusals, degraded health).
    {
        sed -n '/^[^ ].* (fail):$\|^[^ ].* (inconclusive):$/,/^report: /p' "$GAMEDAY_LOG" | grep -v '^report: '
        for dir in /var/log/pods/"${GAMEDAY_K8S_NAMESPACE:-canarystack-loopback}"_*; do
            [ -d "$dir" ] || continue
            lines=$(cat "$dir"/*/*.log 2>/dev/null | grep -E '"level": *"(warning|error|critical)"|Traceback|refused|overdue' | tail -n 8 | cut -c1-400) || true
            [ -z "$lines" ] || printf '%s said:\n%s\n' "$(basename "$dir")" "$lines"
        done
    } >"$WHY_FILE" || true
fi
# The load came from the Locust worker pods (target.yaml's load_workers): every experiment
# that ran a load counts records from every worker (#25).
out=reports prev=""  # gameday run's --out (its run folder is OUT/latest)
for a in "$@"; do
    case "$a" in --out=*) out=${a#--out=} ;; esac
    [ "$prev" = "--out" ] && out=$a
    prev=$a
done
"$REPO/.venv/bin/python" "$HERE/check-load-workers.py" "$out/latest" || rc=${rc/#0/1}
phase load-workers
# Gate observers on this API server: Argo Rollouts, Flagger, HTTPRoute, VirtualService
# objects read as foreign gates, and the Locust master pod (#25); the drift judge's Argo
# AnalysisTemplate and Flagger MetricTemplate/Canary stored by their CRDs and driving a
# real judge (#29, 4 tests in ~4 s); router identity by the API server's TokenReview:
# every router pod listed as itself, no other credential lists one (#27). The modules use
# the running cluster.
CANARY_GAMEDAY_K8S_LIVE=1 "$REPO/.venv/bin/python" -m pytest -q -m k8s_live \
    tests/test_k8s_live_observers.py tests/test_judge_k8s_live.py \
    tests/test_k8s_live_identity.py || rc=${rc/#0/1}
phase observers
exit "$rc"
