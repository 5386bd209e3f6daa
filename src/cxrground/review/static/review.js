// cxrground review: the ILS pair page (image fitted to the window, mask overlay, window/level, zoom to full
// resolution, pan, brush/eraser, generated vs corrected side by side) and the CheXpercept case page (the same
// viewer for the case's images). Everything comes from this server's /api; nothing else is loaded.
'use strict';

const app = document.getElementById('app');
const content = document.getElementById('content');
const statusLine = document.getElementById('status');
let csrf = document.querySelector('meta[name=csrf-token]').content;
const id = app.dataset.assignment;
const SEG = '[SEG]';

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === 'text') node.textContent = v; else node.setAttribute(k, v);
  }
  for (const c of children) node.append(c);
  return node;
}

let relayout = () => {};  // the page's viewer fits its stage to the window again (a longer status line took room)

function setStatus(text, state, ...extra) {
  // state 'error' is styled as an error (colour, icon) and announced at once; extra: nodes after the text (a link)
  statusLine.replaceChildren(text, ...extra);
  if (state) document.body.dataset.state = state;
  statusLine.setAttribute('aria-live', state === 'error' ? 'assertive' : 'polite');
  relayout();
}

class ApiError extends Error {
  constructor(message, status, body) {
    super(message);
    this.status = status;
    this.type = (body && body.error && body.error.type) || '';
    this.body = body || {};
  }
}

async function api(path, options) {
  const resp = await fetch(path, Object.assign({credentials: 'same-origin'}, options || {}));
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const busy = resp.status === 503 ? ' (server busy: your decision was not stored, press the key again)' : '';
    throw new ApiError(((body.error && body.error.message) || ('HTTP ' + resp.status)) + busy, resp.status, body);
  }
  return body;
}

function clock(seconds) {
  return new Date(seconds * 1000).toLocaleTimeString([], {hour: '2-digit', minute: '2-digit'});
}

async function freshCsrf() {
  // the session of this browser now (a sign-in in another tab replaced the one this page was made for)
  const me = await api('/api/me');
  if (!me.csrf) return false;
  csrf = me.csrf;
  for (const input of document.querySelectorAll('input[name=csrf]')) input.value = csrf;
  return true;
}

async function postWrite(route, body) {
  // POST a decision or a comment edit of this assignment (JSON), with the session's CSRF token
  setStatus('saving…', 'saving');
  const send = () => api('/api/assignments/' + id + '/' + route, {
    method: 'POST', headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf}, body: JSON.stringify(body)});
  try {
    return await send();
  } catch (err) {
    if (!(err instanceof ApiError) || err.type !== 'csrf') throw err;
    if (!(await freshCsrf())) throw err;  // signed in again in another tab: this page takes the new session's token
    return send();
  }
}

// One decision with the checks around it: another tab's or session's decision since the page loaded is shown and
// replaced only when the reviewer says so; a session that ended says how to sign in and retry (press `key` again).
// Returns the server's answer, or null when nothing was stored (the status line says why).
async function saveDecision(what, part, decision, reason, mask, known, key, comment) {
  const replacing = 'your ' + decision + (reason ? ' (' + reason + ')' : '');
  return guardedWrite(what, replacing, known, key, (expected, overwrite) => {
    const body = {part: part, decision: decision, reason: reason || '', expected_version: expected || 0,
                  comment: comment || ''};
    if (overwrite) body.overwrite = true;
    if (mask) body.mask = mask;
    return postWrite('decision', body);
  });
}

// A new comment on the stored decision of `part` (the decision itself stays), with the same checks.
async function saveComment(what, part, comment, known) {
  return guardedWrite(what, 'your comment (on that decision)', known, 'Save comment', (expected, overwrite) => {
    const body = {part: part, comment: comment, expected_version: expected || 0};
    if (overwrite) body.overwrite = true;
    return postWrite('comment', body);
  }, true);
}

async function guardedWrite(what, replacing, known, key, attempt, onDecision) {
  // onDecision: the write needs a stored decision (a comment edit), so one taken back meanwhile is not replaced
  let expected = known, overwrite = false;
  for (;;) {
    try {
      return await attempt(expected, overwrite);
    } catch (err) {
      if (err instanceof ApiError && err.status === 409 && err.type === 'conflict' && !overwrite) {
        const now = err.body.error.stored || {};
        const said = now.decision ? 'was decided in another tab or session at ' + clock(now.updated) + ' as ' +
          now.decision + (now.reason ? ' (' + now.reason + ')' : '') : 'has had its decision taken back';
        if ((now.decision || !onDecision) && window.confirm('This ' + what + ' ' + said + '. Replace that with ' + replacing + '?')) {
          expected = now.version || 0; overwrite = true;
          continue;
        }
        setStatus('not saved: this ' + what + ' ' + said + '; that decision is kept (reload to see it)', 'error');
        return null;
      }
      if (err instanceof ApiError && (err.status === 401 || (err.status === 403 && err.type === 'csrf'))) {
        setStatus('not saved: you are signed out. ', 'error',
                  el('a', {href: '/login', target: '_blank', rel: 'noopener', id: 'sign-in-again'},
                     'Sign in in another tab'),
                  ', then press ' + key + ' again (nothing on this page is lost).');
        return null;
      }
      // a busy or unreachable server is worth a retry; a refusal (no such assignment, an image the server cannot
      // serve) is not
      const retry = !(err instanceof ApiError) || err.status >= 500 || err.status === 408;
      setStatus('not saved: ' + err.message + (retry ? '. Press ' + key + ' again to retry.' : ''), 'error');
      return null;
    }
  }
}

// The image n of this item, fetched so that a failure says why: resolves to a decoded <img>, or rejects with an
// Error whose message says what the server said (missing on the server, unreadable).
async function fetchImage(n, label) {
  let resp;
  try {
    resp = await fetch('/api/assignments/' + id + '/image/' + n, {credentials: 'same-origin'});
  } catch (err) {
    throw new Error('The ' + label + ' could not be loaded (no connection to the server)');
  }
  if (!resp.ok) {
    const body = await resp.json().catch(() => ({}));
    throw new Error('The ' + label + ' could not be loaded: ' + ((body.error && body.error.message) ||
                                                                  ('HTTP ' + resp.status)));
  }
  const url = URL.createObjectURL(await resp.blob());
  return new Promise((resolve, reject) => {
    const img = new Image();
    img.onload = () => { URL.revokeObjectURL(url); resolve(img); };
    img.onerror = () => { URL.revokeObjectURL(url); reject(new Error('The ' + label + ' does not decode')); };
    img.src = url;
  });
}

function typing(target) {
  // keys typed into a text field or a list are not shortcuts; checkboxes and sliders leave letters free
  return target instanceof HTMLTextAreaElement || target instanceof HTMLSelectElement ||
    (target instanceof HTMLInputElement && ['text', 'password', 'search', 'number'].includes(target.type));
}

