/**
 * Execution page: the timeline (a Gantt chart on a canvas).
 */
import { TASK_STATES, TERMINAL_EXEC } from './const.js';
import { badge, byCreated, clip, fmtClock, fmtDateTime, fmtDuration, h, setText, shortId, span, stateLabel } from './util.js';

/** Reads the state colours from the stylesheet so the canvas matches the rest of the page. */
export function stateColors() {
  const css = getComputedStyle(document.documentElement);
  const colors = {};
  for (const s of TASK_STATES) colors[s] = css.getPropertyValue(`--st-${s}`).trim() || '#999';
  return colors;
}

/**
 * Gantt chart on a canvas. The canvas has the size of the visible area and sticks to the top of
 * a scroll container whose spacer gives the full height, so only visible rows are painted.
 */
export class Timeline {
  constructor(view) {
    this.view = view;
    this.mode = 'instance';
    this.rows = [];          // instance mode: instance ids; worker mode: {label, items, lanes, y, h}
    this.contentHeight = 0;
    this.layoutDirty = true;
    this.lastLayout = 0;
    this.colors = null;
    this.batch = new Map();  // state -> {solid, faint}: flat [x, y, w, h, ...] lists
    this.AXIS = 26;
    this.ROW = 18;
    this.LANE = 14;
    this.LABEL = 210;

    this.select = h('select', { id: 'timeline-group', 'aria-label': 'group timeline rows' },
      h('option', { value: 'instance' }, 'one row per instance'),
      h('option', { value: 'worker' }, 'one row per worker'));
    this.select.addEventListener('change', () => {
      this.mode = this.select.value;
      this.layoutDirty = true;
      this.scroll.scrollTop = 0;
      this.view.schedule();
    });
    this.info = h('span', { class: 'sub', id: 'timeline-info' });
    // horizontal zoom: null = fit the whole execution, else a fixed window [t0, t1]
    this.window = null;
    const zoomBtn = (label, title, fn) => h('button', { type: 'button', title, onclick: fn }, label);
    this.zoomInfo = h('span', { class: 'sub' }, 'ctrl + wheel: zoom · drag: pan');
    const zoom = h('div', { class: 'zoom' },
      zoomBtn('−', 'zoom out', () => this.zoom(2)),
      zoomBtn('+', 'zoom in', () => this.zoom(0.5)),
      zoomBtn('fit', 'show the whole execution', () => { this.window = null; this.view.schedule(); }));
    // filters: a state and a task id fragment; rows of other instances are left out
    this.filter = { state: '', name: '' };
    const refilter = () => {
      this.filter = { state: this.stateFilter.value, name: this.nameFilter.value.trim().toLowerCase() };
      this.layoutDirty = true;
      this.scroll.scrollTop = 0;
      this.view.schedule();
    };
    this.stateFilter = h('select', { id: 'timeline-state-filter', 'aria-label': 'show instances in state', onchange: refilter },
      h('option', { value: '' }, 'every state'),
      TASK_STATES.map((s) => h('option', { value: s }, stateLabel(s))));
    this.nameFilter = h('input', {
      id: 'timeline-name-filter', type: 'search', placeholder: 'task id contains…', 'aria-label': 'task id contains',
      oninput: refilter,
    });
    // follow running: keep now in the window and the first running row in view
    this.follow = h('input', { type: 'checkbox', id: 'timeline-follow', onchange: () => this.view.schedule() });
    const follow = h('label', { class: 'tl-follow', title: 'keep the running instances and now in view' }, this.follow, ' follow running');
    this.canvas = h('canvas', { class: 'tl-canvas', id: 'timeline-canvas' });
    this.spacer = h('div', { class: 'tl-spacer' });
    this.tip = h('div', { class: 'tl-tip', hidden: true });
    this.scroll = h('div', { class: 'tl-scroll' }, this.canvas, this.spacer);
    this.el = h('section', { class: 'card', id: 'timeline' },
      h('div', { class: 'card-head' }, h('h3', null, 'Timeline'), this.info, h('div', { class: 'grow' }),
        this.zoomInfo, zoom, this.select),
      h('div', { class: 'card-head tl-filters' }, this.stateFilter, this.nameFilter, follow,
        h('span', { class: 'sub' }, 'faint: waiting in the queue · solid: running')),
      h('div', { style: 'position:relative' }, this.scroll, this.tip));

    this.scroll.addEventListener('scroll', () => { this.tip.hidden = true; this.view.schedule(); }, { passive: true });
    this.canvas.addEventListener('mousemove', (ev) => {
      // a plain click must not pin the window: panning starts after a few pixels
      if (this.drag && Math.abs(ev.clientX - this.drag.x) > 2) this.pan(ev.clientX);
      else if (!this.drag) this.hover(ev);
    });
    this.canvas.addEventListener('mouseleave', () => { this.tip.hidden = true; });
    this.canvas.addEventListener('click', (ev) => {
      // a click, not the end of a pan, on a bar opens its task
      if (this.downX != null && Math.abs(ev.clientX - this.downX) > 2) return;
      const inst = this.instanceAt(ev);
      if (inst) this.view.drawer.open(inst.id);
    });
    this.canvas.addEventListener('mousedown', (ev) => {
      if (ev.button !== 0 || !this.geom) return;
      const { t0, t1 } = this.geom;
      this.downX = ev.clientX;
      this.drag = { x: ev.clientX, t0, t1 };
      this.tip.hidden = true;
      ev.preventDefault();
    });
    this.onMouseUp = () => { this.drag = null; };
    window.addEventListener('mouseup', this.onMouseUp);
    this.canvas.addEventListener('wheel', (ev) => {
      if (!ev.ctrlKey && !ev.metaKey) {
        if (ev.shiftKey && this.geom) {
          // shift + wheel pans in time
          ev.preventDefault();
          const { t0, t1, plotW } = this.geom;
          const dt = ((ev.deltaY || ev.deltaX) / plotW) * (t1 - t0);
          this.window = [t0 + dt, t1 + dt];
          this.view.schedule();
        }
        return;
      }
      ev.preventDefault();
      const rect = this.canvas.getBoundingClientRect();
      this.zoom(ev.deltaY > 0 ? 1.25 : 0.8, ev.clientX - rect.left);
    }, { passive: false });
    if (window.ResizeObserver) {
      this.resizer = new ResizeObserver(() => this.view.schedule());
      this.resizer.observe(this.scroll);
    }
  }

