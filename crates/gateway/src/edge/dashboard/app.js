// The dashboard of domain-risk-gateway: one page, same-origin fetch() with the key typed in.
// Everything the API answers is treated as hostile: it only ever reaches the page through
// textContent and attributes, never as markup. The page is served under a strict CSP, so no
// inline style either: sizes are SVG attributes, looks are classes in app.css.
'use strict';

const KEY_NAME = 'drg.key';
const CALLS_PER_PAGE = 20;
const OVERRIDES_PER_PAGE = 50;
const AUDIT_PER_PAGE = 20;
const SVG_NS = 'http://www.w3.org/2000/svg';
const CHART_W = 600;
const CHART_H = 200;
const CHART_HINT = 'Point at a day, or focus the chart and use the arrow keys, to read its values.';
const INVALID_KEY_TEXT = 'This key is not valid (or was revoked). Sign in with a valid key.';
const BROWSER_KEY_TEXT = 'This is a browser key: it may only look up domains from its own sites. ' +
  'Sign in with a server key (one without origins) to see usage, calls and keys.';
// The characters the gateway accepts in a bearer token; anything else would make fetch() throw.
const TOKEN_RE = /^[A-Za-z0-9\-._~+/=]{1,256}$/;

// What the page remembers between calls. `session` changes on every sign-in and sign-out, so an
// answer that arrives for an older session is dropped instead of drawn. `features` is what
// /v1/usage says this gateway has on; `pages` the position of each list read by cursor.
const state = { session: 0, features: {}, pages: {}, chartDays: [], chartActive: -1 };

/* ---------- small DOM helpers ---------- */
const $ = (id) => document.getElementById(id);

function el(tag, className, text) {
  const node = document.createElement(tag);
  if (className) node.className = className;
  if (text !== undefined) node.textContent = text;
  return node;
}

function setAttrs(node, attrs) {
  for (const [name, value] of Object.entries(attrs)) node.setAttribute(name, String(value));
  return node;
}

const svgEl = (tag, attrs) => setAttrs(document.createElementNS(SVG_NS, tag), attrs);

const isObj = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const text = (v, fallback = '–') => (v === null || v === undefined || v === '' ? fallback : String(v));
// Counts from the API should be non-negative integers; anything else is shown as 0.
const count = (v) => (Number.isFinite(v) && v >= 0 ? Math.floor(v) : 0);

// An RFC 3339 value as "YYYY-MM-DD HH:MM:SS" (UTC); what is not a time is shown as it came.
function utcText(iso) {
  const t = new Date(iso);
  return Number.isNaN(t.getTime()) ? String(iso) : t.toISOString().slice(0, 19).replace('T', ' ');
}

// A <time> element for an RFC 3339 value, shown as "YYYY-MM-DD HH:MM:SS" in UTC.
function timeCell(iso, fallback) {
  if (typeof iso !== 'string' || iso === '') return document.createTextNode(fallback);
  const node = el('time', '', utcText(iso));
  node.setAttribute('datetime', iso);
  return node;
}

// A button that acts on one row: what it acts on is in its data attributes, and its label says
// which row (several "Remove" buttons must not sound alike to a screen reader).
function rowButton(className, label, ariaLabel, data) {
  const button = el('button', className, label);
  button.type = 'button';
  button.setAttribute('aria-label', ariaLabel);
  Object.assign(button.dataset, data);
  return button;
}

// The domain of what was typed: of an email address only its domain (a local part never leaves
// the page).
function domainOf(value) {
  const name = value.trim();
  return name.includes('@') ? name.slice(name.lastIndexOf('@') + 1) : name;
}

function panelError(panelId, message) {
  $(panelId).querySelector('.panel-error').textContent = message;
}

// A table row of cells {text} or {node}, each with an optional className.
function row(cells, className) {
  const tr = el('tr', className);
  for (const cell of cells) {
    const td = el('td', cell.className);
    td.append(cell.node || text(cell.text));
    tr.append(td);
  }
  return tr;
}

/* ---------- the key (sessionStorage only) ---------- */
// Storage may be disabled (privacy settings): reading then finds nothing, storing throws and
// the caller says so.
function getKey() {
  try { return sessionStorage.getItem(KEY_NAME); } catch { return null; }
}

function forgetKey(everything) {
  try { if (everything) sessionStorage.clear(); else sessionStorage.removeItem(KEY_NAME); } catch { /* nothing stored */ }
}

/* ---------- the API ---------- */
class ApiError extends Error {
  constructor(status, code, message) { super(message); this.status = status; this.code = code; }
}

// "Retry after 3 seconds", "Retry after 12 minutes", ... from a Retry-After of whole seconds.
function retryText(header) {
  const s = Number.parseInt(header || '', 10);
  if (!(s >= 0)) return '';
  const [n, unit] = s <= 90 ? [s, 'second'] : s <= 5400 ? [Math.ceil(s / 60), 'minute']
    : s <= 172800 ? [Math.ceil(s / 3600), 'hour'] : [Math.ceil(s / 86400), 'day'];
  return ` Retry after ${n} ${unit}${n === 1 ? '' : 's'}.`;
}

// The error body {error, message, detail} as a sentence for people.
function errorText(res, body, method, path) {
  if (res.status === 401) return INVALID_KEY_TEXT;
  let said = typeof body.message === 'string' && body.message ? body.message : `The gateway answered with status ${res.status}.`;
  if (typeof body.detail === 'string' && body.detail) said += ` (${body.detail})`;
  // A 403 on anything but a revocation or a rotation is the key's origins; on those it is an
  // operator key.
  if (res.status === 403 && method !== 'DELETE' && !path.endsWith('/rotate')) return BROWSER_KEY_TEXT + (typeof body.detail === 'string' && body.detail ? ` (${body.detail})` : '');
  if (res.status === 429) return said + retryText(res.headers.get('Retry-After'));
  return said;
}

