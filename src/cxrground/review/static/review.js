// cxrground review: the ILS pair page (image fitted to the window, mask overlay, window/level, zoom to full
// resolution, pan, brush/eraser, generated vs corrected side by side) and the CheXpercept case page (the same
// viewer for the case's images). Everything comes from this server's /api; nothing else is loaded.
'use strict';

const app = document.getElementById('app');
const content = document.getElementById('content');
const statusLine = document.getElementById('status');
const csrf = document.querySelector('meta[name=csrf-token]').content;
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

function setStatus(text, state) {
  statusLine.textContent = text;
  if (state) document.body.dataset.state = state;
}

async function api(path, options) {
  const resp = await fetch(path, Object.assign({credentials: 'same-origin'}, options || {}));
  const body = await resp.json().catch(() => ({}));
  if (!resp.ok) {
    const busy = resp.status === 503 ? ' (server busy: your decision was not stored, press the key again)' : '';
    throw new Error(((body.error && body.error.message) || ('HTTP ' + resp.status)) + busy);
  }
  return body;
}

async function postDecision(part, decision, reason, mask) {
  setStatus('saving…', 'saving');
  const body = {part: part, decision: decision, reason: reason || ''};
  if (mask) body.mask = mask;
  return api('/api/assignments/' + id + '/decision', {
    method: 'POST', headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf}, body: JSON.stringify(body)});
}

function typing(target) {
  // keys typed into a text field or a list are not shortcuts; checkboxes and sliders leave letters free
  return target instanceof HTMLTextAreaElement || target instanceof HTMLSelectElement ||
    (target instanceof HTMLInputElement && ['text', 'password', 'search', 'number'].includes(target.type));
}

