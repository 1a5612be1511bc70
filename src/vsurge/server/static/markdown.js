// A small Markdown subset, built as DOM nodes with createElement and text nodes only:
// model text is never parsed as HTML, so `<script>` or `<img onerror=...>` in a reply stays text.
// Blocks: fenced code (``` or ~~~, unclosed while streaming), headings (#), lists (- * + and 1.), paragraphs.
// Inline: `code`, **bold** / __bold__, *italic* / _italic_.

const FENCE = /^\s*(```+|~~~+)\s*([\w+#.-]*)\s*$/;
const HEADING = /^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$/;
const LIST_ITEM = /^(\s*)([-*+]|\d{1,9}[.)])\s+(.*)$/;
const INLINE = /`([^`\n]+)`|\*\*(?=\S)([^\n]*?\S)\*\*|__(?=\S)([^\n]*?\S)__|\*(?=[^\s*])([^*\n]*?[^\s*]|[^\s*])\*|(?<![\w\\])_(?=[^\s_])([^_\n]*?[^\s_]|[^\s_])_(?!\w)/g;

function element(tag, className) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  return node;
}

// Appends `text` to `parent`, turning inline marks into <code>, <strong> and <em>.
export function appendInline(parent, text) {
  let last = 0;
  for (const match of text.matchAll(INLINE)) {
    if (match.index > last) parent.append(text.slice(last, match.index)); // append(string) makes a text node
    const [, code, bold1, bold2, italic1, italic2] = match;
    if (code !== undefined) {
      const node = element("code");
      node.textContent = code;
      parent.append(node);
    } else {
      const node = element(bold1 !== undefined || bold2 !== undefined ? "strong" : "em");
      appendInline(node, bold1 ?? bold2 ?? italic1 ?? italic2);
      parent.append(node);
    }
    last = match.index + match[0].length;
  }
  if (last < text.length) parent.append(text.slice(last));
}

function codeBlock(code, language) {
  const wrapper = element("div", "codeblock");
  const pre = element("pre");
  const node = element("code");
  node.textContent = code;
  if (language) {
    node.dataset.language = language;
    const label = element("span", "lang");
    label.textContent = language;
    wrapper.append(label);
  }
  pre.append(node);
  const copy = element("button");
  copy.type = "button";
  copy.textContent = "copy";
  copy.addEventListener("click", () => {
    navigator.clipboard?.writeText(code).then(() => { copy.textContent = "copied"; }, () => {});
  });
  wrapper.append(pre, copy);
  return wrapper;
}

function paragraph(lines) {
  const node = element("p");
  lines.forEach((line, i) => {
    if (i > 0) node.append(element("br")); // the model's single newlines are meant as line breaks
    appendInline(node, line);
  });
  return node;
}

function list(lines, start) {
  const first = lines[start].match(LIST_ITEM);
  const ordered = /\d/.test(first[2]);
  const node = element(ordered ? "ol" : "ul");
  if (ordered && parseInt(first[2], 10) !== 1) node.start = parseInt(first[2], 10);
  let i = start;
  while (i < lines.length) {
    const item = lines[i].match(LIST_ITEM);
    if (item && /\d/.test(item[2]) === ordered) {
      const li = element("li");
      appendInline(li, item[3]);
      node.append(li);
    } else if (/^\s{2,}\S/.test(lines[i]) && node.lastChild) {
      node.lastChild.append(element("br")); // an indented line continues the item
      appendInline(node.lastChild, lines[i].trim());
    } else {
      break;
    }
    i++;
  }
  return [node, i];
}

// The block nodes of `text`.
export function markdownNodes(text) {
  const lines = text.replace(/\r\n?/g, "\n").split("\n");
  const blocks = [];
  let pending = [];
  const flush = () => {
    if (pending.length) blocks.push(paragraph(pending));
    pending = [];
  };
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(FENCE);
    if (fence) {
      flush();
      const code = [];
      i++;
      while (i < lines.length && !lines[i].trim().startsWith(fence[1])) code.push(lines[i++]);
      i++; // the closing fence, if it came yet
      blocks.push(codeBlock(code.join("\n"), fence[2]));
      continue;
    }
    const heading = line.match(HEADING);
    if (heading) {
      flush();
      const node = element(`h${heading[1].length}`);
      appendInline(node, heading[2]);
      blocks.push(node);
      i++;
      continue;
    }
    if (LIST_ITEM.test(line)) {
      flush();
      const [node, next] = list(lines, i);
      blocks.push(node);
      i = next;
      continue;
    }
    if (line.trim()) pending.push(line);
    else flush();
    i++;
  }
  flush();
  return blocks;
}

// Replaces the children of `target` with the rendering of `text`.
export function renderMarkdown(text, target) {
  target.replaceChildren(...markdownNodes(text));
  return target;
}