// `off`: what a 404 means on an account route (that feature is turned off on this gateway).
async function api(path, { method = 'GET', json, off } = {}) {
  const session = state.session;
  const key = getKey();
  if (!key) throw new ApiError(401, 'unauthorized', INVALID_KEY_TEXT);
  const headers = { Authorization: `Bearer ${key}`, Accept: 'application/json' };
  const init = { method, headers, cache: 'no-store', credentials: 'omit' };
  if (json !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(json);
  }
  let res;
  let body = null;
  try {
    res = await fetch(path, init);
    const raw = res.status === 204 ? '' : await res.text();
    if (raw) body = JSON.parse(raw);
  } catch {
    if (!res) throw new ApiError(0, 'network', 'The gateway could not be reached. Check the connection and try again.');
    body = null; // not JSON: handled below
  }
  if (session !== state.session) throw new ApiError(0, 'stale', '');
  if (res.status === 404 && off) throw new ApiError(404, 'not_found', off);
  if (!res.ok) throw new ApiError(res.status, isObj(body) ? String(body.error) : '', errorText(res, isObj(body) ? body : {}, method, path));
  if (res.status !== 204 && !isObj(body)) throw new ApiError(res.status, 'bad_answer', 'The gateway answered something this page cannot read.');
  return body;
}

function badShape(what) {
  return new ApiError(200, 'bad_answer', `The gateway's answer has no ${what}; this page cannot show it.`);
}

// Runs one panel's call: busy state and "Loading…" while in flight, its error in its own alert.
// Never rejects, so callers may fire and forget; a 401 anywhere ends the session.
async function runPanel(panelId, work) {
  const section = $(panelId);
  const loading = section.querySelector('.loading');
  const errorBox = section.querySelector('.panel-error');
  section.setAttribute('aria-busy', 'true');
  loading.hidden = false;
  errorBox.textContent = '';
  try {
    await work();
  } catch (e) {
    if (e instanceof ApiError && e.code === 'stale') return;
    if (e instanceof ApiError && e.status === 401) { signOut(INVALID_KEY_TEXT); return; }
    errorBox.textContent = e instanceof ApiError ? e.message : 'Something went wrong while showing this answer.';
  } finally {
    section.setAttribute('aria-busy', 'false');
    loading.hidden = true;
  }
}

/* ---------- what is on ---------- */
// The optional parts this gateway has on (`features` of /v1/usage). A part that is off is neither
// shown nor asked for: its routes would answer 404, which the browser logs as a failed call.
const on = (feature) => isObj(state.features) && state.features[feature] === true;

function showFeatures() {
  for (const section of document.querySelectorAll('[data-feature]')) section.hidden = !on(section.dataset.feature);
}

/* ---------- lists read page by page (calls, overrides, audit) ---------- */
function setPager(name, busy = false) {
  const p = state.pages[name] || { page: 1, next: null };
  $(`${name}-next`).disabled = busy || !p.next;
  $(`${name}-first`).disabled = busy || p.page <= 1;
}

// Page `page` of list `name` from `path`, `cursor` being the previous page's next_cursor ('' for
// the first page), drawn by `render(data, page)`.
function loadPage(name, path, limit, cursor, page, render, off) {
  setPager(name, true); // no second click while a page is on its way
  const query = `limit=${limit}${cursor ? `&cursor=${encodeURIComponent(cursor)}` : ''}`;
  return runPanel(`panel-${name}`, async () => {
    const data = await api(`${path}?${query}`, { off });
    render(data, page);
    state.pages[name] = { page, next: typeof data.next_cursor === 'string' && data.next_cursor ? data.next_cursor : null };
    $(`${name}-page`).textContent = `Page ${page}`;
  }).finally(() => setPager(name));
}

function wirePager(name, load) {
  $(`${name}-next`).addEventListener('click', () => {
    const p = state.pages[name];
    if (p && p.next) void load(p.next, p.page + 1);
  });
  $(`${name}-first`).addEventListener('click', () => void load('', 1));
}

// A change through the API is written to the audit trail: show it there.
function afterChange() {
  if (on('audit')) void loadAudit('', 1);
}

// A panel's form sent: `problem` (what is missing, said instead of calling), else `call()` with
// the button disabled; once it answered, the form is emptied, `reload(answer)` reads the panel's
// list again and `said(answer)` goes to its status line.
async function submitPanel({ panel, button, form, status, problem, call, reload, said }) {
  $(status).textContent = '';
  if (problem) {
    panelError(panel, problem);
    return;
  }
  $(button).disabled = true;
  let answer = null;
  await runPanel(panel, async () => { answer = await call(); });
  $(button).disabled = false;
  if (!isObj(answer)) return;
  $(form).reset();
  await reload(answer);
  $(status).textContent = said(answer);
  afterChange();
}

// A row's thing removed once `question` is confirmed: `path` deleted, the list read again by
// `reload()`, and `said` in the panel's status line.
async function removeConfirmed({ question, panel, status, path, reload, said }) {
  if (!window.confirm(question)) return;
  $(status).textContent = '';
  let removed = false;
  await runPanel(panel, async () => {
    await api(path, { method: 'DELETE' });
    removed = true;
  });
  if (!removed) return;
  await reload();
  $(status).textContent = said;
  afterChange();
}

/* ---------- month (usage) ---------- */
function renderUsage(u) {
  if (!isObj(u)) throw badShape('usage');
  const used = count(u.month_count ?? u.used);
  const limit = count(u.monthly_limit ?? u.limit);
  // A limit of 0 lets nothing through: the month is used up from the start.
  const percent = limit > 0 ? Math.floor((used * 100) / limit) : 100;
  const level = percent >= 100 ? 'over' : percent >= 80 ? 'warn' : 'ok';
  $('usage-plan').textContent = text(u.plan);
  $('usage-text').textContent = `${used} / ${limit} calls`;
  const reset = $('usage-reset');
  reset.replaceChildren(timeCell(u.reset_at, '–'));
  if (typeof u.reset_at === 'string') reset.append(' UTC');

  setAttrs($('usage-fill'), { class: level, width: Math.min(percent, 100), 'data-percent': percent });
  setAttrs($('usage-meter'), {
    'aria-valuemax': limit, 'aria-valuenow': Math.min(used, limit), 'aria-valuetext': `${used} of ${limit} calls (${percent}%)`,
  });
  // Said in words too, so the state never depends on the bar's colour.
  const words = { ok: '', warn: ': nearing the limit', over: ': limit reached' }[level];
  $('usage-percent').textContent = `${percent}% used${words}`;
}

const loadUsage = () => runPanel('panel-usage', async () => renderUsage(await api('/v1/usage')));

