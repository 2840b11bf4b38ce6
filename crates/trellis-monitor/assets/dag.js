/**
 * Execution page: the plan as a DAG.
 *
 * The monitor lays the plan out (`plan.graph`, see API.md): one column per wave, the order inside
 * a column chosen to reduce crossings, and a fan-out of interchangeable tasks folded into one node
 * ("shards ×2,000") whose member states are counted on it. A node opens its task in the drawer; a
 * fan-out opens the grid of its members. A plan too big to draw node by node (`graph: null`) is
 * drawn one stacked bar of state counts per wave; a wave opens the grid of its tasks.
 *
 * The drawing sits in a viewport: the wheel zooms at the pointer, a drag pans, the toolbar zooms,
 * fits and resets, and the minimap shows (and moves) the visible part.
 */
import { STACK_ORDER, TERMINAL_TASK } from './const.js';
import { TaskGrid } from './grid.js';
import { clip, h, setText, shortId, svg } from './util.js';

const W = 210;            // node width
const H = 40;             // node height
const GX = 72;            // gap between columns
const ROW = 52;           // distance between rows
const PAD = 24;
const TOP = 44;           // room for the wave labels
const MINIMAP_W = 180;
const MINIMAP_H = 110;

export class DagView {
  constructor(view) {
    this.view = view;
    this.nodes = new Map();     // task id -> {g, title, task} (single-task nodes)
    this.groups = [];           // per fan-out node: {g, counts, bar, members}
    this.groupOf = new Map();   // member task id -> index into groups
    this.waveEls = [];          // per wave: {segs: {state: rect}, texts: {state: text}, size}
    this.edgesByNode = new Map();
    this.zoom = { k: 1, x: 0, y: 0 };
    this.size = { w: 0, h: 0 };
    this.note = h('span', { class: 'sub' });
    const tool = (label, title, id, fn) => h('button', { type: 'button', class: 'dag-tool', id, title, onclick: fn }, label);
    this.toolbar = h('div', { class: 'dag-toolbar' },
      tool('−', 'zoom out', 'dag-zoom-out', () => this.zoomBy(1 / 1.25)),
      tool('+', 'zoom in', 'dag-zoom-in', () => this.zoomBy(1.25)),
      tool('Fit', 'fit the whole plan in view', 'dag-fit', () => this.fit()),
      tool('1:1', 'actual size', 'dag-reset', () => this.setZoom(1, PAD / 2, 0)));
    this.stage = h('div', { class: 'dag-stage' }, h('div', { class: 'empty', style: 'padding:12px' }, 'Loading plan…'));
    this.grid = new TaskGrid(view);
    this.el = h('section', { class: 'card', id: 'dag' },
      h('div', { class: 'card-head' }, h('h3', null, 'Plan'), this.note, h('div', { class: 'grow' }), this.toolbar),
      this.stage, this.grid.el);
  }

  showError(text) {
    this.stage.replaceChildren(h('div', { class: 'empty', style: 'padding:12px' }, text));
  }

  /** Builds the drawing once per plan. */
  build() {
    const plan = this.view.plan;
    this.nodes.clear();
    this.groups = [];
    this.groupOf.clear();
    this.waveEls = [];
    this.edgesByNode.clear();
    if (!plan || !plan.columns.length) {
      this.showError('The plan has no tasks.');
      return;
    }
    const graph = plan.graph;
    this.aggregated = !graph;
    const content = graph ? this.buildGraph(plan, graph) : this.buildAggregated(plan);
    this.mountStage(content);
    const waves = plan.columns.length;
    const folded = graph ? graph.nodes.filter((n) => n.members.length > 1).length : 0;
    const n = plan.tasks.length;
    setText(this.note, `${n.toLocaleString('en-US')} task${n === 1 ? '' : 's'} in ${waves} wave${waves === 1 ? '' : 's'}` +
      (folded ? ` · ${folded} fan-out${folded === 1 ? '' : 's'} folded (click to list)` : '') +
      (!graph ? ' · too many to draw one by one: one bar per wave (click to list)' : '') +
      (graph && graph.conflicts.length ? ' · dashed orange: file conflict' : ''));
  }

