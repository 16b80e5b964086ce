// Create an environment: a form built from the workflow's public variables (the anchor's
// `!public` metadata: label, description, type, widget, values, panel, index, visibleif).
'use strict';

(function () {
  let workflows = [];
  const wfSel = el('select', { id: 'workflow', name: 'workflow', onchange: () => build() });
  const fieldsBox = el('div', { id: 'fields' });
  const form = el('form', { class: 'create', id: 'create-form', onsubmit: (e) => { e.preventDefault(); submit(); } },
    el('div', { class: 'field' }, el('label', { for: 'workflow', text: 'Workflow' }), wfSel),
    el('div', { class: 'field' }, el('label', { for: 'env-id', text: 'Environment id (optional)' }),
      el('input', { id: 'env-id', type: 'text', placeholder: 'generated when empty', pattern: '[a-z0-9]([a-z0-9-]*[a-z0-9])?' })),
    el('div', { class: 'field' }, el('label', { for: 'hosts', text: 'Hosts' }),
      el('input', { id: 'hosts', type: 'text', required: true, placeholder: 'flp001,flp002' }),
      el('div', { class: 'help', text: 'The machines of the environment: names separated by commas, or a JSON list.' })),
    fieldsBox,
    Page.role === 'admin' ? el('div', { class: 'field' }, el('label', { for: 'site-vars', text: 'Site variables (admin; the site\'s allow-list)' }),
      el('textarea', { id: 'site-vars', rows: 3, placeholder: 'NAME=value, one per line' })) : null,
    el('div', { class: 'actions' }, el('button', { id: 'create-submit', class: 'primary', type: 'submit', text: 'Create' })));
  $('#main').append(el('h1', { class: 'page-title', text: 'New environment' }), form);
  if (!canAct()) notice('bad', Page.leader ? 'A viewer may not create environments.' : 'This replica is on standby: read-only.');

  const field = (d, k) => (d.fields || {})[k];
  const widgetOf = (d) => field(d, 'widget') || (field(d, 'type') === 'bool' ? 'checkBox' : 'editBox');
  const valuesOf = (d) => (Array.isArray(field(d, 'values')) ? field(d, 'values').map(String) : []);

  // The current value of a variable's input ('' when it has none).
  function valueOf(d) {
    const w = widgetOf(d);
    const name = 'var-' + d.name;
    if (w === 'checkBox') return $('[name="' + name + '"]', form).checked ? 'true' : 'false';
    if (w === 'radioButtonBox') { const c = $('[name="' + name + '"]:checked', form); return c ? c.value : ''; }
    if (valuesOf(d).length && ['detectorSelector', 'checkBoxes', 'listBox', 'multiSelect'].includes(w)) {
      return JSON.stringify([...form.querySelectorAll('[name="' + name + '"]:checked')].map((c) => c.value));
    }
    return $('[name="' + name + '"]', form).value;
  }

  function input(d) {
    const w = widgetOf(d);
    const name = 'var-' + d.name;
    const id = 'var-' + d.name;
    const def = d.default === null || d.default === undefined ? '' : String(d.default);
    const values = valuesOf(d);
    if (w === 'checkBox') return el('input', { id, name, type: 'checkbox', checked: def === 'true' });
    if (w === 'radioButtonBox' && values.length) {
      return el('div', { class: 'choices', id }, values.map((v) => el('label', {}, el('input', { type: 'radio', name, value: v, checked: v === def }), ' ' + v)));
    }
    if (values.length && ['detectorSelector', 'checkBoxes', 'listBox', 'multiSelect'].includes(w)) {
      let chosen = [];
      try { chosen = JSON.parse(def); } catch (e) { chosen = def ? def.split(',') : []; }
      return el('div', { class: 'choices', id }, values.map((v) => el('label', {}, el('input', { type: 'checkbox', name, value: v, checked: chosen.includes(v) }), ' ' + v)));
    }
    if (w === 'dropDownBox' && values.length) {
      return el('select', { id, name }, values.map((v) => el('option', { value: v, text: v, selected: v === def })));
    }
    if (w === 'comboBox' && values.length) {
      // An editable choice: the list suggests, the daemon checks the value against it.
      const list = 'list-' + d.name;
      return el('span', {}, el('input', { id, name, type: 'text', value: def, list }), el('datalist', { id: list }, values.map((v) => el('option', { value: v }))));
    }
    if (w === 'textArea') return el('textarea', { id, name, rows: 3, text: def });
    return el('input', { id, name, type: field(d, 'type') === 'number' ? 'number' : 'text', step: 'any', value: def });
  }

  // A detector selector with no values to offer follows the hosts (the anchor's `detectors`,
  // from the inventory): this form sets the hosts themselves and leaves it out.
  const shown = (d) => !(widgetOf(d) === 'detectorSelector' && !valuesOf(d).length);
  const varsOf = (wf) => (wf ? wf.vars.filter(shown) : []);

  function build() {
    const wf = workflows.find((w) => w.name === wfSel.value);
    fieldsBox.replaceChildren();
    if (!wf) return;
    if (wf.error) fieldsBox.append(el('p', { class: 'error', text: wf.error }));
    const panels = new Map();
    // Panels: main first, advanced last, others between by name; in a panel, by `index`.
    const main = (p) => ['mainpanel', 'general_configuration', 'basic_configuration'].includes(String(p).toLowerCase());
    const rank = (d) => { const p = field(d, 'panel') || 'mainPanel'; return main(p) ? '0' : p === 'advancedPanel' ? '2' : '1' + p; };
    const vars = varsOf(wf).sort((a, b) => rank(a).localeCompare(rank(b)) || (Number(field(a, 'index')) || 0) - (Number(field(b, 'index')) || 0) || a.name.localeCompare(b.name));
    for (const d of vars) {
      const panel = field(d, 'panel') || 'mainPanel';
      if (!panels.has(panel)) panels.set(panel, el('fieldset', { 'data-panel': panel }, el('legend', { text: panelTitle(panel) })));
      const f = el('div', { class: 'field', 'data-var': d.name },
        widgetOf(d) === 'checkBox'
          ? el('label', {}, input(d), ' ' + (field(d, 'label') || d.name))
          : [el('label', { for: 'var-' + d.name, text: field(d, 'label') || d.name }), input(d)],
        field(d, 'description') ? el('div', { class: 'help', text: field(d, 'description') }) : null);
      panels.get(panel).append(f);
    }
    fieldsBox.append(...panels.values());
    visibility();
  }

  function panelTitle(p) {
    const t = String(p).replace(/Panel$/, '').replace(/_/g, ' ').replace(/([a-z])([A-Z])/g, '$1 $2').trim();
    return t ? t[0].toUpperCase() + t.slice(1) : 'Variables';
  }

  // `visibleif`: the anchor's condition over other variables (`$$name === "value"`, with
  // ==, !=, ===, !==, &&, ||, !, parentheses, strings, numbers, true/false). A condition this
  // evaluator cannot read leaves the field visible.
  function visible(expr, vals) {
    const toks = String(expr).match(/\$\$[A-Za-z_][\w.]*|"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|===|!==|==|!=|&&|\|\||[!()]|-?\d+(?:\.\d+)?|true|false|\S/g) || [];
    let i = 0;
    const peek = () => toks[i];
    const atom = () => {
      const t = toks[i++];
      if (t === undefined) throw new Error('end');
      if (t === '(') { const v = or(); if (toks[i++] !== ')') throw new Error(')'); return v; }
      if (t === '!') return !truthy(atom());
      if (t.startsWith('$$')) return vals[t.slice(2)] === undefined ? '' : vals[t.slice(2)];
      if (t[0] === '"' || t[0] === '\'') return t.slice(1, -1);
      if (t === 'true' || t === 'false') return t;
      if (/^-?\d/.test(t)) return t;
      throw new Error('token ' + t);
    };
    const truthy = (v) => v !== '' && v !== 'false' && v !== false && v !== '0';
    const cmp = () => {
      let v = atom();
      while (['===', '==', '!==', '!='].includes(peek())) {
        const op = toks[i++];
        const w = atom();
        v = (String(v) === String(w)) === (op[0] === '=');
      }
      return v;
    };
    const and = () => { let v = cmp(); while (peek() === '&&') { i++; const w = cmp(); v = truthy(v) && truthy(w); } return v; };
    const or = () => { let v = and(); while (peek() === '||') { i++; const w = and(); v = truthy(v) || truthy(w); } return v; };
    try { const v = or(); return i === toks.length ? truthy(v) : true; } catch (e) { return true; }
  }

  function currentVars() {
    const wf = workflows.find((w) => w.name === wfSel.value);
    const vals = {};
    for (const d of varsOf(wf)) vals[d.name] = valueOf(d);
    return [wf, vals];
  }

  function visibility() {
    const [wf, vals] = currentVars();
    for (const d of varsOf(wf)) {
      const cond = field(d, 'visibleif');
      const box = $('[data-var="' + CSS.escape(d.name) + '"]', form);
      if (box) box.hidden = !!cond && !visible(cond, vals);
    }
  }
  form.addEventListener('input', visibility);
  form.addEventListener('change', visibility);

  async function submit() {
    const [wf, vals] = currentVars();
    if (!wf) return;
    // Workflows range over `hosts` as a JSON list: a comma list is sent as one.
    const hosts = $('#hosts').value.trim();
    const variables = {
      hosts: hosts.startsWith('[') ? hosts : JSON.stringify(hosts.split(',').map((h) => h.trim()).filter((h) => h)),
    };
    for (const d of varsOf(wf)) {
      const box = $('[data-var="' + CSS.escape(d.name) + '"]', form);
      if (box && !box.hidden) variables[d.name] = vals[d.name];
    }
    const site = $('#site-vars');
    for (const line of (site ? site.value.split('\n') : [])) {
      const l = line.trim();
      if (!l) continue;
      const at = l.indexOf('=');
      if (at < 1) { notice('bad', 'site variable line without NAME=value: ' + l); return; }
      variables[l.slice(0, at).trim()] = l.slice(at + 1).trim();
    }
    $('#create-submit').disabled = true;
    notice('', el('span', { id: 'progress', text: 'creating ' + wf.name + '…' }));
    const r = await call('POST', '/ui/api/create', { workflow: wf.name, variables, env_id: $('#env-id').value });
    $('#create-submit').disabled = false;
    if (!r.ok) { notice('bad', el('b', { text: 'create refused: ' }), el('pre', { id: 'action-error', text: r.data.error })); return; }
    location.href = '/ui/env/' + encodeURIComponent(r.data.id);
  }

  call('GET', '/ui/api/workflows').then((r) => {
    if (!r.ok) { notice('bad', r.data.error); return; }
    workflows = r.data;
    wfSel.replaceChildren(...workflows.map((w) => el('option', { value: w.name, text: w.name })));
    build();
  });
  $('#conn').hidden = true; // this page has no live feed
})();