/* ---------- calls per day (chart) ---------- */
function renderChart(data) {
  if (!isObj(data) || !Array.isArray(data.chart)) throw badShape('chart');
  const days = data.chart.filter(isObj).map((d) => ({
    date: text(d.date, '?'), calls: count(d.total_requests), blocked: count(d.blocked_count),
  }));
  state.chartDays = days;
  state.chartActive = -1;
  const chart = $('chart');
  chart.replaceChildren();
  const slot = CHART_W / Math.max(days.length, 1);
  const max = Math.max(1, ...days.map((d) => d.calls), ...days.map((d) => d.blocked));
  const scale = (v) => (v / max) * (CHART_H - 10);
  // The day under the pointer or focus is shaded by this rect (moved, never re-created).
  chart.append(svgEl('rect', { id: 'chart-focus', class: 'day-focus is-hidden', x: 0, y: 0, width: slot, height: CHART_H }));
  days.forEach((d, i) => {
    chart.append(bar('bar-calls', d, d.calls, `${d.date}: ${d.calls} calls`, i * slot + slot * 0.1, slot * 0.8, scale(d.calls)));
    chart.append(bar('bar-blocked', d, d.blocked, `${d.date}: ${d.blocked} blocked`, i * slot + slot * 0.3, slot * 0.4, scale(d.blocked)));
  });
  chart.append(svgEl('line', { class: 'axis', x1: 0, x2: CHART_W, y1: CHART_H - 0.5, y2: CHART_H - 0.5 }));

  const total = days.reduce((s, d) => s + d.calls, 0);
  const blocked = days.reduce((s, d) => s + d.blocked, 0);
  $('chart-totals').textContent = `${total} calls, ${blocked} blocked in 30 days`;
  $('chart-from').textContent = days.length ? days[0].date : '';
  $('chart-max').textContent = `tallest bar: ${max}`;
  $('chart-to').textContent = days.length ? days[days.length - 1].date : '';
  $('chart-table').tBodies[0].replaceChildren(...days.map((d) => row([{ text: d.date }, { text: d.calls }, { text: d.blocked }])));
  hideDay();
}

function bar(className, day, value, title, x, width, height) {
  const rect = svgEl('rect', { class: className, x, width, y: CHART_H - height, height, 'data-day': day.date, 'data-value': value });
  rect.append(svgEl('title', {}));
  rect.firstChild.textContent = title; // the browser's own hover label
  return rect;
}

function showDay(i) {
  const days = state.chartDays;
  if (!days.length) return;
  const index = Math.max(0, Math.min(days.length - 1, i));
  state.chartActive = index;
  const d = days[index];
  $('chart-focus')?.setAttribute('x', String(index * (CHART_W / days.length)));
  $('chart-focus')?.classList.remove('is-hidden');
  $('chart-tip').textContent = `${d.date}: ${d.calls} calls, ${d.blocked} blocked`;
}

function hideDay() {
  $('chart-focus')?.classList.add('is-hidden');
  $('chart-tip').textContent = CHART_HINT;
}

// The day under the pointer, in the chart's own coordinates (whatever size it is drawn at).
function dayAt(event) {
  const chart = $('chart');
  const ctm = chart.getScreenCTM();
  if (!ctm || !state.chartDays.length) return -1;
  const p = new DOMPoint(event.clientX, event.clientY).matrixTransform(ctm.inverse());
  return Math.floor(p.x / (CHART_W / state.chartDays.length));
}

function wireChart() {
  const chart = $('chart');
  const point = (e) => {
    const i = dayAt(e);
    if (i >= 0 && i < state.chartDays.length) showDay(i);
  };
  chart.addEventListener('pointermove', point);
  chart.addEventListener('pointerdown', point); // a tap on a touch screen
  // A touch "leaves" as soon as the finger lifts: keep its day up until the next tap.
  chart.addEventListener('pointerleave', (e) => {
    if (e.pointerType === 'mouse' && document.activeElement !== chart) hideDay();
  });
  chart.addEventListener('focus', () => showDay(state.chartActive >= 0 ? state.chartActive : state.chartDays.length - 1));
  chart.addEventListener('blur', hideDay);
  chart.addEventListener('keydown', (e) => {
    const last = state.chartDays.length - 1;
    const moves = { ArrowLeft: state.chartActive - 1, ArrowRight: state.chartActive + 1, Home: 0, End: last };
    if (!(e.key in moves) || last < 0) return;
    e.preventDefault();
    showDay(moves[e.key]);
  });
}

const loadChart = () => runPanel('panel-chart', async () =>
  renderChart(await api('/v1/stats', { off: 'Call logs and stats are turned off on this gateway.' })));

/* ---------- recent calls ---------- */
const REASONS = { safe: 'Safe', disposable: 'Disposable', undeliverable: 'Undeliverable', role_account: 'Role account' };
const reasonText = (r) => REASONS[r] || text(r);

function renderCalls(data, page) {
  if (!isObj(data) || !Array.isArray(data.items)) throw badShape('list of calls');
  const rows = data.items.filter(isObj).map((c) => row([
    { node: timeCell(c.created_at, '–') },
    { text: c.email_domain, className: 'domain' },
    { text: reasonText(c.reason), className: `reason reason-${REASONS[c.reason] ? c.reason : 'other'}` },
    { text: c.risk_score, className: 'num' },
  ], 'call-row'));
  $('calls-table').tBodies[0].replaceChildren(...rows);
  $('calls-empty').textContent = page > 1 ? 'No older calls.' : 'No calls recorded yet (answered lookups and checks show up here).';
  $('calls-empty').hidden = rows.length > 0;
}

const loadCalls = (cursor, page) =>
  loadPage('calls', '/v1/logs', CALLS_PER_PAGE, cursor, page, renderCalls, 'Call logs are turned off on this gateway.');

/* ---------- verdict changes ---------- */
const CHANGES_SHOWN = 20;