  destroy() {
    if (this.resizer) this.resizer.disconnect();
    window.removeEventListener('mouseup', this.onMouseUp);
  }

  /** Scales the visible time window by `factor` around the pointer (or the middle). */
  zoom(factor, px) {
    if (!this.geom) return;
    const { t0, t1, x0, plotW } = this.geom;
    const at = px == null ? 0.5 : Math.max(0, Math.min(1, (px - x0) / plotW));
    const anchor = t0 + at * (t1 - t0);
    const width = Math.max(200, (t1 - t0) * factor);
    const full = this.extent();
    if (width >= (full.t1 - full.t0) && factor > 1) {
      this.window = null; // zoomed out past everything: back to fit
    } else {
      this.window = [anchor - at * width, anchor - at * width + width];
    }
    this.view.schedule();
  }

  pan(clientX) {
    const { x, t0, t1 } = this.drag;
    const dt = ((clientX - x) / this.geom.plotW) * (t1 - t0);
    this.window = [t0 - dt, t1 - dt];
    this.view.schedule();
  }

  /** Recomputes rows. Costs a sort of all instances, so it is throttled for large executions. */
  layout() {
    const { state, name } = this.filter;
    const all = [...this.view.instances.values()];
    const insts = (state || name
      ? all.filter((i) => (!state || i.state === state) && (!name || String(i.task_id).toLowerCase().includes(name)))
      : all).sort(byCreated);
    if (this.mode === 'instance') {
      this.rows = insts.map((i) => i.id);
      this.contentHeight = this.AXIS + this.rows.length * this.ROW;
    } else {
      const byWorker = new Map();
      for (const inst of insts) {
        const key = inst.worker || '';
        if (!byWorker.has(key)) byWorker.set(key, []);
        byWorker.get(key).push(inst);
      }
      const keys = [...byWorker.keys()].sort((a, b) => (a === '') - (b === '') || a.localeCompare(b));
      let y = this.AXIS;
      this.rows = keys.map((key) => {
        // greedy lanes: concurrent instances of one worker are stacked, not overlapped
        const items = byWorker.get(key).map((inst) => ({
          id: inst.id,
          start: inst.started_ms ?? inst.created_ms,
          end: inst.ended_ms ?? Infinity,
        })).sort((a, b) => a.start - b.start);
        const laneEnds = [];
        for (const it of items) {
          let lane = laneEnds.findIndex((end) => end <= it.start);
          if (lane < 0) { lane = laneEnds.length; laneEnds.push(0); }
          laneEnds[lane] = it.end;
          it.lane = lane;
        }
        const lanes = Math.max(1, laneEnds.length);
        const row = { label: key || '(no worker)', items, lanes, y, h: lanes * this.LANE + 6 };
        y += row.h;
        return row;
      });
      this.contentHeight = y;
    }
    this.rowsMode = this.mode;
    this.layoutDirty = false;
    this.lastLayout = Date.now();
    const n = insts.length;
    const counted = state || name ? `${n} of ${all.length} instances match` : `${n} instance${n === 1 ? '' : 's'}`;
    setText(this.info, this.mode === 'instance'
      ? counted
      : `${this.rows.length} worker row${this.rows.length === 1 ? '' : 's'} · ${counted}`);
  }

