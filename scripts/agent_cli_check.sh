#!/usr/bin/env bash
# Run the real Claude Code and Codex CLIs (npm) once against a running `dspark serve`, as a user
# would configure them (README: "Anthropic Messages and OpenAI Responses APIs"). Not part of `make
# test`: the two packages are about 800 MB. Usage: scripts/agent_cli_check.sh [BASE_URL] [WORKDIR]
set -euo pipefail
BASE=${1:-http://127.0.0.1:8000}
WORK=${2:-$(mktemp -d)}
mkdir -p "$WORK/home" "$WORK/codex"
cd "$WORK"
[ -x node_modules/.bin/claude ] || npm install --no-audit --no-fund --loglevel=error @anthropic-ai/claude-code @openai/codex >/dev/null
cat > codex/config.toml <<TOML
model = "default"
model_provider = "dspark"

[model_providers.dspark]
name = "dspark-serve"
base_url = "$BASE/v1"
wire_api = "responses"
TOML
echo "== $(node_modules/.bin/claude --version)"
HOME="$WORK/home" ANTHROPIC_BASE_URL="$BASE" ANTHROPIC_AUTH_TOKEN=unused ANTHROPIC_MODEL=default \
  ANTHROPIC_DEFAULT_HAIKU_MODEL=default DISABLE_TELEMETRY=1 CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  timeout 300 node_modules/.bin/claude -p "Say hi" </dev/null || echo "(claude exited $?)"
echo "== $(node_modules/.bin/codex --version)"
HOME="$WORK/home" CODEX_HOME="$WORK/codex" timeout 300 node_modules/.bin/codex exec --skip-git-repo-check "Say hi" \
  </dev/null 2>&1 | grep -v '^warning' || echo "(codex exited $?)"
