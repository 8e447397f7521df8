// Pure logic of the Jobs panel (jobspanel.ts): the command that runs an open script or notebook
// as a job, the submit request from the form's choices, the texts of a job's line, and the log
// follower's offsets. No JupyterLab imports here, so jest tests it without a browser.

export const TERMINAL_STATES = ['succeeded', 'failed', 'cancelled'];

export interface IJobAttempt {
  n: number;
  started_at: string | null;
  running_at: string | null;
  ended_at: string | null;
  end: string | null;
  exit_code: number | null;
  resume_seconds?: number | null;
  lost_seconds?: number | null;
}

/** A job as the hub's jobs API answers it (Job.to_api). */
export interface IJob {
  id: number;
  name: string;
  command: string;
  cwd: string;
  gpu: string;
  gpus: number;
  nodes: number;
  pricing: string;
  max_price: string | null;
  state: string;
  reason: string;
  exit_code: number | null;
  attempts: IJobAttempt[];
  attempt_count?: number;
  lost_seconds?: number;
  cancel_requested?: boolean;
  submitted_at: string;
}

/** What the panel's form holds (texts as typed). */
export interface IJobChoices {
  command: string;
  cwd: string;
  name: string;
  gpu: string; // a catalog slug or "none"
  gpus: string;
  nodes: string;
  spot: boolean;
  bid: string;
}

export interface ISubmitBody {
  command: string;
  cwd?: string;
  name?: string;
  gpu: string;
  gpus: number | string;
  nodes?: number | string;
  pricing?: string;
  max_price?: string;
}

export function isTerminal(state: string): boolean {
  return TERMINAL_STATES.includes(state);
}

/** A word for the shell: as it is when it is plainly safe, else in single quotes. */
export function shellQuote(word: string): string {
  if (/^[A-Za-z0-9_@%+=:,./-]+$/.test(word)) {
    return word;
  }
  return `'${word.replace(/'/g, `'"'"'`)}'`;
}

/** The job that runs a file of the home: `python FILE` for a .py, `jupyter execute FILE` for a
 * notebook, from the file's own folder (`cwd`, relative to the home); null for anything else. */
export function jobCommandFor(
  path: string
): { command: string; cwd: string; kind: 'script' | 'notebook' } | null {
  const clean = path.replace(/^\/+/, '');
  const slash = clean.lastIndexOf('/');
  const cwd = slash < 0 ? '' : clean.slice(0, slash);
  const file = clean.slice(slash + 1);
  if (/\.py$/i.test(file) && file.length > 3) {
    return { command: `python ${shellQuote(file)}`, cwd, kind: 'script' };
  }
  if (/\.ipynb$/i.test(file) && file.length > 6) {
    return { command: `jupyter execute ${shellQuote(file)}`, cwd, kind: 'notebook' };
  }
  return null;
}

function asNumber(text: string): number | string {
  const t = text.trim();
  return /^\d+$/.test(t) ? Number(t) : t; // not a number: the hub says what is allowed
}

/** The POST body for the hub from the form's choices (the hub validates every field). */
export function submitBody(c: IJobChoices): ISubmitBody {
  const body: ISubmitBody = { command: c.command.trim(), gpu: c.gpu, gpus: 0 };
  if (c.cwd) {
    body.cwd = c.cwd;
  }
  if (c.name.trim()) {
    body.name = c.name.trim();
  }
  if (c.gpu !== 'none') {
    body.gpus = asNumber(c.gpus);
    body.nodes = asNumber(c.nodes || '1');
    if (c.spot) {
      body.pricing = 'spot';
      if (c.bid.trim()) {
        body.max_price = c.bid.trim();
      }
    }
  }
  return body;
}

/** `45 s`, `12 min`, `2.5 h`. */
export function shortDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined) {
    return '';
  }
  if (seconds < 90) {
    return `${Math.round(seconds)} s`;
  }
  if (seconds < 5400) {
    return `${Math.round(seconds / 60)} min`;
  }
  return `${(seconds / 3600).toFixed(1)} h`;
}

/** What a job runs on: `A100-80G x2 · 2 nodes · spot (bid 1.50)`, or `No GPU`. */
export function jobOn(job: IJob, typeName: (slug: string) => string): string {
  if (job.gpu === 'none' || !job.gpus) {
    return 'No GPU';
  }
  const parts = [`${typeName(job.gpu)} x${job.gpus}`];
  if (job.nodes > 1) {
    parts.push(`${job.nodes} nodes`);
  }
  if (job.pricing === 'spot') {
    parts.push(job.max_price ? `spot (bid ${job.max_price})` : 'spot');
  }
  return parts.join(' · ');
}

/** `attempt 2 · resumed in 40 s · 3 min of work lost`. */
export function attemptsText(job: IJob): string {
  const n = job.attempt_count ?? job.attempts.length;
  if (!n) {
    return '';
  }
  const parts = [`attempt ${n}`];
  const last = job.attempts[job.attempts.length - 1];
  if (n > 1 && last && last.resume_seconds !== null && last.resume_seconds !== undefined) {
    parts.push(`resumed in ${shortDuration(last.resume_seconds)}`);
  }
  if (job.lost_seconds) {
    parts.push(`${shortDuration(job.lost_seconds)} of work lost`);
  }
  return parts.join(' · ');
}

/** The state as a person reads it: `running`, `failed (exit 3)`, `queued`. */
export function stateText(job: IJob): string {
  if (job.state === 'failed' && job.exit_code !== null && job.exit_code !== undefined) {
    return `failed (exit ${job.exit_code})`;
  }
  if (job.state === 'succeeded') {
    return 'succeeded (exit 0)';
  }
  return job.cancel_requested && !isTerminal(job.state) ? 'cancelling' : job.state;
}

/** One read of a job's log: the text from `offset`, where the next read starts, and whether the
 * job has ended (null when the answer does not say). */
export interface ILogChunk {
  text: string;
  next_offset: number;
  done: boolean | null;
}

/**
 * Follows a job's log: each `step()` reads from the last offset and says whether there is more
 * to come. It ends once the job has ended and a read brought nothing new (the output written
 * just before the end is still read).
 */
export class LogFollower {
  offset = 0;
  done = false;

  constructor(
    private read: (offset: number) => Promise<ILogChunk>,
    private ended: () => Promise<boolean>
  ) {}

  async step(): Promise<{ text: string; more: boolean }> {
    const chunk = await this.read(this.offset);
    const more = chunk.next_offset > this.offset;
    this.offset = Math.max(this.offset, chunk.next_offset);
    const ended = chunk.done === null ? await this.ended() : chunk.done;
    this.done = ended && !more;
    return { text: chunk.text, more };
  }
}
