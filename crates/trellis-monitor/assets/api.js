/**
 * The monitor's JSON API client, the control token, the configuration and the error banner
 * (keyed so each source clears its own message).
 */
import { NET_DOWN, TOKEN_KEY } from './const.js';
import { h } from './util.js';

export const banner = (() => {
  const el = document.getElementById('banner');
  const messages = new Map();
  function render() {
    if (messages.size === 0) {
      el.hidden = true;
      el.replaceChildren();
      return;
    }
    el.hidden = false;
    el.classList.toggle('net-only', messages.size === 1 && messages.has('net'));
    const list = h('div', { class: 'banner-msgs' });
    const shown = new Set();
    for (const [key, text] of messages) {
      if (shown.has(text)) continue; // several requests often fail for the same reason
      shown.add(text);
      list.append(h('div', { class: 'banner-msg', 'data-key': key }, text));
    }
    const close = h('button', { class: 'banner-close', type: 'button', title: 'dismiss', 'aria-label': 'dismiss' }, '×');
    close.addEventListener('click', () => {
      for (const key of [...messages.keys()]) if (key !== 'net') messages.delete(key);
      render();
    });
    el.replaceChildren(list, close);
  }
  return {
    set(key, text) {
      if (messages.get(key) === text) return;
      messages.set(key, text);
      render();
    },
    clear(key) {
      if (messages.delete(key)) render();
    },
    /** Drops the messages of the previous page. */
    reset() {
      for (const key of [...messages.keys()]) if (key !== 'net') messages.delete(key);
      render();
    },
  };
})();

// ------------------------------------------------------------------------------------------
// token and configuration
// ------------------------------------------------------------------------------------------

export const token = (() => {
  let memory = '';
  return {
    get() {
      try { return localStorage.getItem(TOKEN_KEY) || ''; } catch (_) { return memory; }
    },
    set(value) {
      memory = value;
      try {
        if (value) localStorage.setItem(TOKEN_KEY, value);
        else localStorage.removeItem(TOKEN_KEY);
      } catch (_) { /* storage unavailable: keep it for this page only */ }
    },
  };
})();

/** Moves `?token=` from the address into storage so it does not linger in history. */
export function adoptTokenFromUrl() {
  const params = new URLSearchParams(location.search);
  if (!params.has('token')) return;
  token.set(params.get('token') || '');
  params.delete('token');
  const query = params.toString();
  history.replaceState(history.state, '', location.pathname + (query ? `?${query}` : '') + location.hash);
}

/** `controls` is assumed available until `/api/config` says otherwise. */
export const config = { controls: true, version: '', loaded: false };

/** Controls need a monitor started with a token, and that token entered in the page. */
export function controlsUsable() {
  return config.controls && token.get() !== '';
}

/** Why the controls are off, or '' when they are usable. */
export function controlsHint() {
  if (!config.controls) return 'controls disabled: start the monitor with --monitor-token';
  if (!token.get()) return 'enter the monitor\'s token (top right) to use the controls';
  return '';
}

/** A refused control in plain words: what to do about it, and that nothing changed. */
export function refusal(what, err) {
  const status = err instanceof ApiError ? err.status : 0;
  if (status === 401) return `The token was refused, so nothing was changed: check the token at the top right.`;
  if (status === 403) return `Not allowed to ${what}: ${err.message}`;
  return `Could not ${what}: ${err.message}`;
}

// ------------------------------------------------------------------------------------------
// API client
// ------------------------------------------------------------------------------------------

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

export const isAbort = (err) => err && err.name === 'AbortError';

/**
 * Fetches JSON. Non-2xx answers throw an ApiError carrying the server's `error` text; a network
 * failure throws an ApiError with status 0 and raises the "unreachable" banner.
 */
export async function api(path, { method = 'GET', body, signal } = {}) {
  const headers = { Accept: 'application/json' };
  const init = { method, headers, signal, cache: 'no-store' };
  // Controls always need the token; reads too when the monitor forwards tokens.
  const t = token.get();
  if (t) headers.Authorization = `Bearer ${t}`;
  if (method !== 'GET') {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body || {});
  }
  let res;
  try {
    res = await fetch(path, init);
  } catch (err) {
    if (isAbort(err)) throw err;
    banner.set('net', NET_DOWN);
    throw new ApiError(0, NET_DOWN);
  }
  banner.clear('net');
  const text = await res.text();
  let data = null;
  if (text) {
    try { data = JSON.parse(text); } catch (_) { data = null; }
  }
  if (!res.ok) {
    const msg = data && data.error ? data.error : `${res.status} ${res.statusText || 'error'} (${method} ${path})`;
    throw new ApiError(res.status, msg);
  }
  if (data == null) throw new ApiError(res.status, `unreadable answer from ${path}`);
  return data;
}

/** Runs `fn` now and then `ms` after each completion until `signal` aborts. */
export function poll(fn, ms, signal) {
  let timer = null;
  const loop = async () => {
    try { await fn(); } catch (_) { /* reported by fn */ }
    if (!signal.aborted) timer = setTimeout(loop, ms);
  };
  signal.addEventListener('abort', () => clearTimeout(timer));
  loop();
}

/** Reports an API failure in the banner under `key` (network loss already has its message). */
export function report(key, err) {
  if (isAbort(err)) return;
  if (err instanceof ApiError && err.status === 0) return;
  banner.set(key, err && err.message ? err.message : String(err));
}