  /** The SVG content of a laid-out plan: {g, width, height}. */
  buildGraph(plan, graph) {
    const xOf = (wave) => PAD + wave * (W + GX);
    const yOf = (row) => TOP + row * ROW;
    const width = PAD * 2 + plan.columns.length * W + (plan.columns.length - 1) * GX;
    const height = TOP + Math.max(1, graph.rows) * ROW + PAD;
    const root = svg('g');
    const edges = svg('g', { class: 'edges' });
    const conflicts = svg('g', { class: 'conflicts' });
    const nodes = svg('g', { class: 'nodes' });
    plan.columns.forEach((ids, c) => {
      const label = svg('text', { x: xOf(c), y: 18, class: 'wave-label' });
      label.textContent = `wave ${c + 1}`;
      const sub = svg('text', { x: xOf(c), y: 32, class: 'wave-sub' });
      sub.textContent = `${ids.length.toLocaleString('en-US')} task${ids.length === 1 ? '' : 's'}`;
      root.append(label, sub);
    });
    const at = graph.nodes.map((n) => ({ x: xOf(n.wave), y: yOf(n.row) }));
    const link = (node, path) => {
      if (!this.edgesByNode.has(node)) this.edgesByNode.set(node, []);
      this.edgesByNode.get(node).push(path);
    };
    for (const [from, to] of graph.edges) {
      const a = at[from];
      const b = at[to];
      if (!a || !b) continue;
      const x1 = a.x + W, y1 = a.y + H / 2, x2 = b.x - 2, y2 = b.y + H / 2;
      const dx = Math.max(24, (x2 - x1) / 2);
      const path = svg('path', {
        class: 'edge', 'marker-end': 'url(#dag-arrow)',
        d: `M${x1},${y1} C${x1 + dx},${y1} ${x2 - dx},${y2} ${x2},${y2}`,
      });
      edges.append(path);
      link(from, path);
      link(to, path);
    }
    for (const [p, q] of graph.conflicts) {
      const a = at[p];
      const b = at[q];
      if (!a || !b) continue;
      // same column: an arc bulging left of the column; otherwise a straight dashed line
      const d = a.x === b.x
        ? `M${a.x},${a.y + H / 2} C${a.x - 22},${a.y + H / 2} ${b.x - 22},${b.y + H / 2} ${b.x},${b.y + H / 2}`
        : `M${a.x + W / 2},${a.y + H / 2} L${b.x + W / 2},${b.y + H / 2}`;
      const path = svg('path', { class: 'conflict', d });
      const title = svg('title');
      title.textContent = `file conflict: ${graph.nodes[p].label} and ${graph.nodes[q].label}`;
      path.append(title);
      conflicts.append(path);
    }
    const byId = new Map(plan.tasks.map((t) => [t.id, t]));
    graph.nodes.forEach((n, index) => {
      const p = at[index];
      if (n.members.length === 1) nodes.append(this.singleNode(byId.get(n.members[0]) || { id: n.members[0], type: n.type }, p, index));
      else nodes.append(this.groupNode(n, p, index));
    });
    root.append(conflicts, edges, nodes);
    return { g: root, width, height, boxes: at.map((p) => ({ x: p.x, y: p.y, w: W, h: H })) };
  }

  singleNode(task, p, index) {
    const state = this.view.taskState.get(task.id) || 'pending';
    const g = svg('g', { class: 'node', 'data-node': index, 'data-task-id': task.id, 'data-state': state, transform: `translate(${p.x},${p.y})` });
    const rect = svg('rect', { width: W, height: H, rx: 6, ry: 6 });
    const name = svg('text', { x: 10, y: task.type ? 17 : 24 });
    name.textContent = clip(task.id, 28);
    const title = svg('title');
    g.append(rect, name);
    if (task.type) {
      const type = svg('text', { x: 10, y: 32, class: 'node-type' });
      type.textContent = clip(task.type, 32);
      g.append(type);
    }
    g.append(title);
    const entry = { g, title, task };
    this.nodes.set(task.id, entry);
    this.setTitle(entry, state);
    return g;
  }

  /** A fan-out: stacked cards, "label ×N", a line of counts and a bar of member states. */
  groupNode(n, p, index) {
    const group = this.groups.length;
    const g = svg('g', { class: 'node group', 'data-node': index, 'data-group': group, transform: `translate(${p.x},${p.y})` });
    const back1 = svg('rect', { class: 'stack', x: 6, y: -6, width: W, height: H, rx: 6, ry: 6 });
    const back2 = svg('rect', { class: 'stack', x: 3, y: -3, width: W, height: H, rx: 6, ry: 6 });
    const rect = svg('rect', { width: W, height: H, rx: 6, ry: 6 });
    const name = svg('text', { x: 10, y: 16, class: 'group-name' });
    name.textContent = `${clip(n.label, 18)} ×${n.members.length.toLocaleString('en-US')}`;
    const counts = svg('text', { x: 10, y: 30, class: 'node-type group-counts' });
    const bar = svg('g', { class: 'group-bar', transform: `translate(0,${H - 4})` });
    const title = svg('title');
    g.append(back1, back2, rect, name, counts, bar, title);
    const entry = { g, counts, bar, title, node: n };
    this.groups.push(entry);
    for (const id of n.members) this.groupOf.set(id, group);
    this.patchGroup(group);
    return g;
  }

  /** Counts a fan-out's member states onto its node. */
  patchGroup(index) {
    const entry = this.groups[index];
    if (!entry) return;
    const counts = {};
    for (const id of entry.node.members) {
      const s = this.view.taskState.get(id) || 'pending';
      counts[s] = (counts[s] || 0) + 1;
    }
    const total = entry.node.members.length;
    const done = (counts.completed || 0) + (counts.skipped || 0);
    const parts = [`${done.toLocaleString('en-US')} done`];
    for (const s of ['failed', 'running', 'cancelled']) {
      if (counts[s]) parts.push(`${counts[s].toLocaleString('en-US')} ${s}`);
    }
    setText(entry.counts, `(${parts.join(', ')})`);
    // the node takes the colour of what needs attention first
    const state = counts.running ? 'running' : counts.failed ? 'failed'
      : done === total ? 'completed' : Object.keys(counts).some((s) => TERMINAL_TASK.has(s)) ? 'running' : 'pending';
    if (entry.g.getAttribute('data-state') !== state) entry.g.setAttribute('data-state', state);
    const segs = [];
    let x = 0;
    for (const s of STACK_ORDER) {
      const n = counts[s] || 0;
      if (!n) continue;
      const w = (n / total) * W;
      segs.push(svg('rect', { x: x.toFixed(2), y: 0, width: w.toFixed(2), height: 4, style: `fill:var(--st-${s})` }));
      x += w;
    }
    entry.bar.replaceChildren(...segs);
    entry.title.textContent = [`${entry.node.label}: ${total} interchangeable ${entry.node.type} tasks`,
      ...STACK_ORDER.filter((s) => counts[s]).map((s) => `${counts[s]} ${s.replace(/_/g, ' ')}`),
      'click to list them'].join('\n');
  }

  highlight(g, on) {
    if (!g) return;
    g.classList.toggle('hl', on);
    for (const path of this.edgesByNode.get(Number(g.getAttribute('data-node'))) || []) path.classList.toggle('hl', on);
  }

  setTitle(entry, state) {
    const inst = this.view.newestByTask.get(entry.task.id);
    entry.title.textContent = [
      entry.task.id, entry.task.type ? `type ${entry.task.type}` : null, `state ${state}`,
      inst ? `instance ${shortId(inst.id)} · attempt ${inst.attempt}` : 'not started',
      inst && inst.worker ? `worker ${inst.worker}` : null,
      (entry.task.depends_on || []).length ? `depends on ${entry.task.depends_on.join(', ')}` : null,
    ].filter(Boolean).join('\n');
  }

