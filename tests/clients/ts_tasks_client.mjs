// The TypeScript MCP SDK's experimental tasks client (protocol 2025-11-25) driving the
// gateway over stdio. Prints one JSON object per line on stdout, one per step, for
// tests/mcp/test_tasks_legacy.py to check. Usage:
//   node ts_tasks_client.mjs <scenario> <python> <gateway env as JSON> <cwd> [prompt]
// The SDK is installed by scripts/install-ts-mcp-sdk.sh; TS_MCP_SDK is its prefix (ES
// modules ignore NODE_PATH, so the SDK's files are imported by path).
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const sdk = (file) => import(pathToFileURL(
  join(process.env.TS_MCP_SDK, 'node_modules/@modelcontextprotocol/sdk/dist/esm', file)).href);
const { Client } = await sdk('client/index.js');
const { StdioClientTransport } = await sdk('client/stdio.js');
const { CallToolResultSchema, CreateTaskResultSchema } = await sdk('types.js');

const [scenario, python, envJson, cwd, prompt] = process.argv.slice(2);
const out = (step, data) => process.stdout.write(JSON.stringify({ step, ...data }) + '\n');

const transport = new StdioClientTransport({
  command: python, args: ['-m', 'gateway'], env: JSON.parse(envJson), cwd, stderr: 'ignore',
});
const client = new Client({ name: 'ts-tasks-test', version: '0' }, { capabilities: {} });
await client.connect(transport);
out('connected', {
  protocolVersion: transport.protocolVersion ?? null,
  tasks: client.getServerCapabilities()?.tasks ?? null,
});
const { tools } = await client.listTools();
const request = tools.find((t) => t.name === 'claude_request');
const asyncTool = tools.find((t) => t.name === 'claude_request_async');
out('tools', {
  claudeRequest: request?.execution ?? null, claudeRequestAsync: asyncTool?.execution ?? null,
});

async function stream(args) {
  const seen = [];
  for await (const message of client.experimental.tasks.callToolStream(
    { name: 'claude_request', arguments: args }, CallToolResultSchema)) {
    if (message.type === 'taskCreated') seen.push({ type: 'taskCreated', task: message.task });
    else if (message.type === 'taskStatus') seen.push({ type: 'taskStatus', status: message.task.status });
    else if (message.type === 'result') seen.push({ type: 'result', result: message.result });
    else if (message.type === 'error') seen.push({ type: 'error', message: String(message.error?.message ?? message.error) });
  }
  return seen;
}

try {
  if (scenario === 'stream') {
    out('stream', { messages: await stream({ prompt }) });
    const listed = await client.experimental.tasks.listTasks();
    out('list', { taskIds: listed.tasks.map((t) => t.taskId), nextCursor: listed.nextCursor ?? null });
    try {
      await client.experimental.tasks.getTask('no-such-task');
      out('unknown', { code: null });
    } catch (error) {
      out('unknown', { code: error.code ?? null, message: String(error.message) });
    }
    const plain = await client.callTool({ name: 'claude_request', arguments: { prompt: prompt + ' again' } });
    out('plain', { result: plain });
  } else if (scenario === 'cancel') {
    const created = await client.request(
      { method: 'tools/call', params: { name: 'claude_request', arguments: { prompt }, task: { ttl: 60000 } } },
      CreateTaskResultSchema);
    out('created', { task: created.task });
    // Cancel a run that has printed something (so its process is surely up), not a job
    // that has yet to spawn.
    while (!/running for .*, [1-9][0-9]* bytes/.test(
      (await client.experimental.tasks.getTask(created.task.taskId)).statusMessage)) {
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
    const cancelled = await client.experimental.tasks.cancelTask(created.task.taskId);
    out('cancelled', { task: cancelled });
    const after = await client.experimental.tasks.getTask(created.task.taskId);
    out('after', { task: after });
    const result = await client.experimental.tasks.getTaskResult(created.task.taskId, CallToolResultSchema);
    out('result', { result });
  }
} finally {
  await client.close();
}
