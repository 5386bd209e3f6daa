// cxrground review: the ILS pair page (image, mask overlay, window/level, zoom/pan, brush/eraser) and the
// CheXpercept case page. Everything comes from this server's /api; nothing else is loaded.
'use strict';

const app = document.getElementById('app');
const content = document.getElementById('content');
const statusLine = document.getElementById('status');
const csrf = document.querySelector('meta[name=csrf-token]').content;
const id = app.dataset.assignment;

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
  if (!resp.ok) throw new Error((body.error && body.error.message) || ('HTTP ' + resp.status));
  return body;
}

async function postDecision(part, decision, reason, mask) {
  setStatus('saving…', 'saving');
  const body = {part: part, decision: decision, reason: reason || ''};
  if (mask) body.mask = mask;
  return api('/api/assignments/' + id + '/decision', {
    method: 'POST', headers: {'Content-Type': 'application/json', 'X-CSRF-Token': csrf}, body: JSON.stringify(body)});
}

function goNext(result) {
  window.location.href = result.next_open ? '/review/' + result.next_open : '/queue';
}

function typing(target) {
  // keys typed into a text field or a list are not shortcuts; checkboxes and sliders leave letters free
  return target instanceof HTMLTextAreaElement || target instanceof HTMLSelectElement ||
    (target instanceof HTMLInputElement && ['text', 'password', 'search', 'number'].includes(target.type));
}