  /** The SVG content of a plan drawn per wave: {g, width, height}. */
  buildAggregated(plan) {
    const COL = 150, BAR_W = 30, BAR_H = 240, LINE = 16;
    const width = PAD * 2 + plan.columns.length * COL;
    const height = TOP + BAR_H + 34;
    const root = svg('g');
    this.barGeom = { BAR_W, BAR_H, TOP, LINE };
    const boxes = [];
    plan.columns.forEach((ids, c) => {
      const x = PAD + c * COL;
      const g = svg('g', { class: 'wave', 'data-wave': c + 1, transform: `translate(${x},0)` });
      const label = svg('text', { x: 0, y: 18, class: 'wave-label' });
      label.textContent = `wave ${c + 1}`;
      const total = svg('text', { x: 0, y: 34, class: 'wave-sub' });
      total.textContent = `${ids.length.toLocaleString('en-US')} tasks`;
      // the whole column answers a click, not only the painted segments
      const hit = svg('rect', { class: 'hit', x: -4, y: 0, width: COL - 16, height: TOP + BAR_H + 8 });
      const frame = svg('rect', { class: 'frame', x: 0, y: TOP, width: BAR_W, height: BAR_H, rx: 3 });
      const segs = {};
      const texts = {};
      for (const s of STACK_ORDER) {
        const rect = svg('rect', { class: 'seg', x: 0, y: TOP + BAR_H, width: BAR_W, height: 0, 'data-state': s, style: `fill:var(--st-${s})` });
        const title = svg('title');
        rect.append(title);
        segs[s] = rect;
        const text = svg('text', { x: BAR_W + 8, y: 0, 'data-state': s });
        text.style.display = 'none';
        texts[s] = text;
      }
      g.append(hit, label, total, ...STACK_ORDER.map((s) => segs[s]), frame, ...STACK_ORDER.map((s) => texts[s]));
      root.append(g);
      this.waveEls.push({ g, segs, texts, size: ids.length });
      boxes.push({ x, y: TOP, w: BAR_W, h: BAR_H });
    });
    for (let i = 0; i < this.waveEls.length; i += 1) this.patchWave(i);
    return { g: root, width, height, boxes };
  }

  patchWave(index) {
    const el = this.waveEls[index];
    const counts = this.view.waveCounts[index];
    if (!el || !counts) return;
    const { BAR_H, TOP: top, LINE } = this.barGeom;
    const total = Math.max(1, el.size);
    let y = top + BAR_H;
    let line = 0;
    // labels listed top-down in the reverse of the stacking order, so they read like the bar
    for (const s of STACK_ORDER) {
      const n = counts[s] || 0;
      const hgt = (n / total) * BAR_H;
      y -= hgt;
      const rect = el.segs[s];
      rect.setAttribute('y', y.toFixed(2));
      rect.setAttribute('height', hgt.toFixed(2));
      rect.firstChild.textContent = `wave ${index + 1}: ${n} ${s}`;
    }
    for (const s of [...STACK_ORDER].reverse()) {
      const n = counts[s] || 0;
      const text = el.texts[s];
      if (n > 0) {
        text.style.display = '';
        text.setAttribute('y', String(top + 11 + line * LINE));
        setText(text, `${n.toLocaleString('en-US')} ${s.replace(/_/g, ' ')}`);
        line += 1;
      } else text.style.display = 'none';
    }
  }

  /** Applies the changes recorded since the last frame. */
  patch(tasks, waves) {
    this.grid.patch(tasks);
    if (this.aggregated) {
      for (const w of waves) this.patchWave(w);
      return;
    }
    const groups = new Set();
    for (const id of tasks) {
      const group = this.groupOf.get(id);
      if (group !== undefined) {
        groups.add(group);
        continue;
      }
      const entry = this.nodes.get(id);
      if (!entry) continue;
      const state = this.view.taskState.get(id) || 'pending';
      if (entry.g.getAttribute('data-state') !== state) entry.g.setAttribute('data-state', state);
      this.setTitle(entry, state);
    }
    for (const group of groups) this.patchGroup(group);
  }

