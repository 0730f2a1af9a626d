// The Vercel AI SDK's default Responses flow, three turns: each turn sends the
// messages the previous ones returned (which the SDK turns into
// item_reference input items, as store defaults to true).
// Env: BASE_URL, API_KEY, MODEL; REASONING=1 treats the model as a reasoning
// model asked for medium effort (its reasoning items are referenced too) and
// starts each question with PREFIX. Prints one JSON line.
const { generateText, streamText } = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');

async function main() {
  const openai = createOpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY });
  const model = openai.responses(process.env.MODEL);
  const prefix = process.env.PREFIX || '';
  const providerOptions = process.env.REASONING === '1'
    ? { openai: { forceReasoning: true, reasoningEffort: 'medium', reasoningSummary: 'auto' } }
    : undefined;
  const options = { model, maxRetries: 0, providerOptions };
  const messages = [{ role: 'user', content: prefix + 'first question' }];
  const bodies = [];
  const texts = [];
  const reasoning = [];

  const first = await generateText({ ...options, messages });
  texts.push(first.text);
  reasoning.push(first.reasoningText || null);
  bodies.push(first.request.body);
  messages.push(...first.response.messages,
                { role: 'user', content: prefix + 'second question' });

  let failed = null;
  const second = streamText({ ...options, messages, onError: ({ error }) => { failed = error; } });
  texts.push(await second.text);
  reasoning.push((await second.reasoningText) || null);
  if (failed) throw failed;
  bodies.push((await second.request).body);
  messages.push(...(await second.response).messages,
                { role: 'user', content: prefix + 'third question' });

  const third = await generateText({ ...options, messages });
  texts.push(third.text);
  reasoning.push(third.reasoningText || null);
  bodies.push(third.request.body);
  console.log(JSON.stringify({ texts, reasoning, bodies }));
}

main().catch((err) => {
  console.error(String(err && err.stack || err));
  process.exit(1);
});