  /** Time range shown: first creation to last end, or to now while the execution runs. */
  extent() {
    let t0 = Infinity;
    let t1 = -Infinity;
    let open = false;
    for (const inst of this.view.instances.values()) {
      if (inst.created_ms < t0) t0 = inst.created_ms;
      const end = inst.ended_ms ?? inst.started_ms ?? inst.created_ms;
      if (end > t1) t1 = end;
      if (inst.ended_ms == null) open = true;
    }
    const e = this.view.execution;
    if (e && e.started_at_ms != null && e.started_at_ms < t0) t0 = e.started_at_ms;
    if (!Number.isFinite(t0)) { t0 = Date.now() - 60000; t1 = Date.now(); }
    if ((open && !this.view.finished) || (e && !TERMINAL_EXEC.has(e.state) && !this.view.finished)) {
      t1 = Math.max(t1, Date.now());
    }
    if (t1 - t0 < 1000) t1 = t0 + 1000;
    return { t0, t1: t1 + (t1 - t0) * 0.02 };
  }

  draw() {
    const count = this.view.instances.size;
    if (this.layoutDirty) {
      const wait = count > 2000 ? 500 : 100;
      // rows built for the other grouping cannot be drawn: lay out at once after a mode switch
      if (this.rowsMode !== this.mode || Date.now() - this.lastLayout >= wait) this.layout();
      else this.view.scheduleLater(wait);
    }
    if (!this.colors) this.colors = stateColors();
    // the box shrinks for short charts, and caps at 360 px with a scrollbar for long ones
    const boxH = Math.max(120, Math.min(360, this.contentHeight + 2));
    if (this.scroll.style.height !== `${boxH}px`) this.scroll.style.height = `${boxH}px`;
    const W = this.scroll.clientWidth;
    const H = this.scroll.clientHeight;
    if (W <= 0 || H <= 0) return;
    this.spacer.style.height = `${Math.max(0, this.contentHeight - H)}px`;
    const dpr = window.devicePixelRatio || 1;
    if (this.canvas.width !== Math.round(W * dpr) || this.canvas.height !== Math.round(H * dpr)) {
      this.canvas.width = Math.round(W * dpr);
      this.canvas.height = Math.round(H * dpr);
      this.canvas.style.height = `${H}px`;
    }
    const ctx = this.canvas.getContext('2d');
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, W, H);
    ctx.font = '12px system-ui, -apple-system, "Segoe UI", Roboto, sans-serif';
    ctx.textBaseline = 'middle';

    if (this.follow.checked) this.followRunning(H);
    const { t0, t1 } = this.window ? { t0: this.window[0], t1: this.window[1] } : this.extent();
    const x0 = this.LABEL;
    const plotW = Math.max(50, W - x0 - 10);
    const xOf = (t) => x0 + ((t - t0) / (t1 - t0)) * plotW;
    this.geom = { t0, t1, x0, plotW, W, H };
    const now = Date.now();
    const top = this.scroll.scrollTop;
    const ticks = axisTicks(t0, t1, plotW);

