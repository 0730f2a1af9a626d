// The Vercel AI SDK's default Responses flow, three turns: each turn sends the
// messages the previous ones returned (which the SDK turns into
// item_reference input items, as store defaults to true).
// Env: BASE_URL, API_KEY, MODEL. Prints one JSON line.
const { generateText, streamText } = require('ai');
const { createOpenAI } = require('@ai-sdk/openai');

async function main() {
  const openai = createOpenAI({ baseURL: process.env.BASE_URL, apiKey: process.env.API_KEY });
  const model = openai.responses(process.env.MODEL);
  const messages = [{ role: 'user', content: 'first question' }];
  const bodies = [];
  const texts = [];

  const first = await generateText({ model, messages, maxRetries: 0 });
  texts.push(first.text);
  bodies.push(first.request.body);
  messages.push(...first.response.messages, { role: 'user', content: 'second question' });

  const second = streamText({ model, messages, maxRetries: 0,
                              onError: ({ error }) => { console.error(String(error)); process.exitCode = 1; } });
  texts.push(await second.text);
  bodies.push((await second.request).body);
  messages.push(...(await second.response).messages, { role: 'user', content: 'third question' });

  const third = await generateText({ model, messages, maxRetries: 0 });
  texts.push(third.text);
  bodies.push(third.request.body);
  console.log(JSON.stringify({ texts, bodies }));
}

main().catch((err) => {
  console.error(String(err && err.stack || err));
  process.exit(1);
});