function reasonSelect(reasons, idName, label, chosen) {
  // no reason is preselected but the one this reviewer stored before: a rejection records only a reason they chose
  const select = el('select', {id: idName, 'aria-label': label || 'rejection reason'});
  select.append(el('option', {value: '', text: '— reason for rejecting —'}));
  reasons.forEach((r, i) => select.append(el('option', {value: r, text: (i + 1) + '. ' + r})));
  if (chosen && reasons.includes(chosen)) select.value = chosen;
  select.addEventListener('change', () => select.blur());  // letters are shortcuts again once a reason is chosen
  return select;
}

function commentBox(idName, label, stored, max) {
  // the reviewer's free text, sent with the decision (letters typed here are text, not shortcuts; Esc leaves the
  // box so that the keys work again)
  const box = el('textarea', {id: idName, class: 'comment', rows: '2', maxlength: String(max || 2000),
                              'aria-label': label, placeholder: 'Comment (optional, kept with your decision; Esc ' +
                              'leaves the box)'});
  box.value = stored || '';
  box.dataset.stored = box.value;
  box.addEventListener('keydown', (ev) => { if (ev.key === 'Escape') { ev.preventDefault(); box.blur(); } });
  box.addEventListener('input', () => growBox(box));
  return box;
}

function growBox(box) {
  // the box as tall as its text, up to its CSS max-height; beyond that it scrolls
  if (!box.isConnected) return;
  const style = getComputedStyle(box);
  const max = parseFloat(style.maxHeight) || Infinity;
  const edges = parseFloat(style.borderTopWidth) + parseFloat(style.borderBottomWidth);
  box.style.height = 'auto';
  const wanted = box.scrollHeight + edges;
  box.style.height = Math.min(wanted, max) + 'px';
  box.style.overflowY = wanted > max ? 'auto' : 'hidden';
}

function growBoxes() {
  for (const box of document.querySelectorAll('textarea.comment')) growBox(box);
}

function commentSaver(box, decided, save) {
  // "Save comment": offered when a decision is stored and only its comment differs from what is stored
  // (decided(): whether the part has a stored decision; save(): stores the box's text on it)
  const button = el('button', {type: 'button', class: 'save-comment', id: 'save-' + box.id, hidden: ''},
                    'Save comment');
  const refresh = () => { button.hidden = !(decided() && box.value.trim() !== box.dataset.stored.trim()); };
  box.addEventListener('input', refresh);
  button.addEventListener('click', async () => {
    button.disabled = true;
    try { await save(); } finally { button.disabled = false; refresh(); }
  });
  return {button: button, refresh: refresh};
}

function storedComment(text) {
  // a stored comment shown as text (read-only view): never parsed as HTML
  return el('p', {class: 'comment-text', text: 'Comment: ' + text});
}

function onlyReason(select, reason) {
  // a film that cannot be shown: the one reason left is chosen and the others are unavailable
  for (const o of select.options) o.disabled = o.value !== reason;
  select.value = reason;
}

function readable(text, positive) {
  // the answer as a reader sees it: the [SEG] token becomes a note on what the mask is
  const frag = document.createDocumentFragment();
  const pieces = String(text).split(SEG);
  pieces.forEach((piece, i) => {
    if (i > 0) {
      frag.append(el('span', {class: 'seg', title: 'the answer\'s ' + SEG + ' token: the lesion mask',
                              text: positive ? '[mask: the overlay]' : '[empty mask]'}));
    }
    if (piece.trim()) frag.append(document.createTextNode((i > 0 ? ' ' : '') + piece.trim()));
  });
  return frag;
}

// --- the viewer: canvases at the image's native size, scaled and moved by one shared transform --------------

function orientationHelp(data) {
  // what the help line says about the R/L markers of this item's film
  if (data.orientation === 'none') return 'No R/L markers: the film\'s view is ' + data.view + ', not frontal.';
  if (data.orientation === 'assumed') {
    return 'R and L on the film: the patient\'s right and left if the film is frontal (its view is not recorded).';
  }
  return 'R and L on the film: the patient\'s right and left.';
}

function orientationMarks(data) {
  // the R/L markers of one pane (none for a film that is not frontal) and the note on the view when it matters
  const known = data.orientation === 'frontal';
  if (data.orientation === 'none') {
    return {marks: [], note: el('span', {class: 'view-hint', 'data-orientation': 'none',
                                         title: 'R/L markers assume a frontal (PA/AP) film',
                                         text: data.view + ' view: no R/L markers'})};
  }
  // the patient's right on the image's left (markers on the page, never drawn into the canvas or a mask)
  const side = (s, word) => el('span', {class: 'orient', 'data-side': s, text: s,
    title: 'patient\'s ' + word + (known ? ' (' + data.view + ' film)' : ' if the film is frontal (view unknown)')});
  const note = known ? null : el('span', {class: 'view-hint', 'data-orientation': 'assumed',
                                          title: 'the import recorded no view for this film',
                                          text: 'view unknown: R/L assume a frontal film'});
  return {marks: [side('R', 'right'), side('L', 'left')], note: note};
}