function reasonSelect(reasons, idName) {
  // no reason is preselected: a rejection records only a reason the reviewer chose
  const select = el('select', {id: idName, 'aria-label': 'rejection reason'});
  select.append(el('option', {value: '', text: '— reason for rejecting —'}));
  reasons.forEach((r, i) => select.append(el('option', {value: r, text: (i + 1) + '. ' + r})));
  select.addEventListener('change', () => select.blur());  // letters are shortcuts again once a reason is chosen
  return select;
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

function makeViewer(w, h, labels) {
  const view = {scale: 1, tx: 0, ty: 0, level: 127.5, width: 255};
  const stages = el('div', {class: 'stages', id: 'stages'});
  const panes = labels.map((label, i) => {
    const canvas = el('canvas', {id: i === 0 ? 'view' : 'view-' + label.id, width: String(w), height: String(h)});
    const stage = el('div', {class: 'stage', id: i === 0 ? 'stage' : 'stage-' + label.id}, canvas,
                     el('span', {class: 'pane-label', text: label.text}));
    stages.append(stage);
    return {canvas: canvas, stage: stage, ctx: canvas.getContext('2d')};
  });
  const zoomLabel = el('span', {class: 'sub', id: 'zoom-level'});

  function applyTransform() {
    const t = 'translate(' + view.tx + 'px,' + view.ty + 'px) scale(' + view.scale + ')';
    for (const p of panes) p.canvas.style.transform = t;
    app.dataset.scale = view.scale.toFixed(3);
    zoomLabel.textContent = Math.round(view.scale * 100) + ' %';
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
  function size() {  // the stage fills the window below its top edge
    const top = stages.getBoundingClientRect().top + window.scrollY;
    const height = Math.max(320, window.innerHeight - top - 10);
    for (const p of panes) p.stage.style.height = height + 'px';
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

function windowControls(viewer, redraw) {
  const level = el('input', {type: 'range', id: 'level', min: '0', max: '255', step: '0.5', value: '127.5'});
  const width = el('input', {type: 'range', id: 'window', min: '1', max: '255', value: '255'});
  const resetView = el('button', {type: 'button', id: 'reset-view'}, 'Reset view (0)');
  const full = el('button', {type: 'button', id: 'full-res'}, '1:1 (1)');
  level.addEventListener('input', () => { viewer.view.level = Number(level.value); redraw(); });
  width.addEventListener('input', () => { viewer.view.width = Number(width.value); redraw(); });
  resetView.addEventListener('click', () => {
    level.value = '127.5'; width.value = '255'; viewer.view.level = 127.5; viewer.view.width = 255;
    viewer.fit(); redraw();
  });
  full.addEventListener('click', () => viewer.oneToOne());
  const row = el('div', {class: 'controls'}, el('label', {}, 'level ', level), el('label', {}, 'window ', width),
                 resetView, full, viewer.zoomLabel);
  return {row, level, width, resetView, full};
}

function viewKeys(viewer, controls) {
  const centre = () => { const b = viewer.box(); return [b.width / 2, b.height / 2]; };
  return {
    '+': () => viewer.zoom(1.25, ...centre()), '=': () => viewer.zoom(1.25, ...centre()),
    '-': () => viewer.zoom(1 / 1.25, ...centre()), '0': () => controls.resetView.click(),
    '1': () => viewer.oneToOne(),
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

function ilsPage(data) {
  const h = data.height, w = data.width, p = data.payload;
  const viewer = makeViewer(w, h, [{id: 'current', text: 'your mask'}, {id: 'generated', text: 'generated mask'}]);
  const [main, side] = viewer.panes;
  side.stage.hidden = true;
  let grey = null;                      // Uint8ClampedArray of grey values (native size)
  const generated = data.generated_mask ? decodeRuns(data.generated_mask, h, w) : new Uint8Array(h * w);
  let mask = data.mask ? decodeRuns(data.mask, h, w) : generated.slice();
  let edited = false;                   // painted since the page loaded or the last save
  const state = {opacity: 0.45, show: true, tool: 'brush', compare: false,
                 radius: Math.max(2, Math.round(Math.min(h, w) / 40))};

  const show = el('input', {type: 'checkbox', id: 'show-mask', checked: ''});
  const opacity = el('input', {type: 'range', id: 'opacity', min: '0', max: '100', value: '45'});
  const radius = el('input', {type: 'range', id: 'brush-size', min: '1', max: '60', value: String(state.radius)});
  const compare = el('input', {type: 'checkbox', id: 'compare'});
  const tools = {};
  for (const [name, label, key] of [['brush', 'Brush', 'B'], ['eraser', 'Eraser', 'E'], ['pan', 'Pan', 'H']]) {
    tools[name] = el('button', {type: 'button', class: 'tool', id: 'tool-' + name, 'aria-pressed': 'false',
                                title: key}, label + ' (' + key + ')');
    tools[name].addEventListener('click', () => setTool(name));
  }
  const resetMask = el('button', {type: 'button', id: 'reset-mask'}, 'Reset mask');
  const accept = el('button', {type: 'button', class: 'accept', id: 'accept'}, 'Accept (A)');
  const reasons = reasonSelect(data.reasons, 'reason');
  const reject = el('button', {type: 'button', class: 'reject', id: 'reject', disabled: ''}, 'Reject (R)');
  const save = el('button', {type: 'button', id: 'save-mask'}, 'Save corrected mask (S)');
  const own = data.decisions.pair;
  const decided = el('p', {id: 'decision', class: 'decided',
                           text: own ? 'Your decision: ' + own.decision + (own.reason ? ' (' + own.reason + ')' : '')
                                     : 'Not decided yet.'});
  const controls = windowControls(viewer, () => renderAll());
  const maskRow = el('div', {class: 'controls'}, el('label', {}, show, ' mask (M)'),
                     el('label', {}, 'opacity ', opacity), el('label', {}, compare, ' generated beside (C)'));
  const editControls = el('div', {class: 'controls'}, tools.brush, tools.eraser, tools.pan,
    el('label', {}, 'brush ', radius), resetMask);
  if (!data.positive || !data.editable) editControls.hidden = true;
  const answer = el('blockquote', {id: 'answer'});
  answer.append(readable(p.answer, data.positive));
  answer.dataset.raw = p.answer;
  const pose = p.pose_warning ? el('p', {class: 'warning', id: 'pose-warning', role: 'note',
    text: 'Pose reader: this film may be stored wrongly; it looks right after being ' + p.pose_warning.correction +
          ' (P ' + Number(p.pose_warning.p).toFixed(2) + '). If so, every left and right is swapped: reject the ' +
          'pair. (It also flags a few upright films: portables, disease hiding the heart.)'}) : '';
  const text = el('div', {class: 'text'}, pose,
    el('h2', {text: 'Instruction'}), el('blockquote', {id: 'instruction', text: p.instruction}),
    el('h2', {text: 'Answer'}), answer,
    el('h2', {text: 'Report sentence'}),
    el('blockquote', {id: 'sentence', text: p.sentence || '(negative pair: no source sentence)'}),
    el('p', {class: 'sub', text: data.lesion + ' · ' + data.item_type + ' · ' + p.pair_id + ' · ' + p.split}),
    el('details', {}, el('summary', {text: 'Report section (' + p.section_name + ')'}),
       el('p', {id: 'section', text: p.section_content})));
  const decide = el('div', {class: 'controls decide'}, accept, reasons, reject, data.positive ? save : '');
  const help = el('p', {class: 'sub', id: 'help'},
    'Keys: A accept (after painting: accept your mask) · R reject (choose the reason first) · S save your mask ' +
    '(unchanged: an accept) · ' +
    'B brush · E eraser · H pan · M mask · C generated beside · [ ] brush size · + − zoom · 1 full resolution · ' +
    '0 fit · N next · P previous (both ask before dropping unsaved paint). Wheel zooms; drag with Pan ' +
    '(or the middle button) moves.');
  const nav = el('div', {class: 'controls'});
  if (data.prev) nav.append(el('a', {href: '/review/' + data.prev, id: 'prev'}, '← previous (P)'));
  if (data.next_open) nav.append(el('a', {href: '/review/' + data.next_open, id: 'next'}, 'next open (N) →'));
  nav.append(el('span', {class: 'sub', text: (data.position + 1) + ' of ' + data.total}));
  content.append(el('div', {class: 'layout'},
    el('div', {class: 'viewer'}, viewer.stages),
    el('div', {class: 'side'}, nav, decided, data.editable ? decide : el('p', {text: 'Read only.'}),
       controls.row, maskRow, editControls, text, help)));

  function render(pane, layer, colour, x0, y0, x1, y1) {
    if (!grey) return;
    x0 = Math.max(0, x0 | 0); y0 = Math.max(0, y0 | 0);
    x1 = Math.min(w, Math.ceil(x1)); y1 = Math.min(h, Math.ceil(y1));
    if (x1 <= x0 || y1 <= y0) return;
    const out = pane.ctx.createImageData(x1 - x0, y1 - y0);
    const a = state.show ? state.opacity : 0;
    let o = 0;
    for (let y = y0; y < y1; y++) {
      for (let x = x0; x < x1; x++) {
        const i = y * w + x;
        const v = viewer.windowed(grey[i]);
        if (layer[i] && a > 0) {
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
  const renderMain = (x0, y0, x1, y1) => render(main, mask, CYAN, x0, y0, x1, y1);
  function renderAll() {
    renderMain(0, 0, w, h);
    if (state.compare) render(side, generated, ORANGE, 0, 0, w, h);
  }

  function setEdited(value) {
    edited = value;
    if (value) app.dataset.edited = 'true'; else delete app.dataset.edited;
    accept.textContent = value && data.positive ? 'Accept your mask (A)' : 'Accept (A)';
  }
  function leaveOk() {
    return !edited || window.confirm('Your mask edits are not saved. Leave this pair and drop them?');
  }
  function go(url) { if (url && leaveOk()) { setEdited(false); window.location.href = url; } }
  window.addEventListener('beforeunload', (ev) => { if (edited) { ev.preventDefault(); ev.returnValue = ''; } });
  for (const link of nav.querySelectorAll('a')) {
    link.addEventListener('click', (ev) => { ev.preventDefault(); go(link.href); });
  }

  function setTool(name) {
    state.tool = name;
    for (const [k, b] of Object.entries(tools)) b.setAttribute('aria-pressed', String(k === name));
    main.canvas.style.cursor = name === 'pan' ? 'grab' : 'crosshair';
    app.dataset.tool = name;
  }
  function setCompare(on) {
    state.compare = on;
    compare.checked = on;
    side.stage.hidden = !on;
    app.dataset.compare = String(on);
    viewer.fit();
    renderAll();
  }

  function paint(cx, cy) {
    const r = state.radius, value = state.tool === 'eraser' ? 0 : 1;
    for (let y = Math.max(0, Math.ceil(cy - r)); y <= Math.min(h - 1, Math.floor(cy + r)); y++) {
      for (let x = Math.max(0, Math.ceil(cx - r)); x <= Math.min(w - 1, Math.floor(cx + r)); x++) {
        if ((x - cx) * (x - cx) + (y - cy) * (y - cy) <= r * r) mask[y * w + x] = value;
      }
    }
    setEdited(true);
    renderMain(cx - r - 1, cy - r - 1, cx + r + 2, cy + r + 2);
  }
  const readOnly = !data.positive || !data.editable;
  viewer.onDrag(main, () => state.tool === 'pan' || readOnly, paint);
  viewer.onDrag(side, () => true, () => {});

  show.addEventListener('change', () => { state.show = show.checked; renderAll(); });
  opacity.addEventListener('input', () => { state.opacity = opacity.value / 100; renderAll(); });
  radius.addEventListener('input', () => { state.radius = Number(radius.value); });
  compare.addEventListener('change', () => setCompare(compare.checked));
  resetMask.addEventListener('click', () => {
    if (edited && !window.confirm('Drop your mask edits and go back to the generated mask?')) return;
    mask = generated.slice(); setEdited(false); renderAll();
  });
  reasons.addEventListener('change', () => {
    if (reasons.value) reject.removeAttribute('disabled'); else reject.setAttribute('disabled', '');
  });

  function isEmpty(m) { return !m.some((v) => v); }
  function same(a, b) { return a.every((v, i) => v === b[i]); }

  async function decideWith(decision) {
    if (decision === 'accept' && edited && data.positive) decision = 'correct';  // A after painting: your mask
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
    try {
      let result;
      if (decision === 'correct') result = await postDecision('pair', 'correct', '', encodeRuns(mask, h, w));
      else result = await postDecision('pair', decision, decision === 'reject' ? reasons.value : '');
      decision = result.decision || decision;
      decided.textContent = 'Your decision: ' + decision + (decision === 'reject' ? ' (' + reasons.value + ')' : '');
      setStatus('saved: ' + decision, 'saved');
      app.dataset.saved = decision;
      setEdited(false);
      window.location.href = result.next_open ? '/review/' + result.next_open : '/queue';
    } catch (err) {
      setStatus('not saved: ' + err.message, 'error');  // the edits stay on the page
    }
  }
  accept.addEventListener('click', () => decideWith('accept'));
  reject.addEventListener('click', () => decideWith('reject'));
  save.addEventListener('click', () => decideWith('correct'));

  document.addEventListener('keydown', (ev) => {
    if (typing(ev.target) || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const key = ev.key.toLowerCase();
    const actions = Object.assign(viewKeys(viewer, controls), {
      a: () => data.editable && decideWith('accept'), r: () => data.editable && decideWith('reject'),
      s: () => data.editable && data.positive && decideWith('correct'),
      b: () => setTool('brush'), e: () => setTool('eraser'), h: () => setTool('pan'),
      m: () => { show.checked = !show.checked; state.show = show.checked; renderAll(); },
      c: () => setCompare(!state.compare),
      '[': () => { radius.value = String(Math.max(1, state.radius - 1)); state.radius = Number(radius.value); },
      ']': () => { radius.value = String(Math.min(60, state.radius + 1)); state.radius = Number(radius.value); },
      n: () => go(data.next_open ? '/review/' + data.next_open : null),
      p: () => go(data.prev ? '/review/' + data.prev : null),
    });
    if (actions[key]) { ev.preventDefault(); actions[key](); }
  });

  const img = new Image();
  img.onload = () => {
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
    renderAll();
    window.addEventListener('resize', () => { viewer.size(); viewer.fit(); });
    setStatus(own ? 'decided: ' + own.decision : 'open', 'open');
    document.body.dataset.ready = 'true';
  };
  img.onerror = () => setStatus('the image could not be loaded', 'error');
  img.src = '/api/assignments/' + id + '/image/0';
}

// --- CheXpercept case ----------------------------------------------------------------------------------

function benchPage(data) {
  const p = data.payload;
  const images = data.images.map(() => null);  // decoded RGBA per image, loaded once
  let shown = -1;
  let viewer = null, controls = null;
  const holder = el('div', {class: 'viewer'});
  const side = el('div', {class: 'side'});
  content.append(el('div', {class: 'layout'}, holder, side));
  side.append(el('p', {class: 'sub', id: 'case-info',
                       text: data.lesion + ' · path ' + p.path + ' · ' + p.pair_id + ' · reviewer ' + data.reviewer}));

  function load(n) {
    if (images[n]) return Promise.resolve(images[n]);
    return new Promise((resolve, reject) => {
      const img = new Image();
      img.onload = () => {
        const c = document.createElement('canvas');
        c.width = img.naturalWidth; c.height = img.naturalHeight;
        const x = c.getContext('2d');
        x.drawImage(img, 0, 0);
        images[n] = {w: c.width, h: c.height, rgba: x.getImageData(0, 0, c.width, c.height)};
        resolve(images[n]);
      };
      img.onerror = () => reject(new Error('image ' + data.images[n].label + ' could not be loaded'));
      img.src = '/api/assignments/' + id + '/image/' + n;
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
      viewer = makeViewer(im.w, im.h, [{id: 'image', text: ''}]);
      viewer.onDrag(viewer.panes[0], () => true, () => {});
      controls = windowControls(viewer, draw);
      holder.replaceChildren(controls.row, viewer.stages);
      viewer.size();
      viewer.fit();
      if (kept) {
        Object.assign(viewer.view, kept);
        controls.level.value = String(kept.level); controls.width.value = String(kept.width);
      }
    }
    shown = n;
    viewer.panes[0].stage.querySelector('.pane-label').textContent = data.images[n].label;
    app.dataset.image = String(n);
    for (const t of document.querySelectorAll('button.thumb')) {
      t.setAttribute('aria-pressed', String(Number(t.dataset.image) === n));
    }
    draw();
  }

  const order = [];
  for (const q of p.questions) {
    const box = el('section', {class: 'question', 'data-part': q.part});
    box.append(el('h2', {text: q.title}));
    if (q.prefix) box.append(el('pre', {class: 'prefix', text: q.prefix}));
    const thumbs = el('div', {class: 'thumbs'});
    for (const n of q.images) {
      const t = el('button', {type: 'button', class: 'thumb', 'data-image': String(n), title: data.images[n].label},
                   el('img', {src: '/api/assignments/' + id + '/image/' + n, alt: data.images[n].label}));
      t.addEventListener('click', () => showImage(n));
      thumbs.append(t);
      order.push(n);
    }
    box.append(thumbs);
    const question = el('pre', {});
    question.append(readable(q.question, true));
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
    const state = el('span', {class: 'decided part-state'});
    const mine = data.decisions[q.part];
    state.textContent = mine ? mine.decision + (mine.reason ? ' (' + mine.reason + ')' : '') : 'not decided';
    if (data.editable) {
      const reasons = reasonSelect(data.reasons, 'reason-' + q.part);
      const accept = el('button', {type: 'button', class: 'accept'}, 'Accept');
      const reject = el('button', {type: 'button', class: 'reject', disabled: ''}, 'Reject');
      reasons.addEventListener('change', () => {
        if (reasons.value) reject.removeAttribute('disabled'); else reject.setAttribute('disabled', '');
      });
      const send = async (decision) => {
        try {
          const result = await postDecision(q.part, decision, decision === 'reject' ? reasons.value : '');
          state.textContent = decision + (decision === 'reject' ? ' (' + reasons.value + ')' : '');
          box.dataset.state = decision;
          setStatus(result.assignment_done ? 'case complete' : 'saved', 'saved');
          if (result.assignment_done) nextLink.hidden = false;
          nextLink.href = result.next_open ? '/review/' + result.next_open : '/queue';
        } catch (err) {
          setStatus('not saved: ' + err.message, 'error');
        }
      };
      accept.addEventListener('click', () => send('accept'));
      reject.addEventListener('click', () => reasons.value && send('reject'));
      box.append(el('div', {class: 'controls'}, accept, reasons, reject, state));
    } else {
      box.append(state);
    }
    side.append(box);
  }
  const nextLink = el('a', {class: 'button', id: 'next', href: data.next_open ? '/review/' + data.next_open : '/queue'},
                      'Next (N)');
  nextLink.hidden = !Object.keys(data.decisions).length;
  side.append(nextLink, el('p', {class: 'sub', id: 'help', text: 'Keys: + − zoom · 1 full resolution · 0 fit · ' +
    '[ ] previous/next image · N next case. Wheel zooms, drag moves; window/level stays when the image changes.'}));
  document.addEventListener('keydown', (ev) => {
    if (typing(ev.target) || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const key = ev.key.toLowerCase();
    const distinct = [...new Set(order)];
    const step = (d) => showImage(distinct[(distinct.indexOf(shown) + d + distinct.length) % distinct.length]);
    const actions = Object.assign(viewer ? viewKeys(viewer, controls) : {}, {
      n: () => { window.location.href = nextLink.href; }, '[': () => step(-1), ']': () => step(1),
    });
    if (actions[key]) { ev.preventDefault(); actions[key](); }
  });
  const first = order.length ? order[0] : null;
  (first === null ? Promise.resolve() : showImage(first)).then(() => {
    window.addEventListener('resize', () => { if (viewer) { viewer.size(); viewer.fit(); } });
    setStatus('open', 'open');
    document.body.dataset.ready = 'true';
  }).catch((err) => setStatus(err.message, 'error'));
}

api('/api/assignments/' + id)
  .then((data) => (data.kind === 'ils' ? ilsPage(data) : benchPage(data)))
  .catch((err) => setStatus('could not load: ' + err.message, 'error'));
