#!/usr/bin/env bash
# Installs the Debian packages the stack and the tests run: redis-server (the stack's shared
# dependency) and prometheus (promtool checks the shipped rules; the Prometheus tests scrape
# the stack). Skips what is present; needs root and apt-get, else says what to install.
set -euo pipefail
want=()
command -v redis-server >/dev/null 2>&1 || want+=(redis-server)
command -v promtool >/dev/null 2>&1 || want+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || want+=(prometheus-alertmanager)  # deploy/foreign
[ ${#want[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "missing Debian packages: ${want[*]}: install them (apt-get install ${want[*]})" >&2
  echo "or put redis-server and promtool on PATH, then run make again" >&2
  exit 1
fi
echo "installing Debian packages: ${want[*]} (apt-get, about a minute)"
(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${want[@]}") \
  >/tmp/canary-gameday-apt.log 2>&1 || { echo "apt-get failed: see /tmp/canary-gameday-apt.log" >&2; exit 1; }
