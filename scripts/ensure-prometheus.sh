#!/usr/bin/env bash
# Makes sure Prometheus and promtool are installed, for QSM's metrics tests (issue 26): Debian's
# `prometheus` package where they are missing. The tests start their own Prometheus on a
# loopback port with their own configuration and storage; the service the package may start
# is not used. Idempotent; safe to run concurrently (a lock serialises the installers).
set -euo pipefail
have() { command -v prometheus >/dev/null && command -v promtool >/dev/null; }
have && exit 0
exec 9>/tmp/qsm-ensure-prometheus.lock
flock 9
have && exit 0
SUDO=""
[ "$(id -u)" = 0 ] || SUDO="sudo"
echo "ensure-prometheus: installing Prometheus from Debian's packages" >&2
# The service the package installs is not used (where it starts, it listens on :9090).
install() { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }
install || { $SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && install; }
have || { echo "ensure-prometheus: prometheus or promtool missing after the install" >&2; exit 1; }
