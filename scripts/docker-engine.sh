#!/usr/bin/env bash
# Starts or stops a Docker engine for the docker sandbox tier on machines without systemd.
#   scripts/docker-engine.sh start   prints "started" if it started one, "running" if one was up
#   scripts/docker-engine.sh stop    stops the engine this script started
set -euo pipefail
pidfile=/tmp/skyrl-agent-dockerd.pid
case "${1:-}" in
  start)
    if docker info >/dev/null 2>&1; then echo running; exit 0; fi
    command -v dockerd >/dev/null || { echo "error: dockerd is not installed (apt-get install docker.io)" >&2; exit 2; }
    nohup dockerd >/tmp/skyrl-agent-dockerd.log 2>&1 &
    echo $! > "$pidfile"
    for _ in $(seq 1 60); do
      docker info >/dev/null 2>&1 && { echo started; exit 0; }
      sleep 0.5
    done
    echo "error: dockerd did not come up; see /tmp/skyrl-agent-dockerd.log" >&2; exit 1 ;;
  stop)
    [ -f "$pidfile" ] || exit 0
    pid=$(cat "$pidfile"); rm -f "$pidfile"
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 40); do kill -0 "$pid" 2>/dev/null || exit 0; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac
