// envbridge dashboard: helpers shared by the pages (no framework, no third-party code).
'use strict';

const Page = {
  kind: document.body.dataset.page,
  env: document.body.dataset.env,
  caller: document.body.dataset.caller,
  role: document.body.dataset.role,
  leader: document.body.dataset.leader === 'true',
};

function $(sel, root) { return (root || document).querySelector(sel); }

// An element with attributes (`on*` functions become listeners) and children (text or nodes).
function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') e.addEventListener(k.slice(2), v);
    else if (k === 'class') e.className = v;
    else if (k === 'text') e.textContent = v;
    else e.setAttribute(k, v === true ? '' : v);
  }
  for (const k of kids.flat()) {
    if (k === undefined || k === null || k === false) continue;
    e.append(k instanceof Node ? k : document.createTextNode(String(k)));
  }
  return e;
}

// Whether this caller may act here: an operator or admin, on the leader replica.
function canAct() { return Page.role !== 'viewer' && Page.leader; }

function showStandby() {
  $('#standby').hidden = Page.leader;
  $('#nav-new').hidden = !canAct();
}

// A JSON call to the daemon; resolves to {ok, status, data}; `data.error` is the daemon's own words.
async function call(method, url, body) {
  let res;
  try {
    res = await fetch(url, {
      method,
      credentials: 'same-origin',
      headers: body === undefined ? {} : { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
    });
  } catch (e) {
    return { ok: false, status: 0, data: { error: 'the daemon did not answer: ' + e.message } };
  }
  if (res.status === 401) { location.href = '/ui/login'; }
  let data = {};
  try { data = await res.json(); } catch (e) { data = { error: res.status + ' ' + res.statusText }; }
  return { ok: res.ok, status: res.status, data };
}

// The notice line under the header: progress, success or failure.
function notice(kind, ...content) {
  const n = $('#notice');
  n.className = 'notice' + (kind ? ' ' + kind : '');
  n.replaceChildren(...content);
  n.hidden = content.length === 0;
}

function stateBadge(s) { return el('span', { class: 'state ' + (s || 'none'), text: s || '—' }); }

function ago(ms) {
  if (!ms) return '—';
  const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
  if (s < 60) return s + ' s';
  if (s < 3600) return Math.floor(s / 60) + ' min';
  if (s < 86400) return Math.floor(s / 3600) + ' h ' + Math.floor((s % 3600) / 60) + ' min';
  return Math.floor(s / 86400) + ' d';
}

function clock(ms) { return ms ? new Date(ms).toLocaleTimeString() : '—'; }

// The live feed: `onMessage(kind, data)` for each snapshot/update. A lost connection shows in
// the header and is retried; every (re)connection starts with a snapshot, so nothing is missed.
function live(url, onMessage) {
  const conn = $('#conn');
  let es = null;
  let retry = null;
  const lost = (why) => { conn.className = 'conn lost'; conn.textContent = why; };
  const open = () => {
    retry = null;
    es = new EventSource(url);
    es.onopen = () => { conn.className = 'conn live'; conn.textContent = 'live'; };
    for (const kind of ['snapshot', 'update']) {
      es.addEventListener(kind, (ev) => {
        conn.className = 'conn live'; conn.textContent = 'live';
        const data = JSON.parse(ev.data);
        if (data.leader !== Page.leader) { Page.leader = data.leader; showStandby(); onMessage('leader', data); }
        onMessage(kind, data);
      });
    }
    es.addEventListener('expired', () => { es.close(); lost('session ended: log in again'); });
    es.onerror = () => {
      if (es.readyState !== EventSource.CLOSED) { lost('connection lost: reconnecting…'); return; }
      // Closed for good by the browser (e.g. an answer other than 200): check the session, retry.
      lost('connection lost: reconnecting…');
      fetch('/ui/api/me', { credentials: 'same-origin' }).then((r) => {
        if (r.status === 401) lost('session ended: log in again');
        else if (!retry) retry = setTimeout(open, 2000);
      }, () => { if (!retry) retry = setTimeout(open, 2000); });
    };
  };
  open();
}

// A confirmation dialog; `fields` are [{name, label, type, value, options, required}].
// Resolves to the field values, or null when cancelled.
function confirmDialog(title, text, fields) {
  const d = $('#confirm');
  $('#confirm-title').textContent = title;
  $('#confirm-text').textContent = text;
  const box = $('#confirm-fields');
  box.replaceChildren();
  for (const f of fields || []) {
    const id = 'confirm-' + f.name;
    let input;
    if (f.options) {
      input = el('select', { id, name: f.name }, f.options.map((o) => el('option', { value: o, text: o, selected: o === f.value })));
    } else {
      input = el('input', { id, name: f.name, type: f.type || 'text', value: f.value || '', required: f.required, min: f.min });
    }
    box.append(el('div', { class: 'field' }, el('label', { for: id, text: f.label }), input));
  }
  return new Promise((resolve) => {
    d.onclose = () => {
      if (d.returnValue !== 'ok') { resolve(null); return; }
      const out = {};
      for (const f of fields || []) out[f.name] = $('#confirm-' + f.name).value;
      resolve(out);
    };
    d.returnValue = '';
    d.showModal();
  });
}

showStandby();