function renderChanges(data) {
  if (!isObj(data) || !Array.isArray(data.changes)) throw badShape('list of changes');
  // Oldest first from the API: the newest are shown first.
  const rows = data.changes.filter(isObj).slice(-CHANGES_SHOWN).reverse().map((c) => row([
    { node: timeCell(c.changed_at, '–') },
    { text: c.domain, className: 'domain' },
    { text: `${reasonText(c.from)} (${text(c.score_from, '–')})`, className: `reason reason-${REASONS[c.from] ? c.from : 'other'}` },
    { text: `${reasonText(c.to)} (${text(c.score_to, '–')})`, className: `reason reason-${REASONS[c.to] ? c.to : 'other'}` },
    { text: text(c.rule, '–') },
  ], 'change-row'));
  $('changes-table').tBodies[0].replaceChildren(...rows);
  $('changes-empty').textContent = 'No looked-up domain changed verdict in the last 7 days.';
  $('changes-empty').hidden = rows.length > 0;
}

function loadChanges() {
  const since = new Date(Date.now() - 7 * 86400000).toISOString().replace(/\.\d{3}Z$/, 'Z');
  return runPanel('panel-changes', async () =>
    renderChanges(await api(`/v1/changes?limit=1000&since=${encodeURIComponent(since)}`, { off: 'Verdict changes are not watched on this gateway.' })));
}

/* ---------- secrets shown once (a new key, a new webhook) ---------- */
// `prefix` names the box: `${prefix}-result` holds `-id`, `-secret`, `-copy`, `-copy-status`.
function hideSecret(prefix) {
  for (const part of ['secret', 'id', 'note', 'previous', 'copy-status']) {
    const node = $(`${prefix}-${part}`);
    if (node) node.textContent = '';
  }
  $(`${prefix}-result`).hidden = true;
}

function revealSecret(prefix, id, secret) {
  $(`${prefix}-id`).textContent = text(id, '');
  $(`${prefix}-secret`).textContent = secret;
  $(`${prefix}-result`).hidden = false;
  $(`${prefix}-copy`).focus();
}

async function copySecret(prefix) {
  const status = $(`${prefix}-copy-status`);
  const secret = $(`${prefix}-secret`).textContent;
  if (!secret) return;
  try {
    if (!navigator.clipboard) throw new Error('no clipboard');
    await navigator.clipboard.writeText(secret);
    status.textContent = 'Copied to the clipboard.';
  } catch {
    // No clipboard access (permissions, older browser): select the text for a manual copy.
    window.getSelection().selectAllChildren($(`${prefix}-secret`));
    status.textContent = 'The secret is selected: press Ctrl+C (or ⌘C) to copy it.';
  }
}

/* ---------- keys ---------- */
// When the key stops working ("never"), said to be over when it is, and its successor if rotated.
function expiryCell(k) {
  const cell = el('span');
  cell.append(timeCell(k.expires_at, 'never'));
  if (typeof k.expires_at === 'string' && Date.parse(k.expires_at) <= Date.now()) cell.append(' (expired)');
  if (typeof k.rotated_to === 'string' && k.rotated_to) cell.append(el('span', 'hint block', `rotated to ${k.rotated_to}`));
  return cell;
}

function renderKeys(data) {
  if (!isObj(data) || !Array.isArray(data.items)) throw badShape('list of keys');
  const mine = getKey() || '';
  const rows = data.items.filter(isObj).map((k) => {
    const id = text(k.id, '');
    const origins = Array.isArray(k.origins) && k.origins.length ? k.origins.map(String).join(', ') : 'server key';
    // The prefix is the secret's first characters: it tells which row is the key in use.
    const isMine = typeof k.key_prefix === 'string' && k.key_prefix.length >= 8 && mine.startsWith(k.key_prefix);
    const source = typeof k.source === 'string' && k.source ? k.source : 'not reported';
    const actions = el('span', 'actions');
    actions.append(keyButton('key-rotate secondary', 'Rotate', id, source === 'operator'), keyButton('key-revoke danger', 'Revoke', id, source === 'operator'));
    const tr = row([
      { text: isMine ? `${id} (this key)` : id, className: 'mono' },
      { text: text(k.label, 'none') },
      { text: text(k.key_prefix, 'none'), className: 'mono' },
      { text: origins },
      { node: timeCell(k.created_at, 'unknown') },
      { node: timeCell(k.last_used_at, 'never') },
      { node: expiryCell(k) },
      { text: source },
      { node: actions },
    ], 'key-row');
    tr.setAttribute('data-key-id', id);
    return tr;
  });
  $('keys-table').tBodies[0].replaceChildren(...rows);
  if (!rows.length) $('keys-status').textContent = 'This project has no keys listed.';
}

function keyButton(className, label, id, operator) {
  const button = rowButton(className, label, `${label} key ${id}`, { keyId: id });
  // The API refuses operator keys (403); when the list says which they are, don't offer it.
  if (operator) Object.assign(button, { disabled: true, title: 'Keys of the operator\'s keys file are changed in that file.' });
  return button;
}

// The secret of a key just made stays up through the refresh that follows its creation only.
function loadKeys(keepSecret = false) {
  if (!keepSecret) hideSecret('new-key');
  $('keys-status').textContent = '';
  return runPanel('panel-keys', async () =>
    renderKeys(await api('/v1/keys', { off: 'The keys API is turned off on this gateway.' })));
}

const revokeKey = (id) => removeConfirmed({
  question: `Revoke key ${id}? Calls with it will get 401.`,
  panel: 'panel-keys',
  status: 'keys-status',
  path: `/v1/keys/${encodeURIComponent(id)}`,
  reload: () => loadKeys(),
  said: `Key ${id} was revoked.`,
});

// POSTs `body` to `path` (a new key, a rotation): the answer, with its secret, or null when the
// panel said what went wrong.
async function makeKey(path, body) {
  hideSecret('new-key');
  $('keys-status').textContent = '';
  let made = null;
  await runPanel('panel-keys', async () => {
    const answer = await api(path, { method: 'POST', json: body });
    if (typeof answer.key !== 'string' || !answer.key) throw badShape('secret');
    made = answer;
  });
  return made;
}

