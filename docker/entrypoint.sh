#!/bin/sh
# The image's entrypoint: `dspark serve` with the given flags. The image binds 0.0.0.0 (DSPARK_HOST),
# which exposes the server to whatever the port mapping reaches, so it refuses to start without an
# API key (DSPARK_API_KEY or --api-key) unless DSPARK_ALLOW_NO_API_KEY=1 says that is intended.
set -eu

has_key_flag() {
  for arg in "$@"; do
    case "$arg" in --api-key|--api-key=?*) return 0 ;; esac
  done
  return 1
}

if [ -z "${DSPARK_API_KEY:-}" ] && ! has_key_flag "$@" && [ "${DSPARK_ALLOW_NO_API_KEY:-0}" != 1 ]; then
  echo "dspark-serve: refusing to listen on ${DSPARK_HOST:-127.0.0.1} without an API key." >&2
  echo "  Set DSPARK_API_KEY (clients send 'Authorization: Bearer KEY'), or DSPARK_ALLOW_NO_API_KEY=1" >&2
  echo "  if the published port is reachable only by you (e.g. -p 127.0.0.1:8000:8000)." >&2
  exit 64
fi
exec dspark serve "$@"
