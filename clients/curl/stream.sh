#!/usr/bin/env bash
# A streamed chat completion with curl -N: prints the raw server-sent events as they arrive,
# ending with a usage chunk and `data: [DONE]`. Same variables as chat.sh.
#   clients/curl/stream.sh "Write a haiku about the sea."
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
here=$(dirname "$0")
# shellcheck source=common.sh
. "$here/common.sh"

# -N turns off curl's output buffering, so each event shows as soon as the server sends it.
curl -sS -N --fail-with-body "${AUTH[@]}" -H "Content-Type: application/json" \
  -d "$(chat_body "${1:-What is the capital of France?}" true)" "$BASE_URL/chat/completions"