function makeViewer(w, h, labels, data) {
  // labels: [{id, text, aria}] per pane (aria: the canvas's accessible name); data: the item (its orientation)
  const view = {scale: 1, tx: 0, ty: 0, level: 127.5, width: 255, onTransform: null};
  const stages = el('div', {class: 'stages', id: 'stages'});
  app.dataset.orientation = data.orientation || 'frontal';
  const panes = labels.map((label, i) => {
    const canvas = el('canvas', {id: i === 0 ? 'view' : 'view-' + label.id, width: String(w), height: String(h),
                                 role: 'img', 'aria-label': label.aria || label.text || 'image'});
    const {marks, note} = orientationMarks(data);
    const stage = el('div', {class: 'stage', id: i === 0 ? 'stage' : 'stage-' + label.id}, canvas,
                     el('span', {class: 'pane-label', text: label.text}), ...marks);
    if (note) stage.append(note);
    stages.append(stage);
    return {canvas: canvas, stage: stage, ctx: canvas.getContext('2d'), right: marks[0], left: marks[1]};
  });
  const zoomLabel = el('span', {class: 'sub', id: 'zoom-level'});

  function placeMarkers() {
    // R at the image's left edge and L at its right edge, half-way down what is visible of it (kept inside the stage)
    const b = panes[0].stage.getBoundingClientRect();
    if (!b.width) return;
    const x0 = Math.min(Math.max(view.tx, 0), b.width), x1 = Math.min(Math.max(view.tx + w * view.scale, 0), b.width);
    const y0 = Math.max(view.ty, 0), y1 = Math.min(view.ty + h * view.scale, b.height);
    const y = Math.min(Math.max((y0 + y1) / 2, 0), b.height) + 'px';
    for (const p of panes) {
      if (!p.right) continue;
      p.right.style.left = x0 + 'px'; p.right.style.top = y;
      p.left.style.left = x1 + 'px'; p.left.style.top = y;
    }
  }
  function applyTransform() {
    const t = 'translate(' + view.tx + 'px,' + view.ty + 'px) scale(' + view.scale + ')';
    for (const p of panes) p.canvas.style.transform = t;
    placeMarkers();
    app.dataset.scale = view.scale.toFixed(3);
    zoomLabel.textContent = Math.round(view.scale * 100) + ' %';
    if (view.onTransform) view.onTransform();
  }
  function box() { return panes[0].stage.getBoundingClientRect(); }
  function fit() {
    const b = box();
    view.scale = Math.min(b.width / w, b.height / h);
    view.tx = (b.width - w * view.scale) / 2;
    view.ty = (b.height - h * view.scale) / 2;
    applyTransform();
  }
  function zoom(factor, px, py) {
    const s = Math.min(40, Math.max(0.02, view.scale * factor));
    view.tx = px - (px - view.tx) * s / view.scale;
    view.ty = py - (py - view.ty) * s / view.scale;
    view.scale = s;
    applyTransform();
  }
  function oneToOne() {  // one image pixel per screen pixel, around the centre of the view
    const b = box();
    zoom(1 / (view.scale * (window.devicePixelRatio || 1)), b.width / 2, b.height / 2);
  }
  function size() {  // the stage (and the side column beside it) fill the window below their top edge
    const top = stages.getBoundingClientRect().top + window.scrollY;
    const height = Math.max(320, window.innerHeight - top - 12);
    for (const p of panes) p.stage.style.height = height + 'px';
    for (const side of document.querySelectorAll('.side')) {
      const sideTop = side.getBoundingClientRect().top + window.scrollY;
      side.style.maxHeight = Math.max(240, window.innerHeight - sideTop - 12) + 'px';
    }
  }
  for (const p of panes) {
    p.stage.addEventListener('wheel', (ev) => {
      ev.preventDefault();
      const b = p.stage.getBoundingClientRect();
      zoom(ev.deltaY < 0 ? 1.15 : 1 / 1.15, ev.clientX - b.left, ev.clientY - b.top);
    }, {passive: false});
  }
  function toNative(ev, canvas) {
    const rect = canvas.getBoundingClientRect();
    return [Math.floor((ev.clientX - rect.left) * w / rect.width),
            Math.floor((ev.clientY - rect.top) * h / rect.height)];
  }
  // drag: pan when pan() says so (or with the middle button), else paint(x, y) in native pixels
  function onDrag(pane, pan, paint) {
    let drag = null;
    pane.canvas.addEventListener('pointerdown', (ev) => {
      ev.preventDefault();
      pane.canvas.setPointerCapture(ev.pointerId);
      const panning = pan() || ev.button === 1;
      drag = {pan: panning, x: ev.clientX, y: ev.clientY, tx: view.tx, ty: view.ty};
      if (!panning) paint(...toNative(ev, pane.canvas));
    });
    pane.canvas.addEventListener('pointermove', (ev) => {
      if (!drag) return;
      if (drag.pan) {
        view.tx = drag.tx + ev.clientX - drag.x; view.ty = drag.ty + ev.clientY - drag.y; applyTransform();
      } else {
        paint(...toNative(ev, pane.canvas));
      }
    });
    const end = () => { drag = null; };
    pane.canvas.addEventListener('pointerup', end);
    pane.canvas.addEventListener('pointercancel', end);
  }
  // window/level of one 0-255 value (applied per channel for colour images)
  function windowed(v) {
    const x = (v - (view.level - view.width / 2)) * 255 / view.width;
    return x < 0 ? 0 : x > 255 ? 255 : x;
  }
  return {view, stages, panes, zoomLabel, applyTransform, fit, zoom, oneToOne, size, onDrag, windowed, box};
}

function percentiles(histogram, qs) {
  // the q-th quantiles (0..1) of a 256-bin histogram: the smallest value with at least q of the pixels at or below it
  const n = histogram.reduce((a, b) => a + b, 0);
  return qs.map((q) => {
    let seen = 0;
    for (let v = 0; v < 256; v++) {
      seen += histogram[v];
      if (seen >= q * n && seen > 0) return v;
    }
    return 255;
  });
}

function windowControls(viewer, redraw, histogram) {
  // histogram(): the 256-bin grey histogram of the image shown (computed once per image by the page), or null
  const level = el('input', {type: 'range', id: 'level', min: '0', max: '255', step: '0.5', value: '127.5',
                             'aria-label': 'level (centre of the window)'});
  const width = el('input', {type: 'range', id: 'window', min: '1', max: '255', value: '255',
                             'aria-label': 'window width'});
  const readout = el('span', {class: 'wl-readout', id: 'wl-readout', 'aria-live': 'polite'});
  const auto = el('button', {type: 'button', id: 'auto-window',
                             title: 'window from the 1st to the 99th percentile of the image'}, 'Auto (W)');
  const resetView = el('button', {type: 'button', id: 'reset-view'}, 'Reset view (0)');
  const full = el('button', {type: 'button', id: 'full-res'}, '1:1 (1)');
  const num = (v) => (Number.isInteger(v) ? String(v) : v.toFixed(1));
  function show(note) {
    const v = viewer.view, lo = Math.max(0, v.level - v.width / 2), hi = Math.min(255, v.level + v.width / 2);
    readout.textContent = 'W ' + num(v.width) + ' / L ' + num(v.level) + ' (' + num(lo) + '–' + num(hi) + ')' +
      (note ? ' ' + note : '');
    app.dataset.window = num(v.width); app.dataset.level = num(v.level);
  }
  function set(lvl, wdt, note) {
    viewer.view.level = lvl; viewer.view.width = wdt;
    level.value = String(lvl); width.value = String(wdt);
    show(note); redraw();
  }
  level.addEventListener('input', () => { viewer.view.level = Number(level.value); show(); redraw(); });
  width.addEventListener('input', () => { viewer.view.width = Number(width.value); show(); redraw(); });
  auto.addEventListener('click', () => {
    const hist = histogram ? histogram() : null;
    if (!hist) return;
    const [lo, hi] = percentiles(hist, [0.01, 0.99]);
    set((lo + hi) / 2, Math.max(1, hi - lo), 'auto');
  });
  resetView.addEventListener('click', () => { set(127.5, 255, ''); viewer.fit(); });
  full.addEventListener('click', () => viewer.oneToOne());
  const row = el('div', {class: 'controls'}, el('label', {}, 'level ', level), el('label', {}, 'window ', width),
                 readout, auto, resetView, full, viewer.zoomLabel);
  show();
  return {row, level, width, readout, auto, resetView, full, show};
}

function greyHistogram(values) {
  // 256-bin histogram of grey values (one per pixel)
  const hist = new Array(256).fill(0);
  for (let i = 0; i < values.length; i++) hist[values[i]]++;
  return hist;
}

function rgbaHistogram(rgba) {
  // 256-bin histogram of an RGBA image's grey level (the mean of its three channels: an overlay counts by its
  // brightness)
  const hist = new Array(256).fill(0);
  for (let i = 0; i < rgba.length; i += 4) hist[Math.round((rgba[i] + rgba[i + 1] + rgba[i + 2]) / 3)]++;
  return hist;
}

function viewKeys(viewer, controls) {
  const centre = () => { const b = viewer.box(); return [b.width / 2, b.height / 2]; };
  return {
    '+': () => viewer.zoom(1.25, ...centre()), '=': () => viewer.zoom(1.25, ...centre()),
    '-': () => viewer.zoom(1 / 1.25, ...centre()), '0': () => controls.resetView.click(),
    '1': () => viewer.oneToOne(), w: () => controls.auto.click(),
  };
}

