// The Dowse console's page: plain JavaScript, no build step. It keeps the
// objects the console streams (server-sent events of the user's own
// watches), draws them, plots the numeric reported values it has seen
// against local time, and posts desired values to the console, which checks
// them against the model as `dowsectl twin set` does. Two views share the
// streams: the overview, and one Device's page (?device=NAME, switched with
// the History API so that the plots keep what the page has seen).
'use strict';
(() => {
  const meta = (n) => document.querySelector(`meta[name="${n}"]`).content;
  const token = meta('dowse-token');
  const params = new URLSearchParams(location.search);
  const startNS = meta('dowse-namespace');
  const all = params.get('all') === '1' || (!params.has('namespace') && startNS === '');
  const ns = params.get('namespace') || startNS || 'default';
  // Points kept per property: the controller writes a busy Device's status
  // once per interval (a second by default), so this holds about an hour.
  const HISTORY = 4000;
  // The windows a plot can show; 0 is everything the page holds.
  const RANGES = [['1m', '1 min', 60e3], ['10m', '10 min', 600e3], ['1h', '1 h', 3600e3], ['all', 'all', 0]];
  let range = RANGES.find((r) => r[0] === params.get('range')) || RANGES[3];
  const openedAt = Date.now();

  // DeviceReading: the live readings API's view of each Device (only when
  // the API server serves it), laid over Device.status by twinOf.
  const S = { Configuration: new Map(), Instance: new Map(), DeviceModel: new Map(), Device: new Map(), DeviceReading: new Map() };
  // Where reported values come from, as the console's stream says: 'live'
  // (the readings API, newer than Device.status when it is) or 'status'.
  let valueSource = null;
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
  let view = null; // the Device page's Device key, or null for the overview

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
        if (m.kind === 'DeviceReading') recordReading(m.object);
        break;
      case 'source':
        valueSource = m.source;
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
    renderDevicePage();
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
    // Served but failing (no right to read them, a replica down): the
    // values fall back to Device.status wherever it is newer.
    const failing = valueSource === 'live' && problems.has('DeviceReading');
    const src = $('#source');
    src.dataset.source = failing ? 'status' : valueSource || '';
    src.textContent = failing ? 'values: Device.status (live readings failing)' : valueSource === 'live' ? 'values: live readings'
      : valueSource === 'status' ? 'values: Device.status' : '';
    src.title = valueSource === 'live'
      ? 'Reported values come from the controller replicas\' memory (the readings API, readings.dowse.dev), ahead of Device.status, which is written under a budget'
      : 'The API server does not serve the live readings API (readings.dowse.dev): reported values as Device.status holds them';
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
  // properties in order, then any only the status has; a reported value
  // the live readings hold is shown instead of the status's when it is as
  // new or newer. Each reported value says its source: 'live' (a
  // replica's memory) or 'status'.
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
      if (t.observedDesired) {
        x.observed = t.observedDesired.value;
        const ts = (t.observedDesired.metadata || {}).timestamp;
        x.observedAt = ts ? Number(ts) : 0;
      }
    }
    for (const x of props) if (x.reported !== undefined) x.source = 'status';
    const r = S.DeviceReading.get(key(d));
    for (const rp of (r && r.properties) || []) {
      const x = get(rp.name);
      const t = timeOf(rp.time);
      if (x.reported !== undefined && x.readAt && t < x.readAt) continue;
      x.reported = rp.value;
      x.readAt = t;
      x.source = rp.source || 'live';
      // The status's read error was about an older read.
      if (x.source === 'live') x.error = undefined;
    }
    return props;
  }

  // stateOf is the device's state: the live reading's when there is one.
  function stateOf(d) {
    const r = S.DeviceReading.get(key(d));
    return (r && r.state) || (d.status && d.status.state) || '-';
  }

  // addPoint keeps a property's points in time order, one a time.
  function addPoint(k, t, v) {
    const pts = hist.get(k) || [];
    let i = pts.length;
    while (i > 0 && pts[i - 1].t > t) i--;
    if (i > 0 && pts[i - 1].t === t) pts[i - 1].v = v;
    else pts.splice(i, 0, { t, v });
    if (pts.length > HISTORY) pts.splice(0, pts.length - HISTORY);
    hist.set(k, pts);
  }

  // recordReading plots a live reading's values: its recent history
  // (values the page may not have seen) and its newest.
  function recordReading(r) {
    const d = S.Device.get(key(r));
    const m = d ? modelOf(d) : undefined;
    for (const rp of r.properties || []) {
      const mp = modelProp(m, rp.name);
      if (mp && !numericType(mp.type)) continue;
      for (const s of [...(rp.history || []), { value: rp.value, time: rp.time }]) {
        const v = Number(s.value);
        if (String(s.value).trim() === '' || !Number.isFinite(v)) continue;
        addPoint(`${key(r)}/${rp.name}`, timeOf(s.time) || Date.now(), v);
      }
    }
  }

  function record(d) {
    const m = modelOf(d);
    for (const p of twinOf(d)) {
      if (p.reported === undefined) continue;
      const mp = modelProp(m, p.name);
      if (mp && !numericType(mp.type)) continue;
      const v = Number(p.reported);
      if (p.reported.trim() === '' || !Number.isFinite(v)) continue;
      addPoint(`${key(d)}/${p.name}`, p.readAt || Date.now(), v);
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
      h('h3', {}, sel('Device', d), head, h('a', { class: 'page', href: pageHref(d.metadata.namespace, d.metadata.name), onclick: follow, 'data-page': '' }, 'Device page →')),
      h('table', { class: 'twin' }, h('thead', {}, h('tr', {}, ['property', 'desired', 'reported', 'observed', 'read', 'source', 'recent', 'set desired'].map((t) => h('th', {}, t)))), tbody),
      h('p', { class: 'conditions muted' }));
    return { card, head, tbody, rows: new Map() };
  }

  function updateDevice(el, d) {
    const m = modelOf(d);
    const st = d.status || {};
    const state = stateOf(d);
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
    for (const c of ['name', 'desired', 'reported', 'observed', 'read', 'source', 'plot', 'form']) cells[c] = h('td', { class: c });
    cells.name.textContent = name;
    const tr = h('tr', { 'data-property': name }, Object.values(cells));
    return { tr, cells, form: null };
  }

  const unitOf = (mp) => (mp && mp.unit ? mp.unit : '');
  const withUnit = (v, unit) => (v === undefined ? '-' : unit ? `${v} ${unit}` : String(v));

  function updateRow(row, d, m, p) {
    const mp = modelProp(m, p.name);
    const unit = unitOf(mp);
    const c = row.cells;
    c.desired.textContent = withUnit(p.desired, unit);
    c.reported.replaceChildren(h('span', { class: `value${p.desired !== undefined && !same(p.desired, p.reported) ? ' differs' : ''}` }, withUnit(p.reported, unit)),
      p.error ? h('div', { class: 'problem' }, `read failed: ${p.error}`) : '');
    c.observed.textContent = withUnit(p.observed, unit);
    c.read.replaceChildren(h('span', { 'data-since': p.readAt || '' }, ago(p.readAt)));
    c.source.replaceChildren(sourceTag(p));
    row.plotKey = `${key(d)}/${p.name}`;
    row.unit = unit;
    drawSmall(row);
    if (mp && mp.accessMode === 'ReadWrite' && !row.form) { row.form = setForm(d, p.name); c.form.append(row.form.el); }
    settle(d, p);
  }

  // sourceTag says where a reported value comes from.
  function sourceTag(p) {
    if (p.reported === undefined) return '-';
    return h('span', { class: `src src-${p.source}`, 'data-source': p.source,
      title: p.source === 'live' ? 'from the controller replica holding the node (readings API), ahead of Device.status' : 'as Device.status holds it' }, p.source);
  }

  function drawSmall(row) {
    const pts = hist.get(row.plotKey);
    row.cells.plot.replaceChildren(pts && pts.length ? plot(pts, { w: 170, h: 60, unit: row.unit, xTicks: 3, yTicks: 3 }) : '');
  }

  // settle tells every form of a property whether the value it sent was
  // applied or refused by the mapper, once the twin says so.
  function settle(d, p) {
    const k = `${key(d)}/${p.name}`;
    const want = pendingSet.get(k);
    if (want === undefined) return;
    let text; let cls;
    if (p.observed !== undefined && same(p.observed, want)) {
      text = `${want} applied on the device`; cls = 'applied';
    } else if (p.desiredError && p.desiredError.includes(JSON.stringify(want))) {
      text = `the mapper refused it: ${p.desiredError}`; cls = 'refused';
    } else return;
    for (const f of forms.get(k) || []) { f.result.textContent = text; f.result.className = `result ${cls}`; }
    pendingSet.delete(k);
  }

  function same(a, b) {
    if (a === b) return true;
    if (a === undefined || b === undefined || String(a).trim() === '' || String(b).trim() === '') return false;
    const x = Number(a); const y = Number(b);
    return Number.isFinite(x) && Number.isFinite(y) && x === y;
  }

  const forms = new Map(); // device key/property -> Set of forms showing it
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
    const f = { el, input, result };
    const k = `${key(d)}/${prop}`;
    if (!forms.has(k)) forms.set(k, new Set());
    forms.get(k).add(f);
    f.drop = () => forms.get(k).delete(f);
    return f;
  }

  // ---- plots: SVG, against local time ----
  const pad2 = (n) => String(n).padStart(2, '0');
  // clock is a time of day in the browser's time zone, 24-hour.
  const clock = (t, seconds = true) => {
    if (!t) return '-';
    const d = new Date(t);
    return `${pad2(d.getHours())}:${pad2(d.getMinutes())}${seconds ? `:${pad2(d.getSeconds())}` : ''}`;
  };
  // zone names the browser's offset from UTC, e.g. UTC+05:45.
  const zone = () => {
    const o = -new Date().getTimezoneOffset();
    return `UTC${o < 0 ? '-' : '+'}${pad2(Math.floor(Math.abs(o) / 60))}:${pad2(Math.abs(o) % 60)}`;
  };
  const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400].map((s) => s * 1000);

  // timeTicks are round local times between from and to, at most n of them.
  function timeTicks(from, to, n) {
    let step = TIME_STEPS.find((s) => (to - from) / s <= n);
    // Beyond the list (a quiet property's first value read weeks ago):
    // whole days, as many as keep the ticks to n.
    if (!step) step = 86400e3 * Math.ceil((to - from) / 86400e3 / n);
    // Round in local time, so that a zone half an hour off UTC gets
    // ticks at its own full hours.
    const off = (t) => new Date(t).getTimezoneOffset() * 60e3;
    const ticks = [];
    for (let local = Math.ceil((from - off(from)) / step) * step; ; local += step) {
      const t = local + off(local);
      if (t > to) break;
      if (t >= from) ticks.push(t);
    }
    return { ticks, step };
  }

  // valueTicks are round values (1, 2 or 5 times a power of ten apart)
  // covering lo..hi.
  function valueTicks(lo, hi, n) {
    const raw = (hi - lo) / Math.max(1, n - 1);
    const mag = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw);
    const ticks = [];
    // Bounded: a step below the values' precision would not advance v.
    for (let v = Math.floor(lo / step) * step; v <= hi + step * 1e-9 && ticks.length <= n + 2; v += step) ticks.push(+v.toPrecision(12));
    if (!ticks.length) return [lo, hi];
    if (ticks[ticks.length - 1] < hi) ticks.push(+(ticks[ticks.length - 1] + step).toPrecision(12));
    return ticks;
  }

  // windowOf is the span of time a plot shows: the chosen range up to now,
  // or everything held.
  function windowOf(pts) {
    const now = Math.max(Date.now(), pts.length ? pts[pts.length - 1].t : 0);
    if (range[2]) return [now - range[2], now];
    const first = pts.length ? Math.min(pts[0].t, openedAt) : openedAt;
    return [Math.min(first, now - 60e3), now];
  }

  // plot draws the values held in the window as a step line (a reported
  // value holds until the next report), with labelled local-time ticks
  // below and value ticks in the property's unit on the left.
  function plot(pts, o) {
    const NS = 'http://www.w3.org/2000/svg';
    const W = o.w; const H = o.h;
    const big = H > 100;
    const L = big ? 58 : 40; const R = big ? 12 : 6; const T = big ? 28 : 9; const B = big ? 22 : 14;
    const svg = document.createElementNS(NS, 'svg');
    const el = (tag, attrs, text) => {
      const e = document.createElementNS(NS, tag);
      for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
      if (text !== undefined) e.textContent = text;
      svg.append(e);
      return e;
    };
    svg.setAttribute('viewBox', `0 0 ${W} ${H}`);
    svg.setAttribute('width', W);
    svg.setAttribute('height', H);
    svg.setAttribute('role', 'img');
    svg.setAttribute('class', big ? 'plot big' : 'plot');
    const [from, to] = windowOf(pts);
    svg.dataset.from = from;
    svg.dataset.to = to;
    // The value at the window's start is the last one before it.
    let i = pts.findIndex((p) => p.t >= from);
    if (i < 0) i = pts.length;
    const shown = pts.slice(Math.max(0, i - 1)).map((p) => ({ t: Math.max(p.t, from), v: p.v }));
    svg.dataset.points = pts.length - i;
    const vs = shown.map((p) => p.v);
    let lo = Math.min(...vs); let hi = Math.max(...vs);
    if (lo === hi) { const d = Math.abs(lo) / 20 || 1; lo -= d; hi += d; }
    const yt = valueTicks(lo, hi, o.yTicks);
    lo = Math.min(lo, yt[0]); hi = Math.max(hi, yt[yt.length - 1]);
    const x = (t) => L + ((t - from) / (to - from)) * (W - L - R);
    const y = (v) => H - B - ((v - lo) / (hi - lo)) * (H - T - B);
    el('rect', { class: 'frame', x: L, y: T, width: W - L - R, height: H - T - B });
    const unit = o.unit ? ` ${o.unit}` : '';
    for (const v of big ? yt : [yt[0], yt[yt.length - 1]]) {
      if (big) el('line', { class: 'grid', x1: L, x2: W - R, y1: y(v), y2: y(v) });
      el('text', { class: 'ytick', x: L - 3, y: y(v) + 3, 'text-anchor': 'end' }, String(v) + (big ? '' : unit));
    }
    if (big && o.unit) el('text', { class: 'unit', x: L - 3, y: T - 12, 'text-anchor': 'end' }, o.unit);
    const { ticks, step } = timeTicks(from, to, o.xTicks);
    for (const t of ticks) {
      el('line', { class: big ? 'grid' : 'tick', x1: x(t), x2: x(t), y1: big ? T : H - B, y2: H - B + 3 });
      const d = new Date(t);
      el('text', { class: 'xtick', x: x(t), y: H - B + (big ? 14 : 11), 'text-anchor': 'middle', 'data-t': t },
        step >= 86400e3 ? `${d.getFullYear()}-${pad2(d.getMonth() + 1)}-${pad2(d.getDate())}` : clock(t, step < 60e3));
    }
    if (shown.length) {
      const xy = [];
      shown.forEach((p, k) => {
        if (k) xy.push(`${x(p.t).toFixed(1)},${y(shown[k - 1].v).toFixed(1)}`);
        xy.push(`${x(p.t).toFixed(1)},${y(p.v).toFixed(1)}`);
      });
      el('polyline', { points: xy.join(' ') });
      const last = shown[shown.length - 1];
      el('circle', { cx: x(last.t).toFixed(1), cy: y(last.v).toFixed(1), r: big ? 3 : 2 });
    }
    svg.setAttribute('aria-label', `values${unit} from ${clock(from)} to ${clock(to)}, local time: ${shown.length ? `last ${shown[shown.length - 1].v}${unit}` : 'none in this range'}`);
    return svg;
  }

  // rangeChooser fills el with the range buttons; the range is kept in the
  // address, so a bookmarked page opens with it.
  function rangeChooser(el) {
    el.replaceChildren('range ', ...RANGES.map((r) => h('button', { type: 'button', 'data-range': r[0], 'aria-pressed': String(r === range),
      onclick: () => {
        range = r;
        const q = new URLSearchParams(location.search);
        q.set('range', r[0]);
        history.replaceState(history.state, '', `?${q}`);
        for (const b of document.querySelectorAll('[data-range]')) b.setAttribute('aria-pressed', String(b.dataset.range === r[0]));
        replot();
      } }, r[1])));
  }

  function replot() {
    for (const el of devEls.values()) for (const row of el.rows.values()) if (row.plotKey) drawSmall(row);
    if (page) for (const f of page.plots.values()) drawBig(f);
  }

  // ---- one Device's page ----
  let page = null; // {key, rows, plots, forms, ...} while the Device page shows

  const overviewHref = () => `?${new URLSearchParams(all ? { all: '1' } : { namespace: ns })}`;
  function pageHref(namespace, name) {
    const q = new URLSearchParams(all ? { all: '1' } : {});
    q.set('namespace', namespace);
    q.set('device', name);
    return `?${q}`;
  }
  // follow moves between the views without reloading (the streams and the
  // plots' history stay), taking the range along; a click that asks for a
  // new tab is left alone.
  function follow(ev) {
    if (ev.button !== 0 || ev.ctrlKey || ev.metaKey || ev.shiftKey || ev.altKey) return;
    ev.preventDefault();
    const q = new URLSearchParams(ev.currentTarget.getAttribute('href'));
    if (range !== RANGES[3]) q.set('range', range[0]);
    history.pushState(null, '', `?${q}`);
    route();
    render();
    window.scrollTo(0, 0);
  }
  function route() {
    const q = new URLSearchParams(location.search);
    range = RANGES.find((r) => r[0] === q.get('range')) || range;
    view = q.get('device') ? `${q.get('namespace') || ns}/${q.get('device')}` : null;
    $('#overview').hidden = !!view;
    $('#devicepage').hidden = !view;
    document.title = view ? `${view} · Dowse console` : 'Dowse console';
    if (!view && page) { for (const f of page.forms) f.drop(); page = null; $('#devicepage').replaceChildren(); }
    for (const b of document.querySelectorAll('[data-range]')) b.setAttribute('aria-pressed', String(b.dataset.range === range[0]));
  }

  const table = (cls, heads, body) => h('table', { class: cls }, h('thead', {}, h('tr', {}, heads.map((t) => h('th', {}, t)))), body);
  const when = (t) => (t ? [clock(t), ' ', h('span', { class: 'muted', 'data-since': t }, ago(t))] : '-');

  function buildPage(k) {
    const cut = k.indexOf('/');
    const [pns, pname] = [k.slice(0, cut), k.slice(cut + 1)];
    page = { key: k, rows: new Map(), plots: new Map(), forms: [],
      title: h('h2', {}, 'Device ', h('span', { class: 'name' }, pname), h('span', { class: 'meta' }, ` in ${pns}`)),
      facts: h('dl', { class: 'facts' }), missing: h('p', { class: 'empty', hidden: true }),
      props: h('tbody', {}), plotsEl: h('div', { class: 'plots' }), conds: h('tbody', {}), events: h('tbody', {}),
      evproblem: h('p', { class: 'problem', hidden: true }) };
    const ranges = h('span', { class: 'ranges' });
    $('#devicepage').replaceChildren(
      h('nav', {}, h('a', { href: overviewHref(), onclick: follow, id: 'back' }, '← Configurations and Devices')),
      h('div', { class: 'card head', 'data-devicepage': k }, page.title, page.facts, page.missing),
      h('div', { class: 'columns' },
        h('div', {},
          h('section', { class: 'card', id: 'dp-properties' }, h('h3', {}, 'Properties'),
            table('twin props', ['property', 'type', 'desired', 'reported', 'read', 'source', 'observed desired', 'applied', 'set desired'], page.props)),
          h('section', { class: 'card', id: 'dp-plots' }, h('h3', {}, 'Reported values', h('span', { class: 'meta' }, `seen since this page opened, local time (${zone()})`), ranges), page.plotsEl)),
        h('div', {},
          h('section', { class: 'card', id: 'dp-conditions' }, h('h3', {}, 'Conditions'), table('conditions', ['type', 'status', 'reason', 'message', 'since'], page.conds)),
          h('section', { class: 'card', id: 'dp-events' }, h('h3', {}, 'Events'), page.evproblem, table('events', ['type', 'reason', 'when', 'from', 'message'], page.events)))));
    rangeChooser(ranges);
    select('Device', pns, pname);
  }

  const COND_ORDER = ['Valid', 'MapperConnected', 'Authenticated', 'DesiredApplied', 'ReportsAccepted', 'ReportsChecked'];
  const condRank = (t) => { const i = COND_ORDER.indexOf(t); return i < 0 ? COND_ORDER.length : i; };

  function renderDevicePage() {
    if (!view) return;
    if (!page || page.key !== view) buildPage(view);
    const d = S.Device.get(view);
    const body = $('#devicepage .columns');
    if (!d) {
      page.missing.hidden = false;
      page.missing.textContent = synced.Device ? `No Device ${view}: it was deleted, or it is in a namespace this page does not watch.` : emptyText('Device', 'Devices');
      body.hidden = true;
      return;
    }
    page.missing.hidden = true;
    body.hidden = false;
    const m = modelOf(d);
    const st = d.status || {};
    const spec = d.spec || {};
    const proto = spec.protocol && spec.protocol.protocolName;
    const state = stateOf(d);
    const fact = (name, ...v) => [h('dt', {}, name), h('dd', { 'data-fact': name }, ...v)];
    page.facts.replaceChildren(
      ...fact('state', h('span', { class: `state state-${state}` }, state)),
      ...fact('node', spec.nodeName || '-'),
      ...fact('mapper', spec.mapperName || (proto ? `any ${proto} mapper` : '-'), proto && spec.mapperName ? h('span', { class: 'muted' }, ` (${proto})`) : ''),
      ...fact('model', spec.deviceModelRef ? spec.deviceModelRef.name : '-', m ? '' : h('span', { class: 'problem' }, ' (not found)')),
      ...fact('last report', ...[when(timeOf(st.lastReportTime))].flat()),
      ...fact('last online', ...[when(timeOf(st.lastOnlineTime))].flat()),
      ...fact('differing', String(st.differing || 0)),
      ...fact('generation', String(d.metadata.generation || '-'), d.metadata.generation && st.observedGeneration !== d.metadata.generation
        ? h('span', { class: 'differs' }, ` (status is for ${st.observedGeneration || 'none yet'})`) : h('span', { class: 'muted' }, ' (status is current)')));

    const seen = new Set();
    for (const p of twinOf(d)) {
      seen.add(p.name);
      const mp = modelProp(m, p.name);
      const unit = unitOf(mp);
      let row = page.rows.get(p.name);
      if (!row) {
        const cells = {};
        for (const c of ['name', 'type', 'desired', 'reported', 'read', 'source', 'observed', 'appliedAt', 'form']) cells[c] = h('td', { class: c });
        row = { tr: h('tr', { 'data-property': p.name }, Object.values(cells)), cells, form: null };
        page.rows.set(p.name, row);
        page.props.append(row.tr);
      }
      const c = row.cells;
      c.name.replaceChildren(p.name, mp && mp.description ? h('div', { class: 'muted' }, mp.description) : '');
      c.type.textContent = mp ? `${mp.type || '-'} · ${mp.accessMode || '-'}` : 'not in the model';
      c.desired.textContent = withUnit(p.desired, unit);
      c.reported.replaceChildren(h('span', { class: `value${p.desired !== undefined && !same(p.desired, p.reported) ? ' differs' : ''}` }, withUnit(p.reported, unit)),
        p.error ? h('div', { class: 'problem' }, `read failed: ${p.error}`) : '');
      c.read.replaceChildren(...[when(p.readAt)].flat());
      c.source.replaceChildren(sourceTag(p));
      c.observed.replaceChildren(withUnit(p.observed, unit), p.desiredError ? h('div', { class: 'problem' }, `refused: ${p.desiredError}`) : '');
      c.appliedAt.replaceChildren(...[when(p.observedAt)].flat());
      if (mp && mp.accessMode === 'ReadWrite' && !row.form) { row.form = setForm(d, p.name); page.forms.push(row.form); c.form.append(row.form.el); }
      if (hist.has(`${view}/${p.name}`) || (mp && numericType(mp.type))) {
        let f = page.plots.get(p.name);
        if (!f) {
          f = { key: `${view}/${p.name}`, holder: h('div', {}) };
          f.fig = h('figure', { 'data-plot': p.name }, h('figcaption', {}, p.name, f.unitEl = h('span', { class: 'muted' })), f.holder);
          page.plots.set(p.name, f);
          page.plotsEl.append(f.fig);
        }
        f.unit = unit;
        f.unitEl.textContent = unit ? ` in ${unit}` : '';
        drawBig(f);
      }
      settle(d, p);
    }
    for (const [name, row] of page.rows) if (!seen.has(name)) { row.tr.remove(); page.rows.delete(name); }
    for (const [name, f] of page.plots) if (!seen.has(name)) { f.fig.remove(); page.plots.delete(name); }

    const conds = [...(st.conditions || [])].sort((a, b) => condRank(a.type) - condRank(b.type) || a.type.localeCompare(b.type));
    page.conds.replaceChildren(...(conds.length ? conds.map((x) => h('tr', { 'data-condition': x.type },
      h('td', {}, x.type), h('td', { class: String(x.status).toLowerCase() }, x.status), h('td', {}, x.reason || '-'),
      h('td', {}, x.message || ''), h('td', { class: 'when' }, ...[when(timeOf(x.lastTransitionTime))].flat())))
      : [h('tr', {}, h('td', { colspan: 5, class: 'empty' }, 'No conditions yet: the controller has not looked at this Device.'))]));
  }

  function drawBig(f) {
    const pts = hist.get(f.key);
    f.holder.replaceChildren(pts && pts.length ? plot(pts, { w: 720, h: 200, unit: f.unit, xTicks: 7, yTicks: 5 })
      : h('p', { class: 'empty' }, 'No numeric value seen yet.'));
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
      else if (m.op === 'state') {
        for (const el of [p, page && page.evproblem]) if (el) { el.hidden = !m.problem; el.textContent = m.problem || ''; }
      }
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
    // The Device page lists its Device's Events too, with their times.
    if (page && selected && selected.kind === 'Device' && `${selected.namespace}/${selected.name}` === page.key) {
      const full = [...evs.values()].sort((a, b) => evTime(b) - evTime(a)).map((e) => {
        const n = Math.max(e.count || 0, (e.series && e.series.count) || 0);
        return h('tr', { class: e.type === 'Warning' ? 'problem' : '', 'data-event': e.reason }, h('td', {}, e.type), h('td', {}, e.reason),
          h('td', { class: 'when' }, ...[when(evTime(e))].flat()),
          h('td', {}, (e.source && e.source.component) || e.reportingComponent || '-'),
          h('td', {}, (e.message || '') + (n > 1 ? ` (×${n})` : '')));
      });
      page.events.replaceChildren(...(full.length ? full : [h('tr', {}, h('td', { colspan: 5, class: 'empty' }, 'No Events.'))]));
    }
  }

  // Ages tick without a re-render; plots slide with the clock.
  let ticks = 0;
  setInterval(() => {
    for (const el of document.querySelectorAll('[data-since]')) {
      const t = Number(el.dataset.since);
      if (t) el.textContent = ago(t);
    }
    if (++ticks % 5 === 0) replot();
  }, 1000);

  // ---- namespace switcher ----
  $('#ns').value = all ? '' : ns;
  $('#allns').checked = all;
  $('#nsform').addEventListener('submit', (ev) => {
    ev.preventDefault();
    location.search = $('#allns').checked ? '?all=1' : `?namespace=${encodeURIComponent($('#ns').value.trim() || 'default')}`;
  });

  for (const el of document.querySelectorAll('.ranges')) rangeChooser(el);
  window.addEventListener('popstate', () => { route(); render(); });
  route();
  connect();
  render();
})();
