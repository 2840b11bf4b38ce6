/**
 * DOM and formatting helpers: element builders, badges, progress bars, times, sizes.
 */
/**
 * Creates an element. `attrs` keys: `class`, `text`, `on<event>` (listener), `style`, anything
 * else becomes an attribute (`true` = empty attribute, `null`/`false` = omitted).
 */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  if (attrs) {
    for (const [key, value] of Object.entries(attrs)) {
      if (value == null || value === false) continue;
      if (key === 'class') el.className = value;
      else if (key === 'text') el.textContent = value;
      else if (key.startsWith('on') && typeof value === 'function') {
        el.addEventListener(key.slice(2), value);
      } else el.setAttribute(key, value === true ? '' : String(value));
    }
  }
  for (const child of children.flat()) {
    if (child == null || child === false) continue;
    el.append(child instanceof Node ? child : String(child));
  }
  return el;
}

export const SVG_NS = 'http://www.w3.org/2000/svg';

/** Creates an SVG element with attributes. */
export function svg(tag, attrs) {
  const el = document.createElementNS(SVG_NS, tag);
  if (attrs) for (const [key, value] of Object.entries(attrs)) el.setAttribute(key, String(value));
  return el;
}

/** Sets text only when it differs (avoids needless layout work). */
export function setText(el, text) {
  const value = text == null ? '' : String(text);
  if (el.textContent !== value) el.textContent = value;
}

/** A state as people read it: `waiting_for_subtasks` → `waiting for subtasks`. */
export function stateLabel(state) {
  return String(state).replace(/_/g, ' ');
}

export function badge(state) {
  return h('span', { class: 'badge', 'data-state': state || 'pending' }, stateLabel(state || 'pending'));
}

export function setBadge(el, state) {
  const value = state || 'pending';
  if (el.getAttribute('data-state') !== value) el.setAttribute('data-state', value);
  setText(el, stateLabel(value));
}

export function progressBar() {
  const fill = h('div', { class: 'bar-fill', style: 'width:0%' });
  return { el: h('div', { class: 'bar' }, fill), fill };
}

export function setBar(fill, percent) {
  const width = `${Math.max(0, Math.min(100, Number(percent) || 0)).toFixed(2)}%`;
  if (fill.style.width !== width) fill.style.width = width;
}

export const pad = (n, width = 2) => String(n).padStart(width, '0');
// UUIDv7 ids of one execution share their leading timestamp digits: the last eight tell them apart.
export const shortId = (id) => (id == null ? '' : String(id).replace(/-/g, '').slice(-8));
export const enc = encodeURIComponent;

export function fmtClock(ms, withMillis) {
  const d = new Date(ms);
  const s = `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
  return withMillis ? `${s}.${pad(d.getMilliseconds(), 3)}` : s;
}

/** Clock time for today, date and time otherwise. */
export function fmtDateTime(ms) {
  if (ms == null) return '—';
  const d = new Date(ms);
  if (d.toDateString() === new Date().toDateString()) return fmtClock(ms);
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}`;
}

export function fmtDuration(ms) {
  if (ms == null || !Number.isFinite(ms)) return '—';
  const v = Math.max(0, ms);
  if (v < 1000) return `${Math.round(v)} ms`;
  const s = v / 1000;
  if (s < 60) return s < 10 ? `${s.toFixed(1)} s` : `${Math.floor(s)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${pad(Math.floor(s % 60))}s`;
  const hr = Math.floor(m / 60);
  if (hr < 24) return `${hr}h ${pad(m % 60)}m`;
  return `${Math.floor(hr / 24)}d ${hr % 24}h`;
}

export function fmtAge(ms) {
  const v = Math.max(0, ms);
  if (v < 10000) return `${(v / 1000).toFixed(1)} s ago`;
  if (v < 60000) return `${Math.round(v / 1000)} s ago`;
  return `${fmtDuration(v)} ago`;
}

export function fmtBytes(n) {
  if (n == null || !Number.isFinite(n)) return '—';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let v = n;
  let i = 0;
  while (v >= 1024 && i < units.length - 1) { v /= 1024; i += 1; }
  return `${i > 0 && v < 10 ? v.toFixed(1) : Math.round(v)} ${units[i]}`;
}

/** Percent, never rounded up to 100 before the work is done. */
export function fmtPercent(p) {
  if (p == null || !Number.isFinite(Number(p))) return '—';
  const v = Number(p);
  if (v >= 100) return '100%';
  if (v < 10) return `${Math.floor(v * 10) / 10}%`;
  return `${Math.floor(v)}%`;
}

/** Wall time from `start` to `end`, or to now while not ended. */
export function span(start, end) {
  if (start == null) return null;
  return (end == null ? Date.now() : end) - start;
}

/** Orders instances by creation time, then by arrival order. */
export function byCreated(a, b) {
  return (a.created_ms - b.created_ms) || (a._order - b._order);
}

/** Calls `fn` at most once per `ms`, trailing calls coalesced into one. */
export function throttle(fn, ms) {
  let last = 0;
  let timer = null;
  const wrapped = () => {
    const wait = last + ms - Date.now();
    if (timer) return;
    if (wait <= 0) {
      last = Date.now();
      fn();
    } else {
      timer = setTimeout(() => {
        timer = null;
        last = Date.now();
        fn();
      }, wait);
    }
  };
  wrapped.cancel = () => { clearTimeout(timer); timer = null; };
  return wrapped;
}

export function clip(text, max) {
  const s = String(text);
  return s.length > max ? `${s.slice(0, max - 1)}…` : s;
}
