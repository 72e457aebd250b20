# Shared by chat.sh and stream.sh (sourced, not run): the base URL, the auth header, the JSON body.
# shellcheck shell=bash
BASE_URL=${OPENAI_BASE_URL:-http://127.0.0.1:8000/v1}
AUTH=()
if [ -n "${OPENAI_API_KEY:-}" ]; then AUTH=(-H "Authorization: Bearer $OPENAI_API_KEY"); fi

# JSON string escaping for the prompt: backslashes, quotes, and newlines/tabs.
json_string() {
  local s=${1//\\/\\\\}
  s=${s//\"/\\\"}
  s=${s//$'\n'/\\n}
  s=${s//$'\t'/\\t}
  printf '"%s"' "$s"
}

# chat_body PROMPT STREAM: a chat request; a stream also asks for the final usage chunk.
chat_body() {
  local extra=""
  if [ "$2" = true ]; then extra=', "stream": true, "stream_options": {"include_usage": true}'; fi
  printf '{"model": "default", "messages": [{"role": "user", "content": %s}], "max_tokens": %s, "temperature": %s%s}' \
    "$(json_string "$1")" "${MAX_TOKENS:-32}" "${TEMPERATURE:-0}" "$extra"
}
