// sluice chat: streamed replies from /v1/chat/completions (fetch + SSE parsing).
// Stop aborts the fetch; the server sees the disconnect and aborts the request.
"use strict";

const $ = (id) => document.getElementById(id);
const history = []; // {role, content} of the conversation so far
let modelName = null;
let controller = null; // the AbortController of the reply in flight

function apiKey() {
  return sessionStorage.getItem("sluice-api-key");
}

// fetch with the API key; on 401 ask for a key (kept in sessionStorage) and retry.
async function apiFetch(path, options = {}) {
  for (;;) {
    const headers = { "Content-Type": "application/json", ...(options.headers || {}) };
    if (apiKey()) headers.Authorization = `Bearer ${apiKey()}`;
    const response = await fetch(path, { ...options, headers });
    if (response.status !== 401) return response;
    const key = window.prompt("This server needs an API key:");
    if (!key) throw new Error("an API key is needed");
    sessionStorage.setItem("sluice-api-key", key);
  }
}

// Every served model in the picker (a server of several: each loads on its
// first request), the one chosen kept; the first by default.
async function loadModel() {
  const response = await apiFetch("/v1/models");
  const body = await response.json();
  const ids = body.data.map((model) => model.id);
  if (!ids.includes(modelName)) modelName = ids[0];
  const picker = $("model-picker");
  picker.replaceChildren(...body.data.map((model) => {
    const option = document.createElement("option");
    option.value = model.id;
    option.textContent = model.status && model.status !== "loaded"
      ? `${model.id} (${model.status})` : model.id;
    return option;
  }));
  picker.value = modelName;
  picker.closest("label").hidden = ids.length < 2;
  $("model-name").textContent = modelName;
}

function addMessage(role, text) {
  const element = document.createElement("div");
  element.className = `message ${role}`;
  const content = document.createElement("span");
  content.className = "content";
  content.textContent = text;
  element.appendChild(content);
  $("conversation").appendChild(element);
  element.scrollIntoView({ block: "end" });
  return element;
}

// Yields the JSON payload of each `data:` event of an SSE body until [DONE].
async function* sseEvents(body) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const data = event.split("\n").filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trim()).join("\n");
      if (data === "[DONE]") return;
      if (data) yield JSON.parse(data);
    }
  }
}

function requestBody() {
  const messages = [];
  const system = $("system-prompt").value.trim();
  if (system) messages.push({ role: "system", content: system });
  return {
    model: modelName,
    messages: messages.concat(history),
    stream: true,
    stream_options: { include_usage: true },
    temperature: Number($("temperature").value),
    max_tokens: Number($("max-tokens").value),
  };
}

// Reads one streamed reply into `element`; returns its text and figures.
async function readReply(response, element, startedMs) {
  const content = element.querySelector(".content");
  const reply = { text: "", chunks: 0, firstMs: null, usage: null };
  for await (const event of sseEvents(response.body)) {
    if (event.error) throw new Error(event.error.message);
    if (event.usage) reply.usage = event.usage;
    const delta = event.choices && event.choices[0] && event.choices[0].delta;
    if (delta && delta.content) {
      reply.firstMs ??= performance.now();
      reply.chunks += 1;
      reply.text += delta.content;
      content.textContent = reply.text;
      element.dataset.chunks = String(reply.chunks);
      element.scrollIntoView({ block: "end" });
    }
  }
  reply.ttftMs = reply.firstMs === null ? null : reply.firstMs - startedMs;
  reply.endMs = performance.now();
  return reply;
}

function showStats(element, reply) {
  const stats = document.createElement("span");
  stats.className = "stats";
  const parts = [];
  if (reply.usage) {
    const tokens = reply.usage.completion_tokens;
    parts.push(`${reply.usage.prompt_tokens} prompt + ${tokens} completion tokens`);
    if (reply.ttftMs !== null) parts.push(`TTFT ${reply.ttftMs.toFixed(0)} ms`);
    const decodeS = (reply.endMs - reply.firstMs) / 1000;
    if (tokens > 1 && decodeS > 0) parts.push(`${((tokens - 1) / decodeS).toFixed(1)} tokens/s`);
    if (reply.chunks) parts.push(`${(tokens / reply.chunks).toFixed(2)} tokens/chunk`);
  } else {
    parts.push("stopped");
  }
  stats.textContent = parts.join(" · ");
  element.appendChild(stats);
  element.dataset.done = "true";
}

async function send(text) {
  history.push({ role: "user", content: text });
  addMessage("user", text);
  const element = addMessage("assistant", "");
  controller = new AbortController();
  setBusy(true);
  const startedMs = performance.now();
  let reply = { text: "", usage: null };
  try {
    if (!modelName) await loadModel();
    const response = await apiFetch("/v1/chat/completions", {
      method: "POST", body: JSON.stringify(requestBody()), signal: controller.signal,
    });
    if (!response.ok) throw new Error((await response.json()).error.message);
    reply = await readReply(response, element, startedMs);
    showStats(element, reply);
    loadModel().catch(() => {}); // the models' states changed (one loaded, one went)
  } catch (error) {
    if (error.name === "AbortError") {
      reply.text = element.querySelector(".content").textContent;
      showStats(element, { usage: null });
    } else {
      element.classList.add("error");
      element.querySelector(".content").textContent = String(error.message || error);
      element.dataset.done = "true";
    }
  } finally {
    history.push({ role: "assistant", content: reply.text });
    controller = null;
    setBusy(false);
  }
}

function setBusy(isBusy) {
  $("send").disabled = isBusy;
  $("stop").disabled = !isBusy;
}

$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  const text = $("message").value.trim();
  if (!text || controller) return;
  $("message").value = "";
  send(text);
});
$("message").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey) {
    event.preventDefault();
    $("composer").requestSubmit();
  }
});
$("stop").addEventListener("click", () => controller && controller.abort());
$("model-picker").addEventListener("change", (event) => {
  modelName = event.target.value;
  $("model-name").textContent = modelName;
});
$("clear").addEventListener("click", () => {
  history.length = 0;
  $("conversation").replaceChildren();
});
loadModel().catch((error) => { $("model-name").textContent = String(error.message); });
