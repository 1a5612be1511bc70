// The chat page: streams answers from /v1/chat/completions, keeps the conversation in localStorage.
import { askForKey } from "./apikey.js";
import { APIError, getJSON, postStream, sseData } from "./api.js";
import { renderMarkdown } from "./markdown.js";

const CONVERSATION_STORAGE = "vsurge.conversation";
const SETTINGS_STORAGE = "vsurge.settings";
const SETTING_IDS = ["system", "temperature", "top-p", "max-tokens", "schema"];

const $ = (id) => document.getElementById(id);
const conversationView = $("conversation");

// messages: {role: "user" | "assistant" | "error", content, images?, failed?, meta?}; only user/assistant go
// to the API (a user message's images: data: URLs, sent as image_url parts before its text)
// epoch: bumped by "new chat", so a reply still streaming from the old conversation is dropped
// attachments: data: URLs of the images the next message carries
const state = { messages: [], controller: null, epoch: 0, attachments: [] };

// ---------------------------------------------------------------- storage
function loadJSON(key, fallback) {
  try {
    return JSON.parse(localStorage.getItem(key)) ?? fallback;
  } catch {
    return fallback;
  }
}

function saveConversation() {
  try {
    localStorage.setItem(CONVERSATION_STORAGE, JSON.stringify(state.messages));
  } catch {
    // images overflow the browser's storage: keep the text of the conversation
    const light = state.messages.map(({ images, ...rest }) => rest);
    localStorage.setItem(CONVERSATION_STORAGE, JSON.stringify(light));
  }
}

function saveSettings() {
  const settings = { model: $("model").value };
  for (const id of SETTING_IDS) settings[id] = $(id).value;
  localStorage.setItem(SETTINGS_STORAGE, JSON.stringify(settings));
}

function restoreSettings() {
  const settings = loadJSON(SETTINGS_STORAGE, {});
  for (const id of SETTING_IDS) if (typeof settings[id] === "string") $(id).value = settings[id];
  return settings;
}

// ---------------------------------------------------------------- rendering
// Renders assistant text (Markdown subset, never HTML) into `body`; without one, into a new bubble.
// The streaming code calls it on every chunk; tests call window.vsurge.renderAssistant(text).
function renderAssistant(text, body) {
  const target = body || addBubble({ role: "assistant", content: "" }).body;
  return renderMarkdown(text, target);
}

function addBubble(message) {
  conversationView.querySelector(".empty")?.remove();
  const bubble = document.createElement("div");
  bubble.className = `message ${message.role}${message.failed ? " failed" : ""}`;
  const who = document.createElement("div");
  who.className = "who";
  who.textContent = { user: "You", assistant: "Assistant", error: "Error" }[message.role] || message.role;
  const body = document.createElement("div");
  body.className = "body";
  const meta = document.createElement("div");
  meta.className = "meta";
  meta.textContent = message.meta || "";
  // a reasoning model's thinking (the server's --reasoning-parser splits it out): folded, plain text
  const thinking = document.createElement("details");
  thinking.className = "thinking";
  thinking.hidden = !message.reasoning;
  const summary = document.createElement("summary");
  summary.textContent = "Thinking";
  const thought = document.createElement("div");
  thought.textContent = message.reasoning || "";
  thinking.append(summary, thought);
  bubble.append(who, thinking);
  if (message.images && message.images.length) bubble.append(thumbnails(message.images));
  bubble.append(body, meta);
  if (message.role === "assistant") renderAssistant(message.content, body);
  else body.textContent = message.content; // user text and error messages: plain text, always
  conversationView.append(bubble);
  conversationView.scrollTop = conversationView.scrollHeight;
  return { bubble, body, meta, thinking, thought };
}

function thumbnails(urls, onRemove) {
  const strip = document.createElement("div");
  strip.className = "images";
  urls.forEach((url, i) => {
    const image = document.createElement("img");
    image.src = url;
    image.alt = `image ${i + 1}`;
    if (onRemove) {
      image.title = "Click to remove";
      image.addEventListener("click", () => onRemove(i));
    }
    strip.append(image);
  });
  return strip;
}

function renderAttachments() {
  const box = $("attachments");
  box.replaceChildren();
  box.hidden = !state.attachments.length;
  if (state.attachments.length) {
    box.append(thumbnails(state.attachments, (i) => {
      state.attachments.splice(i, 1);
      renderAttachments();
    }));
  }
}

