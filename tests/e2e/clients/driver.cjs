// A real MCP client, the official TypeScript SDK (@modelcontextprotocol/sdk),
// from .clients/node (scripts/install-clients); the node of .clients runs it.
//
//     node driver.cjs NODE_MODULES SPEC.json
//
// SPEC and output as tests/e2e/clients/driver.py (the Python SDK's driver):
// {"timeout", "sessions": {KEY: {"command", "args", "env", "roots", "calls"}}}
// -> {KEY: {"server", "protocol", "tools", "calls", "seconds"} or "error", "stage"}.
// StdioClientTransport gives the server getDefaultEnvironment() (HOME,
// LOGNAME, PATH, SHELL, TERM, USER of this process) plus the config's env.
// What is left behind after a session is checked by the test (the TS SDK
// kills nothing but its own child), from the supervisor's list and /proc.
"use strict";
const { createRequire } = require("node:module");
const fs = require("node:fs");
const path = require("node:path");
const { pathToFileURL } = require("node:url");

const [nodeModules, specPath] = process.argv.slice(2);
const req = createRequire(path.join(nodeModules, "noop.js"));
const { Client } = req("@modelcontextprotocol/sdk/client/index.js");
const { StdioClientTransport } = req("@modelcontextprotocol/sdk/client/stdio.js");
const { ListRootsRequestSchema } = req("@modelcontextprotocol/sdk/types.js");
const sdkVersion = JSON.parse(fs.readFileSync(
  path.join(nodeModules, "@modelcontextprotocol", "sdk", "package.json"), "utf8")).version;

function textOf(result) {
  return (result.content || []).filter((c) => c.type === "text").map((c) => c.text).join("\n");
}

async function session(spec, timeout) {
  const out = {};
  let stage = "start";
  const roots = spec.roots;
  const client = new Client({ name: "landlock-supervisor-tests", version: "1" },
                            { capabilities: roots ? { roots: {} } : {} });
  if (roots) {
    client.setRequestHandler(ListRootsRequestSchema, async () => ({
      roots: roots.map((p) => ({ uri: pathToFileURL(p).href, name: path.basename(p) })),
    }));
  }
  const transport = new StdioClientTransport({
    command: spec.command, args: spec.args || [], env: spec.env || {}, stderr: "inherit",
  });
  const opts = { timeout: timeout * 1000 };
  try {
    stage = "initialize";
    await client.connect(transport, opts);
    const info = client.getServerVersion();
    out.server = info && info.name;
    stage = "tools/list";
    out.tools = (await client.listTools({}, opts)).tools.map((t) => t.name).sort();
    const settle = spec.settle;
    if (settle) {
      stage = `settle ${settle.tool}`;
      const deadline = Date.now() + timeout * 1000;
      while (!textOf(await client.callTool({ name: settle.tool, arguments: settle.arguments }, undefined, opts))
        .includes(settle.until)) {
        if (Date.now() > deadline) throw new Error(`no ${settle.until} in ${settle.tool}`);
        await new Promise((r) => setTimeout(r, 50));
      }
    }
    out.calls = [];
    for (const call of spec.calls || []) {
      stage = `tools/call ${call.tool}`;
      const result = await client.callTool({ name: call.tool, arguments: call.arguments || {} }, undefined, opts);
      out.calls.push({ isError: Boolean(result.isError), text: textOf(result) });
    }
    stage = "close";
  } catch (e) {
    out.error = `${e && e.name}: ${e && e.message}`;
    out.stage = stage;
  } finally {
    try {
      await client.close();
    } catch (e) {
      out.error = out.error || `close: ${e && e.message}`;
    }
  }
  return out;
}

(async () => {
  const spec = JSON.parse(fs.readFileSync(specPath, "utf8"));
  const timeout = spec.timeout || 30;
  const results = { _sdk: sdkVersion };
  for (const [key, one] of Object.entries(spec.sessions)) {
    const t0 = Date.now();
    results[key] = await session(one, timeout);
    results[key].seconds = (Date.now() - t0) / 1000;
  }
  process.stdout.write(JSON.stringify(results) + "\n");
  process.exit(0);
})();