async function createKey(event) {
  event.preventDefault();
  const button = $('new-key-create');
  const label = $('new-key-label').value.trim();
  const origins = $('new-key-origins').value.split('\n').map((s) => s.trim()).filter(Boolean);
  const body = { label: label || null };
  if (origins.length) body.origins = origins;
  button.disabled = true;
  const made = await makeKey('/v1/keys', body);
  button.disabled = false;
  if (!made) return;
  revealSecret('new-key', made.id, made.key);
  const gotOrigins = Array.isArray(made.origins) && made.origins.length > 0;
  $('new-key-note').textContent = origins.length && !gotOrigins
    ? 'Note: the gateway made a server key (no origins): it does not set origins through this API. Ask the operator for a browser key.'
    : '';
  $('new-key-form').reset();
  await loadKeys(true);
  afterChange();
}

// A successor in the key's place (its secret shown once); the old key works until the overlap the
// gateway sets (`keys_api.rotate_overlap_hours`) is over.
async function rotateKey(id) {
  if (!window.confirm(`Rotate key ${id}? A new key takes its place; ${id} keeps working for an overlap, then gets 401.`)) return;
  const made = await makeKey(`/v1/keys/${encodeURIComponent(id)}/rotate`, {});
  if (!made) return;
  revealSecret('new-key', made.id, made.key);
  const previous = isObj(made.previous) ? made.previous : {};
  const until = typeof previous.expires_at === 'string' ? `until ${utcText(previous.expires_at)} UTC` : 'for now';
  $('new-key-previous').textContent = `It replaces key ${text(previous.id, id)}, which keeps working ${until}: switch your clients over before then.`;
  await loadKeys(true);
  afterChange();
}

/* ---------- overrides ---------- */
const OVERRIDE_VERDICTS = { allow: 'Allow (safe, 0)', block: 'Block (disposable, 100)' };

function renderOverrides(data, page) {
  if (!isObj(data) || !Array.isArray(data.items)) throw badShape('list of overrides');
  const rows = data.items.filter(isObj).map((o) => {
    const domain = text(o.domain, '');
    const tr = row([
      { text: domain, className: 'domain' },
      { text: OVERRIDE_VERDICTS[o.verdict] || text(o.verdict), className: o.verdict === 'block' ? 'reason-disposable' : '' },
      { text: text(o.note, 'none') },
      { text: o.set_by, className: 'mono' },
      { node: timeCell(o.set_at, '–') },
      { node: rowButton('override-remove danger', 'Remove', `Remove the override of ${domain}`, { domain }) },
    ], 'override-row');
    tr.setAttribute('data-domain', domain);
    return tr;
  });
  $('overrides-table').tBodies[0].replaceChildren(...rows);
  $('overrides-empty').textContent = page > 1 ? 'No more overrides.' : 'No overrides: every lookup answers from the lists.';
  $('overrides-empty').hidden = rows.length > 0;
}

const loadOverrides = (cursor, page) =>
  loadPage('overrides', '/v1/overrides', OVERRIDES_PER_PAGE, cursor, page, renderOverrides, 'Overrides are turned off on this gateway.');

function setOverride(event) {
  event.preventDefault();
  const domain = domainOf($('override-domain').value);
  const verdict = $('override-verdict').value === 'block' ? 'block' : 'allow';
  return submitPanel({
    panel: 'panel-overrides',
    button: 'override-set',
    form: 'override-form',
    status: 'overrides-status',
    problem: domain ? '' : 'Type the domain to set an override for.',
    call: () => api(`/v1/overrides/${encodeURIComponent(domain)}`, { method: 'PUT', json: { verdict, note: $('override-note').value.trim() } }),
    reload: () => loadOverrides('', 1),
    said: (set) => `${text(set.domain, domain)} now answers ${verdict === 'block' ? 'disposable (100)' : 'safe (0)'} for this project.`,
  });
}

const removeOverride = (domain) => removeConfirmed({
  question: `Remove the override of ${domain}? Its lookups answer from the lists again.`,
  panel: 'panel-overrides',
  status: 'overrides-status',
  path: `/v1/overrides/${encodeURIComponent(domain)}`,
  reload: () => loadOverrides('', 1),
  said: `The override of ${domain} was removed.`,
});

/* ---------- reports ---------- */
const REPORT_STATES = { open: 'Open: waiting for the operator', accepted: 'Accepted', rejected: 'Rejected' };

function renderReports(data) {
  if (!isObj(data) || !Array.isArray(data.items)) throw badShape('list of reports');
  const rows = data.items.filter(isObj).map((r) => {
    const tr = row([
      { node: timeCell(r.reported_at, '–') },
      { text: r.domain, className: 'domain' },
      { text: reasonText(r.verdict), className: `reason reason-${REASONS[r.verdict] ? r.verdict : 'other'}` },
      { text: text(r.note, 'none') },
      { text: REPORT_STATES[r.status] || text(r.status), className: `report-state state-${REPORT_STATES[r.status] ? r.status : 'other'}` },
      { node: timeCell(r.decided_at, 'not yet') },
    ], 'report-row');
    tr.setAttribute('data-report-id', text(r.id, ''));
    return tr;
  });
  $('reports-table').tBodies[0].replaceChildren(...rows);
  $('reports-empty').textContent = 'No reports sent yet.';
  $('reports-empty').hidden = rows.length > 0;
}

const loadReports = () => runPanel('panel-reports', async () =>
  renderReports(await api('/v1/reports', { off: 'Reports are turned off on this gateway.' })));

function sendReport(event) {
  event.preventDefault();
  const domain = domainOf($('report-domain').value);
  const verdict = $('report-verdict').value === 'disposable' ? 'disposable' : 'safe';
  return submitPanel({
    panel: 'panel-reports',
    button: 'report-send',
    form: 'report-form',
    status: 'reports-status',
    problem: domain ? '' : 'Type the domain whose verdict is wrong.',
    call: () => api('/v1/reports', { method: 'POST', json: { domain, verdict, note: $('report-note').value.trim() } }),
    reload: () => loadReports(),
    said: (sent) => `Report sent: the operator will see that ${text(sent.domain, domain)} should be ${verdict}.`,
  });
}

/* ---------- webhooks ---------- */
const WEBHOOK_EVENTS = { 'verdict.changed': 'verdict changes', 'quota.threshold': 'quota thresholds' };