function attach(files) {
  const images = [...files].filter((file) => file.type.startsWith("image/"));
  return Promise.all(images.map((file) => new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  }))).then((urls) => {
    state.attachments.push(...urls);
    renderAttachments();
  });
}

function renderConversation() {
  conversationView.replaceChildren();
  if (!state.messages.length) {
    const empty = document.createElement("div");
    empty.className = "empty";
    empty.textContent = "Ask the model something. Settings are on the left; answers stream as they are made.";
    conversationView.append(empty);
  }
  for (const message of state.messages) addBubble(message);
}

function showError(text) {
  const message = { role: "error", content: text };
  state.messages.push(message);
  addBubble(message);
  saveConversation();
}

function setBusy(busy) {
  $("send").disabled = busy;
  $("stop").disabled = !busy;
  document.body.dataset.state = busy ? "busy" : "idle";
}

// ---------------------------------------------------------------- the request
function numberSetting(id) {
  const raw = $(id).value.trim();
  return raw === "" ? undefined : Number(raw); // empty: the server's default
}

// The JSON schema box: empty -> no response_format; not JSON -> an error before anything is sent.
function responseFormat() {
  const text = $("schema").value.trim();
  if (!text) return undefined;
  let schema;
  try {
    schema = JSON.parse(text);
  } catch (error) {
    throw new Error(`The JSON schema box does not hold valid JSON: ${error.message}`);
  }
  return { type: "json_schema", json_schema: { name: "answer", schema } };
}

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of state.messages) {
    if (m.role === "user" && !m.failed && m.images && m.images.length) {
      const parts = m.images.map((url) => ({ type: "image_url", image_url: { url } }));
      messages.push({ role: "user", content: [...parts, { type: "text", text: m.content }] });
    } else if ((m.role === "user" && !m.failed) || (m.role === "assistant" && m.content)) {
      messages.push({ role: m.role, content: m.content });
    }
  }
  const body = { messages, stream: true, stream_options: { include_usage: true } };
  if ($("model").value) body.model = $("model").value;
  const settings = { temperature: "temperature", top_p: "top-p", max_tokens: "max-tokens" };
  for (const [field, id] of Object.entries(settings)) {
    const value = numberSetting(id);
    if (value !== undefined) body[field] = value;
  }
  const format = responseFormat();
  if (format) body.response_format = format;
  return body;
}

function describe(stats) {
  const parts = [];
  if (stats.tokens !== undefined) parts.push(`${stats.tokens} tokens`);
  if (stats.ttft !== undefined) parts.push(`first token ${stats.ttft.toFixed(2)} s`);
  if (stats.rate !== undefined) parts.push(`${stats.rate.toFixed(1)} tok/s`);
  if (stats.finish === "length") parts.push("stopped at max tokens");
  if (stats.stopped) parts.push("stopped");
  return parts.join(" · ");
}

async function send() {
  const text = $("prompt").value.trim();
  if ((!text && !state.attachments.length) || state.controller) return;
  const user = { role: "user", content: text };
  if (state.attachments.length) user.images = state.attachments;
  state.messages.push(user);
  let body;
  try {
    body = requestBody();
  } catch (error) {
    state.messages.pop();
    showError(error.message);
    return;
  }
  $("prompt").value = "";
  state.attachments = [];
  renderAttachments();
  addBubble(user);
  const assistant = { role: "assistant", content: "" };
  const view = addBubble(assistant);
  view.bubble.dataset.streaming = "true";
  const controller = (state.controller = new AbortController());
  const epoch = state.epoch;
  setBusy(true);
  const started = performance.now();
  const stats = {};
  let failure = null;
  try {
    const response = await postStream("v1/chat/completions", body, controller.signal);
    for await (const data of sseData(response)) {
      if (data === "[DONE]") break;
      const event = JSON.parse(data);
      if (event.error) throw new APIError(event.error.code || 500, event.error.message || JSON.stringify(event.error));
      if (event.usage) stats.tokens = event.usage.completion_tokens;
      const choice = event.choices && event.choices[0];
      if (!choice) continue;
      if (choice.delta && choice.delta.reasoning_content) {
        if (stats.ttft === undefined) stats.ttft = (performance.now() - started) / 1000;
        assistant.reasoning = (assistant.reasoning || "") + choice.delta.reasoning_content;
        view.thinking.hidden = false;
        view.thought.textContent = assistant.reasoning;
      }
      if (choice.delta && choice.delta.content) {
        if (stats.ttft === undefined) stats.ttft = (performance.now() - started) / 1000;
        assistant.content += choice.delta.content;
        renderAssistant(assistant.content, view.body);
        conversationView.scrollTop = conversationView.scrollHeight;
      }
      if (choice.finish_reason) stats.finish = choice.finish_reason;
    }
  } catch (error) {
    if (error.name === "AbortError") stats.stopped = true;
    else failure = error;
  } finally {
    state.controller = null;
    setBusy(false);
    delete view.bubble.dataset.streaming;
  }
  if (epoch !== state.epoch) return; // the conversation was cleared meanwhile
  const seconds = (performance.now() - started) / 1000;
  if (stats.tokens > 1 && stats.ttft !== undefined && seconds > stats.ttft) {
    stats.rate = (stats.tokens - 1) / (seconds - stats.ttft);
  }
  if (assistant.content || assistant.reasoning) {
    assistant.meta = describe(stats);
    view.meta.textContent = assistant.meta;
    state.messages.push(assistant);
  } else {
    view.bubble.remove();
    if (failure || stats.stopped) {
      user.failed = true; // nothing came back: the question is not part of the conversation the model sees
      conversationView.lastElementChild?.classList.add("failed");
    }
  }
  saveConversation();
  if (failure) await reportFailure(failure, user);
}

