"""Both SDKs against a running poolgate serving the demo models (`make run ARGS=--demo`).

    .venv/bin/python examples/sdk_clients.py [http://127.0.0.1:8000] [api-key]
"""

import sys

import anthropic
import openai

base = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8000"
key = sys.argv[2] if len(sys.argv) > 2 else "sk-none"

oai = openai.OpenAI(base_url=base + "/v1", api_key=key)
print(oai.chat.completions.create(
    model="demo", messages=[{"role": "user", "content": "hello from openai"}]
).choices[0].message.content)
for chunk in oai.chat.completions.create(
        model="demo-claude", stream=True,
        messages=[{"role": "user", "content": "an OpenAI client, an Anthropic upstream"}]):
    print(chunk.choices[0].delta.content or "", end="", flush=True)
print()

claude = anthropic.Anthropic(base_url=base, api_key=key)
with claude.messages.stream(model="demo", max_tokens=128,
                            messages=[{"role": "user", "content": "an Anthropic client, an OpenAI upstream"}]) as s:
    for text in s.text_stream:
        print(text, end="", flush=True)
print()
