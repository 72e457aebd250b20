#!/usr/bin/env bash
# One non-streamed chat completion with curl; prints the server's JSON reply.
#   clients/curl/chat.sh "What is the capital of France?"
# OPENAI_BASE_URL (default http://127.0.0.1:8000/v1), OPENAI_API_KEY (needed when the server has
# --api-key), MAX_TOKENS (default 32) and TEMPERATURE (default 0: greedy) adjust the request.
# shellcheck source-path=SCRIPTDIR
set -euo pipefail
here=$(dirname "$0")
# shellcheck source=common.sh
. "$here/common.sh"

curl -sS --fail-with-body "${AUTH[@]}" -H "Content-Type: application/json" \
  -d "$(chat_body "${1:-What is the capital of France?}" false)" "$BASE_URL/chat/completions"
echo