function renderWebhooks(data) {
  if (!isObj(data) || !Array.isArray(data.items)) throw badShape('list of webhooks');
  const rows = data.items.filter(isObj).map((w) => {
    const id = text(w.id, '');
    const events = Array.isArray(w.events) ? w.events.map((e) => WEBHOOK_EVENTS[e] || String(e)).join(', ') : '–';
    const tr = row([
      { text: id, className: 'mono' },
      { text: w.url, className: 'mono' },
      { text: events || 'none' },
      { node: timeCell(w.created_at, 'unknown') },
      { node: rowButton('webhook-remove danger', 'Remove', `Remove webhook ${id}`, { webhookId: id, url: text(w.url, '') }) },
    ], 'webhook-row');
    tr.setAttribute('data-webhook-id', id);
    return tr;
  });
  $('webhooks-table').tBodies[0].replaceChildren(...rows);
  $('webhooks-empty').textContent = 'No webhooks: nothing is sent.';
  $('webhooks-empty').hidden = rows.length > 0;
}

// The secret of a webhook just made stays up through the refresh that follows only.
function loadWebhooks(keepSecret = false) {
  if (!keepSecret) hideSecret('webhook');
  return runPanel('panel-webhooks', async () =>
    renderWebhooks(await api('/v1/webhooks', { off: 'Webhooks are turned off on this gateway.' })));
}

function createWebhook(event) {
  event.preventDefault();
  const url = $('webhook-url').value.trim();
  const events = [...$('webhook-form').querySelectorAll('input[type=checkbox]:checked')].map((box) => box.value);
  hideSecret('webhook');
  return submitPanel({
    panel: 'panel-webhooks',
    button: 'webhook-create',
    form: 'webhook-form',
    status: 'webhooks-status',
    problem: !url ? 'Type the URL the events are sent to.' : events.length ? '' : 'Choose at least one event.',
    call: async () => {
      const made = await api('/v1/webhooks', { method: 'POST', json: { url, events } });
      if (typeof made.secret !== 'string' || !made.secret) throw badShape('secret');
      return made;
    },
    // The secret shown once, and kept up through this reload of the list only.
    reload: (made) => {
      revealSecret('webhook', made.id, made.secret);
      return loadWebhooks(true);
    },
    said: () => '',
  });
}

const removeWebhook = (id, url) => removeConfirmed({
  question: `Remove webhook ${id}? Events stop going to ${url}.`,
  panel: 'panel-webhooks',
  status: 'webhooks-status',
  path: `/v1/webhooks/${encodeURIComponent(id)}`,
  reload: () => loadWebhooks(),
  said: `Webhook ${id} was removed.`,
});

/* ---------- audit trail ---------- */
const ACTIONS = {
  'key.created': 'Key created', 'key.revoked': 'Key revoked', 'key.rotated': 'Key rotated',
  'override.set': 'Override set', 'override.removed': 'Override removed', 'report.sent': 'Report sent',
  'webhook.created': 'Webhook created', 'webhook.removed': 'Webhook removed',
};

function renderAudit(data, page) {
  if (!isObj(data) || !Array.isArray(data.items)) throw badShape('audit trail');
  const rows = data.items.filter(isObj).map((a) => {
    const tr = row([
      { node: timeCell(a.at, '–') },
      { text: a.key_id, className: 'mono' },
      { text: ACTIONS[a.action] || text(a.action) },
      { text: a.target, className: 'mono' },
      { text: text(a.detail, '') },
    ], 'audit-row');
    tr.setAttribute('data-action', text(a.action, ''));
    return tr;
  });
  $('audit-table').tBodies[0].replaceChildren(...rows);
  $('audit-empty').textContent = page > 1 ? 'No older entries.' : 'Nothing changed through the API yet.';
  $('audit-empty').hidden = rows.length > 0;
}

const loadAudit = (cursor, page) =>
  loadPage('audit', '/v1/audit', AUDIT_PER_PAGE, cursor, page, renderAudit, 'The audit trail is turned off on this gateway.');

/* ---------- lookup ---------- */
const KNOWN_EVIDENCE = new Set(['rule', 'matched', 'via_parent', 'source', 'line', 'mx', 'mx_provider', 'neighbourhood', 'service', 'did_you_mean', 'registered', 'age_days', 'young_domain', 'established']);

// The score bands of docs/api.md.
const BANDS = [[100, 'confirmed on a blocklist'], [80, 'very likely disposable'], [50, 'high risk'], [30, 'low risk'], [0, 'safe']];
const band = (score) => BANDS.find(([floor]) => score >= floor)[1];

// "list.txt, line 12", or '' when the evidence names no source.
function sourceText(ev) {
  if (typeof ev.source !== 'string' || !ev.source) return '';
  return Number.isInteger(ev.line) ? `${ev.source}, line ${ev.line}` : ev.source;
}

function ruleLine(ev) {
  const where = sourceText(ev);
  const via = ev.via_parent && ev.matched ? ` through its parent domain ${ev.matched}` : '';
  switch (ev.rule) {
    case 'relay': return `A privacy relay or masked-email service${ev.service ? ` (${ev.service})` : ''}: a real mailbox is behind it`;
    case 'allowlist': return `Allowlisted${via}${where ? ` (${where})` : ''}`;
    case 'record': return `Set by a record${ev.matched ? ` for ${ev.matched}` : ''}${where ? ` in ${where}` : ''}`;
    case 'free_provider': return `On the curated list of free mail providers${via}`;
    case 'blocklist': return `Listed as disposable by ${where || 'a blocklist'}${via}`;
    case 'broad_free_provider': return `On a broad list of free mail providers${where ? ` (${where})` : ''}${via}`;
    case 'mx': return 'No list names it: its mail servers (MX) decided';
    case 'mx_neighbourhood': return 'No list names it: its mail servers are shared with listed throwaway domains';
    case 'unknown': return 'No list names it and its mail servers show nothing against it (the default answer)';
    default: return `Rule: ${text(ev.rule)}`;
  }
}

function mxLines(mx) {
  if (!isObj(mx)) return [];
  const hosts = Array.isArray(mx.hosts) ? mx.hosts.filter(isObj) : [];
  switch (mx.status) {
    case 'hosts': return [`Mail servers: ${hosts.map((h) => `${text(h.host)} (preference ${text(h.preference)})`).join(', ') || 'listed'}`];
    case 'null_mx': return ['No mail server (undeliverable): the domain says it takes no mail (null MX)'];
    case 'no_mail_host': return ['No mail server (undeliverable): no MX record and no address'];
    case 'no_domain': return ['The domain does not exist (undeliverable)'];
    case 'address_only': return ['No MX record: mail would go to the domain\'s own address'];
    case 'unusable_hosts': return [`No mail server can take mail (undeliverable): ${hosts.map((h) => `${text(h.host)} (${text(h.problem).replace(/_/g, ' ')})`).join(', ')}`];
    case 'unknown': return ['DNS gave no clear answer (timeout or failure): nothing concluded from it'];
    default: return [`MX: ${text(mx.status)}`];
  }
}