    // zebra stripes, grid lines, then bars clipped to the plot area, then labels
    const visible = this.visibleRows(top, H);
    ctx.fillStyle = '#f8f9fb';
    for (const row of visible) if (row.index % 2 === 1) ctx.fillRect(0, row.y, W, row.h);
    ctx.strokeStyle = '#e9edf2';
    ctx.lineWidth = 1;
    ctx.beginPath();
    for (const t of ticks.values) {
      const x = Math.round(xOf(t)) + 0.5;
      if (x < x0) continue;
      ctx.moveTo(x, this.AXIS);
      ctx.lineTo(x, H);
    }
    ctx.stroke();
    ctx.save();
    ctx.beginPath();
    ctx.rect(x0, this.AXIS, W - x0, H - this.AXIS);
    ctx.clip();
    for (const row of visible) this.drawRowBars(ctx, row, xOf, now, t0, t1);
    this.flushBars(ctx);
    ctx.restore();
    for (const row of visible) this.drawRowLabel(ctx, row);

    // now marker
    if (!this.view.finished && now <= t1 && now >= t0) {
      const x = Math.round(xOf(now)) + 0.5;
      ctx.strokeStyle = 'rgba(212, 63, 63, 0.7)';
      ctx.setLineDash([3, 3]);
      ctx.beginPath();
      ctx.moveTo(x, this.AXIS);
      ctx.lineTo(x, H);
      ctx.stroke();
      ctx.setLineDash([]);
    }

