/**
 * Execution page: the execution tree.
 */
import { FILTER_SHOW, GROUP_SHOW, ROOT_PAGE, TASK_STATES } from './const.js';
import { badge, byCreated, fmtDuration, h, setBadge, setText, shortId, span, stateLabel } from './util.js';

/**
 * The execution tree: roots, subtask groups nested under the instance that spawned them, resumed
 * parents after their group, continuations after the instance they continue. Rebuilt when the
 * structure changes (throttled); state changes of visible lines are patched in place.
 */
export class TreeView {
  constructor(view) {
    this.view = view;
    this.collapsed = new Set();
    this.lines = new Map();     // instance id -> line refs (lines currently shown)
    this.nodes = new Map();     // element cache of the last build, see build()
    this.needsBuild = true;
    this.lastBuild = 0;
    this.rootLimit = ROOT_PAGE;
    this.groupStart = new Map(); // "<instance>:<group>" -> index of the first member shown
    this.info = h('span', { class: 'sub' });
    this.body = h('div', { class: 'tree-body', id: 'tree-body' });
    const expand = h('button', { type: 'button', class: 'link', onclick: () => { this.collapsed.clear(); this.rebuildNow(); } }, 'expand all');
    const collapse = h('button', {
      type: 'button', class: 'link',
      onclick: () => {
        for (const inst of this.view.instances.values()) if (inst.parent) this.collapsed.add(inst.parent);
        this.rebuildNow();
      },
    }, 'collapse all');
    // Filters: a state and a part of the task id; either set lists the matching instances flat.
    this.stateFilter = h('select', { id: 'tree-state-filter', 'aria-label': 'Only instances in this state' },
      h('option', { value: '' }, 'all states'),
      ...TASK_STATES.map((state) => h('option', { value: state }, stateLabel(state))));
    this.nameFilter = h('input', { id: 'tree-name-filter', type: 'search', placeholder: 'task id contains…', 'aria-label': 'Only tasks whose id contains' });
    this.stateFilter.addEventListener('change', () => this.rebuildNow());
    this.nameFilter.addEventListener('input', () => this.rebuildNow());
    this.el = h('section', { class: 'card', id: 'tree' },
      h('div', { class: 'card-head' }, h('h3', null, 'Execution tree'), this.info, h('div', { class: 'grow' }),
        this.stateFilter, this.nameFilter, expand, collapse),
      this.body);
    this.body.addEventListener('click', (ev) => {
      const toggle = ev.target.closest('.tree-toggle');
      if (toggle && !toggle.classList.contains('leaf')) {
        const id = toggle.closest('.tree-line').getAttribute('data-instance-id');
        if (this.collapsed.has(id)) this.collapsed.delete(id);
        else this.collapsed.add(id);
        this.rebuildNow();
        return;
      }
      const more = ev.target.closest('.tree-more-roots');
      if (more) {
        this.rootLimit += ROOT_PAGE;
        this.rebuildNow();
        return;
      }
      const pager = ev.target.closest('.tree-pager');
      if (pager) {
        const key = pager.getAttribute('data-key');
        const start = this.groupStart.get(key) || 0;
        if (ev.target.closest('.tree-page-next')) this.pageTo(key, start + GROUP_SHOW);
        else if (ev.target.closest('.tree-page-prev')) this.pageTo(key, start - GROUP_SHOW);
        else if (ev.target.closest('.tree-jump-go')) this.jump(pager);
        return;
      }
      const line = ev.target.closest('.tree-line');
      if (line) this.view.drawer.open(line.getAttribute('data-instance-id'));
    });
    this.body.addEventListener('keydown', (ev) => {
      if (ev.key === 'Enter' && ev.target.classList.contains('tree-jump')) {
        this.jump(ev.target.closest('.tree-pager'));
      }
    });
  }

  /** Shows a group's members from index `start` on (clamped when the page is built). */
  pageTo(key, start) {
    this.groupStart.set(key, Math.max(0, start));
    this.rebuildNow();
  }