// --- ILS pair ----------------------------------------------------------------------------------------

function decodeRuns(rle, h, w) {
  // COCO uncompressed counts are column-major runs starting with zeros; the array here is row-major.
  const mask = new Uint8Array(h * w);
  let k = 0, value = 0;
  for (const run of rle.counts) {
    if (value) {
      for (let j = k; j < k + run; j++) mask[(j % h) * w + Math.floor(j / h)] = 1;
    }
    k += run;
    value ^= 1;
  }
  return mask;
}

function encodeRuns(mask, h, w) {
  const counts = [];
  let current = 0, run = 0;
  for (let x = 0; x < w; x++) {
    for (let y = 0; y < h; y++) {
      const v = mask[y * w + x];
      if (v === current) run++; else { counts.push(run); run = 1; current = v; }
    }
  }
  counts.push(run);
  return {size: [h, w], counts: counts};
}

function headerNav(data, extra, withNext) {
  // previous / position / next open in the title bar (the side column starts with what is judged)
  const nav = el('div', {class: 'controls nav', id: 'item-nav'});
  if (data.prev) nav.append(el('a', {href: '/review/' + data.prev, id: 'prev'}, '← previous (P)'));
  nav.append(el('span', {class: 'sub', id: 'position', text: (data.position + 1) + ' of ' + data.total}));
  if (extra) nav.append(extra);
  if (data.next_open && withNext !== false) {
    nav.append(el('a', {href: '/review/' + data.next_open, id: 'next'}, 'next open (N) →'));
  }
  document.querySelector('header.title').append(nav);
  return nav;
}

