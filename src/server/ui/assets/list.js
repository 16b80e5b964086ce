// The environments list, kept current by the live feed.
'use strict';

(function () {
  const envs = new Map();
  const tbody = el('tbody', { id: 'env-rows' });
  const empty = el('p', { class: 'empty', id: 'no-envs', text: 'No environments.' });
  $('#main').append(
    el('div', { class: 'actions' },
      el('h1', { class: 'page-title', text: 'Environments' }),
      el('span', { class: 'spacer' }),
      el('a', { href: '/ui/new', id: 'new-env', hidden: !canAct() }, el('button', { class: 'primary', text: 'New environment' }))),
    el('table', { class: 'envs' },
      el('thead', {}, el('tr', {}, ['Environment', 'Workflow', 'State', 'Nodes', 'Tasks', 'Ready', 'Age', 'Run', 'Failing']
        .map((h) => el('th', { text: h })))),
      tbody),
    empty);

  let dirty = false;
  function render() {
    dirty = false;
    const rows = [...envs.values()].sort((a, b) => a.key.localeCompare(b.key)).map((e) => el('tr', { 'data-env': e.id },
      el('td', {}, el('a', { href: '/ui/env/' + encodeURIComponent(e.id), text: e.id })),
      el('td', { text: e.workflow }),
      el('td', {}, stateBadge(e.deleting ? 'DELETING' : e.state)),
      el('td', { text: e.nodes }),
      el('td', { text: e.seen === e.tasks ? e.tasks : e.seen + ' / ' + e.tasks }),
      el('td', { text: e.ready + ' / ' + e.tasks + ' ' + e.desired }),
      el('td', { text: ago(e.created_ms) }),
      el('td', { text: e.run_number || '—' }),
      el('td', { class: e.failing.length ? 'error' : '', text: e.failing.length || '' })));
    tbody.replaceChildren(...rows);
    empty.hidden = envs.size > 0;
  }
  const later = () => { if (!dirty) { dirty = true; requestAnimationFrame(render); } };

  live('/ui/events', (kind, m) => {
    if (kind === 'snapshot') envs.clear();
    if (kind === 'leader') { $('#new-env').hidden = !canAct(); return; }
    for (const e of m.envs || []) envs.set(e.key, e);
    for (const k of m.envs_gone || []) envs.delete(k);
    later();
  });
  // Ages move with the clock, not with data.
  setInterval(later, 30000);
})();