  /** Shows the page holding the member number typed in a group's pager (1-based). */
  jump(pager) {
    const n = Number(pager.querySelector('.tree-jump').value);
    const total = Number(pager.getAttribute('data-total')) || 0;
    if (!Number.isInteger(n) || n < 1 || n > total) {
      setText(pager.querySelector('.tree-jump-error'), `enter a member from 1 to ${total}`);
      return;
    }
    setText(pager.querySelector('.tree-jump-error'), '');
    this.pageTo(pager.getAttribute('data-key'), n - 1);
  }

  rebuildNow() {
    this.needsBuild = true;
    this.lastBuild = 0;
    this.view.schedule();
  }

  /** Called once per frame with the ids of instances changed since the previous frame. */
  update(changed) {
    for (const id of changed) {
      const line = this.lines.get(id);
      if (line) this.patchLine(line, this.view.instances.get(id));
      // a change to an instance that is not shown may alter a "… and N more" count
      else this.needsBuild = true;
    }
    if (!this.needsBuild) return;
    const wait = this.view.instances.size > 2000 ? 1000 : 150;
    if (Date.now() - this.lastBuild < wait) {
      this.view.scheduleLater(wait);
      return;
    }
    this.build();
  }

  build() {
    this.needsBuild = false;
    this.lastBuild = Date.now();
    const insts = this.view.instances;
    const groupParent = new Map();   // group id -> id of the instance that spawned it
    for (const inst of insts.values()) {
      if (inst.parent && inst.group && insts.has(inst.parent)) groupParent.set(inst.group, inst.parent);
    }
    const groupsOf = new Map();      // parent id -> Map(group id -> members)
    const resumedAfter = new Map();  // group id -> resumed instances
    const continuedBy = new Map();   // instance id -> continuing instances
    const roots = [];
    const push = (map, key, value) => {
      let list = map.get(key);
      if (!list) { list = []; map.set(key, list); }
      list.push(value);
    };
    for (const inst of insts.values()) {
      if (inst.continues && inst.continues !== inst.id && insts.has(inst.continues)) push(continuedBy, inst.continues, inst);
      else if (inst.resumed_after && groupParent.has(inst.resumed_after)) push(resumedAfter, inst.resumed_after, inst);
      else if (inst.parent && insts.has(inst.parent)) {
        let groups = groupsOf.get(inst.parent);
        if (!groups) { groups = new Map(); groupsOf.set(inst.parent, groups); }
        push(groups, inst.group || '', inst);
      } else roots.push(inst);
    }
    roots.sort(byCreated);

    // Elements are keyed and reused between builds ("l:" lines, "n:" notes, "g:" group
    // headers, "m:" more-lines), so a rebuild only creates what is new and moves what moved.
    const cache = this.nodes;
    const nodes = new Map();
    const order = [];
    const lines = new Map();
    const visited = new Set();   // guards against malformed cycles
    const sorted = (list) => list.sort(byCreated);
    const indent = (depth) => `${6 + depth * 20}px`;
    const take = (key, make) => {
      const el = nodes.get(key) || cache.get(key) || make();
      nodes.set(key, el);
      order.push(el);
      return el;
    };
    const textLine = (key, cls, depth, text) => {
      const el = take(key, () => h('div', { class: cls }));
      if (el.style.paddingLeft !== indent(depth)) el.style.paddingLeft = indent(depth);
      setText(el, text);
      return el;
    };

    const renderInst = (inst, depth, tag, tagClass) => {
      if (visited.has(inst.id)) return;
      visited.add(inst.id);
      const groups = groupsOf.get(inst.id);
      const open = !this.collapsed.has(inst.id);
      if (tag) textLine(`n:${inst.id}`, `tree-note${tagClass ? ` ${tagClass}` : ''}`, depth, `↳ ${tag}`);
      const refs = this.lineFor(inst, cache, depth, groups ? (open ? 'open' : 'closed') : 'leaf');
      nodes.set(`l:${inst.id}`, refs);
      order.push(refs.el);
      lines.set(inst.id, refs);
      if (groups) {
        for (const [gid, members] of groups) {
          sorted(members);
          if (open) {
            const g = textLine(`g:${inst.id}:${gid}`, 'tree-group', depth + 1,
              `subtask group ${gid ? shortId(gid) : '—'} · ${members.length} member${members.length === 1 ? '' : 's'}`);
            if (gid) g.setAttribute('data-group-id', gid);
            const key = `${inst.id}:${gid}`;
            const start = Math.min(this.groupStart.get(key) || 0, Math.max(0, members.length - GROUP_SHOW));
            if (start > 0) {
              const before = members.slice(0, start);
              textLine(`b:${key}`, 'tree-more', depth + 1, `… ${before.length} earlier (${countStates(before)})`);
            }
            for (const m of members.slice(start, start + GROUP_SHOW)) renderInst(m, depth + 1);
            if (members.length > GROUP_SHOW) {
              const rest = members.slice(start + GROUP_SHOW);
              const pager = take(`m:${key}`, () => h('div', { class: 'tree-more tree-pager', 'data-key': key },
                h('span', { class: 'tree-page-info' }), ' ',
                h('button', { type: 'button', class: 'link tree-page-prev' }, `previous ${GROUP_SHOW}`), ' ',
                h('button', { type: 'button', class: 'link tree-page-next' }, `next ${GROUP_SHOW}`), ' · member ',
                h('input', { type: 'number', class: 'tree-jump', min: 1, 'aria-label': 'jump to member' }), ' ',
                h('button', { type: 'button', class: 'link tree-jump-go' }, 'go'), ' ',
                h('span', { class: 'err tree-jump-error' })));
              if (pager.style.paddingLeft !== indent(depth + 1)) pager.style.paddingLeft = indent(depth + 1);
              pager.setAttribute('data-total', String(members.length));
              setText(pager.querySelector('.tree-page-info'),
                `members ${start + 1}–${Math.min(start + GROUP_SHOW, members.length)} of ${members.length}` +
                (rest.length ? ` · ${rest.length} later (${countStates(rest)})` : ''));
              pager.querySelector('.tree-page-prev').disabled = start === 0;
              pager.querySelector('.tree-page-next').disabled = rest.length === 0;
            }
          }
          for (const r of sorted(resumedAfter.get(gid) || [])) renderInst(r, depth, `resumed after group ${shortId(gid)}`, '');
        }
      }
      for (const c of sorted(continuedBy.get(inst.id) || [])) renderInst(c, depth, `continues ${shortId(inst.id)}`, 'cont');
    };

    const state = this.stateFilter.value;
    const name = this.nameFilter.value.trim().toLowerCase();
    if (state || name) {
      // Filtered: the matching instances, oldest first, flat.
      const matching = [...insts.values()]
        .filter((inst) => (!state || inst.state === state) && (!name || inst.task_id.toLowerCase().includes(name)))
        .sort(byCreated);
      for (const inst of matching.slice(0, FILTER_SHOW)) {
        const refs = this.lineFor(inst, cache, 0, 'leaf');
        nodes.set(`l:${inst.id}`, refs);
        order.push(refs.el);
        lines.set(inst.id, refs);
      }
      textLine('f:count', 'tree-more tree-filter-count', 0, matching.length === 0 ? 'No task instance matches the filter.'
        : `${matching.length} matching` + (matching.length > FILTER_SHOW ? ` (the first ${FILTER_SHOW} listed)` : ''));
    } else {
      const shownRoots = roots.slice(0, this.rootLimit);
      for (const r of shownRoots) renderInst(r, 0);
      if (roots.length > shownRoots.length) {
        const rest = roots.slice(shownRoots.length);
        const el = take('m:roots', () => h('div', { class: 'tree-more', style: `padding-left:${indent(0)}` },
          h('span'), ' ', h('button', { type: 'button', class: 'link tree-more-roots' }, 'show more')));
        setText(el.firstChild, `… and ${rest.length} more (${countStates(rest)})`);
      }
    }
    if (insts.size === 0) take('empty', () => h('div', { class: 'empty' }, 'No task instances yet.'));

    // reconcile: drop what is gone, then put the rest in order (a no-op when nothing moved)
    for (const [key, value] of cache) {
      if (!nodes.has(key)) (value.el || value).remove();
    }
    let cursor = this.body.firstChild;
    for (const el of order) {
      if (el === cursor) cursor = cursor.nextSibling;
      else this.body.insertBefore(el, cursor);
    }
    while (cursor) {
      const next = cursor.nextSibling;
      cursor.remove();
      cursor = next;
    }
    this.nodes = nodes;
    this.lines = lines;
    setText(this.info, `${insts.size} instance${insts.size === 1 ? '' : 's'} · ${roots.length} root${roots.length === 1 ? '' : 's'}`);
  }