async function reportFailure(error, user) {
  if (error.status === 401) {
    // forget the attempt, ask for the key, then send the same question again
    state.messages = state.messages.filter((m) => m !== user);
    renderConversation();
    saveConversation();
    $("prompt").value = user.content;
    state.attachments = user.images || [];
    renderAttachments();
    await askForKey(error.message);
    await loadModels();
    return send();
  }
  showError(error.status ? `${error.message} (HTTP ${error.status})` : `Request failed: ${error.message}`);
}

function stop() {
  state.controller?.abort(); // the server sees the connection close and frees the slot
}

function newChat() {
  stop();
  state.epoch += 1;
  state.messages = [];
  saveConversation();
  renderConversation();
  $("prompt").focus();
}

// ---------------------------------------------------------------- models
async function loadModels() {
  const select = $("model");
  const wanted = select.value || loadJSON(SETTINGS_STORAGE, {}).model;
  try {
    const models = await getJSON("v1/models");
    select.replaceChildren();
    for (const model of models.data) {
      const option = document.createElement("option");
      option.value = model.id;
      // LoRA adapters name their base; models the server loads on demand say so (unloaded, loading, failed)
      const state = model.status && model.status.value !== "loaded" ? ` · ${model.status.value}` : "";
      const base = model.parent ? ` · LoRA on ${model.parent}` : "";
      const size = model.max_model_len ? ` (${model.max_model_len} tokens)` : "";
      option.textContent = `${model.id}${base}${state}${size}`;
      select.append(option);
    }
    if (models.data.some((m) => m.id === wanted)) select.value = wanted;
    document.body.dataset.models = String(models.data.length);
  } catch (error) {
    if (error.status === 401) {
      await askForKey(error.message);
      return loadModels();
    }
    showError(`Could not list the models: ${error.message}`);
  }
}

// ---------------------------------------------------------------- wiring
$("composer").addEventListener("submit", (event) => {
  event.preventDefault();
  send();
});
$("prompt").addEventListener("keydown", (event) => {
  if (event.key === "Enter" && !event.shiftKey && !event.isComposing) {
    event.preventDefault();
    send();
  }
});
$("stop").addEventListener("click", stop);
$("attach").addEventListener("click", () => $("image-input").click());
$("image-input").addEventListener("change", (event) => {
  attach(event.target.files).finally(() => (event.target.value = ""));
});
$("prompt").addEventListener("paste", (event) => {
  const files = [...(event.clipboardData?.files || [])];
  if (files.some((file) => file.type.startsWith("image/"))) {
    event.preventDefault();
    attach(files);
  }
});
$("composer").addEventListener("dragover", (event) => event.preventDefault());
$("composer").addEventListener("drop", (event) => {
  event.preventDefault();
  attach(event.dataTransfer?.files || []);
});
$("new-chat").addEventListener("click", newChat);
for (const id of [...SETTING_IDS, "model"]) $(id).addEventListener("change", saveSettings);

window.vsurge = { renderAssistant, state, send, stop, newChat, attach };
restoreSettings();
state.messages = loadJSON(CONVERSATION_STORAGE, []).filter((m) => m && typeof m.content === "string");
renderConversation();
setBusy(false);
loadModels();
