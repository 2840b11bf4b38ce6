/**
 * The backlog page (`#/backlog`): the evaluation queue, the task lists with their counters, and
 * the pending grouping suggestions, each accepted or rejected with the monitor's token.
 */
import { api, banner, controlsHint, controlsUsable, poll, refusal, report } from './api.js';
import { h } from './util.js';

export class BacklogView {
  constructor(root) {
    this.root = root;
    this.ctl = new AbortController();
    this.project = new URLSearchParams(location.hash.split('?')[1] || '').get('project') || 'default';
  }

  mount() {
    this.queue = h('tbody');
    this.lists = h('tbody');
    this.suggestions = h('div', { id: 'suggestions-list' });
    this.hint = h('span', { class: 'sub', id: 'suggestions-hint' });
    this.root.replaceChildren(
      h('section', { class: 'card', id: 'suggestions' },
        h('div', { class: 'card-head' }, h('h2', null, 'Suggested lists'), this.hint),
        this.suggestions),
      h('section', { class: 'card', id: 'queue' },
        h('div', { class: 'card-head' }, h('h2', null, 'Evaluation queue'),
          h('span', { class: 'sub' }, `project ${this.project}`)),
        h('table', { class: 'grid', id: 'queue-table' },
          h('thead', null, h('tr', null,
            h('th', null, 'Task'), h('th', null, 'Title'), h('th', null, 'Category'),
            h('th', null, 'Priority'), h('th', { class: 'right' }, 'Score'), h('th', null, 'Status'),
            h('th', null, 'Files'))),
          this.queue)),
      h('section', { class: 'card', id: 'lists' },
        h('div', { class: 'card-head' }, h('h2', null, 'Task lists')),
        h('table', { class: 'grid', id: 'lists-table' },
          h('thead', null, h('tr', null,
            h('th', null, 'List'), h('th', null, 'Status'), h('th', { class: 'right' }, 'Tasks'),
            h('th', { class: 'right' }, 'Completed'), h('th', { class: 'right' }, 'Failed'),
            h('th', { class: 'right' }, 'At once'), h('th', { class: 'right' }, 'Runs'))),
          this.lists)));
    poll(() => this.refresh(), 2000, this.ctl.signal);
  }

  unmount() {
    this.ctl.abort();
  }

  onConfig() {
    this.refresh();
  }

  async refresh() {
    try {
      const data = await api(`/api/backlog?project=${encodeURIComponent(this.project)}`, { signal: this.ctl.signal });
      banner.clear('backlog');
      this.render(data);
    } catch (err) {
      report('backlog', err);
    }
  }

  render(data) {
    const queued = (data.tasks || []).filter((t) => !t.list);
    this.queue.replaceChildren(...(queued.length ? queued.map((t) => h('tr', { 'data-task': t.id },
      h('td', { class: 'mono' }, t.id), h('td', null, t.title), h('td', null, t.category),
      h('td', null, t.priority), h('td', { class: 'right' }, String(t.priority_score)),
      h('td', null, t.status, ...(t.blocks || []).map((b) => h('div', { class: 'sub' }, `${b.kind}: ${b.reason}`))),
      h('td', { class: 'mono' }, (t.files || []).map((f) => `${f.path} (${f.operation})`).join(', '))))
      : [h('tr', null, h('td', { colspan: 7, class: 'empty' }, 'No queued tasks: trellis tasks add TITLE'))]));
    const lists = data.lists || [];
    this.lists.replaceChildren(...(lists.length ? lists.map((l) => h('tr', { 'data-list': l.name },
      h('td', null, l.name), h('td', null, l.status), h('td', { class: 'right' }, String(l.total_tasks)),
      h('td', { class: 'right' }, String(l.completed_tasks)), h('td', { class: 'right' }, String(l.failed_tasks)),
      h('td', { class: 'right' }, String(l.max_parallel_agents)), h('td', { class: 'right' }, String(l.runs))))
      : [h('tr', null, h('td', { colspan: 7, class: 'empty' }, 'No lists yet'))]));
    const usable = controlsUsable();
    this.hint.textContent = usable ? '' : controlsHint();
    const suggestions = data.suggestions || [];
    this.suggestions.replaceChildren(...(suggestions.length ? suggestions.map((s) => {
      const note = h('span', { class: 'sub' });
      const act = (action) => h('button', {
        type: 'button', class: action === 'accept' ? 'primary' : null, 'data-action': action,
        disabled: !usable, title: usable ? null : controlsHint(),
        onclick: () => this.resolve(s, action, note),
      }, action === 'accept' ? 'Accept' : 'Reject');
      return h('div', { class: 'suggestion', 'data-suggestion': s.id },
        h('div', null, h('strong', null, s.name), ' ',
          h('span', { class: 'sub' }, `${s.tasks.map((n) => `T-${n}`).join(' ')} · score ${Number(s.score).toFixed(2)}`)),
        h('div', { class: 'sub' }, s.reason),
        h('div', null, act('accept'), ' ', act('reject'), ' ', note));
    }) : [h('div', { class: 'empty' }, 'No pending suggestions')]));
  }

  async resolve(suggestion, action, note) {
    note.textContent = '';
    try {
      await api(`/api/backlog/suggestions/${encodeURIComponent(suggestion.id)}/${action}`, {
        method: 'POST', body: { project: this.project }, signal: this.ctl.signal,
      });
      await this.refresh();
    } catch (err) {
      note.textContent = refusal(`${action} the suggestion`, err);
    }
  }
}
