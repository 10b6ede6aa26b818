// A stand-in, inside the page, for account routes this gateway does not serve (their parts are
// not built in): tests/dashboard/browser.py installs it before the page's own script runs (through
// the DevTools protocol, so the page's CSP does not apply to it) to check those routes' panels
// against the API's documented shapes, then takes it away. It answers only for the parts named in
// FAKE (set by the test), says in /v1/usage that they are on, and leaves every other call alone.
(() => {
  const FAKE = new Set(FAKE_PARTS);
  const realFetch = window.fetch.bind(window);
  const now = () => new Date().toISOString().replace(/\.\d{3}Z$/, 'Z');
  const store = {
    webhooks: [],
    audit: [
      { id: '2', at: '2026-11-24T10:02:00Z', key_id: 'server', action: 'override.set', target: 'partner-inbox.example', detail: 'allow' },
      { id: '1', at: '2026-11-24T10:01:00Z', key_id: 'server', action: 'key.created', target: 'key_5f2c0a9e1b7d', detail: '' },
    ],
  };
  window.drgFake = store;
  const json = (status, body) => new Response(JSON.stringify(body), { status, headers: { 'Content-Type': 'application/json' } });
  const notFound = () => json(404, { error: 'not_found', message: 'No such webhook.', detail: null });

  function webhooks(path, method, init) {
    if (path === '/v1/webhooks' && method === 'GET') return json(200, { items: store.webhooks });
    if (path === '/v1/webhooks' && method === 'POST') {
      const body = JSON.parse(init.body);
      const hook = { id: `wh_${store.webhooks.length + 1}`, url: body.url, events: body.events, created_at: now() };
      store.webhooks.push(hook);
      return json(201, { ...hook, secret: `whsec_${Math.random().toString(36).slice(2)}` });
    }
    const id = decodeURIComponent(path.slice('/v1/webhooks/'.length));
    if (method !== 'DELETE' || !store.webhooks.some((w) => w.id === id)) return notFound();
    store.webhooks = store.webhooks.filter((w) => w.id !== id);
    return new Response(null, { status: 204 });
  }

  window.fetch = async (input, init = {}) => {
    const path = new URL(typeof input === 'string' ? input : input.url, window.location.href).pathname;
    const method = (init.method || 'GET').toUpperCase();
    if (path === '/v1/usage') {
      const res = await realFetch(input, init);
      if (!res.ok) return res;
      const body = await res.json();
      for (const part of FAKE) body.features[part] = true;
      return json(res.status, body);
    }
    if (FAKE.has('webhooks') && (path === '/v1/webhooks' || path.startsWith('/v1/webhooks/'))) return webhooks(path, method, init);
    if (FAKE.has('audit') && path === '/v1/audit') return json(200, { items: store.audit, next_cursor: null });
    return realFetch(input, init);
  };
})();
