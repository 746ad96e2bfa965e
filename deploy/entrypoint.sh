#!/bin/sh
# Entry point of the canarystack image (deploy/Dockerfile). The first argument is a role:
#
#   serve COMPONENT [ARGS]   python -m canarystack.COMPONENT ARGS (model, engine, broker,
#                            router, gate, rollback) once the admin token is a real one
#                            (engine: a real engine's pod, vLLM in the canarystack-vllm
#                            image of deploy/Dockerfile.vllm)
#   release-init [ARGS]      python deploy/release_init.py ARGS (create the release once)
#   gameday-run [ARGS]       gameday run EXPERIMENTS --target $GAMEDAY_TARGET --out
#                            $GAMEDAY_REPORTS ARGS; EXPERIMENTS from $GAMEDAY_EXPERIMENTS
#                            (a glob, default: every experiment in experiments/k8s/)
#   locust-master [ARGS]     one bounded headless Locust run as the master of
#                            $LOCUST_EXPECT_WORKERS workers; records and summary into a new
#                            folder under $LOCUST_RECORDS_DIR (latest -> it); then it idles
#                            so the records can be copied out with kubectl cp
#   locust-worker [ARGS]     a Locust worker of $LOCUST_MASTER_HOST, reconnecting after each
#                            run (so a new master run finds it) until the pod stops
#   anything else            run as given (e.g. sh, python)
#
# The admin token: a file ($CANARYSTACK_ADMIN_TOKEN_FILE) or the environment variable
# CANARYSTACK_ADMIN_TOKEN. This script refuses to start a component or a game day with no
# token, a token shorter than 16 characters, or the placeholder shipped in deploy/k8s:
# an admin API guarded by a well-known token is an open admin API. It never prints the
# token, and it never kills anything but the processes it started itself.
set -eu

PYTHON="${PYTHON:-python}"
APP_DIR="${APP_DIR:-/app}"
PLACEHOLDER="REPLACE-ME-create-the-secret-see-deploy-k8s-README"
MIN_TOKEN_CHARS=16

die() {
    echo "entrypoint: $*" >&2
    exit 64
}

check_token() {
    token=""
    if [ -n "${CANARYSTACK_ADMIN_TOKEN_FILE:-}" ]; then
        [ -r "$CANARYSTACK_ADMIN_TOKEN_FILE" ] ||
            die "the credential file $CANARYSTACK_ADMIN_TOKEN_FILE cannot be read: mount this pod's own credential Secret (canarystack-<credential>, key: token) there (docs/ARCHITECTURE.md §8)."
        token=$(tr -d ' \t\r\n' <"$CANARYSTACK_ADMIN_TOKEN_FILE")
    else
        token=$(printf '%s' "${CANARYSTACK_ADMIN_TOKEN:-}" | tr -d ' \t\r\n')
    fi
    [ -n "$token" ] ||
        die "no admin token: set CANARYSTACK_ADMIN_TOKEN_FILE (the mounted Secret) or CANARYSTACK_ADMIN_TOKEN."
    [ "$token" != "$PLACEHOLDER" ] ||
        die "the admin token is still the placeholder from deploy/k8s/base: create the real Secret first (openssl rand -hex 32 > deploy/k8s/overlays/<env>/admin-token; see docs/kubernetes.md)."
    [ "${#token}" -ge "$MIN_TOKEN_CHARS" ] ||
        die "the admin token has ${#token} characters; use at least $MIN_TOKEN_CHARS (openssl rand -hex 32)."
    unset token
}

# Run a child in the background and pass SIGTERM/SIGINT on to it (this shell is PID 1).
child=""
forward() {
    if [ -n "$child" ]; then kill -TERM "$child" 2>/dev/null || true; fi
}

idle_until_stopped() {
    trap 'exit 0' TERM INT
    while :; do
        sleep 1 &
        wait $! || true
    done
}

role="${1:-}"
[ -n "$role" ] || die "no role given: use serve COMPONENT, release-init, gameday-run, locust-master or locust-worker."
shift

case "$role" in
serve)
    component="${1:-}"
    case "$component" in
    model | engine | broker | router | gate | rollback) ;;
    *) die "serve what? '$component' is not a component: use model, engine, broker, router, gate or rollback." ;;
    esac
    shift
    check_token
    exec "$PYTHON" -m "canarystack.$component" "$@"
    ;;
release-init)
    check_token
    exec "$PYTHON" "$APP_DIR/deploy/release_init.py" "$@"
    ;;
gameday-run)
    check_token
    : "${GAMEDAY_TARGET:?set GAMEDAY_TARGET to the target file (the gameday-target ConfigMap)}"
    reports="${GAMEDAY_REPORTS:-/reports}"
    # The glob is expanded here, on purpose (a CronJob's args cannot glob).
    # shellcheck disable=SC2086
    set -- ${GAMEDAY_EXPERIMENTS:-$APP_DIR/experiments/k8s/*.yaml} --target "$GAMEDAY_TARGET" --out "$reports" "$@"
    exec "$PYTHON" -m gameday.cli run "$@"
    ;;
locust-master)
    records_root="${LOCUST_RECORDS_DIR:-/records}"
    run_dir="$records_root/$(date -u +%Y%m%dT%H%M%SZ)"
    mkdir -p "$run_dir"
    trap forward TERM INT
    "$PYTHON" -m locust -f "$APP_DIR/locustfiles/llm.py" --master --headless \
        --expect-workers "${LOCUST_EXPECT_WORKERS:-2}" \
        --records-out "$run_dir/records.parquet" --summary-out "$run_dir/summary.json" \
        --csv "$run_dir/locust" "$@" >"$run_dir/locust.log" 2>&1 &
    child=$!
    # Show Locust's output in the pod's log too.
    tail -n +1 -f "$run_dir/locust.log" &
    tailer=$!
    # A SIGTERM interrupts wait (and is passed on): wait again until Locust has written
    # its records and exited, and keep its own exit code.
    while :; do
        code=0
        wait "$child" || code=$?
        kill -0 "$child" 2>/dev/null || break
    done
    kill "$tailer" 2>/dev/null || true
    echo "$code" >"$run_dir/exit-code"
    ln -sfn "$run_dir" "$records_root/latest"
    echo "entrypoint: Locust exited with $code; records in $run_dir (kubectl cp them out)"
    idle_until_stopped
    ;;
locust-worker)
    : "${LOCUST_MASTER_HOST:?set LOCUST_MASTER_HOST to the master Service (locust-master)}"
    stopping=""
    trap 'stopping=1; forward' TERM INT
    while [ -z "$stopping" ]; do
        "$PYTHON" -m locust -f "$APP_DIR/locustfiles/llm.py" --worker \
            --master-host "$LOCUST_MASTER_HOST" "$@" &
        child=$!
        while :; do
            wait "$child" || true
            kill -0 "$child" 2>/dev/null || break
        done
        [ -n "$stopping" ] || sleep 2
    done
    ;;
*)
    exec "$role" "$@"
    ;;
esac
