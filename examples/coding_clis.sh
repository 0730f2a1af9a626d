#!/usr/bin/env bash
# Claude Code and Qwen Code through poolgate. Point MODEL at a model (or alias)
# your workers serve; KEY at one of server.api_keys.
set -euo pipefail
BASE=${BASE:-http://127.0.0.1:8000}
KEY=${KEY:-sk-team-a-change-me}
MODEL=${MODEL:-claude-sonnet-4-6}

# Claude Code speaks Anthropic Messages: the root URL, no /v1.
ANTHROPIC_BASE_URL=$BASE ANTHROPIC_API_KEY=$KEY ANTHROPIC_MODEL=$MODEL \
  ANTHROPIC_SMALL_FAST_MODEL=$MODEL CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC=1 \
  claude -p "What does README.md say poolgate is?" --model "$MODEL"

# Qwen Code in OpenAI mode: the /v1 URL.
OPENAI_BASE_URL=$BASE/v1 OPENAI_API_KEY=$KEY OPENAI_MODEL=$MODEL \
  qwen "What does README.md say poolgate is?" --auth-type openai --model "$MODEL"