  // ---- viewport: zoom, pan, fit, minimap ---------------------------------------------------

  /** Puts `content` in a fresh viewport with its minimap, fitted when it does not fit. */
  mountStage(content) {
    this.content = content;
    const root = svg('svg', { id: 'dag-svg', class: 'dag-svg' });
    const defs = svg('defs');
    const marker = svg('marker', { id: 'dag-arrow', viewBox: '0 0 10 10', refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: 'auto-start-reverse' });
    marker.append(svg('path', { d: 'M0,0 L10,5 L0,10 z', class: 'arrow' }));
    defs.append(marker);
    this.viewport = svg('g', { class: 'viewport' });
    this.viewport.append(content.g);
    root.append(defs, this.viewport);

    this.minimap = svg('svg', {
      class: 'dag-minimap', id: 'dag-minimap', width: MINIMAP_W, height: MINIMAP_H,
      viewBox: `0 0 ${content.width} ${content.height}`, preserveAspectRatio: 'xMidYMid meet',
    });
    const shapes = svg('g', { class: 'mini-nodes' });
    for (const b of content.boxes) shapes.append(svg('rect', { x: b.x, y: b.y, width: b.w, height: b.h, rx: 4 }));
    this.miniView = svg('rect', { class: 'mini-view' });
    this.minimap.append(shapes, this.miniView);

    // a small plan gets a small stage; a big one a tall viewport to zoom and pan in
    this.stage.style.height = `${Math.round(Math.max(170, Math.min(560, content.height + 24)))}px`;
    this.stage.replaceChildren(root, this.minimap);
    this.svgEl = root;
    this.wire(root);
    this.measure();
    const fits = content.width <= this.size.w && content.height <= this.size.h;
    if (fits) this.setZoom(1, 0, 0);
    else this.fit();
    if (!this.resizer && window.ResizeObserver) {
      this.resizer = new ResizeObserver(() => {
        const before = this.size.w;
        this.measure();
        // shown for the first time (its tab was hidden while it was built): fit now
        if (!before && this.size.w) this.fitIfLarge();
        else this.applyZoom();
      });
      this.resizer.observe(this.stage);
    }
  }

  measure() {
    const box = this.stage.getBoundingClientRect();
    this.size = { w: box.width, h: box.height };
  }

  fitIfLarge() {
    if (!this.content) return;
    if (this.content.width <= this.size.w && this.content.height <= this.size.h) this.setZoom(1, 0, 0);
    else this.fit();
  }

  fit() {
    if (!this.content || !this.size.w) return;
    const k = Math.min(1, (this.size.w - 8) / this.content.width, (this.size.h - 8) / this.content.height);
    this.setZoom(k, (this.size.w - this.content.width * k) / 2, Math.max(0, (this.size.h - this.content.height * k) / 2));
  }

  zoomBy(factor, px, py) {
    const cx = px === undefined ? this.size.w / 2 : px;
    const cy = py === undefined ? this.size.h / 2 : py;
    const k = Math.min(4, Math.max(0.02, this.zoom.k * factor));
    const f = k / this.zoom.k;
    this.setZoom(k, cx - (cx - this.zoom.x) * f, cy - (cy - this.zoom.y) * f);
  }

  setZoom(k, x, y) {
    this.zoom = { k, x, y };
    this.applyZoom();
  }