function providerLine(p) {
  if (!isObj(p)) return [];
  const label = text(p.label);
  const host = text(p.host);
  const kinds = {
    disposable: `Mail server ${host} belongs to a disposable-mail service (${label})`,
    forwarder: `Mail is forwarded by ${label} (${host})`,
    mailbox: `Mail goes to ${label}, a business mailbox provider (${host})`,
    security_gateway: `Mail goes through ${label}, a mail security gateway (${host})`,
    consumer: `Mail server ${host} belongs to ${label}, a consumer mail provider`,
  };
  return [kinds[p.kind] || `Mail provider: ${label} (${text(p.kind)}) on ${host}`];
}

// When the domain was registered (RDAP), and what its youth did to the answer.
function ageLines(ev) {
  if (typeof ev.registered !== 'string' || !Number.isInteger(ev.age_days)) return [];
  const days = ev.age_days === 1 ? '1 day' : `${count(ev.age_days)} days`;
  const effect = ev.young_domain === 'raised' ? ': a young domain, so the score is raised (still safe)'
    : ev.established === true ? ': an established domain, so its mail servers\' neighbours alone do not flag it'
      : '';
  return [`Registered ${ev.registered}, ${days} ago${effect}`];
}

function neighbourhoodLines(n) {
  if (!isObj(n)) return [];
  const key = text(n.key);
  const subject = { host: `MX host ${key}`, parent: `The MX hosts' domain ${key}`, network: `The MX hosts' network ${key}` }[n.key_kind] || `${text(n.key_kind)} ${key}`;
  const unlisted = count(n.unlisted);
  const share = Number.isFinite(n.share) ? ` (${Math.round(n.share * 100)}% listed)` : '';
  const lines = [`${subject} is shared with ${count(n.listed)} listed throwaway domains${unlisted ? ` and ${unlisted} unlisted` : ''}${share} (mx_neighbourhood)`];
  const sources = Array.isArray(n.sources) ? n.sources.filter(isObj) : [];
  if (sources.length) lines.push(`Those neighbours are listed by ${sources.map((s) => `${text(s.source)} (${count(s.neighbours)})`).join(', ')}`);
  return lines;
}

// Anything the page does not know yet, shown as "key: value" rather than hidden.
function genericValue(v) {
  const s = typeof v === 'string' ? v : JSON.stringify(v);
  return s.length > 300 ? `${s.slice(0, 300)}…` : s;
}

function evidenceLines(ev) {
  if (!isObj(ev)) return ['The gateway gave no evidence for this answer.'];
  const lines = [ruleLine(ev), ...ageLines(ev), ...neighbourhoodLines(ev.neighbourhood), ...mxLines(ev.mx), ...providerLine(ev.mx_provider)];
  if (typeof ev.did_you_mean === 'string' && ev.did_you_mean) lines.push(`Did you mean ${ev.did_you_mean}?`);
  for (const [k, v] of Object.entries(ev)) {
    if (!KNOWN_EVIDENCE.has(k)) lines.push(`${k}: ${genericValue(v)}`);
  }
  return lines;
}

function renderLookup(rec) {
  if (!isObj(rec)) throw badShape('domain record');
  const yesNo = (v) => (v === true ? 'Yes' : v === false ? 'No' : text(v));
  const score = count(rec.risk_score);
  const facts = [
    ['Domain', text(rec.domain)],
    ['Risk score', `${score} / 100 (${band(score)})`],
    ['Reason', reasonText(rec.reason)],
    ['Free provider', yesNo(rec.is_free_provider)],
    ['Corporate email', yesNo(rec.is_corporate_email)],
    ['Mail provider', text(rec.mx_provider_label, 'none recognised')],
  ];
  const dl = el('dl', 'facts');
  for (const [name, value] of facts) {
    const pair = el('div');
    pair.append(el('dt', '', name), el('dd', '', value));
    dl.append(pair);
  }
  const list = el('ul', 'evidence');
  list.id = 'lookup-evidence';
  list.append(...evidenceLines(rec.evidence).map((line) => el('li', 'evidence-line', line)));
  $('lookup-result').replaceChildren(dl, el('h3', '', 'Why'), list);
}

async function lookup(event) {
  event.preventDefault();
  // Only the domain of an address is sent: a local part never leaves the page.
  const name = domainOf($('lookup-input').value);
  $('lookup-result').replaceChildren();
  if (!name) {
    panelError('panel-lookup', 'Type a domain (or an email address) to look up.');
    return;
  }
  const button = $('lookup-go');
  button.disabled = true;
  await runPanel('panel-lookup', async () => {
    renderLookup(await api(`/v1/public/domain/${encodeURIComponent(name)}?explain=true`));
  });
  button.disabled = false;
  // The lookup was counted (even a 422): bring the month up to date. /v1/usage is not counted.
  if (getKey()) await loadUsage();
}

/* ---------- top flagged domains ---------- */
function renderTop(data) {
  if (!isObj(data) || !Array.isArray(data.domains)) throw badShape('list of domains');
  const items = data.domains.filter(isObj).map((d) => {
    const li = el('li', 'top-item');
    li.append(el('span', 'domain', text(d.domain)), el('span', 'hint', ` — score ${count(d.risk_score)}, ${reasonText(d.reason).toLowerCase()}`));
    return li;
  });
  $('top-list').replaceChildren(...items);
  if (!items.length) $('top-list').append(el('li', 'top-item hint', 'No flagged domains yet.'));
}

const loadTop = () => runPanel('panel-top', async () => renderTop(await api('/v1/public/top-domains')));

/* ---------- views and session ---------- */
// Drops everything the last session showed (API data, a secret) before another key signs in.
const PAGED = ['calls', 'overrides', 'audit'];

