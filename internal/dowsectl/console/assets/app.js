// The Dowse console's page: plain JavaScript, no build step. It keeps the
// objects the console streams (server-sent events of the user's own
// watches), draws them, plots recent numeric reported values, and posts
// desired values to the console, which checks them against the model as
// `dowsectl twin set` does.
'use strict';
(() => {
  const meta = (n) => document.querySelector(`meta[name="${n}"]`).content;
  const token = meta('dowse-token');
  const params = new URLSearchParams(location.search);
  const startNS = meta('dowse-namespace');
  const all = params.get('all') === '1' || (!params.has('namespace') && startNS === '');
  const ns = params.get('namespace') || startNS || 'default';
  const HISTORY = 60; // points per plot

  const S = { Configuration: new Map(), Instance: new Map(), DeviceModel: new Map(), Device: new Map() };
  const synced = {};
  const problems = new Map(); // source -> words
  // Every problem shown since the page opened, newest last, for a person
  // looking back in the browser's developer console (dowseConsole).
  const problemLog = [];
  window.dowseConsole = { problemLog };
  const problem = (src, text) => {
    if (problems.get(src) !== text) problemLog.push(text);
    problems.set(src, text);
  };
  const hist = new Map(); // device key/property -> [{t, v}]
  const pendingSet = new Map(); // device key/property -> value sent from the form
  const seenInstances = new Set();
  let streamOpen = false;
  let selected = null; // {kind, namespace, name}

  const $ = (s) => document.querySelector(s);
  const key = (o) => `${o.metadata.namespace}/${o.metadata.name}`;
  const where = () => (all ? 'any namespace' : `namespace ${ns}`);

  // h builds an element; strings are text, never HTML.
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === 'class') el.className = v;
      else if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : v);
    }
    for (const k of kids.flat()) {
      if (k === undefined || k === null) continue;
      el.append(k instanceof Node ? k : document.createTextNode(String(k)));
    }
    return el;
  }

  function ago(t) {
    if (!t) return '-';
    const s = Math.max(0, (Date.now() - t) / 1000);
    if (s < 1) return 'just now';
    if (s < 90) return `${Math.round(s)}s ago`;
    if (s < 5400) return `${Math.round(s / 60)}m ago`;
    if (s < 129600) return `${Math.round(s / 3600)}h ago`;
    return `${Math.round(s / 86400)}d ago`;
  }
  const timeOf = (s) => (s ? Date.parse(s) : 0);
  const cond = (conds, type) => (conds || []).find((c) => c.type === type);
  const condText = (conds, type) => { const c = cond(conds, type); return c ? c.status : '-'; };
  const sel = (kind, o, text) => h('a', { class: 'sel', 'data-kind': kind, 'data-ns': o.metadata.namespace, 'data-name': o.metadata.name,
    onclick: () => select(kind, o.metadata.namespace, o.metadata.name) }, text || o.metadata.name);
  const sorted = (m) => [...m.values()].sort((a, b) => key(a).localeCompare(key(b)));

  // ---- streams ----
  function connect() {
    const es = new EventSource(all ? 'api/watch?all=1' : `api/watch?namespace=${encodeURIComponent(ns)}`);
    let broken = false;
    es.addEventListener('open', () => {
      if (broken) for (const m of Object.values(S)) m.clear(); // a new stream lists everything again
      broken = false;
      streamOpen = true;
      problems.delete('console');
      schedule();
    });
    es.addEventListener('error', () => {
      broken = true;
      streamOpen = false;
      problem('console', 'The console (dowsectl console) is not answering: is it still running? Reconnecting…');
      schedule();
    });
    es.addEventListener('object', (e) => handle(JSON.parse(e.data)));
  }

  function handle(m) {
    const store = S[m.kind];
    switch (m.op) {
      case 'upsert':
        store.set(key(m.object), m.object);
        if (m.kind === 'Device') record(m.object);
        break;
      case 'delete':
        store.delete(key(m.object));
        break;
      case 'synced':
        synced[m.kind] = true;
        break;
      case 'state':
        if (m.problem) problem(m.kind, m.problem);
        else problems.delete(m.kind);
        break;
    }
    schedule();
  }

  let scheduled = false;
  function schedule() {
    if (scheduled) return;
    scheduled = true;
    requestAnimationFrame(() => { scheduled = false; render(); });
  }

  function render() {
    renderProblems();
    renderConfigurations();
    renderDevices();
  }

  function renderProblems() {
    // One line per problem, naming what it stops when several share it
    // (an unreachable API server stops every watch).
    const byText = new Map();
    for (const [src, text] of problems) byText.set(text, [...(byText.get(text) || []), src]);
    const list = $('#problems');
    list.replaceChildren(...[...byText].map(([text, srcs]) => h('li', { 'data-problem': srcs.join(' ') }, text,
      srcs.length > 1 ? h('span', { class: 'muted' }, ` (${srcs.map((k) => k === 'console' ? 'the console' : `${k}s`).join(', ')})`) : '')));
    const live = $('#live');
    const ok = streamOpen && problems.size === 0;
    live.textContent = ok ? 'live' : streamOpen ? 'live, with problems' : 'reconnecting…';
    live.className = `live ${ok ? 'ok' : 'bad'}`;
  }

  function emptyText(kind, words) {
    if (synced[kind]) return `No ${words} in ${where()}.`;
    if (problems.has(kind)) return `Cannot show ${words}: see the problem above.`;
    return 'loading…';
  }

  // ---- Configurations and their Instances ----
  function renderConfigurations() {
    const list = $('#cfglist');
    const cfgs = sorted(S.Configuration);
    if (!cfgs.length) {
      list.replaceChildren(h('p', { class: 'empty' }, emptyText('Configuration', 'Configurations')));
      return;
    }
    const insts = sorted(S.Instance);
    list.replaceChildren(...cfgs.map((c) => configurationCard(c, insts.filter((i) => i.metadata.namespace === c.metadata.namespace && i.spec.configurationName === c.metadata.name))));
    for (const i of insts) seenInstances.add(key(i));
    markSelected();
  }

  function configurationCard(c, insts) {
    const st = c.status || {};
    const nodes = st.nodes || [];
    const nodeRows = nodes.map((n) => {
      let note = '';
      for (const t of ['Discovering', 'HandlerAvailable']) {
        const x = cond(n.conditions, t);
        if (x && x.status !== 'True' && !note) note = `${x.reason}: ${x.message}`;
      }
      const skipped = (n.skipped || []).map((k) => `${k.reason} ×${k.count}: ${(k.candidates || []).map((c) => c.candidate + (c.message ? ` (${c.message})` : '')).join('; ')}`);
      const ha = condText(n.conditions, 'HandlerAvailable');
      const di = condText(n.conditions, 'Discovering');
      return h('tr', { 'data-node': n.nodeName }, h('td', {}, n.nodeName), h('td', {}, n.devices || 0),
        h('td', { class: ha.toLowerCase() }, ha), h('td', { class: di.toLowerCase() }, di),
        h('td', { class: note ? 'problem' : 'muted' }, note || (skipped.length ? '' : '-'), skipped.map((k) => h('div', { class: 'skipped', 'data-skipped': '' }, `skipped ${k}`))));
    });
    const instRows = insts.map((i) => {
      const used = (i.status && i.status.slots ? i.status.slots.length : 0);
      const nodesSeeing = ((i.status && i.status.nodes) || []).map((n) => n.name).join(', ') || '-';
      return h('tr', { 'data-instance': i.metadata.name, class: seenInstances.has(key(i)) ? '' : 'new' },
        h('td', {}, sel('Instance', i)), h('td', {}, nodesSeeing), h('td', {}, `${used} of ${i.spec.capacity || 0}`), h('td', {}, ago(timeOf(i.metadata.creationTimestamp))));
    });
    const spec = c.spec || {};
    return h('div', { class: 'card', 'data-configuration': key(c) },
      h('h3', {}, sel('Configuration', c), h('span', { class: 'meta' },
        `handler ${spec.discoveryHandler ? spec.discoveryHandler.name : '?'} · capacity ${spec.capacity || 1} · ${st.nodesSeeing || 0} of ${nodes.length} nodes see devices · ${st.nodesReady || 0} ready · ${st.brokers || 0} brokers`)),
      nodes.length ? h('table', { class: 'nodes' }, h('thead', {}, h('tr', {}, ['node', 'devices', 'handler', 'discovering', 'refusals and skipped'].map((t) => h('th', {}, t)))), h('tbody', {}, nodeRows))
        : h('p', { class: 'empty' }, 'No agent reports on this Configuration yet (is its handler running on a node?).'),
      insts.length ? h('table', { class: 'instances' }, h('thead', {}, h('tr', {}, ['instance', 'nodes', 'slots in use', 'found'].map((t) => h('th', {}, t)))), h('tbody', {}, instRows))
        : h('p', { class: 'empty', 'data-no-instances': '' }, 'No Instances: no device found.'));
  }

  // ---- Devices and their twins ----
  const devEls = new Map(); // key -> {card, head, tbody, rows: Map(property -> row)}

  function modelOf(d) {
    const ref = d.spec && d.spec.deviceModelRef;
    return ref ? S.DeviceModel.get(`${d.metadata.namespace}/${ref.name}`) : undefined;
  }
  const modelProp = (m, name) => (m && m.spec && m.spec.properties || []).find((p) => p.name === name);
  const numericType = (t) => t === 'INT' || t === 'FLOAT' || t === 'DOUBLE';

  // twinOf reads a Device as `dowsectl twin get` does: the spec's
  // properties in order, then any only the status has.
  function twinOf(d) {
    const props = [];
    const byName = new Map();
    const get = (name) => { if (!byName.has(name)) { const p = { name }; byName.set(name, p); props.push(p); } return byName.get(name); };
    for (const p of (d.spec && d.spec.properties) || []) { const x = get(p.name); if (p.desired) x.desired = p.desired.value; }
    for (const t of (d.status && d.status.twins) || []) {
      const x = get(t.propertyName);
      if (t.reported) {
        const md = t.reported.metadata || {};
        x.reported = t.reported.value;
        x.readAt = md.timestamp ? Number(md.timestamp) : 0;
        x.error = md.error;
        x.desiredError = md.desiredError;
      }
      if (t.observedDesired) x.observed = t.observedDesired.value;
    }
    return props;
  }

  function record(d) {
    const m = modelOf(d);
    for (const p of twinOf(d)) {
      if (p.reported === undefined) continue;
      const mp = modelProp(m, p.name);
      if (mp && !numericType(mp.type)) continue;
      const v = Number(p.reported);
      if (p.reported.trim() === '' || !Number.isFinite(v)) continue;
      const k = `${key(d)}/${p.name}`;
      const pts = hist.get(k) || [];
      const t = p.readAt || Date.now();
      const last = pts[pts.length - 1];
      if (!last || last.t !== t || last.v !== v) pts.push({ t, v });
      while (pts.length > HISTORY) pts.shift();
      hist.set(k, pts);
    }
  }

  function renderDevices() {
    const list = $('#devlist');
    const devs = sorted(S.Device);
    for (const [k, el] of devEls) if (!S.Device.has(k)) { el.card.remove(); devEls.delete(k); }
    const empty = list.querySelector('p.empty');
    if (!devs.length) {
      const text = emptyText('Device', 'Devices');
      if (empty) empty.textContent = text; else list.append(h('p', { class: 'empty' }, text));
      return;
    }
    if (empty) empty.remove();
    let prev = null;
    for (const d of devs) {
      let el = devEls.get(key(d));
      if (!el) { el = deviceCard(d); devEls.set(key(d), el); }
      updateDevice(el, d);
      // Keep the order without moving cards that are in place (a moved
      // form would lose its focus).
      const want = prev ? prev.nextSibling : list.firstChild;
      if (want !== el.card) list.insertBefore(el.card, want);
      prev = el.card;
    }
    markSelected();
  }

  function deviceCard(d) {
    const head = h('span', { class: 'meta' });
    const tbody = h('tbody', {});
    const card = h('div', { class: 'card', 'data-device': key(d) },
      h('h3', {}, sel('Device', d), head),
      h('table', { class: 'twin' }, h('thead', {}, h('tr', {}, ['property', 'desired', 'reported', 'observed', 'read', 'recent', 'set desired'].map((t) => h('th', {}, t)))), tbody),
      h('p', { class: 'conditions muted' }));
    return { card, head, tbody, rows: new Map() };
  }

  function updateDevice(el, d) {
    const m = modelOf(d);
    const st = d.status || {};
    const state = st.state || '-';
    el.head.replaceChildren(
      `model ${d.spec.deviceModelRef ? d.spec.deviceModelRef.name : '-'} · node ${d.spec.nodeName || '-'} · state `,
      h('span', { class: `state state-${state}`, 'data-state': '' }, state),
      ' · last report ', h('span', { 'data-since': timeOf(st.lastReportTime) || '' }, ago(timeOf(st.lastReportTime))),
      st.differing ? h('span', { class: 'differs' }, ` · ${st.differing} differing`) : '');
    const seen = new Set();
    for (const p of twinOf(d)) {
      seen.add(p.name);
      let row = el.rows.get(p.name);
      if (!row) { row = propertyRow(d, p.name); el.rows.set(p.name, row); el.tbody.append(row.tr); }
      updateRow(row, d, m, p);
    }
    for (const [name, row] of el.rows) if (!seen.has(name)) { row.tr.remove(); el.rows.delete(name); }
    const conds = (st.conditions || []).map((c) => `${c.type} ${c.status}${c.status !== 'True' && c.message ? ` (${c.message})` : ''}`);
    el.card.querySelector('p.conditions').textContent = conds.join(' · ');
  }

  function propertyRow(d, name) {
    const cells = {};
    for (const c of ['name', 'desired', 'reported', 'observed', 'read', 'plot', 'form']) cells[c] = h('td', { class: c });
    cells.name.textContent = name;
    const tr = h('tr', { 'data-property': name }, Object.values(cells));
    return { tr, cells, form: null };
  }

  function updateRow(row, d, m, p) {
    const mp = modelProp(m, p.name);
    const unit = mp && mp.unit ? ` ${mp.unit}` : '';
    const c = row.cells;
    c.desired.textContent = p.desired !== undefined ? p.desired : '-';
    c.reported.replaceChildren(h('span', { class: `value${p.desired !== undefined && !same(p.desired, p.reported) ? ' differs' : ''}` }, p.reported !== undefined ? p.reported + unit : '-'),
      p.error ? h('div', { class: 'problem' }, `read failed: ${p.error}`) : '');
    c.observed.textContent = p.observed !== undefined ? p.observed : '-';
    c.read.replaceChildren(h('span', { 'data-since': p.readAt || '' }, ago(p.readAt)));
    const pts = hist.get(`${key(d)}/${p.name}`);
    c.plot.replaceChildren(pts && pts.length ? plot(pts) : '');
    if (mp && mp.accessMode === 'ReadWrite') {
      if (!row.form) { row.form = setForm(d, p.name); c.form.append(row.form.el); }
      const want = pendingSet.get(`${key(d)}/${p.name}`);
      if (want !== undefined) {
        if (p.observed !== undefined && same(p.observed, want)) {
          row.form.result.textContent = `${want} applied on the device`;
          row.form.result.className = 'result applied';
          pendingSet.delete(`${key(d)}/${p.name}`);
        } else if (p.desiredError && p.desiredError.includes(JSON.stringify(want))) {
          row.form.result.textContent = `the mapper refused it: ${p.desiredError}`;
          row.form.result.className = 'result refused';
          pendingSet.delete(`${key(d)}/${p.name}`);
        }
      }
    }
  }

  function same(a, b) {
    if (a === b) return true;
    if (a === undefined || b === undefined || String(a).trim() === '' || String(b).trim() === '') return false;
    const x = Number(a); const y = Number(b);
    return Number.isFinite(x) && Number.isFinite(y) && x === y;
  }

  function setForm(d, prop) {
    const input = h('input', { name: 'value', 'aria-label': `desired ${prop}`, autocomplete: 'off' });
    const result = h('span', { class: 'result', role: 'status' });
    const el = h('form', { class: 'set', 'data-set': prop }, input, h('button', { type: 'submit' }, 'set'), result);
    el.addEventListener('submit', async (ev) => {
      ev.preventDefault();
      const value = input.value;
      result.textContent = 'setting…';
      result.className = 'result pending';
      let r; let body;
      try {
        r = await fetch('api/desired', { method: 'POST', headers: { 'Content-Type': 'application/json', 'X-Dowse-Token': token },
          body: JSON.stringify({ namespace: d.metadata.namespace, device: d.metadata.name, property: prop, value }) });
        body = await r.json();
      } catch (e) {
        result.textContent = `the console is not answering: ${e.message}`;
        result.className = 'result refused';
        return;
      }
      if (!r.ok) {
        result.textContent = `refused: ${body.error}`;
        result.className = 'result refused';
        return;
      }
      pendingSet.set(`${key(d)}/${prop}`, value);
      result.textContent = `${value} sent; waiting for the mapper…`;
      result.className = 'result pending';
      schedule();
    });
    return { el, input, result };
  }

  // plot draws recent values as an SVG line with the range beside it.
  function plot(pts) {
    const NS = 'http://www.w3.org/2000/svg';
    const W = 120; const H = 28; const PAD = 3;
    const svg = document.createElementNS(NS, 'svg');
    svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
    svg.setAttribute('role', 'img');
    const vs = pts.map((p) => p.v);
    const lo = Math.min(...vs); const hi = Math.max(...vs);
    const t0 = pts[0].t; const t1 = pts[pts.length - 1].t;
    const x = (t) => (t1 === t0 ? W - PAD - 28 : PAD + ((t - t0) / (t1 - t0)) * (W - 2 * PAD - 28));
    const y = (v) => (hi === lo ? H / 2 : H - PAD - ((v - lo) / (hi - lo)) * (H - 2 * PAD));
    const line = document.createElementNS(NS, 'polyline');
    line.setAttribute('points', pts.map((p) => `${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`).join(' '));
    svg.setAttribute('aria-label', `recent values from ${lo} to ${hi}`);
    svg.append(line);
    const last = pts[pts.length - 1];
    const dot = document.createElementNS(NS, 'circle');
    dot.setAttribute('cx', x(last.t).toFixed(1));
    dot.setAttribute('cy', y(last.v).toFixed(1));
    dot.setAttribute('r', '1.8');
    svg.append(dot);
    for (const [v, yy] of hi === lo ? [[hi, H / 2 + 3]] : [[hi, 8], [lo, H - 2]]) {
      const t = document.createElementNS(NS, 'text');
      t.setAttribute('x', W - 26);
      t.setAttribute('y', yy);
      t.textContent = String(+v.toPrecision(4));
      svg.append(t);
    }
    return svg;
  }

  // ---- Events of the object in view ----
  let evSource = null;
  const evs = new Map();

  function select(kind, namespace, name) {
    selected = { kind, namespace, name };
    $('#evwhat').textContent = `of ${kind} ${namespace}/${name}`;
    if (evSource) evSource.close();
    evs.clear();
    renderEvents();
    markSelected();
    const es = new EventSource(`api/events?namespace=${encodeURIComponent(namespace)}&kind=${encodeURIComponent(kind)}&name=${encodeURIComponent(name)}`);
    evSource = es;
    es.addEventListener('object', (e) => {
      const m = JSON.parse(e.data);
      const p = $('#evproblem');
      if (m.op === 'upsert') evs.set(m.object.metadata.uid, m.object);
      else if (m.op === 'delete') evs.delete(m.object.metadata.uid);
      else if (m.op === 'state') { p.hidden = !m.problem; p.textContent = m.problem || ''; }
      renderEvents();
    });
  }

  function markSelected() {
    for (const el of document.querySelectorAll('.selected')) el.classList.remove('selected');
    if (!selected) return;
    for (const a of document.querySelectorAll('a.sel')) {
      if (a.dataset.kind === selected.kind && a.dataset.ns === selected.namespace && a.dataset.name === selected.name) a.classList.add('selected');
    }
  }

  const evTime = (e) => timeOf((e.series && e.series.lastObservedTime) || e.lastTimestamp || e.eventTime || e.metadata.creationTimestamp);
  function renderEvents() {
    const rows = [...evs.values()].sort((a, b) => evTime(b) - evTime(a)).map((e) => {
      const n = Math.max(e.count || 0, (e.series && e.series.count) || 0);
      return h('tr', { class: e.type === 'Warning' ? 'problem' : '' }, h('td', {}, e.type), h('td', {}, e.reason),
        h('td', {}, h('span', { 'data-since': evTime(e) }, ago(evTime(e)))), h('td', {}, (e.message || '') + (n > 1 ? ` (×${n})` : '')));
    });
    $('#evtable tbody').replaceChildren(...(rows.length ? rows : [h('tr', {}, h('td', { colspan: 4, class: 'empty' }, selected ? 'No Events.' : ''))]));
  }

  // Ages tick without a re-render.
  setInterval(() => {
    for (const el of document.querySelectorAll('[data-since]')) {
      const t = Number(el.dataset.since);
      if (t) el.textContent = ago(t);
    }
  }, 1000);

  // ---- namespace switcher ----
  $('#ns').value = all ? '' : ns;
  $('#allns').checked = all;
  $('#nsform').addEventListener('submit', (ev) => {
    ev.preventDefault();
    location.search = $('#allns').checked ? '?all=1' : `?namespace=${encodeURIComponent($('#ns').value.trim() || 'default')}`;
  });

  connect();
  render();
})();
