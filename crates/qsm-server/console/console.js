// QSM web console: one page per hash route, each fed by the server's JSON API.
// No library and no build step, so the server can embed this file as it is.
(() => {
  'use strict';

  const $ = (sel, root = document) => root.querySelector(sel);
  const SVGNS = 'http://www.w3.org/2000/svg';
  const NO_LIMIT = 4294967295; // qsm_types::model::NO_LIMIT (u32::MAX)

  // ---------------------------------------------------------------- DOM building
  // Strings always become text nodes: account names, log lines and every other server
  // string are untrusted, so nothing here is ever parsed as HTML.
  function build(e, attrs, kids) {
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k === 'text') e.textContent = String(v);
      else if (k.startsWith('on')) e.addEventListener(k.slice(2), v);
      else e.setAttribute(k, v === true ? '' : String(v));
    }
    for (const k of kids.flat(2)) {
      if (k != null && k !== false) e.append(k instanceof Node ? k : String(k));
    }
    return e;
  }
  const h = (tag, attrs, ...kids) => build(document.createElement(tag), attrs, kids);
  const s = (tag, attrs, ...kids) => build(document.createElementNS(SVGNS, tag), attrs, kids);
  const td = (x, cls) => h('td', { class: cls }, x);
  const rowHead = (x) => h('th', { scope: 'row' }, x);
  const heading = (text) => h('h1', { tabindex: '-1', text });
  const enc = encodeURIComponent;
  const nodeLink = (name) => h('a', { href: `#/nodes/${enc(name)}`, text: name });

  // ---------------------------------------------------------------- formatting
  const UNITS = ['B', 'KB', 'MB', 'GB', 'TB', 'PB', 'EB'];
  function fmtBytes(n) {
    if (n == null || !isFinite(n)) return '–';
    let v = Math.abs(n);
    let i = 0;
    while (v >= 1000 && i < UNITS.length - 1) { v /= 1000; i++; }
    const t = i === 0 ? String(Math.round(v)) : v.toFixed(v < 10 ? 2 : v < 100 ? 1 : 0);
    return `${n < 0 ? '-' : ''}${t} ${UNITS[i]}`;
  }
  const fmtRate = (n) => `${fmtBytes(n)}/s`;
  const fmtCount = (n) => (n == null ? '–' : Number(n).toLocaleString());

  // Two units at most ("1 m 5 s", "3 h 20 m"): enough to compare runs at a glance.
  const DUR_UNITS = [[86400, 'd'], [3600, 'h'], [60, 'm'], [1, 's']];
  function fmtDuration(sec) {
    if (sec == null || !isFinite(sec)) return '–';
    sec = Math.max(0, Math.round(sec));
    for (let i = 0; i < DUR_UNITS.length; i++) {
      const [size, u] = DUR_UNITS[i];
      if (sec < size) continue;
      const q = Math.floor(sec / size);
      const next = DUR_UNITS[i + 1];
      const r = next ? Math.floor((sec % size) / next[0]) : 0;
      return r ? `${q} ${u} ${r} ${next[1]}` : `${q} ${u}`;
    }
    return '0 s';
  }

  function timeEl(t) {
    if (t == null || t <= 0) return h('span', { class: 'muted', text: '–' });
    const d = new Date(t * 1000);
    return h('time', { datetime: d.toISOString(), title: String(t), text: d.toLocaleString() });
  }

  // Colour is only a second cue: the badge always carries the status as text.
  function statusClass(text) {
    const t = String(text || '').toLowerCase();
    if (t === 'protected' || t === 'completed') return 'ok';
    if (t === 'at risk' || t === 'completed with warnings' || t === 'missed' || t === 'warning') return 'warn';
    if (t === 'failed' || t === 'severed' || t === 'error') return 'bad';
    return 'neutral';
  }
  const badge = (text, cls) => h('span', { class: `badge ${cls || statusClass(text)}`, text: text || '–' });
  const limit = (n) => (n === NO_LIMIT ? 'nolimit' : fmtCount(n));

  // ---------------------------------------------------------------- messages
  const msgEl = $('#message');
  let pollFailed = false; // the message shows a failed poll, which the next good poll clears
  function say(text, kind = 'error') {
    msgEl.className = kind;
    msgEl.textContent = text;
    pollFailed = false;
  }
  function clearMsg() {
    msgEl.className = '';
    msgEl.textContent = '';
    pollFailed = false;
  }
  function fail(err) {
    if (err && err.auth) return; // the login form already says why
    say(err && err.message ? err.message : String(err));
  }

  // ---------------------------------------------------------------- API
  async function api(path, { method = 'GET', body, quiet401 = false } = {}) {
    const headers = { Accept: 'application/json' };
    const init = { method, headers, credentials: 'same-origin', cache: 'no-store' };
    // The server refuses state-changing requests without this header (CSRF guard).
    if (method !== 'GET') headers['X-QSM-CSRF'] = '1';
    if (body !== undefined) {
      headers['Content-Type'] = 'application/json';
      init.body = JSON.stringify(body);
    }
    let res;
    try {
      res = await fetch(path, init);
    } catch (e) {
      throw new Error(`Cannot reach the server (${e.message || e}).`);
    }
    const text = await res.text();
    let data = null;
    if (text) {
      try { data = JSON.parse(text); } catch (_) { data = null; }
    }
    if (res.ok) {
      if (text && data === null) throw new Error(`The server's answer to ${path} is not JSON.`);
      return data;
    }
    const err = new Error((data && typeof data.error === 'string' && data.error)
      || `${method} ${path} failed: ${res.status} ${res.statusText}`.trim());
    err.status = res.status;
    if (res.status === 401 && !quiet401) {
      err.auth = true;
      showLogin(`Your session has ended (${err.message}). Please log in again.`);
    }
    throw err;
  }

  // ---------------------------------------------------------------- views and polling
  // A view lives while its page is shown; leaving the page kills its timers, and a poll
  // that answers after that finds view.alive false and draws nothing.
  let view = null;
  function leaveView() {
    if (!view) return;
    view.alive = false;
    view.timers.forEach(clearInterval);
    view.cleanups.forEach((f) => f());
    view = null;
  }

  // Runs fn now and every ms (0: once). A tick is skipped while the last one is still in
  // flight, so a slow server never gets a pile of overlapping requests. Returns a function
  // that refreshes at once (after an action).
  function poll(v, ms, fn) {
    let busy = false;
    const tick = async (force) => {
      if (busy || !v.alive || (document.hidden && !force)) return;
      busy = true;
      try {
        await fn();
        if (v.alive && pollFailed) clearMsg();
      } catch (e) {
        if (v.alive && !e.auth) { fail(e); pollFailed = true; }
      } finally {
        busy = false;
      }
    };
    if (ms > 0) v.timers.push(setInterval(tick, ms));
    tick(true);
    return () => tick(true);
  }

  // Re-rendering a table every second must not throw the keyboard user's focus away:
  // find the focused control again by its data-* attribute or link target.
  function keepFocus(root, fn) {
    const a = document.activeElement;
    let sel = null;
    if (a && a !== document.body && root.contains(a)) {
      const attr = Array.from(a.attributes).find((x) => x.name.startsWith('data-') || x.name === 'href');
      if (attr) sel = `${a.tagName}[${attr.name}="${CSS.escape(attr.value)}"]`;
    }
    fn();
    if (sel) { const again = root.querySelector(sel); if (again) again.focus(); }
  }

  // A table in a scrolling wrapper (phones), with an "empty" note kept outside the tbody
  // so that the body holds exactly one row per item.
  function table(id, caption, cols) {
    const tbody = h('tbody');
    const head = cols.map((c) => (Array.isArray(c)
      ? h('th', { scope: 'col', class: c[1], text: c[0] })
      : h('th', { scope: 'col', text: c })));
    const t = h('table', { id }, h('caption', { text: caption }), h('thead', null, h('tr', null, head)), tbody);
    const empty = h('p', { class: 'empty', hidden: true });
    const wrap = h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': caption }, t);
    return {
      el: h('div', { class: 'table-block' }, wrap, empty),
      set(rows, emptyText) {
        keepFocus(tbody, () => tbody.replaceChildren(...rows));
        empty.textContent = emptyText || 'Nothing to show.';
        empty.hidden = rows.length > 0;
      },
    };
  }

  // Disables the button while an action runs and says so; the error goes to #message and
  // next to the button, the result to done().
  async function runAction(btn, status, work, done) {
    btn.disabled = true;
    btn.setAttribute('aria-busy', 'true');
    if (status) { status.className = 'status'; status.textContent = 'Running…'; }
    try {
      const r = await work();
      if (status) status.textContent = '';
      if (view && done) done(r);
    } catch (e) {
      if (status) { status.className = 'status error'; status.textContent = e.auth ? '' : `Failed: ${e.message}`; }
      fail(e);
    } finally {
      btn.disabled = false;
      btn.removeAttribute('aria-busy');
      if (btn.isConnected && document.activeElement === document.body) btn.focus();
    }
  }

  // ---------------------------------------------------------------- charts
  function niceMax(v, unit = 1) {
    if (!(v > 0)) return unit;
    const n = v / unit;
    const p = 10 ** Math.floor(Math.log10(n));
    const f = n / p;
    return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p * unit;
  }
  const durationUnit = (max) => (max < 120 ? 1 : max < 7200 ? 60 : 3600);

  // Horizontal grid lines at 0, half and full scale, labelled on the left.
  function gridLines(svg, { L, R, T, ph, W, max, fmt }) {
    for (const f of [0, 0.5, 1]) {
      const y = T + ph * (1 - f);
      svg.append(
        s('line', { class: 'grid', x1: L, x2: W - R, y1: y, y2: y }),
        s('text', { class: 'axis', x: L - 6, y: y + 4, 'text-anchor': 'end', text: fmt(max * f) }),
      );
    }
  }

  function barChart(id, title, days, key, fmt, unitOf) {
    const W = 480, H = 230, L = 76, R = 22, T = 12, B = 42;
    const pw = W - L - R, ph = H - T - B;
    const vals = days.map((d) => d[key]);
    const top = Math.max(0, ...vals);
    const max = niceMax(top, unitOf ? unitOf(top) : 1);
    const total = vals.reduce((a, b) => a + b, 0);
    const label = days.length
      ? `${title}, ${days[0].day} to ${days[days.length - 1].day}: total ${fmt(total)}, ` +
        `at most ${fmt(top)} in one day. The table "Per day" below lists every value.`
      : `${title}: no backups recorded.`;
    const svg = s('svg', { id, class: 'chart', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': label },
      s('title', { text: title }));
    gridLines(svg, { L, R, T, ph, W, max, fmt });
    const bw = pw / Math.max(1, days.length);
    days.forEach((d, i) => {
      const bh = (ph * d[key]) / max;
      svg.append(s('rect', {
        class: 'bar', x: L + i * bw + bw * 0.1, y: T + ph - bh, width: Math.max(1, bw * 0.8), height: bh,
      }, s('title', { text: `${d.day}: ${fmt(d[key])}` })));
    });
    const ticks = new Set(days.length > 2 ? [0, Math.floor((days.length - 1) / 2), days.length - 1] : days.keys());
    for (const i of ticks) {
      svg.append(s('text', { class: 'axis', x: L + (i + 0.5) * bw, y: T + ph + 16, 'text-anchor': 'middle', text: days[i].day.slice(5) }));
    }
    svg.append(s('text', { class: 'axis', x: L + pw / 2, y: H - 6, 'text-anchor': 'middle', text: 'Day (UTC, month-day)' }));
    if (!days.length) {
      svg.append(s('text', { class: 'axis', x: L + pw / 2, y: T + ph / 2, 'text-anchor': 'middle', text: 'No backups recorded' }));
    }
    return svg;
  }

  // ---------------------------------------------------------------- throughput
  // Kept across visits to the Activity page; a break in polling (page left, tab hidden)
  // breaks the line instead of drawing a straight segment over the gap.
  const WINDOW_MS = 120000;
  let samples = []; // {t: performance.now() ms, bytes, dt: s, rate: bytes/s, brk: starts a new segment}
  let prevPoll = null; // {t, bytes: Map(session id → bytes), sampled}

  // Rates per session from the difference of `bytes` between two polls close together.
  function measure(sessions) {
    const t = performance.now();
    const bytes = new Map(sessions.map((x) => [x.id, Number(x.bytes) || 0]));
    const rates = new Map();
    const fresh = prevPoll && t > prevPoll.t && t - prevPoll.t < 5000;
    if (fresh) {
      const dt = (t - prevPoll.t) / 1000;
      let total = 0;
      for (const [id, b] of bytes) {
        // A session first seen now started since the last poll: all its bytes are new.
        const d = Math.max(0, b - (prevPoll.bytes.get(id) || 0));
        rates.set(id, d / dt);
        total += d;
      }
      samples.push({ t, bytes: total, dt, rate: total / dt, brk: !prevPoll.sampled });
    }
    prevPoll = { t, bytes, sampled: !!fresh };
    while (samples.length && samples[0].t < t - WINDOW_MS) samples.shift();
    return rates;
  }

  // The figure shown as text: a server that counts bytes per transaction makes single
  // polls jump between 0 and a burst, so average over the last few seconds.
  function recentRate() {
    const from = performance.now() - 5000;
    let bytes = 0;
    let dt = 0;
    for (const p of samples) if (p.t >= from) { bytes += p.bytes; dt += p.dt; }
    return dt > 0 ? bytes / dt : null;
  }

  function drawThroughput(svg, path) {
    const W = 480, H = 200, L = 76, R = 10, T = 12, B = 26;
    const pw = W - L - R, ph = H - T - B;
    const now = performance.now();
    const top = Math.max(0, ...samples.map((p) => p.rate));
    const max = niceMax(Math.max(1000, top));
    const X = (t) => L + pw * (1 - (now - t) / WINDOW_MS);
    const Y = (r) => T + ph * (1 - r / max);
    const d = samples.map((p, i) => `${i === 0 || p.brk ? 'M' : 'L'}${X(p.t).toFixed(1)},${Y(p.rate).toFixed(1)}`).join(' ');
    path.setAttribute('d', d);
    // The total series stays the first element of the chart; the rest is redrawn behind text.
    svg.replaceChildren(path, s('title', { text: 'Bytes received per second, all sessions, last 2 minutes' }));
    gridLines(svg, { L, R, T, ph, W, max, fmt: fmtRate });
    [[0, '2 min ago', 'start'], [0.5, '1 min ago', 'middle'], [1, 'now', 'end']].forEach(([f, text, anchor]) => {
      svg.append(s('text', { class: 'axis', x: L + pw * f, y: H - 6, 'text-anchor': anchor, text }));
    });
    const recent = recentRate();
    svg.setAttribute('aria-label', recent != null
      ? `Throughput, all sessions, last 2 minutes: ${fmtRate(recent)} over the last 5 seconds, peak ${fmtRate(top)}.`
      : 'Throughput, all sessions, last 2 minutes: measuring.');
    return recent;
  }

  // ---------------------------------------------------------------- reports
  function fmtField(key, val) {
    if (val == null) return key === 'stopped' ? 'no, ran to its end' : '–';
    if (Array.isArray(val)) {
      if (!val.length) return 'none';
      const items = val.slice(0, 5).map((x) => (x && typeof x === 'object'
        ? Object.entries(x).map(([k, v]) => `${k.replace(/_/g, ' ')} ${v}`).join(', ')
        : String(x)));
      return `${val.length}: ${items.join('; ')}${val.length > 5 ? '; …' : ''}`;
    }
    if (typeof val === 'boolean') return val ? 'yes' : 'no';
    if (typeof val === 'number') {
      if (/bytes/.test(key)) return fmtBytes(val);
      if (key === 'seconds') return val < 60 ? `${val.toFixed(1)} s` : fmtDuration(val);
      if (/_at$/.test(key)) return timeEl(val);
      return fmtCount(val);
    }
    if (typeof val === 'object') return JSON.stringify(val);
    return String(val);
  }

  // Every field of a report, so that a field the server adds later still shows.
  function reportView(title, r) {
    const dl = h('dl', { class: 'fields' });
    if (r && typeof r === 'object') {
      for (const [k, v] of Object.entries(r)) dl.append(h('dt', { text: k.replace(/_/g, ' ') }), h('dd', null, fmtField(k, v)));
    }
    const stopped = r && r.stopped;
    return h('section', { class: 'panel report' },
      h('h3', { text: `${title}: ${stopped ? 'stopped early' : 'done'} at ${new Date().toLocaleTimeString()}` }),
      stopped ? h('p', null, badge('stopped', 'warn'), ` ${stopped}`) : null,
      dl);
  }

  // ---------------------------------------------------------------- pages
  const card = (title, value, cls, ...detail) => h('div', { class: `card ${cls || ''}` },
    h('p', { class: 'card-title', text: title }),
    h('p', { class: 'big', text: value == null ? '–' : value }),
    detail.length ? h('p', { class: 'small' }, detail) : null);

  function dataBar(d) {
    const parts = [
      ['Stored', d.stored_bytes, 'seg1'],
      ['Saved by compression', d.saved_by_compression_bytes, 'seg2'],
      ['Saved by deduplication', d.saved_by_dedup_bytes, 'seg3'],
    ];
    const sum = parts.reduce((a, p) => a + (p[1] || 0), 0);
    const total = Math.max(d.protected_bytes || 0, sum);
    const pct = (v) => (total > 0 ? `${Math.round(((v || 0) * 100) / total)} %` : '0 %');
    const W = 480, H = 24;
    const label = `Data protected ${fmtBytes(d.protected_bytes)}: ` +
      parts.map(([name, v]) => `${name.toLowerCase()} ${fmtBytes(v)} (${pct(v)})`).join(', ');
    const svg = s('svg', { class: 'stackbar', viewBox: `0 0 ${W} ${H}`, role: 'img', 'aria-label': label, preserveAspectRatio: 'none' },
      s('rect', { class: 'track', x: 0, y: 0, width: W, height: H }));
    let x = 0;
    for (const [name, v, cls] of parts) {
      const w = total > 0 ? ((v || 0) / total) * W : 0;
      svg.append(s('rect', { class: cls, x, y: 0, width: w, height: H }, s('title', { text: `${name}: ${fmtBytes(v)}` })));
      x += w;
    }
    const ratio = d.stored_bytes > 0 ? `, a reduction of ${(d.protected_bytes / d.stored_bytes).toFixed(1)} : 1` : '';
    return [
      h('p', null, 'Protected ', h('strong', { text: fmtBytes(d.protected_bytes) }), ', stored in ',
        h('strong', { text: fmtBytes(d.stored_bytes) }), ratio, '.'),
      svg,
      h('ul', { class: 'legend' }, parts.map(([name, v, cls]) => h('li', null,
        h('span', { class: `swatch ${cls}`, 'aria-hidden': 'true' }), `${name}: ${fmtBytes(v)} (${pct(v)})`))),
    ];
  }

  function overviewPage(sec, v) {
    const stamp = h('p', { class: 'muted' }, 'Loading…');
    const nodeCards = h('div', { class: 'cards' });
    const cards = h('div', { class: 'cards' });
    const data = h('div', { class: 'panel' });
    const t = table('node-status-table', 'Nodes and their backup status',
      ['Node', 'Status', 'Locked', 'Last completed backup', 'Last result']);
    sec.append(heading('Overview'), stamp, nodeCards, cards, h('h2', { text: 'Data' }), data, h('h2', { text: 'Nodes' }), t.el);
    poll(v, 5000, async () => {
      const o = await api('/api/overview');
      if (!v.alive) return;
      const n = o.nodes || {};
      const pool = o.pool || {};
      const cat = o.catalog || {};
      stamp.replaceChildren('Server ', h('strong', { text: o.server }), ', as of ', timeEl(o.time), '. Refreshes every 5 s.');
      const of = `of ${fmtCount(n.total)} nodes`;
      nodeCards.replaceChildren(
        card('Protected', fmtCount(n.protected), 'ok', `${of}: every filespace backed up in the last 24 h`),
        card('At risk', fmtCount(n.at_risk), n.at_risk ? 'warn' : '', `${of}: no recent complete backup`),
        card('Failed', fmtCount(n.failed), n.failed ? 'bad' : '', `${of}: last backup in 24 h failed`),
        card('Never backed up', fmtCount(n.never), n.never ? 'warn' : '', of),
      );
      cards.replaceChildren(
        card('Storage pool', fmtBytes(pool.bytes), pool.damaged_chunks ? 'bad' : '',
          `${fmtBytes(pool.live_bytes)} live, ${fmtBytes(pool.reclaimable_bytes)} reclaimable, ` +
          `${fmtCount(pool.containers)} containers` +
          (pool.damaged_chunks ? `, ${fmtCount(pool.damaged_chunks)} damaged chunks` : ', no damaged chunks')),
        card('Catalog', fmtBytes(cat.database_bytes), '', `${fmtCount(cat.objects)} objects, ${fmtCount(cat.chunks)} chunks`),
        card('Sessions', fmtCount(o.sessions), '', h('a', { href: '#/activity', text: 'See activity' })),
        card('Processes', fmtCount(o.processes), '', h('a', { href: '#/activity', text: 'See activity' })),
      );
      data.replaceChildren(...dataBar(o.data || {}));
      t.set((o.node_status || []).map((x) => h('tr', { 'data-node': x.name },
        rowHead(nodeLink(x.name)),
        td(badge(x.status)),
        td(x.locked ? 'locked' : 'no'),
        td(timeEl(x.last_completed)),
        td(x.last_result ? badge(x.last_result) : 'none'),
      )), 'No nodes are registered.');
    });
  }

  function activityPage(sec, v) {
    const path = s('path', { class: 'series', d: '' });
    const chart = s('svg', { id: 'throughput-chart', class: 'chart', viewBox: '0 0 480 200', role: 'img', 'aria-label': 'Throughput: measuring.' }, path);
    const now = h('strong', { id: 'throughput-now', text: 'measuring…' });
    const sessions = table('sessions-table', 'Sessions', ['ID', 'Account', 'Client', 'Peer', 'State', 'Started',
      ['Received', 'num'], ['Objects', 'num'], ['Rate', 'num'], 'Server', 'Action']);
    const procs = table('processes-table', 'Processes', ['ID', 'Kind', 'Started', 'Progress', 'Server', 'Action']);
    sec.append(heading('Activity'),
      h('p', { class: 'muted', text: 'Refreshes every second.' }),
      h('h2', { text: 'Throughput' }),
      h('figure', { class: 'figure' }, chart,
        h('figcaption', null, 'Bytes received per second over all sessions, last 2 minutes. Last 5 seconds: ', now)),
      h('h2', { text: 'Sessions' }), sessions.el,
      h('h2', { text: 'Processes' }), procs.el);

    const cancel = async (btn, kind, id, what) => {
      if (!confirm(`Cancel ${what}?`)) return;
      await runAction(btn, null, () => api(`/api/${kind}/${enc(id)}/cancel`, { method: 'POST' }), () => {
        say(`Asked to cancel ${what}.`, 'ok');
        refresh();
      });
    };

    const refresh = poll(v, 1000, async () => {
      const [ss, ps] = await Promise.all([api('/api/sessions'), api('/api/processes')]);
      if (!v.alive) return;
      const rates = measure(ss || []);
      const recent = drawThroughput(chart, path);
      now.textContent = recent != null ? fmtRate(recent) : 'measuring…';
      sessions.set((ss || []).map((x) => h('tr', { 'data-session-id': x.id },
        rowHead(String(x.id)),
        td([x.account, x.admin ? [' ', h('span', { class: 'tag', text: 'admin' })] : null]),
        td(x.client), td(x.peer), td(x.state), td(timeEl(x.started)),
        td(fmtBytes(x.bytes), 'num'), td(fmtCount(x.objects), 'num'),
        td(fmtRate(rates.has(x.id) ? rates.get(x.id) : x.bytes_per_second), 'num'),
        td(x.server),
        td(h('button', {
          type: 'button', class: 'small danger', 'data-cancel-session': x.id,
          'aria-label': `Cancel session ${x.id} of ${x.account}`, text: 'Cancel',
          onclick: (e) => cancel(e.currentTarget, 'sessions', x.id, `session ${x.id} of ${x.account}`),
        })),
      )), 'No sessions.');
      procs.set((ps || []).map((x) => h('tr', { 'data-process-id': x.id },
        rowHead(String(x.id)), td(x.kind), td(timeEl(x.started)), td(x.progress, 'wrap'), td(x.server),
        td(h('button', {
          type: 'button', class: 'small danger', 'data-cancel-process': x.id,
          'aria-label': `Cancel process ${x.id} (${x.kind})`, text: 'Cancel',
          onclick: (e) => cancel(e.currentTarget, 'processes', x.id, `process ${x.id} (${x.kind})`),
        })),
      )), 'No processes.');
    });
  }

  function nodesPage(sec, v) {
    const t = table('nodes-table', 'Registered nodes', ['Node', 'Status', 'Locked', 'Registered', 'Replica of', 'Action']);
    sec.append(heading('Nodes'), t.el);
    const toggle = async (btn, n) => {
      const lock = !n.locked;
      if (lock && !confirm(`Lock node ${n.name}? It cannot log in until it is unlocked.`)) return;
      await runAction(btn, null, () => api(`/api/nodes/${enc(n.name)}/${lock ? 'lock' : 'unlock'}`, { method: 'POST' }), () => {
        say(`Node ${n.name} ${lock ? 'locked' : 'unlocked'}.`, 'ok');
        refresh();
      });
    };
    const refresh = poll(v, 10000, async () => {
      // The status is worked out only by the overview; the node list has the rest.
      const [ns, o] = await Promise.all([api('/api/nodes'), api('/api/overview')]);
      if (!v.alive) return;
      const status = new Map(((o && o.node_status) || []).map((x) => [x.name, x.status]));
      t.set((ns || []).map((n) => h('tr', { 'data-node': n.name },
        rowHead(nodeLink(n.name)),
        td(badge(status.get(n.name))),
        td(n.locked ? 'locked' : 'no'),
        td(timeEl(n.registered)),
        td(n.replica_of || '–'),
        td(h('button', {
          type: 'button', class: n.locked ? 'small' : 'small danger', 'data-lock-node': n.name,
          'aria-label': `${n.locked ? 'Unlock' : 'Lock'} node ${n.name}`, text: n.locked ? 'Unlock' : 'Lock',
          onclick: (e) => toggle(e.currentTarget, n),
        })),
      )), 'No nodes are registered.');
    });
  }

  // Sums a node's runs per UTC day, over the last 30 days that have data, zero-filled so
  // the bars keep a regular time axis.
  function perDay(runs) {
    const map = new Map();
    for (const r of runs) {
      if (!(r.started > 0)) continue;
      const day = new Date(r.started * 1000).toISOString().slice(0, 10);
      const d = map.get(day) || { day, bytes: 0, seconds: 0, runs: 0, failed: 0 };
      d.bytes += Number(r.bytes) || 0;
      d.seconds += Math.max(0, (r.ended || r.started) - r.started);
      d.runs += 1;
      if (r.result === 'failed') d.failed += 1;
      map.set(day, d);
    }
    if (!map.size) return [];
    const keys = [...map.keys()].sort();
    const DAY = 86400000;
    const end = Date.parse(keys[keys.length - 1]);
    const out = [];
    for (let t = Math.max(Date.parse(keys[0]), end - 29 * DAY); t <= end; t += DAY) {
      const day = new Date(t).toISOString().slice(0, 10);
      out.push(map.get(day) || { day, bytes: 0, seconds: 0, runs: 0, failed: 0 });
    }
    return out;
  }

  function nodePage(sec, v, name) {
    const fs = table('filespaces-table', `Filespaces of ${name}`, ['Filespace', 'ID', 'Created', 'Last backup',
      'Result', 'Duration', 'Last completed', ['Bytes stored', 'num'], ['Objects', 'num'], ['Warnings', 'num']]);
    const charts = h('div', { class: 'charts' }, h('p', { class: 'muted', text: 'Loading…' }));
    const days = table('days-table', 'Per day (UTC)', ['Day', ['Runs', 'num'], ['Failed', 'num'], ['Bytes stored', 'num'], ['Duration', 'num']]);
    const hist = table('history-table', 'Backup history, newest first', ['Started', 'Filespace', 'Ended', 'Duration',
      'Result', ['Bytes stored', 'num'], ['Objects', 'num'], ['Warnings', 'num']]);
    sec.append(h('p', null, h('a', { href: '#/nodes', text: '← All nodes' })), heading(`Node ${name}`),
      h('h2', { text: 'Filespaces' }), fs.el,
      h('h2', { text: 'Backups per day' }), charts,
      h('details', null, h('summary', { text: 'Per day, as a table' }), days.el),
      h('h2', { text: 'Backup history' }), hist.el);
    poll(v, 0, async () => {
      const [fss, runs] = await Promise.all([
        api(`/api/nodes/${enc(name)}/filespaces`), api(`/api/nodes/${enc(name)}/backups`)]);
      if (!v.alive) return;
      fs.set((fss || []).map((f) => {
        const b = f.last_backup;
        const c = f.last_completed;
        return h('tr', { 'data-filespace': f.name },
          rowHead(f.name), td(String(f.id)), td(timeEl(f.created)),
          td(b ? timeEl(b.started) : 'never'), td(b ? badge(b.result) : '–'),
          td(b ? fmtDuration(b.ended - b.started) : '–'),
          td(c ? timeEl(c.ended) : 'never'),
          td(c ? fmtBytes(c.bytes) : '–', 'num'), td(c ? fmtCount(c.objects) : '–', 'num'),
          td(c ? fmtCount(c.warnings) : '–', 'num'));
      }), 'This node has no filespaces.');
      const byDay = perDay(runs || []);
      charts.replaceChildren(
        h('figure', { class: 'figure' }, barChart('chart-bytes', 'Bytes stored per day', byDay, 'bytes', fmtBytes),
          h('figcaption', { text: 'Bytes stored per day (sum over all filespaces)' })),
        h('figure', { class: 'figure' }, barChart('chart-duration', 'Backup duration per day', byDay, 'seconds', fmtDuration, durationUnit),
          h('figcaption', { text: 'Backup duration per day (sum of run durations)' })));
      days.set(byDay.slice().reverse().map((d) => h('tr', null, rowHead(d.day), td(fmtCount(d.runs), 'num'),
        td(fmtCount(d.failed), 'num'), td(fmtBytes(d.bytes), 'num'), td(fmtDuration(d.seconds), 'num'))), 'No backups recorded.');
      hist.set((runs || []).slice().sort((a, b) => b.started - a.started).map((r) => h('tr', null,
        rowHead(timeEl(r.started)), td(r.filespace), td(timeEl(r.ended)), td(fmtDuration(r.ended - r.started)),
        td(badge(r.result)), td(fmtBytes(r.bytes), 'num'), td(fmtCount(r.objects), 'num'), td(fmtCount(r.warnings), 'num'),
      )), 'No backups recorded.');
    });
  }

  function eventsPage(sec, v) {
    const t = table('events-table', 'Schedule events of the last 7 days, newest first',
      ['Window start', 'Domain', 'Schedule', 'Action', 'Node', 'State', 'Started', 'Ended', 'Duration', 'Detail']);
    sec.append(heading('Schedule events'), h('p', { class: 'muted', text: 'The last 7 days. Refreshes every 30 s.' }), t.el);
    poll(v, 30000, async () => {
      const since = Math.floor(Date.now() / 1000) - 7 * 86400;
      const evs = await api(`/api/events?since=${since}`);
      if (!v.alive) return;
      const rows = (evs || []).slice().sort((a, b) => (b.window_start || 0) - (a.window_start || 0));
      t.set(rows.map((e) => h('tr', null,
        rowHead(timeEl(e.window_start)), td(e.domain), td(e.schedule), td(e.action),
        td(e.node == null ? '(server)' : e.node), td(badge(e.state)),
        td(timeEl(e.started)), td(timeEl(e.ended)),
        td(e.started && e.ended ? fmtDuration(e.ended - e.started) : '–'), td(e.detail || '', 'wrap'),
      )), 'No schedule events in the last 7 days.');
    });
  }

  function actlogPage(sec, v) {
    const input = h('input', { id: 'actlog-search', type: 'search', name: 'search', autocomplete: 'off', spellcheck: 'false' });
    const since = h('select', { id: 'actlog-since', name: 'since' },
      h('option', { value: '3600', text: 'Last hour' }),
      h('option', { value: '86400', text: 'Last 24 hours', selected: true }),
      h('option', { value: '604800', text: 'Last 7 days' }));
    const form = h('form', { class: 'toolbar', role: 'search' },
      h('div', { class: 'field' }, h('label', { for: 'actlog-search', text: 'Search messages' }), input),
      h('div', { class: 'field' }, h('label', { for: 'actlog-since', text: 'Since' }), since),
      h('button', { type: 'submit', class: 'primary', text: 'Search' }));
    const note = h('p', { class: 'muted', 'aria-live': 'polite' });
    const t = table('actlog-table', 'Activity log, newest first', ['Time', 'Severity', 'Message']);
    sec.append(heading('Activity log'), form, note, t.el);

    // Only the answer to the latest query is drawn, however the answers arrive.
    let seq = 0;
    let timer = 0;
    let inFlight = 0;
    v.cleanups.push(() => clearTimeout(timer));
    const run = async (quietly) => {
      clearTimeout(timer);
      const mine = ++seq;
      const q = new URLSearchParams({ since: String(Math.floor(Date.now() / 1000) - Number(since.value)), limit: '500' });
      if (input.value.trim()) q.set('search', input.value.trim());
      if (!quietly) note.textContent = 'Searching…';
      inFlight++;
      try {
        const r = await api(`/api/actlog?${q}`);
        if (mine !== seq || !v.alive) return;
        const rows = ((r && r.entries) || []).slice().sort((a, b) => b.time - a.time);
        t.set(rows.map((e) => h('tr', null, rowHead(timeEl(e.time)), td(badge(e.severity)), td(e.message, 'wrap'))),
          'No log entries match.');
        note.textContent = `${rows.length} entries.${r && r.truncated ? ' More match than are shown: narrow the search or the time range.' : ''}`;
      } catch (e) {
        if (mine === seq && v.alive) { note.textContent = ''; fail(e); }
      } finally {
        inFlight--;
      }
    };
    form.addEventListener('submit', (e) => { e.preventDefault(); run(); });
    input.addEventListener('input', () => { clearTimeout(timer); timer = setTimeout(() => run(), 350); });
    since.addEventListener('change', () => run());
    // New entries keep arriving: re-run the same query now and then, like a tail.
    v.timers.push(setInterval(() => { if (!inFlight && !document.hidden) run(true); }, 10000));
    run();
  }

  function storagePage(sec, v) {
    const t = table('stgpools-table', 'Storage pools', ['Pool', 'Kind', 'Location', ['Containers', 'num'], ['Bytes', 'num'],
      ['Chunks', 'num'], ['Live', 'num'], ['Reclaimable', 'num'], ['Damaged chunks', 'num']]);
    const reports = h('div', { class: 'reports', 'aria-live': 'polite' });
    const reload = poll(v, 0, async () => {
      const pools = await api('/api/stgpools');
      if (!v.alive) return;
      t.set((pools || []).map((p) => h('tr', { 'data-pool': p.name },
        rowHead(p.name), td(p.kind), td(p.location, 'wrap'), td(fmtCount(p.containers), 'num'), td(fmtBytes(p.bytes), 'num'),
        td(fmtCount(p.chunks), 'num'), td(fmtBytes(p.live_bytes), 'num'),
        td(`${Number(p.reclaimable_percent || 0).toFixed(1)} %`, 'num'),
        td(p.damaged_chunks ? badge(`${fmtCount(p.damaged_chunks)} damaged`, 'bad') : '0', 'num'),
      )), 'No storage pools are defined.');
    });

    // One form per action: Enter in the threshold field runs the reclaim, like its button.
    const action = ({ id, title, button, help, fields = [], ask, path, body }) => {
      const status = h('span', { class: 'status', 'aria-live': 'polite' });
      const btn = h('button', { type: 'submit', id, class: 'primary', text: button });
      const form = h('form', { class: 'panel action' }, h('h3', { text: title }), h('p', { class: 'small', text: help }),
        fields, h('div', { class: 'row' }, btn, status));
      form.addEventListener('submit', async (e) => {
        e.preventDefault();
        let b;
        try { b = body(); } catch (err) { say(err.message); return; }
        if (ask && !confirm(ask(b))) return;
        await runAction(btn, status, () => api(path, { method: 'POST', body: b }), (r) => {
          reports.prepend(reportView(title, r));
          reload();
        });
      });
      return form;
    };

    const threshold = h('input', { id: 'reclaim-threshold', type: 'number', min: '1', max: '100', step: '1', value: '60', inputmode: 'numeric' });
    const mark = h('input', { id: 'audit-mark', type: 'checkbox' });
    sec.append(heading('Storage'), t.el, h('h2', { text: 'Maintenance' }), h('div', { class: 'actions' },
      action({
        id: 'reclaim-button', title: 'Reclaim', button: 'Reclaim',
        help: 'Rewrites containers whose reclaimable share is at least the threshold, freeing their space.',
        fields: h('div', { class: 'field' }, h('label', { for: 'reclaim-threshold', text: 'Threshold (% reclaimable)' }), threshold),
        ask: (b) => `Reclaim containers at least ${b.threshold} % reclaimable?`,
        path: '/api/reclaim',
        body: () => {
          const n = Number(threshold.value);
          if (threshold.value === '' || !Number.isInteger(n) || n < 1 || n > 100) throw new Error('The threshold must be a whole number from 1 to 100.');
          return { threshold: n };
        },
      }),
      action({
        id: 'audit-button', title: 'Audit', button: 'Audit',
        help: 'Reads every container and checks each chunk against the catalog.',
        fields: h('div', { class: 'field check' }, mark, h('label', { for: 'audit-mark', text: 'Mark damaged chunks (the next backup sends them again)' })),
        path: '/api/audit',
        body: () => ({ mark_damaged: mark.checked }),
      }),
      action({
        id: 'expire-button', title: 'Expire inventory', button: 'Expire inventory',
        help: 'Deletes the versions that their management class no longer keeps.',
        ask: () => 'Expire inventory now? Versions past their retention are deleted.',
        path: '/api/expire',
        body: () => ({}),
      }),
      action({
        id: 'backup-db-button', title: 'Back up the catalog', button: 'Back up the catalog',
        help: 'Writes a copy of the catalog database on the server.',
        path: '/api/backup-db',
        body: () => ({}),
      }),
    ), h('h2', { text: 'Reports' }), reports);
  }

  function policyPage(sec, v) {
    const domains = h('div', null, h('p', { class: 'muted', text: 'Loading…' }));
    const sched = table('schedules-table', 'Schedules', ['Domain', 'Schedule', 'Action', 'Objects', 'First start',
      'Window', 'Period', 'Days', 'Next window']);
    sec.append(heading('Policy'), h('h2', { text: 'Domains' }), domains, h('h2', { text: 'Schedules' }), sched.el);
    poll(v, 0, async () => {
      const [ds, ss] = await Promise.all([api('/api/policy'), api('/api/schedules')]);
      if (!v.alive) return;
      domains.replaceChildren(...(ds || []).map((d) => {
        const classes = table(null, `Management classes of ${d.name}`, ['Class', ['Versions exist', 'num'],
          ['Versions deleted', 'num'], ['Retain extra (days)', 'num'], ['Retain only (days)', 'num'],
          ['Retain version (days)', 'num'], ['Retain at least (days)', 'num']]);
        classes.set((d.classes || []).map((c) => h('tr', null, rowHead(c.name), td(limit(c.versions_exist), 'num'),
          td(limit(c.versions_deleted), 'num'), td(limit(c.retain_extra_days), 'num'), td(limit(c.retain_only_days), 'num'),
          td(limit(c.retain_version_days), 'num'), td(c.retain_min_days ? limit(c.retain_min_days) : 'none', 'num'),
        )), 'No management classes.');
        const nodes = d.nodes || [];
        return h('section', { class: 'panel domain' },
          h('h3', { text: d.name }),
          d.description ? h('p', { text: d.description }) : null,
          h('p', null, `Nodes (${nodes.length}): `, nodes.length
            ? nodes.map((n, i) => [i ? ', ' : '', nodeLink(n)]) : 'none'),
          classes.el);
      }));
      if (!(ds || []).length) domains.replaceChildren(h('p', { class: 'empty', text: 'No policy domains are defined.' }));
      sched.set((ss || []).map((x) => h('tr', null,
        td(x.domain), rowHead(x.name), td(x.action), td((x.objects || []).join(', ') || '–', 'wrap'),
        td(timeEl(x.start)), td(fmtDuration(x.duration)), td(fmtDuration(x.period)),
        td((x.days || []).length ? x.days.join(', ') : 'every day'), td(x.next_window ? timeEl(x.next_window) : 'none'),
      )), 'No schedules are defined.');
    });
  }

  // ---------------------------------------------------------------- node view: own files
  // A node session sees only this page and calls only /api/my/… (admin endpoints answer 403).
  // Route: #/files for the list of filespaces, #/files?fs=NAME&dir=PATH inside one; both
  // values go through encodeURIComponent, so spaces, slashes, "&" and "+" survive.
  const filesHref = (fs, dir) => `#/files?fs=${enc(fs)}${dir ? `&dir=${enc(dir)}` : ''}`;
  const tarHref = (fs, dir) => `/api/my/tar?filespace=${enc(fs)}&dir=${enc(dir)}`;
  const downloadHref = (id) => `/api/my/download?object=${enc(id)}`;
  const fullPath = (fs, dir) => (!dir ? fs : fs.endsWith('/') ? fs + dir : `${fs}/${dir}`);
  const baseName = (p) => p.split('/').filter(Boolean).pop() || p;

  function myFilespacesPage(sec, v) {
    const t = table('my-filespaces-table', 'Your filespaces', ['Filespace', 'Last completed backup', 'Result',
      ['Bytes stored', 'num'], ['Objects', 'num'], 'Latest backup']);
    sec.append(heading('My files'),
      h('p', { class: 'muted', text: 'Choose a filespace to browse the files backed up from this node and download them.' }),
      t.el);
    poll(v, 0, async () => {
      let fss;
      try { fss = await api('/api/my/filespaces'); } catch (e) { t.set([], 'Could not list the filespaces.'); throw e; }
      if (!v.alive) return;
      t.set((fss || []).map((f) => {
        const c = f.last_completed;
        const b = f.last_backup;
        // The latest run matters when it is not the completed one (it failed or is running).
        const latest = b && !(c && b.started === c.started)
          ? [timeEl(b.started), ' ', badge(b.result)] : h('span', { class: 'muted', text: b ? 'same' : 'never' });
        return h('tr', { 'data-filespace': f.name },
          rowHead(h('a', { href: filesHref(f.name, ''), text: f.name })),
          td(c ? timeEl(c.ended) : 'never'), td(c ? badge(c.result) : '–'),
          td(c ? fmtBytes(c.bytes) : '–', 'num'), td(c ? fmtCount(c.objects) : '–', 'num'),
          td(latest));
      }), 'This node has no filespaces yet: nothing has been backed up.');
    });
  }

  function breadcrumb(fs, dir) {
    const parts = dir ? dir.split('/').filter(Boolean) : [];
    const items = [[fs, '']];
    parts.forEach((p, i) => items.push([p, parts.slice(0, i + 1).join('/')]));
    return h('nav', { 'aria-label': 'Breadcrumb', class: 'breadcrumb' }, h('ol', null, items.map(([text, d], i) => h('li', null,
      i ? h('span', { class: 'sep', 'aria-hidden': 'true', text: '›' }) : null,
      h('a', { href: filesHref(fs, d), text, 'aria-current': i === items.length - 1 ? 'page' : null })))));
  }

  function entryAction(fs, e) {
    if (e.type === 'directory') {
      return h('a', { href: tarHref(fs, e.path), download: `${e.name}.tar`, 'data-tar': e.path,
        'aria-label': `Download ${e.name} as tar`, text: 'Download as tar' });
    }
    if (e.type !== 'file') return h('span', { class: 'muted', text: '–' });
    if (e.encrypted) return h('span', { class: 'badge neutral', text: 'encrypted: restore with qsm' });
    return h('a', { href: downloadHref(e.object), download: e.name, 'data-download': e.object,
      'aria-label': `Download ${e.name}`, text: 'Download' });
  }

  function filesPage(sec, v, { fs, dir }) {
    const here = fullPath(fs, dir);
    const encNote = h('p', { id: 'files-encrypted', class: 'note warn', hidden: true },
      'This node\'s data is encrypted on the client: the server cannot read it. Restore it with ',
      h('code', { text: 'qsm restore' }), '.');
    const truncNote = h('p', { id: 'files-truncated', class: 'note', hidden: true });
    const tarNote = h('span', { class: 'muted small', hidden: true,
      text: 'The server refuses it while files here are encrypted.' });
    const t = table('files-table', `Contents of ${here}`, ['Name', 'Type', ['Size', 'num'], 'Modified', 'Action']);
    sec.append(
      h('p', null, h('a', { href: '#/files', text: '← All filespaces' })),
      breadcrumb(fs, dir),
      heading(`Files in ${here}`),
      encNote,
      h('p', { class: 'toolbar' },
        h('a', { id: 'download-tar', class: 'button-link', href: tarHref(fs, dir),
          download: `${baseName(dir || fs) || 'filespace'}.tar`, text: 'Download this directory as tar' }),
        tarNote),
      truncNote,
      t.el);
    poll(v, 0, async () => {
      let r;
      try {
        r = await api(`/api/my/files?filespace=${enc(fs)}&dir=${enc(dir)}`);
      } catch (e) {
        t.set([], 'Could not list this directory.');
        throw e;
      }
      if (!v.alive) return;
      const entries = (r && r.entries) || [];
      const encrypted = entries.some((e) => e.encrypted);
      encNote.hidden = !encrypted;
      tarNote.hidden = !encrypted;
      truncNote.hidden = !(r && r.truncated);
      truncNote.textContent = `Only the first ${fmtCount(entries.length)} entries of this directory are shown.`;
      t.set(entries.map((e) => {
        const path = e.path || (dir ? `${dir}/${e.name}` : e.name);
        const x = { ...e, path };
        const name = e.type === 'directory'
          ? h('a', { href: filesHref(fs, path), text: e.name })
          : h('span', { text: e.name });
        return h('tr', { 'data-path': path },
          rowHead([name, e.type === 'symlink' && e.link_target != null
            ? h('span', { class: 'muted', text: ` → ${e.link_target}` }) : null]),
          td(e.type),
          td(e.type === 'file' || e.type === 'hard link' ? fmtBytes(e.size) : '–', 'num'),
          td(timeEl(e.mtime)),
          td(entryAction(fs, x)));
      }), 'This directory is empty.');
    });
  }

  // "fs" and "dir" from the query part of the hash; a missing fs means the filespace list.
  function filesRoute(raw) {
    const q = raw.indexOf('?');
    const params = new Map();
    if (q >= 0) {
      for (const part of raw.slice(q + 1).split('&')) {
        if (!part) continue;
        const i = part.indexOf('=');
        const dec = (x) => { try { return decodeURIComponent(x); } catch (_) { return x; } };
        params.set(dec(i < 0 ? part : part.slice(0, i)), dec(i < 0 ? '' : part.slice(i + 1)));
      }
    }
    return {
      path: q < 0 ? raw : raw.slice(0, q),
      fs: params.get('fs') || '',
      dir: (params.get('dir') || '').replace(/^\/+|\/+$/g, ''),
    };
  }

  // ---------------------------------------------------------------- routing and login
  const PAGES = {
    overview: overviewPage, activity: activityPage, nodes: nodesPage, node: nodePage,
    events: eventsPage, actlog: actlogPage, storage: storagePage, policy: policyPage,
  };
  let me = null;

  const isNode = (who) => !!who && who.admin === false;

  // A node session has one page; every other hash becomes #/files.
  function nodeRoute(byUser) {
    const r = filesRoute(location.hash.slice(1) || '/');
    if (r.path !== '/files') history.replaceState(null, '', '#/files');
    view = { alive: true, timers: [], cleanups: [] };
    const sec = h('section', { id: 'page-files' });
    $('#app').replaceChildren(sec);
    if (r.path === '/files' && r.fs) filesPage(sec, view, r);
    else myFilespacesPage(sec, view);
    if (byUser) { const h1 = $('h1', sec); if (h1) h1.focus(); }
  }

  function route(byUser) {
    if (!me) return;
    leaveView();
    clearMsg();
    if (isNode(me)) { nodeRoute(byUser); return; }
    const m = (location.hash.slice(1) || '/').match(/^\/([a-z]*)(?:\/(.+))?$/) || [];
    let page = m[1] || 'overview';
    let arg = null;
    if (page === 'nodes' && m[2]) {
      page = 'node';
      try { arg = decodeURIComponent(m[2]); } catch (_) { arg = m[2]; }
    }
    if (!PAGES[page]) page = 'overview';
    const navTarget = page === 'node' ? 'nodes' : page;
    for (const a of document.querySelectorAll('#nav a')) {
      if ((a.getAttribute('href').slice(2) || 'overview') === navTarget) a.setAttribute('aria-current', 'page');
      else a.removeAttribute('aria-current');
    }
    view = { alive: true, timers: [], cleanups: [] };
    const sec = h('section', { id: `page-${page}` });
    $('#app').replaceChildren(sec);
    PAGES[page](sec, view, arg);
    // Tell screen readers where they landed; not on first load, where focus is the page's.
    if (byUser) { const h1 = $('h1', sec); if (h1) h1.focus(); }
  }

  function showApp(who, byUser) {
    me = who;
    $('#login-view').hidden = true;
    $('#whoami').textContent = who.account;
    $('#role').hidden = !who.admin;
    $('#role-node').hidden = !isNode(who);
    $('#nav').hidden = isNode(who);
    $('#account').hidden = false;
    $('#app').hidden = false;
    route(byUser);
  }

  function showLogin(reason) {
    leaveView();
    me = null;
    samples = [];
    prevPoll = null;
    clearMsg();
    $('#app').replaceChildren();
    $('#app').hidden = true;
    $('#nav').hidden = true;
    $('#account').hidden = true;
    $('#login-view').hidden = false;
    $('#login-error').textContent = reason || '';
    $('#login-name').focus();
  }

  $('#login-form').addEventListener('submit', async (e) => {
    e.preventDefault();
    const btn = $('#login-submit');
    const err = $('#login-error');
    const name = $('#login-name').value.trim();
    const asNode = $('#login-node').checked;
    err.textContent = '';
    btn.disabled = true;
    try {
      const who = await api('/api/login', {
        method: 'POST', quiet401: true,
        body: { name, password: $('#login-password').value, node: asNode, cookie: true },
      });
      $('#login-password').value = '';
      showApp(who && who.account ? who : { account: name, admin: !asNode }, true);
    } catch (x) {
      err.textContent = x.message;
      $('#login-password').select();
    } finally {
      btn.disabled = false;
    }
  });

  $('#logout').addEventListener('click', async () => {
    try {
      await api('/api/logout', { method: 'POST', quiet401: true });
    } catch (e) {
      if (e.status !== 401) { fail(e); return; }
    }
    showLogin('You are logged out.');
  });

  // The skip link's "#app" would otherwise be taken for a route.
  $('#skip').addEventListener('click', (e) => {
    e.preventDefault();
    const target = me ? $('#app') : $('#login-name');
    target.focus();
  });

  window.addEventListener('hashchange', () => route(true));

  (async () => {
    try {
      showApp(await api('/api/whoami', { quiet401: true }));
    } catch (e) {
      showLogin(e.status === 401 ? '' : e.message);
    }
  })();
})();