function reasonSelect(reasons, idName) {
  const select = el('select', {id: idName});
  for (const r of reasons) select.append(el('option', {value: r, text: r}));
  return select;
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
  const canvas = el('canvas', {id: 'view', width: String(w), height: String(h)});
  const stage = el('div', {class: 'stage', id: 'stage'}, canvas);
  const ctx = canvas.getContext('2d');
  let grey = null;                      // Uint8ClampedArray of grey values (native size)
  const generated = data.generated_mask ? decodeRuns(data.generated_mask, h, w) : new Uint8Array(h * w);
  let mask = data.mask ? decodeRuns(data.mask, h, w) : generated.slice();
  let edited = false;
  const view = {scale: 1, tx: 0, ty: 0, level: 127.5, width: 255, opacity: 0.45, show: true, tool: 'brush',
                radius: Math.max(2, Math.round(Math.min(h, w) / 40))};

  const show = el('input', {type: 'checkbox', id: 'show-mask', checked: ''});
  const opacity = el('input', {type: 'range', id: 'opacity', min: '0', max: '100', value: '45'});
  const level = el('input', {type: 'range', id: 'level', min: '0', max: '255', step: '0.5', value: '127.5'});
  const width = el('input', {type: 'range', id: 'window', min: '1', max: '255', value: '255'});
  const radius = el('input', {type: 'range', id: 'brush-size', min: '1', max: '60', value: String(view.radius)});
  const tools = {};
  for (const [name, label, key] of [['brush', 'Brush', 'B'], ['eraser', 'Eraser', 'E'], ['pan', 'Pan', 'H']]) {
    tools[name] = el('button', {type: 'button', class: 'tool', id: 'tool-' + name, 'aria-pressed': 'false',
                                title: key}, label + ' (' + key + ')');
    tools[name].addEventListener('click', () => setTool(name));
  }
  const resetMask = el('button', {type: 'button', id: 'reset-mask'}, 'Reset mask');
  const resetView = el('button', {type: 'button', id: 'reset-view'}, 'Reset view (0)');
  const accept = el('button', {type: 'button', class: 'accept', id: 'accept'}, 'Accept (A)');
  const reasons = reasonSelect(data.reasons, 'reason');
  const reject = el('button', {type: 'button', class: 'reject', id: 'reject'}, 'Reject (R)');
  const save = el('button', {type: 'button', id: 'save-mask'}, 'Save corrected mask (S)');
  const own = data.decisions.pair;
  const decided = el('p', {id: 'decision', class: 'decided',
                           text: own ? 'Your decision: ' + own.decision + (own.reason ? ' (' + own.reason + ')' : '')
                                     : 'Not decided yet.'});

  const controls = el('div', {class: 'controls'},
    el('label', {}, show, ' mask (M)'), el('label', {}, 'opacity ', opacity),
    el('label', {}, 'level ', level), el('label', {}, 'window ', width), resetView);
  const editControls = el('div', {class: 'controls'}, tools.brush, tools.eraser, tools.pan,
    el('label', {}, 'brush size ', radius), resetMask);
  if (!data.positive) editControls.hidden = true;
  const text = el('div', {class: 'text'},
    el('h2', {text: 'Instruction'}), el('blockquote', {id: 'instruction', text: p.instruction}),
    el('h2', {text: 'Answer'}), el('blockquote', {id: 'answer', text: p.answer}),
    el('h2', {text: 'Report sentence'}),
    el('blockquote', {id: 'sentence', text: p.sentence || '(negative pair: no source sentence)'}),
    el('p', {class: 'sub', text: data.lesion + ' · ' + data.item_type + ' · ' + p.pair_id + ' · ' + p.split}),
    el('details', {}, el('summary', {text: 'Report section (' + p.section_name + ')'}),
       el('p', {id: 'section', text: p.section_content})));
  const decide = el('div', {class: 'controls'}, accept, reasons, reject, data.positive ? save : '');
  const help = el('p', {class: 'sub', id: 'help'},
    'Keys: A accept · R reject · S save mask · B brush · E eraser · H pan · M mask · [ ] brush size · ' +
    '+ − zoom · 0 reset view · N next · P previous. Wheel zooms; drag with Pan (or the middle button) moves.');
  const nav = el('div', {class: 'controls'});
  if (data.prev) nav.append(el('a', {href: '/review/' + data.prev, id: 'prev'}, '← previous'));
  if (data.next_open) nav.append(el('a', {href: '/review/' + data.next_open, id: 'next'}, 'next open →'));
  nav.append(el('span', {class: 'sub', text: (data.position + 1) + ' of ' + data.total}));
  content.append(el('div', {class: 'layout'},
    el('div', {class: 'viewer'}, controls, editControls, stage),
    el('div', {class: 'side'}, text, decided, data.editable ? decide : el('p', {text: 'Read only.'}), help, nav)));

  function applyTransform() {
    canvas.style.transform = 'translate(' + view.tx + 'px,' + view.ty + 'px) scale(' + view.scale + ')';
  }

  function fit() {
    const box = stage.getBoundingClientRect();
    view.scale = Math.min(box.width / w, box.height / h);
    view.tx = (box.width - w * view.scale) / 2;
    view.ty = (box.height - h * view.scale) / 2;
    applyTransform();
  }

  function render(x0, y0, x1, y1) {
    if (!grey) return;
    x0 = Math.max(0, x0 | 0); y0 = Math.max(0, y0 | 0);
    x1 = Math.min(w, Math.ceil(x1)); y1 = Math.min(h, Math.ceil(y1));
    if (x1 <= x0 || y1 <= y0) return;
    const out = ctx.createImageData(x1 - x0, y1 - y0);
    const lo = view.level - view.width / 2, span = view.width, a = view.show ? view.opacity : 0;
    let o = 0;
    for (let y = y0; y < y1; y++) {
      for (let x = x0; x < x1; x++) {
        const i = y * w + x;
        let v = (grey[i] - lo) * 255 / span;
        v = v < 0 ? 0 : v > 255 ? 255 : v;
        if (mask[i] && a > 0) {
          out.data[o] = v * (1 - a); out.data[o + 1] = v * (1 - a) + 255 * a; out.data[o + 2] = v * (1 - a) + 255 * a;
        } else {
          out.data[o] = v; out.data[o + 1] = v; out.data[o + 2] = v;
        }
        out.data[o + 3] = 255;
        o += 4;
      }
    }
    ctx.putImageData(out, x0, y0);
  }
  const renderAll = () => render(0, 0, w, h);

  function setTool(name) {
    view.tool = name;
    for (const [k, b] of Object.entries(tools)) b.setAttribute('aria-pressed', String(k === name));
    canvas.style.cursor = name === 'pan' ? 'grab' : 'crosshair';
    app.dataset.tool = name;
  }

  function paint(cx, cy) {
    const r = view.radius, value = view.tool === 'eraser' ? 0 : 1;
    for (let y = Math.max(0, Math.ceil(cy - r)); y <= Math.min(h - 1, Math.floor(cy + r)); y++) {
      for (let x = Math.max(0, Math.ceil(cx - r)); x <= Math.min(w - 1, Math.floor(cx + r)); x++) {
        if ((x - cx) * (x - cx) + (y - cy) * (y - cy) <= r * r) mask[y * w + x] = value;
      }
    }
    edited = true;
    app.dataset.edited = 'true';
    render(cx - r - 1, cy - r - 1, cx + r + 2, cy + r + 2);
  }

  function toNative(ev) {
    const rect = canvas.getBoundingClientRect();
    return [Math.floor((ev.clientX - rect.left) * w / rect.width), Math.floor((ev.clientY - rect.top) * h / rect.height)];
  }

  let drag = null;
  canvas.addEventListener('pointerdown', (ev) => {
    ev.preventDefault();
    canvas.setPointerCapture(ev.pointerId);
    const panning = view.tool === 'pan' || ev.button === 1 || !data.positive || !data.editable;
    drag = {pan: panning, x: ev.clientX, y: ev.clientY, tx: view.tx, ty: view.ty};
    if (!panning) paint(...toNative(ev));
  });
  canvas.addEventListener('pointermove', (ev) => {
    if (!drag) return;
    if (drag.pan) {
      view.tx = drag.tx + ev.clientX - drag.x; view.ty = drag.ty + ev.clientY - drag.y; applyTransform();
    } else {
      paint(...toNative(ev));
    }
  });
  const endDrag = () => { drag = null; };
  canvas.addEventListener('pointerup', endDrag);
  canvas.addEventListener('pointercancel', endDrag);
  stage.addEventListener('wheel', (ev) => {
    ev.preventDefault();
    const box = stage.getBoundingClientRect();
    zoom(ev.deltaY < 0 ? 1.15 : 1 / 1.15, ev.clientX - box.left, ev.clientY - box.top);
  }, {passive: false});

  function zoom(factor, px, py) {
    const s = Math.min(40, Math.max(0.05, view.scale * factor));
    view.tx = px - (px - view.tx) * s / view.scale;
    view.ty = py - (py - view.ty) * s / view.scale;
    view.scale = s;
    applyTransform();
    app.dataset.scale = view.scale.toFixed(3);
  }

  show.addEventListener('change', () => { view.show = show.checked; renderAll(); });
  opacity.addEventListener('input', () => { view.opacity = opacity.value / 100; renderAll(); });
  level.addEventListener('input', () => { view.level = Number(level.value); renderAll(); });
  width.addEventListener('input', () => { view.width = Number(width.value); renderAll(); });
  radius.addEventListener('input', () => { view.radius = Number(radius.value); });
  resetView.addEventListener('click', () => {
    level.value = '127.5'; width.value = '255'; view.level = 127.5; view.width = 255; fit(); renderAll();
  });
  resetMask.addEventListener('click', () => { mask = generated.slice(); edited = false; renderAll(); });

  async function decideWith(decision) {
    try {
      let result;
      if (decision === 'correct') result = await postDecision('pair', 'correct', '', encodeRuns(mask, h, w));
      else result = await postDecision('pair', decision, decision === 'reject' ? reasons.value : '');
      decided.textContent = 'Your decision: ' + decision + (decision === 'reject' ? ' (' + reasons.value + ')' : '');
      setStatus('saved: ' + decision, 'saved');
      app.dataset.edited = String(edited);
      goNext(result);
    } catch (err) {
      setStatus('not saved: ' + err.message, 'error');
    }
  }
  accept.addEventListener('click', () => decideWith('accept'));
  reject.addEventListener('click', () => decideWith('reject'));
  save.addEventListener('click', () => decideWith('correct'));

  document.addEventListener('keydown', (ev) => {
    if (typing(ev.target) || ev.ctrlKey || ev.metaKey || ev.altKey) return;
    const box = stage.getBoundingClientRect();
    const key = ev.key.toLowerCase();
    const actions = {
      a: () => data.editable && decideWith('accept'), r: () => data.editable && decideWith('reject'),
      s: () => data.editable && data.positive && decideWith('correct'),
      b: () => setTool('brush'), e: () => setTool('eraser'), h: () => setTool('pan'),
      m: () => { show.checked = !show.checked; view.show = show.checked; renderAll(); },
      '[': () => { radius.value = String(Math.max(1, view.radius - 1)); view.radius = Number(radius.value); },
      ']': () => { radius.value = String(Math.min(60, view.radius + 1)); view.radius = Number(radius.value); },
      '+': () => zoom(1.25, box.width / 2, box.height / 2), '=': () => zoom(1.25, box.width / 2, box.height / 2),
      '-': () => zoom(1 / 1.25, box.width / 2, box.height / 2), '0': () => resetView.click(),
      n: () => data.next_open && (window.location.href = '/review/' + data.next_open),
      p: () => data.prev && (window.location.href = '/review/' + data.prev),
    };
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
    setTool('brush');
    fit();
    renderAll();
    setStatus(own ? 'decided: ' + own.decision : 'open', 'open');
    document.body.dataset.ready = 'true';
  };
  img.onerror = () => setStatus('the image could not be loaded', 'error');
  img.src = '/api/assignments/' + id + '/image/0';
}

// --- CheXpercept case ----------------------------------------------------------------------------------

function benchPage(data) {
  const p = data.payload;
  content.append(el('p', {class: 'sub', id: 'case-info',
                          text: data.lesion + ' · path ' + p.path + ' · ' + p.pair_id + ' · reviewer ' + data.reviewer}));
  for (const q of p.questions) {
    const box = el('section', {class: 'question', 'data-part': q.part});
    box.append(el('h2', {text: q.title}));
    if (q.prefix) box.append(el('pre', {class: 'prefix', text: q.prefix}));
    for (const n of q.images) {
      box.append(el('img', {src: '/api/assignments/' + id + '/image/' + n, alt: data.images[n].label}));
    }
    box.append(el('pre', {text: q.question}));
    const list = el('ol', {class: 'options'});
    q.options.forEach((opt, i) => {
      list.append(el('li', {class: q.answer_index.includes(i + 1) ? 'key' : '', text: opt}));
    });
    box.append(list, el('p', {class: 'answer-key', text: 'Answer key: ' + q.answer.join(', ')}));
    const state = el('span', {class: 'decided part-state'});
    const mine = data.decisions[q.part];
    state.textContent = mine ? mine.decision + (mine.reason ? ' (' + mine.reason + ')' : '') : 'not decided';
    if (data.editable) {
      const reasons = reasonSelect(data.reasons, 'reason-' + q.part);
      const accept = el('button', {type: 'button', class: 'accept'}, 'Accept');
      const reject = el('button', {type: 'button', class: 'reject'}, 'Reject');
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
      reject.addEventListener('click', () => send('reject'));
      box.append(el('div', {class: 'controls'}, accept, reasons, reject, state));
    } else {
      box.append(state);
    }
    content.append(box);
  }
  const nextLink = el('a', {class: 'button', id: 'next', href: data.next_open ? '/review/' + data.next_open : '/queue'},
                      'Next (N)');
  nextLink.hidden = !Object.keys(data.decisions).length;
  content.append(nextLink);
  document.addEventListener('keydown', (ev) => {
    if (ev.key.toLowerCase() === 'n' && !typing(ev.target)) window.location.href = nextLink.href;
  });
  setStatus('open', 'open');
  document.body.dataset.ready = 'true';
}

api('/api/assignments/' + id)
  .then((data) => (data.kind === 'ils' ? ilsPage(data) : benchPage(data)))
  .catch((err) => setStatus('could not load: ' + err.message, 'error'));