  /** Returns the line of `inst`, reused from the previous build when possible. */
  lineFor(inst, cache, depth, kind) {
    let refs = cache.get(`l:${inst.id}`);
    if (!refs) {
      refs = {
        toggle: h('button', { type: 'button', class: 'tree-toggle' }),
        badge: badge(inst.state),
        attempt: h('span', { class: 'meta' }),
        worker: h('span', { class: 'meta mono' }),
        dur: h('span', { class: 'dur' }),
        depth: -1,
        kind: '',
        inst,
      };
      refs.el = h('div', { class: 'tree-line', 'data-instance-id': inst.id, 'data-state': inst.state },
        refs.toggle,
        h('span', { class: 'task-id' }, inst.task_id),
        h('span', { class: 'iid mono', title: inst.id }, shortId(inst.id)),
        refs.badge, refs.attempt, refs.worker, refs.dur);
    }
    if (refs.depth !== depth) {
      refs.depth = depth;
      refs.el.style.paddingLeft = `${6 + depth * 20}px`;
    }
    if (refs.kind !== kind) {
      refs.kind = kind;
      refs.toggle.className = `tree-toggle${kind === 'leaf' ? ' leaf' : ''}`;
      refs.toggle.textContent = kind === 'closed' ? '▸' : '▾';
      refs.toggle.setAttribute('aria-label', kind === 'open' ? 'collapse' : 'expand');
      refs.toggle.tabIndex = kind === 'leaf' ? -1 : 0;
    }
    this.patchLine(refs, inst);
    return refs;
  }

