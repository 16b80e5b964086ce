// One environment: its header, transitions, failing tasks, and every task grouped by node and
// role in a virtual list (only the rows in view exist; updates change them in place).
'use strict';

(function () {
  const id = Page.env;
  const enc = encodeURIComponent;
  const ROW = 28;
  // The state machine's events (from, to), in its order, as the server's own table gives them.
  const EVENTS = Object.fromEntries(
    JSON.parse(document.body.dataset.events).map((e) => [e.event, { from: e.from, to: e.to }]));
  const RUN_TYPES = ['PHYSICS', 'TECHNICAL', 'COSMICS', 'SYNTHETIC', 'CALIBRATION', 'PEDESTAL', 'PULSER', 'LASER', 'NOISE'];

  let env = null;
  let gone = false;
  let everSeen = false;
  const tasks = new Map();
  let busy = null;
  let selected = null;
  let flat = [];
  const filter = { state: '', node: '', cls: '', text: '' };

  const head = el('div', { class: 'envhead', id: 'env-head' });
  const actions = el('div', { class: 'actions', id: 'env-actions' });
  const failing = el('div', { class: 'failing-box', id: 'failing', hidden: true });
  const selState = el('select', { id: 'f-state', onchange: (e) => { filter.state = e.target.value; later(); } });
  const selNode = el('select', { id: 'f-node', onchange: (e) => { filter.node = e.target.value; later(); } });
  const selClass = el('select', { id: 'f-class', onchange: (e) => { filter.cls = e.target.value; later(); } });
  const search = el('input', { id: 'f-text', type: 'search', placeholder: 'task, path or message', oninput: (e) => { filter.text = e.target.value.toLowerCase(); later(); } });
  const count = el('span', { class: 'count', id: 'task-count' });
  const rowsEl = el('div', { class: 'rows' });
  const spacer = el('div', { class: 'spacer' }, rowsEl);
  const scroller = el('div', { class: 'scroller', id: 'task-rows', onscroll: () => draw() }, spacer);
  const story = el('aside', { class: 'story', id: 'story', hidden: true });
  $('#main').append(head, actions, failing,
    el('div', { class: 'filters' }, 'State', selState, 'Node', selNode, 'Class', selClass, search, count),
    el('div', { class: 'layout' },
      el('section', { class: 'tasks' },
        el('div', { class: 'thead' }, ['Task', 'State', 'Pod', 'Pod IP', 'Port', 'Changed', 'Message'].map((h) => el('span', { text: h }))),
        scroller),
      story));

  const isFailing = (t) => t.state === 'ERROR';

  function kv(k, v, attrs) { return el('span', { class: 'kv' }, k + ' ', el('b', attrs || {}, v)); }

  function renderHead() {
    if (gone || !env) {
      head.replaceChildren(el('h1', { text: id }), el('span', { class: 'error', id: 'env-gone', text: !gone ? 'loading…' : everSeen ? 'This environment is gone.' : 'No such environment here (yet): this page shows it when it appears.' }), el('a', { href: '/ui/', text: 'All environments' }));
      return;
    }
    const state = env.deleting ? 'DELETING' : env.state;
    head.replaceChildren(
      el('h1', { text: env.id }),
      el('span', { id: 'env-state', 'data-state': state }, stateBadge(state)),
      kv('workflow', env.workflow),
      kv('desired', env.desired),
      kv('nodes', String(env.nodes)),
      kv('tasks', env.seen === env.tasks ? String(env.tasks) : env.seen + ' of ' + env.tasks),
      kv('ready', env.ready + ' / ' + env.tasks, { id: 'env-ready' }),
      kv('run', env.run_number || '—', { id: 'env-run' }),
      kv('age', ago(env.created_ms)),
      ...(env.observed ? [kv('last transition', env.observed.event + ' ' + env.observed.phase + (env.observed.message ? ': ' + env.observed.message : ''))] : []));
  }

  // The buttons are made once and updated in place (never replaced under a pointer).
  const buttons = Object.entries(EVENTS).map(([ev, t]) => [t, el('button', {
    'data-event': ev, class: ev === 'START' ? 'primary' : '', onclick: () => transition(ev), text: ev,
  })]);
  const destroyButton = el('button', { id: 'destroy', class: 'danger', onclick: destroy, text: 'Destroy' });
  actions.append(...buttons.map(([, b]) => b), el('span', { class: 'spacer' }), destroyButton);

  function renderActions() {
    const state = env && env.state;
    const act = canAct() && env && !gone && !env.deleting && !busy;
    for (const [t, b] of buttons) b.disabled = !act || !t.from.includes(state);
    destroyButton.disabled = !act;
    actions.hidden = !canAct() || gone;
  }

  function renderFailing() {
    if (gone) { failing.hidden = true; return; }
    const byName = new Map();
    for (const f of (env && env.failing) || []) byName.set(f.task, { name: f.task, node: f.node, message: f.message });
    for (const t of tasks.values()) if (isFailing(t)) byName.set(t.name, { name: t.name, node: t.node, message: t.message || (byName.get(t.name) || {}).message || '' });
    failing.hidden = byName.size === 0;
    if (byName.size === 0) return;
    const items = [...byName.values()].slice(0, 50);
    failing.replaceChildren(
      el('h2', { text: byName.size + ' failing task' + (byName.size > 1 ? 's' : '') }),
      el('ul', {}, items.map((f) => el('li', { 'data-task': f.name, onclick: () => openStory(f.name) },
        el('b', { text: f.name }), ' on ' + f.node + ': ' + (f.message || 'ERROR')))));
  }

  function options(sel, values, current) {
    const want = ['', ...[...values].sort()];
    const have = [...sel.options].map((o) => o.value);
    if (want.length === have.length && want.every((v, i) => v === have[i])) return;
    sel.replaceChildren(...want.map((v) => el('option', { value: v, text: v || 'all', selected: v === current })));
  }

  function matches(t) {
    if (filter.state && t.state !== filter.state) return false;
    if (filter.node && t.node !== filter.node) return false;
    if (filter.cls && t.class !== filter.cls) return false;
    if (filter.text && !(t.name + ' ' + t.path + ' ' + t.message).toLowerCase().includes(filter.text)) return false;
    return true;
  }

  // The flat list of rows: groups (node, role) with failing ones first, their tasks failing first.
  function rebuild() {
    const states = new Set(), nodes = new Set(), classes = new Set();
    const groups = new Map();
    let shown = 0;
    for (const t of tasks.values()) {
      states.add(t.state); nodes.add(t.node); classes.add(t.class);
      if (!matches(t)) continue;
      shown++;
      const key = t.node + '\u0000' + t.role;
      let g = groups.get(key);
      if (!g) { g = { node: t.node, role: t.role, tasks: [], bad: 0 }; groups.set(key, g); }
      g.tasks.push(t);
      if (isFailing(t)) g.bad++;
    }
    options(selState, states, filter.state);
    options(selNode, nodes, filter.node);
    options(selClass, classes, filter.cls);
    const sorted = [...groups.values()].sort((a, b) => (b.bad > 0) - (a.bad > 0) || a.node.localeCompare(b.node) || a.role.localeCompare(b.role));
    flat = [];
    for (const g of sorted) {
      flat.push({ group: g });
      g.tasks.sort((a, b) => isFailing(b) - isFailing(a) || a.path.localeCompare(b.path));
      for (const t of g.tasks) flat.push({ task: t });
    }
    count.textContent = shown + ' of ' + tasks.size + ' tasks';
    spacer.style.height = (flat.length * ROW) + 'px';
    draw();
  }

  const pool = [];
  function row(i) {
    while (pool.length <= i) {
      const r = el('div', { class: 'row' });
      for (let c = 0; c < 7; c++) r.append(el('span'));
      r.addEventListener('click', () => { if (r.dataset.task) openStory(r.dataset.task); });
      pool.push(r);
    }
    return pool[i];
  }

  // Only the rows in view (and a few around) exist; each is refilled in place.
  function draw() {
    const first = Math.max(0, Math.floor(scroller.scrollTop / ROW) - 5);
    const n = Math.min(flat.length - first, Math.ceil(scroller.clientHeight / ROW) + 10);
    rowsEl.style.transform = 'translateY(' + (first * ROW) + 'px)';
    for (let i = 0; i < Math.max(n, 0); i++) {
      const item = flat[first + i];
      const r = row(i);
      const c = r.children;
      if (item.group) {
        const g = item.group;
        r.className = 'row group' + (g.bad ? ' bad' : '');
        delete r.dataset.task;
        r.removeAttribute('title');
        c[0].textContent = 'node ' + g.node + ' · role ' + g.role + ' · ' + g.tasks.length + ' task' + (g.tasks.length > 1 ? 's' : '') + (g.bad ? ' · ' + g.bad + ' failing' : '');
      } else {
        const t = item.task;
        r.className = 'row task' + (isFailing(t) ? ' failing' : '') + (t.name === selected ? ' selected' : '');
        r.dataset.task = t.name;
        r.title = t.name;
        c[0].textContent = t.path.slice(t.role.length + 1) + ' · ' + t.class + (t.critical ? '' : ' (non-critical)');
        c[1].replaceChildren(stateBadge(t.state));
        c[2].textContent = t.phase || '—';
        c[3].textContent = t.ip || '—';
        c[4].textContent = t.port || '—';
        c[5].textContent = clock(t.changed_ms);
        c[6].className = 'msg';
        c[6].textContent = t.message;
      }
    }
    if (rowsEl.children.length !== Math.max(n, 0)) rowsEl.replaceChildren(...pool.slice(0, Math.max(n, 0)));
  }

  function progress() {
    if (!busy || !env) return;
    const counts = Object.entries(env.counts || {}).map(([s, k]) => k + ' ' + s).join(', ');
    const done = (env.counts || {})[busy.to] || 0;
    notice('', el('span', { id: 'progress', text: busy.what + ': ' + done + ' of ' + env.tasks + ' tasks ' + busy.to + ' (' + counts + ') · ' + ((Date.now() - busy.started) / 1000).toFixed(1) + ' s' }));
  }

  let dirty = false;
  function later() {
    if (dirty) return;
    dirty = true;
    requestAnimationFrame(() => { dirty = false; renderHead(); renderActions(); renderFailing(); rebuild(); progress(); });
  }

  async function transition(ev) {
    const fields = ev === 'START' ? [
      { name: 'run_type', label: 'Run type', options: RUN_TYPES, value: 'PHYSICS' },
      { name: 'run_number', label: 'Run number', type: 'number', min: '1', required: true },
    ] : [];
    const v = await confirmDialog(ev + ' ' + id + '?', 'Send ' + ev + ' to the ' + env.tasks + ' tasks of ' + id + ' (now ' + env.state + ').', fields);
    if (!v) return;
    const body = { event: ev };
    if (ev === 'START') { body.run_number = Number(v.run_number); body.run_type = v.run_type; }
    busy = { what: ev, to: EVENTS[ev].to, started: Date.now() };
    later();
    const r = await call('POST', '/ui/api/env/' + enc(id) + '/transition', body);
    busy = null;
    later();
    if (!r.ok) { notice('bad', el('b', { text: ev + ' refused: ' }), el('pre', { id: 'action-error', text: r.data.error })); return; }
    const d = r.data;
    if (d.ok) {
      notice('good', el('span', { id: 'action-done', text: ev + ' done: ' + d.message + ' in ' + (d.elapsed_ms / 1000).toFixed(1) + ' s' }));
    } else {
      notice('bad', el('b', { id: 'action-error', text: ev + ' ' + d.outcome + ': ' + d.message }),
        el('ul', {}, d.failures.map((f) => el('li', { text: f.task + ' on ' + f.node + ': ' + f.message }))));
    }
  }

  async function destroy() {
    const v = await confirmDialog('Destroy ' + id + '?', 'Its ' + env.tasks + ' tasks are taken out and their pods deleted.', []);
    if (!v) return;
    busy = { what: 'DESTROY', to: 'gone', started: Date.now() };
    later();
    const r = await call('POST', '/ui/api/env/' + enc(id) + '/destroy');
    busy = null;
    later();
    if (!r.ok) notice('bad', el('b', { text: 'destroy refused: ' }), el('pre', { id: 'action-error', text: r.data.error }));
    else notice(r.data.gone ? 'good' : 'bad', el('span', { id: 'action-done', text: 'destroy: ' + r.data.message }), ' ', el('a', { href: '/ui/', text: 'All environments' }));
  }

  async function kill(name) {
    const v = await confirmDialog('Kill ' + name + '?', 'The task is taken out of ' + id + ' and its pod deleted.', []);
    if (!v) return;
    notice('', 'killing ' + name + '…');
    const r = await call('POST', '/ui/api/env/' + enc(id) + '/kill', { task: name });
    if (!r.ok) notice('bad', el('b', { text: 'kill refused: ' }), el('pre', { id: 'action-error', text: r.data.error }));
    else notice('good', el('span', { id: 'action-done', text: name + (r.data.gone ? ' is gone' : ' was not gone in time') }));
  }

  // A task's story: its message, its last log lines and its pod's events, from the cluster.
  let storyState = '';
  async function openStory(name) {
    selected = name;
    storyState = (tasks.get(name) || {}).state || '';
    story.hidden = false;
    story.replaceChildren(el('h2', { text: name }), el('p', { text: 'loading…' }));
    draw();
    const r = await call('GET', '/ui/api/env/' + enc(id) + '/task/' + enc(name));
    if (selected !== name) return;
    if (!r.ok) { story.replaceChildren(el('h2', { text: name }), el('p', { class: 'error', text: r.data.error })); return; }
    const s = r.data;
    story.replaceChildren(
      el('div', { class: 'actions' }, el('button', { id: 'story-close', onclick: () => { selected = null; story.hidden = true; draw(); }, text: 'Close' }),
        el('span', { class: 'spacer' }),
        canAct() ? el('button', { id: 'kill-task', class: 'danger', onclick: () => kill(name), text: 'Kill task' }) : null),
      el('h2', { text: s.name }),
      el('p', {}, stateBadge(s.state), ' ', s.class + ' on ' + s.node + ' · control port ' + (s.control_port || '—')),
      el('p', { class: 'kv', text: s.path }),
      el('h3', { text: 'Message' }), el('pre', { id: 'story-message', text: s.message || '—' }),
      el('h3', { text: 'Last log lines' }), el('pre', { id: 'story-log', text: s.last_log || '(none recorded)' }),
      el('h3', { text: 'Pod events' }),
      s.pod_events.length ? el('ul', { id: 'story-events' }, s.pod_events.map((e) => el('li', { text: e }))) : el('p', { text: '(none recorded)' }));
  }

  live('/ui/events?env=' + enc(id), (kind, m) => {
    if (kind === 'snapshot') { tasks.clear(); gone = false; env = null; }
    if (kind === 'leader') { later(); return; }
    for (const e of m.envs || []) if (e.id === id || e.key === id) { env = e; everSeen = true; }
    if ((m.envs_gone || []).length) gone = true;
    for (const t of m.tasks || []) tasks.set(t.name, t);
    for (const n of m.tasks_gone || []) {
      tasks.delete(n);
      if (n === selected) { selected = null; story.hidden = true; }
    }
    // A selected task that changed state tells its story again.
    if (selected && tasks.has(selected) && tasks.get(selected).state !== storyState && !story.hidden) openStory(selected);
    later();
  });
  setInterval(() => { if (busy) progress(); }, 500);
})();
