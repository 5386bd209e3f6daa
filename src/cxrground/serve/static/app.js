// cxrground web demo: upload a CXR + instruction -> POST /v1/segment -> draw the mask over the image.
// Plain JS, no external resources. The mask is blended with the same colour and alpha as the server's
// overlay_png (io.overlay.blend): out = img * (1 - a) + colour * a inside the mask.
"use strict";

const OVERLAY_RGB = [0, 255, 255];
const OVERLAY_ALPHA = 0.45;

const $ = (id) => document.getElementById(id);
let last = null; // {image: HTMLImageElement, mask: Uint8ClampedArray | null}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

function loadImage(b64) {
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => resolve(img);
    img.onerror = () => reject(new Error("the server returned an image the browser cannot show"));
    img.src = "data:image/png;base64," + b64;
  });
}

function maskAlpha(maskImg, width, height) {
  const c = document.createElement("canvas");
  c.width = width;
  c.height = height;
  const ctx = c.getContext("2d");
  ctx.drawImage(maskImg, 0, 0);
  const px = ctx.getImageData(0, 0, width, height).data;
  const out = new Uint8ClampedArray(width * height);
  for (let i = 0; i < out.length; i++) out[i] = px[4 * i] > 127 ? 1 : 0;
  return out;
}

function draw() {
  if (!last) return;
  const canvas = $("overlay-canvas");
  const { image, mask } = last;
  canvas.width = image.naturalWidth;
  canvas.height = image.naturalHeight;
  const ctx = canvas.getContext("2d");
  ctx.drawImage(image, 0, 0);
  if (!mask || !$("show-mask").checked) return;
  const frame = ctx.getImageData(0, 0, canvas.width, canvas.height);
  const d = frame.data;
  for (let i = 0; i < mask.length; i++) {
    if (!mask[i]) continue;
    for (let k = 0; k < 3; k++) d[4 * i + k] = Math.round(d[4 * i + k] * (1 - OVERLAY_ALPHA) + OVERLAY_RGB[k] * OVERLAY_ALPHA);
  }
  ctx.putImageData(frame, 0, 0);
}

function fmt(value) {
  if (value === null || value === undefined) return "—";
  if (Array.isArray(value)) return value.length ? value.join(", ") : "—";
  if (typeof value === "number") return Number.isInteger(value) ? String(value) : value.toFixed(3);
  return String(value);
}

function showStructured(structured) {
  const body = $("structured").querySelector("tbody");
  body.replaceChildren();
  for (const [key, value] of Object.entries(structured)) {
    const tr = document.createElement("tr");
    const k = document.createElement("td");
    const v = document.createElement("td");
    k.textContent = key.replaceAll("_", " ");
    v.textContent = fmt(value);
    v.dataset.key = key;
    tr.append(k, v);
    body.append(tr);
  }
}

async function submit(event) {
  event.preventDefault();
  showError("");
  const file = $("image-input").files[0];
  const instruction = $("instruction-input").value.trim();
  if (!file) return showError("Choose an image file first.");
  if (!instruction) return showError("Type an instruction first.");
  const form = new FormData();
  form.append("image", file);
  form.append("instruction", instruction);
  form.append("mask_format", "png");
  form.append("include_image", "true");
  const button = $("submit-button");
  button.disabled = true;
  $("status").textContent = "segmenting…";
  try {
    const resp = await fetch("/v1/segment", { method: "POST", body: form });
    let data = null;
    try { data = await resp.json(); } catch (_) { data = null; }
    if (!resp.ok) {
      const msg = data && data.error ? data.error.message : resp.statusText;
      throw new Error(`Error ${resp.status}: ${msg}`);
    }
    const [image, maskImg] = await Promise.all([loadImage(data.image_png), loadImage(data.mask_png)]);
    last = { image, mask: maskAlpha(maskImg, image.naturalWidth, image.naturalHeight) };
    $("result").hidden = false;
    draw();
    $("answer").textContent = data.answer;
    showStructured(data.structured);
    const [h, w] = data.image_size;
    $("meta").textContent = `${w}×${h} px · ${data.mask_pixels} mask pixels · ${data.model.name} · ` +
      `${Math.round(data.timing_ms.total)} ms`;
    $("status").textContent = "done";
    document.body.dataset.state = "done";
  } catch (err) {
    $("status").textContent = "";
    document.body.dataset.state = "error";
    showError(err.message);
  } finally {
    button.disabled = false;
  }
}

async function init() {
  $("segment-form").addEventListener("submit", submit);
  $("show-mask").addEventListener("change", draw);
  $("example-select").addEventListener("change", (e) => {
    if (e.target.value) $("instruction-input").value = e.target.value;
  });
  try {
    const [ex, models] = await Promise.all([fetch("/v1/examples"), fetch("/v1/models")]);
    const { instructions } = await ex.json();
    for (const text of instructions) {
      const opt = document.createElement("option");
      opt.value = text;
      $("example-list").append(opt);
      const sel = document.createElement("option");
      sel.value = text;
      sel.textContent = text;
      $("example-select").append(sel);
    }
    const list = await models.json();
    $("model-name").textContent = list.data.length ? list.data[0].id : "not loaded";
  } catch (err) {
    showError("Cannot reach the server: " + err.message);
  }
  document.body.dataset.ready = "true";
}

init();