  patchLine(refs, inst) {
    if (!inst) return;
    refs.inst = inst;
    if (refs.el.getAttribute('data-state') !== inst.state) refs.el.setAttribute('data-state', inst.state);
    setBadge(refs.badge, inst.state);
    const checks = inst.validation || [];
    const passed = checks.filter((c) => c.passed).length;
    setText(refs.attempt, `attempt ${inst.attempt ?? '—'}${checks.length ? ` · checks ${passed}/${checks.length}` : ''}`);
    setText(refs.worker, inst.worker || '');
    setText(refs.dur, fmtDuration(span(inst.started_ms, inst.ended_ms)));
    const title = [inst.error || '', ...checks.filter((c) => !c.passed)
      .map((c) => `check ${c.name} (${c.level}) failed: ${c.output}`)].filter(Boolean).join('\n');
    if (refs.el.title !== title) refs.el.title = title;
  }

  /** Running durations advance every second. */
  tick() {
    for (const refs of this.lines.values()) {
      const inst = refs.inst;
      if (inst.started_ms != null && inst.ended_ms == null) setText(refs.dur, fmtDuration(span(inst.started_ms, null)));
    }
  }
}

export function countStates(list) {
  const counts = {};
  for (const inst of list) counts[inst.state] = (counts[inst.state] || 0) + 1;
  return TASK_STATES.filter((s) => counts[s]).map((s) => `${counts[s]} ${s}`).join(', ');
}