function clearDashboard() {
  hideSecret('new-key');
  hideSecret('webhook');
  for (const id of ['calls-table', 'changes-table', 'keys-table', 'chart-table', 'overrides-table', 'reports-table', 'webhooks-table', 'audit-table']) $(id).tBodies[0].replaceChildren();
  for (const id of ['chart', 'top-list', 'lookup-result']) $(id).replaceChildren();
  for (const id of ['usage-plan', 'usage-text', 'usage-reset', 'usage-percent', 'chart-totals']) $(id).textContent = '–';
  for (const id of ['chart-from', 'chart-max', 'chart-to', 'keys-status', 'overrides-status', 'reports-status', 'webhooks-status']) $(id).textContent = '';
  for (const box of document.querySelectorAll('.panel-error')) box.textContent = '';
  for (const box of document.querySelectorAll('.panel .hint[id$="-empty"]')) box.hidden = true;
  for (const form of ['new-key-form', 'override-form', 'report-form', 'webhook-form']) $(form).reset();
  $('usage-fill').setAttribute('width', '0');
  $('lookup-input').value = '';
  state.features = {};
  showFeatures();
  state.pages = {};
  for (const name of PAGED) {
    setPager(name);
    $(`${name}-page`).textContent = 'Page 1';
  }
  state.chartDays = [];
  hideDay();
}

function showSignIn(message) {
  $('view-dashboard').hidden = true;
  $('session-actions').hidden = true;
  $('view-sign-in').hidden = false;
  $('sign-in-error').textContent = message || '';
  $('key-input').value = '';
  $('key-input').focus();
}

function signOut(message) {
  state.session += 1;
  forgetKey(true);
  clearDashboard();
  showSignIn(message);
}

// The panels of optional parts, each asked only when its part is on.
const OPTIONAL_PANELS = [
  ['logs', () => loadChart()],
  ['logs', () => loadCalls('', 1)],
  ['changes', () => loadChanges()],
  ['keys', () => loadKeys()],
  ['overrides', () => loadOverrides('', 1)],
  ['reports', () => loadReports()],
  ['webhooks', () => loadWebhooks()],
  ['audit', () => loadAudit('', 1)],
];

function loadOptionalPanels() {
  for (const [feature, load] of OPTIONAL_PANELS) if (on(feature)) void load();
}

// The month and what is on come from the sign-in check itself; every other panel is asked once,
// here.
function openDashboard(usage, moveFocus) {
  state.session += 1;
  clearDashboard();
  state.features = isObj(usage) && isObj(usage.features) ? usage.features : {};
  showFeatures();
  $('view-sign-in').hidden = true;
  $('view-dashboard').hidden = false;
  $('session-actions').hidden = false;
  if (moveFocus) $('main').focus();
  void runPanel('panel-usage', async () => renderUsage(usage));
  loadOptionalPanels();
  void loadTop();
}

async function verify(key, moveFocus) {
  try {
    sessionStorage.setItem(KEY_NAME, key); // sessionStorage only: never localStorage, cookies or the URL
  } catch {
    showSignIn('This browser does not allow session storage, which this page needs to hold the key.');
    return;
  }
  const button = $('sign-in');
  button.disabled = true;
  button.textContent = 'Signing in…';
  $('view-sign-in').setAttribute('aria-busy', 'true');
  $('sign-in-error').textContent = '';
  try {
    openDashboard(await api('/v1/usage'), moveFocus);
  } catch (e) {
    // Whatever went wrong (401, 403, 429, no network), no unverified key stays stored.
    forgetKey(false);
    showSignIn(e instanceof ApiError ? e.message : 'The gateway\'s answer could not be read.');
  } finally {
    button.disabled = false;
    button.textContent = 'Sign in';
    $('view-sign-in').setAttribute('aria-busy', 'false');
  }
}

function onSignIn(event) {
  event.preventDefault();
  const key = $('key-input').value.trim();
  if (!TOKEN_RE.test(key)) {
    $('sign-in-error').textContent = key ? 'That does not look like an API key (drg_ followed by letters and digits).' : 'Paste an API key first.';
    $('key-input').focus();
    return;
  }
  void verify(key, true);
}

function refreshAll() {
  if (!getKey()) { signOut(''); return; }
  void loadUsage();
  loadOptionalPanels();
}

// Rows are redrawn on every load: one listener on the table serves the buttons of every row.
function onRowButton(tableId, selector, act) {
  $(tableId).addEventListener('click', (e) => {
    const button = e.target instanceof Element ? e.target.closest(selector) : null;
    if (button && !button.disabled) void act(button);
  });
}

function init() {
  $('sign-in-form').addEventListener('submit', onSignIn);
  $('sign-out').addEventListener('click', () => signOut(''));
  $('refresh').addEventListener('click', refreshAll);
  wirePager('calls', loadCalls);
  wirePager('overrides', loadOverrides);
  wirePager('audit', loadAudit);
  $('new-key-form').addEventListener('submit', (e) => void createKey(e));
  $('new-key-copy').addEventListener('click', () => void copySecret('new-key'));
  onRowButton('keys-table', '.key-revoke', (b) => revokeKey(b.dataset.keyId));
  onRowButton('keys-table', '.key-rotate', (b) => rotateKey(b.dataset.keyId));
  $('override-form').addEventListener('submit', (e) => void setOverride(e));
  onRowButton('overrides-table', '.override-remove', (b) => removeOverride(b.dataset.domain));
  $('report-form').addEventListener('submit', (e) => void sendReport(e));
  $('webhook-form').addEventListener('submit', (e) => void createWebhook(e));
  $('webhook-copy').addEventListener('click', () => void copySecret('webhook'));
  onRowButton('webhooks-table', '.webhook-remove', (b) => removeWebhook(b.dataset.webhookId, b.dataset.url));
  $('lookup-form').addEventListener('submit', (e) => void lookup(e));
  $('new-key-origins').placeholder = 'https://app.example.com';
  $('webhook-url').placeholder = 'https://hooks.example.com/drg';
  wireChart();

  const key = getKey();
  if (key && TOKEN_RE.test(key)) void verify(key, false);
  else { forgetKey(false); showSignIn(''); }
}

if (document.readyState === 'loading') document.addEventListener('DOMContentLoaded', init);
else init();
