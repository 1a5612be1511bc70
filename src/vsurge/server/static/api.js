// Requests to the vsurge API: headers with the key, OpenAI error JSON as exceptions, server-sent events.
import { apiKey } from "./apikey.js";

export class APIError extends Error {
  constructor(status, message) {
    super(message);
    this.name = "APIError";
    this.status = status;
  }
}

export function requestHeaders() {
  const headers = { "Content-Type": "application/json" };
  const key = apiKey();
  if (key) headers.Authorization = `Bearer ${key}`;
  return headers;
}

// The server's message from an OpenAI error body {"error": {"message", ...}}; else the status and the body's start.
export async function errorFrom(response) {
  let text = "";
  try {
    text = await response.text();
  } catch {
    // the body is unreadable (connection dropped): the status alone
  }
  let message = `HTTP ${response.status} ${response.statusText}`.trim();
  try {
    const body = JSON.parse(text);
    const error = body && body.error;
    if (error) message = typeof error === "string" ? error : error.message || JSON.stringify(error);
    else if (body && body.detail) message = JSON.stringify(body.detail);
  } catch {
    if (text) message += `: ${text.slice(0, 300)}`;
  }
  return new APIError(response.status, message);
}

export async function getJSON(path, signal) {
  const response = await fetch(path, { headers: requestHeaders(), signal });
  if (!response.ok) throw await errorFrom(response);
  return response.json();
}

export async function postStream(path, body, signal) {
  const response = await fetch(path, {
    method: "POST", headers: requestHeaders(), body: JSON.stringify(body), signal,
  });
  if (!response.ok) throw await errorFrom(response);
  return response;
}

// Yields the `data:` payload (a string) of each event of a text/event-stream response body.
export async function* sseData(response) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  const boundary = /\r?\n\r?\n/;
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let match;
      while ((match = boundary.exec(buffer))) {
        const block = buffer.slice(0, match.index);
        buffer = buffer.slice(match.index + match[0].length);
        const data = block.split(/\r?\n/).filter((l) => l.startsWith("data:"))
          .map((l) => l.slice(5).replace(/^ /, "")).join("\n");
        if (data) yield data;
      }
    }
  } finally {
    reader.releaseLock();
  }
}
