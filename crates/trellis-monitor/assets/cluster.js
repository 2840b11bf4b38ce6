/**
 * The cluster page (`#/cluster`): the coordinators, their shards and load.
 */
import { api, banner, poll, report } from './api.js';
import { fmtAge, h, setText } from './util.js';

export function shardRanges(shards) {
  const sorted = [...(shards || [])].sort((a, b) => a - b);
  const parts = [];
  for (let i = 0; i < sorted.length; i++) {
    const start = sorted[i];
    let end = start;
    while (i + 1 < sorted.length && sorted[i + 1] === end + 1) end = sorted[++i];
    parts.push(start === end ? String(start) : `${start}–${end}`);
  }
  return parts.length ? parts.join(', ') : '—';
}

export class ClusterView {
  constructor(root) {
    this.root = root;
    this.ctl = new AbortController();
  }

  mount() {
    this.tbody = h('tbody', null, h('tr', null, h('td', { colspan: 6, class: 'empty' }, 'Loading…')));
    this.count = h('span', { class: 'sub' });
    this.root.replaceChildren(h('section', { class: 'card', id: 'cluster' },
      h('div', { class: 'card-head' }, h('h2', null, 'Coordinators'), this.count),
      h('table', { class: 'grid', id: 'cluster-table' },
        h('thead', null, h('tr', null,
          h('th', null, 'Coordinator'), h('th', null, 'Address'), h('th', null, 'Shards'),
          h('th', { class: 'right' }, 'In memory'), h('th', { class: 'right' }, 'Lag'),
          h('th', { class: 'right' }, 'Reported'))),
        this.tbody)));
    poll(() => this.refresh(), 1000, this.ctl.signal);
  }

  unmount() {
    this.ctl.abort();
  }

  async refresh() {
    try {
      const data = await api('/api/cluster', { signal: this.ctl.signal });
      banner.clear('cluster');
      this.render(data);
    } catch (err) {
      report('cluster', err);
    }
  }

  render(data) {
    const coordinators = Array.isArray(data.coordinators) ? data.coordinators : [];
    this.tbody.replaceChildren(...coordinators.map((c) => h('tr', { 'data-coordinator-id': c.id },
      h('td', { class: 'mono' }, c.id),
      h('td', { class: 'mono' }, c.address || '—'),
      h('td', { title: `${(c.shards || []).length} shards` }, `${shardRanges(c.shards)} (${(c.shards || []).length})`),
      h('td', { class: 'right num' }, String(c.executions_in_memory ?? 0)),
      h('td', { class: 'right num' }, String(c.lag ?? 0)),
      h('td', { class: 'right num' }, c.reported_at_ms ? fmtAge(Date.now() - c.reported_at_ms) : '—'))));
    if (coordinators.length === 0) {
      this.tbody.replaceChildren(h('tr', null, h('td', { colspan: 6, class: 'empty' }, 'No coordinator reported.')));
    }
    const unowned = (data.unowned_shards || []).length;
    setText(this.count, `${coordinators.length} coordinators over ${data.shards ?? '?'} shards` +
      (unowned ? `, ${unowned} unheld (${shardRanges(data.unowned_shards)})` : ''));
  }
}
