// The official `openai` npm package against dspark-serve: one reply, then the same request streamed.
//   cd clients/node && npm ci && node chat.mjs "What is the capital of France?"
// OPENAI_BASE_URL (default http://127.0.0.1:8000/v1) and OPENAI_API_KEY pick the server; MAX_TOKENS
// sets the length. HTTP only, so it runs against any OpenAI-compatible server.
import OpenAI from "openai";

const client = new OpenAI({
  baseURL: process.env.OPENAI_BASE_URL ?? "http://127.0.0.1:8000/v1",
  apiKey: process.env.OPENAI_API_KEY ?? "unused",
  maxRetries: 0,
});
const prompt = process.argv[2] ?? "What is the capital of France?";
const request = {
  model: "default",
  messages: [{ role: "user", content: prompt }],
  temperature: 0,
  max_tokens: Number(process.env.MAX_TOKENS ?? 32),
};

const reply = await client.chat.completions.create(request);
console.log(`chat> ${reply.choices[0].message.content}`);
console.log(`usage> completion=${reply.usage.completion_tokens}`);
// dspark-serve's extension: speculative statistics beside the standard fields.
if (reply.dspark_stats) console.log(`stats> mode=${reply.dspark_stats.mode} rounds=${reply.dspark_stats.rounds}`);

const stream = await client.chat.completions.create({
  ...request, stream: true, stream_options: { include_usage: true },
});
let text = "";
let usage = null;
for await (const chunk of stream) {
  if (chunk.choices.length > 0) text += chunk.choices[0].delta.content ?? "";
  if (chunk.usage) usage = chunk.usage;
}
console.log(`stream> ${text}`);
console.log(`stream-usage> completion=${usage?.completion_tokens}`);