    // axis, painted last so rows scroll under it
    ctx.fillStyle = '#f7f9fb';
    ctx.fillRect(0, 0, W, this.AXIS);
    ctx.strokeStyle = '#dfe4ea';
    ctx.beginPath();
    ctx.moveTo(0, this.AXIS + 0.5);
    ctx.lineTo(W, this.AXIS + 0.5);
    ctx.moveTo(x0 - 0.5, 0);
    ctx.lineTo(x0 - 0.5, H);
    ctx.stroke();
    ctx.fillStyle = '#637083';
    ctx.textAlign = 'center';
    for (const t of ticks.values) {
      const x = xOf(t);
      if (x < x0 + 20 || x > W - 20) continue;
      ctx.fillText(ticks.label(t), x, this.AXIS / 2);
    }
    ctx.textAlign = 'left';
    ctx.fillText(this.mode === 'instance' ? 'task · instance' : 'worker', 10, this.AXIS / 2);
    if (count === 0) {
      ctx.fillStyle = '#97a1ae';
      ctx.fillText('No task instances yet.', x0 + 12, this.AXIS + 18);
    }
  }

  /**
   * Queues one bar: faint from creation to start (waiting; only with `withWait`), solid from
   * start to end (or now); never started: faint from creation to end (or now).
   * Bars are collected per state and painted by flushBars() with one fill style per state.
   */
  drawBar(inst, y, barH, xOf, now, withWait) {
    const lim = this.geom.W + 10;
    const clamp = (x) => (x < -10 ? -10 : x > lim ? lim : x);
    const end = clamp(xOf(inst.ended_ms ?? now));
    if (end < this.geom.x0) return; // entirely left of the window
    const created = clamp(xOf(inst.created_ms));
    if (created > lim - 10) return; // entirely right of it
    let batch = this.batch.get(inst.state);
    if (!batch) {
      batch = { solid: [], faint: [] };
      this.batch.set(inst.state, batch);
    }
    if (inst.started_ms != null) {
      const start = clamp(xOf(inst.started_ms));
      if (withWait && start - created >= 1) batch.faint.push(created, y + barH * 0.3, start - created, barH * 0.4);
      batch.solid.push(start, y, Math.max(2, end - start), barH);
    } else {
      batch.faint.push(created, y + barH * 0.2, Math.max(2, end - created), barH * 0.6);
    }
  }

  flushBars(ctx) {
    for (const [state, batch] of this.batch) {
      ctx.fillStyle = this.colors[state] || '#999';
      ctx.globalAlpha = 0.4;
      const f = batch.faint;
      for (let i = 0; i < f.length; i += 4) ctx.fillRect(f[i], f[i + 1], f[i + 2], f[i + 3]);
      ctx.globalAlpha = 1;
      const b = batch.solid;
      for (let i = 0; i < b.length; i += 4) ctx.fillRect(b[i], b[i + 1], b[i + 2], b[i + 3]);
    }
    this.batch.clear();
  }

  /**
   * "Follow running": a zoomed window slides so now stays near its right edge, and the first row
   * with a running instance is scrolled into view when it is not.
   */
  followRunning(H) {
    const now = Date.now();
    if (this.window && !this.view.finished) {
      const width = this.window[1] - this.window[0];
      if (now > this.window[1] - width * 0.05 || now < this.window[0]) this.window = [now - width * 0.9, now + width * 0.1];
    }
    let index = -1;
    let y = 0;
    let h = 0;
    if (this.mode === 'instance') {
      index = this.rows.findIndex((id) => {
        const inst = this.view.instances.get(id);
        return inst && inst.state === 'running';
      });
      y = index * this.ROW;
      h = this.ROW;
    } else {
      index = this.rows.findIndex((row) => row.items.some((it) => {
        const inst = this.view.instances.get(it.id);
        return inst && inst.state === 'running';
      }));
      if (index >= 0) {
        y = this.rows[index].y - this.AXIS;
        h = this.rows[index].h;
      }
    }
    if (index < 0) return;
    const top = this.scroll.scrollTop;
    const visible = H - this.AXIS;
    if (y < top || y + h > top + visible) this.scroll.scrollTop = Math.max(0, y - visible / 3);
  }

  /** Rows intersecting the visible area, with their on-canvas position. */
  visibleRows(top, H) {
    const out = [];
    if (this.mode === 'instance') {
      const ROW = this.ROW;
      const first = Math.max(0, Math.floor(top / ROW));
      const last = Math.min(this.rows.length, Math.ceil((top + H - this.AXIS) / ROW) + 1);
      for (let i = first; i < last; i += 1) {
        const inst = this.view.instances.get(this.rows[i]);
        if (inst) out.push({ index: i, y: this.AXIS + i * ROW - top, h: ROW, inst });
      }
      return out;
    }
    const rows = this.rows;
    // binary search for the first row reaching into the visible area
    let lo = 0;
    let hi = rows.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (rows[mid].y + rows[mid].h - this.AXIS <= top) lo = mid + 1;
      else hi = mid;
    }
    for (let i = lo; i < rows.length; i += 1) {
      const y = rows[i].y - top;
      if (y > H) break;
      out.push({ index: i, y, h: rows[i].h, worker: rows[i] });
    }
    return out;
  }

  drawRowLabel(ctx, row) {
    const mid = row.y + Math.min(row.h, 20) / 2;
    ctx.fillStyle = '#1d2733';
    if (row.inst) {
      const label = clip(row.inst.task_id, 22);
      ctx.fillText(label, 10, mid);
      const w = ctx.measureText(label).width;
      ctx.fillStyle = '#97a1ae';
      ctx.fillText(shortId(row.inst.id), Math.min(10 + w + 6, this.LABEL - 60), mid);
    } else {
      ctx.fillText(clip(row.worker.label, 26), 10, mid);
    }
  }

  drawRowBars(ctx, row, xOf, now, t0, t1) {
    if (row.inst) {
      this.drawBar(row.inst, row.y + 4, this.ROW - 8, xOf, now, true);
      return;
    }
    for (const it of row.worker.items) {
      const inst = this.view.instances.get(it.id);
      if (!inst) continue;
      if ((inst.ended_ms ?? now) < t0 || inst.created_ms > t1) continue;
      // a worker's lane shows only its own run time, not the wait before dispatch
      this.drawBar(inst, row.y + 3 + it.lane * this.LANE, this.LANE - 3, xOf, now, false);
    }
  }

  /** Tooltip for the instance under the pointer. */
  hover(ev) {
    const inst = this.instanceAt(ev);
    if (!inst) { this.tip.hidden = true; return; }
    this.showTip(ev, inst);
  }

  /** The instance whose bar is under the pointer, or null. */
  instanceAt(ev) {
    if (!this.geom) return null;
    const rect = this.canvas.getBoundingClientRect();
    const x = ev.clientX - rect.left;
    const y = ev.clientY - rect.top;
    const top = this.scroll.scrollTop;
    let inst = null;
    if (y > this.AXIS) {
      const { t0, t1, x0, plotW } = this.geom;
      const t = t0 + ((x - x0) / plotW) * (t1 - t0);
      if (this.mode === 'instance') {
        const i = Math.floor((y - this.AXIS + top) / this.ROW);
        inst = this.view.instances.get(this.rows[i]) || null;
      } else {
        const cy = y + top;
        const row = this.rows.find((r) => cy >= r.y && cy < r.y + r.h);
        if (row) {
          const lane = Math.floor((cy - row.y - 3) / this.LANE);
          const slack = ((t1 - t0) / plotW) * 3;
          const now = Date.now();
          const hit = row.items.find((it) => {
            const i = this.view.instances.get(it.id);
            return i && it.lane === lane && t >= i.created_ms - slack && t <= (i.ended_ms ?? now) + slack;
          });
          if (hit) inst = this.view.instances.get(hit.id);
        }
      }
    }
    return inst;
  }

  showTip(ev, inst) {
    const rect = this.canvas.getBoundingClientRect();
    const x = ev.clientX - rect.left;
    const y = ev.clientY - rect.top;
    const dur = span(inst.started_ms, inst.ended_ms);
    this.tip.replaceChildren(
      h('div', null, h('b', null, inst.task_id), ' ', badge(inst.state)),
      h('div', { class: 'mono' }, inst.id),
      h('div', null, `attempt ${inst.attempt ?? '—'} · run ${inst.run ?? '—'}${inst.worker ? ` · ${inst.worker}` : ''}`),
      h('div', null, `created ${fmtClock(inst.created_ms, true)}` +
        (inst.dispatched_ms != null ? ` · dispatched ${fmtClock(inst.dispatched_ms, true)}` : '') +
        (inst.started_ms != null ? ` · started ${fmtClock(inst.started_ms, true)}` : '') +
        (inst.ended_ms != null ? ` · ended ${fmtClock(inst.ended_ms, true)}` : '')),
      inst.dispatched_ms != null && inst.started_ms != null
        ? h('div', null, `waited ${fmtDuration(span(inst.dispatched_ms, inst.started_ms))} in the queue`) : null,
      dur != null ? h('div', null, `ran ${fmtDuration(dur)}`) : null,
      inst.error ? h('div', { class: 'err' }, inst.error) : null,
      ...(inst.validation || []).map((c) => h('div', { class: c.passed ? 'meta' : 'err' },
        `check ${c.name} (${c.level}) ${c.passed ? 'passed' : 'failed'} in ${fmtDuration(c.duration_ms)}`)),
      ...(inst.earlier_attempts || []).map((a) => h('div', { class: 'meta' },
        `attempt ${a.attempt}${a.worker_id ? ` on ${a.worker_id}` : ''}: ${a.error}`)));
    this.tip.hidden = false;
    const box = this.scroll.getBoundingClientRect();
    const left = Math.min(x + 14, box.width - this.tip.offsetWidth - 4);
    this.tip.style.left = `${Math.max(4, left)}px`;
    this.tip.style.top = `${Math.min(y + 14, box.height - 10)}px`;
  }
}

/** Tick positions (about one per 100 px) and their label format for a time range. */
export function axisTicks(t0, t1, width) {
  const steps = [100, 200, 500, 1e3, 2e3, 5e3, 1e4, 15e3, 3e4, 6e4, 12e4, 3e5, 6e5, 9e5, 18e5,
    36e5, 72e5, 108e5, 216e5, 432e5, 864e5];
  const per = (t1 - t0) / Math.max(1, width / 100);
  const step = steps.find((s) => s >= per) || steps[steps.length - 1];
  // align to local midnight so hour steps land on round hours
  const offset = new Date(t0).getTimezoneOffset() * 60000;
  const values = [];
  for (let t = Math.ceil((t0 - offset) / step) * step + offset; t <= t1; t += step) values.push(t);
  const label = step < 1000 ? (t) => fmtClock(t, true).slice(3, 12)
    : step < 6e4 ? (t) => fmtClock(t)
      : step < 864e5 ? (t) => fmtClock(t).slice(0, 5)
        : (t) => fmtDateTime(t);
  return { values, label };
}