  applyZoom() {
    if (!this.viewport) return;
    const { k, x, y } = this.zoom;
    this.viewport.setAttribute('transform', `translate(${x.toFixed(1)},${y.toFixed(1)}) scale(${k.toFixed(4)})`);
    this.stage.setAttribute('data-zoom', k.toFixed(3));
    // the part of the content in view, in content coordinates
    this.miniView.setAttribute('x', String(-x / k));
    this.miniView.setAttribute('y', String(-y / k));
    this.miniView.setAttribute('width', String(this.size.w / k));
    this.miniView.setAttribute('height', String(this.size.h / k));
    // no minimap while the whole plan is in view
    const all = x >= -1 && y >= -1 && x + this.content.width * k <= this.size.w + 1 && y + this.content.height * k <= this.size.h + 1;
    this.minimap.style.display = all ? 'none' : '';
  }

  /** Centres the view on a point of the minimap. */
  centreOn(ev) {
    const box = this.minimap.getBoundingClientRect();
    const { width, height } = this.content;
    const scale = Math.min(box.width / width, box.height / height);
    const offX = (box.width - width * scale) / 2;
    const offY = (box.height - height * scale) / 2;
    const cx = (ev.clientX - box.left - offX) / scale;
    const cy = (ev.clientY - box.top - offY) / scale;
    const { k } = this.zoom;
    this.setZoom(k, this.size.w / 2 - cx * k, this.size.h / 2 - cy * k);
  }

  wire(root) {
    root.addEventListener('wheel', (ev) => {
      ev.preventDefault();
      const box = this.stage.getBoundingClientRect();
      this.zoomBy(ev.deltaY < 0 ? 1.15 : 1 / 1.15, ev.clientX - box.left, ev.clientY - box.top);
    }, { passive: false });
    let drag = null;
    root.addEventListener('pointerdown', (ev) => {
      if (ev.button !== 0) return;
      drag = { x: ev.clientX, y: ev.clientY, zx: this.zoom.x, zy: this.zoom.y, moved: false };
    });
    root.addEventListener('pointermove', (ev) => {
      if (!drag) return;
      const dx = ev.clientX - drag.x;
      const dy = ev.clientY - drag.y;
      if (!drag.moved && Math.abs(dx) + Math.abs(dy) < 4) return;
      if (!drag.moved) root.setPointerCapture(ev.pointerId);
      drag.moved = true;
      this.stage.classList.add('panning');
      this.setZoom(this.zoom.k, drag.zx + dx, drag.zy + dy);
    });
    const end = () => {
      this.stage.classList.remove('panning');
      // a drag is not a click: the click that ends it is swallowed below
      this.dragged = drag && drag.moved;
      drag = null;
    };
    root.addEventListener('pointerup', end);
    root.addEventListener('pointercancel', end);
    let miniDrag = false;
    this.minimap.addEventListener('pointerdown', (ev) => { miniDrag = true; this.minimap.setPointerCapture(ev.pointerId); this.centreOn(ev); });
    this.minimap.addEventListener('pointermove', (ev) => { if (miniDrag) this.centreOn(ev); });
    this.minimap.addEventListener('pointerup', () => { miniDrag = false; });

    // highlight a node's edges on hover
    root.addEventListener('mouseover', (ev) => this.highlight(ev.target.closest('g.node'), true));
    root.addEventListener('mouseout', (ev) => this.highlight(ev.target.closest('g.node'), false));
    root.addEventListener('click', (ev) => {
      if (this.dragged) {
        this.dragged = false;
        return;
      }
      const wave = ev.target.closest('g.wave');
      if (wave) {
        const index = Number(wave.getAttribute('data-wave')) - 1;
        const ids = this.view.plan.columns[index] || [];
        this.grid.open(`Wave ${index + 1}`, ids);
        return;
      }
      const g = ev.target.closest('g.node');
      if (!g) return;
      if (g.hasAttribute('data-group')) {
        const entry = this.groups[Number(g.getAttribute('data-group'))];
        this.grid.open(`${entry.node.label} ×${entry.node.members.length.toLocaleString('en-US')}`, entry.node.members);
        return;
      }
      this.view.openTask(g.getAttribute('data-task-id'));
    });
  }

  destroy() {
    if (this.resizer) this.resizer.disconnect();
  }
}
