/**
 * Constants shared by the pages: task and execution states, event kinds, page sizes.
 */
export const TASK_STATES = [
  'pending', 'queued', 'blocked', 'running', 'waiting_for_subtasks', 'waiting_for_human',
  'retry_scheduled', 'completed', 'failed', 'skipped', 'cancelled',
];
export const EXEC_STATES = [
  'pending', 'running', 'paused', 'waiting_for_human', 'completed', 'failed', 'cancelled',
];
export const TERMINAL_EXEC = new Set(['completed', 'failed', 'cancelled']);
/** Task states an instance does not leave. */
export const TERMINAL_TASK = new Set(['completed', 'failed', 'skipped', 'cancelled']);
/** Bottom-to-top order of the segments of a wave's stacked bar (settled work at the bottom). */
export const STACK_ORDER = [
  'completed', 'skipped', 'failed', 'cancelled', 'running', 'waiting_for_subtasks',
  'waiting_for_human', 'retry_scheduled', 'blocked', 'queued', 'pending',
];
/** Event kinds after which the execution detail (questions, state, reason) is fetched again. */
export const REFETCH_KINDS = new Set([
  'question_asked', 'question_answered', 'question_expired', 'pause_requested',
  'resume_requested', 'cancel_requested', 'execution_finished',
]);
export const EVENT_CATEGORY = {
  task_failed: 'bad', task_lost: 'bad', task_timed_out: 'bad', budget_exhausted: 'bad',
  execution_timed_out: 'bad', task_completed: 'good', execution_finished: 'good',
  question_asked: 'human', question_answered: 'human', question_expired: 'human',
  subtasks_spawned: 'sub', task_dispatched: 'run', task_started: 'run', execution_started: 'run',
  run_started: 'run', pause_requested: 'ctl', resume_requested: 'ctl', cancel_requested: 'ctl',
};

export const TOKEN_KEY = 'trellis.token';
export const NET_DOWN = 'monitor unreachable, retrying';
export const GROUP_SHOW = 50;        // subtask group members listed in the tree
export const ROOT_PAGE = 200;        // root instances listed in the tree before "show more"
export const FILTER_SHOW = 500;      // instances listed when the tree is filtered
export const EVENT_CAP = 1000;       // rows kept in the event log
export const EVENT_PAGE = 500;       // events per page fetched from the stored log
