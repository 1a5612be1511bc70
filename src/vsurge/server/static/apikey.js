// The API key: kept in localStorage, asked for (once, however many requests got a 401) with a small form.
const STORAGE = "vsurge.apiKey";

export function apiKey() {
  return localStorage.getItem(STORAGE) || "";
}

export function setApiKey(key) {
  if (key) localStorage.setItem(STORAGE, key);
  else localStorage.removeItem(STORAGE);
}

let pending = null;

// Shows the page's #key-dialog; resolves once the user saved a key.
export function askForKey(message) {
  if (pending) return pending;
  const dialog = document.getElementById("key-dialog");
  const form = dialog.querySelector("form");
  const input = dialog.querySelector("input");
  dialog.querySelector(".reason").textContent = message || "This server needs an API key.";
  input.value = "";
  dialog.hidden = false;
  input.focus();
  pending = new Promise((resolve) => {
    form.onsubmit = (event) => {
      event.preventDefault();
      setApiKey(input.value.trim());
      dialog.hidden = true;
      pending = null;
      resolve();
    };
  });
  return pending;
}