function ilsPage(data) {
  const h = data.height, w = data.width, p = data.payload;
  const positive = data.positive;
  const viewer = makeViewer(w, h, [
    {id: 'current', text: positive ? (data.editable ? 'your mask' : data.reviewer + '\'s mask') : 'film',
     aria: 'chest film ' + data.key + (positive ? ', lesion mask drawn over it in cyan' : '')},
    {id: 'generated', text: 'generated mask', aria: 'chest film ' + data.key + ', generated mask in orange'}], data);
  const [main, side] = viewer.panes;
  side.stage.hidden = true;
  let grey = null;                      // Uint8ClampedArray of grey values (native size)
  let film = 'loading';                 // 'loading', 'shown' or 'unreadable': decisions wait for 'shown'
  const generated = data.generated_mask ? decodeRuns(data.generated_mask, h, w) : new Uint8Array(h * w);
  let mask = data.mask ? decodeRuns(data.mask, h, w) : generated.slice();
  const own = data.decisions.pair;
  let edited = false;                   // painted since the page loaded or the last save
  // the mask shown is the reviewer's own (a stored correction or paint): Accept keeps it
  let ownMask = positive && !!own && own.decision === 'correct' && !!data.mask;
  const state = {opacity: 0.45, show: true, outline: false, tool: 'brush', compare: false,
                 radius: Math.max(2, Math.round(Math.min(h, w) / 40))};
  const maxRadius = Math.max(60, Math.round(Math.min(h, w) / 6));
  const readOnly = !positive || !data.editable;   // nothing to paint: the pointer pans

  const show = el('input', {type: 'checkbox', id: 'show-mask', checked: ''});
  const outline = el('input', {type: 'checkbox', id: 'outline'});
  const opacity = el('input', {type: 'range', id: 'opacity', min: '0', max: '100', value: '45',
                               'aria-label': 'mask opacity'});
  const radius = el('input', {type: 'range', id: 'brush-size', min: '1', max: String(maxRadius),
                              value: String(state.radius), 'aria-label': 'brush radius (image pixels)'});
  const compare = el('input', {type: 'checkbox', id: 'compare'});
  const tools = {};
  for (const [name, label, key] of [['brush', 'Brush', 'B'], ['eraser', 'Eraser', 'E'], ['pan', 'Pan', 'H']]) {
    tools[name] = el('button', {type: 'button', class: 'tool', id: 'tool-' + name, 'aria-pressed': 'false',
                                title: key}, label + ' (' + key + ')');
    tools[name].addEventListener('click', () => setTool(name));
  }
  const resetMask = el('button', {type: 'button', id: 'reset-mask'}, 'Reset to generated mask');
  const accept = el('button', {type: 'button', class: 'accept', id: 'accept', disabled: ''}, 'Accept (A)');
  const reasons = reasonSelect(data.reasons, 'reason', 'reason for rejecting this pair',
                               own && own.decision === 'reject' ? own.reason : '');
  const reject = el('button', {type: 'button', class: 'reject', id: 'reject', disabled: ''}, 'Reject (R)');
  const save = el('button', {type: 'button', id: 'save-mask', disabled: ''}, 'Save corrected mask (S)');
  const comment = commentBox('comment', 'comment on your decision', own ? own.comment : '', data.max_comment);
  const saver = commentSaver(comment, () => !!own, async () => {
    const result = await saveComment('pair', 'pair', comment.value, own.version);
    if (!result) return;  // the status line says why
    Object.assign(own, {version: result.version, comment: result.comment, updated: result.updated});
    comment.dataset.stored = comment.value;
    setStatus('comment saved (the decision stays as it was)', 'saved');
  });
  const decided = el('p', {id: 'decision', class: 'decided',
                           text: own ? 'Your decision: ' + own.decision + (own.reason ? ' (' + own.reason + ')' : '') +
                                       (ownMask ? ' — your mask is shown' : '')
                                     : 'Not decided yet.'});
  if (!data.editable) decided.textContent = own ? data.reviewer + '\'s decision: ' + own.decision +
    (own.reason ? ' (' + own.reason + ')' : '') : data.reviewer + ' has not decided yet.';
  let histogram = null;  // the film's, computed once when auto window is first asked for
  const controls = windowControls(viewer, () => renderAll(),
                                  () => (grey ? (histogram = histogram || greyHistogram(grey)) : null));
  const maskRow = el('div', {class: 'controls'}, el('label', {}, show, ' mask (M)'),
                     el('label', {}, outline, ' outline (O)'),
                     el('label', {}, 'opacity ', opacity), el('label', {}, compare, ' generated beside (C)'));
  const editControls = el('div', {class: 'controls'}, tools.brush, tools.eraser, tools.pan,
    el('label', {}, 'brush ', radius), resetMask);
  if (!positive) maskRow.hidden = true;  // a negative pair has no mask to show
  if (!positive || !data.editable) editControls.hidden = true;
  const answer = el('blockquote', {id: 'answer'});
  answer.append(readable(p.answer, positive));
  answer.dataset.raw = p.answer;
  const pose = p.pose_warning ? el('p', {class: 'warning', id: 'pose-warning', role: 'note',
    text: 'Pose reader: this film may be stored wrongly; it looks right after being ' + p.pose_warning.correction +
          ' (P ' + Number(p.pose_warning.p).toFixed(2) + '). If so, every left and right is swapped: reject the ' +
          'pair. (It also flags a few upright films: portables, disease hiding the heart.)'}) : '';
  const readOnlyNote = data.editable ? '' : el('p', {class: 'warning', id: 'read-only', role: 'note',
    text: 'Read only: ' + data.reviewer + '\'s assignment (only the assigned reviewer decides).'});
  const text = el('div', {class: 'text'}, readOnlyNote, pose,
    el('h2', {text: 'Instruction'}), el('blockquote', {id: 'instruction', text: p.instruction}),
    el('h2', {text: 'Answer'}), answer,
    el('h2', {text: 'Report sentence'}),
    el('blockquote', {id: 'sentence', text: p.sentence || '(negative pair: no source sentence)'}));
  const labels = data.labels || {};
  const meta = el('div', {class: 'text'},
    el('p', {class: 'sub', id: 'pair-info'}, data.lesion + ' · ',
       el('span', {id: 'item-type', title: 'type: ' + data.item_type, text: labels.item_type || data.item_type}),
       ' · ' + p.split + ' split · ', el('span', {id: 'item-key', title: 'item key (review history --key)',
                                                  text: data.key})),
    el('details', {}, el('summary', {id: 'section-name', title: 'section_name: ' + p.section_name,
                                     text: 'Report section: ' + (labels.section || p.section_name)}),
       el('p', {id: 'section', text: p.section_content})));
  const decide = el('div', {class: 'decide'}, el('div', {class: 'controls'}, accept, reasons, reject,
                                                  positive ? save : ''), comment, saver.button);
  const theirComment = !data.editable && own && own.comment ? storedComment(own.comment) : '';
  const help = el('p', {class: 'sub', id: 'help'},
    'Keys: A accept what is shown (your painted or saved mask, else the generated one) · R reject (choose the ' +
    'reason first) · S save your mask (unchanged: an accept); the comment is sent with the decision, or alone with ' +
    'Save comment once you have decided (Esc leaves the box) · ' +
    'B brush · E eraser · H pan · M mask · O outline · C generated beside · [ ] brush size · + − zoom · ' +
    '1 full resolution · W auto window (1st–99th percentile) · 0 fit and full window · N next · P previous (both ask before dropping unsaved paint). Wheel zooms; drag ' +
    'with Pan (or the middle button) moves. ' + orientationHelp(data));
  const nav = headerNav(data);
  const sideColumn = el('div', {class: 'side'}, text, decided, data.editable ? decide : theirComment,
                        controls.row, maskRow, editControls, meta, help);
  content.append(el('div', {class: 'layout'}, el('div', {class: 'viewer'}, viewer.stages), sideColumn));
  growBoxes();
  const cursor = el('div', {class: 'brush-cursor', id: 'brush-cursor', hidden: ''});
  main.stage.append(cursor);

  function outlined(layer, i, x, y, t) {
    // a mask pixel within t pixels of the mask's edge (t grows as the film shrinks on screen, so the line stays
    // about 1.5 screen pixels wide)
    return x < t || y < t || x >= w - t || y >= h - t || !layer[i - t] || !layer[i + t] || !layer[i - t * w] ||
      !layer[i + t * w];
  }
  function render(pane, layer, colour, x0, y0, x1, y1) {
    if (!grey) return;
    x0 = Math.max(0, x0 | 0); y0 = Math.max(0, y0 | 0);
    x1 = Math.min(w, Math.ceil(x1)); y1 = Math.min(h, Math.ceil(y1));
    if (x1 <= x0 || y1 <= y0) return;
    const out = pane.ctx.createImageData(x1 - x0, y1 - y0);
    const a = state.show ? (state.outline ? 1 : state.opacity) : 0;
    const t = Math.max(1, Math.round(1.5 / viewer.view.scale));
    let o = 0;
    for (let y = y0; y < y1; y++) {
      for (let x = x0; x < x1; x++) {
        const i = y * w + x;
        const v = viewer.windowed(grey[i]);
        if (layer[i] && a > 0 && (!state.outline || outlined(layer, i, x, y, t))) {
          out.data[o] = v * (1 - a) + colour[0] * a; out.data[o + 1] = v * (1 - a) + colour[1] * a;
          out.data[o + 2] = v * (1 - a) + colour[2] * a;
        } else {
          out.data[o] = v; out.data[o + 1] = v; out.data[o + 2] = v;
        }
        out.data[o + 3] = 255;
        o += 4;
      }
    }
    pane.ctx.putImageData(out, x0, y0);
  }
  const CYAN = [0, 255, 255], ORANGE = [255, 150, 0];
  const margin = () => state.radius + 2 + (state.outline ? Math.max(1, Math.round(1.5 / viewer.view.scale)) : 0);
  const renderMain = (x0, y0, x1, y1) => render(main, mask, CYAN, x0, y0, x1, y1);
  function renderAll() {
    renderMain(0, 0, w, h);
    if (state.compare) render(side, generated, ORANGE, 0, 0, w, h);
  }
  let lastScale = 0, pending = false;
  viewer.view.onTransform = () => {  // an outline's width follows the zoom (redrawn once per frame at most)
    if (state.outline && Math.abs(viewer.view.scale - lastScale) > 1e-6 && !pending && grey) {
      pending = true;
      requestAnimationFrame(() => { pending = false; lastScale = viewer.view.scale; renderAll(); });
    }
    placeCursor();
  };

  function refreshAccept() {
    accept.textContent = ownMask && positive ? 'Accept your mask (A)' : 'Accept (A)';
  }
  function setEdited(value) {
    edited = value;
    if (value) { app.dataset.edited = 'true'; ownMask = true; } else delete app.dataset.edited;
    refreshAccept();
  }
  const commentChanged = () => comment.value.trim() !== comment.dataset.stored.trim();
  function leaveOk() {
    if (edited) return window.confirm('Your mask edits are not saved. Leave this pair and drop them?');
    return !commentChanged() || window.confirm('Your comment is not saved (it is saved with a decision' +
                                               (own ? ', or with Save comment' : '') + '). Leave this pair and ' +
                                               'drop it?');
  }
  function go(url) { if (url && leaveOk()) { setEdited(false); window.location.href = url; } }
  window.addEventListener('beforeunload', (ev) => {
    if (edited || (data.editable && commentChanged())) { ev.preventDefault(); ev.returnValue = ''; }
  });
  for (const link of nav.querySelectorAll('a')) {
    link.addEventListener('click', (ev) => { ev.preventDefault(); go(link.href); });
  }

  function setTool(name) {
    state.tool = name;
    for (const [k, b] of Object.entries(tools)) b.setAttribute('aria-pressed', String(k === name));
    main.canvas.style.cursor = name === 'pan' || readOnly ? 'grab' : 'none';
    app.dataset.tool = name;
    placeCursor();
  }
  function setCompare(on) {
    if (!positive) return;
    state.compare = on;
    compare.checked = on;
    side.stage.hidden = !on;
    app.dataset.compare = String(on);
    viewer.fit();
    renderAll();
  }
  function setOutline(on) {
    state.outline = on;
    outline.checked = on;
    app.dataset.outline = String(on);
    renderAll();
  }

  // the brush's circle at the pointer, its size on screen as painted
  let pointer = null;
  function placeCursor() {
    const painting = !readOnly && state.tool !== 'pan' && pointer && film === 'shown';
    cursor.hidden = !painting;
    if (!painting) return;
    const b = main.stage.getBoundingClientRect();
    const d = 2 * state.radius * viewer.view.scale;
    cursor.style.width = cursor.style.height = d + 'px';
    cursor.style.left = (pointer[0] - b.left - d / 2) + 'px';
    cursor.style.top = (pointer[1] - b.top - d / 2) + 'px';
    cursor.classList.toggle('eraser', state.tool === 'eraser');
  }
  main.canvas.addEventListener('pointermove', (ev) => { pointer = [ev.clientX, ev.clientY]; placeCursor(); });
  main.canvas.addEventListener('pointerleave', () => { pointer = null; placeCursor(); });
  function setRadius(r) {
    state.radius = Math.min(maxRadius, Math.max(1, r));
    radius.value = String(state.radius);
    placeCursor();
  }

  function paint(cx, cy) {
    if (film !== 'shown') return;
    const r = state.radius, value = state.tool === 'eraser' ? 0 : 1;
    for (let y = Math.max(0, Math.ceil(cy - r)); y <= Math.min(h - 1, Math.floor(cy + r)); y++) {
      for (let x = Math.max(0, Math.ceil(cx - r)); x <= Math.min(w - 1, Math.floor(cx + r)); x++) {
        if ((x - cx) * (x - cx) + (y - cy) * (y - cy) <= r * r) mask[y * w + x] = value;
      }
    }
    setEdited(true);
    const m = margin();
    renderMain(cx - m, cy - m, cx + m + 1, cy + m + 1);
  }
  viewer.onDrag(main, () => state.tool === 'pan' || readOnly, paint);
  viewer.onDrag(side, () => true, () => {});

  show.addEventListener('change', () => { state.show = show.checked; renderAll(); });
  outline.addEventListener('change', () => setOutline(outline.checked));
  opacity.addEventListener('input', () => { state.opacity = opacity.value / 100; renderAll(); });
  radius.addEventListener('input', () => setRadius(Number(radius.value)));
  compare.addEventListener('change', () => setCompare(compare.checked));
  resetMask.addEventListener('click', () => {
    if ((edited || ownMask) && !window.confirm('Drop your mask and go back to the generated mask?')) return;
    mask = generated.slice(); setEdited(false); ownMask = false; refreshAccept(); renderAll();
  });
  function canReject() {
    if (reasons.value && film !== 'loading') reject.removeAttribute('disabled'); else reject.setAttribute('disabled', '');
  }
  reasons.addEventListener('change', canReject);

  function isEmpty(m) { return !m.some((v) => v); }
  function same(a, b) { return a.every((v, i) => v === b[i]); }

  async function decideWith(decision, key) {
    if (film === 'loading') {
      setStatus('the film is still loading: decide once it is shown', 'open');
      return;
    }
    if (film === 'unreadable' && decision !== 'reject') {
      setStatus('not saved: the film could not be shown, so it cannot be accepted; reject it as "' +
                data.unreadable_reason + '" (R)', 'error');
      return;
    }
    // Accept keeps the mask that is shown: the reviewer's paint or their saved correction (the generated mask
    // only when that is what is shown)
    if (decision === 'accept' && ownMask && positive) decision = 'correct';
    if (decision === 'correct' && isEmpty(mask)) {  // nothing is posted
      setStatus('not saved: your mask is empty. An empty mask means no lesion: reject the pair instead ' +
                '(choose a reason, then R), or paint the lesion', 'error');
      return;
    }
    if (decision === 'correct' && same(mask, generated)) decision = 'accept';  // no change: not a correction
    if (decision === 'reject' && !reasons.value) {
      setStatus('choose a reason for rejecting (the list is focused), then press R again', 'open');
      reasons.focus();
      return;
    }
    if (decision === 'reject' && edited && !window.confirm('Reject and drop your mask edits?')) return;
    const result = await saveDecision('pair', 'pair', decision, decision === 'reject' ? reasons.value : '',
                                      decision === 'correct' ? encodeRuns(mask, h, w) : null,
                                      own ? own.version : 0, key, comment.value);
    if (!result) return;  // the edits stay on the page; the status line says why
    comment.dataset.stored = comment.value;
    decision = result.decision || decision;
    decided.textContent = 'Your decision: ' + decision + (decision === 'reject' ? ' (' + reasons.value + ')' : '');
    setStatus('saved: ' + decision, 'saved');
    app.dataset.saved = decision;
    setEdited(false);
    window.location.href = result.next_open ? '/review/' + result.next_open : '/queue';
  }
  accept.addEventListener('click', () => decideWith('accept', 'A'));
  reject.addEventListener('click', () => decideWith('reject', 'R'));
  save.addEventListener('click', () => decideWith('correct', 'S'));

  document.addEventListener('keydown', (ev) => {
    if (typing(ev.target) || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const key = ev.key.toLowerCase();
    const actions = Object.assign(viewKeys(viewer, controls), {
      a: () => data.editable && decideWith('accept', 'A'), r: () => data.editable && decideWith('reject', 'R'),
      s: () => data.editable && positive && decideWith('correct', 'S'),
      b: () => setTool('brush'), e: () => setTool('eraser'), h: () => setTool('pan'),
      m: () => { show.checked = !show.checked; state.show = show.checked; renderAll(); },
      o: () => positive && setOutline(!state.outline),
      c: () => setCompare(!state.compare),
      '[': () => setRadius(state.radius - Math.max(1, Math.round(state.radius / 8))),
      ']': () => setRadius(state.radius + Math.max(1, Math.round(state.radius / 8))),
      n: () => go(data.next_open ? '/review/' + data.next_open : null),
      p: () => go(data.prev ? '/review/' + data.prev : null),
    });
    if (actions[key]) { ev.preventDefault(); actions[key](); }
  });

  refreshAccept();
  relayout = () => viewer.size();
  setStatus('loading the film…', 'loading');
  fetchImage(0, 'film').then((img) => {
    const scratch = document.createElement('canvas');
    scratch.width = w; scratch.height = h;
    const sctx = scratch.getContext('2d');
    sctx.drawImage(img, 0, 0);
    const rgba = sctx.getImageData(0, 0, w, h).data;
    grey = new Uint8ClampedArray(w * h);
    for (let i = 0; i < w * h; i++) grey[i] = rgba[4 * i];
    setTool(readOnly ? 'pan' : 'brush');
    viewer.size();
    viewer.fit();
    lastScale = viewer.view.scale;
    renderAll();
    window.addEventListener('resize', () => { viewer.size(); viewer.fit(); });
    film = 'shown';
    app.dataset.film = film;
    for (const b of [accept, save]) b.removeAttribute('disabled');
    canReject();
    setStatus(own ? 'decided: ' + own.decision : 'open', 'open');
    document.body.dataset.ready = 'true';
  }).catch((err) => {
    film = 'unreadable';
    app.dataset.film = film;
    onlyReason(reasons, data.unreadable_reason);
    canReject();
    main.stage.querySelector('.pane-label').textContent = 'no film';
    setStatus(err.message + '. It cannot be accepted or corrected' +
              (data.editable ? ': reject it as "' + data.unreadable_reason + '" (R), or leave it for later.' : '.'),
              'error');
    document.body.dataset.ready = 'true';
  });
}

// --- CheXpercept case ----------------------------------------------------------------------------------

function benchPage(data) {
  const p = data.payload;
  const images = data.images.map(() => null);  // decoded RGBA per image, loaded once
  let shown = -1;
  let viewer = null, controls = null;
  let film = 'loading';                         // 'loading', 'shown' or 'unreadable': decisions wait for 'shown'
  const holder = el('div', {class: 'viewer'});
  const side = el('div', {class: 'side'});
  content.append(el('div', {class: 'layout'}, holder, side));
  const progress = el('span', {class: 'sub', id: 'case-progress'});
  headerNav(data, progress, false);  // the case's own Next button goes on once it is decided
  if (!data.editable) {
    side.append(el('p', {class: 'warning', id: 'read-only', role: 'note',
                         text: 'Read only: ' + data.reviewer + '\'s assignment (only the assigned reviewer decides).'}));
  }
  const labels = data.labels || {};
  side.append(el('p', {class: 'sub', id: 'case-info'}, data.lesion + ' · ',
                 el('span', {id: 'item-type', title: 'path: ' + p.path, text: labels.item_type || p.path}),
                 ' · reviewer ' + data.reviewer + ' · ',
                 el('span', {id: 'item-key', title: 'item key (review history --key)', text: data.key})));

  function load(n) {
    if (images[n]) return Promise.resolve(images[n]);
    return fetchImage(n, 'image "' + data.images[n].label + '"').then((img) => {
      const c = document.createElement('canvas');
      c.width = img.naturalWidth; c.height = img.naturalHeight;
      const x = c.getContext('2d');
      x.drawImage(img, 0, 0);
      images[n] = {w: c.width, h: c.height, rgba: x.getImageData(0, 0, c.width, c.height)};
      return images[n];
    });
  }
  function draw() {
    if (shown < 0 || !viewer) return;
    const src = images[shown].rgba, out = viewer.panes[0].ctx.createImageData(src.width, src.height);
    for (let i = 0; i < src.data.length; i += 4) {
      out.data[i] = viewer.windowed(src.data[i]); out.data[i + 1] = viewer.windowed(src.data[i + 1]);
      out.data[i + 2] = viewer.windowed(src.data[i + 2]); out.data[i + 3] = 255;
    }
    viewer.panes[0].ctx.putImageData(out, 0, 0);
  }
  async function showImage(n) {
    const im = await load(n);
    // one viewer per image size; window/level and zoom carry over between images of the same size
    if (!viewer || viewer.panes[0].canvas.width !== im.w || viewer.panes[0].canvas.height !== im.h) {
      const kept = viewer ? {level: viewer.view.level, width: viewer.view.width} : null;
      viewer = makeViewer(im.w, im.h, [{id: 'image', text: '', aria: 'case image'}], data);
      viewer.onDrag(viewer.panes[0], () => true, () => {});
      controls = windowControls(viewer, draw, () => {
        const im = images[shown];
        if (!im) return null;
        im.hist = im.hist || rgbaHistogram(im.rgba.data);
        return im.hist;
      });
      holder.replaceChildren(controls.row, viewer.stages);
      viewer.size();
      viewer.fit();
      if (kept) {
        Object.assign(viewer.view, kept);
        controls.level.value = String(kept.level); controls.width.value = String(kept.width);
        controls.show();
      }
    }
    shown = n;
    viewer.panes[0].stage.querySelector('.pane-label').textContent = data.images[n].label;
    viewer.panes[0].canvas.setAttribute('aria-label', 'case image: ' + data.images[n].label);
    app.dataset.image = String(n);
    for (const t of document.querySelectorAll('button.thumb')) {
      t.setAttribute('aria-pressed', String(Number(t.dataset.image) === n));
    }
    draw();
  }

  const order = [];
  const questions = [];   // per question: {part, box, accept, reject, reasons, state, title}
  let current = -1;       // the question A and R act on
  function setCurrent(i) {
    current = i;
    questions.forEach((q, k) => {
      q.box.classList.toggle('current', k === i);
      if (k === i) q.box.setAttribute('aria-current', 'step'); else q.box.removeAttribute('aria-current');
    });
  }
  function firstOpen(after) {
    const n = questions.length;
    for (let d = 1; d <= n; d++) {
      const k = (after + d + n) % n;
      if (!(questions[k].part in data.decisions)) return k;
    }
    return -1;
  }
  function refreshProgress() {
    const decidedParts = questions.filter((q) => q.part in data.decisions).length;
    progress.textContent = decidedParts + ' of ' + questions.length + ' questions decided';
  }

  p.questions.forEach((q, qi) => {
    const label = 'question ' + (qi + 1) + ' (' + q.title + ')';
    const box = el('section', {class: 'question', 'data-part': q.part, 'aria-label': label});
    box.append(el('h2', {text: (qi + 1) + '. ' + q.title}));
    if (q.prefix) box.append(el('p', {class: 'prefix', text: q.prefix}));  // the context the question starts from
    const thumbs = el('div', {class: 'thumbs'});
    for (const n of q.images) {
      const t = el('button', {type: 'button', class: 'thumb', 'data-image': String(n), title: data.images[n].label,
                              'aria-label': 'show ' + data.images[n].label},
                   el('img', {src: '/api/assignments/' + id + '/image/' + n, alt: ''}));
      t.addEventListener('click', () => showImage(n).catch((err) => setStatus(err.message, 'error')));
      thumbs.append(t);
      order.push(n);
    }
    box.append(thumbs);
    // the question as asked without its options (listed below), and the exact text the model reads folded away
    const stem = (labels.stems || {})[q.part];
    const question = el(stem ? 'p' : 'pre', {class: 'question-text'});
    question.append(readable(stem || q.question, true));
    box.append(question);
    const list = el('ol', {class: 'options'});
    q.options.forEach((opt, i) => {
      const li = el('li', {class: q.answer_index.includes(i + 1) ? 'key' : ''});
      li.append(readable(opt, true));
      list.append(li);
    });
    const key = el('p', {class: 'answer-key'});
    key.append('Answer key: ', readable(q.answer.join(', '), true));
    box.append(list, key);
    if (stem) {
      box.append(el('details', {class: 'prompt'}, el('summary', {text: 'Question as the model reads it'}),
                    el('pre', {class: 'prompt', text: q.question})));
    }
    const state = el('span', {class: 'decided part-state'});
    const mine = data.decisions[q.part];
    state.textContent = mine ? mine.decision + (mine.reason ? ' (' + mine.reason + ')' : '') : 'not decided';
    if (mine) box.dataset.state = mine.decision;
    const entry = {part: q.part, box: box, state: state, title: q.title, label: label, images: q.images};
    if (data.editable) {
      const reasons = reasonSelect(data.reasons, 'reason-' + q.part, 'reason for rejecting ' + label,
                                   mine && mine.decision === 'reject' ? mine.reason : '');
      const accept = el('button', {type: 'button', class: 'accept', disabled: '', 'aria-label': 'Accept ' + label},
                        'Accept (A)');
      const reject = el('button', {type: 'button', class: 'reject', disabled: '', 'aria-label': 'Reject ' + label},
                        'Reject (R)');
      const comment = commentBox('comment-' + q.part, 'comment on ' + label, mine ? mine.comment : '',
                                 data.max_comment);
      const saver = commentSaver(comment, () => q.part in data.decisions, async () => {
        const stored = data.decisions[q.part];
        const result = await saveComment('question', q.part, comment.value, stored.version);
        if (!result) return;
        Object.assign(stored, {version: result.version, comment: result.comment, updated: result.updated});
        comment.dataset.stored = comment.value;
        setStatus('comment saved on ' + label + ' (its decision stays as it was)', 'saved');
      });
      const canReject = () => {
        if (reasons.value && film !== 'loading') reject.removeAttribute('disabled');
        else reject.setAttribute('disabled', '');
      };
      reasons.addEventListener('change', canReject);
      Object.assign(entry, {accept: accept, reject: reject, reasons: reasons, canReject: canReject,
                            comment: comment, saver: saver});
      accept.addEventListener('click', () => send(qi, 'accept'));
      reject.addEventListener('click', () => send(qi, 'reject'));
      box.append(el('div', {class: 'controls'}, accept, reasons, reject, state), comment, saver.button);
      box.addEventListener('focusin', () => setCurrent(qi));
      box.addEventListener('click', () => setCurrent(qi));
    } else {
      box.append(state);
      if (mine && mine.comment) box.append(storedComment(mine.comment));
    }
    questions.push(entry);
    side.append(box);
  });

  async function send(qi, decision) {
    const q = questions[qi];
    setCurrent(qi);
    if (film === 'loading') {
      setStatus('the images are still loading: decide once they are shown', 'open');
      return;
    }
    if (film === 'unreadable' && decision !== 'reject') {
      setStatus('not saved: an image of this case could not be shown, so it cannot be accepted; reject it as "' +
                data.unreadable_reason + '" (R)', 'error');
      return;
    }
    if (decision === 'reject' && !q.reasons.value) {
      setStatus('choose a reason for rejecting ' + q.label + ' (the list is focused), then press R again', 'open');
      q.reasons.focus();
      return;
    }
    const mine = data.decisions[q.part];
    const reason = decision === 'reject' ? q.reasons.value : '';
    const result = await saveDecision('question', q.part, decision, reason, null, mine ? mine.version : 0,
                                      decision === 'accept' ? 'A' : 'R', q.comment.value);
    if (!result) return;
    data.decisions[q.part] = {decision: decision, reason: reason, version: result.version, updated: result.updated,
                              comment: result.comment};
    q.comment.dataset.stored = q.comment.value;
    q.saver.refresh();
    q.state.textContent = decision + (reason ? ' (' + reason + ')' : '');
    q.box.dataset.state = decision;
    refreshProgress();
    setStatus(result.assignment_done ? 'case complete: N for the next case' : 'saved: ' + decision, 'saved');
    if (result.assignment_done) nextLink.hidden = false;
    nextLink.href = result.next_open ? '/review/' + result.next_open : '/queue';
    const next = firstOpen(qi);
    if (next >= 0) {  // the next open question, with its first image
      setCurrent(next);
      questions[next].box.scrollIntoView({block: 'nearest'});
      if (questions[next].images.length && questions[next].images[0] !== shown) {
        showImage(questions[next].images[0]).catch((err) => setStatus(err.message, 'error'));
      }
    }
  }

  const nextLink = el('a', {class: 'button', id: 'next', href: data.next_open ? '/review/' + data.next_open : '/queue'},
                      'Next case (N)');
  nextLink.hidden = !Object.keys(data.decisions).length;
  window.addEventListener('beforeunload', (ev) => {  // a comment typed but not sent with a decision
    if (questions.some((q) => q.comment && q.comment.value.trim() !== q.comment.dataset.stored.trim())) {
      ev.preventDefault(); ev.returnValue = '';
    }
  });
  side.append(nextLink, el('p', {class: 'sub', id: 'help', text: 'Keys: A accept / R reject the highlighted ' +
    'question (choose the reason first; the next open question is highlighted after each decision; click a ' +
    'question to pick it; its comment box is sent with the decision, or alone with Save comment once decided; Esc ' +
    'leaves the box) · + − zoom · 1 full ' +
    'resolution · W auto window (1st–99th percentile) · 0 fit and full window · [ ] previous/next image · N next ' +
    'case. Wheel zooms, drag moves; window/level stays when the image changes. ' + orientationHelp(data)}));
  refreshProgress();
  growBoxes();
  setCurrent(questions.length ? Math.max(0, firstOpen(-1)) : -1);
  document.addEventListener('keydown', (ev) => {
    if (typing(ev.target) || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const key = ev.key.toLowerCase();
    const distinct = [...new Set(order)];
    const step = (d) => showImage(distinct[(distinct.indexOf(shown) + d + distinct.length) % distinct.length]);
    const actions = Object.assign(viewer ? viewKeys(viewer, controls) : {}, {
      n: () => { window.location.href = nextLink.href; }, '[': () => step(-1), ']': () => step(1),
      p: () => { if (data.prev) window.location.href = '/review/' + data.prev; },
    });
    if (data.editable && current >= 0) {
      actions.a = () => send(current, 'accept');
      actions.r = () => send(current, 'reject');
    }
    if (actions[key]) { ev.preventDefault(); actions[key](); }
  });

  // every image of the case is loaded before anything can be accepted (the server refuses an accept of an image it
  // cannot serve, too); one that fails leaves only the rejection as unreadable
  const distinct = [...new Set(data.images.map((_, n) => n))];
  relayout = () => { if (viewer) viewer.size(); };
  setStatus('loading the images…', 'loading');
  Promise.allSettled(distinct.map(load)).then(async (settled) => {
    const failed = settled.find((r) => r.status === 'rejected');
    const first = order.length ? order[0] : distinct.find((n) => images[n]);
    if (first !== undefined && first !== null && images[first]) await showImage(first);
    window.addEventListener('resize', () => { if (viewer) { viewer.size(); viewer.fit(); } });
    if (failed) {
      film = 'unreadable';
      for (const q of questions) {
        if (q.reasons) { onlyReason(q.reasons, data.unreadable_reason); q.canReject(); }
      }
      setStatus(failed.reason.message + '. The case cannot be accepted' +
                (data.editable ? ': reject its questions as "' + data.unreadable_reason + '", or leave it for later.'
                               : '.'), 'error');
    } else {
      film = 'shown';
      for (const q of questions) {
        if (q.accept) { q.accept.removeAttribute('disabled'); q.canReject(); }
      }
      setStatus(data.editable ? 'open' : 'read only', 'open');
    }
    app.dataset.film = film;
    if (viewer) viewer.size();
    document.body.dataset.ready = 'true';
  });
}

api('/api/assignments/' + id)
  .then((data) => (data.kind === 'ils' ? ilsPage(data) : benchPage(data)))
  .catch((err) => setStatus('could not load: ' + err.message, 'error'));
